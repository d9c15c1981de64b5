#!/usr/bin/env bash
# Where fnscope's time goes, in instructions: runs the fib workload natively and under
# `fnscope record` inside callgrind (valgrind --tool=callgrind --trace-children=yes, which
# follows the recorder into the traced program), at two sizes, and prints the instructions
# per call of each function (the difference of the two sizes divided by the difference of
# calls, so that start-up and hooking cancel out), separately for the traced program and for
# the recorder process, and the fixed start-up cost.
#
#   bench/callgrind.sh            # fib 20 and fib 24
#   bench/callgrind.sh 18 22
#
# Needs valgrind (apt-get install -y valgrind). Uses target/bench/bin/ (run bench/run.sh, or
# BENCH_RUNS=1 BENCH_ONLY=trivial bench/run.sh, once first to build it) and
# target/release/fnscope.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
small=${1:-20}
large=${2:-24}
fnscope=${FNSCOPE:-$root/target/release/fnscope}
fib=$root/target/bench/bin/fib
out=$root/target/bench/callgrind
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind not found: apt-get install -y valgrind" >&2; exit 1; }
[ -x "$fib" ] || { echo "callgrind.sh: no $fib: run bench/run.sh first" >&2; exit 1; }
[ -x "$fnscope" ] || { echo "callgrind.sh: no $fnscope: cargo build --release -p fnscope-cli" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
calls() { "$fib" "$1" | sed -n 's/^bench-calls: //p'; }
for n in "$small" "$large"; do
    valgrind --tool=callgrind --callgrind-out-file="$out/native.$n" "$fib" "$n" >/dev/null 2>&1
    mkdir -p "$out/$n"
    valgrind --tool=callgrind --trace-children=yes --smc-check=all \
        --callgrind-out-file="$out/$n/cg.%p" "$fnscope" record -o "$out/trace.$n" -- "$fib" "$n" \
        >/dev/null 2>"$out/log.$n"
    grep '^fnscope:' "$out/log.$n" >&2 || true
done
dc=$(( $(calls "$large") - $(calls "$small") ))

# Which profile is which process: the recorder's command line starts with fnscope.
pick() { # dir kind
    for f in "$1"/cg.*; do
        if grep -q "^cmd: .*fnscope record" "$f"; then [ "$2" = recorder ] && echo "$f"
        else [ "$2" = program ] && echo "$f"; fi
    done
}

echo "== fib natively: fib($small) vs fib($large), $dc more calls"
python3 "$here/tools/cg_percall.py" "$out/native.$small" "$out/native.$large" "$dc" 5
echo
echo "== fib under fnscope record: the traced program (stubs run here)"
python3 "$here/tools/cg_percall.py" "$(pick "$out/$small" program)" "$(pick "$out/$large" program)" "$dc" 12
echo
echo "== the recorder process (fnscope record: drains the shared buffer, encodes, writes)"
python3 "$here/tools/cg_percall.py" "$(pick "$out/$small" recorder)" "$(pick "$out/$large" recorder)" "$dc" 12
