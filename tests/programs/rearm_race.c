/*
 * The two places where re-arming frames after a backtrace would break a return, reached on
 * purpose by single-stepping (the trap flag) through fnscope's stubs:
 *  - exit: a first walk, from an untraced handler, lands at the very start of f's exit stub
 *    and disarms f (its slot still holds the stub then); single-stepping on, a second handler
 *    lands on the stub's pop, after the stub has put the real return address back. It walks
 *    from a hooked function and then calls one, which ends the walk. Re-arming f there would
 *    make its return land in the exit stub again, with its entry gone.
 *  - entry (argument "entry"): the second handler lands right after the entry stub of the
 *    next call of f from the same call site has reserved its shadow entry, which still holds
 *    the previous call's: re-arming it would make the stub save the exit stub as the return
 *    address.
 * The handlers find the places by the stubs' instructions; the program says which phase it
 * reached, so that a change of the stubs that moves them shows as a failure, not as a pass.
 * Run traced with `--exclude on_trap --exclude on_usr2` (untraced handlers); natively it
 * never leaves phase 0.
 */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#define NOINLINE __attribute__((noinline, noclone))
#define TRAP_FLAG 0x100

static volatile long sink;
static int phase, at_entry;

NOINLINE long f(long x)
{
    sink += x;
    return x * 3 + sink;
}

NOINLINE int walker(void)
{
    void *frames[64];
    return backtrace(frames, 64);
}

NOINLINE long after_walk(long x)
{
    sink += x;
    return x + 1;
}

/* fnscope_exit's first instructions: sub rsp, 8; mov [rsp-8], rax. */
static const unsigned char EXIT_START[] = {0x48, 0x83, 0xec, 0x08, 0x48, 0x89, 0x44, 0x24, 0xf8};
/* The exit stub's pop: sub qword ptr [rdx], 32. */
static const unsigned char EXIT_POP[] = {0x48, 0x83, 0x2a, 0x20};
/* The entry stub right after its xadd: cmp rcx, [rdx + 8]. */
static const unsigned char AFTER_RESERVE[] = {0x48, 0x3b, 0x4a, 0x08};

static void on_trap(int sig, siginfo_t *si, void *context)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = context;
    const unsigned char *rip = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    void *frames[64];
    if (phase == 0 && memcmp(rip, EXIT_START, sizeof EXIT_START) == 0) {
        sink += backtrace(frames, 64);
        phase = 1;
        return;
    }
    const unsigned char *second = at_entry ? AFTER_RESERVE : EXIT_POP;
    if (phase == 1 && memcmp(rip, second, 4) == 0) {
        sink += walker();
        sink += after_walk(1);
        phase = 2;
        uc->uc_mcontext.gregs[REG_EFL] &= ~TRAP_FLAG;
    }
}

static void on_usr2(int sig, siginfo_t *si, void *context)
{
    (void)sig;
    (void)si;
    ((ucontext_t *)context)->uc_mcontext.gregs[REG_EFL] |= TRAP_FLAG;
}

int main(int argc, char **argv)
{
    at_entry = argc > 1 && strcmp(argv[1], "entry") == 0;
    /* Loads the unwinder before stepping starts. */
    sink += walker();
    f(1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_SIGINFO;
    sa.sa_sigaction = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    sa.sa_sigaction = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    raise(SIGUSR2);
    static volatile long end = 4;
    for (long i = 2; i < end; i++)
        sink += f(i);
    printf("phase %d sink %ld\n", phase, sink);
    return 0;
}
