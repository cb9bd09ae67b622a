/* The recorder's slow paths leave the program as they found it: errno (the hooks return the real
 * call's, and free() and the functions that succeed leave it alone, while a slow path's system
 * calls can fail: a missing MADV_POPULATE_WRITE, no address space, a full disk), and
 * cancellation: malloc and free are no cancellation points, but the writes and opens of a slow
 * path are, and a thread of the program cancelled there died inside malloc, holding the
 * program's locks. Each slow path brackets itself (about 17 ns here: never per event). Shared by
 * recorder.c and policy_hook.c. */
#ifndef HEAPCAST_QUIET_H
#define HEAPCAST_QUIET_H

#include <errno.h>
#include <pthread.h>

struct quiet { int err, cancel; };

static inline void quiet_begin(struct quiet *q) {
    q->err = errno;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &q->cancel);
}

static inline void quiet_end(const struct quiet *q) {
    pthread_setcancelstate(q->cancel, NULL);
    errno = q->err;
}

#endif
