/* Measures what one `rdtsc` costs on this machine: the floor of fnscope's timing mode, which
 * reads the time-stamp counter twice per call (entry and exit). On virtual machines that trap
 * or emulate the instruction it can be far above the 5-10 ns of bare metal.
 * Prints: `rdtsc-ns: X` (median of 7 runs of 2 million back-to-back reads), then the same for
 * `rdtscp` and for clock_gettime(CLOCK_MONOTONIC) for comparison. */
#include <stdint.h>
#include <stdio.h>

#include "timing.h"

int main(void)
{
    double r[REPS];
    uint64_t sink = 0;
    for (int k = 0; k < REPS; k++) {
        double t0 = now_ns();
        for (int i = 0; i < N; i++) {
            uint32_t lo, hi;
            __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
            sink += lo ^ hi;
        }
        r[k] = (now_ns() - t0) / N;
    }
    printf("rdtsc-ns: %.2f\n", median(r));
    for (int k = 0; k < REPS; k++) {
        double t0 = now_ns();
        for (int i = 0; i < N; i++) {
            uint32_t lo, hi, aux;
            __asm__ volatile("rdtscp" : "=a"(lo), "=d"(hi), "=c"(aux));
            sink += lo ^ hi;
        }
        r[k] = (now_ns() - t0) / N;
    }
    printf("rdtscp-ns: %.2f\n", median(r));
    for (int k = 0; k < REPS; k++) {
        double t0 = now_ns();
        for (int i = 0; i < N / 4; i++) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            sink += ts.tv_nsec;
        }
        r[k] = (now_ns() - t0) / (N / 4);
    }
    printf("clock_gettime-ns: %.2f\n", median(r));
    return sink == 42; /* keeps the loops */
}
