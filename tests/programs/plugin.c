/*
 * A library the test program loads with dlopen after it has started: with `--lib plugin`,
 * its functions must be hooked when it arrives and their calls recorded.
 */
#include "counts.h"

COUNTER(plugin_square);
COUNTER(plugin_sum);

NOINLINE long plugin_square(long x)
{
    HIT(plugin_square);
    return x * x;
}

NOINLINE long plugin_sum(int n)
{
    HIT(plugin_sum);
    long s = 0;
    for (int i = 0; i < n; i++)
        s += plugin_square(i);
    return s;
}

void plugin_report(void)
{
    PRINT_COUNT(plugin_square);
    PRINT_COUNT(plugin_sum);
}
