/*
 * posix_spawn, then fork, with libc hooked. glibc's posix_spawn runs its child on a stack of
 * its own but with the parent's thread pointer, so the child's hooked libc calls land on the
 * parent's shadow stack; the stack is unmapped when posix_spawn returns. A later fork (or
 * exception, or thread exit) must not touch those entries' return slots (before: a crash in
 * every forked child).
 */
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

extern char **environ;

COUNTER(work);
COUNTER(spawn_true);

NOINLINE long work(long x)
{
    HIT(work);
    return x * 7 + 3;
}

NOINLINE int spawn_true(void)
{
    HIT(spawn_true);
    char *argv[] = {"true", NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ) != 0)
        return -1;
    int status;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void)
{
    long h = 1;
    for (int round = 0; round < 5; round++) {
        if (spawn_true() != 0)
            return 1;
        pid_t pid = fork();
        if (pid == 0) {
            work_calls = spawn_true_calls = 0;
            for (int i = 0; i < 10; i++)
                h = work(h);
            PRINT_COUNT(work);
            PRINT_COUNT(spawn_true);
            fflush(stderr);
            _exit(0);
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 2;
    }
    printf("done\n");
    PRINT_COUNT(work);
    PRINT_COUNT(spawn_true);
    return 0;
}
