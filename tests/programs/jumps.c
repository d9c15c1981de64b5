/*
 * Non-local exits across hooked frames: longjmp out of a chain of hooked calls back to main,
 * longjmp back into a hooked function that is still running (it must then return normally,
 * through whatever the tool put in place of its return address), and siglongjmp out of a
 * hooked signal handler. Every call is counted when it is entered, whether it returns or is
 * jumped over, so the counts are exact.
 */
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include "counts.h"

COUNTER(jmp_a);
COUNTER(jmp_b);
COUNTER(jmp_c);
COUNTER(guarded);
COUNTER(deep_jump);
COUNTER(after_jump);
COUNTER(sig_chain_1);
COUNTER(sig_chain_2);
COUNTER(on_sigusr1);

static jmp_buf main_env;
static sigjmp_buf sig_env;
static volatile int sink;

NOINLINE void jmp_c(int i)
{
    HIT(jmp_c);
    if (i % 4 != 3)
        longjmp(main_env, i + 1);
    sink += i;
}

/* The work after each call keeps the calls from being tail calls: every frame is real. */
NOINLINE void jmp_b(int i)
{
    HIT(jmp_b);
    jmp_c(i);
    sink += 2;
}

NOINLINE void jmp_a(int i)
{
    HIT(jmp_a);
    jmp_b(i);
    sink += 3;
}

/* Always called with an env; the NULL test only gives the recursion a way to end that the
 * compiler can see. */
NOINLINE void deep_jump(jmp_buf *env, int depth)
{
    HIT(deep_jump);
    if (depth == 0) {
        if (env)
            longjmp(*env, 1);
        return;
    }
    deep_jump(env, depth - 1);
    sink += depth;
}

/* Calls setjmp itself, is jumped back into, and then returns normally. */
NOINLINE int guarded(int depth)
{
    HIT(guarded);
    jmp_buf env;
    volatile int landed = 0;
    if (setjmp(env) == 0)
        deep_jump(&env, depth);
    else
        landed = 1;
    return landed * 10 + depth;
}

NOINLINE int after_jump(int x)
{
    HIT(after_jump);
    return x + 1;
}

NOINLINE static void on_sigusr1(int sig)
{
    HIT(on_sigusr1);
    siglongjmp(sig_env, sig);
}

NOINLINE void sig_chain_2(int i)
{
    HIT(sig_chain_2);
    raise(SIGUSR1);
    sink += i; /* never reached: the handler jumps away */
}

NOINLINE void sig_chain_1(int i)
{
    HIT(sig_chain_1);
    sig_chain_2(i);
    sink += 1;
}

int main(void)
{
    volatile long total = 0;

    /* longjmp from 3 frames down to main, 150 times out of 200. */
    for (volatile int i = 0; i < 200; i++) {
        int r = setjmp(main_env);
        if (r == 0) {
            jmp_a(i);
            total += 1000;
        } else {
            total += r;
        }
        total += after_jump(i);
    }
    printf("longjmp total %ld\n", total);

    /* longjmp from 1..8 frames down back into guarded(), which then returns. */
    long g = 0;
    for (int i = 0; i < 100; i++)
        g += guarded(i % 8);
    printf("guarded total %ld\n", g);

    /* siglongjmp out of a handler that interrupted two hooked frames; the saved mask is
     * restored, so SIGUSR1 must be unblocked again afterwards. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    volatile int jumped = 0;
    for (volatile int i = 0; i < 50; i++) {
        if (sigsetjmp(sig_env, 1) == 0)
            sig_chain_1(i);
        else
            jumped++;
        total += after_jump(i);
    }
    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    printf("siglongjmp %d times, SIGUSR1 blocked afterwards: %s\n", jumped,
           sigismember(&now, SIGUSR1) ? "yes" : "no");
    printf("final total %ld\n", total);

    PRINT_COUNT(jmp_a);
    PRINT_COUNT(jmp_b);
    PRINT_COUNT(jmp_c);
    PRINT_COUNT(guarded);
    PRINT_COUNT(deep_jump);
    PRINT_COUNT(after_jump);
    PRINT_COUNT(sig_chain_1);
    PRINT_COUNT(sig_chain_2);
    PRINT_COUNT(on_sigusr1);
    return 0;
}
