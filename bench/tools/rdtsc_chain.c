/* What the code between two `rdtsc` adds to their cost, the question behind the stubs'
 * layout (see crates/fnscope-agent/src/stubs.rs, `specialise_tls`). Each round reads the
 * counter twice and runs the same body after each read: nothing, a chain of k dependent loads
 * (each load's address is the value the one before it loaded), or k independent loads.
 *
 *   gcc -O2 -o rdtsc_chain bench/tools/rdtsc_chain.c && ./rdtsc_chain
 *
 * Prints ns per round (two `rdtsc`), medians of 7 runs of 2 million rounds. On the Intel Xeon
 * VM of stop 40: none 15.7, 8 independent loads 16.3, a chain of 2 15.8, of 4 17.5, of 8
 * 27.9: `rdtsc` waits for the loads before it, so a stub pays for its longest chain of
 * dependent loads beyond the dozen cycles the counter hides, not for its instructions. */
#include <stdio.h>

#include "timing.h"

/* A word that holds its own address: loading from it gives the address again. */
static void *self_word;

#define DEP(k) ".rept " #k "\n mov r8, [r8]\n .endr\n"
#define IND(k) ".rept " #k "\n mov r9, [r8]\n .endr\n"

#define ROUNDS(body)                                                                               \
    for (long i = 0; i < N; i++)                                                               \
        __asm__ volatile(".intel_syntax noprefix\n"                                            \
                         " lea r8, [rip + self_word]\n"                                        \
                         " rdtsc\n shl rdx, 32\n or rax, rdx\n mov [rsp - 64], rax\n" body      \
                         " rdtsc\n shl rdx, 32\n or rax, rdx\n mov [rsp - 72], rax\n" body      \
                         ".att_syntax\n" ::: "rax", "rdx", "r8", "r9", "memory")

#define MEASURE(name, body)                                                                        \
    do {                                                                                       \
        double v[REPS];                                                                        \
        for (int r = 0; r < REPS; r++) {                                                       \
            double t0 = now_ns();                                                              \
            ROUNDS(body);                                                                      \
            v[r] = (now_ns() - t0) / N;                                                        \
        }                                                                                      \
        printf("%-22s %.2f ns\n", name, median(v));                                           \
    } while (0)

int main(void)
{
    self_word = &self_word;
    MEASURE("none", "");
    MEASURE("8 independent loads", IND(8));
    MEASURE("chain of 2 loads", DEP(2));
    MEASURE("chain of 4 loads", DEP(4));
    MEASURE("chain of 8 loads", DEP(8));
    return 0;
}
