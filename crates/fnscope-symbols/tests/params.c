/* Functions whose DWARF signatures tests/params.rs checks: compiled with gcc -O0 and -O2 at
   test time. noinline keeps each a function of its own with DW_AT_low_pc at -O2; the calls in
   main keep them from being dropped. */
#include <stdarg.h>
#include <stdint.h>

#define F __attribute__((noinline))

enum sign { MINUS = -1, ZERO, PLUS };
enum small { A, B, C };
struct pair { int a; int b; };
struct vec2 { double x, y; };
struct mixed { long a; double b; };
struct big { long v[5]; };
struct three { float f[3]; char tag; };
union word { int i; float f; };
typedef const char *name_t;

F int8_t ints8(int8_t a, uint8_t b) { return a + b; }
F uint16_t ints16(int16_t a, uint16_t b) { return a + b; }
F int32_t ints32(int32_t a, uint32_t b) { return a + b; }
F uint64_t ints64(int64_t a, uint64_t b) { return a + b; }
F _Bool flags(_Bool on, char c, unsigned char u) { return on && c == u; }
F enum sign signs(enum sign s, enum small m) { return (enum sign)(s * (int)m); }
F int *pointers(int *p, char *s, const char *cs, name_t n, void (*fn)(void)) { return p + (s == cs) + (n == 0) + (fn == 0); }
F const char *names(const char *s) { return s + 1; }
F float floats(float f, double d) { return f + (float)d; }
F long double longd(int i, long double x, double d) { return x + i + d; }
F long eight(long a, long b, long c, long d, long e, long f, long g, long h) { return a + b + c + d + e + f + g + h; }
F double mixes(int i, double d, char *p, float f, long l) { return i + d + (p != 0) + f + l; }
F int by_pair(struct pair p, int x) { return p.a + p.b + x; }
F double by_vec(struct vec2 v, struct mixed m) { return v.x + v.y + m.a + m.b; }
F long by_big(int i, struct big b, long j, double d) { return i + b.v[0] + b.v[4] + j + d; }
F long after_big(struct big b, long a, long c, long d, long e, long f, long g, long h) { return b.v[2] + a + c + d + e + f + g + h; }
/* Called with the same k everywhere: gcc -O2 compiles a copy that takes only `a`
   (scaled.constprop.0), whose DWARF still lists all three parameters. */
static F int scaled(int a, int k, double unused) { (void)unused; return a * k; }
F __int128 wide(__int128 a, long b, __int128 c) { return a + b + c; }
F long wide_late(long a, long b, long c, long d, long e, __int128 w, long f) { return a + b + c + d + e + (long)w + f; }
F void nothing(int x) { (void)x; }
F struct pair ret_pair(int a, int b) { struct pair p = { a, b }; return p; }
F struct vec2 ret_vec(double x) { struct vec2 v = { x, -x }; return v; }
F struct mixed ret_mixed(long a, double b) { struct mixed m = { a, b }; return m; }
F struct big ret_big(long a, int b) { struct big r = { { a, b, a, b, a } }; return r; }
F float by_three(struct three t, union word w) { return t.f[0] + t.f[2] + t.tag + w.i; }
F int late_pair(long a, long b, long c, long d, long e, struct pair p, long f) { return a + b + c + d + e + p.a + p.b + f; }
F int sum(int n, ...) {
    va_list ap;
    int s = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        s += va_arg(ap, int);
    va_end(ap);
    return s;
}
F void empty(void) {}

int main(void) {
    struct pair p = { 1, 2 };
    struct vec2 v = { 1, 2 };
    struct mixed m = { 1, 2 };
    struct big b = { { 1, 2, 3, 4, 5 } };
    struct three t = { { 1, 2, 3 }, 'x' };
    union word w = { 1 };
    long r = ints8(1, 2) + ints16(1, 2) + ints32(1, 2) + (long)ints64(1, 2) + flags(1, 'a', 'a');
    r += signs(MINUS, C) + *pointers(&p.a, "a", "b", "n", empty) + *names("xy") + (long)floats(1, 2);
    r += (long)longd(1, 2, 3) + eight(1, 2, 3, 4, 5, 6, 7, 8) + (long)mixes(1, 2, "p", 3, 4);
    r += by_pair(p, 3) + (long)by_vec(v, m) + by_big(1, b, 2, 3) + (long)wide(1, 2, 3);
    r += wide_late(1, 2, 3, 4, 5, 6, 7) + ret_pair(1, 2).a + (long)ret_vec(1).x + ret_mixed(1, 2).a;
    r += ret_big(1, 2).v[1] + (long)by_three(t, w) + late_pair(1, 2, 3, 4, 5, p, 6) + sum(2, 1, 2);
    r += after_big(b, 1, 2, 3, 4, 5, 6, 7) + scaled((int)r, 3, 1.0) + scaled((int)r + 1, 3, 1.0);
    nothing(1);
    empty();
    return r == 0;
}
