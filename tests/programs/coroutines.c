/*
 * Two coroutines on stacks of their own (ucontext), each switching away from inside nested
 * hooked functions and coming back later: hooked frames return on another stack than the
 * one that ran last, in an order no single call stack would have. One stack is a static
 * buffer (below the thread's stack), the other a buffer in main's frame (inside it).
 */
#include <ucontext.h>

#include "counts.h"

#define ROUNDS 200

COUNTER(leaf);
COUNTER(middle);
COUNTER(body_a);
COUNTER(body_b);

static ucontext_t main_ctx, ctx_a, ctx_b;
static volatile long sink;

NOINLINE long leaf(ucontext_t *self, ucontext_t *next, long x)
{
    HIT(leaf);
    swapcontext(self, next);
    return x * 2 + 1;
}

NOINLINE long middle(ucontext_t *self, ucontext_t *next, long x)
{
    HIT(middle);
    long r = leaf(self, next, x + 1);
    return r ^ x;
}

NOINLINE static void body_a(void)
{
    HIT(body_a);
    for (int i = 0; i < ROUNDS; i++)
        sink += middle(&ctx_a, &ctx_b, i);
}

NOINLINE static void body_b(void)
{
    HIT(body_b);
    for (int i = 0; i < ROUNDS; i++)
        sink += middle(&ctx_b, &ctx_a, i * 3);
}

static char stack_a[256 * 1024];

int main(void)
{
    char stack_b[256 * 1024];
    getcontext(&ctx_a);
    ctx_a.uc_stack.ss_sp = stack_a;
    ctx_a.uc_stack.ss_size = sizeof stack_a;
    ctx_a.uc_link = &main_ctx;
    makecontext(&ctx_a, body_a, 0);
    getcontext(&ctx_b);
    ctx_b.uc_stack.ss_sp = stack_b;
    ctx_b.uc_stack.ss_size = sizeof stack_b;
    ctx_b.uc_link = &main_ctx;
    makecontext(&ctx_b, body_b, 0);
    swapcontext(&main_ctx, &ctx_a);
    printf("sink %ld\n", sink);
    PRINT_COUNT(leaf);
    PRINT_COUNT(middle);
    PRINT_COUNT(body_a);
    PRINT_COUNT(body_b);
    return 0;
}
