/*
 * 5000 short-lived threads, one after another: each starts a stream, records two calls and
 * ends, so every thread start and end path of the agent runs thousands of times.
 */
#include <pthread.h>

#include "counts.h"

#define THREADS 5000

COUNTER(work);
COUNTER(run);

static volatile long sink;

NOINLINE long work(long x)
{
    HIT(work);
    return x * 3 + 1;
}

NOINLINE static void *run(void *arg)
{
    HIT(run);
    sink += work((long)arg);
    return NULL;
}

int main(void)
{
    for (long i = 0; i < THREADS; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, run, (void *)i) != 0)
            return 1;
        pthread_join(t, NULL);
    }
    printf("sink %ld\n", sink);
    PRINT_COUNT(work);
    PRINT_COUNT(run);
    return 0;
}
