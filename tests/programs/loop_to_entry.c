/* spin() loops by jumping back to its own first instruction, as gcc -O2 compiles
   `for (;;) { if (--n < 0) return; work(); }`-like loops of a function with nothing to save.
   Hooked, each turn would enter spin again: nested calls that never return. */
#include <stdio.h>
#include <stdlib.h>
long counter, total;
__attribute__((noinline)) void work(void) { __asm__ volatile("" ::: "memory"); total += counter; }
__asm__(".text\n.globl spin\n.type spin,@function\n"
        "spin:\n"
        "  .cfi_startproc\n"
        "  subq $1, counter(%rip)\n"
        "  js 1f\n"
        "  call work\n"
        "  jmp spin\n"
        "1: ret\n"
        "  .cfi_endproc\n"
        ".size spin, .-spin\n");
void spin(void);
int main(int argc, char **argv) {
    counter = argc > 1 ? atol(argv[1]) : 100000;
    spin();
    printf("total %ld\n", total);
    return 0;
}
