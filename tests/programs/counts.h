/*
 * Shared by the fnscope test programs: each program counts the calls of its own functions
 * and prints the counts at the end, so the test has an oracle that does not come from the
 * tool under test.
 *
 * Protocol (stderr, one line each; the test sums lines with the same kind and name, which is
 * how several processes of one run - fork, exec - add up):
 *   count NAME N    NAME must be hooked and its call count in `report --json` must be N.
 *   atmost NAME N   NAME must be hooked with 1..=N calls (the tool may drop calls deeper
 *                   than its shadow stack, but never invent any).
 *   skipped NAME N  NAME (called N times) must not be hooked: it cannot be patched safely.
 *                   The program checks its results itself.
 *   either NAME N   NAME may be skipped or hooked; if hooked, with exactly N calls.
 * NAME is the name as c++filt/`nm -C` print it; it may contain spaces, N is the last word.
 *
 * Counters are bumped with atomic read-modify-write so that threads and signal handlers
 * cannot lose increments, and so that the compiler can neither drop nor merge them.
 *
 * A count is only right if every execution of the body is one entry into the function.
 * GCC breaks that by inlining, cloning, or turning self-recursion whose result is combined
 * linearly (`return f(n - 1) * 2 + k`) into a loop: hence NOINLINE, and XOR in the recursive
 * functions. After changing a program, run check_oracles.sh: it compares every count with
 * the entries gdb sees.
 */
#ifndef FNSCOPE_TEST_COUNTS_H
#define FNSCOPE_TEST_COUNTS_H

#include <stdio.h>

/* A function that must stay a real function with exactly one entry per call: not inlined,
 * not cloned into a `.constprop`/`.isra` copy whose calls would not reach NAME, and kept
 * even if it looks unused. */
#define NOINLINE __attribute__((noinline, noclone, used))

#define COUNTER(fn) static unsigned long fn##_calls
#define HIT(fn) __atomic_fetch_add(&fn##_calls, 1, __ATOMIC_RELAXED)
#define CALLS(fn) __atomic_load_n(&fn##_calls, __ATOMIC_RELAXED)

static inline void print_count(const char *kind, const char *name, unsigned long n)
{
    fprintf(stderr, "%s %s %lu\n", kind, name, n);
}

/* For the common case where the printed name is the C identifier. */
#define PRINT_COUNT(fn) print_count("count", #fn, CALLS(fn))

#endif
