#!/bin/bash
# Checks the test programs' own call counts against gdb: for every function a program
# counts, the number of times gdb sees its first instruction executed must equal what the
# program printed. Run it after changing or adding a program in this directory.
#
# Why: the end-to-end tests (crates/fnscope-cli/tests/record_programs.rs) trust these counts
# as the truth. The tests check with `nm -C` that each counted function exists and was not
# cloned, but two GCC transformations keep the symbol and still break a count, and only an
# independent count finds them:
#   - inlining despite the attribute (GCC 12 ignores noinline on an out-of-class C++
#     constructor definition: put it on the declaration in the class);
#   - tail recursion with an accumulator (`return f(n - 1) * 2 + k`) becomes a loop, so the
#     body runs without a new entry (combine the result with XOR instead).
#
# Usage: tests/programs/check_oracles.sh [PROGRAM...]     (default: all; needs gdb)
# The flags below must match the ones record_programs.rs builds each program with.
set -u

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name source flags...
programs=(
    "basic basic.c -O2 -g"
    "basic-O0 basic.c -O0 -g"
    "basic-cet basic.c -O2 -g -fcf-protection=full"
    "basic-nopie basic.c -O2 -g -fno-pie -no-pie"
    "threads threads.c -O2 -g"
    "recursion recursion.c -O2 -g -fno-optimize-sibling-calls"
    "tailcalls tailcalls.c -O2 -g -foptimize-sibling-calls"
    "exceptions exceptions.cpp -O2 -g"
    "backtrace backtrace.cpp -O2 -g -rdynamic"
    "exceptions_static exceptions.cpp -O2 -g -static-libgcc -static-libstdc++"
    "backtrace_static backtrace.cpp -O2 -g -rdynamic -static-libgcc -static-libstdc++"
    "backtrace_signal backtrace_signal.c -O2 -g -rdynamic"
    "backtrace_async backtrace_async.c -O2 -g"
    "jumps jumps.c -O2 -g"
    "signals signals.c -O2 -g"
    "fork fork.c -O2 -g"
    "exec_self exec_self.c -O2 -g"
    "pthread_exit pthread_exit.c -O2 -g"
    "exit_deep exit_deep.c -O2 -g"
    "abort abort.c -O2 -g"
    "sigkill sigkill.c -O2 -g"
    "asm_heads asm_heads.c -O2 -g"
    "retvals retvals.c -O2 -g"
    "args args.c -O2 -g"
    "registers registers.c -O2 -g"
    "cpp_virtual cpp_virtual.cpp -O2 -g"
)
# sigterm_wait.c is not listed: it waits for a SIGTERM that nobody sends here.

failed=0
for line in "${programs[@]}"; do
    read -r name source flags <<<"$line"
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then
        continue
    fi
    case $source in *.cpp) cc=g++ ;; *) cc=gcc ;; esac
    # shellcheck disable=SC2086 # flags are words
    if ! $cc $flags -pthread -I "$here" -o "$work/$name" "$here/$source"; then
        echo "$name: does not compile"
        failed=1
        continue
    fi
    # The program's own counts (its exit status is the tests' business, not ours).
    (cd "$work" && "./$name" </dev/null >/dev/null 2>"$name.counts")
    names=$(grep -E '^(count|atmost|either) ' "$work/$name.counts" |
        sed -E 's/^[a-z]+ //; s/ [0-9]+$//' | sort -u | tr '\n' '\037')
    (cd "$work" && COUNT_NAMES="$names" COUNT_OUT="$name.gdb" \
        timeout 900 gdb -q -batch -nx -x "$here/gdb_count.py" --args "./$name" \
        >"$name.gdblog" 2>&1 </dev/null)
    if ! python3 - "$work/$name.counts" "$work/$name.gdb" "$name" <<'PY'; then
import collections, sys
counts, gdb_out, name = sys.argv[1:]
want = collections.Counter()
for line in open(counts):
    kind, _, rest = line.rstrip("\n").partition(" ")
    if kind in ("count", "atmost", "either"):
        fn, n = rest.rsplit(" ", 1)
        want[fn] += int(n)
seen = dict(l.rstrip("\n").split("\t") for l in open(gdb_out))
bad = [f"  {fn}: program counts {n}, gdb saw {seen.get(fn)} entries"
       for fn, n in sorted(want.items()) if str(n) != seen.get(fn)]
print(f"{name}: {len(want)} functions, " + ("all counts right" if not bad else "WRONG"))
print("\n".join(bad)) if bad else None
sys.exit(1 if bad or not want else 0)
PY
        failed=1
    fi
done
exit $failed
