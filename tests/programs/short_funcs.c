/*
 * Functions of 2 to 4 bytes at -O2, which the 5-byte jump at the entry cannot hook: some
 * followed by alignment padding (hooked over it), some packed one after the other (hooked
 * with a 2-byte jump to an island in padding nearby), one with a loop back into its first 5
 * bytes (the same), and two in code laid out without any padding within reach of a 2-byte
 * jump (the island goes into the moved first bytes of a neighbour, whose calls must count
 * right too). Usage: short_funcs [N] (default 1000).
 *
 * The functions are too short to count their own calls (counts.h), so each call site
 * counts its call just before making it. `noipa` keeps every call a real call: no inlining,
 * no cloning, and no pure/const discovery that would let GCC merge or drop calls.
 */
#include <stdlib.h>

#include "counts.h"
#include "dense_asm.h"

#define SHORT __attribute__((noipa, used))
/* Not aligned: the next function starts right after the `ret`. */
#define PACKED __attribute__((noipa, used, optimize("align-functions=1")))

COUNTER(p_ident);
COUNTER(p_zero);
COUNTER(p_get);
COUNTER(loop_add);
COUNTER(add2);
COUNTER(sub2);
COUNTER(get_x);
COUNTER(neg);
COUNTER(dense_mix1);
COUNTER(dense_ident);
COUNTER(dense_mix2);
COUNTER(dense_zero);
COUNTER(dense_mix3);

struct point {
    int x, y;
};

PACKED int p_ident(int a) { return a; }
PACKED int p_zero(void) { return 0; }
PACKED int p_get(const int *p) { return *p; }

int loop_add(int a, int n);
/* Adds `a` n times (n >= 1); the loop goes back to +2, inside the first 5 bytes. */
asm(".text\n"
    ".globl loop_add\n.type loop_add,@function\nloop_add:\n"
    "  .cfi_startproc\n"
    "  xor %eax,%eax\n"
    "1: add %edi,%eax\n"
    "  dec %esi\n"
    "  jnz 1b\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size loop_add, .-loop_add\n");

int dense_mix1(int a, int b);
int dense_ident(int a);
int dense_mix2(int a, int b);
int dense_zero(void);
int dense_mix3(int a, int b);
/* A section of its own, no alignment inside: the short functions sit more than 128 bytes from
 * the padding at either end. Each mix function is 160 bytes. */
asm(".section .text.dense,\"ax\",@progbits\n"
    ".p2align 4\n"
    DENSE_MIX_MACRO
    "DENSE_MIX dense_mix1\n"
    ".globl dense_ident\n.type dense_ident,@function\ndense_ident:\n"
    "  .cfi_startproc\n  mov %edi,%eax\n  ret\n  .cfi_endproc\n"
    ".size dense_ident, .-dense_ident\n"
    "DENSE_MIX dense_mix2\n"
    ".globl dense_zero\n.type dense_zero,@function\ndense_zero:\n"
    "  .cfi_startproc\n  xor %eax,%eax\n  ret\n  .cfi_endproc\n"
    ".size dense_zero, .-dense_zero\n"
    "DENSE_MIX dense_mix3\n"
    ".text\n");

SHORT int add2(int a, int b) { return a + b; }
SHORT int sub2(int a, int b) { return a - b; }
SHORT int get_x(const struct point *p) { return p->x; }
SHORT int neg(int a) { return -a; }

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    struct point pt = {3, 4};
    long sum = 0;
    for (long i = 0; i < n; i++) {
        int k = (int)(i % 7);
        HIT(add2);
        sum += add2(k, 1);
        if (k < 3) {
            HIT(sub2);
            sum += sub2(k, 2);
        }
        HIT(get_x);
        sum += get_x(&pt);
        HIT(p_ident);
        sum += p_ident(k);
        if (i % 2 == 0) {
            HIT(neg);
            sum += neg(k);
            HIT(p_zero);
            sum += p_zero();
        }
        HIT(p_get);
        sum += p_get(&pt.y);
        if (i % 10 == 0) {
            HIT(loop_add);
            sum += loop_add(k, 3);
        }
        HIT(dense_mix1);
        sum += dense_mix1(k, 1);
        HIT(dense_ident);
        sum += dense_ident(k);
        if (k == 2) {
            HIT(dense_mix2);
            sum += dense_mix2(k, (int)i);
        }
        if (k > 4) {
            HIT(dense_zero);
            sum += dense_zero();
        }
        if (i % 3 == 0) {
            HIT(dense_mix3);
            sum += dense_mix3((int)i, k);
        }
    }
    printf("%ld\n", sum);
    PRINT_COUNT(p_ident);
    PRINT_COUNT(p_zero);
    PRINT_COUNT(p_get);
    PRINT_COUNT(loop_add);
    PRINT_COUNT(add2);
    PRINT_COUNT(sub2);
    PRINT_COUNT(get_x);
    PRINT_COUNT(neg);
    PRINT_COUNT(dense_mix1);
    PRINT_COUNT(dense_ident);
    PRINT_COUNT(dense_mix2);
    PRINT_COUNT(dense_zero);
    PRINT_COUNT(dense_mix3);
    return 0;
}
