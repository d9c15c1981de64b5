"""A small pure-Python benchmark for the bench harness: recursion, method calls, closures,
generators, dict/list/str work. Deterministic; about 0.3-1 s on CPython 3.11 at the default
size.

Usage: python3.11 pybench.py [SCALE]   (default 1; 0 returns at once)

Prints `bench-py-calls: N`, the number of Python-level calls made by the benchmark functions
(for information: a native tracer sees the interpreter's C functions, not these)."""

import sys

calls = 0


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def fib_calls(n):
    a, b = 1, 1
    for _ in range(n - 1):
        a, b = b, 1 + a + b
    return b if n >= 1 else 1


class Vec:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def add(self, o):
        return Vec(self.x + o.x, self.y + o.y)

    def dot(self, o):
        return self.x * o.x + self.y * o.y


def vectors(n):
    acc = Vec(0, 0)
    s = 0
    for i in range(n):
        v = Vec(i, -i)
        acc = acc.add(v)
        s += acc.dot(v) & 0xFFFF
    # per iteration: Vec(), add (+ Vec() inside), dot
    return s, 4 * n


def words(n):
    counts = {}
    text = "the quick brown fox jumps over the lazy dog again and again".split()
    for i in range(n):
        w = text[i % len(text)] + str(i % 13)
        counts[w] = counts.get(w, 0) + 1
    keys = sorted(counts, key=lambda k: (-counts[k], k))
    return len(keys), len(keys)  # the key function is called once per key


def gen(n):
    def squares(m):
        for i in range(m):
            yield i * i

    total = sum(x % 7 for x in squares(n))
    return total, 2  # squares() and the generator expression, each entered once


def closures(n):
    def make_adder(k):
        def add(x):
            return x + k

        return add

    adders = [make_adder(k) for k in range(10)]
    t = 0
    for i in range(n):
        t = adders[i % 10](t) % 1000003
    return t, 10 + n


def main():
    scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    if scale <= 0:
        print("bench-py-calls: 0")
        return
    ncalls = 0
    n = 26 + (scale.bit_length() - 1)
    r = fib(n)
    ncalls += fib_calls(n)
    checks = [r]
    for f, size in ((vectors, 200000), (words, 240000), (gen, 400000), (closures, 400000)):
        v, c = f(size * scale)
        checks.append(v)
        ncalls += c + 1
    print("checks:", checks)
    print("bench-py-calls:", ncalls)


main()
