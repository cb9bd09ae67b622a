/* many_stacks: ROUNDS rounds over 2^BITS distinct stacks: stack i descends BITS levels through
 * left() or right() by the bits of i, and its leaf mallocs and frees one block of 4242 bytes.
 * Recorded with --stacks (at least BITS + 3 frames), each stack is a location of its own.
 * With "signals", a timer interrupts it every 20 us with a handler that mallocs and
 * frees 77 bytes (from glibc's per-thread cache, warmed before the timer starts): events
 * nested in the recorder's, while its location table grows.
 * With "fork", a child forked after the rounds runs one more round (its location table, which
 * the parent grew, starts small again) before the parent's last round.
 * usage: many_stacks BITS ROUNDS [signals|fork] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;
static void left(unsigned i, int depth);
static void right(unsigned i, int depth);

__attribute__((noinline)) static void leaf(void) {
    sink = malloc(4242);
    free(sink);
}

/* The calls are not tail calls (the volatile store after them), so that each level keeps its
 * frame and return address. */
static volatile int after;
__attribute__((noinline)) static void step(unsigned i, int depth) {
    if (depth == 0) leaf();
    else if (i & 1) right(i >> 1, depth - 1);
    else left(i >> 1, depth - 1);
    after++;
}
__attribute__((noinline)) static void left(unsigned i, int depth) { step(i, depth); after++; }
__attribute__((noinline)) static void right(unsigned i, int depth) { step(i, depth); after++; }

static volatile long handled;
static void on_timer(int sig) {
    (void)sig;
    free(malloc(77));
    handled++;
}

int main(int argc, char **argv) {
    int signals = argc == 4 && strcmp(argv[3], "signals") == 0;
    int forks = argc == 4 && strcmp(argv[3], "fork") == 0;
    if (argc < 3 || argc > 4 || (argc == 4 && !signals && !forks)) {
        fprintf(stderr, "usage: many_stacks BITS ROUNDS [signals|fork]\n");
        return 2;
    }
    int bits = atoi(argv[1]), rounds = atoi(argv[2]);
    if (signals) {
        /* the handler's size warmed into glibc's per-thread cache first (as signal.c does): its
         * first malloc had gone to the arena, and interrupting the loop's own malloc of 4242
         * bytes there (no lock in a single-threaded program) corrupted glibc's heap ("malloc
         * assertion failure in sysmalloc", once in a full test run) */
        free(malloc(77));
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_timer;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval every = {{0, 20}, {0, 20}};
        setitimer(ITIMER_REAL, &every, NULL);
    }
    for (int r = 0; r < rounds; r++)
        for (unsigned i = 0; i < 1u << bits; i++) step(i, bits);
    if (forks) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            for (unsigned i = 0; i < 1u << bits; i++) step(i, bits);
            _exit(0);
        }
        int status;
        if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            return 1;
        for (unsigned i = 0; i < 1u << bits; i++) step(i, bits);
        rounds++;
    }
    if (signals) {
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        if (handled == 0) {
            fprintf(stderr, "many_stacks: no signal was handled\n");
            return 1;
        }
    }
    printf("%d\n", rounds << bits);
    return 0;
}
