/*
 * Recursion, shallow and very deep. Built with -fno-optimize-sibling-calls so that every
 * level is a real call with its own frame.
 *
 * fib(25) is 242785 calls at most 25 deep: every one must be counted. deep(100000) runs on a
 * thread with a 256 MiB stack and nests 100000 hooked calls: the tool may leave out calls
 * nested deeper than its shadow stack (hence `atmost`), but the program must still compute the
 * same result, and calls made after the deep recursion has unwound (fib(15) on that thread)
 * must again be counted exactly.
 */
#include <pthread.h>

#include "counts.h"

#define DEEP 100000

COUNTER(fib);
COUNTER(deep);
COUNTER(deep_thread);

NOINLINE long fib(int n)
{
    HIT(fib);
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

/* The XOR with a shift keeps GCC from rewriting this into a loop with an accumulator. */
NOINLINE unsigned long deep(unsigned long n)
{
    HIT(deep);
    if (n == 0)
        return 7;
    unsigned long v = deep(n - 1);
    return (v ^ (v >> 3)) + n;
}

NOINLINE static void *deep_thread(void *arg)
{
    HIT(deep_thread);
    unsigned long *out = arg;
    out[0] = deep(DEEP);
    out[1] = (unsigned long)fib(15);
    return NULL;
}

int main(void)
{
    printf("fib(25) = %ld\n", fib(25));

    unsigned long out[2];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    /* 100000 frames of deep() need a few MiB; leave plenty of room. */
    pthread_attr_setstacksize(&attr, 256ul << 20);
    pthread_t t;
    if (pthread_create(&t, &attr, deep_thread, out) != 0) {
        perror("pthread_create");
        return 1;
    }
    pthread_join(t, NULL);
    printf("deep(%d) = %lu\n", DEEP, out[0]);
    printf("fib(15) = %lu\n", out[1]);

    PRINT_COUNT(fib);
    print_count("atmost", "deep", CALLS(deep));
    PRINT_COUNT(deep_thread);
    return 0;
}
