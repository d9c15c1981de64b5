#!/usr/bin/env python3
"""Start-up cost of tracing: wall time of programs run natively and under `fnscope record`,
with the analysis cache warm (one untimed traced run of each first), runs interleaved.

Every process the agent loads into pays its start-up (analysis from the cache, trampolines,
image table, patching), so short-lived processes show it best: `make -j2` of a generated
10-file C project (each gcc runs cc1, as, collect2, ld), `cc1plus --version` (41k functions)
and `git --version`.

    bench/startup.py [--fnscope target/release/fnscope] [--runs 7] [--cold]

--cold also times the first traced run of `cc1plus --version` with an empty analysis cache
(a cache folder of its own, under a temporary XDG_CACHE_HOME).
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fnscope", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "fnscope"))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    fns = os.path.abspath(a.fnscope)
    cc1plus = subprocess.run(["g++", "-print-prog-name=cc1plus"], capture_output=True, text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="fnscope-startup-")
    proj = os.path.join(work, "proj")
    out = os.path.join(work, "trace")
    generate(proj)
    clean = ["make", "-s", "-C", proj, "clean"]

    def traced(cmd):
        shutil.rmtree(out, ignore_errors=True)
        return [fns, "record", "-o", out, "--"] + cmd

    cases = [
        ("make -j2", ["make", "-s", "-j2"], proj, True),
        ("cc1plus --version", [cc1plus, "--version"], None, False),
        ("git --version", ["git", "--version"], None, False),
    ]
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min); {os.cpu_count()} cores; {a.runs} runs each")
    results = []
    try:
        for name, cmd, cwd, needs_clean in cases:
            # Warm-up: the analysis cache, the page cache.
            for c in (cmd, traced(cmd)):
                if needs_clean:
                    subprocess.run(clean, check=True, stdout=subprocess.DEVNULL)
                timed(c, cwd)
            native, tr = [], []
            for _ in range(a.runs):
                for kind in (native, tr):
                    if needs_clean:
                        subprocess.run(clean, check=True, stdout=subprocess.DEVNULL)
                    kind.append(timed(cmd if kind is native else traced(cmd), cwd))
            results.append((name, statistics.median(native), statistics.median(tr)))
        if a.cold:
            cache_home = os.path.join(work, "cache")
            env = dict(os.environ, XDG_CACHE_HOME=cache_home)
            cold, warm = [], []
            for _ in range(a.runs):
                shutil.rmtree(cache_home, ignore_errors=True)
                cold.append(timed(traced([cc1plus, "--version"]), env=env))
                warm.append(timed(traced([cc1plus, "--version"]), env=env))
            results.append(("cc1plus --version, cold cache", statistics.median(warm), statistics.median(cold)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'':32} {'native ms':>10} {'traced ms':>10} {'ratio':>7}")
    for name, n, t in results:
        label = "warm ms" if "cold" in name else ""
        if label:
            print(f"{name:32} {n * 1e3:10.1f} {t * 1e3:10.1f} {t / n:7.2f}   (first column: traced, warm)")
        else:
            print(f"{name:32} {n * 1e3:10.1f} {t * 1e3:10.1f} {t / n:7.2f}")
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
