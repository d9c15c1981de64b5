/*
 * fork: the parent and two children each call functions a known number of times. The
 * children inherit the parent's counters, so each child zeroes them first and then prints
 * only its own calls; the test adds up the lines of all three processes. One child leaves
 * with exit() (atexit handlers and stdio flush run), the other with _exit() (nothing runs:
 * the tool has to get that child's calls without its cooperation). Functions that are
 * running while fork() is called (main) exist in both processes afterwards, so they are not
 * counted.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

COUNTER(parent_work);
COUNTER(child_work);
COUNTER(shared_work);

NOINLINE long parent_work(long x)
{
    HIT(parent_work);
    return x * 3 + 1;
}

NOINLINE long child_work(long x)
{
    HIT(child_work);
    return x * 5 + 2;
}

NOINLINE long shared_work(long x)
{
    HIT(shared_work);
    return x ^ 0x77;
}

static void reset_counts(void)
{
    parent_work_calls = child_work_calls = shared_work_calls = 0;
}

static void print_counts(void)
{
    PRINT_COUNT(parent_work);
    PRINT_COUNT(child_work);
    PRINT_COUNT(shared_work);
}

static void child(int n, int use_exit)
{
    reset_counts();
    long h = n;
    for (int i = 0; i < n; i++)
        h = child_work(h) + shared_work(i);
    /* Each child writes one line, all on stderr, so nothing is left in a stdio buffer. */
    fprintf(stderr, "child %d result %ld\n", n, h);
    print_counts();
    if (use_exit)
        exit(7);
    _exit(9);
}

static pid_t spawn(int n, int use_exit)
{
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0)
        child(n, use_exit);
    return pid;
}

static int wait_code(pid_t pid)
{
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

int main(void)
{
    long h = 1;
    for (int i = 0; i < 1000; i++)
        h = parent_work(h) + shared_work(i);
    printf("parent before fork %ld\n", h);
    fflush(stdout);

    /* One child at a time, so the output order is fixed. */
    pid_t a = spawn(300, 1);
    int code_a = wait_code(a);
    pid_t b = spawn(200, 0);
    int code_b = wait_code(b);

    for (int i = 0; i < 50; i++)
        h = parent_work(h) + shared_work(i);
    printf("parent after fork %ld, child exit codes %d %d\n", h, code_a, code_b);
    print_counts();
    return code_a == 7 && code_b == 9 ? 3 : 1;
}
