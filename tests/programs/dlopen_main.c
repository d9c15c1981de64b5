/*
 * Calls a library it was linked with and one it loads with dlopen (path in argv[1]), known
 * numbers of times, then prints the counts of all three modules.
 */
#include <dlfcn.h>
#include <stdlib.h>

#include "counts.h"

int linked_twice(int x);
void linked_report(void);

COUNTER(main_step);

NOINLINE static long main_step(long (*sum)(int), int i)
{
    HIT(main_step);
    return sum(i) + linked_twice(i);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    long (*sum)(int) = (long (*)(int))dlsym(h, "plugin_sum");
    void (*report)(void) = (void (*)(void))dlsym(h, "plugin_report");
    long total = 0;
    for (int i = 0; i < 30; i++)
        total += main_step(sum, i);
    printf("total %ld\n", total);
    report();
    linked_report();
    PRINT_COUNT(main_step);
    return 0;
}
