/*
 * Tail calls, compiled with GCC's default -O2 sibling-call optimisation: the calls below
 * become `jmp`s, so a hooked function is entered with the return address its caller's caller
 * pushed (which the tool may already have replaced), and one `ret` ends several calls.
 *   - is_even/is_odd: mutual recursion, every step a jump to the other function's entry;
 *   - tc_a -> tc_b -> tc_c: a chain of jumps, tc_c returns straight to tc_a's caller;
 *   - dispatch: an indirect tail call through a table (jmp *);
 *   - shuffle8: a tail call that rewrites the caller's incoming stack arguments in place;
 *   - tc_len: a tail call into libc (jmp strlen);
 *   - ping/pong: 100000 mutual tail calls in a row, which cost no native stack at all. A tool
 *     that keeps one shadow-stack entry per open call may drop some of them (atmost).
 * Self-recursion is avoided on purpose: GCC turns it into a loop, and a loop iteration is not
 * a call.
 */
#include <string.h>

#include "counts.h"

COUNTER(is_even);
COUNTER(is_odd);
COUNTER(tc_a);
COUNTER(tc_b);
COUNTER(tc_c);
COUNTER(dispatch);
COUNTER(op_add);
COUNTER(op_mul);
COUNTER(op_xor);
COUNTER(shuffle8);
COUNTER(sum8);
COUNTER(tc_len);
COUNTER(ping);
COUNTER(pong);

NOINLINE int is_odd(unsigned n);

NOINLINE int is_even(unsigned n)
{
    HIT(is_even);
    if (n == 0)
        return 1;
    return is_odd(n - 1);
}

NOINLINE int is_odd(unsigned n)
{
    HIT(is_odd);
    if (n == 0)
        return 0;
    return is_even(n - 1);
}

NOINLINE long tc_c(long x)
{
    HIT(tc_c);
    return x * 7 + 3;
}

NOINLINE long tc_b(long x)
{
    HIT(tc_b);
    return tc_c(x + 11);
}

NOINLINE long tc_a(long x)
{
    HIT(tc_a);
    return tc_b(x ^ 0x3f);
}

NOINLINE long op_add(long x) { HIT(op_add); return x + 1000; }
NOINLINE long op_mul(long x) { HIT(op_mul); return x * 3; }
NOINLINE long op_xor(long x) { HIT(op_xor); return x ^ 0xabc; }

static long (*const ops[3])(long) = {op_add, op_mul, op_xor};

NOINLINE long dispatch(int op, long x)
{
    HIT(dispatch);
    return ops[op % 3](x);
}

/* Positional weights make the sum depend on the order, so a mixed-up argument shows. */
NOINLINE long sum8(long a, long b, long c, long d, long e, long f, long g, long h)
{
    HIT(sum8);
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h;
}

/* g and h arrive on the stack and are passed on swapped, in the same stack slots. */
NOINLINE long shuffle8(long a, long b, long c, long d, long e, long f, long g, long h)
{
    HIT(shuffle8);
    return sum8(b, a, d, c, f, e, h, g);
}

NOINLINE size_t tc_len(const char *s)
{
    HIT(tc_len);
    return strlen(s);
}

NOINLINE unsigned long pong(unsigned long n, unsigned long acc);

NOINLINE unsigned long ping(unsigned long n, unsigned long acc)
{
    HIT(ping);
    if (n == 0)
        return acc;
    return pong(n - 1, acc * 3 + n);
}

NOINLINE unsigned long pong(unsigned long n, unsigned long acc)
{
    HIT(pong);
    if (n == 0)
        return acc;
    return ping(n - 1, acc ^ (acc >> 7));
}

int main(int argc, char **argv)
{
    (void)argv;
    volatile int base = argc; /* 1, unknown to the compiler */

    int evens = 0;
    for (unsigned i = 0; i < 200; i++)
        evens += is_even(i + (unsigned)base - 1);
    printf("evens %d\n", evens);

    long t = 0;
    for (long i = 0; i < 1000; i++)
        t += tc_a(i + base);
    printf("chain %ld\n", t);

    long d = 0;
    for (int i = 0; i < 999; i++)
        d += dispatch(i + base - 1, i);
    printf("dispatch %ld\n", d);

    long s = 0;
    for (long i = 0; i < 500; i++) {
        long r = shuffle8(i, i + base, i + 2, i + 3, i + 4, i + 5, i + 6, i + 7);
        long want = (i + 1) + 2 * i + 3 * (i + 3) + 4 * (i + 2) + 5 * (i + 5) + 6 * (i + 4) +
                    7 * (i + 7) + 8 * (i + 6);
        if (r != want)
            printf("MISMATCH shuffle8(%ld): %ld want %ld\n", i, r, want);
        s += r;
    }
    printf("shuffle %ld\n", s);

    const char *words[] = {"a", "tail", "calls", "everywhere"};
    size_t len = 0;
    for (int i = 0; i < 400; i++)
        len += tc_len(words[(i + base) % 4]);
    printf("lengths %zu\n", len);

    printf("ping-pong %lu\n", ping(100000 + (unsigned long)base - 1, 1));

    PRINT_COUNT(is_even);
    PRINT_COUNT(is_odd);
    PRINT_COUNT(tc_a);
    PRINT_COUNT(tc_b);
    PRINT_COUNT(tc_c);
    PRINT_COUNT(dispatch);
    PRINT_COUNT(op_add);
    PRINT_COUNT(op_mul);
    PRINT_COUNT(op_xor);
    PRINT_COUNT(shuffle8);
    PRINT_COUNT(sum8);
    PRINT_COUNT(tc_len);
    print_count("atmost", "ping", CALLS(ping));
    print_count("atmost", "pong", CALLS(pong));
    return 0;
}
