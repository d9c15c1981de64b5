#!/usr/bin/env python3
"""Start-up cost of tracing: wall time of programs run natively and under `fnscope record`,
with the analysis cache warm (one untimed traced run of each first), runs interleaved.

Every process the agent loads into pays its start-up (analysis from the cache, trampolines,
image table, patching), so short-lived processes show it best: `make -j2` of a generated
10-file C project (each gcc runs cc1, as, collect2, ld), `cc1plus --version` (41k functions)
and `git --version`.

    bench/startup.py [--fnscope target/release/fnscope]... [--runs 7] [--cold]

Several --fnscope binaries (say, before and after a change) are timed interleaved with the
native runs. --cold also times the first traced run of `cc1plus --version` with an empty
analysis cache (a cache folder of its own, under a temporary XDG_CACHE_HOME) and a warm run
after it.

bench/run.sh calls `measure` for its issue 8 targets.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def generate(root):
    """Ten small C files (a few functions each, as in a project of many small units) and a
    Makefile: compiling one takes little more than starting the compiler's processes."""
    os.makedirs(root, exist_ok=True)
    objs = []
    for i in range(10):
        with open(os.path.join(root, f"f{i}.c"), "w") as f:
            for j in range(5):
                f.write(f"int f{i}_{j}(int x) {{ return x > 3 ? f{i}_{j}(x / 2) + {j} : x * {j + 1}; }}\n")
            if i == 0:
                f.write("int main(void) { return f0_1(7) == 0; }\n")
        objs.append(f"f{i}.o")
    with open(os.path.join(root, "Makefile"), "w") as f:
        f.write(f"OBJS = {' '.join(objs)}\n")
        f.write("prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n")
        f.write("%.o: %.c\n\t$(CC) -O1 -c -o $@ $<\n")
        f.write("clean:\n\trm -f prog $(OBJS)\n")


def timed(cmd, cwd=None, env=None):
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def measure(binaries, runs, cold):
    """Times the cases natively and under each fnscope binary, interleaved, `runs` times.

    Returns rows of (case, [native seconds or None, then seconds per binary]), medians;
    with `cold`, two more rows: `cc1plus --version` with an empty analysis cache, and the run
    right after it."""
    cc1plus = subprocess.run(["g++", "-print-prog-name=cc1plus"], capture_output=True, text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="fnscope-startup-")
    proj = os.path.join(work, "proj")
    out = os.path.join(work, "trace")
    generate(proj)
    clean = ["make", "-s", "-C", proj, "clean"]

    def traced(fns, cmd):
        shutil.rmtree(out, ignore_errors=True)
        return [fns, "record", "-o", out, "--"] + cmd

    cases = [
        ("make -j2", ["make", "-s", "-j2"], proj, True),
        ("cc1plus --version", [cc1plus, "--version"], None, False),
        ("git --version", ["git", "--version"], None, False),
    ]
    rows = []
    try:
        for name, cmd, cwd, needs_clean in cases:
            cmds = [cmd] + [traced(b, cmd) for b in binaries]
            # Warm-up: the analysis cache, the page cache.
            for c in cmds:
                if needs_clean:
                    subprocess.run(clean, check=True, stdout=subprocess.DEVNULL)
                timed(c, cwd)
            times = [[] for _ in cmds]
            for _ in range(runs):
                for k, c in enumerate(cmds):
                    if needs_clean:
                        subprocess.run(clean, check=True, stdout=subprocess.DEVNULL)
                    if k > 0:
                        shutil.rmtree(out, ignore_errors=True)
                    times[k].append(timed(c, cwd))
            rows.append((name, [statistics.median(t) for t in times]))
        if cold:
            cache_home = os.path.join(work, "cache")
            env = dict(os.environ, XDG_CACHE_HOME=cache_home)
            first = [[] for _ in binaries]
            after = [[] for _ in binaries]
            for _ in range(runs):
                for k, b in enumerate(binaries):
                    shutil.rmtree(cache_home, ignore_errors=True)
                    first[k].append(timed(traced(b, [cc1plus, "--version"]), env=env))
                    after[k].append(timed(traced(b, [cc1plus, "--version"]), env=env))
            rows.append(("cc1plus, cold cache", [None] + [statistics.median(t) for t in first]))
            rows.append(("cc1plus, right after", [None] + [statistics.median(t) for t in after]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fnscope", action="append")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    default = os.path.join(os.path.dirname(__file__), "..", "target", "release", "fnscope")
    binaries = [os.path.abspath(b) for b in (a.fnscope or [default])]
    load = os.getloadavg()
    print(f"load before: {load[0]:.2f} {load[1]:.2f} (1, 5 min); {os.cpu_count()} cores; {a.runs} runs each, medians")
    for i, b in enumerate(binaries):
        print(f"[{i}] {b}")
    rows = measure(binaries, a.runs, a.cold)
    head = f"{'':24} {'native ms':>10}" + "".join(f" {f'[{i}] ms':>9} {f'[{i}] ×':>7}" for i in range(len(binaries)))
    print(head)
    for name, t in rows:
        line = f"{name:24} " + (f"{t[0] * 1e3:10.1f}" if t[0] else f"{'':10}")
        for x in t[1:]:
            line += f" {x * 1e3:9.1f} " + (f"{x / t[0]:7.2f}" if t[0] else f"{'':7}")
        print(line)
    load = os.getloadavg()
    print(f"load after: {load[0]:.2f} {load[1]:.2f}")


if __name__ == "__main__":
    main()
