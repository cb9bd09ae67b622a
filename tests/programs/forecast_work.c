/* forecast_work N SEED: a heap workload whose sizes depend on its input, for the forecasting
 * tests (tests/test_forecast_cli.py): two runs with different N and SEED are two recordings of
 * the same program. */
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
  int n = atoi(argv[1]); unsigned seed = (unsigned)atoi(argv[2]);
  void *keep[64] = {0};
  for (int i = 0; i < n; i++) {
    char *a = malloc(24); char *b = malloc(100 + (i % 4) * 8);
    memset(a, 1, 24);
    free(a);
    char *c = calloc(4, 16);
    seed = seed * 1103515245u + 12345u;
    int k = (seed >> 16) % 64;
    free(keep[k]); keep[k] = malloc(40 + (i % 3) * 200);
    b = realloc(b, 300);
    free(c); free(b);
  }
  for (int k = 0; k < 64; k++) free(keep[k]);
  return 0;
}
