/*
 * Known nesting on several threads, for the timeline exports (Perfetto, Chrome): each thread
 * runs the same calls in the same order, one call of `nap` per worker sleeps 3 ms (the only
 * long calls apart from their callers), `hidden` has callees of its own (for --exclude), and
 * the main thread leaves two `jump_deep` frames by longjmp (calls that end unwound).
 */
#include <pthread.h>
#include <setjmp.h>
#include <time.h>

#include "counts.h"

#define NWORKERS 2

COUNTER(leaf);
COUNTER(middle);
COUNTER(nap);
COUNTER(under_hidden);
COUNTER(hidden);
COUNTER(outer);
COUNTER(jump_deep);
COUNTER(jump_top);
COUNTER(worker);

static volatile unsigned long sink;
static jmp_buf env;

NOINLINE void leaf(int i)
{
    HIT(leaf);
    sink += (unsigned long)i;
}

NOINLINE void middle(int n)
{
    HIT(middle);
    for (int i = 0; i < n; i++)
        leaf(i);
    sink++;
}

NOINLINE void nap(void)
{
    HIT(nap);
    struct timespec ts = {0, 3000000};
    nanosleep(&ts, NULL);
}

NOINLINE void under_hidden(void)
{
    HIT(under_hidden);
    sink += 7;
}

NOINLINE void hidden(void)
{
    HIT(hidden);
    under_hidden();
    under_hidden();
    sink++;
}

NOINLINE void outer(int k)
{
    HIT(outer);
    middle(k);
    hidden();
    if (k == 2)
        nap();
    middle(1);
    sink++;
}

NOINLINE void jump_deep(int d)
{
    HIT(jump_deep);
    if (d == 0)
        longjmp(env, 1);
    jump_deep(d - 1);
    sink++;
}

NOINLINE void jump_top(void)
{
    HIT(jump_top);
    if (setjmp(env) == 0)
        jump_deep(1);
    sink++;
}

NOINLINE static void *worker(void *arg)
{
    HIT(worker);
    (void)arg;
    for (int k = 1; k <= 3; k++)
        outer(k);
    return NULL;
}

int main(void)
{
    outer(1);
    jump_top();
    pthread_t t[NWORKERS];
    for (long i = 0; i < NWORKERS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0) {
            perror("pthread_create");
            return 1;
        }
    for (int i = 0; i < NWORKERS; i++)
        pthread_join(t[i], NULL);
    PRINT_COUNT(leaf);
    PRINT_COUNT(middle);
    PRINT_COUNT(nap);
    PRINT_COUNT(under_hidden);
    PRINT_COUNT(hidden);
    PRINT_COUNT(outer);
    PRINT_COUNT(jump_deep);
    PRINT_COUNT(jump_top);
    PRINT_COUNT(worker);
    return 0;
}
