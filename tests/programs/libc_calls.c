/*
 * Calls libc's memset argv[1] times and memcpy argv[2] times, through pointers (so that GCC
 * neither inlines them nor goes through the IFUNC resolver again), and prints with write(2)
 * only: with libc traced, the report must show exactly these calls of the two, whatever the
 * agent itself calls.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char a[512], b[512];

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    long n = atol(argv[1]), m = atol(argv[2]);
    void *(*volatile set)(void *, int, size_t) = memset;
    void *(*volatile copy)(void *, const void *, size_t) = memcpy;
    for (long i = 0; i < n; i++)
        set(a, (int)i, 64 + i % 200);
    for (long i = 0; i < m; i++)
        copy(b, a, 32 + i % 300);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum = sum * 31 + (unsigned char)b[i];
    char line[32];
    int k = sizeof line;
    line[--k] = '\n';
    do {
        line[--k] = (char)('0' + sum % 10);
        sum /= 10;
    } while (sum);
    return write(1, line + k, sizeof line - k) == (ssize_t)(sizeof line - k) ? 0 : 1;
}
