/*
 * fsync_delay_probe.c: checks what fsync_delay.so delays. pglease-bench runs it with the
 * shim preloaded and reports, per call, how much longer the call through the shim took
 * than the same call made directly to libc.
 *
 *   fsync_delay_probe DIR CALLS
 *
 * Writes 8 KiB to a fresh file in DIR. For each of fsync, fdatasync,
 * sync_file_range(SYNC_FILE_RANGE_WRITE) (postgres' writeback hint) and
 * sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER) it makes CALLS pairs of calls, one
 * straight to libc's function (dlsym on libc.so.6, which bypasses any preload) and one
 * through the ordinary symbol (the shim's, when preloaded), alternating and rewriting
 * the data before each so that both flush the same amount while the disk's own speed
 * drifts. Prints one line per kind: `<name> <median µs direct> <median µs via symbol>`.
 * Removes the file. Exit status 1 on any failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*fd_call)(int);
typedef int (*range_call)(int, off64_t, off64_t, unsigned int);

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count)
{
    qsort(values, (size_t)count, sizeof *values, compare);
    return count % 2 ? values[count / 2] : (values[count / 2 - 1] + values[count / 2]) / 2;
}

/* One call of `kind`, direct or through the symbol; returns its time in µs, or -1. */
static double timed(int kind, int direct, int fd, void *libc)
{
    static const unsigned int write_only = SYNC_FILE_RANGE_WRITE;
    static const unsigned int waiting =
        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
    fd_call fd_fn = NULL;
    range_call range_fn = NULL;
    if (kind == 0)
        fd_fn = direct ? (fd_call)dlsym(libc, "fsync") : fsync;
    else if (kind == 1)
        fd_fn = direct ? (fd_call)dlsym(libc, "fdatasync") : fdatasync;
    else
        range_fn = direct ? (range_call)dlsym(libc, "sync_file_range") : sync_file_range;
    if (fd_fn == NULL && range_fn == NULL)
        return -1;
    double start = now_us();
    int rc = fd_fn != NULL ? fd_fn(fd) : range_fn(fd, 0, 0, kind == 2 ? write_only : waiting);
    double elapsed = now_us() - start;
    return rc == 0 ? elapsed : -1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR CALLS\n", argv[0]);
        return 1;
    }
    int calls = atoi(argv[2]);
    if (calls <= 0) {
        fprintf(stderr, "CALLS must be a positive number\n");
        return 1;
    }
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == NULL) {
        fprintf(stderr, "cannot find libc.so.6: %s\n", dlerror());
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync-delay-probe-%ld", argv[1], (long)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    double *direct = calloc((size_t)calls, sizeof *direct);
    double *via = calloc((size_t)calls, sizeof *via);
    char block[8192];
    memset(block, 'x', sizeof block);
    static const char *names[] = {"fsync", "fdatasync", "sync_file_range_write",
                                  "sync_file_range_wait"};
    int failed = direct == NULL || via == NULL;
    for (int kind = 0; kind < 4 && !failed; kind++) {
        for (int i = 0; i < calls && !failed; i++) {
            for (int round = 0; round < 2 && !failed; round++) {
                if (pwrite(fd, block, sizeof block, 0) != (ssize_t)sizeof block) {
                    perror("pwrite");
                    failed = 1;
                    break;
                }
                double us = timed(kind, round == 0, fd, libc);
                if (us < 0) {
                    perror(names[kind]);
                    failed = 1;
                }
                (round == 0 ? direct : via)[i] = us;
            }
        }
        if (!failed)
            printf("%s %.1f %.1f\n", names[kind], median(direct, calls), median(via, calls));
    }
    free(direct);
    free(via);
    close(fd);
    unlink(path);
    return failed;
}
