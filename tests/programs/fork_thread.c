/*
 * A thread other than main forks; in the child that thread becomes the only one and simply
 * returns, ending the child, while in the parent it goes on calling, inside a hooked frame
 * that was open at the fork. Before, the child's thread-exit handling took its state from
 * the parent's shared slot and emptied it, and the parent then aborted.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

COUNTER(work);
COUNTER(forker);

NOINLINE long work(long x)
{
    HIT(work);
    return x * 3 + 1;
}

NOINLINE long forker(int n)
{
    HIT(forker);
    pid_t pid = fork();
    if (pid == 0) {
        work_calls = forker_calls = 0;
        long h = 0;
        for (int i = 0; i < n; i++)
            h = work(h);
        PRINT_COUNT(work);
        PRINT_COUNT(forker);
        fflush(stderr);
        return h;
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        exit(3);
    long h = 1;
    for (int i = 0; i < 2 * n; i++)
        h = work(h);
    return h;
}

static void *thread_main(void *arg)
{
    (void)arg;
    return (void *)forker(10);
}

int main(void)
{
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, thread_main, NULL);
    pthread_join(t, &r);
    printf("parent %ld\n", (long)r);
    PRINT_COUNT(work);
    PRINT_COUNT(forker);
    return 0;
}
