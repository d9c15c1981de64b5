/*
 * A shared library linked with -static-libgcc -static-libstdc++: it throws and catches
 * through its own copy of the unwinder, whose symbols are local to it (no dlsym finds them).
 * Traced with `--lib`, its hooked frames' return addresses must be put back for that
 * unwinder too, or the first throw ends in std::terminate. The main program
 * (own_unwinder_main.c) calls lib_run and then lib_counts.
 */
#include <stdexcept>

#include "counts.h"

COUNTER(thrower);
COUNTER(middle);
COUNTER(catcher);
COUNTER(guard_dtor);

struct Guard {
    NOINLINE ~Guard();
};

NOINLINE Guard::~Guard()
{
    HIT(guard_dtor);
}

NOINLINE int thrower(int i)
{
    HIT(thrower);
    if (i % 3 == 0)
        throw std::runtime_error("multiple of three");
    return i;
}

NOINLINE int middle(int i)
{
    HIT(middle);
    Guard g;
    return thrower(i) + 1;
}

NOINLINE int catcher(int i)
{
    HIT(catcher);
    try {
        return middle(i);
    } catch (const std::exception &) {
        return -1;
    }
}

extern "C" int lib_run(int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += catcher(i);
    return s;
}

extern "C" void lib_counts(void)
{
    print_count("count", "thrower(int)", CALLS(thrower));
    print_count("count", "middle(int)", CALLS(middle));
    print_count("count", "catcher(int)", CALLS(catcher));
    print_count("count", "Guard::~Guard()", CALLS(guard_dtor));
}
