/*
 * A traced signal handler that lands while an exit stub holds a record slot it has reserved
 * and not yet written, and fills chunks meanwhile, so that the agent hands the chunk over
 * and takes a new one under the stub. The program single-steps through its loop of calls
 * (the trap flag; fnscope's stubs run inside it). The SIGTRAP handler knows an exit stub's
 * reservation by its instruction, `xadd qword ptr [rdx + 16], rsi` (rdx is the thread's state,
 * whose words 2 and 3 are the next free slot and the chunk's end; rsi the bytes wanted), and
 * takes turns at three ways to get in the way:
 *
 *   crossed  right before the xadd, calls `in_handler` until less room is left than the stub
 *            wants, so that its slots run past the chunk's end; right after, takes a new
 *            chunk. The stubs used to check such slots against the new chunk's end alone and
 *            write them past the old one's, over the next chunk's header (a call lost, a
 *            garbage count of lost records);
 *   before   right after the xadd, fills the chunk until a new one is taken: the slot lies in
 *            the chunk handed over;
 *   late     right after the stub's checks (the second conditional jump after the xadd),
 *            fills two chunks, so that the one holding the slot goes to the recorder before
 *            the stub writes it, and waits 10 ms, time for the recorder to take it.
 *
 * With the trap flag set, the agent's own slow paths (taking a chunk, with signals blocked)
 * are stepped through too: they used to block SIGTRAP, and the kernel kills a process whose
 * trap is blocked.
 *
 * Prints how many times each way met the stub (found by its instructions, so that a change
 * of the stubs shows as a failure, not as a pass; natively all 0). `loopfn(i)` returns 7 i,
 * for a check of the recorded values. Record with `--exclude on_trap`: the handler's own
 * record would take the room it leaves.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#include "counts.h"

COUNTER(loopfn);
COUNTER(in_handler);
COUNTER(on_trap);

static volatile long sink;
static long reservations, crossed, before, late;
/* The instruction the last trap stopped at: the one the current trap comes after. */
static const unsigned char *stepped;
/* Conditional jumps stepped since the last reservation of a `late` turn, or -1. */
static int jumps_since = -1;

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

static int is_reserve(const unsigned char *p)
{
    return memcmp(p, RESERVE, sizeof RESERVE) == 0;
}

static int is_conditional_jump(const unsigned char *p)
{
    return (p[0] >= 0x70 && p[0] <= 0x7f) || (p[0] == 0x0f && p[1] >= 0x80 && p[1] <= 0x8f);
}

/* Calls in_handler until the next free slot has jumped `swaps` times (each call's record
   takes 24 or 48 bytes: a jump is a new chunk). Returns whether it did. */
static int take_chunks(volatile unsigned long *state, int swaps)
{
    for (long k = 0; k < 1000000; k++) {
        unsigned long was = state[2];
        in_handler(k);
        unsigned long now = state[2];
        if ((now < was || now > was + 48) && --swaps == 0)
            return 1;
    }
    return 0;
}

NOINLINE void on_trap(int sig, siginfo_t *si, void *context)
{
    (void)sig;
    (void)si;
    HIT(on_trap);
    ucontext_t *uc = context;
    const unsigned char *next = (const unsigned char *)uc->uc_mcontext.gregs[REG_RIP];
    volatile unsigned long *state = (volatile unsigned long *)uc->uc_mcontext.gregs[REG_RDX];
    long turn = reservations % 3;
    if (is_reserve(next) && turn == 0) {
        unsigned long want = uc->uc_mcontext.gregs[REG_RSI];
        for (long k = 0; k < 1000000 && state[3] - state[2] >= want; k++)
            in_handler(k);
    }
    if (stepped && is_reserve(stepped)) {
        reservations++;
        if (turn == 0 && state[2] > state[3])
            crossed += take_chunks(state, 1);
        else if (turn == 1)
            before += take_chunks(state, 1);
        else if (turn == 2)
            jumps_since = 0;
    } else if (jumps_since >= 0 && stepped && is_conditional_jump(stepped) && ++jumps_since == 2) {
        jumps_since = -1;
        if (take_chunks(state, 2)) {
            late++;
            struct timespec ms10 = {0, 10000000};
            nanosleep(&ms10, NULL);
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
    printf("crossed %ld before %ld late %ld sum %ld\n", crossed, before, late, sum);
    PRINT_COUNT(loopfn);
    PRINT_COUNT(in_handler);
    print_count("skipped", "on_trap", CALLS(on_trap));
    return 0;
}
