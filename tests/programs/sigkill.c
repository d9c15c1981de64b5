/*
 * The program kills itself with SIGKILL after making known calls. Nothing can run after
 * SIGKILL - no handler, no atexit, no flush in the agent - so every completed call must
 * already be somewhere the recorder can read it, and so must the calls still running (die,
 * main), which the recorder closes as cut off. `record` exits with 137, and `info` must say
 * that the trace ended abruptly.
 */
#include <signal.h>
#include <unistd.h>

#include "counts.h"

COUNTER(before_kill);
COUNTER(also_before_kill);

NOINLINE long before_kill(long x)
{
    HIT(before_kill);
    return x * 19 + 7;
}

NOINLINE long also_before_kill(long x)
{
    HIT(also_before_kill);
    return x ^ (x << 3);
}

/* Still running when the process dies: entered once. */
NOINLINE void die(void)
{
    PRINT_COUNT(before_kill);
    PRINT_COUNT(also_before_kill);
    print_count("count", "die", 1);
    kill(getpid(), SIGKILL);
    before_kill(0); /* never reached; keeps kill() from being a tail call */
}

int main(void)
{
    long h = 1;
    for (int i = 0; i < 20000; i++)
        h = also_before_kill(before_kill(h));
    printf("result %ld\n", h);
    fflush(stdout);
    die();
    return 0;
}
