/*
 * A game-like frame loop for the record-time filters and the flight recorder: each frame
 * updates (libm), draws (libc) and may be made slow on purpose.
 *
 *   frames FRAMES PERIOD_MS [SLOW_FRAME:SLOW_MS]... [crash:FRAME] [work:N]
 *
 * PERIOD_MS paces the loop (0: as fast as it goes); `work:N` adds N more calls of `physics`
 * to each frame (a heavier frame, for benchmarks). Each SLOW_FRAME spins for SLOW_MS in
 * `stall` (the only slow calls apart from their callers). `crash:FRAME` writes through a null
 * pointer inside `draw` of that frame, with main, frame and draw open.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "counts.h"

COUNTER(physics);
COUNTER(draw);
COUNTER(stall);
COUNTER(frame);

static volatile double world;
static volatile unsigned long pixels;
static int crash_frame = -1;
static int extra_work;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

NOINLINE void physics(int i)
{
    HIT(physics);
    world += sin(i * 0.01) * sqrt((double)i + 1.0) + cos(world);
}

NOINLINE void draw(int i)
{
    HIT(draw);
    char line[96];
    snprintf(line, sizeof line, "frame %d world %.3f", i, world);
    char screen[256];
    memset(screen, (int)strlen(line), sizeof screen);
    pixels += (unsigned long)screen[i % 256];
    if (i == crash_frame) {
        fflush(stderr);
        *(volatile int *)(pixels * 0) = 1;
    }
}

NOINLINE void stall(double ms)
{
    HIT(stall);
    double end = now_ms() + ms;
    while (now_ms() < end)
        ;
}

NOINLINE void frame(int i, double slow_ms)
{
    HIT(frame);
    physics(i);
    physics(i + 1);
    for (int k = 0; k < extra_work; k++)
        physics(i + k);
    draw(i);
    if (slow_ms > 0)
        stall(slow_ms);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: frames FRAMES PERIOD_MS [SLOW_FRAME:SLOW_MS]... [crash:FRAME] [work:N]\n");
        return 2;
    }
    int frames = atoi(argv[1]);
    double period = atof(argv[2]);
    double *slow = calloc((size_t)frames + 1, sizeof *slow);
    for (int a = 3; a < argc; a++) {
        if (strncmp(argv[a], "crash:", 6) == 0)
            crash_frame = atoi(argv[a] + 6);
        else if (strncmp(argv[a], "work:", 5) == 0)
            extra_work = atoi(argv[a] + 5);
        else {
            int f = atoi(argv[a]);
            const char *c = strchr(argv[a], ':');
            if (c && f >= 0 && f < frames)
                slow[f] = atof(c + 1);
        }
    }
    double next = now_ms();
    for (int i = 0; i < frames; i++) {
        frame(i, slow[i]);
        if (period > 0) {
            next += period;
            double wait = next - now_ms();
            if (wait > 0) {
                struct timespec ts = {(time_t)(wait / 1e3), (long)(fmod(wait, 1e3) * 1e6)};
                nanosleep(&ts, NULL);
            }
        }
    }
    printf("%d frames, world %.6f, pixels %lu\n", frames, world, pixels);
    PRINT_COUNT(frame);
    PRINT_COUNT(physics);
    PRINT_COUNT(draw);
    PRINT_COUNT(stall);
    free(slow);
    return 0;
}
