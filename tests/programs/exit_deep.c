/*
 * exit() called four hooked frames deep. The calls still open at that moment never return,
 * but they were entered and must be in the trace (the tool closes them when the process
 * ends). The counts are printed by an atexit handler - a hooked function called by libc
 * during exit - which counts itself too.
 */
#include <stdlib.h>

#include "counts.h"

COUNTER(done_work);
COUNTER(depth_1);
COUNTER(depth_2);
COUNTER(depth_3);
COUNTER(leave_now);
COUNTER(report_at_exit);

NOINLINE long done_work(long x)
{
    HIT(done_work);
    return x * 13 + 5;
}

NOINLINE static void report_at_exit(void)
{
    HIT(report_at_exit);
    printf("in atexit handler\n");
    PRINT_COUNT(done_work);
    PRINT_COUNT(depth_1);
    PRINT_COUNT(depth_2);
    PRINT_COUNT(depth_3);
    PRINT_COUNT(leave_now);
    PRINT_COUNT(report_at_exit);
}

NOINLINE void leave_now(long v)
{
    HIT(leave_now);
    printf("leaving with %ld\n", v);
    exit(5);
}

/* The work after each call keeps them from being tail calls. */
NOINLINE long depth_3(long x)
{
    HIT(depth_3);
    for (int i = 0; i < 40; i++)
        x = done_work(x);
    leave_now(x & 0xffff);
    return x + 1;
}

NOINLINE long depth_2(long x)
{
    HIT(depth_2);
    return depth_3(x) * 2;
}

NOINLINE long depth_1(long x)
{
    HIT(depth_1);
    return depth_2(x) * 3;
}

int main(void)
{
    atexit(report_at_exit);
    long h = 1;
    for (int i = 0; i < 60; i++)
        h = done_work(h);
    printf("never printed %ld\n", depth_1(h));
    return 0;
}
