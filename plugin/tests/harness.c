/*
 * A harness that plays NCCL: dlopen the plugin, resolve every ncclTunerPlugin_vN, init with a
 * logger, call getCollInfo with real-shaped cost tables (-1 entries included), finalize, and check
 * each decision against known answers for tests/data/basic.csv (from a file and from
 * NCCLRL_TUNER_TABLE_DATA), tests/data/shapes.csv (rows for several communicator shapes),
 * tables of 1 MiB and 17 MiB in the environment, the request log (NCCLRL_TUNER_REQUEST_LOG), files
 * that are not tables (a NUL byte, a FIFO, a directory, /dev/zero), the locale (HARNESS_LOCALE: run
 * everything under it), ABI v2's refusals, the per-collective filter limit, communicators
 * initialised and queried from several threads at once, and the deployment's fingerprint
 * (NCCLRL_TUNER_TABLE_FINGERPRINT: a file without one is refused; `any` opts out). Checks of other
 * things that read a table file run with NCCLRL_TUNER_TABLE_FINGERPRINT=any.
 *
 *   harness LIB DATA_DIR     exit status 0 when every check passes (HARNESS_ECHO=1: print the log lines)
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <dlfcn.h>
#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ncclrl_tuner_abi.h"

static int failures = 0, checks = 0;

/* The NCCL release the plugin sees: it asks ncclGetVersion of the process (this program, linked
 * -rdynamic); 0 = the call fails, as when no NCCL answers. */
static int fake_nccl_code = 22809;
__attribute__((visibility("default"))) int ncclGetVersion(int* version);
int ncclGetVersion(int* version) {
  if (!fake_nccl_code) return 4; /* ncclInvalidArgument */
  *version = fake_nccl_code;
  return 0;
}
#define CHECK(cond, ...)                                              \
  do {                                                                \
    checks++;                                                         \
    if (!(cond)) {                                                    \
      failures++;                                                     \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);            \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
    }                                                                 \
  } while (0)

#define MAX_MSGS 256
static char msgs[MAX_MSGS][1024]; /* NCCL's logger keeps 1024 bytes of a line */
static int levels[MAX_MSGS];
static int nmsgs = 0;

static int echo = 0;
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (nmsgs >= MAX_MSGS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msgs[nmsgs], sizeof(msgs[0]), fmt, ap);
  va_end(ap);
  if (echo) fprintf(stderr, "LOG %d %s\n", level, msgs[nmsgs]);
  levels[nmsgs++] = level;
}

static int count_level(int level) {
  int n = 0;
  for (int i = 0; i < nmsgs; i++) n += levels[i] == level;
  return n;
}

static int find_msg(int level, const char* a, const char* b) {
  for (int i = 0; i < nmsgs; i++)
    if (levels[i] == level && strstr(msgs[i], a) && (!b || strstr(msgs[i], b))) return 1;
  return 0;
}

/* A whole file, NUL-terminated; *len its size. */
static char* read_all(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  fclose(f);
  if (buf) { buf[n] = '\0'; *len = (size_t)n; }
  return buf;
}

static unsigned long long fnv1a(const char* buf, size_t len) {
  unsigned long long h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; i++) { h ^= (unsigned char)buf[i]; h *= 0x100000001b3ULL; }
  return h;
}

/* A cost table shaped like NCCL's: [7][3] floats, algorithms NCCL cannot run marked -1. */
/* A table text's fingerprint as the plugin logs it: 16 lowercase hex digits. */
static void fp_hex(const char* text, char out[17]) {
  snprintf(out, 17, "%016llx", fnv1a(text, strlen(text)));
}

static void fill_table(float t[7][3]) {
  for (int a = 0; a < 7; a++)
    for (int p = 0; p < 3; p++) t[a][p] = 10.0f + (float)(a * 3 + p);
  for (int p = 0; p < 3; p++) {
    t[NCCLRL_COLLNET_DIRECT][p] = t[NCCLRL_COLLNET_CHAIN][p] = t[NCCLRL_NVLS][p] = -1.0f;
    t[NCCLRL_NVLS_TREE][p] = t[NCCLRL_PAT][p] = -1.0f;
  }
  t[NCCLRL_NVLS][NCCLRL_LL] = -1.0f;
}

typedef struct {
  int coll;
  size_t nbytes;
  int pipe, regbuff;
  int algo, proto, channels; /* expected: algo -1 = table untouched */
} expect_t;

static const expect_t EXPECT[] = {
    {NCCLRL_ALLREDUCE, 100, 1, 0, NCCLRL_TREE, NCCLRL_LL, 2},
    {NCCLRL_ALLREDUCE, 65535, 1, 0, NCCLRL_TREE, NCCLRL_LL, 2},
    {NCCLRL_ALLREDUCE, 65536, 1, 0, NCCLRL_RING, NCCLRL_LL128, 8},
    {NCCLRL_ALLREDUCE, 1048576, 1, 0, NCCLRL_RING, NCCLRL_SIMPLE, 16},
    {NCCLRL_ALLREDUCE, 1500000, 1, 0, NCCLRL_RING, NCCLRL_SIMPLE, 16},   /* the overlapping row was rejected */
    {NCCLRL_ALLREDUCE, 4294967295u, 1, 1, NCCLRL_RING, NCCLRL_SIMPLE, 16},
    {NCCLRL_ALLREDUCE, 4294967296ull, 1, 0, -1, -1, 0},                  /* beyond the table: NCCL decides */
    {NCCLRL_ALLGATHER, 100, 1, 0, -1, -1, 0},                            /* PAT is -1 in the cost table */
    {NCCLRL_ALLGATHER, 5000, 1, 0, -1, -1, 0},                           /* NVLS is -1 too */
    {NCCLRL_ALLGATHER, 10000, 1, 0, NCCLRL_RING, NCCLRL_SIMPLE, 6},      /* spaces, upper case, chunk column */
    {NCCLRL_BROADCAST, 10, 1, 0, -1, -1, 0},                             /* row is for 2 nodes x 16 ranks */
    {NCCLRL_REDUCESCATTER, 50, 4, 0, NCCLRL_RING, NCCLRL_LL, 3},         /* numPipeOps 4 only */
    {NCCLRL_REDUCESCATTER, 50, 1, 0, -1, -1, 0},
    {NCCLRL_REDUCE, 5, 1, 0, -2, -2, 4},                                 /* channels only */
    {NCCLRL_REDUCE, 15, 1, 0, -1, -1, 0},                                /* rejected line */
};
#define NEXPECT (sizeof(EXPECT) / sizeof(EXPECT[0]))

typedef ncclrl_result_t (*get_cost_fn)(void*, int, size_t, int, float**, int, int, int, int*);

static void check_cost_version(const char* label, void* ctx, int version, const ncclrl_tuner_v3_t* v3,
                               get_cost_fn get4) {
  for (size_t i = 0; i < NEXPECT; i++) {
    const expect_t* e = &EXPECT[i];
    if (version == 3 && e->pipe != 1 && e->pipe != 4) continue;
    float t[7][3], before[7][3];
    fill_table(t);
    memcpy(before, t, sizeof(t));
    int nch = 0;
    ncclrl_result_t rc = version == 3 ? v3->getCollInfo(ctx, e->coll, e->nbytes, e->pipe, (float**)t, 7, 3, &nch)
                                      : get4(ctx, e->coll, e->nbytes, e->pipe, (float**)t, 7, 3, e->regbuff, &nch);
    CHECK(rc == NCCLRL_SUCCESS, "%s case %zu: rc %d", label, i, rc);
    int changed = 0, forced_a = -1, forced_p = -1;
    for (int a = 0; a < 7; a++)
      for (int p = 0; p < 3; p++)
        if (t[a][p] != before[a][p]) { changed++; forced_a = a; forced_p = p; }
    if (e->algo >= 0) {
      CHECK(changed == 1 && forced_a == e->algo && forced_p == e->proto && t[forced_a][forced_p] == 0.0f,
            "%s case %zu: expected %d/%d forced, got %d changes (%d/%d)", label, i, e->algo, e->proto, changed,
            forced_a, forced_p);
    } else {
      CHECK(changed == 0, "%s case %zu: table must stay untouched, %d entries changed", label, i, changed);
    }
    CHECK(nch == e->channels, "%s case %zu: channels %d, expected %d", label, i, nch, e->channels);
    /* never force an entry NCCL marked -1 */
    for (int a = 0; a < 7; a++)
      for (int p = 0; p < 3; p++)
        if (before[a][p] < 0) CHECK(t[a][p] == before[a][p], "%s case %zu: forced disabled %d/%d", label, i, a, p);
  }
}

/* ---- robustness: files that are not tables, the locale, ABI v2, the filter limit, threads ---- */

/* Init a v5 context on the table at path (no data variable); the log lines land in msgs. */
static void* init_path(const ncclrl_tuner_v5_t* v5, const char* path, size_t nranks, size_t nnodes) {
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  nmsgs = 0;
  void* ctx = NULL;
  CHECK(v5->init(&ctx, 90, nranks, nnodes, logger, &nvl, NULL) == NCCLRL_SUCCESS && ctx, "init on %s", path);
  return ctx;
}

/* No row applies: every call keeps NCCL's decision. */
static int untouched(const ncclrl_tuner_v5_t* v5, void* ctx) {
  for (int c = 0; c < NCCLRL_NUM_COLLS; c++)
    for (size_t s = 1; s < ((size_t)1 << 33); s *= 3) {
      float t[7][3], before[7][3];
      fill_table(t);
      memcpy(before, t, sizeof(t));
      int nch = 0;
      v5->getCollInfo(ctx, c, s, 1, (float**)t, 7, 3, 0, &nch);
      if (nch != 0 || memcmp(t, before, sizeof(t)) != 0) return 0;
    }
  return 1;
}

/* A named file that is not a table: this communicator's init fails with a WARN naming the file and
 * why; with NCCLRL_TUNER_ON_ERROR=fallback, the same WARN and NCCL decides everything. */
static void check_refused_file(const ncclrl_tuner_v5_t* v5, const char* path, const char* what) {
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  nmsgs = 0;
  void* ctx = (void*)&nvl;
  ncclrl_result_t rc = v5->init(&ctx, 89, 4, 1, logger, &nvl, NULL);
  CHECK(rc != NCCLRL_SUCCESS && ctx == NULL, "%s: init must fail (rc %d)", path, rc);
  CHECK(find_msg(NCCLRL_LOG_WARN, path, what) && find_msg(NCCLRL_LOG_WARN, "this communicator's init fails", NULL),
        "%s: no WARN saying '%s' and that init fails", path, what);
  setenv("NCCLRL_TUNER_ON_ERROR", "fallback", 1);
  ctx = init_path(v5, path, 4, 1);
  unsetenv("NCCLRL_TUNER_ON_ERROR");
  CHECK(find_msg(NCCLRL_LOG_WARN, path, what) && find_msg(NCCLRL_LOG_WARN, "NCCL's own decisions everywhere", NULL),
        "%s: no WARN saying '%s'", path, what);
  CHECK(!find_msg(NCCLRL_LOG_INFO, "table from", NULL), "%s: must not load", path);
  CHECK(untouched(v5, ctx), "%s: NCCL must decide everything", path);
  v5->finalize(ctx);
}

static void check_not_tables(const ncclrl_tuner_v5_t* v5) {
  char dir[] = "/tmp/ncclrl-harness-odd-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[256];
  /* a NUL byte anywhere: not a text table, refused whole (a preallocated, half-written file looks so) */
  snprintf(path, sizeof(path), "%s/nul.csv", dir);
  FILE* f = fopen(path, "wb");
  static const char nul_table[] = "allreduce,0,100,ring,ll,2,-1,-1\nallreduce,101,200,ring\0ll,2,-1,-1\n";
  if (f) { fwrite(nul_table, 1, sizeof(nul_table) - 1, f); fclose(f); }
  check_refused_file(v5, path, "holds a NUL byte at offset 54 (line 2)");
  /* a FIFO with no writer: refused at once (a blocking open or read would stall NCCL's init) */
  snprintf(path, sizeof(path), "%s/fifo.csv", dir);
  CHECK(mkfifo(path, 0600) == 0, "mkfifo");
  check_refused_file(v5, path, "is a FIFO, not a regular file");
  unlink(path);
  /* a directory, an endless device */
  check_refused_file(v5, dir, "is a directory, not a regular file");
  check_refused_file(v5, "/dev/zero", "is a character device, not a regular file");
  /* unreadable: a WARN, not the INFO of a missing file (root reads it anyway: skip then) */
  snprintf(path, sizeof(path), "%s/secret.csv", dir);
  f = fopen(path, "w");
  if (f) { fputs("allreduce,0,100,ring,ll,2,-1,-1\n", f); fclose(f); }
  chmod(path, 0);
  if (access(path, R_OK) != 0) check_refused_file(v5, path, "cannot open table");
  unlink(path);
  snprintf(path, sizeof(path), "%s/nul.csv", dir);
  unlink(path);
  rmdir(dir);
}

/* Table names in upper case and numbers read the same under any locale the application set. */
static void check_locale(const ncclrl_tuner_v5_t* v5) {
  const char* want = getenv("HARNESS_LOCALE");
  const char* got = setlocale(LC_ALL, want ? want : "C");
  CHECK(got != NULL, "setlocale(LC_ALL, '%s') failed", want ? want : "C");
  if (got && want) {
    printf("locale %s: decimal point '%s', tolower('I') = 0x%02x\n", got, localeconv()->decimal_point,
           (unsigned)(unsigned char)tolower('I'));
  }
  setenv("NCCLRL_TUNER_TABLE_DATA", "ALLREDUCE, 0, 1023, RING, LL128, 7, -1, -1\n"
         "ALLREDUCE,1024,MAX,TREE,SIMPLE,+12,-1,-1\n"
         "ALLREDUCE,1024,max,TREE,SIMPLE,12,-1,-1\n"
         "BROADCAST,0,max,RING,SIMPLE,3,-1,-1,-1,-1,1048576\n"
         "REDUCE,0,1.5,RING,SIMPLE,3,-1,-1\nREDUCE,0,1,5,RING,SIMPLE,3,-1,-1\n"
         "ALLGATHER,0,9223372036854775808,RING,LL,1,-1,-1\n", 1);
  nmsgs = 0;
  void* ctx = NULL;
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  v5->init(&ctx, 91, 4, 1, logger, &nvl, NULL);
  CHECK(find_msg(NCCLRL_LOG_INFO, "(", "3 rows") && count_level(NCCLRL_LOG_WARN) == 4,
        "locale: 3 rows and 4 WARNs expected, %d WARNs", count_level(NCCLRL_LOG_WARN));
  CHECK(find_msg(NCCLRL_LOG_WARN, ":2: field max_bytes", NULL) && find_msg(NCCLRL_LOG_WARN, ":5: field max_bytes", NULL)
        && find_msg(NCCLRL_LOG_WARN, ":6: field", NULL) && find_msg(NCCLRL_LOG_WARN, ":7: field max_bytes", NULL),
        "locale: MAX, 1.5, 1,5 and 2^63 must be rejected");
  float t[7][3];
  int nch = 0;
  fill_table(t);
  v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 100, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(t[NCCLRL_RING][NCCLRL_LL128] == 0.0f && nch == 7, "locale: upper-case RING/LL128 row");
  fill_table(t);
  nch = 0;
  v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1 << 20, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(t[NCCLRL_TREE][NCCLRL_SIMPLE] == 0.0f && nch == 12, "locale: TREE/SIMPLE row");
  fill_table(t);
  nch = 0;
  v5->getCollInfo(ctx, NCCLRL_BROADCAST, 5, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(t[NCCLRL_RING][NCCLRL_SIMPLE] == 0.0f && nch == 3, "locale: BROADCAST row");
  v5->finalize(ctx);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
}

/* ABI v2 (NCCL 2.21): a choice that NCCL cannot run for that collective is never written. */
static void check_v2_refusals(const ncclrl_tuner_v2_t* v2) {
  static const struct {
    const char* row;
    int coll, collnet, nvls;
    size_t nnodes;
    int forced; /* 1: the row's algorithm and protocol are written */
  } CASES[] = {
      {"broadcast,0,max,tree,simple,2,-1,-1", NCCLRL_BROADCAST, 1, 1, 1, 0},
      {"broadcast,0,max,ring,ll128,2,-1,-1", NCCLRL_BROADCAST, 0, 0, 1, 1},
      {"reduce,0,max,nvls,simple,2,-1,-1", NCCLRL_REDUCE, 1, 1, 1, 0},
      {"allgather,0,max,tree,simple,2,-1,-1", NCCLRL_ALLGATHER, 1, 1, 1, 0},
      {"allgather,0,max,pat,simple,2,-1,-1", NCCLRL_ALLGATHER, 1, 1, 2, 0},
      {"allgather,0,max,nvls,simple,2,-1,-1", NCCLRL_ALLGATHER, 0, 1, 1, 1},
      {"allgather,0,max,nvls,ll,2,-1,-1", NCCLRL_ALLGATHER, 0, 1, 1, 0},
      {"allgather,0,max,nvls,simple,2,-1,-1", NCCLRL_ALLGATHER, 0, 1, 2, 0},
      {"allgather,0,max,nvls,simple,2,-1,-1", NCCLRL_ALLGATHER, 1, 1, 2, 1},
      {"allgather,0,max,collnet_direct,simple,2,-1,-1", NCCLRL_ALLGATHER, 1, 1, 2, 0},
      {"reducescatter,0,max,collnet_chain,simple,2,-1,-1", NCCLRL_REDUCESCATTER, 1, 1, 2, 0},
      {"reducescatter,0,max,ring,ll,2,-1,-1", NCCLRL_REDUCESCATTER, 0, 0, 2, 1},
      {"allreduce,0,max,nvls_tree,simple,2,-1,-1", NCCLRL_ALLREDUCE, 1, 1, 1, 0},
      {"allreduce,0,max,nvls_tree,simple,2,-1,-1", NCCLRL_ALLREDUCE, 0, 1, 2, 1},
      {"allreduce,0,max,nvls_tree,ll128,2,-1,-1", NCCLRL_ALLREDUCE, 1, 1, 2, 0},
      {"allreduce,0,max,collnet_direct,simple,2,-1,-1", NCCLRL_ALLREDUCE, 1, 0, 2, 1},
      {"allreduce,0,max,collnet_direct,ll,2,-1,-1", NCCLRL_ALLREDUCE, 1, 0, 2, 0},
      {"allreduce,0,max,collnet_chain,simple,2,-1,-1", NCCLRL_ALLREDUCE, 0, 1, 2, 0},
      {"allreduce,0,max,pat,simple,2,-1,-1", NCCLRL_ALLREDUCE, 1, 1, 1, 0},
      {"allreduce,0,max,tree,ll128,2,-1,-1", NCCLRL_ALLREDUCE, 0, 0, 1, 1},
  };
  for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
    setenv("NCCLRL_TUNER_TABLE_DATA", CASES[i].row, 1);
    nmsgs = 0;
    void* ctx = NULL;
    CHECK(v2->init(8, CASES[i].nnodes, logger, &ctx) == NCCLRL_SUCCESS && ctx, "v2 init");
    CHECK(count_level(NCCLRL_LOG_WARN) == 0, "v2 case %zu: the row itself is valid", i);
    int a = -1, p = -1, nch = 0;
    v2->getCollInfo(ctx, CASES[i].coll, 4096, CASES[i].collnet, CASES[i].nvls, 1, &a, &p, &nch);
    if (CASES[i].forced)
      CHECK(a >= 0 && p >= 0 && nch == 2, "v2 case %zu (%s, %zu nodes): must be written, got %d/%d/%d", i,
            CASES[i].row, CASES[i].nnodes, a, p, nch);
    else
      CHECK(a == -1 && p == -1 && nch == 0, "v2 case %zu (%s, %zu nodes, collnet %d, nvls %d): written %d/%d/%d", i,
            CASES[i].row, CASES[i].nnodes, CASES[i].collnet, CASES[i].nvls, a, p, nch);
    v2->destroy(ctx);
  }
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
}

/* More distinct numPipeOps filters than a collective keeps: every row past the limit has its WARN. */
static void check_filter_limit(const ncclrl_tuner_v5_t* v5) {
  char* text = malloc(64 * 40);
  if (!text) return;
  text[0] = '\0';
  for (int k = 1; k <= 20; k++) /* 20 filters, two rows each: the last 4 filters' 8 rows are rejected */
    for (int j = 0; j < 2; j++)
      snprintf(text + strlen(text), 64, "allreduce,%d,%d,ring,ll,1,-1,-1,%d\n", j * 100, j * 100 + 99, k);
  setenv("NCCLRL_TUNER_TABLE_DATA", text, 1);
  nmsgs = 0;
  void* ctx = NULL;
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  v5->init(&ctx, 92, 4, 1, logger, &nvl, NULL);
  CHECK(count_level(NCCLRL_LOG_WARN) == 8 && find_msg(NCCLRL_LOG_INFO, "32 for this communicator", "8 rejected"),
        "filter limit: 8 WARNs expected, %d", count_level(NCCLRL_LOG_WARN));
  for (int k = 17; k <= 20; k++) {
    char want[64];
    snprintf(want, sizeof(want), ":%d: field numPipeOps", 2 * k - 1);
    CHECK(find_msg(NCCLRL_LOG_WARN, want, NULL), "filter limit: no WARN for line %d", 2 * k - 1);
    snprintf(want, sizeof(want), ":%d: field numPipeOps", 2 * k);
    CHECK(find_msg(NCCLRL_LOG_WARN, want, NULL), "filter limit: no WARN for line %d", 2 * k);
  }
  v5->finalize(ctx);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  free(text);
}

/* Several communicators initialised, queried and finalised at once from threads: each thread's
 * decisions equal those of one thread alone. The table comes from the environment, set before. */
#define NTHREADS 8
#define NQUERIES 2000
typedef struct {
  const ncclrl_tuner_v5_t* v5;
  size_t nranks, nnodes;
  int got[NQUERIES][3];
  int ok;
} worker_t;

static void query_all(const ncclrl_tuner_v5_t* v5, void* ctx, int got[NQUERIES][3]) {
  for (int q = 0; q < NQUERIES; q++) {
    float t[7][3];
    for (int a = 0; a < 7; a++)
      for (int p = 0; p < 3; p++) t[a][p] = 1.0f;
    int nch = 0;
    v5->getCollInfo(ctx, q % 5, (size_t)q * 977u * (size_t)(q % 7 + 1), 1, (float**)t, 7, 3, 0, &nch);
    got[q][0] = got[q][1] = -1;
    for (int a = 0; a < 7; a++)
      for (int p = 0; p < 3; p++)
        if (t[a][p] == 0.0f) { got[q][0] = a; got[q][1] = p; }
    got[q][2] = nch;
  }
}

static void* worker(void* arg) {
  worker_t* w = (worker_t*)arg;
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  w->ok = 1;
  for (int round = 0; round < 5; round++) {
    void* ctx = NULL;
    if (w->v5->init(&ctx, 100 + round, w->nranks, w->nnodes, NULL, &nvl, NULL) != NCCLRL_SUCCESS || !ctx) {
      w->ok = 0;
      return NULL;
    }
    query_all(w->v5, ctx, w->got);
    w->v5->finalize(ctx);
  }
  return NULL;
}

static void check_threads(const ncclrl_tuner_v5_t* v5, const char* data_dir) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/shapes.csv", data_dir);
  size_t len = 0;
  char* text = read_all(path, &len);
  CHECK(text != NULL, "cannot read %s", path);
  if (!text) return;
  setenv("NCCLRL_TUNER_TABLE_DATA", text, 1);
  free(text);
  static const size_t SHAPE[][2] = {{4, 2}, {2, 1}, {2, 2}, {4, 1}};
  static worker_t ws[NTHREADS], ref[4];
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  for (int s = 0; s < 4; s++) { /* one thread alone first: the reference */
    void* ctx = NULL;
    v5->init(&ctx, 99, SHAPE[s][0], SHAPE[s][1], NULL, &nvl, NULL);
    query_all(v5, ctx, ref[s].got);
    v5->finalize(ctx);
  }
  pthread_t tid[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    ws[i].v5 = v5;
    ws[i].nranks = SHAPE[i % 4][0];
    ws[i].nnodes = SHAPE[i % 4][1];
    CHECK(pthread_create(&tid[i], NULL, worker, &ws[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < NTHREADS; i++) pthread_join(tid[i], NULL);
  for (int i = 0; i < NTHREADS; i++) {
    CHECK(ws[i].ok, "thread %d: init failed", i);
    CHECK(memcmp(ws[i].got, ref[i % 4].got, sizeof(ws[i].got)) == 0, "thread %d: decisions differ", i);
  }
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
}

/* ---- the deployment: every rank must run the same table, or fail loudly ---- */

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  CHECK(f != NULL, "cannot write %s", path);
  if (f) { fputs(text, f); fclose(f); }
}

/* One rank's communicator init through ABI version `version` (2 to 6); returns its result, *ctx the context. */
static ncclrl_result_t rank_init(void* lib, int version, void** ctx) {
  char name[32];
  snprintf(name, sizeof(name), "ncclTunerPlugin_v%d", version);
  void* sym = dlsym(lib, name);
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  *ctx = (void*)&nvl; /* init must set it, to NULL when it fails */
  nmsgs = 0;
  switch (version) {
    case 2: return ((const ncclrl_tuner_v2_t*)sym)->init(4, 1, logger, ctx);
    case 3: return ((const ncclrl_tuner_v3_t*)sym)->init(4, 1, logger, ctx);
    case 4: return ((const ncclrl_tuner_v4_t*)sym)->init(4, 1, logger, ctx);
    case 5: return ((const ncclrl_tuner_v5_t*)sym)->init(ctx, 7, 4, 1, logger, &nvl, NULL);
    default: return ((const ncclrl_tuner_v6_t*)sym)->init(ctx, 7, 4, 1, logger, &nvl, NULL);
  }
}

/* Whether a v5 context forces allreduce 100 B to ring/ll on 2 channels (the deployed table's row). */
static int forces_row(const ncclrl_tuner_v5_t* v5, void* ctx) {
  float t[7][3];
  int nch = 0;
  fill_table(t);
  v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 100, 1, (float**)t, 7, 3, 0, &nch);
  return t[NCCLRL_RING][NCCLRL_LL] == 0.0f && nch == 2;
}

/* The README's deployment (NCCLRL_TUNER_TABLE=PATH and NCCLRL_TUNER_TABLE_FINGERPRINT=F on every
 * rank), two ranks emulated by two communicator inits: a rank whose file is missing, or whose file
 * changed between the two inits, fails its init with a WARN naming the path (and both
 * fingerprints); NCCLRL_TUNER_ON_ERROR=fallback keeps NCCL's decisions there, with the WARN. */
static void check_deployment(void* lib, const ncclrl_tuner_v5_t* v5) {
  char dir[] = "/tmp/ncclrl-harness-deploy-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[256], missing[256], want_fp[17], got_fp[17], msg[512];
  snprintf(path, sizeof(path), "%s/nccl_tuner.csv", dir);
  snprintf(missing, sizeof(missing), "%s/not-on-this-node.csv", dir);
  const char* table = "allreduce,0,1000,ring,ll,2,-1,-1\n";
  const char* changed = "allreduce,0,1000,tree,simple,4,-1,-1\n";
  fp_hex(table, want_fp);
  fp_hex(changed, got_fp);
  write_file(path, table);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  unsetenv("NCCLRL_TUNER_ON_ERROR");
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", want_fp, 1);
  void* ctx;
  for (int version = 2; version <= 6; version++) {
    /* rank 0 reads the deployed file: loads, "as expected" */
    write_file(path, table);
    ncclrl_result_t rc = rank_init(lib, version, &ctx);
    snprintf(msg, sizeof(msg), "fingerprint %s): 1 for this communicator", want_fp);
    CHECK(rc == NCCLRL_SUCCESS && ctx && find_msg(NCCLRL_LOG_INFO, path, msg) && count_level(NCCLRL_LOG_WARN) == 0,
          "v%d rank 0: must load the expected table (rc %d)", version, rc);
    if (rc == NCCLRL_SUCCESS && version == 5) CHECK(forces_row(v5, ctx), "rank 0: the table must apply");
    if (rc == NCCLRL_SUCCESS) v5->finalize(ctx); /* every version's destroy is the same function */
    /* the file changes before rank 1's init: rank 1 fails, naming the path and both fingerprints */
    write_file(path, changed);
    rc = rank_init(lib, version, &ctx);
    snprintf(msg, sizeof(msg), "has fingerprint %s, not the %s that NCCLRL_TUNER_TABLE_FINGERPRINT expects", got_fp,
             want_fp);
    CHECK(rc != NCCLRL_SUCCESS && ctx == NULL, "v%d rank 1: a changed file must fail init (rc %d)", version, rc);
    CHECK(find_msg(NCCLRL_LOG_WARN, path, msg) && find_msg(NCCLRL_LOG_WARN, msg, "init fails"),
          "v%d rank 1: WARN must say '%s' and that init fails", version, msg);
    CHECK(!find_msg(NCCLRL_LOG_INFO, "table from", NULL), "v%d rank 1: nothing may load", version);
    /* a node without the file: fails, naming the path */
    setenv("NCCLRL_TUNER_TABLE", missing, 1);
    rc = rank_init(lib, version, &ctx);
    CHECK(rc != NCCLRL_SUCCESS && ctx == NULL && find_msg(NCCLRL_LOG_WARN, "no table at", missing)
          && find_msg(NCCLRL_LOG_WARN, missing, "init fails"), "v%d: a missing file must fail init, WARN", version);
    setenv("NCCLRL_TUNER_TABLE", path, 1);
  }
  /* a named file missing fails even when no fingerprint is stated */
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT");
  setenv("NCCLRL_TUNER_TABLE", missing, 1);
  CHECK(rank_init(lib, 5, &ctx) != NCCLRL_SUCCESS && ctx == NULL && find_msg(NCCLRL_LOG_WARN, "no table at", missing),
        "a missing NCCLRL_TUNER_TABLE must fail init");
  setenv("NCCL_TUNER_CONFIG_FILE", missing, 1);
  unsetenv("NCCLRL_TUNER_TABLE");
  CHECK(rank_init(lib, 5, &ctx) != NCCLRL_SUCCESS && ctx == NULL && find_msg(NCCLRL_LOG_WARN, "no table at", missing),
        "a missing NCCL_TUNER_CONFIG_FILE must fail init");
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  /* a fingerprint stated, no source named, no ./nccl_tuner.conf: fails */
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", want_fp, 1);
  CHECK(rank_init(lib, 5, &ctx) != NCCLRL_SUCCESS && ctx == NULL
        && find_msg(NCCLRL_LOG_WARN, "no table at nccl_tuner.conf", "init fails"),
        "an expected fingerprint without a table must fail init");
  /* opt-out: the same faults keep NCCL's decisions, each with its WARN */
  setenv("NCCLRL_TUNER_ON_ERROR", "fallback", 1);
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  ncclrl_result_t rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && find_msg(NCCLRL_LOG_WARN, msg, "NCCL's own decisions everywhere")
        && !find_msg(NCCLRL_LOG_INFO, "table from", NULL) && untouched(v5, ctx),
        "fallback: a changed file keeps NCCL's decisions with a WARN (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  setenv("NCCLRL_TUNER_TABLE", missing, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && find_msg(NCCLRL_LOG_WARN, "no table at", missing)
        && find_msg(NCCLRL_LOG_WARN, missing, "NCCL's own decisions everywhere") && untouched(v5, ctx),
        "fallback: a missing file keeps NCCL's decisions with a WARN (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  /* upper case is accepted; the fingerprint guards files only: NCCLRL_TUNER_TABLE_DATA (what ncclrl's
   * measured jobs set, while the deployment's variables may still be exported) wins and loads */
  setenv("NCCLRL_TUNER_ON_ERROR", "FAIL", 1);
  write_file(path, table);
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  for (char* c = want_fp; *c; c++) *c = (char)toupper((unsigned char)*c);
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", want_fp, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && forces_row(v5, ctx), "an upper-case fingerprint must match");
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  setenv("NCCLRL_TUNER_TABLE_DATA", changed, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && find_msg(NCCLRL_LOG_INFO, "table from NCCLRL_TUNER_TABLE_DATA", got_fp),
        "the environment's table loads whatever fingerprint the file is expected to have");
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  /* malformed settings fail init, naming the variable, whatever the policy */
  static const char* const BAD_FP[] = {"xyz", "cbf29ce48422232", "cbf29ce4842223250", "0xcbf29ce4842223"};
  for (size_t i = 0; i < sizeof(BAD_FP) / sizeof(BAD_FP[0]); i++) {
    setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", BAD_FP[i], 1);
    CHECK(rank_init(lib, 5, &ctx) != NCCLRL_SUCCESS && ctx == NULL
          && find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_FINGERPRINT=", "is not 16 hex digits"),
          "a malformed fingerprint '%s' must fail init", BAD_FP[i]);
  }
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT");
  setenv("NCCLRL_TUNER_ON_ERROR", "ignore", 1);
  CHECK(rank_init(lib, 5, &ctx) != NCCLRL_SUCCESS && ctx == NULL
        && find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_ON_ERROR='ignore' is not fail or fallback", NULL),
        "an unknown NCCLRL_TUNER_ON_ERROR must fail init");
  unsetenv("NCCLRL_TUNER_ON_ERROR");
  unsetenv("NCCLRL_TUNER_TABLE");
  unlink(path);
  rmdir(dir);
}

/* A table file read while no fingerprint is expected (NCCLRL_TUNER_TABLE_FINGERPRINT unset) is
 * refused, whichever source named it (./nccl_tuner.conf too), with one WARN naming the fix: the
 * variable set to the fingerprint of the bytes read, or `any`. The refusal follows
 * NCCLRL_TUNER_ON_ERROR (fail: init fails; fallback: NCCL decides everything). `any` loads the file
 * unchecked; a matching fingerprint loads it; another fingerprint is refused; NCCLRL_TUNER_TABLE_DATA
 * needs none; nothing read (no ./nccl_tuner.conf) stays an INFO. */
static void check_unchecked(void* lib, const ncclrl_tuner_v5_t* v5) {
  char dir[] = "/tmp/ncclrl-harness-unchecked-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[256], conf[256], fix[128], msg[256], cwd[4096];
  snprintf(path, sizeof(path), "%s/nccl_tuner.csv", dir);
  snprintf(conf, sizeof(conf), "%s/nccl_tuner.conf", dir);
  const char* table = "allreduce,0,1000,ring,ll,2,-1,-1\n";
  const char* other = "allreduce,0,1000,tree,simple,4,-1,-1\n";
  char fp[17], other_fp[17];
  fp_hex(table, fp);
  fp_hex(other, other_fp);
  snprintf(fix, sizeof(fix), "set NCCLRL_TUNER_TABLE_FINGERPRINT=%s (these %zu bytes' fingerprint", fp, strlen(table));
  write_file(path, table);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  unsetenv("NCCLRL_TUNER_ON_ERROR");
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT");
  void* ctx;
  ncclrl_result_t rc;
  /* unchecked, policy fail: every ABI version's init fails, one WARN naming the file and the fix */
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  for (int version = 2; version <= 6; version++) {
    rc = rank_init(lib, version, &ctx);
    CHECK(rc != NCCLRL_SUCCESS && ctx == NULL, "v%d: an unchecked file must fail init (rc %d)", version, rc);
    CHECK(count_level(NCCLRL_LOG_WARN) == 1 && find_msg(NCCLRL_LOG_WARN, path, fix)
          && find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_FINGERPRINT is unset", "or =any to load files unchecked")
          && find_msg(NCCLRL_LOG_WARN, fix, "this communicator's init fails"),
          "v%d: one WARN naming %s, '%s' and that init fails", version, path, fix);
    CHECK(!find_msg(NCCLRL_LOG_INFO, "table from", NULL), "v%d: an unchecked file must not load", version);
  }
  /* NCCL_TUNER_CONFIG_FILE and ./nccl_tuner.conf are files too */
  unsetenv("NCCLRL_TUNER_TABLE");
  setenv("NCCL_TUNER_CONFIG_FILE", path, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc != NCCLRL_SUCCESS && ctx == NULL && count_level(NCCLRL_LOG_WARN) == 1 && find_msg(NCCLRL_LOG_WARN, path, fix),
        "an unchecked NCCL_TUNER_CONFIG_FILE must fail init with the WARN (rc %d)", rc);
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  CHECK(getcwd(cwd, sizeof(cwd)) != NULL && chdir(dir) == 0, "chdir %s", dir);
  rc = rank_init(lib, 5, &ctx); /* no ./nccl_tuner.conf yet: nothing read, an INFO, NCCL decides */
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 0
        && find_msg(NCCLRL_LOG_INFO, "no table at nccl_tuner.conf", NULL) && untouched(v5, ctx),
        "no file, no fingerprint: an INFO and NCCL's decisions (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  write_file(conf, table);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc != NCCLRL_SUCCESS && ctx == NULL && count_level(NCCLRL_LOG_WARN) == 1
        && find_msg(NCCLRL_LOG_WARN, "table nccl_tuner.conf is a file", fix)
        && find_msg(NCCLRL_LOG_WARN, fix, "this communicator's init fails"),
        "an unchecked ./nccl_tuner.conf must fail init with the WARN (rc %d)", rc);
  /* policy fallback: the same WARN, NCCL decides everything */
  setenv("NCCLRL_TUNER_ON_ERROR", "fallback", 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 1
        && find_msg(NCCLRL_LOG_WARN, "table nccl_tuner.conf is a file", fix)
        && find_msg(NCCLRL_LOG_WARN, fix, "NCCL's own decisions everywhere") && untouched(v5, ctx)
        && !find_msg(NCCLRL_LOG_INFO, "table from", NULL),
        "fallback: an unchecked ./nccl_tuner.conf keeps NCCL's decisions with the WARN (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  unlink(conf);
  CHECK(chdir(cwd) == 0, "chdir back to %s", cwd);
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 1 && find_msg(NCCLRL_LOG_WARN, path, fix)
        && find_msg(NCCLRL_LOG_WARN, fix, "NCCL's own decisions everywhere") && untouched(v5, ctx)
        && !find_msg(NCCLRL_LOG_INFO, "table from", NULL),
        "fallback: an unchecked NCCLRL_TUNER_TABLE keeps NCCL's decisions with the WARN (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  unsetenv("NCCLRL_TUNER_ON_ERROR");
  /* opt-out: `any` (any case) loads the file unchecked, no WARN */
  static const char* const ANY[] = {"any", "ANY", "Any"};
  for (size_t i = 0; i < sizeof(ANY) / sizeof(ANY[0]); i++) {
    setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", ANY[i], 1);
    rc = rank_init(lib, 5, &ctx);
    snprintf(msg, sizeof(msg), "fingerprint %s): 1 for this communicator", fp);
    CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 0 && find_msg(NCCLRL_LOG_INFO, path, msg)
          && forces_row(v5, ctx), "NCCLRL_TUNER_TABLE_FINGERPRINT=%s must load the file unchecked (rc %d)", ANY[i], rc);
    if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  }
  /* `any` does not require a table: nothing named, no ./nccl_tuner.conf is an INFO */
  unsetenv("NCCLRL_TUNER_TABLE");
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 0
        && find_msg(NCCLRL_LOG_INFO, "no table at nccl_tuner.conf", NULL), "any without a table: INFO (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  /* the matching fingerprint loads */
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", fp, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 0 && find_msg(NCCLRL_LOG_INFO, path, msg)
        && forces_row(v5, ctx), "the matching fingerprint must load the file (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  /* another fingerprint is refused: fail, then fallback */
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", other_fp, 1);
  snprintf(msg, sizeof(msg), "has fingerprint %s, not the %s that NCCLRL_TUNER_TABLE_FINGERPRINT expects", fp, other_fp);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc != NCCLRL_SUCCESS && ctx == NULL && count_level(NCCLRL_LOG_WARN) == 1 && find_msg(NCCLRL_LOG_WARN, path, msg)
        && find_msg(NCCLRL_LOG_WARN, msg, "this communicator's init fails"), "a mismatch must fail init (rc %d)", rc);
  setenv("NCCLRL_TUNER_ON_ERROR", "fallback", 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 1
        && find_msg(NCCLRL_LOG_WARN, msg, "NCCL's own decisions everywhere") && untouched(v5, ctx),
        "fallback: a mismatch keeps NCCL's decisions with the WARN (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  unsetenv("NCCLRL_TUNER_ON_ERROR");
  /* NCCLRL_TUNER_TABLE_DATA is not a file: it loads without a fingerprint, the named file unread */
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT");
  setenv("NCCLRL_TUNER_TABLE_DATA", table, 1);
  rc = rank_init(lib, 5, &ctx);
  CHECK(rc == NCCLRL_SUCCESS && ctx && count_level(NCCLRL_LOG_WARN) == 0
        && find_msg(NCCLRL_LOG_INFO, "table from NCCLRL_TUNER_TABLE_DATA", fp) && forces_row(v5, ctx),
        "NCCLRL_TUNER_TABLE_DATA needs no fingerprint (rc %d)", rc);
  if (rc == NCCLRL_SUCCESS) v5->finalize(ctx);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  /* a value outside the allowed set fails init, naming the variable and the allowed values */
  static const char* const BAD[] = {"anything", "none", "an", "any "};
  for (size_t i = 0; i < sizeof(BAD) / sizeof(BAD[0]); i++) {
    setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", BAD[i], 1);
    rc = rank_init(lib, 5, &ctx);
    CHECK(rc != NCCLRL_SUCCESS && ctx == NULL && count_level(NCCLRL_LOG_WARN) == 1
          && find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_FINGERPRINT=", "is not 16 hex digits")
          && find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_FINGERPRINT=", "or any"),
          "NCCLRL_TUNER_TABLE_FINGERPRINT='%s' must fail init naming the allowed values", BAD[i]);
  }
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT");
  unsetenv("NCCLRL_TUNER_TABLE");
  unlink(path);
  rmdir(dir);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIB DATA_DIR\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  const ncclrl_tuner_v2_t* v2 = dlsym(lib, "ncclTunerPlugin_v2");
  const ncclrl_tuner_v3_t* v3 = dlsym(lib, "ncclTunerPlugin_v3");
  const ncclrl_tuner_v4_t* v4 = dlsym(lib, "ncclTunerPlugin_v4");
  const ncclrl_tuner_v5_t* v5 = dlsym(lib, "ncclTunerPlugin_v5");
  const ncclrl_tuner_v6_t* v6 = dlsym(lib, "ncclTunerPlugin_v6");
  CHECK(v2 && v3 && v4 && v5 && v6, "missing a versioned symbol");
  CHECK(dlsym(lib, "load_table") == NULL && dlsym(lib, "lookup") == NULL, "internal symbols are visible");
  if (!(v2 && v3 && v4 && v5 && v6)) return 1;
  CHECK(strcmp(v5->name, "ncclrl") == 0 && v6->getChunkSize != NULL, "names/getChunkSize");
  /* HARNESS_LOCALE: every check below runs under that locale (an application's setlocale) */
  check_locale(v5);
  /* the checks of table files below are about their content: read them unchecked (check_deployment
   * and check_unchecked set the variable as they need) */
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", "any", 1);

  char path[1024];
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  unsetenv("NCCL_TUNER_CONFIG_FILE");
  snprintf(path, sizeof(path), "%s/basic.csv", argv[2]);
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  size_t basic_len = 0;
  char* basic = read_all(path, &basic_len);
  CHECK(basic != NULL, "cannot read %s", path);
  if (!basic) return 1;
  char want[1400];
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  ncclrl_tuner_constants_v5_t constants;
  memset(&constants, 0, sizeof(constants));

  /* v5: load, WARNs for each bad line, decisions */
  nmsgs = 0;
  void* ctx = NULL;
  echo = getenv("HARNESS_ECHO") != NULL;
  CHECK(v5->init(&ctx, 42, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "v5 init");
  CHECK(count_level(NCCLRL_LOG_WARN) == 8, "expected 8 WARNs, got %d", count_level(NCCLRL_LOG_WARN));
  static const char* const bad[][2] = {{"basic.csv:5:", "overlaps line 4"}, {"basic.csv:10:", "field collective"},
                                       {"basic.csv:11:", "field min_bytes"}, {"basic.csv:12:", "field max_bytes"},
                                       {"basic.csv:13:", "field protocol"}, {"basic.csv:14:", "field channels"},
                                       {"basic.csv:15:", "fields"}, {"basic.csv:18:", "both"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    CHECK(find_msg(NCCLRL_LOG_WARN, bad[i][0], bad[i][1]), "no WARN naming %s %s", bad[i][0], bad[i][1]);
  CHECK(find_msg(NCCLRL_LOG_INFO, "TUNER/ncclrl: table from ", "tuner ABI v5"), "no INFO on load");
  snprintf(want, sizeof(want), "table from %s (%zu bytes, 10 rows, fingerprint %016llx): 8 for this communicator "
           "(4 ranks, 1 node), 8 rejected;", path, basic_len, fnv1a(basic, basic_len));
  CHECK(find_msg(NCCLRL_LOG_INFO, want, NULL), "INFO must read '%s'", want);
  for (int i = 0; i < nmsgs; i++) CHECK(strncmp(msgs[i], "TUNER/ncclrl: ", 14) == 0, "prefix: %s", msgs[i]);
  check_cost_version("v5", ctx, 5, v3, (get_cost_fn)v5->getCollInfo);
  CHECK(v5->finalize(ctx) == NCCLRL_SUCCESS, "v5 finalize");

  /* v6: same decisions, plus chunk size from the extra column */
  ctx = NULL;
  CHECK(v6->init(&ctx, 43, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS, "v6 init");
  check_cost_version("v6", ctx, 6, v3, (get_cost_fn)v6->getCollInfo);
  size_t chunk = 12345;
  v6->getChunkSize(ctx, NCCLRL_ALLGATHER, 10000, NCCLRL_RING, NCCLRL_SIMPLE, 6, &chunk);
  CHECK(chunk == 1048576, "v6 chunk %zu", chunk);
  chunk = 12345;
  v6->getChunkSize(ctx, NCCLRL_ALLGATHER, 10000, NCCLRL_TREE, NCCLRL_SIMPLE, 6, &chunk);
  CHECK(chunk == 12345, "v6 chunk for another algorithm must stay NCCL's");
  chunk = 12345;
  v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 100, NCCLRL_TREE, NCCLRL_LL, 2, &chunk);
  CHECK(chunk == 12345, "v6 chunk without a chunk column must stay NCCL's");
  v6->finalize(ctx);

  /* NCCL releases: the version asked and what a row's channels mean there, in the INFO line on load */
  static const struct { int code; int abi; const char* says; } REL[] = {
      {22809, 6, "tuner ABI v6, NCCL 2.28.9: a row's channels replace NCCL's count"},
      {23100, 6, "tuner ABI v6, NCCL 2.31.0: a row's channels cap NCCL's own count (never raise it)"},
      {23206, 7, "tuner ABI v7, NCCL 2.32.6: a row's channels cap NCCL's own count (never raise it)"},
      {0, 6, "tuner ABI v6, NCCL version unknown: a row's channels replace NCCL's count up to 2.30, cap it from"},
      {0, 7, "tuner ABI v7, NCCL version unknown: a row's channels cap NCCL's own count"}};
  const ncclrl_tuner_v7_t* v7 = dlsym(lib, "ncclTunerPlugin_v7");
  CHECK(v7 && v7->getChunkSize && strcmp(v7->name, "ncclrl") == 0, "v7 symbol");
  ncclrl_tuner_constants_v7_t constants7;
  memset(&constants7, 0, sizeof(constants7));
  for (size_t i = 0; v7 && i < sizeof(REL) / sizeof(REL[0]); i++) {
    fake_nccl_code = REL[i].code;
    nmsgs = 0;
    ctx = NULL;
    ncclrl_result_t rc = REL[i].abi == 7 ? v7->init(&ctx, 44, 4, 1, logger, &nvl, &constants7)
                                         : v6->init(&ctx, 44, 4, 1, logger, &nvl, &constants);
    CHECK(rc == NCCLRL_SUCCESS && ctx, "init as NCCL %d", REL[i].code);
    CHECK(find_msg(NCCLRL_LOG_INFO, "TUNER/ncclrl: table from ", REL[i].says), "INFO must say '%s'", REL[i].says);
    if (REL[i].abi == 7) check_cost_version("v7", ctx, 7, v3, (get_cost_fn)v7->getCollInfo);
    v6->finalize(ctx);
  }
  fake_nccl_code = 23100;

  /* an all-IGNORE call (2.31+: NCCL's symmetric kernels ask first): nothing touched, nothing counted */
  ctx = NULL;
  CHECK(v6->init(&ctx, 45, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS, "v6 init");
  {
    float t[7][3];
    for (int a = 0; a < 7; a++)
      for (int q = 0; q < 3; q++) t[a][q] = NCCLRL_COST_IGNORE;
    int nch = 0;
    CHECK(v6->getCollInfo(ctx, NCCLRL_ALLREDUCE, 100, 0, (float**)t, 7, 3, 0, &nch) == NCCLRL_SUCCESS,
          "all-IGNORE call");
    int touched = 0;
    for (int a = 0; a < 7; a++)
      for (int q = 0; q < 3; q++) touched += t[a][q] != NCCLRL_COST_IGNORE;
    CHECK(touched == 0 && nch == 0, "an all-IGNORE call must leave the table (%d changed) and channels (%d)",
          touched, nch);
    /* 2.31+: the call NCCL asks ahead of a collective (numPipeOps 0) is left to NCCL (its symmetric LL
     * kernel gives way or not as without a plugin); before 2.31 numPipeOps 0 is an ordinary call */
    static const int CODES[] = {23100, 0, 22809}; /* 0: no NCCL answers (earlier releases never send 0) */
    for (size_t ci = 0; ci < sizeof(CODES) / sizeof(CODES[0]); ci++) {
      int code = CODES[ci];
      fake_nccl_code = code;
      void* c2 = NULL;
      CHECK(v6->init(&c2, 47, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && c2, "v6 init");
      float u[7][3], before[7][3];
      fill_table(u);
      memcpy(before, u, sizeof(u));
      int n2 = 0;
      v6->getCollInfo(c2, NCCLRL_ALLREDUCE, 100, 0, (float**)u, 7, 3, 0, &n2);
      int same = memcmp(u, before, sizeof(u)) == 0 && n2 == 0;
      int left = code >= 23100 || code == 0;
      CHECK(left ? same : (!same && u[NCCLRL_TREE][NCCLRL_LL] == 0.0f && n2 == 2),
            "NCCL %d, numPipeOps 0: %s", code, left ? "must be left to NCCL" : "takes the row");
      v6->finalize(c2);
    }
    fake_nccl_code = 23100;
    nch = 0; /* a channels-only row (Reduce 5 B: 4 channels) is no decision either when nothing can run */
    v6->getCollInfo(ctx, NCCLRL_REDUCE, 5, 1, (float**)t, 7, 3, 0, &nch);
    CHECK(nch == 0, "an all-IGNORE call must not take a row's channels, got %d", nch);
  }
  v6->finalize(ctx);

  /* a table that states the releases its rows mean the same on: a WARN on any other, the rows still load */
  setenv("NCCLRL_TUNER_TABLE_DATA", "# t\n#ncclrl:nccl-versions=2.27-2.30\nallreduce,0,8191,ring,ll,2,-1,-1\n", 1);
  for (int code = 23100; code >= 22809; code -= 291) {
    fake_nccl_code = code;
    nmsgs = 0;
    ctx = NULL;
    CHECK(v6->init(&ctx, 48, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "v6 init (versions)");
    int warned = find_msg(NCCLRL_LOG_WARN, "means what its rows say on NCCL 2.27-2.30 only; this is NCCL 2.31.0",
                          "cap NCCL's own count");
    CHECK(code == 23100 ? warned && count_level(NCCLRL_LOG_WARN) == 1 : count_level(NCCLRL_LOG_WARN) == 0,
          "NCCL %d: the versions WARN %s", code, code == 23100 ? "is due" : "must not come");
    CHECK(find_msg(NCCLRL_LOG_INFO, "1 rows", "0 rejected"), "the versions line is no row");
    v6->finalize(ctx);
  }

  /* a versions line the plugin cannot read: one WARN naming it, the rows still load, no release WARN */
  setenv("NCCLRL_TUNER_TABLE_DATA", "#ncclrl:nccl-versions=2.30-2.27\nallreduce,0,8191,ring,ll,2,-1,-1\n", 1);
  fake_nccl_code = 23100;
  nmsgs = 0;
  ctx = NULL;
  CHECK(v6->init(&ctx, 49, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "v6 init (bad versions)");
  CHECK(count_level(NCCLRL_LOG_WARN) == 1 && find_msg(NCCLRL_LOG_WARN, ":1: #ncclrl:nccl-versions= needs", NULL),
        "a versions line with its releases reversed: one WARN naming its line");
  CHECK(find_msg(NCCLRL_LOG_INFO, "1 rows", "0 rejected"), "the rows load beside a bad versions line");
  v6->finalize(ctx);

  /* chunk rows: getChunkSize asks per channel slice, after the decisions of its group */
  setenv("NCCLRL_TUNER_TABLE_DATA", "allreduce,0,65535,ring,simple,2,-1,-1,-1,-1,4096\n"
         "allreduce,65536,1048576,ring,simple,4,-1,-1,-1,-1,131072\nallgather,0,4294967295,ring,ll,2,-1,-1\n", 1);
  ctx = NULL;
  CHECK(v6->init(&ctx, 46, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "v6 init (chunk table)");
  {
    float t[7][3];
    int nch = 0;
    size_t ck;
    fill_table(t);
    v6->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1048576, 1, (float**)t, 7, 3, 0, &nch);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 1048576 / 4, NCCLRL_RING, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 131072, "the slice of a 1 MiB AllReduce takes its row's chunk, got %zu", ck);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 1048576 / 4, NCCLRL_TREE, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 7, "a slice run on another algorithm keeps NCCL's chunk, got %zu", ck);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLGATHER, 1048576 / 4, NCCLRL_RING, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 7, "a slice of a collective not decided keeps NCCL's chunk, got %zu", ck);
    /* a new group (decisions after slices): the 1 MiB decision above is done with */
    fill_table(t);
    v6->getCollInfo(ctx, NCCLRL_ALLREDUCE, 60000, 1, (float**)t, 7, 3, 0, &nch);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 200000, NCCLRL_RING, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 7, "a slice larger than its group's decisions keeps NCCL's chunk (no earlier group's), got %zu", ck);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 30000, NCCLRL_RING, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 4096, "the slice of the group's 60000 B AllReduce takes its row's chunk, got %zu", ck);
    /* one group of two AllReduces with different chunks: a slice that fits both is ambiguous */
    fill_table(t);
    v6->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1048576, 1, (float**)t, 7, 3, 0, &nch);
    fill_table(t);
    v6->getCollInfo(ctx, NCCLRL_ALLREDUCE, 60000, 1, (float**)t, 7, 3, 0, &nch);
    float all_ignore[7][3];
    for (int a = 0; a < 7; a++)
      for (int q = 0; q < 3; q++) all_ignore[a][q] = NCCLRL_COST_IGNORE;
    for (int k = 0; k < 40; k++) /* all-IGNORE calls are not decisions: they never push the others out */
      v6->getCollInfo(ctx, NCCLRL_ALLREDUCE, 60000, 0, (float**)all_ignore, 7, 3, 0, &nch);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 30000, NCCLRL_RING, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 7, "a slice that fits two decisions of different chunks keeps NCCL's chunk, got %zu", ck);
    ck = 7;
    v6->getChunkSize(ctx, NCCLRL_ALLREDUCE, 200000, NCCLRL_RING, NCCLRL_SIMPLE, 1, &ck);
    CHECK(ck == 131072, "a slice larger than the small call belongs to the large one, got %zu", ck);
  }
  v6->finalize(ctx);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  fake_nccl_code = 22809;

  /* v4 and v3 */
  ctx = NULL;
  CHECK(v4->init(4, 1, logger, &ctx) == NCCLRL_SUCCESS, "v4 init");
  check_cost_version("v4", ctx, 4, v3, (get_cost_fn)v4->getCollInfo);
  v4->destroy(ctx);
  ctx = NULL;
  CHECK(v3->init(4, 1, logger, &ctx) == NCCLRL_SUCCESS, "v3 init");
  check_cost_version("v3", ctx, 3, v3, NULL);
  v3->destroy(ctx);

  /* v2: algorithm/protocol outputs, only what the call says is available */
  ctx = NULL;
  CHECK(v2->init(4, 1, logger, &ctx) == NCCLRL_SUCCESS, "v2 init");
  int a = -1, p = -1, nch = 0;
  v2->getCollInfo(ctx, NCCLRL_ALLREDUCE, 100, 0, 0, 1, &a, &p, &nch);
  CHECK(a == NCCLRL_TREE && p == NCCLRL_LL && nch == 2, "v2 allreduce: %d/%d/%d", a, p, nch);
  a = p = -1; nch = 0;
  v2->getCollInfo(ctx, NCCLRL_ALLGATHER, 100, 0, 0, 1, &a, &p, &nch);
  CHECK(a == -1 && p == -1 && nch == 0, "v2 must not force PAT");
  a = p = -1; nch = 0;
  v2->getCollInfo(ctx, NCCLRL_ALLGATHER, 5000, 0, 0, 1, &a, &p, &nch);
  CHECK(a == -1 && p == -1, "v2 must not force NVLS without nvlsSupport");
  v2->getCollInfo(ctx, NCCLRL_ALLGATHER, 5000, 0, 1, 1, &a, &p, &nch);
  CHECK(a == NCCLRL_NVLS && p == NCCLRL_SIMPLE && nch == 0, "v2 NVLS with nvlsSupport: %d/%d/%d", a, p, nch);
  v2->destroy(ctx);

  /* a communicator of another shape sees only its rows */
  nmsgs = 0;
  ctx = NULL;
  v5->init(&ctx, 44, 16, 2, logger, &nvl, &constants);
  float t[7][3];
  fill_table(t);
  nch = 0;
  v5->getCollInfo(ctx, NCCLRL_BROADCAST, 10, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(t[NCCLRL_RING][NCCLRL_LL] == 0.0f && nch == 0, "2x16 broadcast row");
  fill_table(t);
  nch = 0;
  v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 65536, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(nch == 0, "the 1-node row must not apply to 2 nodes");
  v5->finalize(ctx);

  /* no file named, none in the working folder: NCCL's defaults, no WARN; unexpected arguments: NCCL decides
   * (a named file that is missing fails init: check_deployment) */
  unsetenv("NCCLRL_TUNER_TABLE");
  nmsgs = 0;
  ctx = NULL;
  CHECK(access("nccl_tuner.conf", F_OK) != 0, "the harness needs a working folder without nccl_tuner.conf");
  CHECK(v5->init(&ctx, 45, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS, "init without a file");
  CHECK(count_level(NCCLRL_LOG_WARN) == 0 && find_msg(NCCLRL_LOG_INFO, "no table at nccl_tuner.conf", NULL),
        "no file anywhere logs INFO");
  fill_table(t);
  nch = 0;
  v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 100, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(nch == 0 && t[NCCLRL_TREE][NCCLRL_LL] != 0.0f, "no table: untouched");
  CHECK(v5->getCollInfo(ctx, 99, 100, 1, (float**)t, 7, 3, 0, &nch) == NCCLRL_SUCCESS, "unknown collType");
  CHECK(v5->getCollInfo(NULL, NCCLRL_ALLREDUCE, 100, 1, (float**)t, 7, 3, 0, &nch) == NCCLRL_SUCCESS, "NULL ctx");
  v5->finalize(ctx);

  /* the example-plugin format file loads cleanly */
  snprintf(path, sizeof(path), "%s/example_format.csv", argv[2]);
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  nmsgs = 0;
  ctx = NULL;
  v5->init(&ctx, 46, 4, 1, logger, &nvl, &constants);
  CHECK(count_level(NCCLRL_LOG_WARN) == 0, "example-format table: %d WARNs", count_level(NCCLRL_LOG_WARN));
  fill_table(t);
  nch = 0;
  v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1 << 20, 1, (float**)t, 7, 3, 0, &nch);
  CHECK(t[NCCLRL_RING][NCCLRL_LL128] == 0.0f && nch == 24, "example-format row");
  v5->finalize(ctx);

  /* the table's content in NCCLRL_TUNER_TABLE_DATA: same rows, same WARNs (naming the variable),
   * same decisions; it wins over NCCLRL_TUNER_TABLE (here example_format.csv) */
  setenv("NCCLRL_TUNER_TABLE_DATA", basic, 1);
  nmsgs = 0;
  ctx = NULL;
  CHECK(v5->init(&ctx, 47, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "v5 init from the environment");
  snprintf(want, sizeof(want), "table from NCCLRL_TUNER_TABLE_DATA (%zu bytes, 10 rows, fingerprint %016llx): 8 for "
           "this communicator", basic_len, fnv1a(basic, basic_len));
  CHECK(find_msg(NCCLRL_LOG_INFO, want, NULL), "INFO must read '%s'", want);
  CHECK(count_level(NCCLRL_LOG_WARN) == 8, "env: expected 8 WARNs, got %d", count_level(NCCLRL_LOG_WARN));
  CHECK(find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_DATA:5:", "overlaps line 4"), "env WARN names the variable");
  CHECK(!find_msg(NCCLRL_LOG_INFO, "example_format.csv", NULL), "the path must not be read when the data is set");
  check_cost_version("env v5", ctx, 5, v3, (get_cost_fn)v5->getCollInfo);
  v5->finalize(ctx);

  /* set but empty: the path is used */
  setenv("NCCLRL_TUNER_TABLE_DATA", "", 1);
  nmsgs = 0;
  ctx = NULL;
  v5->init(&ctx, 48, 4, 1, logger, &nvl, &constants);
  snprintf(want, sizeof(want), "table from %s (", path);
  CHECK(find_msg(NCCLRL_LOG_INFO, want, NULL), "an empty NCCLRL_TUNER_TABLE_DATA must fall back to the path");
  v5->finalize(ctx);

  /* NCCL_TUNER_CONFIG_FILE when NCCLRL_TUNER_TABLE is unset */
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  unsetenv("NCCLRL_TUNER_TABLE");
  snprintf(path, sizeof(path), "%s/shapes.csv", argv[2]);
  setenv("NCCL_TUNER_CONFIG_FILE", path, 1);
  nmsgs = 0;
  ctx = NULL;
  v5->init(&ctx, 49, 4, 2, logger, &nvl, &constants);
  snprintf(want, sizeof(want), "table from %s (", path);
  CHECK(find_msg(NCCLRL_LOG_INFO, want, NULL), "NCCL_TUNER_CONFIG_FILE must be read");
  v5->finalize(ctx);

  /* one table, several communicator shapes: each communicator applies its own rows only */
  static const struct {
    size_t nranks, nnodes;
    int coll;
    size_t nbytes;
    int algo, proto, channels;
  } SHAPES[] = {
      {4, 2, NCCLRL_ALLREDUCE, 100, NCCLRL_TREE, NCCLRL_LL, 2},
      {4, 2, NCCLRL_ALLREDUCE, 1 << 20, NCCLRL_RING, NCCLRL_SIMPLE, 4},
      {4, 2, NCCLRL_ALLGATHER, 100, -1, -1, 0},
      {2, 1, NCCLRL_ALLREDUCE, 100, NCCLRL_RING, NCCLRL_LL, 1},
      {2, 1, NCCLRL_ALLREDUCE, 1 << 20, NCCLRL_RING, NCCLRL_LL128, 3},
      {2, 1, NCCLRL_ALLGATHER, 100, -1, -1, 0},
      {2, 2, NCCLRL_ALLREDUCE, 100, NCCLRL_TREE, NCCLRL_SIMPLE, 5},
      {2, 2, NCCLRL_ALLREDUCE, 1 << 20, NCCLRL_TREE, NCCLRL_SIMPLE, 5},
      {2, 2, NCCLRL_ALLGATHER, 1 << 20, NCCLRL_RING, NCCLRL_SIMPLE, 6},
      {4, 1, NCCLRL_ALLREDUCE, 100, -1, -1, 0},
      {8, 2, NCCLRL_ALLREDUCE, 100, -1, -1, 0},
  };
  for (size_t i = 0; i < sizeof(SHAPES) / sizeof(SHAPES[0]); i++) {
    nmsgs = 0;
    ctx = NULL;
    v5->init(&ctx, 50 + i, SHAPES[i].nranks, SHAPES[i].nnodes, logger, &nvl, &constants);
    CHECK(count_level(NCCLRL_LOG_WARN) == 0, "shape case %zu: %d WARNs", i, count_level(NCCLRL_LOG_WARN));
    CHECK(find_msg(NCCLRL_LOG_INFO, "6 rows", NULL), "shape case %zu: all 6 rows parse", i);
    fill_table(t);
    float before[7][3];
    memcpy(before, t, sizeof(t));
    nch = 0;
    v5->getCollInfo(ctx, SHAPES[i].coll, SHAPES[i].nbytes, 1, (float**)t, 7, 3, 0, &nch);
    int changed = 0, fa = -1, fp = -1;
    for (int x = 0; x < 7; x++)
      for (int y = 0; y < 3; y++)
        if (t[x][y] != before[x][y]) { changed++; fa = x; fp = y; }
    CHECK(SHAPES[i].algo < 0 ? changed == 0 : (changed == 1 && fa == SHAPES[i].algo && fp == SHAPES[i].proto),
          "shape case %zu (%zu ranks, %zu nodes): forced %d/%d (%d changes)", i, SHAPES[i].nranks, SHAPES[i].nnodes,
          fa, fp, changed);
    CHECK(nch == SHAPES[i].channels, "shape case %zu: channels %d, expected %d", i, nch, SHAPES[i].channels);
    v5->finalize(ctx);
  }
  unsetenv("NCCL_TUNER_CONFIG_FILE");

  /* a 1 MiB table in the environment (rows for another shape, then this communicator's) still loads */
  const char* other = "allreduce,0,10,ring,ll,1,7,77\n";
  const char* mine = "allreduce,0,4294967295,ring,ll128,24,1,4\n";
  size_t olen = strlen(other), nrep = (1u << 20) / olen + 1;
  size_t big_len = nrep * olen + strlen(mine);
  char* big = malloc(big_len + 1);
  CHECK(big != NULL, "malloc");
  if (big) {
    for (size_t i = 0; i < nrep; i++) memcpy(big + i * olen, other, olen);
    memcpy(big + nrep * olen, mine, strlen(mine) + 1);
    setenv("NCCLRL_TUNER_TABLE_DATA", big, 1);
    setenv("NCCLRL_TUNER_TABLE", "/nonexistent/ncclrl.csv", 1);
    nmsgs = 0;
    ctx = NULL;
    v5->init(&ctx, 70, 4, 1, logger, &nvl, &constants);
    snprintf(want, sizeof(want), "table from NCCLRL_TUNER_TABLE_DATA (%zu bytes, %zu rows, fingerprint %016llx): 1 for",
             big_len, nrep + 1, fnv1a(big, big_len));
    CHECK(find_msg(NCCLRL_LOG_INFO, want, NULL) && count_level(NCCLRL_LOG_WARN) == 0, "1 MiB table: '%s'", want);
    fill_table(t);
    nch = 0;
    v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1 << 20, 1, (float**)t, 7, 3, 0, &nch);
    CHECK(t[NCCLRL_RING][NCCLRL_LL128] == 0.0f && nch == 24, "1 MiB table: decision");
    v5->finalize(ctx);
    free(big);
  }

  /* 17 MiB (over the 16 MiB cap): refused whole with a WARN, NCCL decides */
  size_t huge_len = 17u << 20;
  char* huge = malloc(huge_len + strlen(mine) + 1);
  CHECK(huge != NULL, "malloc");
  if (huge) {
    memset(huge, '#', huge_len);
    for (size_t i = 79; i < huge_len; i += 80) huge[i] = '\n';
    memcpy(huge + huge_len, mine, strlen(mine) + 1);
    setenv("NCCLRL_TUNER_TABLE_DATA", huge, 1);
    nmsgs = 0;
    ctx = NULL;
    CHECK(v5->init(&ctx, 71, 4, 1, logger, &nvl, &constants) != NCCLRL_SUCCESS && !ctx, "a huge table fails init");
    CHECK(find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_DATA is larger than", "init fails"), "17 MiB table: WARN");
    setenv("NCCLRL_TUNER_ON_ERROR", "fallback", 1);
    nmsgs = 0;
    ctx = NULL;
    CHECK(v5->init(&ctx, 71, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "init with a huge table");
    CHECK(find_msg(NCCLRL_LOG_WARN, "NCCLRL_TUNER_TABLE_DATA is larger than", "NCCL's own decisions"),
          "17 MiB table: WARN");
    fill_table(t);
    nch = 0;
    v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1 << 20, 1, (float**)t, 7, 3, 0, &nch);
    CHECK(t[NCCLRL_RING][NCCLRL_LL128] != 0.0f && nch == 0, "17 MiB table: NCCL decides");
    v5->finalize(ctx);
    /* the same from a file */
    unsetenv("NCCLRL_TUNER_TABLE_DATA");
    char tmp[] = "/tmp/ncclrl-harness-XXXXXX";
    int fd = mkstemp(tmp);
    FILE* f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f != NULL, "temp file");
    if (f) {
      fputs(huge, f);
      fclose(f);
      setenv("NCCLRL_TUNER_TABLE", tmp, 1);
      nmsgs = 0;
      ctx = NULL;
      CHECK(v5->init(&ctx, 72, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS, "fallback: init succeeds");
      CHECK(find_msg(NCCLRL_LOG_WARN, "is larger than", tmp), "17 MiB file: WARN");
      fill_table(t);
      nch = 0;
      v5->getCollInfo(ctx, NCCLRL_ALLREDUCE, 1 << 20, 1, (float**)t, 7, 3, 0, &nch);
      CHECK(t[NCCLRL_RING][NCCLRL_LL128] != 0.0f && nch == 0, "17 MiB file: NCCL decides");
      v5->finalize(ctx);
      unlink(tmp);
    }
    unsetenv("NCCLRL_TUNER_ON_ERROR");
    free(huge);
  }
  free(basic);

  /* the request log: the same decisions, every request in the file (3 in order, the rest counted),
   * and an unwritable folder costs one WARN and nothing else */
  char logdir[] = "/tmp/ncclrl-harness-log-XXXXXX";
  CHECK(mkdtemp(logdir) != NULL, "mkdtemp");
  snprintf(path, sizeof(path), "%s/basic.csv", argv[2]);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  char prefix[1100];
  snprintf(prefix, sizeof(prefix), "%s/req", logdir);
  setenv("NCCLRL_TUNER_REQUEST_LOG", prefix, 1);
  setenv("NCCLRL_TUNER_REQUEST_LOG_MAX", "3", 1);
  nmsgs = 0;
  ctx = NULL;
  CHECK(v5->init(&ctx, 0xabc, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "init with a request log");
  int opened = -1;
  for (int i = 0; i < nmsgs; i++)
    if (levels[i] == NCCLRL_LOG_INFO && strstr(msgs[i], "request log: ")) opened = i;
  CHECK(opened >= 0, "no INFO naming the request log's file");
  char logfile[1200] = "";
  if (opened >= 0) {
    const char* at = strstr(msgs[opened], " go to ");
    const char* end = at ? strstr(at, " at its destroy") : NULL;
    if (at && end && (size_t)(end - at - 7) < sizeof(logfile)) {
      memcpy(logfile, at + 7, (size_t)(end - at - 7));
      logfile[end - at - 7] = '\0';
    }
  }
  CHECK(strncmp(logfile, prefix, strlen(prefix)) == 0, "request log file '%s' is not under %s", logfile, prefix);
  check_cost_version("request log v5", ctx, 5, v3, (get_cost_fn)v5->getCollInfo);
  CHECK(v5->finalize(ctx) == NCCLRL_SUCCESS, "finalize with a request log");
  CHECK(count_level(NCCLRL_LOG_WARN) == 8, "request log: WARNs beyond the table's: %d", count_level(NCCLRL_LOG_WARN));
  size_t log_len = 0;
  char* text = logfile[0] ? read_all(logfile, &log_len) : NULL;
  CHECK(text != NULL, "no request log at '%s'", logfile);
  if (text) {
    snprintf(want, sizeof(want), "# comm_id: 0x0000000000000abc\n# tuner_abi: 5\n# nnodes: 1\n# nranks: 4\n"
             "# requests: %zu\n# recorded: 3\n# max_records: 3\n# dropped: %zu\n# dropped_unkeyed: 0\n",
             NEXPECT, NEXPECT - 3);
    CHECK(strncmp(text, "# ncclrl-tuner-request-log: 1\n# host: ", 38) == 0 && strstr(text, want),
          "request log header:\n%s", text);
    CHECK(strstr(text, "# dropped_count: reduce,5,1\n# dropped_count: reduce,15,1\n") != NULL, "dropped counts");
    CHECK(strstr(text, "collective,nbytes,nnodes,nranks\nallreduce,100,1,4\nallreduce,65535,1,4\n"
                       "allreduce,65536,1,4\n") != NULL && text[log_len - 1] == '\n', "request log rows:\n%s", text);
    free(text);
    unlink(logfile);
  }
  snprintf(want, sizeof(want), "%s.tmp", logfile);
  CHECK(access(want, F_OK) != 0, "the temporary file is left behind");
  rmdir(logdir);
  setenv("NCCLRL_TUNER_REQUEST_LOG", "/nonexistent/ncclrl/req", 1);
  nmsgs = 0;
  ctx = NULL;
  CHECK(v5->init(&ctx, 0xabd, 4, 1, logger, &nvl, &constants) == NCCLRL_SUCCESS && ctx, "init, unwritable log");
  check_cost_version("unwritable request log v5", ctx, 5, v3, (get_cost_fn)v5->getCollInfo);
  v5->finalize(ctx);
  CHECK(count_level(NCCLRL_LOG_WARN) == 9 && find_msg(NCCLRL_LOG_WARN, "request log /nonexistent/ncclrl/req.",
                                                      "cannot create files in /nonexistent/ncclrl"),
        "unwritable request log: one WARN (%d in all)", count_level(NCCLRL_LOG_WARN));
  unsetenv("NCCLRL_TUNER_REQUEST_LOG");
  unsetenv("NCCLRL_TUNER_REQUEST_LOG_MAX");

  check_not_tables(v5);
  check_deployment(lib, v5);
  check_unchecked(lib, v5);
  check_v2_refusals(v2);
  check_filter_limit(v5);
  check_threads(v5, argv[2]);

  dlclose(lib);
  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures ? 1 : 0;
}
