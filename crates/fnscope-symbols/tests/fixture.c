/* Test program for fnscope-symbols: compiled with gcc -O2 at test time. */
#include <stdio.h>

__attribute__((cold, noinline)) void report(int x) { fprintf(stderr, "rare %d\n", x); }

/* The unlikely branch calls a cold function, so GCC moves it to `hot.cold`, a piece of hot()
   that is jumped to with hot()'s frame set up: not a function entry. */
__attribute__((noinline)) int hot(const int *v, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (__builtin_expect(v[i] < 0, 0)) {
            report(v[i]);
            s -= v[i] * 7;
            continue;
        }
        s += v[i];
    }
    return s;
}

/* Local, so only .symtab names it. */
static __attribute__((noinline)) int helper(int x) { return x * x + 1; }

int main(int argc, char **argv) {
    int v[3] = {argc, 2, 3};
    (void)argv;
    return hot(v, 3) + helper(argc) == 0;
}
