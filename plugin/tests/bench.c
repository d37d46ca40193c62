/* getCollInfo cost per call with a 200-row table, and table load time for 1,000 and 100,000 rows; the
 * same calls with the request log on (recorded in order, then counted past the cap), and its write at
 * finalize. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../ncclrl_tuner_abi.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void write_table(const char* path, int rows) {
  FILE* f = fopen(path, "w");
  static const char* colls[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
  int per = rows / 5;
  for (int c = 0; c < 5; c++)
    for (int i = 0; i < per; i++)
      fprintf(f, "%s,%llu,%llu,%s,%s,%d,1,4\n", colls[c], (unsigned long long)i * 4096ull,
              (unsigned long long)i * 4096ull + 4095ull, i % 2 ? "ring" : "tree", i % 3 ? "simple" : "ll", 1 + i % 24);
  fclose(f);
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  const ncclrl_tuner_v5_t* v5 = dlsym(lib, "ncclTunerPlugin_v5");
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  const char* p200 = "/tmp/ncclrl-bench-200.csv";
  const char* p1000 = "/tmp/ncclrl-bench-1000.csv";
  const char* p100k = "/tmp/ncclrl-bench-100000.csv";
  write_table(p200, 200);
  write_table(p1000, 1000);
  write_table(p100k, 100000);

  double loads[21];
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", "any", 1); /* the bench's own files: read unchecked */
  setenv("NCCLRL_TUNER_TABLE", p1000, 1);
  for (int r = 0; r < 21; r++) {
    void* ctx = NULL;
    double t0 = now_ns();
    v5->init(&ctx, 1, 4, 1, NULL, &nvl, NULL);
    loads[r] = now_ns() - t0;
    v5->finalize(ctx);
  }
  qsort(loads, 21, sizeof(double), cmp);
  double big[7];
  int big_rows = 0;
  setenv("NCCLRL_TUNER_TABLE", p100k, 1);
  for (int r = 0; r < 7; r++) {
    void* ctx = NULL;
    double t0 = now_ns();
    v5->init(&ctx, 1, 4, 1, NULL, &nvl, NULL);
    big[r] = now_ns() - t0;
    float t[7][3] = {{1.0f}};
    int nch = 0;
    t[1][2] = 1.0f;
    v5->getCollInfo(ctx, 4, 99999ull * 4096ull / 5ull, 1, (float**)t, 7, 3, 0, &nch);
    big_rows += nch > 0; /* the last rows loaded too */
    v5->finalize(ctx);
  }
  qsort(big, 7, sizeof(double), cmp);

  setenv("NCCLRL_TUNER_TABLE", p200, 1);
  void* ctx = NULL;
  v5->init(&ctx, 1, 4, 1, NULL, &nvl, NULL);
  enum { N = 2000000 };
  size_t* sizes = malloc(sizeof(size_t) * 4096);
  srand(1);
  for (int i = 0; i < 4096; i++) sizes[i] = (size_t)(rand() % (40 * 4096));
  float t[7][3];
  int nch = 0;
  double per_call[7];
  for (int r = 0; r < 7; r++) {
    double t0 = now_ns();
    for (int i = 0; i < N; i++) {
      t[1][2] = 1.0f; t[0][0] = 1.0f; t[1][0] = 1.0f; t[0][2] = 1.0f;
      nch = 0;
      v5->getCollInfo(ctx, i % 5, sizes[i & 4095], 1, (float**)t, 7, 3, 0, &nch);
    }
    per_call[r] = (now_ns() - t0) / N;
  }
  qsort(per_call, 7, sizeof(double), cmp);
  v5->finalize(ctx);
  printf("getCollInfo, 200-row table: %.1f ns/call (median of 7 x %d calls, random sizes, all collectives)\n",
         per_call[3], N);
  printf("table load, 1,000 rows: %.3f ms (median of 21 inits, parse + validate + index)\n", loads[10] / 1e6);
  printf("table load, 100,000 rows (4.5 MB): %.1f ms (median of 7 inits, slowest %.1f ms; read + parse + overlap "
         "check + index)%s\n", big[3] / 1e6, big[6] / 1e6, big_rows == 7 ? "" : " [rows missing!]");

  /* the request log: the default cap (100,000 in order), then counts per (collective, size) */
  enum { RECORDED = 100000 };
  setenv("NCCLRL_TUNER_REQUEST_LOG", "/tmp/ncclrl-bench-requests", 1);
  unsetenv("NCCLRL_TUNER_REQUEST_LOG_MAX");
  ctx = NULL;
  v5->init(&ctx, 1, 4, 1, NULL, &nvl, NULL);
  double t0 = now_ns();
  for (int i = 0; i < RECORDED; i++) {
    nch = 0;
    v5->getCollInfo(ctx, i % 5, sizes[i & 4095], 1, (float**)t, 7, 3, 0, &nch);
  }
  double in_order = (now_ns() - t0) / RECORDED;
  t0 = now_ns();
  for (int i = 0; i < N; i++) {
    nch = 0;
    v5->getCollInfo(ctx, i % 5, sizes[i & 4095], 1, (float**)t, 7, 3, 0, &nch);
  }
  double counted = (now_ns() - t0) / N;
  t0 = now_ns();
  v5->finalize(ctx);
  double written = now_ns() - t0;
  unsetenv("NCCLRL_TUNER_REQUEST_LOG");
  printf("getCollInfo with the request log: %.1f ns/call for the first %d (in order), %.1f ns/call past the cap "
         "(%d calls, up to 20,480 distinct collective and size keys); file written at finalize in %.1f ms\n",
         in_order, RECORDED, counted, N, written / 1e6);
  return nch < 0;
}
