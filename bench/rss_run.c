/* rss_run OUT CMD ARGS...: runs CMD and writes to OUT its peak RSS in kB (the kernel's maxrss of
 * it and the children it waited for) and its exit status. A launcher of its own, small, because
 * the maxrss of a child forked from a large process (the benchmark's Python) would include the
 * pages it shared with that process before exec. */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: rss_run OUT CMD ARGS...\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &status, 0, &ru) < 0)
        return 2;
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 2;
    fprintf(f, "%ld %d\n", ru.ru_maxrss, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    fclose(f);
    return 0;
}
