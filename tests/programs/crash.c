/*
 * The program crashes (SIGSEGV) three hooked calls deep, after known calls. Its handler-less
 * death runs nothing of fnscope's: the calls still running (main, outer, middle, inner) are
 * closed by the recorder from the shadow stack in shared memory, as cut off.
 */
#include <stdlib.h>

#include "counts.h"

COUNTER(step);
COUNTER(outer);
COUNTER(middle);
COUNTER(inner);

static int *volatile nowhere;

NOINLINE long step(long x)
{
    HIT(step);
    return x * 13 + 5;
}

NOINLINE void inner(long h)
{
    HIT(inner);
    PRINT_COUNT(step);
    PRINT_COUNT(outer);
    PRINT_COUNT(middle);
    PRINT_COUNT(inner);
    fflush(stderr);
    *nowhere = (int)h;
}

NOINLINE void middle(long h)
{
    HIT(middle);
    inner(h);
    step(h); /* never reached; keeps the calls from being tail calls */
}

NOINLINE void outer(long h)
{
    HIT(outer);
    middle(h);
    step(h);
}

int main(void)
{
    long h = 1;
    for (int i = 0; i < 1000; i++)
        h = step(h);
    printf("result %ld\n", h);
    fflush(stdout);
    outer(h);
    return 0;
}
