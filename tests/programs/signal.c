/* A timer signal interrupts a loop of malloc(32)/free pairs; its handler does malloc(48)/free.
 * Both sizes stay in glibc's per-thread cache after the first round, so the handler never waits
 * for a lock that the interrupted code holds. Prints the exact number of each pair. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define LOOPS 1000000
static volatile sig_atomic_t handled;

static void on_alarm(int sig) {
    void *q = malloc(48);
    free(q);
    handled++;
}

int main(void) {
    free(malloc(32));                      /* warm the cache bins before the timer starts */
    free(malloc(48));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 50}, {0, 50}};  /* every 50 us */
    setitimer(ITIMER_REAL, &it, NULL);
    for (long i = 0; i < LOOPS; i++) {
        void *p = malloc(32);
        *(volatile char *)p = 0;
        free(p);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("loop %d handler %d\n", LOOPS + 1, (int)handled + 1);
    return 0;
}
