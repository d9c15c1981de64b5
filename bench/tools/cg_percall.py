#!/usr/bin/env python3
"""Per-call instruction counts from two callgrind profiles of the same program at two sizes.

Usage: cg_percall.py SMALL.out LARGE.out CALLS_DIFFERENCE [TOP]

Prints, per function, (Ir in LARGE - Ir in SMALL) / CALLS_DIFFERENCE: the instructions each
extra call costs, with the fixed costs (start-up, hooking) cancelled out. Then the fixed cost
of the SMALL run, per function. Used by bench/callgrind.sh."""

import re
import subprocess
import sys

LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)\s*$")


def load(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no",
                          "--threshold=100", path],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    per_fn = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        # "file:function [object]"; strip callgrind's recursion marks ('2).
        name = re.sub(r"'\d+", "", m.group(2))
        per_fn[name] = per_fn.get(name, 0) + int(m.group(1).replace(",", ""))
    return per_fn


def short(name):
    """"function [object]" without paths; code inlined from another file (no object) is shown
    as "file.rs:function"."""
    obj = ""
    m = re.match(r"^(.*?)\s+\[([^\[\]]*)\]$", name)
    if m:
        name, obj = m.group(1), " [%s]" % m.group(2).rsplit("/", 1)[-1]
    m = re.match(r"^(.*?\.(?:rs|c|h|S|cc|cpp|hpp)|\?\?\?):(.*)$", name)
    if m:
        name = m.group(2) if obj else "%s:%s" % (m.group(1).rsplit("/", 1)[-1], m.group(2))
    return (name + obj)[:120]


def main():
    small, large, calls = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 12
    rows = sorted(((large.get(k, 0) - small.get(k, 0)) / calls, k)
                  for k in set(small) | set(large))
    rows.reverse()
    total = sum(v for v, _ in rows)
    print("    Ir/call  function  (total %.1f Ir per call)" % total)
    for v, k in rows[:top]:
        if abs(v) < 0.05:
            break
        print("  %9.1f  %s" % (v, short(k)))
    fixed = sorted(((v, k) for k, v in small.items()), reverse=True)
    print("  fixed cost of the small run: %d Ir in all; largest:" % sum(small.values()))
    for v, k in fixed[:5]:
        print("  %11d  %s" % (v, short(k)))


if __name__ == "__main__":
    main()
