/*
 * Functions whose first bytes make inline hooking hard, written in assembly so the bytes are
 * exactly what the test means (a compiler could lay them out differently). The hook
 * overwrites the first 5 bytes with a jump and moves the instructions it covered elsewhere:
 *
 *   short_ret, short_zero, short_inc   1, 3 and 4 bytes long, placed back to back with no
 *                                      padding: a 5-byte patch would overwrite the next one.
 *                                      short_ret (1 byte) must be skipped; the others may be
 *                                      hooked with a 2-byte jump to an island in padding
 *                                      nearby, or (none is in reach here) in the moved first
 *                                      bytes of a hooked neighbour.
 *   head_loop                          a loop jumps back to offset 2, inside a 5-byte patch:
 *                                      skipped, or hooked through an island (2 bytes).
 *   victim                             another function (jumper_in) jumps to victim+3,
 *                                      inside a 5-byte patch: skipped, or hooked through an
 *                                      island (only 2 bytes overwritten); jumper_in hooked.
 *   body_loop                          a loop jumps back to offset 10, past the patch: hooked.
 *                                      Its first instruction is RIP-relative with an
 *                                      immediate after the displacement.
 *   rip_prologue, rip_lea, rip_cmp     first instruction RIP-relative (load, lea, compare
 *                                      with immediate): hooked, relocated.
 *   early_branch                       a conditional branch in the first 5 bytes, to a
 *                                      target past them: hooked, branch relocated.
 *   call_head                          starts with a call; the tool may hook it or skip it,
 *                                      but must not break it.
 *
 * Each hookable function counts its own calls; the short ones cannot (there is no room): main
 * calls each of them exactly 1000 times and checks every result against a C version of the
 * same computation.
 */
#include <stdlib.h>

#include "counts.h"

/* Read and written by the assembly below, so neither static nor const-folded. */
unsigned long after_shorts_calls, jumper_in_calls, body_loop_calls, rip_prologue_calls;
unsigned long rip_lea_calls, rip_cmp_calls, early_branch_calls, call_head_calls;
long rip_total;
int rip_flag;
const int rip_table[8] = {11, 22, 33, 44, 55, 66, 77, 88};

void short_ret(void);
int short_zero(void);
int short_inc(int x);
int after_shorts(int x);
int head_loop(int n);
int victim(int x);
int jumper_in(int x);
int body_loop(int n);
long rip_prologue(long x);
int rip_lea(int i);
int rip_cmp(int x);
int early_branch(int x);
int call_head(int x);

__asm__(
    ".text\n"
    ".intel_syntax noprefix\n"

    /* --- 1, 3 and 4 bytes, then a hookable function, all back to back. --- */
    ".globl short_ret\n.type short_ret,@function\n"
    "short_ret:\n .cfi_startproc\n ret\n .cfi_endproc\n"
    ".size short_ret, .-short_ret\n"

    ".globl short_zero\n.type short_zero,@function\n"
    "short_zero:\n .cfi_startproc\n xor eax, eax\n ret\n .cfi_endproc\n"
    ".size short_zero, .-short_zero\n"

    ".globl short_inc\n.type short_inc,@function\n"
    "short_inc:\n .cfi_startproc\n lea eax, [rdi+1]\n ret\n .cfi_endproc\n"
    ".size short_inc, .-short_inc\n"

    ".globl after_shorts\n.type after_shorts,@function\n"
    "after_shorts:\n .cfi_startproc\n"
    " add qword ptr [rip+after_shorts_calls], 1\n"
    " lea eax, [rdi+rdi*2]\n ret\n .cfi_endproc\n"
    ".size after_shorts, .-after_shorts\n"

    /* --- int head_loop(int n): n + (n-1) + ... + 1 for n >= 1; the loop starts at offset 2. */
    ".globl head_loop\n.type head_loop,@function\n"
    "head_loop:\n .cfi_startproc\n"
    " xor eax, eax\n"
    "1: add eax, edi\n"
    " dec edi\n"
    " jg 1b\n"
    " ret\n .cfi_endproc\n"
    ".size head_loop, .-head_loop\n"

    /* --- int victim(int x) = 2x + 7; jumper_in(x) = x + 7 by jumping to victim+3. --- */
    ".globl victim\n.type victim,@function\n"
    "victim:\n .cfi_startproc\n"
    " lea eax, [rdi+rdi]\n" /* 3 bytes */
    ".Lvictim_mid:\n"
    " add eax, 7\n"
    " ret\n .cfi_endproc\n"
    ".size victim, .-victim\n"

    ".globl jumper_in\n.type jumper_in,@function\n"
    "jumper_in:\n .cfi_startproc\n"
    " add qword ptr [rip+jumper_in_calls], 1\n"
    " mov eax, edi\n"
    " jmp .Lvictim_mid\n .cfi_endproc\n"
    ".size jumper_in, .-jumper_in\n"

    /* --- int body_loop(int n): same sum as head_loop, loop starts at offset 10. --- */
    ".globl body_loop\n.type body_loop,@function\n"
    "body_loop:\n .cfi_startproc\n"
    " add qword ptr [rip+body_loop_calls], 1\n" /* 8 bytes: disp32 then imm8 */
    " xor eax, eax\n"
    "1: add eax, edi\n"
    " dec edi\n"
    " jg 1b\n"
    " ret\n .cfi_endproc\n"
    ".size body_loop, .-body_loop\n"

    /* --- long rip_prologue(long x): rip_total += x, returns the new total. --- */
    ".globl rip_prologue\n.type rip_prologue,@function\n"
    "rip_prologue:\n .cfi_startproc\n"
    " mov rax, qword ptr [rip+rip_total]\n"
    " add rax, rdi\n"
    " mov qword ptr [rip+rip_total], rax\n"
    " add qword ptr [rip+rip_prologue_calls], 1\n"
    " ret\n .cfi_endproc\n"
    ".size rip_prologue, .-rip_prologue\n"

    /* --- int rip_lea(int i) = rip_table[i & 7]. --- */
    ".globl rip_lea\n.type rip_lea,@function\n"
    "rip_lea:\n .cfi_startproc\n"
    " lea rax, [rip+rip_table]\n"
    " and edi, 7\n"
    " mov eax, dword ptr [rax+rdi*4]\n"
    " add qword ptr [rip+rip_lea_calls], 1\n"
    " ret\n .cfi_endproc\n"
    ".size rip_lea, .-rip_lea\n"

    /* --- int rip_cmp(int x) = rip_flag ? 2x : x + 100. --- */
    ".globl rip_cmp\n.type rip_cmp,@function\n"
    "rip_cmp:\n .cfi_startproc\n"
    " cmp dword ptr [rip+rip_flag], 0\n" /* disp32 then imm8 */
    " je 1f\n"
    " lea eax, [rdi+rdi]\n"
    " jmp 2f\n"
    "1: lea eax, [rdi+100]\n"
    "2: add qword ptr [rip+rip_cmp_calls], 1\n"
    " ret\n .cfi_endproc\n"
    ".size rip_cmp, .-rip_cmp\n"

    /* --- int early_branch(int x) = x < 0 ? -3x : x + 1000; js at offset 2. --- */
    ".globl early_branch\n.type early_branch,@function\n"
    "early_branch:\n .cfi_startproc\n"
    " test edi, edi\n"
    " js 1f\n"
    " lea eax, [rdi+1000]\n"
    " add qword ptr [rip+early_branch_calls], 1\n"
    " ret\n"
    "1: lea eax, [rdi+rdi*2]\n"
    " neg eax\n"
    " add qword ptr [rip+early_branch_calls], 1\n"
    " ret\n .cfi_endproc\n"
    ".size early_branch, .-early_branch\n"

    /* --- int call_head(int x) = call_head_helper(x) + 1 = 2x + 4. --- */
    ".globl call_head_helper\n.type call_head_helper,@function\n"
    "call_head_helper:\n .cfi_startproc\n"
    " lea eax, [rdi+rdi]\n"
    " add eax, 3\n"
    " ret\n .cfi_endproc\n"
    ".size call_head_helper, .-call_head_helper\n"

    ".globl call_head\n.type call_head,@function\n"
    "call_head:\n .cfi_startproc\n"
    " call call_head_helper\n" /* 5 bytes: the whole patch */
    " add eax, 1\n"
    " add qword ptr [rip+call_head_calls], 1\n"
    " ret\n .cfi_endproc\n"
    ".size call_head, .-call_head\n"

    ".att_syntax prefix\n");

static int failures;

static void check(const char *what, long got, long want)
{
    if (got != want) {
        printf("MISMATCH %s: got %ld, want %ld\n", what, got, want);
        failures++;
    }
}

static long sum_to(int n)
{
    long s = 0;
    for (int i = 1; i <= n; i++)
        s += i;
    return s;
}

int main(int argc, char **argv)
{
    (void)argv;
    /* argc is 1, but the compiler cannot know: the inputs are not constants. */
    int base = argc;
    long results = 0;

    for (int i = 0; i < 1000; i++) {
        int x = i + base;
        short_ret();
        check("short_zero", short_zero(), 0);
        check("short_inc", short_inc(x), x + 1);
        check("after_shorts", after_shorts(x), 3 * x);
        check("head_loop", head_loop(x % 50 + 1), sum_to(x % 50 + 1));
        check("victim", victim(x), 2 * x + 7);
        check("jumper_in", jumper_in(x), x + 7);
        check("body_loop", body_loop(x % 50 + 1), sum_to(x % 50 + 1));
        long before = rip_total;
        check("rip_prologue", rip_prologue(x), before + x);
        check("rip_lea", rip_lea(x), rip_table[x & 7]);
        rip_flag = i & 1;
        check("rip_cmp", rip_cmp(x), rip_flag ? 2 * x : x + 100);
        int y = (i % 3 == 0) ? -x : x;
        check("early_branch", early_branch(y), y < 0 ? -3 * y : y + 1000);
        check("call_head", call_head(x), 2 * x + 4);
        results += x;
    }
    printf("checked %ld, %d mismatches, rip_total %ld\n", results, failures, rip_total);

    print_count("skipped", "short_ret", 1000);
    print_count("either", "short_zero", 1000);
    print_count("either", "short_inc", 1000);
    print_count("either", "head_loop", 1000);
    print_count("either", "victim", 1000);
    print_count("count", "after_shorts", after_shorts_calls);
    print_count("count", "jumper_in", jumper_in_calls);
    print_count("count", "body_loop", body_loop_calls);
    print_count("count", "rip_prologue", rip_prologue_calls);
    print_count("count", "rip_lea", rip_lea_calls);
    print_count("count", "rip_cmp", rip_cmp_calls);
    print_count("count", "early_branch", early_branch_calls);
    print_count("either", "call_head", call_head_calls);
    return failures ? 1 : 0;
}
