/*
 * Deterministic call stacks for the export tests (folded stacks, flame graphs, call graphs,
 * speedscope): nesting, recursion, and the same functions reached from different stacks in
 * three threads and the main thread. The calls made do not depend on timing:
 *   worker(id):  50 x middle(id + 2), then rec(5)
 *   middle(k):   inner(k) (k calls of leaf), then rec(3)
 *   rec(n):      leaf(n), then rec(n - 1) while n > 0   (n + 1 nested calls)
 *   main:        3 workers (ids 0..2), and meanwhile middle(1), rec(4)
 */
#include <pthread.h>
#include <stdio.h>

#define FUNCTION __attribute__((noinline, noclone))

static volatile unsigned long sink;

FUNCTION static void leaf(int i)
{
    sink += (unsigned long)i;
}

FUNCTION static int rec(int n)
{
    leaf(n);
    if (n <= 0)
        return 0;
    return rec(n - 1) + 1;
}

FUNCTION static void inner(int k)
{
    for (int i = 0; i < k; i++)
        leaf(i);
}

FUNCTION static void middle(int k)
{
    inner(k);
    rec(3);
}

FUNCTION static void *worker(void *arg)
{
    int id = (int)(long)arg;
    for (int i = 0; i < 50; i++)
        middle(id + 2);
    rec(5);
    return NULL;
}

int main(void)
{
    pthread_t t[3];
    for (long i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    middle(1);
    rec(4);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    printf("sink %lu\n", sink);
    return 0;
}
