/*
 * Eight threads run at the same time (they start together at a barrier) and call the same
 * functions different, known numbers of times, plus a recursion in each. Each thread has its
 * own record stream in the tool; the per-function totals must still be exact.
 */
#include <pthread.h>
#include <stdlib.h>

#include "counts.h"

#define NTHREADS 8

COUNTER(thread_main);
COUNTER(once_init);
COUNTER(work_a);
COUNTER(work_b);
COUNTER(common);
COUNTER(tree);

static pthread_barrier_t start_line;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int once_value;

/* Called by libc's pthread_once, from whichever thread gets there first. */
NOINLINE static void once_init(void)
{
    HIT(once_init);
    once_value = 42;
}

NOINLINE unsigned long work_a(unsigned long x)
{
    HIT(work_a);
    return x * 2654435761u + 1;
}

NOINLINE unsigned long work_b(unsigned long x)
{
    HIT(work_b);
    return (x ^ (x >> 7)) + 3;
}

NOINLINE unsigned long common(unsigned long x, int id)
{
    HIT(common);
    return x + (unsigned long)id;
}

NOINLINE unsigned long tree(int depth)
{
    HIT(tree);
    if (depth == 0)
        return 1;
    /* XOR keeps GCC from turning the second call into a loop (tail recursion with an
     * accumulator), which would run this body without a new entry. */
    unsigned long l = tree(depth - 1);
    return l ^ (tree(depth - 1) + 1);
}

NOINLINE static void *thread_main(void *arg)
{
    HIT(thread_main);
    int id = (int)(long)arg;
    pthread_barrier_wait(&start_line);
    pthread_once(&once, once_init);
    unsigned long h = (unsigned long)id;
    /* Thread id gets (id+1)*1000 calls of work_a and (8-id)*500 of work_b, interleaved. */
    for (int i = 0; i < (id + 1) * 1000; i++) {
        h = work_a(h);
        if (i < (NTHREADS - id) * 500)
            h = work_b(h);
        if (i % 10 == 0 && i < 1000)
            h = common(h, id);
    }
    h += tree(6 + id % 3);
    return (void *)h;
}

int main(void)
{
    /* The main thread makes some calls before any thread exists. */
    unsigned long h = 1;
    for (int i = 0; i < 10; i++)
        h = work_a(h);

    pthread_t t[NTHREADS];
    pthread_barrier_init(&start_line, NULL, NTHREADS);
    for (long i = 0; i < NTHREADS; i++)
        if (pthread_create(&t[i], NULL, thread_main, (void *)i) != 0) {
            perror("pthread_create");
            return 1;
        }
    unsigned long results[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        results[i] = (unsigned long)r;
    }
    for (int i = 0; i < NTHREADS; i++)
        printf("thread %d result %lu\n", i, results[i]);
    printf("main %lu once %d\n", h, once_value);

    PRINT_COUNT(thread_main);
    PRINT_COUNT(once_init);
    PRINT_COUNT(work_a);
    PRINT_COUNT(work_b);
    PRINT_COUNT(common);
    PRINT_COUNT(tree);
    return 0;
}
