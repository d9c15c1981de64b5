/*
 * backtrace() from signal handlers, with hooked frames open below them:
 *  1. SIGUSR1 raised from 3 hooked frames deep, handled on the same stack: the handler walks
 *     the stack (through the signal frame into the interrupted frames), calls a hooked
 *     function, and returns; the interrupted calls then return normally;
 *  2. the same with the handler on an alternate signal stack;
 *  3. on the alternate stack again, with a handler that only walks;
 *  4. a SIGSEGV from 3 hooked frames deep whose handler walks the stack, prints what it saw
 *     and the counts, and ends the process with _exit(7), as crash reporters do.
 * The program prints how many frames each walk saw and how many of the hooked functions
 * below the handler were among them: the same traced and natively. The calls made between
 * the walks (`between`) must be counted exactly, each a call of main's, and the traced
 * program must not crash elsewhere.
 */
#include <execinfo.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "counts.h"

COUNTER(outer);
COUNTER(middle);
COUNTER(inner);
COUNTER(handler_work);
COUNTER(between);
COUNTER(crash_outer);
COUNTER(crash_inner);
COUNTER(on_usr1);
COUNTER(only_walk);

static volatile long sink;
static volatile int *volatile nowhere;
static char walks[1024];

/* How many frames a walk saw, and whether the hooked ones below the handler are among them. */
static void note_walk(const char *what)
{
    void *frames[64];
    int n = backtrace(frames, 64);
    char **names = backtrace_symbols(frames, n);
    int seen = 0;
    for (int i = 0; i < n && names; i++)
        if (strstr(names[i], "(inner+") || strstr(names[i], "(middle+") || strstr(names[i], "(outer+") ||
            strstr(names[i], "(crash_inner+") || strstr(names[i], "(crash_outer+"))
            seen++;
    free(names);
    char line[96];
    int len = snprintf(line, sizeof line, "%s: %d frames, %d hooked callers\n", what, n, seen);
    strncat(walks, line, sizeof walks - strlen(walks) - 1);
    (void)len;
}

NOINLINE long handler_work(long x)
{
    HIT(handler_work);
    return x * 7 + 1;
}

NOINLINE static void on_usr1(int sig)
{
    HIT(on_usr1);
    note_walk(sig == SIGUSR1 ? "handler" : "?");
    sink += handler_work(sig);
}

NOINLINE static void only_walk(int sig)
{
    HIT(only_walk);
    note_walk(sig == SIGUSR1 ? "walking handler" : "?");
}

NOINLINE long inner(long x)
{
    HIT(inner);
    raise(SIGUSR1);
    return x + sink;
}

NOINLINE long middle(long x)
{
    HIT(middle);
    return inner(x) * 3;
}

NOINLINE long outer(long x)
{
    HIT(outer);
    return middle(x) ^ 5;
}

NOINLINE long between(long x)
{
    HIT(between);
    return x * 2 + 1;
}

/* Inlined, so that `between` is called by main itself. */
static inline __attribute__((always_inline)) long three_rounds(void)
{
    long sum = 0;
    for (int i = 0; i < 3; i++) {
        sum += outer(i);
        for (int j = 0; j < 50; j++)
            sum += between(j);
    }
    return sum;
}

static void print_counts(void)
{
    fputs(walks, stdout);
    fflush(stdout);
    PRINT_COUNT(outer);
    PRINT_COUNT(middle);
    PRINT_COUNT(inner);
    PRINT_COUNT(handler_work);
    PRINT_COUNT(between);
    PRINT_COUNT(on_usr1);
    PRINT_COUNT(only_walk);
    PRINT_COUNT(crash_outer);
    PRINT_COUNT(crash_inner);
}

static void on_segv(int sig)
{
    (void)sig;
    note_walk("crash handler");
    print_counts();
    _exit(7);
}

NOINLINE long crash_inner(long x)
{
    HIT(crash_inner);
    return *nowhere + x;
}

NOINLINE long crash_outer(long x)
{
    HIT(crash_outer);
    return crash_inner(x) * 2;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    long sum = 0;
    sum += three_rounds();
    static char alt[1 << 16];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    sum += three_rounds();
    sa.sa_handler = only_walk;
    sigaction(SIGUSR1, &sa, NULL);
    sum += three_rounds();
    printf("sum %ld\n", sum);
    sa.sa_handler = on_segv;
    sa.sa_flags = 0;
    sigaction(SIGSEGV, &sa, NULL);
    return (int)crash_outer(sum);
}
