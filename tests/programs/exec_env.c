/*
 * A program that starts programs with environments of its own, as `env -i` and many daemons
 * do: the traced program must still be followed. The first image spawns itself with
 * posix_spawn and an environment holding one variable, then replaces itself with execve and
 * another such environment, from inside `before_exec` (which, like main, is still running
 * when its image goes: those calls end with the exec). Each image prints the counts of its own
 * calls; the test adds up the lines.
 */
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

COUNTER(main);
COUNTER(child_work);
COUNTER(final_work);
COUNTER(before_exec);

NOINLINE long child_work(long x)
{
    HIT(child_work);
    return x * 3 + 1;
}

NOINLINE long final_work(long x)
{
    HIT(final_work);
    return x * 5 + 1;
}

static void print_all(void)
{
    PRINT_COUNT(main);
    PRINT_COUNT(child_work);
    PRINT_COUNT(final_work);
    PRINT_COUNT(before_exec);
    fflush(stderr);
}

NOINLINE void before_exec(char *self)
{
    HIT(before_exec);
    print_all();
    char *argv[] = {self, "final", NULL};
    char *envp[] = {"FNSCOPE_TEST_IMAGE=final", NULL};
    execve("/proc/self/exe", argv, envp);
    perror("execve");
    exit(1);
}

int main(int argc, char **argv)
{
    HIT(main);
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        long h = 1;
        for (int i = 0; i < 100; i++)
            h = child_work(h);
        printf("child %ld\n", h);
        print_all();
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "final") == 0) {
        long h = 1;
        for (int i = 0; i < 50; i++)
            h = final_work(h);
        printf("final %ld\n", h);
        print_all();
        return 0;
    }
    char *cargv[] = {argv[0], "child", NULL};
    char *cenv[] = {"FNSCOPE_TEST_IMAGE=child", NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, cargv, cenv) != 0)
        return 1;
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    fflush(stdout);
    before_exec(argv[0]);
    return 1;
}
