/*
 * ncclrl tuner plugin: loads a tuned table (NVIDIA's example-plugin CSV, plus optional columns of
 * ours) into NCCL through the tuner ABI, versions 2 to 7, from one library.
 *
 * NCCL releases (the version is asked of the NCCL library whose logger init receives, and logged
 * with the ABI it bound): a row means the same on every release, except where NCCL no longer lets
 * a plugin do what the row says, which is logged and left to NCCL:
 *   - channels: up to 2.30 the row's count replaces NCCL's per-call count; from 2.31 NCCL takes
 *     min(row, its own count): a row can lower channels, never raise them;
 *   - a forced entry is set to 0.0 and no entry is ever set to -1 (from 2.31 NCCL no longer skips
 *     a -1 the plugin writes: it would win);
 *   - from 2.31 NCCL may ask first with every entry -1 (its symmetric kernels, one NVLink node):
 *     nothing to decide, so such a call is not counted, logged or explored. It then asks ahead of
 *     the collective (numPipeOps 0) whether its symmetric LL kernel keeps the call: that answer is
 *     left to NCCL, as without a plugin (by default the kernel gives way, and the collective's own
 *     call then takes the row as written), and is not counted either;
 *   - chunk rows (ABI v6+): NCCL asks getChunkSize per channel slice (nChannels 1, the slice's
 *     bytes), after getCollInfo; the row is the one that decided the collective the slice belongs
 *     to (the recent decisions of the same collective whose size the slice fits), and where those
 *     disagree NCCL's chunk is kept.
 *
 * Table rows: collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
 *             [,numPipeOps[,regBuff[,chunk_bytes]]]
 * -1 means "any" for nNodes/nRanks/numPipeOps/regBuff, "keep NCCL's" for algorithm+protocol
 * (both or neither), channels and chunk_bytes (0 also keeps NCCL's channels/chunk).
 *
 * Source, read at every communicator init, first found wins: the content of
 * NCCLRL_TUNER_TABLE_DATA (set and non-empty), the file NCCLRL_TUNER_TABLE, the file
 * NCCL_TUNER_CONFIG_FILE, ./nccl_tuner.conf. A file is read whole into a buffer; one parser works
 * on the bytes either way. The INFO line on load names the source, its size, its row count and
 * the FNV-1a 64-bit fingerprint of its exact bytes (ncclrl.costmodel.table.fingerprint).
 *
 * Rules: a row only forces an (algorithm, protocol) whose cost-table entry NCCL left enabled; an
 * unmatched size, or a disabled entry, leaves NCCL's choice untouched (channels stay 0).
 * Malformed rows, unknown names and rows that overlap an earlier applicable row are rejected at
 * load with a WARN naming the source, line and field (one per row; the overlap check is O(n log n));
 * valid rows still load; no file, a file that is not a regular file (FIFO, directory, device: checked
 * with fstat after a non-blocking open, before any read), a table over 16 MiB, a NUL byte anywhere,
 * or no memory = no table: for a source a variable named, or a file whose FNV-1a fingerprint is not
 * NCCLRL_TUNER_TABLE_FINGERPRINT, the communicator's init fails with a WARN (ranks must never decide
 * differently; NCCLRL_TUNER_ON_ERROR=fallback keeps NCCL's defaults instead, with the WARN); for the
 * unnamed ./nccl_tuner.conf, NCCL's defaults. A table read from a file (./nccl_tuner.conf too) needs
 * NCCLRL_TUNER_TABLE_FINGERPRINT: 16 hex digits, checked against the bytes read, or `any` to opt
 * out; unset, the file is refused with one WARN naming the fingerprint to set, under the same
 * policy (a file can differ between nodes or change between two ranks' inits); the table in
 * NCCLRL_TUNER_TABLE_DATA needs none. Parsing is ASCII-only and ignores the C locale. Under
 * ABI v2 a row's algorithm is written only where NCCL 2.21 runs it for that collective. Lookups are binary searches over per-collective arrays
 * built at init: no allocation, no locking (read-only after init), and the same answer on every
 * rank that reads the same bytes.
 *
 * Request log (opt-in, NCCLRL_TUNER_REQUEST_LOG=PREFIX): each communicator's context keeps every
 * getCollInfo request (collType, nBytes) in order in memory, up to NCCLRL_TUNER_REQUEST_LOG_MAX
 * records (default 100000; past it only counts per (collType, nBytes)), and writes them at its
 * destroy/finalize to PREFIX.HOST.PID.N.csv (N: the process's logging contexts in init order),
 * through a temporary file renamed into place. It reads nothing back and never changes a decision;
 * a failure is one WARN and NCCL carries on (a folder that cannot be written: no log for that
 * context; no memory while recording: counts only from there). Thread safety: NCCL calls a
 * communicator's tuner context from one thread at a time (a communicator is not used
 * concurrently), so a context's log takes no lock; the only state shared between contexts is the
 * file counter N, an atomic.
 */
#define _GNU_SOURCE /* dladdr, RTLD_NOLOAD: asking the NCCL that loaded us for its version */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ncclrl_tuner_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define PREFIX "TUNER/ncclrl: "
#define MAX_FIELDS 11
#define MAX_LINE 4096
#define MAX_CHANNELS 64
#define MAX_KEYS 16 /* distinct (numPipeOps, regBuff) filters per collective */
#define CHUNK_MEMO 32 /* recent decisions getChunkSize looks back on (a group of collectives, then its slices) */
#define NCCL_2_31 23100 /* from here a row's channels cap NCCL's own, and all-IGNORE calls come */
#define MAX_TABLE_BYTES (16 << 20) /* a larger table is refused whole: NCCL decides */
#define DATA_ENV "NCCLRL_TUNER_TABLE_DATA"
#define FINGERPRINT_ENV "NCCLRL_TUNER_TABLE_FINGERPRINT"
#define ON_ERROR_ENV "NCCLRL_TUNER_ON_ERROR"
#define REQLOG_ENV "NCCLRL_TUNER_REQUEST_LOG"
#define REQLOG_MAX_ENV "NCCLRL_TUNER_REQUEST_LOG_MAX"
#define REQLOG_FORMAT 1
#define REQLOG_DEFAULT_MAX 100000
#define REQLOG_MAX_LIMIT (1 << 26)   /* ordered records at most: 512 MiB of 8-byte records */
#define REQLOG_FIRST_CAP 4096        /* records allocated at init (32 KiB), doubled as needed up to the cap */
#define REQLOG_FIRST_KEYS 64         /* slots of the past-the-cap count table at first use */
#define REQLOG_MAX_KEYS (1 << 16)    /* slots at most; a new key past half of them is counted as unkeyed */
#define REQLOG_COLL_SHIFT 56         /* a record: collType in the top 8 bits, nBytes in the low 56 (saturated) */
#define REQLOG_NBYTES_MASK ((UINT64_C(1) << REQLOG_COLL_SHIFT) - 1)
#define REQLOG_OTHER_COLL 0xff       /* a collType outside 0..254 */
#define REQLOG_HOST_MAX 256
#define REQLOG_IO_BUFFER (1 << 16)
#define REQLOG_CWD_MAX 4096

typedef struct {
  uint64_t lo, hi;
  uint64_t chunk;
  int32_t nnodes, nranks, pipe;
  int16_t channels;
  int8_t coll, algo, proto, regbuff;
  int32_t line;
} row_t;

typedef struct {
  int32_t pipe;
  int8_t regbuff;
  int32_t n;
  row_t* rows; /* sorted by lo, non-overlapping */
} part_t;

typedef struct {
  uint64_t key; /* a record (collType, nBytes) */
  uint64_t count; /* 0: empty slot */
} reqkey_t;

/* One context's request log; on == 0 when NCCLRL_TUNER_REQUEST_LOG is unset or its folder cannot be written. */
typedef struct {
  int on, warned;
  unsigned context;
  uint64_t comm_id;
  int has_comm_id;
  long pid;
  char host[REQLOG_HOST_MAX];
  char* path; /* PREFIX.HOST.PID.N.csv */
  uint64_t* recs; /* in request order */
  size_t n, cap, max;
  reqkey_t* keys; /* open addressing, power-of-two slots, at most half used */
  size_t nkeys, keycap;
  uint64_t requests, unkeyed;
} reqlog_t;

typedef struct {
  ncclrl_logger_t log;
  int version;   /* the tuner ABI NCCL bound */
  int nccl_code; /* NCCL's version code (2.31.0: 23100), 0 when it could not be asked */
  int trace;
  size_t nranks, nnodes;
  part_t parts[NCCLRL_NUM_COLLS][MAX_KEYS];
  int nparts[NCCLRL_NUM_COLLS];
  row_t* storage;
  int nrows, rejected, applicable;
  int nccl_choice; /* rows marked as stating NCCL's choice for other plugins: left to NCCL here */
  int strict;     /* a table is required: its source was named by a variable, or its fingerprint is expected */
  int fail;       /* strict, and NCCLRL_TUNER_ON_ERROR is not fallback: a table not loaded fails this init */
  int has_expect; /* NCCLRL_TUNER_TABLE_FINGERPRINT was given: expect */
  int unchecked;  /* NCCLRL_TUNER_TABLE_FINGERPRINT=any: a table file loads without its fingerprint checked */
  uint64_t expect;
  int loaded;     /* the table was read, matched the expected fingerprint, and is indexed */
  uint64_t table_fp; /* the loaded table's fingerprint (0: none loaded); online ranks compare it at HELLO */
  char path[512];
  int versions_lo, versions_hi; /* the table's NCCL releases (its NCCL_VERSIONS_MARK line); 0: not stated */
  int has_chunk; /* some row sets chunk_bytes: decisions are remembered for getChunkSize */
  struct { int coll; size_t nbytes; const row_t* row; } memo[CHUNK_MEMO];
  unsigned memo_next;
  unsigned memo_group;  /* memo_next when the current group of decisions began (the first after a slice) */
  int memo_sliced;      /* getChunkSize came since the last decision: the next decision starts a group */
  reqlog_t reqlog;
  struct ocomm* online; /* online mode's state of this communicator (NCCLRL_TUNER_MODE=online), or NULL */
} ctx_t;

static const char* const COLL_NAMES[NCCLRL_NUM_COLLS] = {"broadcast", "reduce", "allgather", "reducescatter",
                                                         "allreduce"};
static const char* const ALGO_NAMES[NCCLRL_NUM_ALGOS] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                                         "nvls", "nvls_tree", "pat"};
static const char* const PROTO_NAMES[NCCLRL_NUM_PROTOS] = {"ll", "ll128", "simple"};
static const char* const FIELD_NAMES[MAX_FIELDS] = {"collective", "min_bytes", "max_bytes", "algorithm", "protocol",
                                                    "channels", "nNodes", "nRanks", "numPipeOps", "regBuff",
                                                    "chunk_bytes"};

static void nolog(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level; (void)flags; (void)file; (void)line; (void)fmt;
}

#define LOG(ctx, level, ...) (ctx)->log((level), NCCLRL_SUBSYS_TUNING, __FILE__, __LINE__, __VA_ARGS__)

/* NCCL's version code (2.31.0: 23100), asked of the library that holds NCCL's logger (PyTorch loads
 * NCCL privately, so a global lookup alone would miss it), else of the process's global scope; 0 when
 * neither answers. Asked at each communicator's init (a few microseconds). */
static int nccl_version_code(ncclrl_logger_t logger) {
  typedef int (*getver_t)(int*);
  getver_t f = NULL;
  Dl_info info;
  void* h = NULL;
  if (logger && dladdr((void*)logger, &info) && info.dli_fname && info.dli_fname[0])
    h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (h) f = (getver_t)dlsym(h, "ncclGetVersion");
  if (!f) f = (getver_t)dlsym(RTLD_DEFAULT, "ncclGetVersion");
  int code = 0;
  int v = f && f(&code) == 0 && code >= 20000 && code < 1000000 ? code : 0;
  if (h) dlclose(h);
  return v;
}

/* NCCL's release as text, and what a row's channels mean there (the INFO line on load says both). */
static const char* nccl_semantics(const ctx_t* ctx) {
  static _Thread_local char buf[160];
  int v = ctx->nccl_code;
  if (v > 0)
    snprintf(buf, sizeof(buf), "NCCL %d.%d.%d: %s", v / 10000, v / 100 % 100, v % 100,
             v >= NCCL_2_31 ? "a row's channels cap NCCL's own count (never raise it)"
                            : "a row's channels replace NCCL's count");
  else
    snprintf(buf, sizeof(buf), "NCCL version unknown: %s", ctx->version >= 7
             ? "a row's channels cap NCCL's own count (never raise it)"
             : "a row's channels replace NCCL's count up to 2.30, cap it from 2.31");
  return buf;
}

/* What a table that is not loaded means for this communicator, as its WARN ends. */
static const char* outcome(const ctx_t* ctx) {
  return ctx->fail ? "this communicator's init fails (" ON_ERROR_ENV "=fallback keeps NCCL's own decisions instead)"
                   : "NCCL's own decisions everywhere";
}

static int name_index(const char* s, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

/* ASCII character classes and case, whatever the process's locale: an application's setlocale()
 * (a decimal comma in LC_NUMERIC, Turkish case rules in LC_CTYPE) never changes how a table reads. */
static int ascii_space(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }
static int ascii_digit(int c) { return c >= '0' && c <= '9'; }
static int ascii_alnum(int c) { return ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }
static int ascii_caseeq(const char* a, const char* b) {
  for (; *a && *b; a++, b++)
    if (ascii_lower(*a) != ascii_lower(*b)) return 0;
  return *a == *b;
}

/* A whole decimal number (optional sign, ASCII digits only, no locale) in [lo, hi], or "max"
 * (4294967295); returns 0 on success, -1 otherwise (*out untouched). */
static int parse_int(const char* s, long long lo, long long hi, long long* out) {
  long long v;
  if (strcmp(s, "max") == 0) {
    v = 4294967295LL;
  } else {
    const char* p = s;
    int neg = 0;
    if (*p == '-' || *p == '+') neg = *p++ == '-';
    if (*p == '\0') return -1;
    const uint64_t limit = UINT64_C(1) << 63; /* the magnitude of INT64_MIN */
    uint64_t m = 0;
    for (; *p; p++) {
      if (!ascii_digit((unsigned char)*p)) return -1;
      unsigned d = (unsigned)(*p - '0');
      if (m > (limit - d) / 10) return -1; /* out of range of a 64-bit integer */
      m = m * 10 + d;
    }
    if (!neg && m == limit) return -1;
    v = neg ? (m == limit ? INT64_MIN : -(long long)m) : (long long)m;
  }
  if (v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static char* trim(char* s) {
  while (ascii_space((unsigned char)*s)) s++;
  char* e = s + strlen(s);
  while (e > s && ascii_space((unsigned char)e[-1])) *--e = '\0';
  return s;
}

static void lower(char* s) {
  for (; *s; s++) *s = ascii_lower(*s);
}

/* A comment line that marks the next row as stating NCCL's own choice (the replica's prediction),
 * written so that plugins which need every size covered (NVIDIA's example) run that choice; this
 * plugin skips the row and leaves the call to NCCL, whose real choice it is. */
#define NCCL_CHOICE_MARK "#ncclrl:nccl-choice"
#define NCCL_VERSIONS_MARK "#ncclrl:nccl-versions=" /* M.m-M.m: the releases the rows mean the same on */

/* Parse one line into *r. Returns 1 for a row, 0 for blank/comment, -1 for an error (logged). */
static int parse_line(ctx_t* ctx, const char* path, int lineno, char* line, row_t* r) {
  char* s = trim(line);
  if (*s == '\0' || *s == '#') return 0;
  char* fields[MAX_FIELDS + 1];
  int nf = 0;
  /* split by hand: strtok_r would merge empty fields */
  char* p = s;
  for (;;) {
    char* comma = strchr(p, ',');
    if (nf > MAX_FIELDS) break;
    fields[nf++] = p;
    if (!comma) break;
    *comma = '\0';
    p = comma + 1;
  }
  if (nf < 8 || nf > MAX_FIELDS) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: has %d fields; expected 8 to %d "
        "(collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff[,chunk_bytes]]])",
        path, lineno, nf, MAX_FIELDS);
    return -1;
  }
  for (int i = 0; i < nf; i++) { fields[i] = trim(fields[i]); }
  long long v[MAX_FIELDS];
  memset(r, 0, sizeof(*r));
  r->line = lineno;
  lower(fields[0]);
  int c = name_index(fields[0], COLL_NAMES, NCCLRL_NUM_COLLS);
  if (c < 0) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field collective: unknown value '%s'; allowed: broadcast, reduce, "
        "allgather, reducescatter, allreduce", path, lineno, fields[0]);
    return -1;
  }
  r->coll = (int8_t)c;
  static const long long lo_lim[MAX_FIELDS] = {0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1};
  static const long long hi_lim[MAX_FIELDS] = {0, INT64_MAX, INT64_MAX, 0, 0, MAX_CHANNELS, 1 << 20, 1 << 24,
                                               1 << 20, 1, INT64_MAX};
  for (int i = 1; i < nf; i++) {
    if (i == 3 || i == 4) continue;
    if (parse_int(fields[i], lo_lim[i], hi_lim[i], &v[i]) != 0 || ((i == 6 || i == 7 || i == 8) && v[i] == 0)) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field %s: '%s' is not allowed; expected %s", path, lineno,
          FIELD_NAMES[i], fields[i],
          i <= 2 ? "a whole number of bytes >= 0 (or max)" :
          i == 5 ? "-1, 0 (keep NCCL's) or 1..64" :
          i == 9 ? "-1 (any), 0 or 1" :
          i == 10 ? "-1/0 (keep NCCL's) or bytes > 0" : "-1 (any) or a whole number >= 1");
      return -1;
    }
  }
  if (v[1] > v[2]) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field max_bytes: %lld is below min_bytes %lld", path, lineno, v[2], v[1]);
    return -1;
  }
  lower(fields[3]);
  lower(fields[4]);
  int a = strcmp(fields[3], "-1") == 0 ? -1 : name_index(fields[3], ALGO_NAMES, NCCLRL_NUM_ALGOS);
  if (a < 0 && strcmp(fields[3], "-1") != 0) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field algorithm: unknown value '%s'; allowed: tree, ring, "
        "collnet_direct, collnet_chain, nvls, nvls_tree, pat, -1", path, lineno, fields[3]);
    return -1;
  }
  int q = strcmp(fields[4], "-1") == 0 ? -1 : name_index(fields[4], PROTO_NAMES, NCCLRL_NUM_PROTOS);
  if (q < 0 && strcmp(fields[4], "-1") != 0) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field protocol: unknown value '%s'; allowed: ll, ll128, simple, -1",
        path, lineno, fields[4]);
    return -1;
  }
  if ((a < 0) != (q < 0)) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field %s: algorithm and protocol must both be set or both be -1",
        path, lineno, a < 0 ? "algorithm" : "protocol");
    return -1;
  }
  r->lo = (uint64_t)v[1];
  r->hi = (uint64_t)v[2];
  r->algo = (int8_t)a;
  r->proto = (int8_t)q;
  r->channels = (int16_t)(v[5] > 0 ? v[5] : 0);
  r->nnodes = (int32_t)v[6];
  r->nranks = (int32_t)v[7];
  r->pipe = nf > 8 ? (int32_t)v[8] : -1;
  r->regbuff = nf > 9 ? (int8_t)v[9] : -1;
  r->chunk = (nf > 10 && v[10] > 0) ? (uint64_t)v[10] : 0;
  if (a < 0 && r->channels == 0 && r->chunk == 0) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field channels: the row changes nothing (algorithm, protocol, "
        "channels and chunk all keep NCCL's)", path, lineno);
    return -1;
  }
  return 1;
}

/* FNV-1a (64-bit) of the table's exact bytes: the fingerprint ranks and ncclrl compare. */
static uint64_t fnv1a64(const char* buf, size_t len) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)buf[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

/* Every line of a table text, in order: the well-formed rows of every communicator shape go to
 * *out (*n of them, file order), each rejected line is one WARN (ctx->rejected counts them).
 * Returns 0, or -1 when out of memory (logged; nothing kept). */
static int parse_text(ctx_t* ctx, const char* origin, const char* text, size_t len, row_t** out, int* n) {
  int cap = 256, count = 0;
  row_t* rows = malloc(sizeof(row_t) * (size_t)cap);
  *out = NULL;
  *n = 0;
  if (!rows) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s: %s", origin, outcome(ctx));
    return -1;
  }
  char line[MAX_LINE];
  int lineno = 0, nccl_choice = 0;
  const char* p = text;
  const char* end = text + len;
  while (p < end) {
    const char* nl = memchr(p, '\n', (size_t)(end - p));
    size_t line_len = (size_t)((nl ? nl : end) - p);
    const char* start = p;
    p = nl ? nl + 1 : end;
    lineno++;
    if (line_len > MAX_LINE - 2) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: line longer than %d characters; rejected", origin, lineno,
          MAX_LINE - 2);
      ctx->rejected++;
      continue;
    }
    memcpy(line, start, line_len);
    line[line_len] = '\0';
    if (strncmp(trim(line), NCCL_VERSIONS_MARK, sizeof(NCCL_VERSIONS_MARK) - 1) == 0) {
      unsigned a, b, c, d;
      char tail;
      const char* v = trim(line) + sizeof(NCCL_VERSIONS_MARK) - 1;
      if (ascii_digit((unsigned char)v[0]) && sscanf(v, "%u.%u-%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a < 100 && b < 100 &&
          c < 100 && d < 100 && a * 100 + b <= c * 100 + d) {
        ctx->versions_lo = (int)(a * 10000 + b * 100);
        ctx->versions_hi = (int)(c * 10000 + d * 100 + 99);
      } else {
        LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: %s needs MAJOR.MINOR-MAJOR.MINOR, lowest first (2.27-2.30); "
            "line ignored", origin, lineno, NCCL_VERSIONS_MARK);
      }
      continue;
    }
    if (strncmp(trim(line), NCCL_CHOICE_MARK, sizeof(NCCL_CHOICE_MARK) - 1) == 0) {
      nccl_choice = 1; /* the next row states NCCL's predicted choice for plugins that need every size covered */
      continue;
    }
    row_t r;
    int rc = parse_line(ctx, origin, lineno, line, &r);
    if (rc < 0) { ctx->rejected++; nccl_choice = 0; continue; }
    if (rc == 0) continue;
    if (nccl_choice) { /* NCCL decides that size itself here: its real choice, not a prediction of it */
      nccl_choice = 0;
      ctx->nccl_choice++;
      continue;
    }
    if (count == cap) {
      row_t* bigger = cap <= INT32_MAX / 2 ? realloc(rows, sizeof(row_t) * (size_t)cap * 2) : NULL;
      if (!bigger) {
        /* a partial table could differ between ranks: apply none of it */
        free(rows);
        LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s at line %d: %s",
            origin, lineno, outcome(ctx));
        return -1;
      }
      rows = bigger;
      cap *= 2;
    }
    rows[count++] = r;
  }
  *out = rows;
  *n = count;
  return 0;
}

/* ---- overlap check: O(n log n) ----
 * Rows are checked in file order: a row is rejected when its range overlaps a row accepted before
 * it for the same collective whose numPipeOps/regBuff filters are compatible (equal, or either -1).
 * "Some accepted row of a set S overlaps [lo, hi]" is "the largest max_bytes among the accepted rows
 * of S with min_bytes <= hi is >= lo": a prefix maximum over S sorted by min_bytes, kept in a
 * Fenwick tree. Four orders hold every set a query needs: rows by (collective, numPipeOps,
 * regBuff), by (collective, regBuff), by (collective, numPipeOps) and by collective alone. */
enum { ORD_EXACT, ORD_REG, ORD_PIPE, ORD_ALL, NUM_ORDS };

typedef struct {
  int64_t group;
  uint64_t lo;
  int32_t row; /* index into the rows, file order */
} okey_t;

typedef struct {
  uint64_t hi1; /* max_bytes + 1 of an accepted row, 0: none */
  int32_t line;
} best_t;

typedef struct {
  okey_t* keys;   /* sorted by (group, lo, row) */
  int32_t* pos;   /* row -> its place in keys */
  int32_t* start; /* place -> first place of its group */
  int32_t* end;   /* place -> one past the last place of its group */
  best_t* fw;     /* per group, a Fenwick tree over its places (1-based within the group) */
} order_t;

static int64_t order_group(int kind, int coll, int32_t pipe, int regbuff) {
  int64_t g = (int64_t)coll << 40;
  if (kind == ORD_EXACT || kind == ORD_PIPE) g |= ((int64_t)pipe + 1) << 2;
  if (kind == ORD_EXACT || kind == ORD_REG) g |= (int64_t)(regbuff + 1);
  return g;
}

/* Stable LSD radix sort by (group, lo), bytes of lo first, then of group; the keys arrive in row
 * (file) order, so ties stay in it. A byte every key shares costs one counting pass and no move. */
static int radix_sort(okey_t* a, okey_t* tmp, int n) {
  static const int PASSES = 16;
  size_t (*count)[256] = calloc((size_t)PASSES, sizeof(*count));
  if (!count) return -1;
  for (int i = 0; i < n; i++) { /* every pass's histogram in one read */
    uint64_t lo = a[i].lo, g = (uint64_t)a[i].group;
    for (int b = 0; b < 8; b++) { count[b][(lo >> (8 * b)) & 0xff]++; count[8 + b][(g >> (8 * b)) & 0xff]++; }
  }
  okey_t* src = a;
  okey_t* dst = tmp;
  for (int pass = 0; pass < PASSES; pass++) {
    int shift = (pass % 8) * 8, same = 0;
    for (int b = 0; b < 256; b++) same |= count[pass][b] == (size_t)n;
    if (same || n == 0) continue;
    size_t sum = 0;
    for (int b = 0; b < 256; b++) { size_t c = count[pass][b]; count[pass][b] = sum; sum += c; }
    for (int i = 0; i < n; i++)
      dst[count[pass][(pass < 8 ? src[i].lo >> shift : (uint64_t)src[i].group >> shift) & 0xff]++] = src[i];
    okey_t* t = src; src = dst; dst = t;
  }
  if (src != a) memcpy(a, src, sizeof(okey_t) * (size_t)n);
  free(count);
  return 0;
}

static int better(best_t a, best_t b) { return a.hi1 > b.hi1 || (a.hi1 == b.hi1 && a.hi1 && a.line < b.line); }

/* The best accepted row of group g with min_bytes <= hi (hi1 0: none). */
static best_t order_query(const order_t* o, int n, int64_t g, uint64_t hi) {
  best_t best = {0, 0};
  int lo_i = 0, hi_i = n; /* first place of group g */
  while (lo_i < hi_i) {
    int mid = lo_i + (hi_i - lo_i) / 2;
    if (o->keys[mid].group < g) lo_i = mid + 1; else hi_i = mid;
  }
  if (lo_i >= n || o->keys[lo_i].group != g) return best;
  int s = lo_i, e = o->end[lo_i];
  int a = s, b = e; /* first place of the group with min_bytes > hi */
  while (a < b) {
    int mid = a + (b - a) / 2;
    if (o->keys[mid].lo <= hi) a = mid + 1; else b = mid;
  }
  for (int i = a - s; i > 0; i -= i & -i)
    if (better(o->fw[s + i - 1], best)) best = o->fw[s + i - 1];
  return best;
}

static void order_insert(order_t* o, int row, best_t v) {
  int p = o->pos[row], s = o->start[p], len = o->end[p] - s;
  for (int i = p - s + 1; i <= len; i += i & -i)
    if (better(v, o->fw[s + i - 1])) o->fw[s + i - 1] = v;
}

static void order_free(order_t* o) {
  free(o->keys); free(o->pos); free(o->start); free(o->end); free(o->fw);
}

static int order_build(order_t* o, int kind, const row_t* rows, int n, okey_t* tmp) {
  memset(o, 0, sizeof(*o));
  size_t m = n > 0 ? (size_t)n : 1;
  o->keys = malloc(m * sizeof(okey_t));
  o->pos = malloc(m * sizeof(int32_t));
  o->start = malloc(m * sizeof(int32_t));
  o->end = malloc(m * sizeof(int32_t));
  o->fw = calloc(m, sizeof(best_t));
  if (!o->keys || !o->pos || !o->start || !o->end || !o->fw) { order_free(o); return -1; }
  for (int i = 0; i < n; i++) {
    o->keys[i].group = order_group(kind, rows[i].coll, rows[i].pipe, rows[i].regbuff);
    o->keys[i].lo = rows[i].lo;
    o->keys[i].row = i;
  }
  if (radix_sort(o->keys, tmp, n) != 0) { order_free(o); return -1; }
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && o->keys[j].group == o->keys[i].group) j++;
    for (int k = i; k < j; k++) { o->start[k] = i; o->end[k] = j; o->pos[o->keys[k].row] = k; }
    i = j;
  }
  return 0;
}

/* Line of an accepted row that clashes with r (0: none). */
static int find_clash(const order_t* ords, int n, const row_t* r) {
  int64_t g[4];
  const order_t* o[4];
  int k = 0;
  if (r->pipe != -1 && r->regbuff != -1) {
    for (int x = 0; x < 4; x++) {
      o[k] = &ords[ORD_EXACT];
      g[k++] = order_group(ORD_EXACT, r->coll, x & 1 ? -1 : r->pipe, x & 2 ? -1 : r->regbuff);
    }
  } else if (r->pipe == -1 && r->regbuff != -1) {
    o[k] = &ords[ORD_REG]; g[k++] = order_group(ORD_REG, r->coll, -1, r->regbuff);
    o[k] = &ords[ORD_REG]; g[k++] = order_group(ORD_REG, r->coll, -1, -1);
  } else if (r->pipe != -1) {
    o[k] = &ords[ORD_PIPE]; g[k++] = order_group(ORD_PIPE, r->coll, r->pipe, -1);
    o[k] = &ords[ORD_PIPE]; g[k++] = order_group(ORD_PIPE, r->coll, -1, -1);
  } else {
    o[k] = &ords[ORD_ALL]; g[k++] = order_group(ORD_ALL, r->coll, -1, -1);
  }
  for (int i = 0; i < k; i++) {
    best_t b = order_query(o[i], n, g[i], r->hi);
    if (b.hi1 && b.hi1 - 1 >= r->lo) return b.line;
  }
  return 0;
}

/* The rows of this communicator's shape that load: rows of other shapes are dropped silently; a
 * row overlapping an accepted one (above), or past MAX_KEYS distinct numPipeOps/regBuff filters of
 * its collective, is rejected with one WARN each. rows (file order, n of them) is compacted in
 * place and sorted by (collective, numPipeOps, regBuff, min_bytes); returns how many are left, or
 * -1 when out of memory (logged). */
static int select_rows(ctx_t* ctx, const char* origin, row_t* rows, int n) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    const row_t* r = &rows[i];
    if ((r->nnodes != -1 && (size_t)r->nnodes != ctx->nnodes) || (r->nranks != -1 && (size_t)r->nranks != ctx->nranks))
      continue;
    rows[m++] = *r;
  }
  order_t ords[NUM_ORDS];
  int built = 0;
  okey_t* tmp = malloc(sizeof(okey_t) * (m > 0 ? (size_t)m : 1));
  row_t* sorted = malloc(sizeof(row_t) * (m > 0 ? (size_t)m : 1));
  char* accepted = calloc(m > 0 ? (size_t)m : 1, 1);
  /* only the orders some row queries are kept up to date; the first also sorts the result */
  int used[NUM_ORDS] = {0, 0, 0, 0};
  for (int i = 0; i < m; i++)
    used[rows[i].pipe == -1 ? (rows[i].regbuff == -1 ? ORD_ALL : ORD_REG) : (rows[i].regbuff == -1 ? ORD_PIPE : 0)] = 1;
  int queried_exact = used[ORD_EXACT];
  used[ORD_EXACT] = 1;
  memset(ords, 0, sizeof(ords));
  if (tmp && sorted && accepted)
    for (; built < NUM_ORDS; built++)
      if (used[built] && order_build(&ords[built], built, rows, m, tmp) != 0) break;
  free(tmp);
  if (built < NUM_ORDS) {
    for (int k = 0; k < built; k++) order_free(&ords[k]);
    free(sorted);
    free(accepted);
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory checking %s: %s", origin, outcome(ctx));
    return -1;
  }
  for (int i = 0; i < m; i++) {
    const row_t* r = &rows[i];
    int clash = find_clash(ords, m, r);
    if (clash) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field min_bytes: range %llu-%llu of %s overlaps line %d; rejected",
          origin, r->line, (unsigned long long)r->lo, (unsigned long long)r->hi, COLL_NAMES[(int)r->coll], clash);
      ctx->rejected++;
      continue;
    }
    best_t v = {r->hi + 1, r->line};
    for (int k = 0; k < NUM_ORDS; k++)
      if (used[k] && (k != ORD_EXACT || queried_exact)) order_insert(&ords[k], i, v);
    accepted[i] = 1;
  }
  /* the accepted rows in the first order: by (collective, numPipeOps, regBuff, min_bytes) */
  int kept = 0;
  for (int p = 0; p < m; p++) {
    int i = ords[ORD_EXACT].keys[p].row;
    if (accepted[i]) sorted[kept++] = rows[i];
  }
  memcpy(rows, sorted, sizeof(row_t) * (size_t)kept);
  for (int k = 0; k < NUM_ORDS; k++) order_free(&ords[k]);
  free(sorted);
  free(accepted);
  /* at most MAX_KEYS (numPipeOps, regBuff) groups per collective, the first in that order */
  int out = 0, keys = 0;
  for (int i = 0; i < kept;) {
    int j = i;
    while (j < kept && rows[j].coll == rows[i].coll && rows[j].pipe == rows[i].pipe &&
           rows[j].regbuff == rows[i].regbuff) j++;
    keys = (i > 0 && rows[i - 1].coll == rows[i].coll) ? keys + 1 : 1;
    for (int k = i; k < j; k++) {
      if (keys > MAX_KEYS) {
        LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field numPipeOps: more than %d distinct numPipeOps/regBuff "
            "filters for %s; rejected", origin, rows[k].line, MAX_KEYS, COLL_NAMES[(int)rows[k].coll]);
        ctx->rejected++;
      } else {
        rows[out++] = rows[k];
      }
    }
    i = j;
  }
  return out;
}

/* Parse, validate and index a table text of len bytes for this communicator; origin names it in
 * log lines (a path, or the environment variable). Never fails: problems are WARNs, and anything
 * odd leaves NCCL's decisions in place. */
static void load_text(ctx_t* ctx, const char* origin, const char* text, size_t len) {
  snprintf(ctx->path, sizeof(ctx->path), "%s", origin);
  uint64_t hash = fnv1a64(text, len);
  if (ctx->has_expect && hash != ctx->expect) { /* another file, or another version of it, than the deployment's */
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s has fingerprint %016llx, not the %016llx that " FINGERPRINT_ENV
        " expects (%zu bytes; other ranks may read other bytes): %s", origin, (unsigned long long)hash,
        (unsigned long long)ctx->expect, len, outcome(ctx));
    return;
  }
  const char* nul = memchr(text, '\0', len);
  if (nul) { /* not a text table (a binary, or a file preallocated and not yet written) */
    int lineno = 1;
    for (const char* q = text; q < nul; q++) lineno += *q == '\n';
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s holds a NUL byte at offset %zu (line %d): not a text table; %s "
        "(%zu bytes, fingerprint %016llx)", origin, (size_t)(nul - text), lineno, outcome(ctx), len,
        (unsigned long long)hash);
    return;
  }
  row_t* rows = NULL;
  int n = 0;
  if (parse_text(ctx, origin, text, len, &rows, &n) != 0) return;
  ctx->nrows = n + ctx->nccl_choice; /* every well-formed row of the text, those left to NCCL included */
  n = select_rows(ctx, origin, rows, n);
  if (n < 0) {
    free(rows);
    ctx->nrows = 0;
    return;
  }
  for (int i = 0; i < n;) {
    int c = rows[i].coll, j = i;
    while (j < n && rows[j].coll == c && rows[j].pipe == rows[i].pipe && rows[j].regbuff == rows[i].regbuff) j++;
    part_t* part = &ctx->parts[c][ctx->nparts[c]++]; /* select_rows left at most MAX_KEYS per collective */
    part->pipe = rows[i].pipe;
    part->regbuff = rows[i].regbuff;
    part->rows = rows + i;
    part->n = j - i;
    i = j;
  }
  ctx->storage = rows;
  ctx->applicable = n;
  for (int i = 0; i < n; i++) ctx->has_chunk |= rows[i].chunk > 0;
  ctx->loaded = 1;
  ctx->table_fp = hash;
  char marked[96] = "";
  if (ctx->nccl_choice)
    snprintf(marked, sizeof(marked), ", %d marked as NCCL's choice (left to NCCL)", ctx->nccl_choice);
  LOG(ctx, NCCLRL_LOG_INFO, PREFIX "table from %s (%zu bytes, %d rows, fingerprint %016llx): %d for this "
      "communicator (%zu rank%s, %zu node%s), %d rejected%s; tuner ABI v%d, %s", origin, len, ctx->nrows,
      (unsigned long long)hash, ctx->applicable, ctx->nranks, ctx->nranks == 1 ? "" : "s", ctx->nnodes,
      ctx->nnodes == 1 ? "" : "s", ctx->rejected, marked, ctx->version,
      nccl_semantics(ctx));
  int v = ctx->nccl_code;
  if (ctx->versions_hi && v > 0 && (v < ctx->versions_lo || v > ctx->versions_hi))
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table from %s means what its rows say on NCCL %d.%d-%d.%d only; this is NCCL "
        "%d.%d.%d: rows are applied as this release allows (%s; `ncclrl plugin verify` names the rows that differ)",
        origin, ctx->versions_lo / 10000, ctx->versions_lo / 100 % 100, ctx->versions_hi / 10000,
        ctx->versions_hi / 100 % 100, v / 10000, v / 100 % 100, v % 100,
        v >= NCCL_2_31 ? "from 2.31 a row's channels cap NCCL's own count" : "see the table's comments");
}

static const char* file_kind(mode_t mode) {
  return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device" :
         S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* The whole file as one buffer (*len bytes), or NULL (logged) when it cannot be read in full.
 * Only a regular file of at most MAX_TABLE_BYTES is read: the file is opened without blocking
 * (a FIFO with no writer never stalls init) and checked with fstat before any read; a file that
 * keeps growing past the cap while read is refused too. */
static char* read_file(ctx_t* ctx, const char* path, size_t* len) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      LOG(ctx, ctx->strict ? NCCLRL_LOG_WARN : NCCLRL_LOG_INFO, PREFIX "no table at %s (%s): %s", path,
          strerror(err), outcome(ctx));
    else
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "cannot open table %s (%s): %s", path,
          strerror(err), outcome(ctx));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "cannot read %s (%s): %s", path, strerror(errno), outcome(ctx));
    close(fd);
    return NULL;
  }
  if (!S_ISREG(st.st_mode)) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s is %s, not a regular file: %s", path,
        file_kind(st.st_mode), outcome(ctx));
    close(fd);
    return NULL;
  }
  if (st.st_size > MAX_TABLE_BYTES) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s is larger than %d bytes (%lld): %s", path,
        MAX_TABLE_BYTES, (long long)st.st_size, outcome(ctx));
    close(fd);
    return NULL;
  }
  size_t cap = (size_t)st.st_size + 1 > 4096 ? (size_t)st.st_size + 1 : 4096, n = 0;
  char* buf = malloc(cap);
  int err = 0;
  while (buf && n <= MAX_TABLE_BYTES) {
    if (n == cap) {
      size_t want = cap * 2 > (size_t)MAX_TABLE_BYTES + 1 ? (size_t)MAX_TABLE_BYTES + 1 : cap * 2;
      char* bigger = realloc(buf, want);
      if (!bigger) { free(buf); buf = NULL; break; }
      buf = bigger;
      cap = want;
    }
    ssize_t got = read(fd, buf + n, cap - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) { err = errno; break; }
    if (got == 0) break;
    n += (size_t)got;
  }
  close(fd);
  if (!buf) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s: %s", path, outcome(ctx));
    return NULL;
  }
  if (err) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "cannot read %s (%s): %s", path, strerror(err), outcome(ctx));
    free(buf);
    return NULL;
  }
  if (n > MAX_TABLE_BYTES) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s is larger than %d bytes (it grew while read): %s", path,
        MAX_TABLE_BYTES, outcome(ctx));
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

/* The table's source, in order: the content of NCCLRL_TUNER_TABLE_DATA (if set and non-empty),
 * the file NCCLRL_TUNER_TABLE, the file NCCL_TUNER_CONFIG_FILE, ./nccl_tuner.conf. A source named
 * by a variable, or the file when a fingerprint is expected, must load (ctx->strict); when it does
 * not, init fails unless fallback (NCCLRL_TUNER_ON_ERROR=fallback). The expected fingerprint guards
 * files (a file can differ between nodes or change between inits), so a file read while none is
 * expected (NCCLRL_TUNER_TABLE_FINGERPRINT unset, and not `any`) is refused under the same policy,
 * ./nccl_tuner.conf included: it exists, so it was meant to apply. NCCLRL_TUNER_TABLE_DATA is the
 * launcher's copy of the same bytes to every rank (its own fingerprint is on the INFO line), and
 * ncclrl's measured jobs set it while the user's deployment variables may still be exported. */
static void load_table(ctx_t* ctx, int fallback) {
  const char* data = getenv(DATA_ENV);
  const char* path = getenv("NCCLRL_TUNER_TABLE");
  if (!path || !*path) path = getenv("NCCL_TUNER_CONFIG_FILE");
  ctx->strict = (data && *data) || (path && *path) || ctx->has_expect;
  ctx->fail = ctx->strict && !fallback;
  if (data && *data) {
    size_t len = strlen(data);
    if (len > MAX_TABLE_BYTES) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table from %s is larger than %d bytes (%zu): %s", DATA_ENV,
          MAX_TABLE_BYTES, len, outcome(ctx));
      return;
    }
    char* copy = malloc(len + 1); /* parse a private copy: the environment may change under us */
    if (!copy) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s: %s", DATA_ENV, outcome(ctx));
      return;
    }
    memcpy(copy, data, len + 1);
    ctx->has_expect = 0;
    load_text(ctx, DATA_ENV, copy, len);
    free(copy);
    return;
  }
  if (!path || !*path) path = "nccl_tuner.conf";
  size_t len = 0;
  char* text = read_file(ctx, path, &len);
  if (!text) return;
  if (!ctx->has_expect && !ctx->unchecked) { /* unchecked bytes: ranks could run different tables unseen */
    ctx->fail = !fallback;
    unsigned long long hash = (unsigned long long)fnv1a64(text, len);
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s is a file and " FINGERPRINT_ENV " is unset: ranks could read "
        "different bytes unseen (another node's copy, a file replaced between inits); set " FINGERPRINT_ENV
        "=%016llx (these %zu bytes' fingerprint; the export prints the table's) on every rank, or =any to load "
        "files unchecked: %s", path, hash, len, outcome(ctx));
    free(text);
    return;
  }
  load_text(ctx, path, text, len);
  free(text);
}

static const row_t* find_in(const part_t* part, uint64_t nbytes) {
  int lo = 0, hi = part->n - 1, best = -1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    if (part->rows[mid].lo <= nbytes) { best = mid; lo = mid + 1; } else { hi = mid - 1; }
  }
  if (best >= 0 && part->rows[best].hi >= nbytes) return &part->rows[best];
  return NULL;
}

/* pipe/regbuff < -1 mean "unknown for this ABI version": only rows that accept any value match. */
static const row_t* lookup(const ctx_t* ctx, int coll, uint64_t nbytes, int pipe, int regbuff) {
  if (coll < 0 || coll >= NCCLRL_NUM_COLLS) return NULL;
  for (int k = 0; k < ctx->nparts[coll]; k++) {
    const part_t* p = &ctx->parts[coll][k];
    if (p->pipe != -1 && p->pipe != pipe) continue;
    if (p->regbuff != -1 && p->regbuff != regbuff) continue;
    const row_t* r = find_in(p, nbytes);
    if (r) return r;
  }
  return NULL;
}

/* ---- request log ---- */

static atomic_uint reqlog_next_context; /* N of the next logging context of this process */

/* A failure while recording: one WARN per context, however often it happens. */
static void reqlog_warn_once(ctx_t* ctx, const char* what) {
  reqlog_t* rl = &ctx->reqlog;
  if (!rl->warned)
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "request log %s: %s; NCCL's decisions are unaffected", rl->path, what);
  rl->warned = 1;
}

static uint64_t reqlog_pack(int coll, size_t nbytes) {
  uint64_t c = (coll >= 0 && coll < REQLOG_OTHER_COLL) ? (uint64_t)coll : REQLOG_OTHER_COLL;
  uint64_t b = (uint64_t)nbytes > REQLOG_NBYTES_MASK ? REQLOG_NBYTES_MASK : (uint64_t)nbytes;
  return (c << REQLOG_COLL_SHIFT) | b;
}

static size_t reqlog_slot(uint64_t key, size_t keycap) {
  uint64_t h = key ^ (key >> 31);
  h *= UINT64_C(0x9e3779b97f4a7c15);
  return (size_t)(h ^ (h >> 29)) & (keycap - 1);
}

/* Double the count table (or make the first); 0 when it cannot grow (full, or no memory). */
static int reqlog_grow_keys(ctx_t* ctx) {
  reqlog_t* rl = &ctx->reqlog;
  size_t cap = rl->keycap ? rl->keycap * 2 : REQLOG_FIRST_KEYS;
  if (cap > REQLOG_MAX_KEYS) return 0;
  reqkey_t* keys = calloc(cap, sizeof(reqkey_t));
  if (!keys) {
    reqlog_warn_once(ctx, "out of memory for the counts past the cap; later sizes are counted as unkeyed");
    return 0;
  }
  for (size_t i = 0; i < rl->keycap; i++) {
    if (!rl->keys[i].count) continue;
    size_t j = reqlog_slot(rl->keys[i].key, cap);
    while (keys[j].count) j = (j + 1) & (cap - 1);
    keys[j] = rl->keys[i];
  }
  free(rl->keys);
  rl->keys = keys;
  rl->keycap = cap;
  return 1;
}

/* A request past the cap: its (collType, nBytes) count goes up. */
static void reqlog_count(ctx_t* ctx, uint64_t key) {
  reqlog_t* rl = &ctx->reqlog;
  if (rl->keycap) {
    size_t j = reqlog_slot(key, rl->keycap);
    for (; rl->keys[j].count; j = (j + 1) & (rl->keycap - 1))
      if (rl->keys[j].key == key) { rl->keys[j].count++; return; }
  }
  if ((rl->nkeys + 1) * 2 > rl->keycap && !reqlog_grow_keys(ctx)) { rl->unkeyed++; return; }
  size_t j = reqlog_slot(key, rl->keycap);
  while (rl->keys[j].count) j = (j + 1) & (rl->keycap - 1);
  rl->keys[j].key = key;
  rl->keys[j].count = 1;
  rl->nkeys++;
}

/* Every getCollInfo call of a logging context: a store, and a doubling now and then up to the cap. */
static void reqlog_note(ctx_t* ctx, int coll, size_t nbytes) {
  reqlog_t* rl = &ctx->reqlog;
  if (!rl->on) return;
  rl->requests++;
  uint64_t rec = reqlog_pack(coll, nbytes);
  if (rl->n == rl->cap && rl->cap < rl->max) {
    size_t cap = rl->cap * 2 < rl->max ? rl->cap * 2 : rl->max;
    uint64_t* bigger = realloc(rl->recs, cap * sizeof(uint64_t));
    if (bigger) {
      rl->recs = bigger;
      rl->cap = cap;
    } else {
      reqlog_warn_once(ctx, "out of memory growing the ordered records; later requests are only counted");
      rl->max = rl->n;
    }
  }
  if (rl->n < rl->cap) rl->recs[rl->n++] = rec;
  else reqlog_count(ctx, rec);
}

/* NCCLRL_TUNER_REQUEST_LOG_MAX, else the default; a malformed value is a WARN and the default. */
static size_t reqlog_max(ctx_t* ctx) {
  const char* s = getenv(REQLOG_MAX_ENV);
  long long v = REQLOG_DEFAULT_MAX;
  if (s && *s && parse_int(s, 0, REQLOG_MAX_LIMIT, &v) != 0) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s='%.64s' is not a whole number from 0 to %d; using %d", REQLOG_MAX_ENV, s,
        REQLOG_MAX_LIMIT, REQLOG_DEFAULT_MAX);
    v = REQLOG_DEFAULT_MAX;
  }
  return (size_t)v;
}

/* At init: when NCCLRL_TUNER_REQUEST_LOG is set, name this context's file and check its folder. */
static void reqlog_open(ctx_t* ctx, uint64_t comm_id, int has_comm_id) {
  const char* prefix = getenv(REQLOG_ENV);
  if (!prefix || !*prefix) return;
  reqlog_t* rl = &ctx->reqlog;
  rl->max = reqlog_max(ctx);
  rl->context = atomic_fetch_add(&reqlog_next_context, 1u);
  rl->comm_id = comm_id;
  rl->has_comm_id = has_comm_id;
  rl->pid = (long)getpid();
  if (gethostname(rl->host, sizeof(rl->host)) != 0 || !rl->host[0]) snprintf(rl->host, sizeof(rl->host), "unknown");
  rl->host[sizeof(rl->host) - 1] = '\0';
  for (char* h = rl->host; *h; h++) /* a file name on every file system */
    if (!ascii_alnum((unsigned char)*h) && *h != '.' && *h != '-' && *h != '_') *h = '_';
  /* a relative prefix is taken from the working folder at init: the process may move before destroy */
  char cwd[REQLOG_CWD_MAX];
  const char* base = "";
  if (prefix[0] != '/' && getcwd(cwd, sizeof(cwd)) != NULL) {
    size_t n = strlen(cwd);
    if (n + 1 < sizeof(cwd) && (n == 0 || cwd[n - 1] != '/')) { cwd[n] = '/'; cwd[n + 1] = '\0'; }
    base = cwd;
  }
  int len = snprintf(NULL, 0, "%s%s.%s.%ld.%u.csv", base, prefix, rl->host, rl->pid, rl->context);
  rl->path = len > 0 ? malloc((size_t)len + 1) : NULL;
  if (!rl->path) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "request log %s...: out of memory; this communicator's requests are not "
        "recorded; NCCL's decisions are unaffected", prefix);
    return;
  }
  snprintf(rl->path, (size_t)len + 1, "%s%s.%s.%ld.%u.csv", base, prefix, rl->host, rl->pid, rl->context);
  /* the folder must take new files now; a failure later (full disk) is reported at destroy */
  char* dir = strdup(rl->path);
  const char* folder = dir;
  int err = ENOMEM;
  if (dir) {
    char* slash = strrchr(dir, '/');
    if (!slash) folder = ".";
    else if (slash == dir) folder = "/";
    else *slash = '\0';
    err = access(folder, W_OK | X_OK) == 0 ? 0 : errno;
  }
  if (err) {
    char why[600];
    snprintf(why, sizeof(why), "cannot create files in %s (%s); this communicator's requests are not recorded",
             dir ? folder : "its folder", strerror(err));
    reqlog_warn_once(ctx, why);
    free(dir);
    free(rl->path);
    rl->path = NULL;
    return;
  }
  free(dir);
  rl->cap = rl->max < REQLOG_FIRST_CAP ? rl->max : REQLOG_FIRST_CAP;
  rl->recs = rl->cap ? malloc(rl->cap * sizeof(uint64_t)) : NULL;
  if (rl->cap && !rl->recs) rl->cap = 0; /* every request then goes to the counts */
  rl->on = 1;
  LOG(ctx, NCCLRL_LOG_INFO, PREFIX "request log: this communicator's requests (up to %zu in order) go to %s at "
      "its destroy", rl->max, rl->path);
}

static int cmp_keys(const void* x, const void* y) {
  uint64_t a = ((const reqkey_t*)x)->key, b = ((const reqkey_t*)y)->key;
  return a < b ? -1 : a > b;
}

static int reqlog_coll_name(char* buf, size_t size, uint64_t rec) {
  unsigned c = (unsigned)(rec >> REQLOG_COLL_SHIFT);
  return c < NCCLRL_NUM_COLLS ? snprintf(buf, size, "%s", COLL_NAMES[c]) : snprintf(buf, size, "colltype%u", c);
}

/* At destroy: write PATH.tmp whole, then rename it to PATH; any failure is one WARN. */
static void reqlog_close(ctx_t* ctx) {
  reqlog_t* rl = &ctx->reqlog;
  if (rl->on) {
    size_t nkeys = 0;
    for (size_t i = 0; i < rl->keycap; i++) /* the counts, compacted and sorted by (collType, nBytes) */
      if (rl->keys[i].count) rl->keys[nkeys++] = rl->keys[i];
    if (nkeys) qsort(rl->keys, nkeys, sizeof(reqkey_t), cmp_keys);
    size_t tlen = strlen(rl->path) + sizeof(".tmp");
    char* tmp = malloc(tlen);
    FILE* f = NULL;
    int err = ENOMEM;
    if (tmp) {
      snprintf(tmp, tlen, "%s.tmp", rl->path);
      f = fopen(tmp, "w");
      if (!f) err = errno;
    }
    if (f) {
      errno = 0;
      setvbuf(f, NULL, _IOFBF, REQLOG_IO_BUFFER);
      char comm[32], name[32];
      if (rl->has_comm_id) snprintf(comm, sizeof(comm), "0x%016llx", (unsigned long long)rl->comm_id);
      else snprintf(comm, sizeof(comm), "unknown");
      int bad = fprintf(f, "# ncclrl-tuner-request-log: %d\n# host: %s\n# pid: %ld\n# context: %u\n"
                        "# comm_id: %s\n# tuner_abi: %d\n# nnodes: %zu\n# nranks: %zu\n# requests: %llu\n"
                        "# recorded: %zu\n# max_records: %zu\n# dropped: %llu\n# dropped_unkeyed: %llu\n",
                        REQLOG_FORMAT, rl->host, rl->pid, rl->context, comm, ctx->version, ctx->nnodes,
                        ctx->nranks, (unsigned long long)rl->requests, rl->n, rl->max,
                        (unsigned long long)(rl->requests - rl->n), (unsigned long long)rl->unkeyed) < 0;
      for (size_t i = 0; i < nkeys && !bad; i++) {
        reqlog_coll_name(name, sizeof(name), rl->keys[i].key);
        bad = fprintf(f, "# dropped_count: %s,%llu,%llu\n", name,
                      (unsigned long long)(rl->keys[i].key & REQLOG_NBYTES_MASK),
                      (unsigned long long)rl->keys[i].count) < 0;
      }
      bad = bad || fputs("collective,nbytes,nnodes,nranks\n", f) < 0;
      for (size_t i = 0; i < rl->n && !bad; i++) {
        reqlog_coll_name(name, sizeof(name), rl->recs[i]);
        bad = fprintf(f, "%s,%llu,%zu,%zu\n", name, (unsigned long long)(rl->recs[i] & REQLOG_NBYTES_MASK),
                      ctx->nnodes, ctx->nranks) < 0;
      }
      if (bad || ferror(f)) { bad = 1; err = errno ? errno : EIO; }
      int closed = fclose(f);
      if (!bad && closed != 0) { bad = 1; err = errno ? errno : EIO; }
      if (!bad && rename(tmp, rl->path) != 0) { bad = 1; err = errno; }
      if (bad) unlink(tmp);
      else {
        err = 0;
        LOG(ctx, NCCLRL_LOG_INFO, PREFIX "request log: wrote %s (%llu requests, %zu in order, %llu past the cap)",
            rl->path, (unsigned long long)rl->requests, rl->n, (unsigned long long)(rl->requests - rl->n));
      }
    }
    if (err) /* its own WARN, even after one while recording */
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "request log %s: cannot be written (%s); its %llu requests are lost; "
          "NCCL's decisions are unaffected", rl->path, strerror(err), (unsigned long long)rl->requests);
    free(tmp);
  }
  free(rl->recs);
  free(rl->keys);
  free(rl->path);
  memset(rl, 0, sizeof(*rl));
}

#ifdef NCCLRL_ONLINE
#include "ncclrl_online.c"
#endif

/* The deployment's settings: NCCLRL_TUNER_ON_ERROR (fail, the default, or fallback) into
 * *fallback, NCCLRL_TUNER_TABLE_FINGERPRINT (16 hex digits, into ctx->expect; or `any`, any case:
 * ctx->unchecked). Returns 0, or -1 (logged, naming the variable and its allowed values) when a
 * value is malformed: init fails then, whatever the policy. */
static int read_settings(ctx_t* ctx, int* fallback) {
  const char* policy = getenv(ON_ERROR_ENV);
  *fallback = 0;
  if (policy && *policy) {
    if (ascii_caseeq(policy, "fallback")) *fallback = 1;
    else if (!ascii_caseeq(policy, "fail")) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX ON_ERROR_ENV "='%.64s' is not fail or fallback: this communicator's init "
          "fails", policy);
      return -1;
    }
  }
  const char* want = getenv(FINGERPRINT_ENV);
  if (!want || !*want) return 0;
  if (ascii_caseeq(want, "any")) {
    ctx->unchecked = 1;
    return 0;
  }
  uint64_t v = 0;
  size_t n = 0;
  for (; want[n] && n < 17; n++) {
    char c = ascii_lower(want[n]);
    int d = ascii_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) break;
    v = v << 4 | (uint64_t)d;
  }
  if (n != 16 || want[n]) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX FINGERPRINT_ENV "='%.64s' is not 16 hex digits (the fingerprint the table's "
        "export prints, also in nccl_tuner.manifest) or any (a table file loads unchecked): this communicator's "
        "init fails", want);
    return -1;
  }
  ctx->has_expect = 1;
  ctx->expect = v;
  return 0;
}

/* comm_id: the communicator's id (ABI v5 and later; has_comm_id 0 before). *out is the new context,
 * or NULL with a result other than success: no memory, a malformed setting, or a table the
 * deployment requires that did not load (each logged at WARN); NCCL then fails the communicator's
 * init on this rank, instead of running with decisions other ranks do not share. */
static ncclrl_result_t new_ctx(size_t nranks, size_t nnodes, ncclrl_logger_t logger, int version, uint64_t comm_id,
                               int has_comm_id, void** out) {
  if (!out) return NCCLRL_INVALID_ARGUMENT;
  *out = NULL;
  ctx_t* ctx = calloc(1, sizeof(ctx_t));
  if (!ctx) return NCCLRL_SYSTEM_ERROR;
  ctx->log = logger ? logger : nolog;
  ctx->version = version;
  ctx->nccl_code = nccl_version_code(logger);
  ctx->nranks = nranks;
  ctx->nnodes = nnodes;
  const char* dbg = getenv("NCCL_DEBUG");
  ctx->trace = dbg && ascii_caseeq(dbg, "TRACE");
  int fallback = 0;
  if (read_settings(ctx, &fallback) != 0) {
    free(ctx);
    return NCCLRL_INVALID_USAGE;
  }
  load_table(ctx, fallback);
  if (ctx->fail && !ctx->loaded) { /* the WARN that says why was logged where the table was refused */
    free(ctx->storage);
    free(ctx);
    return NCCLRL_INVALID_USAGE;
  }
  reqlog_open(ctx, comm_id, has_comm_id);
#ifdef NCCLRL_ONLINE
  if (has_comm_id) ctx->online = online_attach(ctx, comm_id);
  else if (online_requested())
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "online mode needs tuner ABI v5 (NCCL 2.28+); this NCCL speaks v%d: static table",
        version);
#endif
  *out = ctx;
  return NCCLRL_SUCCESS;
}

static ncclrl_result_t destroy_ctx(void* c) {
  ctx_t* ctx = (ctx_t*)c;
  if (ctx) {
#ifdef NCCLRL_ONLINE
    online_detach(ctx->online);
#endif
    reqlog_close(ctx);
    free(ctx->storage);
    free(ctx);
  }
  return NCCLRL_SUCCESS;
}

/* Apply a row to NCCL's cost table (v3+); r NULL: NCCL decides. */
static void apply_row(ctx_t* ctx, const row_t* r, int coll, size_t nBytes, float** costTable, int numAlgo,
                      int numProto, int* nChannels) {
  if (!r) return;
  if (r->algo >= 0) {
    if (!costTable || r->algo >= numAlgo || r->proto >= numProto) return;
    float (*table)[numProto] = (float (*)[numProto])costTable;
    if (table[r->algo][r->proto] < 0.0f) {
      if (ctx->trace)
        LOG(ctx, NCCLRL_LOG_TRACE, PREFIX "%s %zu B: %s/%s disabled by NCCL (line %d); NCCL decides",
            COLL_NAMES[coll], nBytes, ALGO_NAMES[(int)r->algo], PROTO_NAMES[(int)r->proto], r->line);
      return;
    }
    table[r->algo][r->proto] = 0.0f;
  }
  if (r->channels > 0) *nChannels = r->channels;
  if (ctx->trace)
    LOG(ctx, NCCLRL_LOG_TRACE, PREFIX "%s %zu B -> %s/%s channels %d (line %d)", COLL_NAMES[coll], nBytes,
        r->algo >= 0 ? ALGO_NAMES[(int)r->algo] : "nccl", r->proto >= 0 ? PROTO_NAMES[(int)r->proto] : "nccl",
        (int)r->channels, r->line);
}

#ifdef NCCLRL_ONLINE
/* What the static table runs for this call: its row's choice where NCCL left it enabled, else NCCL's. */
static ocfg_t static_cfg(const row_t* r, float** costTable, int numAlgo, int numProto) {
  ocfg_t c = {-1, -1, (int16_t)(r && r->channels > 0 ? r->channels : 0)};
  if (r && r->algo >= 0 && costTable && r->algo < numAlgo && r->proto < numProto &&
      ((float (*)[numProto])costTable)[r->algo][r->proto] >= 0.0f) {
    c.algo = r->algo;
    c.proto = r->proto;
    return c;
  }
  int a = -1, p = -1;
  if (nccl_choice(costTable, numAlgo, numProto, &a, &p)) { c.algo = (int8_t)a; c.proto = (int8_t)p; }
  return c;
}

/* Online mode: the arm the schedule gives this call, forced where NCCL left it enabled; arm 0 (and an
 * arm NCCL disabled, identically on every rank) runs the static table's decision. */
static void apply_online(ctx_t* ctx, const row_t* r, int coll, size_t nBytes, int pipe, float** costTable,
                         int numAlgo, int numProto, int* nChannels) {
  /* what arm 0 runs matters only to a bucket still to form or exploring (its calls are matched to
   * events): a committed or frozen bucket skips the cost-table scan */
  const obucket_t* cur = coll >= 0 && coll < NCCLRL_NUM_COLLS ? ctx->online->b[coll][log2_bucket(nBytes)] : NULL;
  ocfg_t arm0 = !cur || cur->state == B_EXPLORE ? static_cfg(r, costTable, numAlgo, numProto) : (ocfg_t){-1, -1, 0};
  obucket_t* b = NULL;
  ocfg_t cfg = arm0, ran = arm0;
  int timed = 0;
  int arm = online_pick(ctx->online, ctx, coll, nBytes, costTable, numAlgo, numProto, arm0, &b, &cfg, &timed);
  if (arm > 0) {
    float (*t)[numProto] = (float (*)[numProto])costTable;
    if (costTable && cfg.algo >= 0 && cfg.algo < numAlgo && cfg.proto >= 0 && cfg.proto < numProto &&
        t[cfg.algo][cfg.proto] >= 0.0f) {
      t[cfg.algo][cfg.proto] = 0.0f;
      if (cfg.channels > 0) *nChannels = cfg.channels;
      ran = cfg;
    } else {
      arm = 0;
    }
  }
  if (arm == 0) apply_row(ctx, r, coll, nBytes, costTable, numAlgo, numProto, nChannels);
  else if (arm < 0 && b) ran = static_cfg(NULL, costTable, numAlgo, numProto); /* NCCL decides: its own choice */
  /* NCCL aggregates grouped tasks (numPipeOps > 1) into one decision whose events carry each task's own
   * size: such a call keeps its place in the schedule but is not matched to events */
  if (b && pipe <= 1) online_note(b, timed ? arm : -1, ran, nBytes);
}
#endif

/* Every entry -1: NCCL asks with nothing to choose from (2.31+: its symmetric kernels' own round). */
static int all_ignored(float** costTable, int numAlgo, int numProto) {
  if (!costTable || numAlgo <= 0 || numProto <= 0) return 0;
  float (*t)[numProto] = (float (*)[numProto])costTable;
  for (int a = 0; a < numAlgo; a++)
    for (int p = 0; p < numProto; p++)
      if (t[a][p] >= 0.0f) return 0;
  return 1;
}

static ncclrl_result_t apply(ctx_t* ctx, int coll, size_t nBytes, int pipe, int regbuff, float** costTable,
                             int numAlgo, int numProto, int* nChannels) {
  if (all_ignored(costTable, numAlgo, numProto)) return NCCLRL_SUCCESS; /* not a call to count or decide */
  /* 2.31+: NCCL asks ahead of a collective (numPipeOps 0) whether its symmetric LL kernel keeps it: NCCL
   * answers as it would without a plugin; the collective's own call follows where the kernel gives way */
  if (pipe == 0 && ctx && (ctx->nccl_code >= NCCL_2_31 || ctx->nccl_code == 0)) /* earlier releases never */
    return NCCLRL_SUCCESS;                                                   /* ask with numPipeOps 0 */
  if (ctx) reqlog_note(ctx, coll, nBytes);
  if (!ctx || !nChannels) return NCCLRL_SUCCESS; /* anything unexpected: NCCL decides */
  const row_t* r = lookup(ctx, coll, nBytes, pipe, regbuff);
  if (ctx->has_chunk && coll >= 0 && coll < NCCLRL_NUM_COLLS) { /* what getChunkSize's slices will belong to */
    if (ctx->memo_sliced) { /* NCCL scheduled the last group: its decisions are done with */
      ctx->memo_group = ctx->memo_next;
      ctx->memo_sliced = 0;
    }
    unsigned i = ctx->memo_next++ % CHUNK_MEMO;
    ctx->memo[i].coll = coll;
    ctx->memo[i].nbytes = nBytes;
    ctx->memo[i].row = r;
  }
#ifdef NCCLRL_ONLINE
  if (ctx->online) {
    apply_online(ctx, r, coll, nBytes, pipe, costTable, numAlgo, numProto, nChannels);
    return NCCLRL_SUCCESS;
  }
#endif
  apply_row(ctx, r, coll, nBytes, costTable, numAlgo, numProto, nChannels);
  return NCCLRL_SUCCESS;
}

/* ---- v2 ---- */

/* Tuner ABI v2 (NCCL 2.21) has no cost table: the plugin writes the algorithm and protocol itself,
 * and NCCL runs them unchecked. So a row's choice is only written where that NCCL runs it for this
 * collective (its tuning model, src/graph/tuning.cc and src/enqueue.cc in 2.21):
 *   Broadcast, Reduce: Ring;  AllGather, ReduceScatter: Ring, NVLS;
 *   AllReduce: Tree, Ring, CollNet Direct, CollNet Chain, NVLS, NVLS Tree;
 *   PAT does not exist (2.23+); CollNet and NVLS algorithms run the Simple protocol only;
 *   CollNet needs the call's collNetSupport, NVLS and NVLS Tree its nvlsSupport; NVLS Tree needs
 *   several nodes, NVLS on several nodes needs CollNet too.
 * CollNet Direct for AllGather/ReduceScatter also depends on the network plugin's collectives and a
 * NIC per GPU, which a v2 call does not show: never written. A user's NCCL_ALGO/NCCL_PROTO is not
 * visible under v2 either (v3 and later see it as -1 entries). */
static int v2_can_run(const ctx_t* ctx, int coll, int algo, int proto, int collNetSupport, int nvlsSupport) {
  int ok = 0;
  switch (coll) {
    case NCCLRL_BROADCAST:
    case NCCLRL_REDUCE: ok = algo == NCCLRL_RING; break;
    case NCCLRL_ALLGATHER:
    case NCCLRL_REDUCESCATTER: ok = algo == NCCLRL_RING || algo == NCCLRL_NVLS; break;
    case NCCLRL_ALLREDUCE: ok = algo >= NCCLRL_TREE && algo <= NCCLRL_NVLS_TREE; break;
    default: ok = 0;
  }
  if (!ok || proto < 0 || proto >= NCCLRL_NUM_PROTOS) return 0;
  if (algo == NCCLRL_TREE || algo == NCCLRL_RING) return 1;
  if (proto != NCCLRL_SIMPLE) return 0;
  if (algo == NCCLRL_COLLNET_DIRECT || algo == NCCLRL_COLLNET_CHAIN) return collNetSupport == 1;
  if (nvlsSupport != 1) return 0;
  if (algo == NCCLRL_NVLS_TREE) return ctx->nnodes > 1;
  return ctx->nnodes <= 1 || collNetSupport == 1; /* NVLS */
}

static ncclrl_result_t init_v2(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx) {
  return new_ctx(nRanks, nNodes, logger, 2, 0, 0, ctx);
}
static ncclrl_result_t get_v2(void* c, int collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels) {
  ctx_t* ctx = (ctx_t*)c;
  if (ctx) reqlog_note(ctx, collType, nBytes);
  if (!ctx || !algorithm || !protocol || !nChannels) return NCCLRL_SUCCESS;
  const row_t* r = lookup(ctx, collType, nBytes, numPipeOps, -2);
  if (!r) return NCCLRL_SUCCESS;
  if (r->algo >= 0) {
    if (!v2_can_run(ctx, collType, r->algo, r->proto, collNetSupport, nvlsSupport)) {
      if (ctx->trace)
        LOG(ctx, NCCLRL_LOG_TRACE, PREFIX "%s %zu B: %s/%s cannot run here under tuner ABI v2 (line %d); NCCL decides",
            COLL_NAMES[collType], nBytes, ALGO_NAMES[(int)r->algo], PROTO_NAMES[(int)r->proto], r->line);
      return NCCLRL_SUCCESS;
    }
    *algorithm = r->algo;
    *protocol = r->proto;
  }
  if (r->channels > 0) *nChannels = r->channels;
  return NCCLRL_SUCCESS;
}

/* ---- v3 / v4 ---- */
static ncclrl_result_t init_v3(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx) {
  return new_ctx(nRanks, nNodes, logger, 3, 0, 0, ctx);
}
static ncclrl_result_t init_v4(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx) {
  return new_ctx(nRanks, nNodes, logger, 4, 0, 0, ctx);
}
static ncclrl_result_t get_v3(void* c, int collType, size_t nBytes, int numPipeOps, float** costTable, int numAlgo,
                              int numProto, int* nChannels) {
  return apply((ctx_t*)c, collType, nBytes, numPipeOps, -2, costTable, numAlgo, numProto, nChannels);
}
static ncclrl_result_t get_v4(void* c, int collType, size_t nBytes, int numPipeOps, float** costTable, int numAlgo,
                              int numProto, int regBuff, int* nChannels) {
  return apply((ctx_t*)c, collType, nBytes, numPipeOps, regBuff, costTable, numAlgo, numProto, nChannels);
}

/* ---- v5 / v6 ---- */
static ncclrl_result_t init_v5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                               ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v5_t* constants) {
  (void)nvl; (void)constants;
  return new_ctx(nRanks, nNodes, logger, 5, commId, 1, ctx);
}
static ncclrl_result_t init_v6(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                               ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v5_t* constants) {
  (void)nvl; (void)constants;
  return new_ctx(nRanks, nNodes, logger, 6, commId, 1, ctx);
}
/* NCCL asks per channel slice (nChannels 1, nBytes the slice's share), after the getCollInfo calls of
 * its group: the slice belongs to one of that group's decisions of this collective that it fits in (a
 * collective of B bytes on up to 128 channels has slices of B/128 .. B bytes; a group is the decisions
 * since the last slice, at most the last CHUNK_MEMO). Their rows must agree on the chunk (and on running
 * this algorithm/protocol where they name one), or NCCL's chunk stays. */
static ncclrl_result_t chunk_v6(void* c, int collType, size_t nBytes, int algo, int proto, int nChannels,
                                size_t* chunkSize) {
  (void)nChannels;
  ctx_t* ctx = (ctx_t*)c;
  if (!ctx || !chunkSize || !ctx->has_chunk || nBytes == 0) return NCCLRL_SUCCESS;
  ctx->memo_sliced = 1;
  unsigned group = ctx->memo_next - ctx->memo_group; /* decisions of the group being scheduled */
  unsigned n = group < CHUNK_MEMO ? group : CHUNK_MEMO;
  uint64_t chunk = 0;
  int found = 0;
  for (unsigned k = 0; k < n; k++) {
    unsigned i = (ctx->memo_next - 1 - k) % CHUNK_MEMO;
    if (ctx->memo[i].coll != collType || nBytes > ctx->memo[i].nbytes || ctx->memo[i].nbytes / 128 > nBytes)
      continue;
    const row_t* r = ctx->memo[i].row;
    uint64_t want = r && r->chunk > 0 && (r->algo < 0 || (r->algo == algo && r->proto == proto)) ? r->chunk : 0;
    if (found && want != chunk) {
      if (ctx->trace)
        LOG(ctx, NCCLRL_LOG_TRACE, PREFIX "%s slice of %zu B: its collective is ambiguous; NCCL's chunk %zu kept",
            COLL_NAMES[collType], nBytes, *chunkSize);
      return NCCLRL_SUCCESS;
    }
    chunk = want;
    found = 1;
  }
  if (chunk > 0) *chunkSize = (size_t)chunk;
  return NCCLRL_SUCCESS;
}

static ncclrl_result_t init_v7(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                               ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v7_t* constants) {
  (void)nvl; (void)constants;
  return new_ctx(nRanks, nNodes, logger, 7, commId, 1, ctx);
}

EXPORT const ncclrl_tuner_v2_t ncclTunerPlugin_v2 = {"ncclrl", init_v2, get_v2, destroy_ctx};
EXPORT const ncclrl_tuner_v3_t ncclTunerPlugin_v3 = {"ncclrl", init_v3, get_v3, destroy_ctx};
EXPORT const ncclrl_tuner_v4_t ncclTunerPlugin_v4 = {"ncclrl", init_v4, get_v4, destroy_ctx};
EXPORT const ncclrl_tuner_v5_t ncclTunerPlugin_v5 = {"ncclrl", init_v5, get_v4, destroy_ctx};
EXPORT const ncclrl_tuner_v6_t ncclTunerPlugin_v6 = {"ncclrl", init_v6, get_v4, destroy_ctx, chunk_v6};
EXPORT const ncclrl_tuner_v7_t ncclTunerPlugin_v7 = {"ncclrl", init_v7, get_v4, destroy_ctx, chunk_v6};
