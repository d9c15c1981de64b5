// glibc's backtrace() (libgcc's _Unwind_Backtrace underneath, as for Rust's std::backtrace)
// walks the stack by return address. In timing mode a hooked frame's return address is the
// tool's exit stub while the function runs: unless the tool gives the real ones back before
// the walk, the backtrace stops at the first hooked frame. The program prints what it saw
// (how many frames, and the names of the first ones), which must be the same traced; calls
// made after each walk must still be counted exactly. It also walks with _Unwind_Backtrace
// itself, which a program linked with -static-libgcc runs from its own copy of the unwinder.
#include <execinfo.h>
#include <unwind.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "counts.h"

COUNTER(walk);
COUNTER(level2);
COUNTER(level1);
COUNTER(after);

static std::string seen;

// The function name in one line of backtrace_symbols ("./prog(_Z5walkv+0x1f) [0x...]").
static std::string name_of(const char *line)
{
    const char *open = strchr(line, '(');
    const char *end = open ? strpbrk(open, "+)") : nullptr;
    return open && end ? std::string(open + 1, end) : std::string("?");
}

static _Unwind_Reason_Code count_frame(struct _Unwind_Context *, void *arg)
{
    ++*static_cast<int *>(arg);
    return _URC_NO_REASON;
}

NOINLINE int walk()
{
    HIT(walk);
    // The unwinder first: after one walk the tool has given the frames open then their
    // return addresses back, and the second walk would see them whatever it runs.
    int unwound = 0;
    _Unwind_Backtrace(count_frame, &unwound);
    void *frames[64];
    int n = backtrace(frames, 64);
    char **names = backtrace_symbols(frames, n);
    seen = std::to_string(n) + " (unwinder " + std::to_string(unwound) + "):";
    for (int i = 0; i < n && i < 4 && names; i++)
        seen += " " + name_of(names[i]);
    free(names);
    return n;
}

NOINLINE int level2(int k)
{
    HIT(level2);
    return walk() + k;
}

NOINLINE int level1(int k)
{
    HIT(level1);
    return level2(k) * 2;
}

NOINLINE int after(int k)
{
    HIT(after);
    return k ^ 5;
}

int main()
{
    long sum = 0;
    for (int i = 0; i < 3; i++) {
        sum += level1(i);
        printf("walk %d saw %s\n", i, seen.c_str());
        for (int j = 0; j < 100; j++)
            sum += after(j);
    }
    printf("sum %ld\n", sum);
    print_count("count", "walk()", CALLS(walk));
    print_count("count", "level2(int)", CALLS(level2));
    print_count("count", "level1(int)", CALLS(level1));
    print_count("count", "after(int)", CALLS(after));
    return 0;
}
