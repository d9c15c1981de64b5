/*
 * fnscope's demo program: something small to record that has what a profile should show.
 *   - 4 worker threads, each with its own call tree;
 *   - recursion: every worker sorts its records with a recursive merge sort;
 *   - one clearly hot function: checksum() is called 200000 times (50000 per worker) and
 *     takes most of the run time;
 *   - a few cold functions called once or a handful of times.
 * It runs for about 0.2 s natively and prints a result that does not depend on timing.
 *
 *   gcc -O2 -g -pthread -o demo demo.c && fnscope record -- ./demo && fnscope report
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKERS 4
#define BLOCKS_PER_WORKER 50000
#define BLOCK_SIZE 256
#define RECORDS 20000

/* The hot spot. noinline keeps it a function of its own, as hot functions in real programs
 * usually are, instead of disappearing into its caller; noclone keeps GCC from specialising
 * it for the constant size into a `checksum.constprop.0` copy. The other functions get the
 * same treatment so that the report shows the names in this file. */
#define FUNCTION __attribute__((noinline, noclone))

FUNCTION static uint32_t checksum(const uint8_t *data, size_t n)
{
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + data[i]) % 65521;
        b = (b + a) % 65521;
    }
    return (b << 16) | a;
}

FUNCTION static void fill_block(uint8_t *block, uint32_t seed)
{
    for (size_t i = 0; i < BLOCK_SIZE; i++) {
        seed = seed * 1664525u + 1013904223u;
        block[i] = (uint8_t)(seed >> 24);
    }
}

FUNCTION static void merge(uint32_t *a, uint32_t *tmp, size_t mid, size_t n)
{
    size_t i = 0, j = mid, k = 0;
    while (i < mid && j < n)
        tmp[k++] = a[i] <= a[j] ? a[i++] : a[j++];
    while (i < mid)
        tmp[k++] = a[i++];
    while (j < n)
        tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

/* Recursive merge sort: 4095 calls per worker, nested 12 deep. */
FUNCTION static void merge_sort(uint32_t *a, uint32_t *tmp, size_t n)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && a[j - 1] > a[j]; j--) {
                uint32_t t = a[j];
                a[j] = a[j - 1];
                a[j - 1] = t;
            }
        return;
    }
    size_t mid = n / 2;
    merge_sort(a, tmp, mid);
    merge_sort(a + mid, tmp, n - mid);
    merge(a, tmp, mid, n);
}

FUNCTION static uint32_t process_blocks(int id, uint32_t *records)
{
    uint8_t block[BLOCK_SIZE];
    uint32_t acc = 0;
    for (int i = 0; i < BLOCKS_PER_WORKER; i++) {
        /* A fresh block every 100 checksums keeps fill_block well below checksum. */
        if (i % 100 == 0)
            fill_block(block, (uint32_t)(id * BLOCKS_PER_WORKER + i));
        block[i % BLOCK_SIZE] ^= (uint8_t)i;
        uint32_t c = checksum(block, BLOCK_SIZE);
        if (i < RECORDS)
            records[i] = c;
        acc ^= c;
    }
    return acc;
}

struct job {
    int id;
    uint32_t result, smallest, largest;
};

static void *worker(void *arg)
{
    struct job *job = arg;
    uint32_t *records = malloc(RECORDS * sizeof *records);
    uint32_t *tmp = malloc(RECORDS * sizeof *tmp);
    if (!records || !tmp) {
        perror("malloc");
        exit(1);
    }
    job->result = process_blocks(job->id, records);
    merge_sort(records, tmp, RECORDS);
    job->smallest = records[0];
    job->largest = records[RECORDS - 1];
    free(records);
    free(tmp);
    return NULL;
}

FUNCTION static void print_summary(const struct job *jobs)
{
    uint32_t all = 0;
    for (int i = 0; i < WORKERS; i++) {
        printf("worker %d: checksum %08x, smallest %08x, largest %08x\n", jobs[i].id,
               jobs[i].result, jobs[i].smallest, jobs[i].largest);
        all ^= jobs[i].result;
    }
    printf("combined %08x\n", all);
}

int main(void)
{
    pthread_t threads[WORKERS];
    struct job jobs[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        jobs[i].id = i;
        if (pthread_create(&threads[i], NULL, worker, &jobs[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    for (int i = 0; i < WORKERS; i++)
        pthread_join(threads[i], NULL);
    print_summary(jobs);
    return 0;
}
