/* A program that forks, each side allocating from a call site of its own. The test links it
 * with many libraries at long paths, so that the module map at its start overflows the
 * recorder's kept buffers (native/recorder/recorder.c, "module snapshots"); built with -DLIB,
 * such a library.
 * Prints "forked 0" when the child exited with 0. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef LIB
int lib_fn(int x) { return x + 1; }
#else
__attribute__((noinline)) void *parent_alloc(size_t n) { return malloc(n); }
__attribute__((noinline)) void *child_alloc(size_t n) { return malloc(n); }

int main(void) {
    free(parent_alloc(3333));
    pid_t pid = fork();
    if (pid == 0) {
        free(child_alloc(5555));
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 1;
    printf("forked %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
#endif
