/*
 * Ordinary calls of every kind a plain C program makes: direct calls, calls through a
 * pointer from libc (qsort comparator), a constructor that runs before main, an atexit
 * handler that runs after main, and a function whose unlikely path GCC moves to a separate
 * `classify.cold` part (entered by a jump, not a call: hooking it would corrupt the stack).
 *
 * It also shows what `record` must pass through untouched: arguments, environment, working
 * directory and stdin. The test builds it several ways (-O2, -O0, -fcf-protection, -no-pie)
 * and also strips it.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "counts.h"

COUNTER(early_init);
COUNTER(main);
COUNTER(add3);
COUNTER(square);
COUNTER(cmp_int);
COUNTER(classify);
COUNTER(rare_note);
COUNTER(tree_walk);
COUNTER(at_exit_report);

static int init_value;

/* Runs from the executable's init_array, after preloaded libraries' constructors. */
__attribute__((constructor)) NOINLINE static void early_init(void)
{
    HIT(early_init);
    init_value = 17;
}

NOINLINE int add3(int a, int b, int c)
{
    HIT(add3);
    return a + b + c;
}

NOINLINE long square(long x)
{
    HIT(square);
    return x * x;
}

/* Called by qsort inside libc: a hooked function whose caller is not hooked. */
NOINLINE static int cmp_int(const void *a, const void *b)
{
    HIT(cmp_int);
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static volatile long rare_sink;

/* `cold` makes GCC put the unlikely branch of classify() into classify.cold. */
__attribute__((cold)) NOINLINE static void rare_note(int x)
{
    HIT(rare_note);
    rare_sink += x;
}

NOINLINE int classify(int x)
{
    HIT(classify);
    if (__builtin_expect(x % 97 == 0, 0)) {
        /* Executed a few times on purpose, so a wrongly hooked .cold part would crash. */
        rare_note(x);
        return -x - (int)(rare_sink & 1);
    }
    return x * 2 + 1;
}

/* Recursion with two calls per level. The XOR keeps GCC from turning the second call into a
 * loop (tail recursion with an accumulator), which would run the body without an entry. */
NOINLINE long tree_walk(int depth)
{
    HIT(tree_walk);
    if (depth == 0)
        return 1;
    long left = tree_walk(depth - 1);
    long right = tree_walk(depth - 1);
    return (left ^ right) + depth;
}

/* Runs inside exit(), after main has returned; prints every count including its own. */
NOINLINE static void at_exit_report(void)
{
    HIT(at_exit_report);
    PRINT_COUNT(early_init);
    PRINT_COUNT(main);
    PRINT_COUNT(add3);
    PRINT_COUNT(square);
    PRINT_COUNT(cmp_int);
    PRINT_COUNT(classify);
    PRINT_COUNT(rare_note);
    PRINT_COUNT(tree_walk);
    PRINT_COUNT(at_exit_report);
}

int main(int argc, char **argv)
{
    HIT(main);
    atexit(at_exit_report);

    printf("init_value %d\n", init_value);
    for (int i = 0; i < argc; i++)
        printf("arg[%d] <%s>\n", i, i == 0 ? "(program)" : argv[i]);
    const char *env = getenv("FNSCOPE_TEST_ENV");
    printf("env <%s>\n", env ? env : "(unset)");
    char cwd[4096];
    printf("cwd <%s>\n", getcwd(cwd, sizeof cwd) ? cwd : "(error)");

    /* Sum of the numbers on stdin (0 when stdin is empty or /dev/null). */
    long in_sum = 0, v;
    while (scanf("%ld", &v) == 1)
        in_sum += v;
    printf("stdin sum %ld\n", in_sum);

    long acc = 0;
    for (int i = 0; i < 1000; i++)
        acc += add3(i, 2 * i, 3) + square(i % 13);
    printf("acc %ld\n", acc);

    int data[500];
    unsigned seed = 12345;
    for (int i = 0; i < 500; i++) {
        seed = seed * 1103515245u + 12345u;
        data[i] = (int)(seed >> 8) % 10000;
    }
    qsort(data, 500, sizeof data[0], cmp_int);
    for (int i = 1; i < 500; i++)
        if (data[i - 1] > data[i]) {
            printf("qsort result not sorted\n");
            return 1;
        }
    printf("sorted min %d max %d\n", data[0], data[499]);

    long cls = 0;
    for (int i = 1; i <= 2000; i++)
        cls += classify(i);
    printf("classify sum %ld\n", cls);

    printf("tree_walk %ld\n", tree_walk(12));
    fflush(stdout);
    return 0;
}
