/* fib(N) whose hot phase the program times itself, so that start-up, hooking and the
 * recorder's end are left out: prints `ns/call=X` for the recursion alone.
 * Usage: fib_timed [N]   (default 32) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common.h"

BENCH_FN long fib(long n)
{
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = bench_arg(argc, argv, 1, 32);
    unsigned long long a = 1, b = 1; /* calls of fib(0), fib(1); then c(n) = 1 + c(n-1) + c(n-2) */
    for (long i = 2; i <= n; i++) {
        unsigned long long c = 1 + a + b;
        a = b;
        b = c;
    }
    double t0 = now_ns();
    long r = fib(n);
    double t1 = now_ns();
    printf("fib(%ld) = %ld, calls %llu, ns/call=%.2f\n", n, r, b, (t1 - t0) / (double)b);
    return 0;
}
