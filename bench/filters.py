#!/usr/bin/env python3
"""Record-time filters and the flight recorder (issue 12), measured.

    python3 bench/filters.py            # from the repository root; BENCH_RUNS=5 by default

Part 1, a game-like program (tests/programs/frames.c: a frame loop at 60 frames a second for
3 s, each frame calling into libm and libc, one 40 ms frame): bytes per second written to disk
with no filter, with --app-only, with --min-duration 50us and in flight mode, with libc and
libm hooked (--lib) in every case. The function tables written at start-up (measured with a
run of no frames) are shown apart and left out of the rate.

Part 2, the cost per call on fib(32) (bench/workloads/fib.c, 7,049,155 calls): native, plain
timing mode, --min-duration 1ns (every call kept: the stub's extra compare is all that is
added), --min-duration 1ms (every call dropped), flight mode, and --filter main (fib is
filtered out, so not hooked). ns/call = (traced - native wall time) / 7,049,155 calls, from
the median of BENCH_RUNS rounds with the configurations interleaved; CPU includes the recorder.

Prints Markdown tables on stdout.
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
FNSCOPE = os.environ.get("FNSCOPE", os.path.join(ROOT, "target/release/fnscope"))
FIB_CALLS = 7_049_155


def build(tmp):
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "fnscope-cli"], cwd=ROOT, check=True)
    progs = os.path.join(ROOT, "tests/programs")
    frames = os.path.join(tmp, "frames")
    subprocess.run(["gcc", "-O2", "-o", frames, os.path.join(progs, "frames.c"), "-I", progs, "-lm"], check=True)
    fib = os.path.join(tmp, "fib")
    subprocess.run(["gcc", "-O2", "-o", fib, os.path.join(ROOT, "bench/workloads/fib.c")], check=True)
    return frames, fib


def timed(cmd):
    """Wall seconds and CPU seconds (user + system of the command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def folder_bytes(path):
    total = 0
    for d, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def calls_in(trace):
    out = subprocess.run([FNSCOPE, "info", "-i", trace], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("calls recorded:"):
            return int(line.split()[-1])
    return 0


def game(frames, tmp):
    args = [frames, "180", "16.667", "90:40", "work:300"]
    # The same recording with no frames: what is written whatever the run's length (the
    # function tables of the program, libc and libm), left out of the rate.
    empty = [frames, "0", "16.667"]
    libs = ["--lib", "libc", "--lib", "libm"]
    configs = [
        ("no filter", libs),
        ("--app-only", libs + ["--app-only"]),
        ("--min-duration 50us", libs + ["--min-duration", "50us"]),
        ("--flight --trigger 'frame>30ms'", libs + ["--flight", "--trigger", "frame>30ms"]),
    ]
    rows = {name: [] for name, _ in configs}
    for r in range(RUNS):
        for name, opts in configs:
            trace = os.path.join(tmp, "game")
            shutil.rmtree(trace, ignore_errors=True)
            wall, _ = timed([FNSCOPE, "record", "-o", trace] + opts + ["--"] + args)
            main = os.path.getsize(os.path.join(trace, "trace.fns"))
            snaps = [os.path.join(trace, s) for s in os.listdir(trace) if s.startswith("snapshot-")]
            snap_bytes = sum(folder_bytes(s) for s in snaps)
            calls = calls_in(trace) + sum(calls_in(s) for s in snaps)
            shutil.rmtree(trace, ignore_errors=True)
            timed([FNSCOPE, "record", "-o", trace] + opts + ["--"] + empty)
            fixed = os.path.getsize(os.path.join(trace, "trace.fns"))
            rows[name].append((wall, main, snap_bytes, len(snaps), calls, fixed))
        print(f"game round {r + 1}/{RUNS} done", file=sys.stderr)
    print("## Game-like program: 180 frames at 60 fps (3 s), libc and libm hooked, one 40 ms frame\n")
    print("| recording | bytes/s written while running | trace.fns (of which function tables) | snapshots | calls recorded | vs technique D (8 MB in 3-5 s: 1.6-2.7 MB/s) |")
    print("|---|---|---|---|---|---|")
    for name, _ in configs:
        v = rows[name]
        wall = statistics.median(x[0] for x in v)
        main = statistics.median(x[1] for x in v)
        snap = statistics.median(x[2] for x in v)
        nsnap = statistics.median(x[3] for x in v)
        calls = statistics.median(x[4] for x in v)
        fixed = statistics.median(x[5] for x in v)
        rate = max(main - fixed, 0) / wall
        snap_text = f"{int(nsnap)} ({snap / 1024:.1f} KiB)" if nsnap else "-"
        print(
            f"| {name} | {rate / 1024:.1f} KiB/s | {main / 1024:.1f} KiB ({fixed / 1024:.1f} KiB) | {snap_text} "
            f"| {int(calls):,} | {rate / 2.0e6 * 100:.2f}% of 2 MB/s |"
        )
    print()


def costs(fib, tmp):
    configs = [
        ("native", None),
        ("timing", []),
        ("--min-duration 1ns (all kept)", ["--min-duration", "1ns"]),
        ("--min-duration 1ms (all dropped)", ["--min-duration", "1ms"]),
        ("--flight", ["--flight"]),
        ("--filter main (fib not hooked)", ["--filter", "main"]),
    ]
    rows = {name: [] for name, _ in configs}
    for r in range(RUNS):
        order = configs[r % len(configs):] + configs[: r % len(configs)]
        for name, opts in order:
            trace = os.path.join(tmp, "fib-trace")
            shutil.rmtree(trace, ignore_errors=True)
            cmd = [fib, "32"] if opts is None else [FNSCOPE, "record", "-o", trace] + opts + ["--", fib, "32"]
            rows[name].append(timed(cmd))
        print(f"cost round {r + 1}/{RUNS} done", file=sys.stderr)
    nat_wall = statistics.median(x[0] for x in rows["native"])
    nat_cpu = statistics.median(x[1] for x in rows["native"])
    base = None
    print(f"## Cost per call, fib(32), {FIB_CALLS:,} calls, median of {RUNS} rounds\n")
    print("| recording | wall ms | ns/call (wall) | CPU ms | ns/call (CPU, recorder included) | vs timing (wall ns/call) |")
    print("|---|---|---|---|---|---|")
    for name, _ in configs:
        wall = statistics.median(x[0] for x in rows[name])
        cpu = statistics.median(x[1] for x in rows[name])
        per = (wall - nat_wall) / FIB_CALLS * 1e9
        per_cpu = (cpu - nat_cpu) / FIB_CALLS * 1e9
        if name == "timing":
            base = per
        ratio = f"{per / base:.2f}x" if base and name != "native" else "-"
        print(f"| {name} | {wall * 1e3:.0f} | {per:.1f} | {cpu * 1e3:.0f} | {per_cpu:.1f} | {ratio} |")
    print()


def main():
    tmp = tempfile.mkdtemp(prefix="fnscope-bench-filters-")
    try:
        frames, fib = build(tmp)
        game(frames, tmp)
        costs(fib, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
