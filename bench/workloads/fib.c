/* Call-heavy recursion: fib(n) by the naive double recursion.
 * Usage: fib [N]   (default 32; 0 returns at once)
 * Calls of fib: 2*F(N+1) - 1. */
#include "common.h"

BENCH_FN long fib(long n)
{
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

int main(int argc, char **argv)
{
    long n = bench_arg(argc, argv, 1, 32);
    if (n <= 0) {
        bench_report_calls(0);
        return 0;
    }
    /* Calls: c(n) = 1 + c(n-1) + c(n-2), c(0) = c(1) = 1. */
    unsigned long long a = 1, b = 1; /* c(0), c(1) */
    for (long i = 2; i <= n; i++) {
        unsigned long long c = 1 + a + b;
        a = b;
        b = c;
    }
    long r = fib(n);
    printf("fib(%ld) = %ld\n", n, r);
    bench_report_calls(n == 1 ? 1 : b);
    return 0;
}
