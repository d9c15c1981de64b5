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
    tmp = a.keep or tempfile.mkdtemp(prefix="fnscope-views-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    os.makedirs(tmp, exist_ok=True)
    wl = os.path.join(ROOT, "bench/workloads")
    fib = os.path.join(tmp, "fib")
    subprocess.run(["gcc", "-O2", "-fno-inline", "-I", wl, "-o", fib, os.path.join(wl, "fib.c")], check=True)
    trace = os.path.join(tmp, "trace")
    r = subprocess.run([fnscope, "record", "-o", trace, "--", fib, str(a.n)], capture_output=True, text=True, check=True)
    calls = int(r.stderr.split(" calls recorded")[0].split()[-1])
    print(f"fib({a.n}): {calls:,} calls, trace {os.path.getsize(os.path.join(trace, 'trace.fns')) / 2**20:.1f} MiB", file=sys.stderr)
    pf = os.path.join(tmp, "out.pftrace")
    views = [
        ("report", [fnscope, "report", "-i", trace], None, "≤ 4 s, ≤ 100 MB (issue 8)"),
        ("replay", [fnscope, "replay", "-i", trace], None, "≤ 30 s, ≤ 100 MB (issue 8)"),
        ("export --format perfetto", [fnscope, "export", "--format", "perfetto", "-i", trace, "-o", pf], pf, "≤ 20 s, ≤ 200 MB (issue 9)"),
    ]
    rows = []
    for name, cmd, out, target in views:
        got = []
        for _ in range(a.runs):
            if out and os.path.exists(out):
                os.unlink(out)
            got.append(timed(cmd))
        size = os.path.getsize(out) / calls if out else None
        wall = statistics.median(g[0] for g in got)
        cpu = statistics.median(g[1] for g in got)
        rss = max(g[2] for g in got) / 1024
        rows.append((name, wall, cpu, rss, size, target))
        print(f"{name}: {wall:.2f} s", file=sys.stderr)
    print(f"| view ({calls:,} calls, one thread) | wall | CPU | peak memory | output | target |")
    print("|---|---|---|---|---|---|")
    for name, wall, cpu, rss, size, target in rows:
        out = f"{size:.1f} B/call" if size else "—"
        print(f"| `{name}` | {wall:.2f} s | {cpu:.2f} s | {rss:.0f} MB | {out} | {target} |")
    if not a.keep:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
