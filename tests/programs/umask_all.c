/* A program that sets umask(0777) and then forks: the child's trace files, created after it,
 * must still be readable and writable by their owner (`heapcast record`).
 *   umask_all   prints "ok" once its child has ended */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    for (int i = 0; i < 1000; i++) free(malloc(32));
    umask(0777);
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < 100000; i++) free(malloc(16 + i % 64));
        exit(0);   /* (its exit handlers run: the allocator's summary too) */
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok\n" : "child failed\n");
    return 0;
}
