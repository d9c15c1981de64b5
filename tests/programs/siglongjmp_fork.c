/*
 * A signal handler on the alternate signal stack leaves with siglongjmp, three times, and the
 * program forks after that: the child must return from fork() as a child (and exit with 3),
 * not into the code after the earlier raise(). With libc traced, raise's frame, left by the
 * jump, has the same return slot as fork's; the handler's frames on the signal stack still
 * hold the exit stub.
 */
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "counts.h"

COUNTER(handler);
COUNTER(after_fork);

static sigjmp_buf jump;

NOINLINE static void handler(int sig)
{
    HIT(handler);
    siglongjmp(jump, sig);
}

NOINLINE static int after_fork(pid_t child)
{
    HIT(after_fork);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

int main(void)
{
    static char altstack[1 << 16];
    stack_t ss = { .ss_sp = altstack, .ss_size = sizeof altstack };
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaltstack(&ss, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
        return 2;
    int jumps = 0;
    for (int i = 0; i < 3; i++) {
        if (sigsetjmp(jump, 1) == 0) {
            raise(SIGUSR1);
            puts("raise returned");
        } else {
            jumps++;
        }
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        _exit(3);
    int code = after_fork(child);
    printf("jumps %d, child exit %d\n", jumps, code);
    print_count("count", "handler", CALLS(handler));
    print_count("count", "after_fork", CALLS(after_fork));
    return code == 3 && jumps == 3 ? 0 : 1;
}
