/*
 * pthread_exit() from four hooked frames deep, in four threads. glibc implements it by
 * unwinding the thread's stack (forced unwind through libgcc), running cleanup handlers on
 * the way, so the unwinder must get past every frame whose return address the tool replaced.
 * The calls that never return are counted too: they were entered.
 */
#include <pthread.h>

#include "counts.h"

#define NTHREADS 4

COUNTER(thread_main);
COUNTER(before_exit);
COUNTER(chain_1);
COUNTER(chain_2);
COUNTER(chain_3);
COUNTER(quit_now);
COUNTER(cleanup);

static long sink;

NOINLINE long before_exit(long x)
{
    HIT(before_exit);
    return x * 9 + 2;
}

NOINLINE static void cleanup(void *arg)
{
    HIT(cleanup);
    __atomic_fetch_add(&sink, (long)arg, __ATOMIC_RELAXED);
}

NOINLINE void quit_now(long id)
{
    HIT(quit_now);
    pthread_exit((void *)(id * 100 + 1));
}

/* The work after each call keeps them from being tail calls. */
NOINLINE long chain_3(long id)
{
    HIT(chain_3);
    long r;
    pthread_cleanup_push(cleanup, (void *)(id + 1));
    quit_now(id);
    r = __atomic_load_n(&sink, __ATOMIC_RELAXED);
    pthread_cleanup_pop(0);
    return r + 1;
}

NOINLINE long chain_2(long id)
{
    HIT(chain_2);
    return chain_3(id) * 2;
}

NOINLINE long chain_1(long id)
{
    HIT(chain_1);
    return chain_2(id) * 3;
}

NOINLINE static void *thread_main(void *arg)
{
    HIT(thread_main);
    long id = (long)arg, h = id;
    for (int i = 0; i < 100 * (id + 1); i++)
        h = before_exit(h);
    __atomic_fetch_add(&sink, h & 0xff, __ATOMIC_RELAXED);
    return (void *)chain_1(id);
}

int main(void)
{
    pthread_t t[NTHREADS];
    for (long i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, thread_main, (void *)i);
    for (int i = 0; i < NTHREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        printf("thread %d returned %ld\n", i, (long)r);
    }
    /* Adding up in any order gives the same sum, so this is deterministic. */
    printf("sink %ld\n", sink);

    PRINT_COUNT(thread_main);
    PRINT_COUNT(before_exit);
    PRINT_COUNT(chain_1);
    PRINT_COUNT(chain_2);
    PRINT_COUNT(chain_3);
    PRINT_COUNT(quit_now);
    PRINT_COUNT(cleanup);
    return 0;
}
