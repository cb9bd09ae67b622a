/* Forks while the program's own libraries are still being initialized, beside a thread that
 * allocates: built twice, as a library (-DLIB) whose constructor runs before the recorder's own
 * (it is initialized first, being a dependency of the program, not preloaded) and as the program
 * that needs it. The constructor starts a thread that mallocs and frees in a loop, then forks
 * 200 children, one after the other; each child mallocs 1234 bytes, frees them and exits. A
 * child that has not exited after 5 s is counted as hung and killed. main prints "forks N" and
 * "hung N". */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef LIB
static volatile int stop;
int forks_done, forks_hung;
static void *churn(void *arg) {
    (void)arg;
    while (!stop) {
        void *p = malloc(32);
        free(p);
    }
    return NULL;
}
__attribute__((constructor)) static void early(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, churn, NULL)) return;
    for (int i = 0; i < 200; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *p = malloc(1234);
            free(p);
            _exit(0);
        }
        if (pid < 0) break;
        forks_done++;
        int status, done = 0;
        for (int w = 0; w < 5000 && !done; w++) {
            struct timespec ms = {0, 1000000};
            if (waitpid(pid, &status, WNOHANG) == pid) done = 1;
            else nanosleep(&ms, NULL);
        }
        if (!done) {
            forks_hung++;
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
        }
    }
    stop = 1;
    pthread_join(t, NULL);
}
#else
extern int forks_done, forks_hung;
int main(void) {
    printf("forks %d\nhung %d\n", forks_done, forks_hung);
    return 0;
}
#endif
