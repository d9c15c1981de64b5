/*
 * Functions called a number of times that depends on the program's argument N, for the
 * tests of count mode, merging, diff and coverage (crates/fnscope-cli/tests/
 * counts_and_coverage.rs). The test knows the formulas; the program also counts its own
 * calls and prints them (protocol of tests/programs/counts.h), so that a test failure can
 * tell a broken oracle from a broken tool:
 *
 *   main 1, alpha N, beta 2N+1, grid N*N, only_even N if N is even (else 0),
 *   only_odd N if N is odd (else 0), never_called 0, rec 2^(N+1)-1, worker 1 (in a second
 *   thread), delta N (called by worker).
 *
 * Built with -DVARIANT=1 the code differs (another build-id) but the counts do not.
 */
#include <pthread.h>
#include <stdlib.h>

#include "counts.h"

#ifndef VARIANT
#define VARIANT 0
#endif

COUNTER(alpha);
COUNTER(beta);
COUNTER(grid);
COUNTER(only_even);
COUNTER(only_odd);
COUNTER(never_called);
COUNTER(rec);
COUNTER(worker);
COUNTER(delta);

static volatile int sink;

NOINLINE int alpha(int x)
{
    HIT(alpha);
    return x * 3 + 1 + VARIANT;
}

NOINLINE int beta(int x)
{
    HIT(beta);
    return x ^ 5;
}

NOINLINE int grid(int x, int y)
{
    HIT(grid);
    return x * y + 7;
}

NOINLINE int only_even(int x)
{
    HIT(only_even);
    return x / 2;
}

NOINLINE int only_odd(int x)
{
    HIT(only_odd);
    return x * 2 + 1;
}

NOINLINE int never_called(int x)
{
    HIT(never_called);
    return x - 11;
}

/* 2^(d+1) - 1 calls; XOR keeps GCC from turning the recursion into a loop. */
NOINLINE unsigned rec(unsigned d)
{
    HIT(rec);
    if (d == 0)
        return 1;
    return rec(d - 1) ^ (rec(d - 1) << 1);
}

NOINLINE int delta(int x)
{
    HIT(delta);
    return x + 13;
}

NOINLINE void *worker(void *arg)
{
    HIT(worker);
    int n = *(int *)arg;
    for (int i = 0; i < n; i++)
        sink += delta(i);
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    pthread_t t;
    if (pthread_create(&t, NULL, worker, &n) != 0)
        return 2;
    for (int i = 0; i < n; i++) {
        sink += alpha(i);
        sink += n % 2 == 0 ? only_even(i) : only_odd(i);
        for (int j = 0; j < n; j++)
            sink += grid(i, j);
    }
    for (int i = 0; i < 2 * n + 1; i++)
        sink += beta(i);
    sink += (int)rec((unsigned)n);
    if (argc > 5)
        sink += never_called(n);
    pthread_join(t, NULL);

    print_count("count", "main", 1);
    PRINT_COUNT(alpha);
    PRINT_COUNT(beta);
    PRINT_COUNT(grid);
    PRINT_COUNT(only_even);
    PRINT_COUNT(only_odd);
    PRINT_COUNT(never_called);
    PRINT_COUNT(rec);
    PRINT_COUNT(worker);
    PRINT_COUNT(delta);
    return 0;
}
