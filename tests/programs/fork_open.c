/*
 * A hooked function that is running when the process forks: `spawner` calls fork() and
 * returns in both processes. fnscope's rule (docs): a call belongs to the process that
 * entered it, so `spawner` is one call, the parent's, in timing mode as in count mode; the
 * child's own calls (`child_work`) are its own. The child zeroes its copy of the counters,
 * so the lines of both processes add up to the calls entered.
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

COUNTER(spawner);
COUNTER(child_work);
COUNTER(parent_work);

NOINLINE long child_work(long x)
{
    HIT(child_work);
    return x * 5 + 2;
}

NOINLINE long parent_work(long x)
{
    HIT(parent_work);
    return x * 3 + 1;
}

NOINLINE pid_t spawner(int n)
{
    HIT(spawner);
    pid_t pid = fork();
    if (pid == 0) {
        spawner_calls = 0;
        long h = n;
        for (int i = 0; i < n; i++)
            h = child_work(h);
        fprintf(stderr, "child result %ld\n", h);
    }
    return pid;
}

int main(void)
{
    pid_t pid = spawner(100);
    if (pid == 0) {
        PRINT_COUNT(spawner);
        PRINT_COUNT(child_work);
        PRINT_COUNT(parent_work);
        fflush(stderr);
        _exit(0);
    }
    long h = 1;
    for (int i = 0; i < 50; i++)
        h = parent_work(h);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    printf("parent result %ld\n", h);
    PRINT_COUNT(spawner);
    PRINT_COUNT(child_work);
    PRINT_COUNT(parent_work);
    return 0;
}
