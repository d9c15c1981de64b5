/*
 * Signal handlers that call hooked functions while hooked frames are open below them:
 *  1. raise() from 5 hooked frames deep, handler on the same stack;
 *  2. the same with the handler on an alternate signal stack at a LOWER address than the
 *     interrupted frames (a static buffer, main thread);
 *  3. again on a HIGHER address (a buffer in main's stack frame, used by a second thread
 *     whose own stack is lower) - a tool that decides which shadow-stack entries are still
 *     live by comparing stack pointers gets one of 2 and 3 wrong;
 *  4. asynchronous signals: another thread sends SIGUSR2 to the main thread 2000 times while
 *     main keeps calling a hooked function, so the signal lands anywhere, including in the
 *     middle of the tool's entry and exit code; a semaphore makes each delivery count.
 * All printed counts are deterministic; spin_work's count depends on timing and is not
 * printed.
 */
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <string.h>

#include "counts.h"

#define RAISES 100
#define ASYNC 2000

COUNTER(nest);
COUNTER(on_usr1);
COUNTER(handler_work);
COUNTER(on_alt);
COUNTER(alt_work);
COUNTER(alt_thread);
COUNTER(on_usr2);
COUNTER(async_work);
COUNTER(sender);

static volatile long sink;
static unsigned long spin_calls;
static unsigned handled;
static sem_t delivered;
static pthread_t main_thread;

NOINLINE long handler_work(int x)
{
    HIT(handler_work);
    return x * 3 + 1;
}

NOINLINE static void on_usr1(int sig)
{
    HIT(on_usr1);
    for (int i = 0; i < 3; i++)
        sink += handler_work(sig + i);
}

NOINLINE long alt_work(int depth)
{
    HIT(alt_work);
    if (depth == 0)
        return 1;
    long r = alt_work(depth - 1);
    return (r ^ depth) + 1;
}

/* Checks it really runs on the alternate stack, and nests 9 hooked calls there. */
NOINLINE static void on_alt(int sig)
{
    HIT(on_alt);
    stack_t st;
    sigaltstack(NULL, &st);
    if (!(st.ss_flags & SS_ONSTACK))
        sink -= 1000000;
    sink += alt_work(8) + sig;
}

/* Raises `sig` from `depth` hooked frames down. The XOR after the call keeps GCC from
 * turning the recursion into a loop (it does for `r * 2 + depth`: tail recursion with an
 * accumulator), which would run the body without entering the function again. */
NOINLINE long nest(int depth, int sig)
{
    HIT(nest);
    if (depth == 0) {
        raise(sig);
        return 1;
    }
    long r = nest(depth - 1, sig);
    return (r << 1) ^ depth;
}

static void install(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

static void use_altstack(void *base, size_t size)
{
    stack_t st = {.ss_sp = base, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&st, NULL) != 0)
        perror("sigaltstack");
}

NOINLINE static void *alt_thread(void *altstack)
{
    HIT(alt_thread);
    use_altstack(altstack, 256 * 1024);
    long r = 0;
    for (int i = 0; i < 20; i++)
        r += nest(5, SIGPROF);
    return (void *)r;
}

NOINLINE long async_work(long x)
{
    HIT(async_work);
    return x ^ 0x5a5a;
}

NOINLINE static void on_usr2(int sig)
{
    HIT(on_usr2);
    sink += async_work(sig) + async_work(sig + 1);
    __atomic_fetch_add(&handled, 1, __ATOMIC_RELEASE);
    sem_post(&delivered); /* async-signal-safe */
}

/* Sends one signal at a time and waits until the handler has run, so none coalesce. */
NOINLINE static void *sender(void *arg)
{
    (void)arg;
    HIT(sender);
    for (int i = 0; i < ASYNC; i++) {
        pthread_kill(main_thread, SIGUSR2);
        while (sem_wait(&delivered) != 0)
            ;
    }
    return NULL;
}

NOINLINE unsigned long spin_work(unsigned long x)
{
    __atomic_fetch_add(&spin_calls, 1, __ATOMIC_RELAXED);
    return x * 7 + 1;
}

int main(void)
{
    long total = 0;

    install(SIGUSR1, on_usr1, 0);
    for (int i = 0; i < RAISES; i++)
        total += nest(5, SIGUSR1);
    printf("same stack: total %ld sink %ld\n", total, sink);

    static char low_altstack[256 * 1024];
    use_altstack(low_altstack, sizeof low_altstack);
    install(SIGPROF, on_alt, SA_ONSTACK);
    for (int i = 0; i < RAISES; i++)
        total += nest(5, SIGPROF);
    printf("low alt stack: total %ld sink %ld\n", total, sink);

    /* In main's frame, so above every thread stack in the address space. */
    char high_altstack[256 * 1024];
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, alt_thread, high_altstack);
    pthread_join(t, &r);
    total += (long)r;
    printf("high alt stack: total %ld sink %ld\n", total, sink);

    main_thread = pthread_self();
    sem_init(&delivered, 0, 0);
    install(SIGUSR2, on_usr2, SA_RESTART);
    pthread_create(&t, NULL, sender, NULL);
    unsigned long x = 1;
    while (__atomic_load_n(&handled, __ATOMIC_ACQUIRE) < ASYNC)
        x = spin_work(x);
    pthread_join(t, NULL);
    printf("async: handled %u sink %ld\n", handled, sink);

    PRINT_COUNT(nest);
    PRINT_COUNT(on_usr1);
    PRINT_COUNT(handler_work);
    PRINT_COUNT(on_alt);
    PRINT_COUNT(alt_work);
    PRINT_COUNT(alt_thread);
    PRINT_COUNT(on_usr2);
    PRINT_COUNT(async_work);
    PRINT_COUNT(sender);
    return 0;
}
