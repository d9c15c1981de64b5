// C++ exceptions thrown through several hooked frames and caught further up, with
// destructors running during the unwinding, rethrows from catch blocks, an exception thrown
// from inside libstdc++, and the same on two more threads at once. The unwinder walks the
// return addresses of every frame it crosses: if it meets one the tool replaced and cannot
// explain, it calls std::terminate and the program dies with SIGABRT.
#include <pthread.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "counts.h"

COUNTER(guard_ctor);
COUNTER(guard_dtor);
COUNTER(thrower);
COUNTER(level3);
COUNTER(level2);
COUNTER(level1);
COUNTER(checked_at);
COUNTER(run_rounds);

static long sink;

struct AppError : std::runtime_error {
    int code;
    explicit AppError(int c) : std::runtime_error("app error " + std::to_string(c)), code(c) {}
};

// The attributes must be on the declarations in the class: on the out-of-class definitions
// alone GCC 12 still inlines constructor and destructor into their callers.
struct Guard {
    int id;
    NOINLINE explicit Guard(int i);
    NOINLINE ~Guard();
};

Guard::Guard(int i) : id(i)
{
    HIT(guard_ctor);
}

Guard::~Guard()
{
    HIT(guard_dtor);
    __atomic_fetch_add(&sink, id, __ATOMIC_RELAXED);
}

// Throws two times out of three; the guard is destroyed either way.
NOINLINE int thrower(int i)
{
    HIT(thrower);
    Guard g(i);
    if (i % 3 != 2)
        throw AppError(i);
    return i;
}

NOINLINE int level3(int i)
{
    HIT(level3);
    Guard g(i + 1000);
    int r = thrower(i);
    return r * 3 + 1;
}

// Catches in the middle of the chain, and rethrows one time out of five.
NOINLINE int level2(int i)
{
    HIT(level2);
    Guard g(i + 2000);
    try {
        return level3(i) + 7;
    } catch (AppError &e) {
        if (i % 5 == 0)
            throw;
        return -e.code;
    }
}

NOINLINE int level1(int i)
{
    HIT(level1);
    Guard g(i + 3000);
    int r = level2(i);
    return r + 11;
}

// std::vector::at throws std::out_of_range from inside libstdc++, through this frame.
NOINLINE int checked_at(const std::vector<int> &v, int i)
{
    HIT(checked_at);
    Guard g(i + 4000);
    return v.at(static_cast<size_t>(i)) * 2;
}

// One round of everything above; returns a checksum of what was returned and caught.
NOINLINE long run_rounds(int n)
{
    HIT(run_rounds);
    long total = 0;
    int caught = 0, out_of_range = 0;
    for (int i = 0; i < n; i++) {
        try {
            total += level1(i);
        } catch (const AppError &e) {
            caught++;
            total += e.code * 100;
        }
    }
    std::vector<int> v{1, 2, 3, 4, 5, 6, 7, 8};
    for (int i = 0; i < 16; i++) {
        try {
            total += checked_at(v, i);
        } catch (const std::out_of_range &) {
            out_of_range++;
        }
    }
    return total * 1000 + caught * 10 + out_of_range;
}

static void *thread_rounds(void *arg)
{
    *static_cast<long *>(arg) = run_rounds(200);
    return nullptr;
}

int main()
{
    printf("main rounds %ld\n", run_rounds(300));

    pthread_t t[2];
    long res[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], nullptr, thread_rounds, &res[i]);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], nullptr);
        printf("thread %d rounds %ld\n", i, res[i]);
    }
    printf("guards alive %lu sink %ld\n", CALLS(guard_ctor) - CALLS(guard_dtor), sink);

    // Names as c++filt prints them; both the C1 and C2 constructor symbols of Guard (one
    // address) demangle to the same name.
    print_count("count", "Guard::Guard(int)", CALLS(guard_ctor));
    print_count("count", "Guard::~Guard()", CALLS(guard_dtor));
    print_count("count", "thrower(int)", CALLS(thrower));
    print_count("count", "level3(int)", CALLS(level3));
    print_count("count", "level2(int)", CALLS(level2));
    print_count("count", "level1(int)", CALLS(level1));
    print_count("count", "checked_at(std::vector<int, std::allocator<int> > const&, int)",
                CALLS(checked_at));
    print_count("count", "run_rounds(int)", CALLS(run_rounds));
    return 0;
}
