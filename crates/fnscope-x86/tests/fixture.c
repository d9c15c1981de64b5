/* Test program for fnscope-x86: compiled with gcc -O2 at test time. The assembly functions
   have an exact layout that the tests rely on. */
#include <stdio.h>

#include "dense_asm.h"

long counter = 42;

__attribute__((noinline)) int normal(int a, int b) {
    int s = 0;
    for (int i = 0; i < a; i++) s += i * b + (s >> 3);
    return s;
}

__attribute__((cold, noinline)) void report(int x) { fprintf(stderr, "rare %d\n", x); }

/* GCC moves the unlikely branch to `hot.cold`. */
__attribute__((noinline)) int hot(const int *v, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (__builtin_expect(v[i] < 0, 0)) {
            report(v[i]);
            s -= v[i] * 7;
            continue;
        }
        s += v[i];
    }
    return s;
}

int tiny(void);
int loopy(int, int);
long riprel(void);

int pad_short(int, int);
int packed_a(int);
int packed_b(int);
int noop1(void);
long ra_entry(void);
long ra_frame(void);
long ra_pop(void);
long args_only(long, long, long, long, long, long, long);

/* No padding within reach of a jmp rel8 (161-byte neighbours): both short functions get
 * their island in dense_big2's first bytes, which it relocates (dense_big1's are too far). */
asm(".section .text.dense,\"ax\",@progbits\n"
    ".p2align 4\n"
    DENSE_MIX_MACRO
    "DENSE_MIX dense_big1\n"
    ".globl dense_t1\n.type dense_t1,@function\ndense_t1:\n"
    "  .cfi_startproc\n  mov %edi,%eax\n  ret\n  .cfi_endproc\n"
    ".size dense_t1, .-dense_t1\n"
    ".globl dense_t2\n.type dense_t2,@function\ndense_t2:\n"
    "  .cfi_startproc\n  xor %eax,%eax\n  ret\n  .cfi_endproc\n"
    ".size dense_t2, .-dense_t2\n"
    "DENSE_MIX dense_big2\n"
    ".text\n");

asm(".text\n"
    /* 3 bytes: xor eax,eax; ret */
    ".globl tiny\n.type tiny,@function\ntiny:\n"
    "  xor %eax,%eax\n  ret\n"
    ".size tiny, .-tiny\n"
    /* 4 bytes, then alignment padding: hooked over its padding. */
    ".p2align 4\n"
    ".globl pad_short\n.type pad_short,@function\npad_short:\n"
    "  lea (%rdi,%rsi),%eax\n  ret\n"
    ".size pad_short, .-pad_short\n"
    ".p2align 4\n"
    /* Packed without padding: hooked through islands in padding nearby. */
    ".globl packed_a\n.type packed_a,@function\npacked_a:\n"
    "  mov %edi,%eax\n  ret\n"
    ".size packed_a, .-packed_a\n"
    ".globl packed_b\n.type packed_b,@function\npacked_b:\n"
    "  lea 1(%rdi),%eax\n  ret\n"
    ".size packed_b, .-packed_b\n"
    /* 1 byte, no padding after it: no form fits. */
    ".globl noop1\n.type noop1,@function\nnoop1:\n"
    "  ret\n"
    ".size noop1, .-noop1\n"
    /* The loop branches back to +2, inside the first 5 bytes: hooked through an island. */
    ".globl loopy\n.type loopy,@function\nloopy:\n"
    "  .cfi_startproc\n"
    "  xor %eax,%eax\n"
    "1: add %edi,%eax\n"
    "  dec %esi\n"
    "  jnz 1b\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size loopy, .-loopy\n"
    ".p2align 4\n"
    /* Starts with a 7-byte RIP-relative load. */
    ".globl riprel\n.type riprel,@function\nriprel:\n"
    "  .cfi_startproc\n"
    "  mov counter(%rip), %rax\n"
    "  add $1, %rax\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size riprel, .-riprel\n"
    /* Copies its return address at the entry, as libffi's ffi_call_unix64 does. */
    ".globl ra_entry\n.type ra_entry,@function\nra_entry:\n"
    "  mov (%rsp),%r10\n"
    "  mov %r10,%rax\n"
    "  ret\n"
    ".size ra_entry, .-ra_entry\n"
    /* Reads it through the frame pointer, after other stack moves. */
    ".globl ra_frame\n.type ra_frame,@function\nra_frame:\n"
    "  push %rbp\n"
    "  mov %rsp,%rbp\n"
    "  push %rbx\n"
    "  sub $24,%rsp\n"
    "  test %edi,%edi\n"
    "  je 2f\n"
    "  mov 8(%rbp),%rax\n"
    "2: add $24,%rsp\n"
    "  pop %rbx\n"
    "  pop %rbp\n"
    "  ret\n"
    ".size ra_frame, .-ra_frame\n"
    /* Pops it. */
    ".globl ra_pop\n.type ra_pop,@function\nra_pop:\n"
    "  pop %rax\n"
    "  push %rax\n"
    "  ret\n"
    ".size ra_pop, .-ra_pop\n"
    /* Reads its 7th argument, just above the return address: an ordinary function. */
    ".globl args_only\n.type args_only,@function\nargs_only:\n"
    "  push %rbx\n"
    "  sub $16,%rsp\n"
    "  mov 32(%rsp),%rax\n"
    "  lea 32(%rsp),%rbx\n"
    "  add $16,%rsp\n"
    "  pop %rbx\n"
    "  ret\n"
    ".size args_only, .-args_only\n");

/* What gcc makes of __builtin_return_address(0). */
__attribute__((noinline)) void *caller(void) { return __builtin_return_address(0); }

int main(int argc, char **argv) {
    int v[3] = {argc, 2, 3};
    (void)argv;
    printf("%d %d %d %d %ld\n", normal(argc + 5, 3), hot(v, 3), tiny(), loopy(2, 3), riprel());
    printf("%d %d %d %d %p %ld %ld %ld %ld\n", pad_short(1, 2), packed_a(3), packed_b(4), noop1(),
           caller(), ra_entry(), ra_frame(), ra_pop(), args_only(1, 2, 3, 4, 5, 6, 7));
    return 0;
}
