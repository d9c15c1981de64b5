/*
 * Shared by the test programs that need code laid out without padding: an assembler macro
 * `DENSE_MIX name` that defines a 161-byte function `int name(int a, int b)` (with call frame
 * information) whose first 17 bytes are simple relocatable instructions. Put
 * DENSE_MIX_MACRO in an asm() block, then `DENSE_MIX some_name` lines.
 */
#ifndef FNSCOPE_TEST_DENSE_ASM_H
#define FNSCOPE_TEST_DENSE_ASM_H

#define DENSE_MIX_MACRO                                                                  \
    ".macro DENSE_MIX name\n"                                                            \
    ".globl \\name\n.type \\name,@function\n\\name:\n"                                   \
    "  .cfi_startproc\n"                                                                 \
    "  push %rbx\n"                                                                      \
    "  .cfi_adjust_cfa_offset 8\n"                                                       \
    "  .cfi_offset %rbx, -16\n"                                                          \
    "  mov %edi,%ebx\n"                                                                  \
    "  lea (%rbx,%rsi),%eax\n"                                                           \
    "  xor $0x55,%eax\n"                                                                 \
    "  .rept 30\n"                                                                       \
    "  imul $7,%eax,%eax\n"                                                              \
    "  add %ebx,%eax\n"                                                                  \
    "  .endr\n"                                                                          \
    "  pop %rbx\n"                                                                       \
    "  .cfi_adjust_cfa_offset -8\n"                                                      \
    "  .cfi_restore %rbx\n"                                                              \
    "  ret\n"                                                                            \
    "  .cfi_endproc\n"                                                                   \
    ".size \\name, .-\\name\n"                                                           \
    ".endm\n"

#endif
