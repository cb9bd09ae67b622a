/* free_pools N SEED: two FIFO pools with their own call sites and sizes (tests/
 * test_forecast_free_groups.py). Each iteration pushes one block into pool A and a random
 * number (0-2) into pool B, then frees A's oldest block and as many of B's oldest. Within its
 * own pool a free always releases the oldest block; among all live blocks its rank depends on
 * the random interleaving of the two pools. */
#include <stdlib.h>
#include <string.h>
#define DEPTH 40
static char *pool_a[DEPTH], *pool_b[4 * DEPTH];
static int head_a, tail_a, head_b, tail_b;

static __attribute__((noinline)) void push_a(void) {
  char *p = malloc(24);
  memset(p, 1, 24);
  pool_a[tail_a++ % DEPTH] = p;
}
static __attribute__((noinline)) void push_b(void) {
  char *p = malloc(40);
  memset(p, 2, 40);
  pool_b[tail_b++ % (4 * DEPTH)] = p;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1000;
  unsigned seed = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
  for (int i = 0; i < DEPTH - 1; i++) { push_a(); push_b(); }
  for (int i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    int k = (int)((seed >> 16) % 3);
    push_a();
    for (int j = 0; j < k; j++) push_b();
    free(pool_a[head_a++ % DEPTH]);
    for (int j = 0; j < k; j++) free(pool_b[head_b++ % (4 * DEPTH)]);
  }
  while (head_a < tail_a) free(pool_a[head_a++ % DEPTH]);
  while (head_b < tail_b) free(pool_b[head_b++ % (4 * DEPTH)]);
  return 0;
}
