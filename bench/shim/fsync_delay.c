/*
 * fsync_delay.c: an LD_PRELOAD shim that makes a fast disk behave like a slow one for
 * the process that loads it. Built by pglease-bench (scenario 6) with the machine's C
 * compiler into target/pglease-bench/shim/ and preloaded into a stock postgres only.
 *
 * fsync(), fdatasync() and sync_file_range() with SYNC_FILE_RANGE_WAIT_AFTER sleep
 * FSYNC_DELAY_US microseconds, then call the real function (found with dlsym(RTLD_NEXT)),
 * so the data still reaches the disk and the caller waits as long as it would for a disk
 * whose flush takes that much longer.
 *
 * sync_file_range() without SYNC_FILE_RANGE_WAIT_AFTER is not delayed: postgres calls it
 * with SYNC_FILE_RANGE_WRITE alone, as a hint to start writeback early (checkpointer,
 * bgwriter, backend_flush_after). That only queues I/O; a real disk, however slow, does
 * not make that caller wait for it, so neither does the shim.
 *
 * FSYNC_DELAY_US is read once, when the library is loaded (the postmaster), and
 * inherited by every forked backend. Unset, empty, zero or invalid: no delay.
 * The shim counts nothing and writes nothing: postgres' own pg_stat_wal counts syncs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static long delay_us;

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_sync_file_range)(int, off64_t, off64_t, unsigned int);

/* Finds the real functions; also called lazily, should another library's constructor
 * sync a file before this one ran. */
static void resolve(void)
{
    if (real_fsync == NULL)
        real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (real_fdatasync == NULL)
        real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (real_sync_file_range == NULL)
        real_sync_file_range =
            (int (*)(int, off64_t, off64_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range");
}

__attribute__((constructor)) static void fsync_delay_init(void)
{
    const char *value = getenv("FSYNC_DELAY_US");
    if (value != NULL && *value != '\0') {
        char *end = NULL;
        long parsed = strtol(value, &end, 10);
        if (end != NULL && *end == '\0' && parsed > 0)
            delay_us = parsed;
    }
    resolve();
}

/* Sleeps the configured delay in full (a signal does not cut it short); keeps errno. */
static void delay(void)
{
    if (delay_us <= 0)
        return;
    int saved = errno;
    struct timespec left = {delay_us / 1000000, (delay_us % 1000000) * 1000};
    while (nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
    errno = saved;
}

int fsync(int fd)
{
    delay();
    resolve();
    if (real_fsync == NULL) {
        errno = ENOSYS;
        return -1;
    }
    return real_fsync(fd);
}

int fdatasync(int fd)
{
    delay();
    resolve();
    if (real_fdatasync == NULL) {
        errno = ENOSYS;
        return -1;
    }
    return real_fdatasync(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags)
{
    if (flags & SYNC_FILE_RANGE_WAIT_AFTER)
        delay();
    resolve();
    if (real_sync_file_range == NULL) {
        errno = ENOSYS;
        return -1;
    }
    return real_sync_file_range(fd, offset, nbytes, flags);
}
