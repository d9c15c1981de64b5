/*
 * Waits for SIGTERM, so a test can check that `record` passes a signal it receives on to the
 * traced program: the handler (a hooked function) notes it, and the program exits normally
 * with status 0 after printing what it got. Prints "ready" on stdout once the handler is in
 * place; the test sends the signal only after reading that line.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "counts.h"

COUNTER(on_term);
COUNTER(tick);

static volatile sig_atomic_t got;

NOINLINE static void on_term(int sig)
{
    HIT(on_term);
    got = sig;
}

NOINLINE int tick(int x)
{
    HIT(tick);
    return x + 1;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);

    /* Block SIGTERM until we sleep in sigsuspend, so a signal cannot slip in between the
     * check and the wait. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);

    int t = 0;
    for (int i = 0; i < 100; i++)
        t = tick(t);
    printf("ready\n");
    fflush(stdout);

    /* Give up after 30 s (the test would have failed long before) instead of hanging. */
    alarm(30);
    while (!got)
        sigsuspend(&old);
    printf("got signal %d after %d ticks\n", (int)got, t);
    PRINT_COUNT(on_term);
    PRINT_COUNT(tick);
    return 0;
}
