/*
 * One communicator init as NCCL does it (tuner ABI v5), driven from a script: prints the plugin's
 * log lines, then answers decision queries. Tests use it to hold real exported tables against
 * ncclrl's Python reader (rows, shapes, fingerprint).
 *
 *   probe LIB NRANKS NNODES [DATA_FILE]
 *
 * DATA_FILE: its bytes become NCCLRL_TUNER_TABLE_DATA inside this process before init (past the
 * kernel's limit on one variable handed to a new program). Otherwise the environment is used as is.
 * Output: one "log LEVEL MESSAGE" line per log call, then for each stdin line "COLL NBYTES" (collType
 * number, bytes) one line "COLL NBYTES ALGO PROTO CHANNELS": the algorithm and protocol the plugin
 * forced (-1 -1: NCCL's own) and the channel count it set (0: NCCL's own), every cost-table entry
 * enabled. Exit status 0 unless the plugin cannot be loaded or init fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ncclrl_tuner_abi.h"

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  printf("log %d %s\n", level, msg);
}

static char* read_all(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char* buf = malloc(cap + 1);
  while (buf) {
    if (n == cap) {
      char* bigger = realloc(buf, cap * 2 + 1);
      if (!bigger) { free(buf); buf = NULL; break; }
      buf = bigger;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (got == 0) break;
    n += got;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  return buf;
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: %s LIB NRANKS NNODES [DATA_FILE]\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  const ncclrl_tuner_v5_t* v5 = dlsym(lib, "ncclTunerPlugin_v5");
  if (!v5) { fprintf(stderr, "no ncclTunerPlugin_v5\n"); return 2; }
  if (argc == 5) {
    char* data = read_all(argv[4]);
    if (!data) { fprintf(stderr, "cannot read %s\n", argv[4]); return 2; }
    setenv("NCCLRL_TUNER_TABLE_DATA", data, 1);
    free(data);
  }
  ncclrl_nvl_domain_info_v5_t nvl = {1, 1, 1};
  ncclrl_tuner_constants_v5_t constants;
  memset(&constants, 0, sizeof(constants));
  void* ctx = NULL;
  size_t nranks = strtoull(argv[2], NULL, 10), nnodes = strtoull(argv[3], NULL, 10);
  if (v5->init(&ctx, 1, nranks, nnodes, logger, &nvl, &constants) != NCCLRL_SUCCESS || !ctx) {
    fprintf(stderr, "init failed\n");
    return 1;
  }
  int coll;
  unsigned long long nbytes;
  while (scanf("%d %llu", &coll, &nbytes) == 2) {
    float t[NCCLRL_NUM_ALGOS][NCCLRL_NUM_PROTOS];
    for (int a = 0; a < NCCLRL_NUM_ALGOS; a++)
      for (int p = 0; p < NCCLRL_NUM_PROTOS; p++) t[a][p] = 1.0f;
    int nch = 0;
    v5->getCollInfo(ctx, coll, (size_t)nbytes, 1, (float**)t, NCCLRL_NUM_ALGOS, NCCLRL_NUM_PROTOS, 0, &nch);
    int fa = -1, fp = -1;
    for (int a = 0; a < NCCLRL_NUM_ALGOS; a++)
      for (int p = 0; p < NCCLRL_NUM_PROTOS; p++)
        if (t[a][p] == 0.0f) { fa = a; fp = p; }
    printf("%d %llu %d %d %d\n", coll, nbytes, fa, fp, nch);
  }
  v5->finalize(ctx);
  dlclose(lib);
  return 0;
}
