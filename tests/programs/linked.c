/* A library linked at build time (DT_NEEDED): hooked from the start with `--lib linked`. */
#include "counts.h"

COUNTER(linked_twice);

NOINLINE int linked_twice(int x)
{
    HIT(linked_twice);
    return 2 * x + 1;
}

void linked_report(void)
{
    PRINT_COUNT(linked_twice);
}
