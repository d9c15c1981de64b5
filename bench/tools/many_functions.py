#!/usr/bin/env python3
"""What the number of distinct functions a program calls costs a traced call (fib calls one
function, so the workloads' figures leave this out; bench/run.sh ends with this script's table).

Generates programs that call N small functions (64, 1,024, 4,096) once each per round, in
a fixed order from N call sites, and time their rounds themselves; runs each natively, under
`fnscope record` (also with the functions in a shared library, `--lib`) and, if it is
installed, under `uftrace record -P .`, and prints ns per call. Then times mock-ups of the control flow of a call, in assembler, for the same N (no
time stamps, no records: branches only):

- `plain`: the caller calls the function.
- `hooked`: as fnscope runs a hooked call. The function's first bytes jump to its slot (in an
  area of its own), the slot loads the address of its relocated prologue into r11 and jumps
  to the one shared stub through a pointer (`jmp [rip + x]`: the stub lies in the agent's
  library, out of a direct jump's reach), the stub calls the prologue from a single `call r11`
  site (so that the function returns to the shared exit, predicted by the return stack), the
  prologue jumps back into the function, and the stub returns.
- `direct`: the same with a direct jump from the slot to the stub, as if the stub lay within
  2 GiB of the slots.
- `per-slot`: `direct`, but the slot calls the shared entry (which returns), then calls the
  prologue itself and jumps to the shared exit: no indirect call whose target varies, but a
  call and a return more.

    python3 bench/tools/many_functions.py [--fnscope target/release/fnscope] [--runs 3]

On the Intel Xeon VM of stop 41 (ns a call for 64 / 1,024 / 4,096 functions, medians of 3
runs): native 1.7 / 1.9 / 2.2, fnscope 20.9 / 30.6 / 41.9, uftrace 114 / 145 / 154 (fnscope
5.5, 4.7 and 3.7 times cheaper). What grows with the number of functions is the branches a
hooked call takes: seven taken branches against two natively, five of them at addresses of
the function's own (its call site, the jump to the slot, the slot's jump to the stub, the jump
back, its return), which outgrow the branch predictors. In the mock-ups (see the table run.sh
prints) the slots' jumps to the stub through a pointer cost most: about 3 ns a call more than
direct jumps at 1,024 functions (in most runs: that size flips between two figures), 4 ns at
4,096, nothing at 64. The shared indirect call is not
the cause: its target is predicted from the path that led to it, and calling from the slot
costs more. This is where real programs' calls lose against fib's (`cc1`: 28 ns a call in the
stubs). The `in a .so` column runs the same functions from a shared library traced with
`--lib`: there the agent's library, and so the stub, usually lies within a direct jump of the
slots, and the slots jump to it directly (27.5 → 20.5 ns a call at 1,024 functions, 38.3 →
31.7 at 4,096, against the binary before that change). In the program itself the slots
jumped directly to a thunk in their area's header, one indirect jump for the area (29.4 →
23.9 and 38.1 → 32.9 ns); they now jump directly to a copy of the stubs placed in their area
(23.7 → 19.9 and 32.1 → 30.6 ns, medians of 2 runs of 3 interleaved with the binary before).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile

SIZES = (64, 1024, 4096)

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void run(void);
int main(int argc, char **argv) {
    long n = atol(argv[1]), reps = atol(argv[2]);
    for (int r = 0; r < 10; r++) run();
    double best = 1e30;
    for (int t = 0; t < 5; t++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long r = 0; r < reps; r++) run();
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ((double)reps * n);
        if (ns < best) best = ns;
    }
    printf("%.3f\n", best);
    return 0;
}
"""


def functions(n):
    """C source: n functions and `run`, a round that calls each once, from its own call site."""
    lines = ["volatile int sink;"]
    for k in range(n):
        lines.append(f"__attribute__((noinline)) void f{k}(void) {{ sink += {k % 7}; }}")
    lines.append("__attribute__((noinline)) void run(void) {")
    lines += [f"    f{k}();" for k in range(n)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def build_lib(work, n):
    """The program with its functions in a shared library of their own (`libmanyN.so`,
    traced with `--lib`): the agent's library then usually lies within a direct jump of the
    slots. Returns the program and the library's file name."""
    # Calls inside the library go straight to their function, as in the program, not through
    # its PLT.
    lib = build(work, f"libmany{n}.so", [(f"libmany{n}.c", functions(n))], ["-shared", "-fPIC", "-fno-semantic-interposition"])
    exe = build(work, f"manylib{n}", [("main.c", MAIN)], [lib, f"-Wl,-rpath,{work}"])
    return exe, os.path.basename(lib)


def mock(n, design):
    """Assembler for `run` and n functions (with their slots), with the control flow of
    `design`."""
    o = [".intel_syntax noprefix", ".section .note.GNU-stack,\"\",@progbits", ".text", ".globl run", "run:"]
    o += [f"    call fn{k}" for k in range(n)]
    o += ["    ret", "shared:", "    call r11", "    ret", "entry:", "    ret", "exit:", "    ret"]
    for k in range(n):
        o += [".p2align 4", f"fn{k}:"]
        o += ["    add rax, 1", "    ret"] if design == "plain" else [f"    jmp slot{k}", f"body{k}:", "    ret"]
    if design != "plain":
        o.append(".p2align 12")
        for k in range(n):
            o += [".p2align 5", f"slot{k}:"]
            if design == "hooked":
                o += [f"    lea r11, [rip + prologue{k}]", "    jmp qword ptr [rip + shared_at]"]
            elif design == "direct":
                o += [f"    lea r11, [rip + prologue{k}]", "    jmp shared"]
            else:
                o += ["    call entry", f"    call prologue{k}", "    jmp exit"]
            o += [f"prologue{k}:", "    add rax, 1", f"    jmp body{k}"]
    o += [".data", "shared_at:", "    .quad shared"]
    return "\n".join(o) + "\n"


def build(work, name, sources, flags=()):
    """Writes `sources` ((file name, text) pairs) into `work` and builds them with gcc -O2 and
    `flags` into `work/name`; returns its path."""
    out = os.path.join(work, name)
    paths = []
    for fname, text in sources:
        p = os.path.join(work, fname)
        with open(p, "w") as f:
            f.write(text)
        paths.append(p)
    subprocess.run(["gcc", "-O2", "-o", out] + paths + list(flags), check=True)
    return out


def ns_per_call(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


DESIGNS = ("plain", "hooked", "direct", "per-slot")


def measure(fnscope, runs, uftrace=None):
    """Times the programs and the mock-ups, `runs` times each, interleaved per size.

    Returns {"programs": [(n, native, fnscope, fnscope with the functions in a library,
    uftrace or None)], "mockups": [(n, and a figure per design of DESIGNS)]}, ns per call,
    medians. bench/run.sh calls it (BENCH_EXTRA `many`)."""
    work = tempfile.mkdtemp(prefix="fnscope-many-")
    trace = os.path.join(work, "trace")
    out = {"programs": [], "mockups": []}
    try:
        for n in SIZES:
            exe = build(work, f"many{n}", [(f"many{n}.c", functions(n)), ("main.c", MAIN)])
            lib_exe, lib = build_lib(work, n)
            args = [str(n), str(max(4_000_000 // n, 1))]
            native, traced, in_lib, peer = [], [], [], []
            for _ in range(runs):
                native.append(ns_per_call([exe] + args))
                shutil.rmtree(trace, ignore_errors=True)
                traced.append(ns_per_call([fnscope, "record", "-o", trace, "--", exe] + args))
                shutil.rmtree(trace, ignore_errors=True)
                in_lib.append(ns_per_call([fnscope, "record", "--lib", lib, "-o", trace, "--", lib_exe] + args))
                if uftrace:
                    shutil.rmtree(trace, ignore_errors=True)
                    # uftrace takes several times longer a call: a tenth of the rounds.
                    peer.append(ns_per_call([uftrace, "record", "-d", trace, "-P", ".", exe, str(n), str(max(400_000 // n, 1))]))
            out["programs"].append((n, statistics.median(native), statistics.median(traced), statistics.median(in_lib),
                                    statistics.median(peer) if peer else None))
        for n in SIZES:
            exes = [build(work, f"mock{n}{d}", [("main.c", MAIN), (f"mock{n}{d}.S", mock(n, d))]) for d in DESIGNS]
            times = [[] for _ in DESIGNS]
            for _ in range(runs):
                for k, exe in enumerate(exes):
                    times[k].append(ns_per_call([exe, str(n), str(max(4_000_000 // n, 1))]))
            out["mockups"].append((n,) + tuple(statistics.median(t) for t in times))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--fnscope", default=os.environ.get("FNSCOPE", os.path.join(here, "..", "..", "target", "release", "fnscope")))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    got = measure(a.fnscope, a.runs, shutil.which("uftrace"))
    print(f"{'functions':>10} {'native ns':>10} {'fnscope ns':>11} {'in a .so ns':>12} {'uftrace ns':>11}")
    for n, native, traced, in_lib, peer in got["programs"]:
        peer_ns = f"{peer:11.2f}" if peer is not None else f"{'-':>11}"
        print(f"{n:>10} {native:10.2f} {traced:11.2f} {in_lib:12.2f} {peer_ns}")
    print(f"\n{'functions':>10}" + "".join(f" {d + ' ns':>12}" for d in DESIGNS) + "   (mock-ups: branches only)")
    for row in got["mockups"]:
        print(f"{row[0]:>10}" + "".join(f" {x:12.2f}" for x in row[1:]))


if __name__ == "__main__":
    main()
