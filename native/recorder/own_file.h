/* The recorder's own files, kept apart from the program's.
 *
 * A program may close every descriptor it did not open (daemons, closefrom(3), a shell's
 * `exec 3>&-`) and then open files of its own, which take the lowest free numbers: those of the
 * recorder's files. Writing through a number it no longer owns, the recorder grew a program's
 * own file by its chunks (fallocate, zeros, mapped and filled with records) and lost those events
 * without a word. So the recorder's descriptors sit at high numbers (HC_HIGH_FD on, where a
 * program's next open does not land), and before each use that is not on the per-event path (a
 * new chunk, a .mods line, a predictions buffer) the descriptor is checked to be still the same
 * file (device and inode); if it is not, the number is the program's and is never touched again,
 * and the file is opened anew by its path. Static functions: recorder.c and policy_hook.c include
 * this each for its own files. */
#ifndef HEAPCAST_OWN_FILE_H
#define HEAPCAST_OWN_FILE_H

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HC_HIGH_FD 900          /* below the usual 1024 limit of open files */
#define HC_PATH_MAX 4200

struct hc_file {
    volatile int fd;            /* -1: none (never opened, or lost for good) */
    int reopen;                 /* open(2) flags to open it again (never O_CREAT or O_TRUNC) */
    int at_end;                 /* opened again: written from its end (lseek), as before */
    dev_t dev;
    ino_t ino;
    char path[HC_PATH_MAX];
};

/* fd, or a duplicate of it at HC_HIGH_FD or above (fd then closed). */
static inline int hc_high_fd(int fd) {
    if (fd < 0 || fd >= HC_HIGH_FD) return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, HC_HIGH_FD);
    if (high < 0) return fd;    /* (a limit of open files below HC_HIGH_FD) */
    close(fd);
    return high;
}

/* Makes fd (just created on path) f's own, moved to a high number, readable and writable by
 * its owner only whatever the program's umask (one of 0777 made it unreadable to `heapcast
 * record`); the descriptor, or -1 (then closed) when it cannot be identified. */
static inline int hc_file_keep(struct hc_file *f, int fd, const char *path, int reopen,
                               int at_end) {
    struct stat st;
    size_t n = strlen(path);
    if (fd >= 0)
        fchmod(fd, 0600);
    if (fd < 0 || n >= sizeof f->path || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        __atomic_store_n(&f->fd, -1, __ATOMIC_RELEASE);
        return -1;
    }
    memcpy(f->path, path, n + 1);
    f->reopen = reopen;
    f->at_end = at_end;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    fd = hc_high_fd(fd);
    __atomic_store_n(&f->fd, fd, __ATOMIC_RELEASE);
    return fd;
}

static inline int hc_file_is(const struct hc_file *f, int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == f->dev && st.st_ino == f->ino;
}

/* f's descriptor, checked: opened again by its path when its number is no longer f's file;
 * -1 if that cannot be done (the file is gone), for good. errno may change. No lock: two threads
 * that both open it again keep one descriptor, the other is closed. */
static inline int hc_file_fd(struct hc_file *f) {
    int fd = __atomic_load_n(&f->fd, __ATOMIC_ACQUIRE);
    if (fd < 0 || hc_file_is(f, fd)) return fd;
    int again = open(f->path, f->reopen | O_CLOEXEC);
    if (again >= 0 && !hc_file_is(f, again)) {   /* another file by that name now */
        close(again);
        again = -1;
    }
    if (again >= 0 && f->at_end) lseek(again, 0, SEEK_END);
    again = hc_high_fd(again);
    if (__atomic_compare_exchange_n(&f->fd, &fd, again, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return again;
    if (again >= 0) close(again);
    return __atomic_load_n(&f->fd, __ATOMIC_ACQUIRE);
}

/* Lets go of f (a fork child's inherited files): its descriptor is closed only if it is still
 * f's file; a number the program has taken stays the program's. */
static inline void hc_file_forget(struct hc_file *f) {
    int fd = __atomic_exchange_n(&f->fd, -1, __ATOMIC_ACQ_REL);
    if (hc_file_is(f, fd)) close(fd);
}

#endif
