/*
 * Calls a library it was linked with and one it loads with dlopen (path in argv[1]), known
 * numbers of times, then prints the counts of all three modules.
 *
 * With a second argument `reload`, it then closes the plugin, loads it again (the dynamic
 * linker puts it back at the same address; the program says whether it did) and calls it
 * as many times more: the new copy's code must be hooked anew. The plugin's counters start
 * from zero in the new copy, so it prints its counts once per copy.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

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
    int copies = argc > 2 && strcmp(argv[2], "reload") == 0 ? 2 : 1;
    void *first_base = NULL;
    for (int copy = 0; copy < copies; copy++) {
        void *h = dlopen(argv[1], RTLD_NOW);
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        long (*sum)(int) = (long (*)(int))dlsym(h, "plugin_sum");
        void (*report)(void) = (void (*)(void))dlsym(h, "plugin_report");
        Dl_info where;
        if (!dladdr((void *)sum, &where))
            return 1;
        if (copy == 0)
            first_base = where.dli_fbase;
        else
            printf("reloaded at the %s address\n", where.dli_fbase == first_base ? "same" : "another");
        long total = 0;
        for (int i = 0; i < 30; i++)
            total += main_step(sum, i);
        printf("total %ld\n", total);
        report();
        if (copies > 1)
            dlclose(h);
    }
    linked_report();
    PRINT_COUNT(main_step);
    return 0;
}
