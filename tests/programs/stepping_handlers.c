/*
 * A traced signal handler that runs after every instruction of a stretch of the program
 * (single-stepping: the trap flag), fnscope's entry and exit code included, and calls hooked
 * functions each time. Its calls must take the half-written or half-released shadow entry of
 * the call it interrupted for what it is: the handler's first call used to find, right after
 * the entry stub of f had reserved its entry, the slot word the handler's own call had left
 * there one instruction earlier, took the entry for a gone frame and removed it under the
 * stub, which then wrote into a free entry and lost f's return address.
 *
 * The counts are the program's own: the number of steps depends on the code stepped through,
 * so it differs traced and native. `covered` says whether the handler landed right after an
 * entry stub's reservation and right before an exit stub's pop (found by their instructions,
 * so that a change of the stubs shows as a failure, not as a pass); natively it prints 0 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#include "counts.h"

#define TRAP_FLAG 0x100

COUNTER(f);
COUNTER(g);
COUNTER(on_trap);
COUNTER(on_usr2);

static volatile long sink;
static volatile int stop;
static int after_reserve, before_pop;

/* The entry stub right after its xadd: cmp rcx, [rdx + 8]. */
static const unsigned char AFTER_RESERVE[] = {0x48, 0x3b, 0x4a, 0x08};
/* The exit stub's pop: sub qword ptr [rdx], 32. */
static const unsigned char EXIT_POP[] = {0x48, 0x83, 0x2a, 0x20};

NOINLINE long g(long x)
{
    HIT(g);
    sink += x;
    return x ^ 1;
}

NOINLINE long f(long x)
{
    HIT(f);
    sink += g(x);
    return x * 3 + sink;
}

NOINLINE void on_trap(int sig, siginfo_t *si, void *context)
{
    (void)sig;
    (void)si;
    HIT(on_trap);
    ucontext_t *uc = context;
    const unsigned char *rip = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    if (memcmp(rip, AFTER_RESERVE, sizeof AFTER_RESERVE) == 0)
        after_reserve = 1;
    if (memcmp(rip, EXIT_POP, sizeof EXIT_POP) == 0)
        before_pop = 1;
    sink += g(7);
    if (stop)
        uc->uc_mcontext.gregs[REG_EFL] &= ~TRAP_FLAG;
}

NOINLINE void on_usr2(int sig, siginfo_t *si, void *context)
{
    (void)sig;
    (void)si;
    HIT(on_usr2);
    ((ucontext_t *)context)->uc_mcontext.gregs[REG_EFL] |= TRAP_FLAG;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_SIGINFO;
    sa.sa_sigaction = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    sa.sa_sigaction = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    raise(SIGUSR2);
    static volatile long end = 4;
    for (long i = 0; i < end; i++)
        sink += f(i);
    stop = 1;
    printf("covered %d %d sink %ld\n", after_reserve, before_pop, sink);
    PRINT_COUNT(f);
    PRINT_COUNT(g);
    PRINT_COUNT(on_trap);
    PRINT_COUNT(on_usr2);
    return 0;
}
