#!/usr/bin/env python3
"""The cost per call inside the traced program, start-up and write-out left out.

    python3 bench/inprocess.py [--runs 11] [-- EXTRA RECORD OPTIONS]

Builds bench/workloads/fib_timed.c (fib(32), 7,049,155 calls, the recursion timed by the
program itself) and runs it natively, under `fnscope record` (timing), with
`--min-duration 1ns` (every call kept: the exit stub's extra test is all that is added) and
with `--flight`, the configurations interleaved round by round. Prints the median, least and
most ns per call of each, and one `rdtsc`'s cost (bench/tools/rdtsc_cost.c): two of them per
call are the floor of timing mode.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    fnscope = os.environ.get("FNSCOPE", os.path.join(ROOT, "target/release/fnscope"))
    if "FNSCOPE" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "fnscope-cli"], cwd=ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="fnscope-inprocess-")
    wl = os.path.join(ROOT, "bench/workloads")
    fib = os.path.join(tmp, "fib_timed")
    subprocess.run(["gcc", "-O2", "-I", wl, "-o", fib, os.path.join(wl, "fib_timed.c")], check=True)
    rdtsc = os.path.join(tmp, "rdtsc_cost")
    subprocess.run(["gcc", "-O2", "-o", rdtsc, os.path.join(ROOT, "bench/tools/rdtsc_cost.c")], check=True)
    trace = os.path.join(tmp, "trace")
    configs = {
        "native": None,
        "timing": [],
        "--min-duration 1ns": ["--min-duration", "1ns"],
        "--flight": ["--flight"],
    }
    got = {k: [] for k in configs}
    for r in range(args.runs):
        for name, opts in configs.items():
            cmd = [fib] if opts is None else [fnscope, "record", "-o", trace] + opts + args.extra + ["--", fib]
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
            m = re.search(r"ns/call=([0-9.]+)", out)
            if not m:
                sys.exit(f"no ns/call in the output of {' '.join(cmd)}:\n{out}")
            got[name].append(float(m.group(1)))
        print(f"round {r + 1}/{args.runs}", file=sys.stderr)
    print(subprocess.run([rdtsc], capture_output=True, text=True).stdout.strip())
    timing = statistics.median(got["timing"])
    print(f"| recording | median ns/call | least | most | vs timing |")
    print(f"|---|---|---|---|---|")
    for name, v in got.items():
        med = statistics.median(v)
        print(f"| {name} | {med:.2f} | {min(v):.2f} | {max(v):.2f} | {med / timing:.2f}x |")


if __name__ == "__main__":
    main()
