/*
 * A scripted driver that plays NCCL for several communicators at once, in any tuner ABI version:
 * tests use it to send a known sequence of getCollInfo requests (the request log) and to compare
 * decisions with and without a setting.
 *
 *   drive LIB        commands on stdin, one per line:
 *     init ID VERSION NRANKS NNODES COMMID   a context ID (0..63) through ncclTunerPlugin_vVERSION (2..6)
 *     call ID COLL NBYTES                    one request; prints "ID COLL NBYTES ALGO PROTO CHANNELS"
 *     calls ID COLL NBYTES COUNT             COUNT requests, nothing printed
 *     fini ID                                destroy (v2-v4) or finalize (v5, v6)
 * First line out: "pid PID". Each log call: "log LEVEL MESSAGE". ALGO PROTO: what the plugin chose
 * (v2: its outputs; v3+: the cost-table entry it set to 0), -1 -1 for NCCL's own, every entry
 * enabled; CHANNELS: what it wrote (0: NCCL's own). Exit status 0 unless a command fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../ncclrl_tuner_abi.h"

#define MAX_CTX 64
#define NA NCCLRL_NUM_ALGOS
#define NP NCCLRL_NUM_PROTOS

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  printf("log %d %s\n", level, msg);
}

typedef struct {
  int version;
  void* ctx;
} slot_t;

static const ncclrl_tuner_v2_t* v2;
static const ncclrl_tuner_v3_t* v3;
static const ncclrl_tuner_v4_t* v4;
static const ncclrl_tuner_v5_t* v5;
static const ncclrl_tuner_v6_t* v6;

/* One request; algo and proto -1 when NCCL keeps its own. */
static int request(const slot_t* s, int coll, size_t nbytes, int* algo, int* proto, int* nch) {
  float t[NCCLRL_NUM_ALGOS][NCCLRL_NUM_PROTOS];
  for (int a = 0; a < NCCLRL_NUM_ALGOS; a++)
    for (int p = 0; p < NCCLRL_NUM_PROTOS; p++) t[a][p] = 1.0f;
  *algo = *proto = -1;
  *nch = 0;
  ncclrl_result_t rc;
  switch (s->version) {
    case 2: return v2->getCollInfo(s->ctx, coll, nbytes, 1, 1, 1, algo, proto, nch);
    case 3: rc = v3->getCollInfo(s->ctx, coll, nbytes, 1, (float**)t, NA, NP, nch); break;
    case 4: rc = v4->getCollInfo(s->ctx, coll, nbytes, 1, (float**)t, NA, NP, 0, nch); break;
    case 5: rc = v5->getCollInfo(s->ctx, coll, nbytes, 1, (float**)t, NA, NP, 0, nch); break;
    default: rc = v6->getCollInfo(s->ctx, coll, nbytes, 1, (float**)t, NA, NP, 0, nch);
  }
  for (int a = 0; a < NCCLRL_NUM_ALGOS; a++)
    for (int p = 0; p < NCCLRL_NUM_PROTOS; p++)
      if (t[a][p] == 0.0f) { *algo = a; *proto = p; }
  return rc;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s LIB < commands\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  v2 = dlsym(lib, "ncclTunerPlugin_v2");
  v3 = dlsym(lib, "ncclTunerPlugin_v3");
  v4 = dlsym(lib, "ncclTunerPlugin_v4");
  v5 = dlsym(lib, "ncclTunerPlugin_v5");
  v6 = dlsym(lib, "ncclTunerPlugin_v6");
  if (!v2 || !v3 || !v4 || !v5 || !v6) { fprintf(stderr, "missing a ncclTunerPlugin_vN\n"); return 2; }
  printf("pid %ld\n", (long)getpid());
  slot_t slots[MAX_CTX];
  memset(slots, 0, sizeof(slots));
  ncclrl_nvl_domain_info_v5_t nvl = {1, 1, 1};
  ncclrl_tuner_constants_v5_t constants;
  memset(&constants, 0, sizeof(constants));
  char cmd[16];
  int id;
  while (scanf("%15s %d", cmd, &id) == 2) {
    if (id < 0 || id >= MAX_CTX) { fprintf(stderr, "context id %d out of range\n", id); return 2; }
    slot_t* s = &slots[id];
    if (strcmp(cmd, "init") == 0) {
      int version;
      size_t nranks, nnodes;
      unsigned long long comm;
      if (scanf("%d %zu %zu %llu", &version, &nranks, &nnodes, &comm) != 4 || version < 2 || version > 6 || s->ctx) {
        fprintf(stderr, "bad init for context %d\n", id);
        return 2;
      }
      ncclrl_result_t rc;
      s->version = version;
      switch (version) {
        case 2: rc = v2->init(nranks, nnodes, logger, &s->ctx); break;
        case 3: rc = v3->init(nranks, nnodes, logger, &s->ctx); break;
        case 4: rc = v4->init(nranks, nnodes, logger, &s->ctx); break;
        case 5: rc = v5->init(&s->ctx, comm, nranks, nnodes, logger, &nvl, &constants); break;
        default: rc = v6->init(&s->ctx, comm, nranks, nnodes, logger, &nvl, &constants);
      }
      if (rc != NCCLRL_SUCCESS || !s->ctx) { fprintf(stderr, "init of context %d failed (%d)\n", id, rc); return 1; }
    } else if (strcmp(cmd, "call") == 0 || strcmp(cmd, "calls") == 0) {
      int coll, algo, proto, nch;
      unsigned long long nbytes, count = 1;
      int many = strcmp(cmd, "calls") == 0;
      if (scanf("%d %llu", &coll, &nbytes) != 2 || (many && scanf("%llu", &count) != 1) || !s->ctx) {
        fprintf(stderr, "bad %s for context %d\n", cmd, id);
        return 2;
      }
      for (unsigned long long i = 0; i < count; i++)
        if (request(s, coll, (size_t)nbytes, &algo, &proto, &nch) != NCCLRL_SUCCESS) {
          fprintf(stderr, "getCollInfo failed on context %d\n", id);
          return 1;
        }
      if (!many) printf("%d %d %llu %d %d %d\n", id, coll, nbytes, algo, proto, nch);
    } else if (strcmp(cmd, "fini") == 0) {
      if (!s->ctx) { fprintf(stderr, "fini of context %d, not initialised\n", id); return 2; }
      ncclrl_result_t rc = s->version == 2 ? v2->destroy(s->ctx) : s->version == 3 ? v3->destroy(s->ctx)
                         : s->version == 4 ? v4->destroy(s->ctx) : s->version == 5 ? v5->finalize(s->ctx)
                         : v6->finalize(s->ctx);
      if (rc != NCCLRL_SUCCESS) { fprintf(stderr, "fini of context %d failed (%d)\n", id, rc); return 1; }
      s->ctx = NULL;
    } else {
      fprintf(stderr, "unknown command %s\n", cmd);
      return 2;
    }
  }
  dlclose(lib);
  return 0;
}
