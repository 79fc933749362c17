/*
 * Palisade's clock-shift preload: shifts CLOCK_REALTIME, gettimeofday() and
 * time() of one process by an offset read from a file, and nothing else.
 *
 * Why not libfaketime: 0.9.10 aborts at start-up under Debian's jemalloc-linked
 * redis-server 7.0.15 (libfaketime issues #130, #478) because it resolves the real
 * functions with dlsym() and allocates while the allocator is not ready. This file
 * does neither: every clock read is a raw syscall, no memory is allocated, and the
 * offset file is read with raw open/read/close.
 *
 * The offset file named by PALISADE_CLOCK_SHIFT_FILE holds a signed decimal number
 * of milliseconds. It is re-read at most every 5 ms (on the monotonic clock), so a
 * harness can jump the clock of a running server by rewriting the file.
 * Monotonic clocks are never touched: the shift is exactly a wall-clock jump.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long cached_offset_ns;
static long long next_read_ns;

static long long monotonic_ns(void) {
    struct timespec ts;
    if (syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) != 0) return 0;
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long read_offset_ns(void) {
    const char *path = getenv("PALISADE_CLOCK_SHIFT_FILE");
    if (path == NULL) return 0;
    long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[32];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    long long ms = 0;
    int negative = 0, i = 0;
    if (buf[0] == '-') { negative = 1; i = 1; }
    for (; i < n && buf[i] >= '0' && buf[i] <= '9'; i++) ms = ms * 10 + (buf[i] - '0');
    return (negative ? -ms : ms) * 1000000LL;
}

static long long offset_ns(void) {
    long long now = monotonic_ns();
    if (now >= __atomic_load_n(&next_read_ns, __ATOMIC_RELAXED)) {
        __atomic_store_n(&cached_offset_ns, read_offset_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&next_read_ns, now + 5000000LL, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&cached_offset_ns, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000LL; ts->tv_sec -= 1; }
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts);
    return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz; /* glibc declares tv non-null; the obsolete tz is left untouched */
    struct timespec ts;
    long r = syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (r != 0) return (int)r;
    shift(&ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    shift(&ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
