/* Many small functions with arguments: integer, floating-point, pointer and struct arguments,
 * one to eight of them, a few calling each other, in a loop over a small array.
 * Usage: smallfuncs [ITERATIONS]   (default 400000; 0 returns at once)
 * Calls: CALLS_PER_ITER per iteration (counted below, next to each call site). */
#include "common.h"
#include <stdint.h>
#include <string.h>

struct pair { long a, b; };
struct vec3 { double x, y, z; };

BENCH_FN long add2(long a, long b) { return a * 3 + b; }
BENCH_FN long add3(long a, long b, long c) { return (a ^ b) + c * 5; }
BENCH_FN int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
BENCH_FN long mix6(long a, long b, long c, long d, long e, long f)
{
    return (a + b * 3) ^ (c - d * 7) ^ (e * 11 + f);
}
BENCH_FN long sum8(long a, long b, long c, long d, long e, long f, long g, long h)
{
    /* The last two arguments come on the stack. */
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h;
}
BENCH_FN double lerp(double a, double b, double t) { return a + (b - a) * t; }
BENCH_FN double dot3(struct vec3 u, struct vec3 v) { return u.x * v.x + u.y * v.y + u.z * v.z; }
BENCH_FN struct pair swap_pair(struct pair p) { struct pair q = { p.b + 1, p.a - 1 }; return q; }
BENCH_FN uint64_t hash_step(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }
BENCH_FN uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = hash_step(h, p[i]);           /* n calls of hash_step */
    return h;
}
BENCH_FN long sum_array(const int *a, int n)
{
    long s = 0;
    for (int i = 0; i < n; i++)
        s += a[i];
    return s;
}
BENCH_FN void store(long *slot, long v) { *slot = v ^ (*slot >> 1); }
BENCH_FN long nested(long a, long b)
{
    return add2(a, b) + add3(a, b, 1);    /* 2 calls */
}

#define HASH_LEN 4
/* 12 direct calls: add2 add3 clampi mix6 sum8 lerp dot3 swap_pair hash_bytes sum_array store
 * nested; hash_bytes makes HASH_LEN calls of hash_step and nested 2 more. */
#define CALLS_PER_ITER (12 + HASH_LEN + 2)

int main(int argc, char **argv)
{
    long iters = bench_arg(argc, argv, 1, 400000);
    if (iters <= 0) {
        bench_report_calls(0);
        return 0;
    }
    int arr[16];
    unsigned char bytes[HASH_LEN];
    for (int i = 0; i < 16; i++)
        arr[i] = i * 7 - 40;
    memcpy(bytes, "fnsc", HASH_LEN);
    long acc = 1, slot = 0;
    double facc = 0.5;
    struct pair p = { 1, 2 };
    for (long i = 0; i < iters; i++) {
        acc += add2(acc, i);
        acc += add3(acc, i, 3);
        acc += clampi((int)(acc & 0xffff), 100, 60000);
        acc ^= mix6(acc, i, 1, 2, 3, 4);
        acc += sum8(acc, i, 1, 2, 3, 4, 5, 6);
        facc = lerp(facc, (double)(i & 7), 0.25);
        struct vec3 u = { facc, 1.0, 2.0 }, v = { 0.5, (double)(i & 3), facc };
        facc += dot3(u, v) * 1e-9;
        p = swap_pair(p);
        bytes[i & (HASH_LEN - 1)] ^= (unsigned char)acc;
        acc ^= (long)hash_bytes(bytes, HASH_LEN);
        arr[i & 15] ^= (int)acc;
        acc += sum_array(arr, 16);
        store(&slot, acc);
        acc += nested(acc, slot);
    }
    printf("acc=%ld facc=%.6f p=(%ld,%ld) slot=%ld\n", acc, facc, p.a, p.b, slot);
    bench_report_calls((unsigned long long)iters * CALLS_PER_ITER);
    return 0;
}
