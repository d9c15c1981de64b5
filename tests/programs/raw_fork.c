/*
 * Copies of the process the C library's fork() does not announce (its pthread_atfork
 * handlers do not run): clone() without CLONE_VM, and fork and clone made through syscall().
 * Each child calls child_work a known number of times, prints its own counts and leaves
 * with _exit(); the parent checks each child's exit code, then calls parent_work. Traced,
 * the children died of SIGSEGV at their first hooked call.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

COUNTER(child_work);
COUNTER(parent_work);
COUNTER(in_clone);

NOINLINE long child_work(long x)
{
    HIT(child_work);
    return x * 5 + 2;
}

NOINLINE long parent_work(long x)
{
    HIT(parent_work);
    return x ^ 0x55;
}

/* A child's work: n calls, its counts printed, an exit code made of the result. */
static void child(int n)
{
    child_work_calls = parent_work_calls = in_clone_calls = 0;
    long s = 0;
    for (int i = 0; i < n; i++)
        s = child_work(s) % 1000003;
    PRINT_COUNT(child_work);
    _exit((int)(s % 50) + 1);
}

static int expected_code(int n)
{
    long s = 0;
    for (int i = 0; i < n; i++)
        s = (s * 5 + 2) % 1000003;
    return (int)(s % 50) + 1;
}

NOINLINE static int in_clone(void *arg)
{
    HIT(in_clone);
    child((int)(long)arg);
    return 0;
}

static int wait_for(long pid)
{
    int status;
    if (pid <= 0 || waitpid((pid_t)pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

int main(void)
{
    size_t size = 1 << 20;
    char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        return 2;
    int ok = 1;
    ok &= wait_for(clone(in_clone, stack + size, SIGCHLD, (void *)500L)) == expected_code(500);
    long pid = syscall(SYS_fork);
    if (pid == 0)
        child(300);
    ok &= wait_for(pid) == expected_code(300);
    pid = syscall(SYS_clone, SIGCHLD, 0L, 0L, 0L, 0L);
    if (pid == 0)
        child(200);
    ok &= wait_for(pid) == expected_code(200);
    long s = 0;
    for (int i = 0; i < 100; i++)
        s = parent_work(s);
    PRINT_COUNT(parent_work);
    print_count("count", "in_clone", 1);
    return ok && s >= 0 ? 0 : 1;
}
