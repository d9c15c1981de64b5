/* The same call-heavy loop on T threads: T workers share a fixed total number of iterations
 * (so the native wall time stays about the same from 1 thread up to the number of cores),
 * each iteration calling step(), which calls mix().
 * Usage: threads T [TOTAL_ITERATIONS]   (default 1 thread, 3000000; 0 iterations returns at once)
 * Calls: T (worker) + 2 * TOTAL_ITERATIONS (rounded down to a multiple of T). */
#include "common.h"
#include <pthread.h>
#include <stdint.h>

BENCH_FN uint64_t mix(uint64_t a, uint64_t b) { return (a ^ (b << 7)) * 0x9e3779b97f4a7c15ULL; }
BENCH_FN uint64_t step(uint64_t acc, uint64_t i) { return mix(acc, i) + (i & 3); }

struct job {
    long iters;
    uint64_t seed, result;
};

BENCH_FN void *worker(void *arg)
{
    struct job *j = arg;
    uint64_t acc = j->seed;
    for (long i = 0; i < j->iters; i++)
        acc = step(acc, (uint64_t)i);
    j->result = acc;
    return NULL;
}

int main(int argc, char **argv)
{
    long nthreads = bench_arg(argc, argv, 1, 1);
    long total = bench_arg(argc, argv, 2, 3000000);
    if (nthreads < 1 || nthreads > 256) {
        fprintf(stderr, "threads: thread count must be 1..256\n");
        return 2;
    }
    if (total <= 0) {
        bench_report_calls(0);
        return 0;
    }
    long per = total / nthreads;
    pthread_t tid[256];
    struct job jobs[256];
    for (long t = 0; t < nthreads; t++) {
        jobs[t].iters = per;
        jobs[t].seed = (uint64_t)t + 1;
        if (pthread_create(&tid[t], NULL, worker, &jobs[t]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    uint64_t x = 0;
    for (long t = 0; t < nthreads; t++) {
        pthread_join(tid[t], NULL);
        x ^= jobs[t].result;
    }
    printf("threads=%ld result=%llx\n", nthreads, (unsigned long long)x);
    bench_report_calls((unsigned long long)nthreads + 2ULL * (unsigned long long)(per * nthreads));
    return 0;
}
