#!/usr/bin/env python3
"""The views over a very large trace: `report`, `replay` and the Perfetto export of one
single-threaded tree of about 126 million calls (fib(38) built with -fno-inline, so every
call is a call), with wall time, CPU time, peak memory and output size.

    python3 bench/views.py [--n 38] [--runs 1] [--keep DIR]

One tree is the hard case for the call-by-call views: its root returns last, so putting the
calls in the order they started holds or spills all of them. Outputs go to a temporary
folder on the same disk as the trace (the Perfetto file is about 4 GB); it is removed at the
end unless --keep names a folder to use instead. Prints a Markdown table next to the
targets of issues 8 and 9.

bench/run.sh calls `measure` (report and replay) for its issue 8 targets.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, stdout=subprocess.DEVNULL):
    """Wall s, CPU s (user + system) and peak resident KB of `cmd`, from GNU time."""
    r = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M"] + cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    wall, user, sys_, rss = r.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(sys_), int(rss)


def measure(fnscope, n, runs, views, keep=None):
    """Records fib(n) and times each of `views` (names of VIEWS) `runs` times over it.

    Returns (calls recorded, rows of (view, wall s, CPU s, peak MB, output bytes per call or
    None, target)), medians of wall and CPU time and the most memory. Works in `keep`, or in a
    temporary folder removed at the end."""
    tmp = keep or tempfile.mkdtemp(prefix="fnscope-views-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    os.makedirs(tmp, exist_ok=True)
    try:
        wl = os.path.join(ROOT, "bench/workloads")
        fib = os.path.join(tmp, "fib")
        subprocess.run(["gcc", "-O2", "-fno-inline", "-I", wl, "-o", fib, os.path.join(wl, "fib.c")], check=True)
        trace = os.path.join(tmp, "trace")
        shutil.rmtree(trace, ignore_errors=True)
        r = subprocess.run([fnscope, "record", "-o", trace, "--", fib, str(n)], capture_output=True, text=True, check=True)
        calls = int(r.stderr.split(" calls recorded")[0].split()[-1])
        print(f"fib({n}): {calls:,} calls, trace {os.path.getsize(os.path.join(trace, 'trace.fns')) / 2**20:.1f} MiB", file=sys.stderr)
        rows = []
        for name in views:
            args, out_name, target = VIEWS[name]
            out = os.path.join(tmp, out_name) if out_name else None
            cmd = [fnscope] + args + ["-i", trace] + (["-o", out] if out else [])
            got = []
            for _ in range(runs):
                if out and os.path.exists(out):
                    os.unlink(out)
                got.append(timed(cmd))
            size = os.path.getsize(out) / calls if out else None
            wall = statistics.median(g[0] for g in got)
            cpu = statistics.median(g[1] for g in got)
            rss = max(g[2] for g in got) / 1024
            rows.append((name, wall, cpu, rss, size, target))
            print(f"{name}: {wall:.2f} s", file=sys.stderr)
        return calls, rows
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


# Per view: fnscope's arguments before `-i TRACE`, the file it writes (`-o`, in the working
# folder) or None for standard output (discarded), and its target.
VIEWS = {
    "report": (["report"], None, "≤ 4 s, ≤ 100 MB (issue 8)"),
    "replay": (["replay"], None, "≤ 30 s, ≤ 100 MB (issue 8)"),
    "export --format perfetto": (["export", "--format", "perfetto"], "out.pftrace", "≤ 20 s, ≤ 200 MB (issue 9)"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=38)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep")
    a = ap.parse_args()
    if not os.path.exists("/usr/bin/time"):
        sys.exit("needs GNU time: apt-get install time")
    fnscope = os.environ.get("FNSCOPE", os.path.join(ROOT, "target/release/fnscope"))
    if "FNSCOPE" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "fnscope-cli"], cwd=ROOT, check=True)
    calls, rows = measure(fnscope, a.n, a.runs, list(VIEWS), a.keep)
    print(f"| view ({calls:,} calls, one thread) | wall | CPU | peak memory | output | target |")
    print("|---|---|---|---|---|---|")
    for name, wall, cpu, rss, size, target in rows:
        out = f"{size:.1f} B/call" if size else "—"
        print(f"| `{name}` | {wall:.2f} s | {cpu:.2f} s | {rss:.0f} MB | {out} | {target} |")


if __name__ == "__main__":
    main()
