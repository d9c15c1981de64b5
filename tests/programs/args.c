/*
 * Arguments must reach the hooked function intact, wherever the ABI puts them:
 *   - 8 integer and 10 floating-point arguments: 6 in rdi..r9, 8 in xmm0..7, the rest on the
 *     stack, together with a 24-byte struct and a long double passed in memory (the long
 *     double 16-byte aligned) - the tool's entry code must not move the stack;
 *   - variadic functions: the caller sets al to the number of vector registers used and the
 *     callee's prologue only saves xmm0..7 when al is not zero, so an entry stub that
 *     clobbers al loses the double arguments; the same prologue stores them with movaps,
 *     which faults if the stub misaligned the stack;
 *   - a GNU C nested function, which gets its parent's frame in r10 (the static chain).
 * Each callee checks every value against what the caller meant to pass and counts the
 * mismatches; main prints them.
 */
#include <stdarg.h>
#include <string.h>

#include "counts.h"

struct three { long a, b, c; };

COUNTER(many_ints);
COUNTER(many_mixed);
COUNTER(va_sum);
COUNTER(va_format);
COUNTER(v_format);
COUNTER(with_nested);

static int failures;

static void expect_l(const char *what, long got, long want)
{
    if (got != want) {
        printf("MISMATCH %s: got %ld want %ld\n", what, got, want);
        failures++;
    }
}

static void expect_d(const char *what, double got, double want)
{
    if (memcmp(&got, &want, sizeof got) != 0) {
        printf("MISMATCH %s: got %a want %a\n", what, got, want);
        failures++;
    }
}

/* Argument k of call `seed` is seed * 100 + k: each one distinct and predictable. */
#define IV(seed, k) ((long)(seed) * 100 + (k))
#define DV(seed, k) ((double)(seed) * 100 + (k) + 0.5)

NOINLINE long many_ints(long seed, long a1, long a2, long a3, long a4, long a5, long a6,
                        long a7, long a8)
{
    HIT(many_ints);
    long a[] = {a1, a2, a3, a4, a5, a6, a7, a8};
    for (int k = 0; k < 8; k++)
        expect_l("many_ints", a[k], IV(seed, k + 1));
    return a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8;
}

NOINLINE double many_mixed(int seed, long i1, double d1, long i2, double d2, long i3,
                           double d3, long i4, double d4, long i5, double d5, long i6,
                           double d6, long i7, double d7, long i8, double d8, double d9,
                           struct three s, double d10, long double ld, int last)
{
    HIT(many_mixed);
    long iv[] = {i1, i2, i3, i4, i5, i6, i7, i8};
    double dv[] = {d1, d2, d3, d4, d5, d6, d7, d8, d9, d10};
    for (int k = 0; k < 8; k++)
        expect_l("many_mixed int", iv[k], IV(seed, k + 1));
    for (int k = 0; k < 10; k++)
        expect_d("many_mixed double", dv[k], DV(seed, k + 1));
    expect_l("many_mixed struct a", s.a, IV(seed, 20));
    expect_l("many_mixed struct b", s.b, IV(seed, 21));
    expect_l("many_mixed struct c", s.c, IV(seed, 22));
    if (ld != (long double)seed / 3) {
        printf("MISMATCH many_mixed long double\n");
        failures++;
    }
    expect_l("many_mixed last", last, seed + 99);
    return d1 + d10 + (double)(i1 + i8);
}

/* fmt: 'i' int, 'l' long, 'd' double, 'L' long double. Argument k is checked like above. */
NOINLINE double va_sum(int seed, const char *fmt, ...)
{
    HIT(va_sum);
    va_list ap;
    va_start(ap, fmt);
    double total = 0;
    for (int k = 0; fmt[k]; k++) {
        switch (fmt[k]) {
        case 'i': {
            int v = va_arg(ap, int);
            expect_l("va_sum int", v, IV(seed, k));
            total += v;
            break;
        }
        case 'l': {
            long v = va_arg(ap, long);
            expect_l("va_sum long", v, IV(seed, k));
            total += (double)v;
            break;
        }
        case 'd': {
            double v = va_arg(ap, double);
            expect_d("va_sum double", v, DV(seed, k));
            total += v;
            break;
        }
        case 'L': {
            long double v = va_arg(ap, long double);
            if (v != (long double)DV(seed, k)) {
                printf("MISMATCH va_sum long double\n");
                failures++;
            }
            total += (double)v;
            break;
        }
        }
    }
    va_end(ap);
    return total;
}

/* A va_list passed on: vsnprintf reads the registers va_format's prologue saved. */
NOINLINE int v_format(char *buf, size_t n, const char *fmt, va_list ap)
{
    HIT(v_format);
    return vsnprintf(buf, n, fmt, ap);
}

NOINLINE int va_format(char *buf, size_t n, const char *fmt, ...)
{
    HIT(va_format);
    va_list ap;
    va_start(ap, fmt);
    int r = v_format(buf, n, fmt, ap);
    va_end(ap);
    return r;
}

/* The nested function reads and writes `acc` in with_nested's frame through r10. It is
 * called directly (its address is never taken), so no trampoline is involved. */
NOINLINE long with_nested(long k)
{
    HIT(with_nested);
    long acc = k;
    __attribute__((noinline)) long bump(long x)
    {
        acc += x;
        return acc * 2;
    }
    long r = 0;
    for (long i = 0; i < 10; i++)
        r += bump(i);
    return r + acc;
}

int main(int argc, char **argv)
{
    (void)argv;
    volatile int base = argc; /* 1, unknown to the compiler */
    double dsum = 0;
    long lsum = 0;
    char buf[256];

    for (int s = base; s < base + 200; s++) {
        lsum += many_ints(s, IV(s, 1), IV(s, 2), IV(s, 3), IV(s, 4), IV(s, 5), IV(s, 6),
                          IV(s, 7), IV(s, 8));
        struct three t = {IV(s, 20), IV(s, 21), IV(s, 22)};
        dsum += many_mixed(s, IV(s, 1), DV(s, 1), IV(s, 2), DV(s, 2), IV(s, 3), DV(s, 3),
                           IV(s, 4), DV(s, 4), IV(s, 5), DV(s, 5), IV(s, 6), DV(s, 6),
                           IV(s, 7), DV(s, 7), IV(s, 8), DV(s, 8), DV(s, 9), t, DV(s, 10),
                           (long double)s / 3, s + 99);
        /* 9 doubles: 8 in xmm0..7 (al = 8), one on the stack, mixed with ints. */
        dsum += va_sum(s, "dddddddddi", DV(s, 0), DV(s, 1), DV(s, 2), DV(s, 3), DV(s, 4),
                       DV(s, 5), DV(s, 6), DV(s, 7), DV(s, 8), (int)IV(s, 9));
        /* One double among integers (al = 1), and long doubles in memory. */
        dsum += va_sum(s, "ilidlLL", (int)IV(s, 0), IV(s, 1), (int)IV(s, 2), DV(s, 3),
                       IV(s, 4), (long double)DV(s, 5), (long double)DV(s, 6));
        /* No vector registers at all (al = 0). */
        dsum += va_sum(s, "iiiiiiiill", (int)IV(s, 0), (int)IV(s, 1), (int)IV(s, 2),
                       (int)IV(s, 3), (int)IV(s, 4), (int)IV(s, 5), (int)IV(s, 6),
                       (int)IV(s, 7), IV(s, 8), IV(s, 9));
        va_format(buf, sizeof buf, "%d %.3f %s %.2f %ld %.1f", s, DV(s, 1), "x", DV(s, 2),
                  IV(s, 3), DV(s, 4));
        char want[256];
        snprintf(want, sizeof want, "%d %.3f %s %.2f %ld %.1f", s, DV(s, 1), "x", DV(s, 2),
                 IV(s, 3), DV(s, 4));
        if (strcmp(buf, want) != 0) {
            printf("MISMATCH va_format: <%s> want <%s>\n", buf, want);
            failures++;
        }
        long nested = with_nested(s), acc = s, nested_want = 0;
        for (long i = 0; i < 10; i++) {
            acc += i;
            nested_want += acc * 2;
        }
        expect_l("with_nested", nested, nested_want + acc);
        lsum += nested;
    }
    printf("lsum %ld dsum %.3f last <%s>\n", lsum, dsum, buf);
    printf("%d mismatches\n", failures);

    PRINT_COUNT(many_ints);
    PRINT_COUNT(many_mixed);
    PRINT_COUNT(va_sum);
    PRINT_COUNT(va_format);
    PRINT_COUNT(v_format);
    PRINT_COUNT(with_nested);
    return failures ? 1 : 0;
}
