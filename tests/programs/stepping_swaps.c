/*
 * A traced signal handler that lands between an exit stub's reservation of its record slots
 * and its check of them, every time, and fills the chunk meanwhile, so that the agent takes a
 * new one under the stub. The program single-steps through its loop of calls (the trap flag;
 * fnscope's stubs run inside it); right after each `xadd qword ptr [rdx + 16], rsi` it steps
 * over (an exit stub reserving slots: rdx is the thread's state, whose words 2 and 3 are the
 * next free slot and the chunk's end) the SIGTRAP handler calls `in_handler` until the next
 * free slot jumps: a new chunk. One chunk exactly, never two.
 *
 * The slots the stub reserved lie in the chunk now handed over, or past its end. The stubs
 * used to check them against the new chunk's end alone: a record was lost, written outside
 * any chunk (over another chunk's header), or left a hole of zeros in the old chunk that the
 * reader took for a call.
 *
 * With the trap flag set, the agent's own slow paths (taking a chunk, with signals blocked)
 * are stepped through too: they used to block SIGTRAP, and the kernel kills a process whose
 * trap is blocked.
 *
 * Prints `swaps N`: how many times the handler found the reservation and made the swap
 * (found by its instruction, so that a change of the stubs shows as a failure, not as a
 * pass); natively 0. `loopfn(i)` returns 7 i, for a check of the recorded values.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "counts.h"

#define TRAP_FLAG 0x100

COUNTER(loopfn);
COUNTER(in_handler);
COUNTER(on_trap);

static volatile long sink;
static long filled, swaps;
static const unsigned char *stepped;

/* xadd qword ptr [rdx + 16], rsi */
static const unsigned char RESERVE[] = {0x48, 0x0f, 0xc1, 0x72, 0x10};

NOINLINE void in_handler(long k)
{
    HIT(in_handler);
    sink += k;
}

NOINLINE long loopfn(long i)
{
    HIT(loopfn);
    return i * 7;
}

NOINLINE void on_trap(int sig, siginfo_t *si, void *context)
{
    (void)sig;
    (void)si;
    HIT(on_trap);
    ucontext_t *uc = context;
    const unsigned char *next = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    volatile unsigned long *state = (volatile unsigned long *)uc->uc_mcontext.gregs[REG_RDX];
    if (memcmp(next, RESERVE, sizeof RESERVE) == 0) {
        /* About to reserve rsi bytes: calls until less room is left, so that the
           reservation runs past the chunk's end. */
        unsigned long size = uc->uc_mcontext.gregs[REG_RSI];
        for (long k = 0; k < 1000000 && state[3] - state[2] >= size; k++)
            in_handler(k);
        if (state[3] - state[2] < size)
            filled++;
    }
    if (stepped && memcmp(stepped, RESERVE, sizeof RESERVE) == 0) {
        /* Calls until the next free slot leaves the run of slots it was walking: a new chunk
           (each call's record takes 24 or 48 bytes). */
        for (long k = 0; k < 1000000; k++) {
            unsigned long before = state[2];
            in_handler(k);
            unsigned long after = state[2];
            if (after < before || after > before + 48) {
                swaps++;
                break;
            }
        }
    }
    stepped = next;
}

static void trap_flag(int on)
{
    if (on)
        __asm__ volatile("pushfq; orq $0x100, (%%rsp); popfq" ::: "memory", "cc");
    else
        __asm__ volatile("pushfq; andq $~0x100, (%%rsp); popfq" ::: "memory", "cc");
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 300, sum = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    trap_flag(1);
    for (long i = 0; i < calls; i++)
        sum += loopfn(i);
    trap_flag(0);
    printf("filled %ld swaps %ld sum %ld\n", filled, swaps, sum);
    PRINT_COUNT(loopfn);
    PRINT_COUNT(in_handler);
    PRINT_COUNT(on_trap);
    return 0;
}
