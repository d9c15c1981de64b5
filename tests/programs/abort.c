/*
 * abort() from three hooked frames deep. The process dies by SIGABRT (exit status 134
 * through `record`); everything it printed before stays the same, and every call that had
 * returned before abort() must be in the trace. The counts are printed just before abort(),
 * and only for functions whose calls had all returned by then.
 */
#include <stdlib.h>
#include <sys/resource.h>

#include "counts.h"

COUNTER(finished_work);
COUNTER(other_work);
COUNTER(print_counts);

NOINLINE long finished_work(long x)
{
    HIT(finished_work);
    return x * 17 + 3;
}

NOINLINE long other_work(long x)
{
    HIT(other_work);
    return x ^ (x >> 5);
}

NOINLINE static void print_counts(void)
{
    HIT(print_counts);
    PRINT_COUNT(finished_work);
    PRINT_COUNT(other_work);
    /* This call itself returns before abort() is reached. */
    PRINT_COUNT(print_counts);
}

/* Not counted: these are still running when the process dies (or, if GCC turned a call to
 * them into a jump, gone; either way the counted calls above are unaffected). */
NOINLINE void crash_3(long x)
{
    printf("result %ld, aborting\n", x);
    fflush(stdout);
    print_counts();
    abort();
}

NOINLINE void crash_2(long x)
{
    crash_3(x + 1);
}

NOINLINE void crash_1(long x)
{
    crash_2(x * 2);
}

int main(void)
{
    /* No core file: it would only slow the test down and litter the directory. */
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);

    long h = 1;
    for (int i = 0; i < 5000; i++)
        h = other_work(finished_work(h));
    crash_1(h & 0xffffff);
    return 0;
}
