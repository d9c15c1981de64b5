/*
 * Register state across a hooked call, checked from assembly so that nothing the compiler
 * does can hide a difference.
 *
 * probe_call loads a distinct pattern into every general register and xmm0..15, pushes one
 * stack argument and calls probe_leaf. probe_leaf (the hooked function) first checks what it
 * received: the six argument registers, rax (al counts vector arguments of variadic calls),
 * r10 (static chain of nested functions), xmm0..7, the stack argument, the stack pointer
 * (exactly 8 below the caller's) and its alignment. It touches nothing but rax, the flags
 * and memory. After the call probe_call checks that every register other than rax still
 * holds its pattern: not only the callee-saved ones, because GCC's -fipa-ra (on at -O2)
 * lets a caller keep values in any register its callee is known not to write, so the
 * tool's entry and exit code must give back every register it uses.
 *
 * The result is one bit per register that was wrong; main names them.
 */
#include "counts.h"

/* Patterns: [0..5] rdi rsi rdx rcx r8 r9, [6] rax, [7] r10, [8] stack argument, [9] r11,
 * [10] rbx, [11] rbp, [12..15] r12..r15. */
const unsigned long probe_pat[16] = {
    0x1111111111111101, 0x2222222222222202, 0x3333333333333303, 0x4444444444444404,
    0x5555555555555505, 0x6666666666666606, 0x0000000000000008, 0x7777777777777707,
    0x8888888888888808, 0x9999999999999909, 0xaaaaaaaaaaaaaa0a, 0xbbbbbbbbbbbbbb0b,
    0xcccccccccccccc0c, 0xdddddddddddddd0d, 0xeeeeeeeeeeeeee0e, 0x0f0f0f0f0f0f0f0f,
};
/* xmm0..15; ordinary numbers, so ucomisd reports equal only for equal values. */
const double probe_fpat[16] = {1.25, 2.5, 3.75, 5.0, 6.25, 7.5, 8.75, 10.0,
                               11.25, 12.5, 13.75, 15.0, 16.25, 17.5, 18.75, 20.0};
unsigned long probe_leaf_calls, probe_call_calls, probe_entry_mask, probe_exit_mask;
unsigned long probe_caller_rsp;

unsigned long probe_call(void);

/* Entry check of one general register against probe_pat[i]: sets bit i of
 * probe_entry_mask (bts: an `or` immediate cannot reach bit 31). */
#define ENTRY_GPR(reg, i)                                                                     \
    " cmp " #reg ", qword ptr [rip+probe_pat+8*" #i "]\n"                                    \
    " je 1f\n"                                                                                \
    " bts qword ptr [rip+probe_entry_mask], " #i "\n"                                      \
    "1:\n"
/* Entry check of xmm n against probe_fpat[n]: bit 16+n. Unordered (NaN) counts as wrong. */
#define ENTRY_XMM(n)                                                                          \
    " ucomisd xmm" #n ", qword ptr [rip+probe_fpat+8*" #n "]\n"                              \
    " jne 2f\n"                                                                               \
    " jnp 1f\n"                                                                               \
    "2: bts qword ptr [rip+probe_entry_mask], 16+" #n "\n"                               \
    "1:\n"
/* After-call check of a general register: bit `bit` of probe_exit_mask. */
#define EXIT_GPR(reg, i, bit)                                                                 \
    " cmp " #reg ", qword ptr [rip+probe_pat+8*" #i "]\n"                                    \
    " je 1f\n"                                                                                \
    " bts qword ptr [rip+probe_exit_mask], " #bit "\n"                                     \
    "1:\n"
#define EXIT_XMM(n)                                                                           \
    " ucomisd xmm" #n ", qword ptr [rip+probe_fpat+8*" #n "]\n"                              \
    " jne 2f\n"                                                                               \
    " jnp 1f\n"                                                                               \
    "2: bts qword ptr [rip+probe_exit_mask], 16+" #n "\n"                                \
    "1:\n"
#define LOAD_XMM(n) " movsd xmm" #n ", qword ptr [rip+probe_fpat+8*" #n "]\n"

__asm__(
    ".text\n"
    ".intel_syntax noprefix\n"

    ".globl probe_leaf\n.type probe_leaf,@function\n"
    "probe_leaf:\n .cfi_startproc\n"
    " add qword ptr [rip+probe_leaf_calls], 1\n"
    ENTRY_GPR(rdi, 0) ENTRY_GPR(rsi, 1) ENTRY_GPR(rdx, 2) ENTRY_GPR(rcx, 3)
    ENTRY_GPR(r8, 4) ENTRY_GPR(r9, 5) ENTRY_GPR(rax, 6) ENTRY_GPR(r10, 7)
    ENTRY_XMM(0) ENTRY_XMM(1) ENTRY_XMM(2) ENTRY_XMM(3)
    ENTRY_XMM(4) ENTRY_XMM(5) ENTRY_XMM(6) ENTRY_XMM(7)
    /* rax has been checked: from here on it is the scratch register. */
    " mov rax, qword ptr [rsp+8]\n"            /* the stack argument: bit 8 */
    " cmp rax, qword ptr [rip+probe_pat+8*8]\n"
    " je 1f\n"
    " bts qword ptr [rip+probe_entry_mask], 8\n"
    "1:\n"
    " lea rax, [rsp+8]\n"                      /* rsp exactly 8 below the caller's: bit 9 */
    " cmp rax, qword ptr [rip+probe_caller_rsp]\n"
    " je 1f\n"
    " bts qword ptr [rip+probe_entry_mask], 9\n"
    "1:\n"
    " test al, 15\n"                           /* rsp+8 16-byte aligned: bit 10 */
    " jz 1f\n"
    " bts qword ptr [rip+probe_entry_mask], 10\n"
    "1:\n"
    " mov rax, qword ptr [rip+probe_entry_mask]\n"
    " ret\n .cfi_endproc\n"
    ".size probe_leaf, .-probe_leaf\n"

    ".globl probe_call\n.type probe_call,@function\n"
    "probe_call:\n .cfi_startproc\n"
    " push rbx\n .cfi_adjust_cfa_offset 8\n .cfi_rel_offset rbx, 0\n"
    " push rbp\n .cfi_adjust_cfa_offset 8\n .cfi_rel_offset rbp, 0\n"
    " push r12\n .cfi_adjust_cfa_offset 8\n .cfi_rel_offset r12, 0\n"
    " push r13\n .cfi_adjust_cfa_offset 8\n .cfi_rel_offset r13, 0\n"
    " push r14\n .cfi_adjust_cfa_offset 8\n .cfi_rel_offset r14, 0\n"
    " push r15\n .cfi_adjust_cfa_offset 8\n .cfi_rel_offset r15, 0\n"
    " add qword ptr [rip+probe_call_calls], 1\n"
    " mov qword ptr [rip+probe_entry_mask], 0\n"
    " mov qword ptr [rip+probe_exit_mask], 0\n"
    /* Entry rsp was 8 mod 16; six pushes keep that; 8 more make room for the stack argument
     * and align rsp for the call. */
    " sub rsp, 8\n .cfi_adjust_cfa_offset 8\n"
    " mov rax, qword ptr [rip+probe_pat+8*8]\n"
    " mov qword ptr [rsp], rax\n"
    " mov qword ptr [rip+probe_caller_rsp], rsp\n"
    " mov rdi, qword ptr [rip+probe_pat+8*0]\n"
    " mov rsi, qword ptr [rip+probe_pat+8*1]\n"
    " mov rdx, qword ptr [rip+probe_pat+8*2]\n"
    " mov rcx, qword ptr [rip+probe_pat+8*3]\n"
    " mov r8, qword ptr [rip+probe_pat+8*4]\n"
    " mov r9, qword ptr [rip+probe_pat+8*5]\n"
    " mov rax, qword ptr [rip+probe_pat+8*6]\n"
    " mov r10, qword ptr [rip+probe_pat+8*7]\n"
    " mov r11, qword ptr [rip+probe_pat+8*9]\n"
    " mov rbx, qword ptr [rip+probe_pat+8*10]\n"
    " mov rbp, qword ptr [rip+probe_pat+8*11]\n"
    " mov r12, qword ptr [rip+probe_pat+8*12]\n"
    " mov r13, qword ptr [rip+probe_pat+8*13]\n"
    " mov r14, qword ptr [rip+probe_pat+8*14]\n"
    " mov r15, qword ptr [rip+probe_pat+8*15]\n"
    LOAD_XMM(0) LOAD_XMM(1) LOAD_XMM(2) LOAD_XMM(3) LOAD_XMM(4) LOAD_XMM(5) LOAD_XMM(6)
    LOAD_XMM(7) LOAD_XMM(8) LOAD_XMM(9) LOAD_XMM(10) LOAD_XMM(11) LOAD_XMM(12)
    LOAD_XMM(13) LOAD_XMM(14) LOAD_XMM(15)
    " call probe_leaf\n"
    /* rax holds the entry mask; everything else is checked. Exit bits: 0 rsp, 1..6 rdi..r9,
     * 7 r10, 8 r11, 9 rbx, 10 rbp, 11..14 r12..r15, 16+n xmm n. */
    " cmp rsp, qword ptr [rip+probe_caller_rsp]\n"
    " je 1f\n"
    " bts qword ptr [rip+probe_exit_mask], 0\n"
    "1:\n"
    EXIT_GPR(rdi, 0, 1) EXIT_GPR(rsi, 1, 2) EXIT_GPR(rdx, 2, 3) EXIT_GPR(rcx, 3, 4)
    EXIT_GPR(r8, 4, 5) EXIT_GPR(r9, 5, 6) EXIT_GPR(r10, 7, 7) EXIT_GPR(r11, 9, 8)
    EXIT_GPR(rbx, 10, 9) EXIT_GPR(rbp, 11, 10) EXIT_GPR(r12, 12, 11) EXIT_GPR(r13, 13, 12)
    EXIT_GPR(r14, 14, 13) EXIT_GPR(r15, 15, 14)
    EXIT_XMM(0) EXIT_XMM(1) EXIT_XMM(2) EXIT_XMM(3) EXIT_XMM(4) EXIT_XMM(5) EXIT_XMM(6)
    EXIT_XMM(7) EXIT_XMM(8) EXIT_XMM(9) EXIT_XMM(10) EXIT_XMM(11) EXIT_XMM(12)
    EXIT_XMM(13) EXIT_XMM(14) EXIT_XMM(15)
    /* Result: entry mask in the low 32 bits, exit mask in the high 32. */
    " mov rdx, qword ptr [rip+probe_exit_mask]\n"
    " shl rdx, 32\n"
    " or rax, rdx\n"
    " add rsp, 8\n .cfi_adjust_cfa_offset -8\n"
    " pop r15\n .cfi_adjust_cfa_offset -8\n .cfi_restore r15\n"
    " pop r14\n .cfi_adjust_cfa_offset -8\n .cfi_restore r14\n"
    " pop r13\n .cfi_adjust_cfa_offset -8\n .cfi_restore r13\n"
    " pop r12\n .cfi_adjust_cfa_offset -8\n .cfi_restore r12\n"
    " pop rbp\n .cfi_adjust_cfa_offset -8\n .cfi_restore rbp\n"
    " pop rbx\n .cfi_adjust_cfa_offset -8\n .cfi_restore rbx\n"
    " ret\n .cfi_endproc\n"
    ".size probe_call, .-probe_call\n"

    ".att_syntax prefix\n");

static const char *const entry_names[32] = {
    "rdi", "rsi", "rdx", "rcx", "r8", "r9", "rax", "r10", "stack argument", "stack pointer",
    "stack alignment", 0, 0, 0, 0, 0, "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
    "xmm7"};
static const char *const exit_names[32] = {
    "rsp", "rdi", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11", "rbx", "rbp", "r12", "r13",
    "r14", "r15", 0, "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
    "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"};

int main(void)
{
    unsigned long entry_bad = 0, exit_bad = 0;
    for (int i = 0; i < 1000; i++) {
        unsigned long r = probe_call();
        entry_bad |= r & 0xffffffff;
        exit_bad |= r >> 32;
    }
    for (int b = 0; b < 32; b++) {
        if (entry_bad >> b & 1)
            printf("WRONG at entry of the hooked function: %s\n", entry_names[b]);
        if (exit_bad >> b & 1)
            printf("WRONG after the hooked call returned: %s\n", exit_names[b]);
    }
    printf("registers %s\n", entry_bad | exit_bad ? "CHANGED" : "intact");
    print_count("count", "probe_leaf", probe_leaf_calls);
    print_count("count", "probe_call", probe_call_calls);
    return entry_bad | exit_bad ? 1 : 0;
}
