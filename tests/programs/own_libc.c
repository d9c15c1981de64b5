/*
 * A program that defines C library functions itself, as bash (getenv) and programs with
 * their own allocator do. Built with -rdynamic, its definitions are exported, so the dynamic
 * linker binds every call of the process to them - the C library's own and fnscope's agent's
 * included. The agent must set itself up without running them (they are hooked by then):
 * before the fix, the main thread recorded nothing (getenv), or the agent crashed in its own
 * start-up on the 8-byte-aligned blocks of this malloc.
 *
 * With -DOWN_MALLOC the program also brings its own malloc family, returning blocks that are
 * 8 but never 16 bytes aligned (legal for many old allocators, fatal to code that assumes
 * glibc's 16).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "counts.h"

extern char **environ;

COUNTER(main);
COUNTER(work);
COUNTER(thread_main);

NOINLINE char *getenv(const char *name)
{
    size_t n = strlen(name);
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

#ifdef OWN_MALLOC
static char arena[256 << 20] __attribute__((aligned(16)));
static size_t used;

/* Each block: an 8-byte size header, then the caller's bytes at an address = 8 mod 16. */
NOINLINE void *malloc(size_t n)
{
    size_t need = (n + 8 + 15) & ~(size_t)15;
    size_t at = __atomic_fetch_add(&used, need, __ATOMIC_RELAXED);
    if (at + need > sizeof arena)
        return NULL;
    *(size_t *)(arena + at) = n;
    return arena + at + 8;
}

NOINLINE void free(void *p)
{
    (void)p;
}

NOINLINE void *calloc(size_t a, size_t b)
{
    return malloc(a * b); /* the arena is never reused: still zero */
}

NOINLINE void *realloc(void *p, size_t n)
{
    void *q = malloc(n);
    if (p && q) {
        size_t old = *(size_t *)((char *)p - 8);
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}
#endif

NOINLINE unsigned long work(unsigned long x)
{
    HIT(work);
    return x * 7 + 1;
}

static void *thread_main(void *arg)
{
    HIT(thread_main);
    unsigned long acc = (unsigned long)arg;
    for (int i = 0; i < 5000; i++)
        acc = work(acc);
    return (void *)acc;
}

int main(void)
{
    HIT(main);
    unsigned long acc = 0;
    for (int i = 0; i < 20000; i++) {
        acc = work(acc);
        if (i % 1000 == 0 && getenv("FNSCOPE_TEST_NOT_SET"))
            return 3;
    }
    pthread_t t;
    pthread_create(&t, NULL, thread_main, (void *)acc);
    void *r;
    pthread_join(t, &r);
    char *s = malloc(100);
    strcpy(s, "result");
    printf("%s %lu\n", s, (unsigned long)r);
    PRINT_COUNT(main);
    PRINT_COUNT(work);
    PRINT_COUNT(thread_main);
    return 0;
}
