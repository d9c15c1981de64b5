/*
 * New program images started from a traced one: the program runs itself again through
 * /proc/self/exe
 *   - from a vfork() child (the child shares the parent's memory until it execs),
 *   - through posix_spawn() (glibc uses clone(CLONE_VM|CLONE_VFORK) for it),
 *   - and finally by exec'ing itself in place.
 * Each image prints the counts of its own calls before it leaves (the pre-exec image before
 * it execs); the test adds up the lines of all images. Functions that are running when an
 * image is replaced (main, run_image) never return, so they are not counted.
 */
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

extern char **environ;

COUNTER(first_work);
COUNTER(vfork_work);
COUNTER(spawn_work);
COUNTER(exec_work);
COUNTER(shared_work);
COUNTER(start_vfork);

NOINLINE long first_work(long x)
{
    HIT(first_work);
    return x * 3 + 1;
}

NOINLINE long vfork_work(long x)
{
    HIT(vfork_work);
    return x * 5 + 1;
}

NOINLINE long spawn_work(long x)
{
    HIT(spawn_work);
    return x * 7 + 1;
}

NOINLINE long exec_work(long x)
{
    HIT(exec_work);
    return x * 11 + 1;
}

NOINLINE long shared_work(long x)
{
    HIT(shared_work);
    return x ^ 0x3c;
}

static void print_counts(void)
{
    PRINT_COUNT(first_work);
    PRINT_COUNT(vfork_work);
    PRINT_COUNT(spawn_work);
    PRINT_COUNT(exec_work);
    PRINT_COUNT(shared_work);
    PRINT_COUNT(start_vfork);
}

/* A hooked function that vforks: the child runs on this frame until execv. Only execv and
 * _exit are called in the child, as POSIX requires. */
NOINLINE static pid_t start_vfork(char *argv0)
{
    HIT(start_vfork);
    char *args[] = {argv0, "vfork-child", NULL};
    pid_t pid = vfork();
    if (pid == 0) {
        execv("/proc/self/exe", args);
        _exit(127);
    }
    return pid;
}

static int wait_code(pid_t pid)
{
    int status;
    if (pid <= 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

static long loop(long (*fn)(long), int n)
{
    long h = 1;
    for (int i = 0; i < n; i++)
        h = fn(h) + shared_work(i);
    return h;
}

NOINLINE static int run_image(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "vfork-child") == 0) {
        printf("vfork child %ld\n", loop(vfork_work, 30));
        fflush(stdout);
        print_counts();
        return 21;
    }
    if (argc > 1 && strcmp(argv[1], "spawn-child") == 0) {
        printf("spawn child %ld\n", loop(spawn_work, 40));
        fflush(stdout);
        print_counts();
        return 22;
    }
    if (argc > 1 && strcmp(argv[1], "exec-image") == 0) {
        printf("exec image %ld\n", loop(exec_work, 50));
        fflush(stdout);
        print_counts();
        return 4;
    }

    printf("first image %ld\n", loop(first_work, 100));
    fflush(stdout);

    int vcode = wait_code(start_vfork(argv[0]));
    printf("vfork child exit %d\n", vcode);
    fflush(stdout);

    pid_t pid;
    char *sargs[] = {argv[0], "spawn-child", NULL};
    int scode = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, sargs, environ) == 0
                    ? wait_code(pid)
                    : -1;
    printf("spawn child exit %d\n", scode);
    fflush(stdout);
    if (vcode != 21 || scode != 22)
        return 1;

    print_counts();
    char *eargs[] = {argv[0], "exec-image", NULL};
    execv("/proc/self/exe", eargs);
    perror("execv");
    return 1;
}

int main(int argc, char **argv)
{
    return run_image(argc, argv);
}
