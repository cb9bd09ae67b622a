/* vfork children that allocate before they exit, as shells do: a vfork child shares its
 * parent's memory (and the recorder's state in it) but has a pid of its own, so the recorder
 * must not take the parent's thread for one that has ended (it would unmap the parent's chunk).
 * Each child makes enough events to need new chunks, after a pause long enough for the recorder
 * to look for ended threads. Prints "ok" at the end. Usage: vfork_alloc [ROUNDS] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void churn(int n, size_t size) {
    for (int i = 0; i < n; i++) {
        char *p = malloc(size);
        if (!p) abort();
        p[0] = (char)i;
        free(p);
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    for (int r = 0; r < rounds; r++) {
        usleep(150000);
        pid_t pid = vfork();
        if (pid == 0) {
            churn(40000, 32);
            _exit(0);
        }
        if (pid < 0) return 2;
        int status;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
        churn(40000, 48);
    }
    printf("ok\n");
    return 0;
}
