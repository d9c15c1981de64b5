/* Shared by the bench workloads: how a function is kept a real, separate call.
 *
 * The workloads are built with plain `gcc -O2`, which would otherwise inline small functions,
 * clone them, or turn recursion into loops; the call counts each workload prints are only
 * right if every source-level call of a BENCH_FN function is a machine-level call.
 *  - noipa: no inlining, cloning or interprocedural changes of the calling convention;
 *  - no-optimize-sibling-calls: no tail calls and no tail-recursion-to-loop rewriting
 *    (gcc turns `fib(n-1) + fib(n-2)` into one call plus a loop without it).
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#define BENCH_FN __attribute__((noipa, optimize("no-optimize-sibling-calls")))

/* Prints the line the harness reads: the number of calls of BENCH_FN functions the run made
 * (main and the C runtime's own functions are not included). */
static inline void bench_report_calls(unsigned long long calls)
{
    printf("bench-calls: %llu\n", calls);
}

/* The size argument: argv[1] as a number, `def` when absent. 0 means "return at once" (the
 * harness measures start-up with it). */
static inline long bench_arg(int argc, char **argv, int i, long def)
{
    return argc > i ? strtol(argv[i], NULL, 10) : def;
}

#endif
