/* Threads started by the thousand, each making a few calls and ending: the pattern of a
 * program that starts a thread per task. Each thread hands the recorder its one chunk with the
 * few records it holds as it ends, so this measures what a chunk costs more than what a call
 * costs.
 * Usage: churn ROUNDS   (default 20000 rounds of 4 threads; 0 returns at once)
 * Calls: 4 * ROUNDS (task) + 20 * ROUNDS (work). */
#include "common.h"
#include <pthread.h>

BENCH_FN long work(long x) { return x * 3 + 1; }

BENCH_FN void *task(void *arg)
{
    long s = 0;
    for (long i = 0; i < 5; i++)
        s += work((long)arg + i);
    return (void *)s;
}

int main(int argc, char **argv)
{
    long rounds = bench_arg(argc, argv, 1, 20000);
    if (rounds <= 0) {
        bench_report_calls(0);
        return 0;
    }
    long sum = 0;
    for (long k = 0; k < rounds; k++) {
        pthread_t t[4];
        for (long i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, task, (void *)i) != 0) {
                fprintf(stderr, "churn: pthread_create failed\n");
                return 1;
            }
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            sum += (long)r;
        }
    }
    fprintf(stderr, "churn: %ld\n", sum);
    bench_report_calls(24ULL * (unsigned long long)rounds);
    return 0;
}
