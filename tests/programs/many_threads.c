/*
 * 300 threads alive at the same time (a barrier holds them until all have started), each
 * calling a hooked function 1000 times: more threads than a small shared buffer has chunks
 * for at two per thread, so chunk hand-over under pressure is exercised.
 */
#include <pthread.h>

#include "counts.h"

#define THREADS 300
#define PER_THREAD 1000

COUNTER(step);
COUNTER(worker);

static pthread_barrier_t start;
static volatile long sink;

NOINLINE long step(long x)
{
    HIT(step);
    return x * 3 + 1;
}

NOINLINE static void *worker(void *arg)
{
    HIT(worker);
    pthread_barrier_wait(&start);
    long x = (long)arg;
    for (int i = 0; i < PER_THREAD; i++)
        x = step(x) & 0xffff;
    sink += x;
    return NULL;
}

int main(void)
{
    pthread_t t[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (long i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0)
            return 1;
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("done\n");
    PRINT_COUNT(step);
    PRINT_COUNT(worker);
    return 0;
}
