/* The library half of tail_main.c, traced with `--lib tail_lib`. */
#include "counts.h"

COUNTER(lib_leaf);
COUNTER(lib_jump);

NOINLINE long lib_leaf(long x)
{
    HIT(lib_leaf);
    return x * 3 + 1;
}

/* A tail call back into the program, through a pointer (jmp *). */
NOINLINE long lib_jump(long (*f)(long), long x)
{
    HIT(lib_jump);
    return f(x ^ 5);
}

void lib_report(void)
{
    PRINT_COUNT(lib_leaf);
    PRINT_COUNT(lib_jump);
}
