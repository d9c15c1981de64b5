/*
 * backtrace() from a signal handler that lands anywhere: another thread sends SIGUSR1 to the
 * main thread 3000 times (one at a time) while main keeps calling a short hooked function
 * from one call site, so the signal often interrupts the tool's entry or exit code. The
 * handler walks the stack, then calls hooked functions: after each walk the tool gives the
 * interrupted frames their exit hook back, and must not do it to a frame whose entry or exit
 * code was cut short by the signal (which would send a return astray and crash). All
 * printed counts are deterministic; spin's depends on timing and is not printed.
 */
#include <execinfo.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "counts.h"

#ifndef ASYNC
#define ASYNC 3000
#endif

COUNTER(on_usr1);
COUNTER(walker);
COUNTER(handler_tail);
COUNTER(run_loop);
COUNTER(sender);

static volatile long sink;
static unsigned handled;
static unsigned long spin_calls;
static sem_t delivered;
static sem_t looping;
static pthread_t main_thread;

NOINLINE int walker(void)
{
    HIT(walker);
    void *frames[64];
    return backtrace(frames, 64);
}

NOINLINE long handler_tail(long x)
{
    HIT(handler_tail);
    return x * 5 + 3;
}

NOINLINE static void on_usr1(int sig)
{
    HIT(on_usr1);
    int n = walker();
    sink += handler_tail(n > 2) + sig;
    __atomic_fetch_add(&handled, 1, __ATOMIC_RELEASE);
    sem_post(&delivered); /* async-signal-safe */
}

NOINLINE unsigned long spin(unsigned long x)
{
    __atomic_fetch_add(&spin_calls, 1, __ATOMIC_RELAXED);
    return x * 7 + 1;
}

NOINLINE static unsigned long run_loop(void)
{
    HIT(run_loop);
    /* No signal before this point: under gdb (check_oracles.sh), a signal that arrives while
     * it steps over its breakpoint here makes it count this entry again. */
    sem_post(&looping);
    unsigned long x = 1;
    while (__atomic_load_n(&handled, __ATOMIC_ACQUIRE) < ASYNC)
        x = spin(x);
    return x;
}

/* Sends one signal at a time and waits until the handler has run, so none coalesce. */
NOINLINE static void *sender(void *arg)
{
    (void)arg;
    HIT(sender);
    while (sem_wait(&looping) != 0)
        ;
    for (int i = 0; i < ASYNC; i++) {
        pthread_kill(main_thread, SIGUSR1);
        while (sem_wait(&delivered) != 0)
            ;
        usleep(20);
    }
    return NULL;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    main_thread = pthread_self();
    sem_init(&delivered, 0, 0);
    sem_init(&looping, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, sender, NULL);
    unsigned long x = run_loop();
    pthread_join(t, NULL);
    printf("handled %u sink %ld\n", handled, sink);
    (void)x;
    PRINT_COUNT(on_usr1);
    PRINT_COUNT(walker);
    PRINT_COUNT(handler_tail);
    PRINT_COUNT(run_loop);
    PRINT_COUNT(sender);
    return 0;
}
