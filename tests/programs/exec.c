/* Without arguments: allocates, forks a child that execs this program again with argument
 * "child", waits for it, frees and exits. With "child": allocates a 4002-byte block, frees it and
 * exits. The exec'd image is traced only with follow_children. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        void *q = malloc(4002);
        free(q);
        printf("child %d\n", (int)getpid());
        return 0;
    }
    void *p = malloc(4001);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "child", (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    free(p);
    printf("parent %d child exit %d\n", (int)getpid(), WEXITSTATUS(status));
    return 0;
}
