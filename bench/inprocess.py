#!/usr/bin/env python3
"""The cost per call inside the traced program, start-up and write-out left out.

    python3 bench/inprocess.py [--runs 11] [-- EXTRA RECORD OPTIONS]

Builds bench/workloads/fib_timed.c (fib(32), 7,049,155 calls, the recursion timed by the
program itself) and runs it natively, under `fnscope record` (timing), with
`--min-duration 1ns` (every call kept: the exit stub's extra test is all that is added) and
with `--flight`; and bench/workloads/fib3_timed.c (the same recursion with three integer
arguments) timed plainly and with its three arguments and return value recorded (`-A`,
`-R`), also with `--flight`, where the recorder copies chunks instead of compressing them
alongside; and, when `uftrace` is on PATH, fib under `uftrace record -P .` (dynamic patching of
the same binary). The configurations are interleaved round by round. Prints the median,
least and most ns per call of each, and one `rdtsc`'s cost (bench/tools/rdtsc_cost.c): two of
them per call are the floor of timing mode, measured once per round.

bench/run.sh calls `measure` for its issue 8 and 11 targets.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Issue 11's recording of fib3: its three arguments and its return value.
VALUES = ["-A", "fib3@arg1/i64,arg2/i32,arg3/i32", "-R", "fib3@i64"]


def build_timed(tmp):
    """Builds bench/workloads/fib_timed.c and fib3_timed.c into `tmp`; returns their paths."""
    wl = os.path.join(ROOT, "bench/workloads")
    built = []
    for name in ("fib_timed", "fib3_timed"):
        exe = os.path.join(tmp, name)
        subprocess.run(["gcc", "-O2", "-I", wl, "-o", exe, os.path.join(wl, name + ".c")], check=True)
        built.append(exe)
    return tuple(built)


def ns_per_call(stdout, cmd):
    """The `ns/call=` figure a timed workload prints; exits with the output when there is none."""
    m = re.search(r"ns/call=([0-9.]+)", stdout)
    if not m:
        sys.exit(f"no ns/call in the output of {' '.join(cmd)}:\n{stdout}")
    return float(m.group(1))


def measure(fnscope, runs, extra=(), uftrace=None):
    """Runs every configuration `runs` times, interleaved, and `rdtsc_cost` once per round.

    Returns ({"rdtsc": ns, "rdtscp": ns, "clock_gettime": ns}, the medians over the rounds of
    what bench/tools/rdtsc_cost.c prints, and {configuration: [ns per call, one per round]}).
    `uftrace` (a path, or None) adds fib under `uftrace record -P .`.
    """
    tmp = tempfile.mkdtemp(prefix="fnscope-inprocess-")
    try:
        fib, fib3 = build_timed(tmp)
        rdtsc = os.path.join(tmp, "rdtsc_cost")
        subprocess.run(["gcc", "-O2", "-o", rdtsc, os.path.join(ROOT, "bench/tools/rdtsc_cost.c")], check=True)
        trace = os.path.join(tmp, "trace")
        values = VALUES
        configs = {
            "native": (fib, None),
            "timing": (fib, []),
            "--min-duration 1ns": (fib, ["--min-duration", "1ns"]),
            "--flight": (fib, ["--flight"]),
            "fib3 native": (fib3, None),
            "fib3 timing": (fib3, []),
            "fib3 -A (3 args) -R": (fib3, values),
            # The recorder copies chunks instead of compressing them: the stubs' own cost, with
            # the least of the recorder's work running alongside.
            "fib3 -A (3 args) -R --flight": (fib3, values + ["--flight"]),
        }
        if uftrace:
            configs["uftrace -P ."] = (fib, "uftrace")
        got = {k: [] for k in configs}
        # The floor is measured in every round too: on a shared host one `rdtsc` costs more
        # when the neighbours are busy, as every timed call does.
        costs = {}
        for r in range(runs):
            for name, (prog, opts) in configs.items():
                if opts == "uftrace":
                    cmd = [uftrace, "record", "-d", trace + ".uftrace", "--no-libcall", "-P", ".", prog]
                else:
                    cmd = [prog] if opts is None else [fnscope, "record", "-o", trace] + opts + list(extra) + ["--", prog]
                out = subprocess.run(cmd, capture_output=True, text=True).stdout
                got[name].append(ns_per_call(out, cmd))
                shutil.rmtree(trace, ignore_errors=True)
                shutil.rmtree(trace + ".uftrace", ignore_errors=True)
            out = subprocess.run([rdtsc], capture_output=True, text=True).stdout
            for m in re.finditer(r"^([\w_]+)-ns: ([0-9.]+)", out, re.M):
                costs.setdefault(m.group(1), []).append(float(m.group(2)))
            if "rdtsc" not in costs:
                sys.exit(f"no rdtsc-ns in the output of {rdtsc}:\n{out}")
            print(f"in-process round {r + 1}/{runs}", file=sys.stderr)
        return {k: statistics.median(v) for k, v in costs.items()}, got
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    fnscope = os.environ.get("FNSCOPE", os.path.join(ROOT, "target/release/fnscope"))
    if "FNSCOPE" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "fnscope-cli"], cwd=ROOT, check=True)
    costs, got = measure(fnscope, args.runs, args.extra, shutil.which("uftrace"))
    for name, ns in costs.items():
        print(f"{name}-ns: {ns:.2f} (median over the rounds)")
    rdtsc_ns = costs["rdtsc"]
    print(f"| recording | median ns/call | least | most | vs timing of the same program |")
    print(f"|---|---|---|---|---|")
    for name, v in got.items():
        med = statistics.median(v)
        timing = statistics.median(got["fib3 timing" if name.startswith("fib3") else "timing"])
        print(f"| {name} | {med:.2f} | {min(v):.2f} | {max(v):.2f} | {med / timing:.2f}x |")
    timing = statistics.median(got["timing"])
    print(f"\ntiming mode: {timing / (2 * rdtsc_ns):.2f}x the floor of two rdtsc ({2 * rdtsc_ns:.2f} ns)")
    if "uftrace -P ." in got:
        print(f"uftrace -P . costs {statistics.median(got['uftrace -P .']) / timing:.2f}x fnscope's timing mode per call")


if __name__ == "__main__":
    main()
