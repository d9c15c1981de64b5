/*
 * A function in hand-written assembly that copies its return address into a new frame and
 * returns from another stack pointer, as libffi's ffi_call_unix64 does (python's ctypes
 * calls every foreign function through it). Hooked in timing mode, its return reaches
 * fnscope's exit stub from a stack slot no open call was entered with: the tool must take it
 * as the newest open call's return and go on (before, it aborted the program).
 *
 * move_ret(top, fn) builds its frame inside an area its caller allocated (top is the end of
 * it), calls fn there, and returns through the copy. The caller uses alloca, so it restores
 * its stack pointer from its frame pointer, whatever move_ret leaves in rsp.
 */
#include <stdint.h>
#include <stdlib.h>

#include "counts.h"

void move_ret(void *top, void (*fn)(void));

/* The return address is read through a copy of rsp made with push/pop, as hand-written code
 * may: the analysis need not see it, and the exit stub must cope either way. */
__asm__(".text\n"
        ".globl move_ret\n"
        ".type move_ret, @function\n"
        "move_ret:\n"
        "  .cfi_startproc\n"
        "  pushq %rsp\n"
        "  popq %rax\n"
        "  movq (%rax), %r10\n"
        "  leaq -32(%rdi), %rax\n"
        "  movq %rbp, 16(%rax)\n"
        "  movq %r10, 24(%rax)\n"
        "  movq %rax, %rbp\n"
        "  movq %rax, %rsp\n"
        "  call *%rsi\n"
        "  leaq 24(%rbp), %rsp\n"
        "  movq 16(%rbp), %rbp\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size move_ret, .-move_ret\n");

COUNTER(leaf);
COUNTER(through_moved_return);
COUNTER(main);

static volatile long sink;

NOINLINE void leaf(void)
{
    HIT(leaf);
    sink++;
}

NOINLINE long through_moved_return(int i)
{
    HIT(through_moved_return);
    char *area = __builtin_alloca(256 + (i & 1) * 16);
    char *top = (char *)(((uintptr_t)area + 192) & ~(uintptr_t)15);
    move_ret(top, leaf);
    return sink + i;
}

int main(void)
{
    HIT(main);
    long total = 0;
    for (int i = 0; i < 1000; i++)
        total += through_moved_return(i);
    printf("total %ld\n", total);
    PRINT_COUNT(main);
    PRINT_COUNT(leaf);
    PRINT_COUNT(through_moved_return);
    print_count("count", "move_ret", 1000);
    return 0;
}
