/* What the bench's small C tools share: a monotonic clock in nanoseconds and the median of
 * REPS runs of N rounds each. */
#ifndef FNSCOPE_BENCH_TIMING_H
#define FNSCOPE_BENCH_TIMING_H

#include <stdlib.h>
#include <time.h>

#define N 2000000
#define REPS 7

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..REPS), which it sorts. */
static double median(double *v)
{
    qsort(v, REPS, sizeof *v, cmp);
    return v[REPS / 2];
}

#endif
