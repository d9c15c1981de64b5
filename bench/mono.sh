#!/usr/bin/env bash
# Per-call cost of tracing managed methods on Mono: fnscope (timing and count mode) next to
# Mono's own `--trace` and `--profile=log:calls` (enter/leave instrumentation of every
# method), on one small method called N and 3N times. The per-call cost is the growth of the
# wall time from N to 3N calls, over 2N, minus the same for the native run: fixed costs
# (start-up, hooking, writing out) cancel. Prints a Markdown table (medians of BENCH_RUNS
# rounds).
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

# Wall time (ns) of N and of 3N calls: "t1 t3". $1 is the command with N where the count goes.
times() {
    local t1 t3
    t1=$(median_ns "${@//@N@/$n}")
    t3=$(median_ns "${@//@N@/$((3 * n))}")
    echo "$t1 $t3"
}
read -r b1 b3 < <(times mono "$work/step.exe" @N@)
echo "| tool | wall time, $n calls | wall time, $((3 * n)) calls | per call over native |"
echo "|---|---|---|---|"
printf '| native `mono` | %.3f s | %.3f s | - |\n' "$(echo "$b1 / 1000000000" | bc -l)" "$(echo "$b3 / 1000000000" | bc -l)"
row() {
    local name=$1 t1 t3
    shift
    read -r t1 t3 < <(times "$@")
    printf '| %s | %.3f s | %.3f s | %.1f ns |\n' "$name" "$(echo "$t1 / 1000000000" | bc -l)" "$(echo "$t3 / 1000000000" | bc -l)" \
        "$(echo "(($t3 - $t1) - ($b3 - $b1)) / (2 * $n)" | bc -l)"
}
row '`fnscope record` (timing)' "$fnscope" record -o "$work/trace" -- mono "$work/step.exe" @N@
row '`fnscope record --mode count`' "$fnscope" record --mode count -o "$work/trace" -- mono "$work/step.exe" @N@
row '`mono --profile=log:calls`' mono --profile=log:calls,output="$work/log.mlpd" "$work/step.exe" @N@
row '`mono --trace=M:Bench:Step` (to /dev/null)' mono --trace=M:Bench:Step "$work/step.exe" @N@
echo
echo "Bench:Step (int), never inlined; $(nproc) CPUs; $(mono --version | head -1)"
