/*
 * Makes as many calls as its argument says (default 30 million) and prints a result that
 * depends on all of them: enough records to fill fnscope's whole shared buffer several times
 * over in a second or two.
 */
#include <stdlib.h>

#include "counts.h"

COUNTER(step);

NOINLINE unsigned long step(unsigned long x)
{
    HIT(step);
    return x * 6364136223846793005ul + 1442695040888963407ul;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 30000000;
    unsigned long x = 1;
    for (long i = 0; i < n; i++)
        x = step(x);
    printf("result %lu\n", x);
    PRINT_COUNT(step);
    return 0;
}
