/* Ten allocations of 2001..2010 bytes, a line on stdout, then abort(). */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    void *p[10];
    for (int i = 0; i < 10; i++) p[i] = malloc(2001 + i);
    free(p[0]);
    printf("allocated %lx\n", (unsigned long)p[9]);
    fflush(stdout);
    abort();
}
