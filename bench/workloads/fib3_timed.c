/* fib(N) with two more integer arguments (three in all) and a return value, timed by the
 * program itself like fib_timed.c: the cost of recording arguments and return values
 * (`record -A 'fib3@arg1/i64,arg2/i32,arg3/i32' -R 'fib3@i64'`) against a plain timed call
 * of the same function. Prints `ns/call=X`.
 * Usage: fib3_timed [N]   (default 32) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common.h"

BENCH_FN long fib3(long n, int a, int b)
{
    if (n < 2)
        return n + (a ^ b) - (a ^ b);
    return fib3(n - 1, a + 1, b) + fib3(n - 2, a, b + 1);
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
    unsigned long long a = 1, b = 1;
    for (long i = 2; i <= n; i++) {
        unsigned long long c = 1 + a + b;
        a = b;
        b = c;
    }
    double t0 = now_ns();
    long r = fib3(n, 0, 0);
    double t1 = now_ns();
    printf("fib3(%ld) = %ld, calls %llu, ns/call=%.2f\n", n, r, b, (t1 - t0) / (double)b);
    return 0;
}
