/* Functions that print their own arguments and return values in fnscope's notation
   (`CALL name(args) = ret`), the oracle of tests/record_values.rs. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <errno.h>
#include <unistd.h>
#include <stdlib.h>

#define N __attribute__((noinline, noipa))

struct pt { int x; int y; };

static void quoted(const char *s, size_t bound) {
    if (!s) { printf("NULL"); return; }
    if ((uintptr_t)s < 4096) { printf("<bad %#lx>", (unsigned long)(uintptr_t)s); return; }
    size_t n = strlen(s);
    putchar('"');
    for (size_t i = 0; i < n && i < bound; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') printf("\\\""); else if (c == '\\') printf("\\\\");
        else if (c == '\n') printf("\\n"); else if (c == '\t') printf("\\t"); else if (c == '\r') printf("\\r");
        else if (c >= 0x20 && c <= 0x7e) putchar(c); else printf("\\x%02x", c);
    }
    putchar('"');
    if (n > bound) printf("...");
}

N int add3(int a, int b, int c) { int r = a + b + c; printf("CALL add3(%d, %d, %d) = %d\n", a, b, c, r); return r; }
N long widths(int8_t a, uint8_t b, int16_t c, uint16_t d, int32_t e, uint64_t f) {
    long r = a + b + c + d + e + (long)f;
    printf("CALL widths(%d, %u, %d, %u, %d, %lu) = %ld\n", a, b, c, d, e, (unsigned long)f, r);
    return r;
}
N size_t slen(const char *s) {
    size_t n = (s && (uintptr_t)s >= 4096) ? strlen(s) : 0;
    printf("CALL slen("); quoted(s, 64); printf(") = %zu\n", n);
    return n;
}
N double scale(double v, float f) { double r = v * f; printf("CALL scale(%g, %g) = %g\n", v, f, r); return r; }
N long many(long a, long b, long c, long d, long e, long f, long g, long h) {
    long r = a + b + c + d + e + f + g + h;
    printf("CALL many(%ld, %ld, %ld, %ld, %ld, %ld, %ld, %ld) = %ld\n", a, b, c, d, e, f, g, h, r);
    return r;
}
N struct pt mkpt(int x, int y) { struct pt p = { x, y }; printf("CALL mkpt(%d, %d) = {x=%d, y=%d}\n", x, y, x, y); return p; }
N int limit(int n) { printf("CALL limit(%d) = %d\n", n, n * 2); return n * 2; }

int main(void) {
    char at_bound[65], over[70];
    memset(at_bound, 'b', 64); at_bound[64] = 0;
    memset(over, 'o', 69); over[69] = 0;
    long s = add3(1, -2, 300);
    s += widths(-5, 250, -1000, 65000, -70000, 1ull << 40);
    s += (long)slen("abc");
    s += (long)slen("tab\there\x01\"q\\");
    s += (long)slen(at_bound);
    s += (long)slen(over);
    s += (long)slen(NULL);
    s += (long)slen((const char *)16);
    s += (long)scale(1.5, 2.0f);
    s += (long)scale(-0.25, 8.0f);
    s += many(1, 2, 3, 4, 5, 6, 7, -8);
    struct pt p = mkpt(3, -4);
    s += p.x + p.y;
    for (int i = 0; i < 3; i++) {
        int fd = open("/etc/hostname", O_RDONLY);
        if (fd < 0) printf("OPEN %d failed: %s\n", i, strerror(errno));
        else { printf("OPEN %d ok\n", i); close(fd); }
    }
    int l = limit(5);
    printf("limit returned %d\n", l);
    printf("sum %ld\n", s);
    return 0;
}
