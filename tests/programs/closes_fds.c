/* A program that closes every descriptor it did not open, as daemons do, then puts files of its
 * own at those numbers: the recorder must never write to them, and must go on recording.
 *
 *   closes_fds FILE low   closes descriptors 3..255, opens FILE (it takes number 3)
 *   closes_fds FILE all   closes every descriptor from 3 up, opens FILE, and duplicates it onto
 *                         every number from 3 to 1100 (those the recorder had included; 64 fewer
 *                         than the limit of open files where that is lower)
 * Then writes 100 lines to FILE, makes 1,000,000 malloc/free pairs, forks a child that makes as
 * many and writes one more line through the highest of those numbers, and checks that FILE holds
 * exactly its 101 lines. Prints "ok" (exit 0) or what is wrong (exit 1). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LINE "the program's own data\n"
#define TOP 1100

static void churn(long n) {
    for (long i = 0; i < n; i++) free(malloc(16 + i % 100));
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int all = strcmp(argv[2], "all") == 0;
    churn(1000);   /* the recorder's files are open */
    int top = all ? (int)sysconf(_SC_OPEN_MAX) : 256;
    for (int fd = 3; fd < top; fd++) close(fd);
    int mine = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (mine < 0) { perror(argv[1]); return 2; }
    int last = mine;
    /* (up to TOP, leaving 64 numbers free under a lower limit of open files: the recorder opens
     * its files again at one of them) */
    int upto = (int)sysconf(_SC_OPEN_MAX) - 64 < TOP ? (int)sysconf(_SC_OPEN_MAX) - 64 : TOP;
    if (all)
        for (int fd = 3; fd <= upto; fd++)
            if (fd != mine && dup2(mine, fd) == fd) last = fd;
    for (int i = 0; i < 100; i++)
        if (write(mine, LINE, sizeof LINE - 1) != sizeof LINE - 1) { perror("write"); return 2; }
    churn(1000000);
    pid_t child = fork();
    if (child == 0) {
        churn(1000000);
        /* the recorder let go of its parent's files in this child: not of this number */
        _exit(write(last, LINE, sizeof LINE - 1) == sizeof LINE - 1 ? 0 : 3);
    }
    int status = 0;
    waitpid(child, &status, 0);
    struct stat st;
    fstat(mine, &st);
    long want = 101 * (long)(sizeof LINE - 1);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("the child could not write through descriptor %d\n", last);
        return 1;
    }
    if (st.st_size != want) {
        printf("%s has %lld bytes, not %ld\n", argv[1], (long long)st.st_size, want);
        return 1;
    }
    printf("ok\n");
    return 0;
}
