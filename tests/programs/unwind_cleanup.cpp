/*
 * Destructors that run while an exception unwinds: each of the four nested `thrower` frames
 * owns a Guard, whose destructor calls `cleanup` from that frame's landing pad. In the call
 * tree each `cleanup` belongs under the `thrower` frame whose clean-up ran it (four different
 * depths), not under the deepest frame, which is gone by then.
 */
#include "counts.h"

COUNTER(main);
COUNTER(catcher);
COUNTER(thrower);
COUNTER(cleanup);

static volatile int sink;

extern "C" NOINLINE void cleanup(int level)
{
    HIT(cleanup);
    sink += level;
}

struct Guard {
    int level;
    ~Guard() { cleanup(level); }
};

extern "C" NOINLINE void thrower(int level)
{
    HIT(thrower);
    Guard g{level};
    if (level == 0)
        throw level;
    thrower(level - 1);
    sink++;
}

extern "C" NOINLINE int catcher(void)
{
    HIT(catcher);
    try {
        thrower(3);
    } catch (int) {
        return 1;
    }
    return 0;
}

int main()
{
    HIT(main);
    int caught = 0;
    for (int i = 0; i < 10; i++)
        caught += catcher();
    printf("caught %d\n", caught);
    PRINT_COUNT(main);
    PRINT_COUNT(catcher);
    PRINT_COUNT(thrower);
    PRINT_COUNT(cleanup);
    return 0;
}
