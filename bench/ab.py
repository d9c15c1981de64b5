#!/usr/bin/env python3
"""Two fnscope builds against each other, on the figures a change to the hot path moves.

    python3 bench/ab.py --a OLD/fnscope --b NEW/fnscope [--runs 15]
                        [--only fib,values,whole,recorder]
                        [-- EXTRA RECORD OPTIONS]

Measures, for each build, fib(32) and fib3(32) timed by the programs themselves
(bench/workloads/fib_timed.c, fib3_timed.c): `fib`, ns per call in the program in timing
mode; `values`, ns per call in the program with fib3's three arguments and return value
recorded (issue 11's recording); `whole`, CPU time per call of the whole tree (program and
recorder, user and system, from the children's rusage), fib in timing mode (the same
recordings as `fib`'s: one run of fib gives both); `recorder`, CPU time per call of fnscope's
main thread alone, the recorder (`perf stat --no-inherit`, which leaves the program out, in
recordings of fib of their own): a change to the recorder shows there without the program's
noise, which is most of the whole tree's.

The host this runs on is shared, and its speed drifts by more than most changes are worth:
a run's figures move by a nanosecond or two from one batch to the next. So the two builds run
back to back in every round, in the order A B in even rounds and B A in odd ones (the
second run of a pair tends to differ from the first, the trace of the first being written
out meanwhile), and besides each build's median the table gives the median of the per-round
differences B - A and how many rounds B was the cheaper: a change is real when the
difference keeps its sign across batches, not when one median is below the other once.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import SUMMARY_RE, cpu_children  # noqa: E402
from inprocess import VALUES, build_timed, ns_per_call  # noqa: E402

WHAT = {
    "fib": "fib, ns/call in the program",
    "values": "fib3 with 3 arguments and the return value, ns/call in the program",
    "whole": "fib, whole-tree CPU ns/call (program + recorder)",
    "recorder": "fib, the recorder's CPU ns/call (fnscope's main thread)",
}


def one_run(fnscope, prog, opts, trace, extra, counted=None):
    """One recording of `prog` with build `fnscope`: (ns per call in the program, whole-tree
    CPU ns per call); with `counted` (a file for perf's figures), the second is the CPU of
    fnscope's main thread alone."""
    cmd = [fnscope, "record", "-o", trace] + opts + list(extra) + ["--", prog]
    if counted:
        cmd = ["perf", "stat", "--no-inherit", "-x", ",", "-e", "task-clock", "-o", counted, "--"] + cmd
    c0 = cpu_children()
    p = subprocess.run(cmd, capture_output=True, text=True)
    cpu = cpu_children() - c0
    shutil.rmtree(trace, ignore_errors=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    m = SUMMARY_RE.search(p.stderr)
    if not m or int(m.group(3)) == 0:
        sys.exit(f"no calls recorded in the summary of {' '.join(cmd)}:\n{p.stderr}")
    if counted:
        with open(counted) as f:
            msec = [float(line.split(",")[0]) for line in f if ",task-clock," in line]
        if not msec:
            sys.exit(f"perf stat gave no task-clock for {' '.join(cmd)}")
        cpu = msec[0] * 1e-3
    return ns_per_call(p.stdout, cmd), cpu * 1e9 / int(m.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the fnscope build to compare against")
    ap.add_argument("--b", required=True, help="the fnscope build being measured")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--only", default="fib,values,whole,recorder", help="comma-separated: " + ", ".join(WHAT))
    ap.add_argument("extra", nargs="*", help="more `fnscope record` options, for both builds")
    args = ap.parse_args()
    only = [w for w in args.only.split(",") if w]
    unknown = [w for w in only if w not in WHAT]
    if unknown or not only:
        sys.exit(f"--only takes some of {', '.join(WHAT)}; got {args.only!r}")
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    for name, path in builds.items():
        if not os.access(path, os.X_OK):
            sys.exit(f"build {name} ({path}) is not an executable file")
    if "recorder" in only and not shutil.which("perf"):
        sys.exit("--only recorder needs perf (apt-get install linux-perf)")
    tmp = tempfile.mkdtemp(prefix="fnscope-ab-")
    try:
        fib, fib3 = build_timed(tmp)
        trace = os.path.join(tmp, "trace")
        got = {(w, b): [] for w in WHAT for b in builds}
        # Each recording and the figures it gives.
        runs = []
        counted = os.path.join(tmp, "perf.csv")
        if "fib" in only or "whole" in only:
            runs.append((fib, [], ("fib", "whole"), None))
        if "values" in only:
            runs.append((fib3, VALUES, ("values", None), None))
        if "recorder" in only:
            runs.append((fib, [], (None, "recorder"), counted))
        for r in range(args.runs):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for prog, opts, (inside, cpu_figure), perf in runs:
                for b in order:
                    ns, cpu = one_run(builds[b], prog, opts, trace, args.extra, perf)
                    if inside:
                        got[(inside, b)].append(ns)
                    if cpu_figure:
                        got[(cpu_figure, b)].append(cpu)
            print(f"round {r + 1}/{args.runs}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"A = {builds['A']}\nB = {builds['B']}\n{args.runs} rounds, extra options: {' '.join(args.extra) or 'none'}\n")
    print("| figure | A median | B median | B - A, median of the rounds' differences | rounds B cheaper | B / A |")
    print("|---|---|---|---|---|---|")
    for w in only:
        a, b = got[(w, "A")], got[(w, "B")]
        diffs = [y - x for x, y in zip(a, b)]
        wins = sum(d < 0 for d in diffs)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {WHAT[w]} | {ma:.2f} | {mb:.2f} | {statistics.median(diffs):+.2f} | {wins}/{len(diffs)} | {mb / ma:.3f} |")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
