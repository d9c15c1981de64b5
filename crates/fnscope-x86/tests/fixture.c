/* Test program for fnscope-x86: compiled with gcc -O2 at test time. The assembly functions
   have an exact layout that the tests rely on. */
#include <stdio.h>

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

asm(".text\n"
    /* 3 bytes: xor eax,eax; ret */
    ".globl tiny\n.type tiny,@function\ntiny:\n"
    "  xor %eax,%eax\n  ret\n"
    ".size tiny, .-tiny\n"
    /* The loop branches back to +2, inside the first 5 bytes. */
    ".globl loopy\n.type loopy,@function\nloopy:\n"
    "  .cfi_startproc\n"
    "  xor %eax,%eax\n"
    "1: add %edi,%eax\n"
    "  dec %esi\n"
    "  jnz 1b\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size loopy, .-loopy\n"
    /* Starts with a 7-byte RIP-relative load. */
    ".globl riprel\n.type riprel,@function\nriprel:\n"
    "  .cfi_startproc\n"
    "  mov counter(%rip), %rax\n"
    "  add $1, %rax\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size riprel, .-riprel\n");

int main(int argc, char **argv) {
    int v[3] = {argc, 2, 3};
    (void)argv;
    printf("%d %d %d %d %ld\n", normal(argc + 5, 3), hot(v, 3), tiny(), loopy(2, 3), riprel());
    return 0;
}
