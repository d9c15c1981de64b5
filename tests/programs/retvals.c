/*
 * Return values in every place the x86-64 System V ABI puts them. The tool's exit code runs
 * between the callee's `ret` and the caller, so it must leave all of them alone:
 *   rax; rax:rdx (struct of two longs, __int128); xmm0 (double, float, __float128, __m128i);
 *   xmm0:xmm1 (struct of two doubles, _Complex double, struct of four floats); rax + xmm0
 *   (struct {long; double}); st(0) (long double); st(0):st(1) (_Complex long double); memory
 *   with the address in rax (large struct); ymm0 and zmm0 (__m256d, __m512d - only where the
 *   CPU has AVX / AVX-512F: a 128-bit VEX instruction in the tool's stub would zero their
 *   upper halves).
 * The x87 loop also catches a stub that leaves the x87 register stack unbalanced: after
 * 8 leaks every further long double operation gives NaN.
 * main computes the expected values with the same expressions and compares bit for bit.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "counts.h"

typedef struct { long a, b; } pair_l;
typedef struct { double x, y; } pair_d;
typedef struct { long n; double d; } mixed;
typedef struct { float a, b, c, d; } quad_f;
typedef struct { long v[6]; } big;

COUNTER(ret_long);
COUNTER(ret_pair_l);
COUNTER(ret_i128);
COUNTER(ret_double);
COUNTER(ret_float);
COUNTER(ret_f128);
COUNTER(ret_m128i);
COUNTER(ret_pair_d);
COUNTER(ret_cdouble);
COUNTER(ret_quad_f);
COUNTER(ret_mixed);
COUNTER(ret_ld);
COUNTER(ret_cld);
COUNTER(ret_big);
COUNTER(ret_m256d);
COUNTER(ret_m512d);

NOINLINE long ret_long(long x) { HIT(ret_long); return x * 1000003 + 7; }
NOINLINE pair_l ret_pair_l(long x) { HIT(ret_pair_l); return (pair_l){x * 3, ~x}; }
NOINLINE __int128 ret_i128(long x) { HIT(ret_i128); return (__int128)x * 0x1234567890abcdefLL + 5; }
NOINLINE double ret_double(double x) { HIT(ret_double); return x * 1.5 + 0.25; }
NOINLINE float ret_float(float x) { HIT(ret_float); return x * 0.75f - 2.0f; }
NOINLINE __float128 ret_f128(__float128 x) { HIT(ret_f128); return x * 3 + 1; }
NOINLINE __m128i ret_m128i(long x)
{
    HIT(ret_m128i);
    return _mm_set_epi64x(x * 5, x ^ 0x55);
}
NOINLINE pair_d ret_pair_d(double x) { HIT(ret_pair_d); return (pair_d){x + 1, x * x}; }
NOINLINE _Complex double ret_cdouble(double x)
{
    HIT(ret_cdouble);
    return x * 2 + (x - 3) * 1.0i;
}
NOINLINE quad_f ret_quad_f(float x)
{
    HIT(ret_quad_f);
    return (quad_f){x, x + 1, x * 2, x * x};
}
NOINLINE mixed ret_mixed(long x) { HIT(ret_mixed); return (mixed){x - 9, (double)x / 8}; }
NOINLINE long double ret_ld(long double x) { HIT(ret_ld); return x * 3.0L / 7.0L + 0.5L; }
NOINLINE _Complex long double ret_cld(long double x)
{
    HIT(ret_cld);
    return x / 3 + (x * 5) * 1.0iL;
}
NOINLINE big ret_big(long x)
{
    HIT(ret_big);
    big b;
    for (int i = 0; i < 6; i++)
        b.v[i] = x * (i + 1);
    return b;
}
__attribute__((target("avx"))) NOINLINE __m256d ret_m256d(double x)
{
    HIT(ret_m256d);
    return _mm256_set_pd(x, x + 1, x + 2, x + 3);
}
__attribute__((target("avx512f"))) NOINLINE __m512d ret_m512d(double x)
{
    HIT(ret_m512d);
    return _mm512_set_pd(x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7);
}

static int failures;

static void same(const char *what, const void *got, const void *want, size_t n)
{
    if (memcmp(got, want, n) != 0) {
        printf("MISMATCH %s\n", what);
        failures++;
    }
}
#define SAME(what, got, want)                                                                 \
    do {                                                                                      \
        __typeof__(want) w_ = (want), g_ = (got);                                             \
        same(what, &g_, &w_, sizeof w_);                                                      \
    } while (0)

/* The AVX comparisons are in their own functions so that the rest of main is plain SSE2. */
__attribute__((target("avx"))) static void check_m256d(double x)
{
    __m256d g = ret_m256d(x), w = _mm256_set_pd(x, x + 1, x + 2, x + 3);
    same("ret_m256d", &g, &w, sizeof g);
}
__attribute__((target("avx512f"))) static void check_m512d(double x)
{
    __m512d g = ret_m512d(x),
            w = _mm512_set_pd(x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7);
    same("ret_m512d", &g, &w, sizeof g);
}

int main(int argc, char **argv)
{
    (void)argv;
    /* Inputs the compiler cannot see, so that nothing is folded at compile time. */
    volatile long seed = argc * 17;
    int avx = __builtin_cpu_supports("avx"), avx512 = __builtin_cpu_supports("avx512f");

    long double ld_sum = 0, ld_want = 0;
    for (int i = 0; i < 500; i++) {
        long x = seed + i;
        double d = (double)x / 3;
        float f = (float)x / 7;
        long double ld = (long double)x / 11;

        SAME("ret_long", ret_long(x), x * 1000003 + 7);
        SAME("ret_pair_l", ret_pair_l(x), ((pair_l){x * 3, ~x}));
        SAME("ret_i128", ret_i128(x), (__int128)x * 0x1234567890abcdefLL + 5);
        SAME("ret_double", ret_double(d), d * 1.5 + 0.25);
        SAME("ret_float", ret_float(f), f * 0.75f - 2.0f);
        __float128 q = (__float128)x / 13;
        SAME("ret_f128", ret_f128(q), q * 3 + 1);
        SAME("ret_m128i", ret_m128i(x), _mm_set_epi64x(x * 5, x ^ 0x55));
        SAME("ret_pair_d", ret_pair_d(d), ((pair_d){d + 1, d * d}));
        SAME("ret_cdouble", ret_cdouble(d), d * 2 + (d - 3) * 1.0i);
        SAME("ret_quad_f", ret_quad_f(f), ((quad_f){f, f + 1, f * 2, f * f}));
        SAME("ret_mixed", ret_mixed(x), ((mixed){x - 9, (double)x / 8}));
        /* long double has 6 padding bytes: compare the 10 that hold the value. */
        _Complex long double c = ret_cld(ld), cw = ld / 3 + (ld * 5) * 1.0iL;
        long double cr = __real__ c, ci = __imag__ c, cwr = __real__ cw, cwi = __imag__ cw;
        same("ret_cld real", &cr, &cwr, 10);
        same("ret_cld imag", &ci, &cwi, 10);
        big b = ret_big(x), bw;
        for (int k = 0; k < 6; k++)
            bw.v[k] = x * (k + 1);
        same("ret_big", &b, &bw, sizeof b);

        /* Accumulated on the x87 stack across calls. */
        ld_sum += ret_ld(ld);
        ld_want += ld * 3.0L / 7.0L + 0.5L;

        if (avx)
            check_m256d(d);
        if (avx512)
            check_m512d(d);
    }
    same("long double sum", &ld_sum, &ld_want, 10);
    printf("long double sum %.6Lf (%s)\n", ld_sum, ld_sum == ld_sum ? "a number" : "NaN");
    printf("avx %s, avx512f %s\n", avx ? "checked" : "not available",
           avx512 ? "checked" : "not available");
    printf("%d mismatches\n", failures);

    PRINT_COUNT(ret_long);
    PRINT_COUNT(ret_pair_l);
    PRINT_COUNT(ret_i128);
    PRINT_COUNT(ret_double);
    PRINT_COUNT(ret_float);
    PRINT_COUNT(ret_f128);
    PRINT_COUNT(ret_m128i);
    PRINT_COUNT(ret_pair_d);
    PRINT_COUNT(ret_cdouble);
    PRINT_COUNT(ret_quad_f);
    PRINT_COUNT(ret_mixed);
    PRINT_COUNT(ret_ld);
    PRINT_COUNT(ret_cld);
    PRINT_COUNT(ret_big);
    if (avx)
        PRINT_COUNT(ret_m256d);
    if (avx512)
        PRINT_COUNT(ret_m512d);
    return failures ? 1 : 0;
}
