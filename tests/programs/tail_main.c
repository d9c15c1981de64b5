/*
 * Tail calls between the program and a library traced with `--lib` (tail_lib.c). The
 * program's functions are entered through the copy of the stubs the agent places beside the
 * program's slots, the library's through another copy or the agent's own stubs, so a
 * function entered by a tail call from the other module finds the other stub's exit in its
 * return slot:
 *   - to_lib jumps to lib_leaf (jmp lib_leaf@plt);
 *   - from_lib jumps to lib_jump, which jumps back to prog_leaf through a pointer.
 * outer calls both (not tail calls), so each tail call has a live caller above it.
 */
#include "counts.h"

long lib_leaf(long x);
long lib_jump(long (*f)(long), long x);
void lib_report(void);

COUNTER(outer);
COUNTER(to_lib);
COUNTER(from_lib);
COUNTER(prog_leaf);

NOINLINE long prog_leaf(long x)
{
    HIT(prog_leaf);
    return x + 11;
}

NOINLINE long to_lib(long x)
{
    HIT(to_lib);
    return lib_leaf(x + 2);
}

NOINLINE long from_lib(long x)
{
    HIT(from_lib);
    return lib_jump(prog_leaf, x);
}

NOINLINE long outer(long x)
{
    HIT(outer);
    long a = to_lib(x);
    long b = from_lib(a);
    return a ^ b;
}

int main(void)
{
    long s = 0;
    for (long i = 0; i < 1000; i++)
        s += outer(i);
    printf("%ld\n", s);
    PRINT_COUNT(outer);
    PRINT_COUNT(to_lib);
    PRINT_COUNT(from_lib);
    PRINT_COUNT(prog_leaf);
    lib_report();
    return 0;
}
