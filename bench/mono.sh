#!/usr/bin/env bash
# Per-call cost of tracing managed methods on Mono: fnscope (timing and count mode) next to
# Mono's own `--trace` and `--profile=log:calls` (enter/leave instrumentation of every
# method), on one small method called K and 3K times (K = BENCH_CALLS, 10x for count mode,
# 1/4 for --trace). The per-call cost is the growth of the wall time from K to 3K calls, over
# 2K, minus the same for the native run: fixed costs (start-up, hooking, writing out) cancel.
# Prints a Markdown table (medians of BENCH_RUNS rounds).
#
#   bench/mono.sh      # BENCH_CALLS=2000000 BENCH_RUNS=5 FNSCOPE=target/release/fnscope
#
# Needs mono-runtime, mono-mcs and libmono-profiler (Mono's log profiler).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=${BENCH_CALLS:-2000000}
runs=${BENCH_RUNS:-5}
fnscope=${FNSCOPE:-}
if [ -z "$fnscope" ]; then
    cargo build --release -q -p fnscope-cli
    fnscope=$root/target/release/fnscope
fi
for t in mono mcs; do
    command -v "$t" >/dev/null || { echo "bench/mono.sh: $t is not installed (apt-get install mono-runtime mono-mcs)" >&2; exit 1; }
done
ls /usr/lib/libmono-profiler-log.so* >/dev/null 2>&1 ||
    { echo "bench/mono.sh: Mono's log profiler is not installed (apt-get install libmono-profiler)" >&2; exit 1; }
work=$root/target/bench/mono
mkdir -p "$work"
mcs -optimize+ -out:"$work/step.exe" bench/workloads/mono_step.cs

# Median wall time in ns of running "$@" $runs times (output discarded).
median_ns() {
    local times=()
    for _ in $(seq "$runs"); do
        rm -rf "$work/trace" "$work/log.mlpd"
        local t0 t1
        t0=$(date +%s%N)
        "$@" >/dev/null 2>&1 || { echo "bench/mono.sh: failed: $*" >&2; exit 1; }
        t1=$(date +%s%N)
        times+=($((t1 - t0)))
    done
    printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p"
}

# Wall time (ns) of K and of 3K calls: "t1 t3". K is $1; in the command, @N@ stands for the
# number of calls.
times() {
    local k=$1 t1 t3
    shift
    t1=$(median_ns "${@//@N@/$k}")
    t3=$(median_ns "${@//@N@/$((3 * k))}")
    echo "$t1 $t3"
}
echo "| tool | calls (K) | wall time, K calls | wall time, 3K calls | per call over native |"
echo "|---|---|---|---|---|"
# One row: name, K, command. The native run's growth from K to 3K calls is subtracted.
row() {
    local name=$1 k=$2 t1 t3 b1 b3
    shift 2
    read -r b1 b3 < <(times "$k" mono "$work/step.exe" @N@)
    read -r t1 t3 < <(times "$k" "$@")
    printf '| %s | %s | %.3f s | %.3f s | %.1f ns |\n' "$name" "$k" "$(echo "$t1 / 1000000000" | bc -l)" "$(echo "$t3 / 1000000000" | bc -l)" \
        "$(echo "(($t3 - $t1) - ($b3 - $b1)) / (2 * $k)" | bc -l)"
}
row '`fnscope record` (timing)' "$n" "$fnscope" record -o "$work/trace" -- mono "$work/step.exe" @N@
# Count mode costs a few ns a call: more calls, so that they outweigh the noise of its fixed
# costs (about a second for the counters file).
row '`fnscope record --mode count`' "$((10 * n))" "$fnscope" record --mode count -o "$work/trace" -- mono "$work/step.exe" @N@
row '`mono --profile=log:calls`' "$n" mono --profile=log:calls,output="$work/log.mlpd" "$work/step.exe" @N@
row '`mono --trace=M:Bench:Step` (to /dev/null)' "$((n / 4))" mono --trace=M:Bench:Step "$work/step.exe" @N@
echo
echo "Bench:Step (int), never inlined; $(nproc) CPUs; $(mono --version | head -1)"
