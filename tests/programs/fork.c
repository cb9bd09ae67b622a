/* Fork twice (parent -> child -> grandchild). Each descendant frees blocks that the parent
 * allocated before the first fork, which must replay as inherited blocks, not unknown frees.
 * Prints "<role> <pid>" lines; the descendants also print the addresses they freed. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    void *a = malloc(3001), *b = malloc(3002);
    printf("parent %d %lx %lx\n", (int)getpid(), (unsigned long)a, (unsigned long)b);
    fflush(stdout);  /* nothing buffered may be printed twice */
    pid_t child = fork();
    if (child == 0) {
        free(a);                                  /* a block of the parent's heap */
        void *c = malloc(3003);
        printf("child %d %d %lx\n", (int)getpid(), (int)getppid(), (unsigned long)c);
        fflush(stdout);
        pid_t grandchild = fork();
        if (grandchild == 0) {
            free(b);                              /* allocated two generations up */
            free(c);                              /* allocated by its parent */
            printf("grandchild %d %d\n", (int)getpid(), (int)getppid());
            exit(0);
        }
        waitpid(grandchild, NULL, 0);
        free(c);
        exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    free(b);
    free(a);
    printf("done %d\n", WEXITSTATUS(status));
    return 0;
}
