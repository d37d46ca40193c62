/*
 * ncclrl tuner plugin: loads a tuned table (NVIDIA's example-plugin CSV, plus optional columns of
 * ours) into NCCL through the tuner ABI, versions 2 to 6, from one library.
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
 * load with a WARN naming the source, line and field; valid rows still load; no file, a table over
 * 16 MiB or no memory = NCCL's defaults. Lookups are binary searches over per-collective arrays
 * built at init: no allocation, no locking (read-only after init), and the same answer on every
 * rank that reads the same bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ncclrl_tuner_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define PREFIX "TUNER/ncclrl: "
#define MAX_FIELDS 11
#define MAX_LINE 4096
#define MAX_CHANNELS 64
#define MAX_KEYS 16 /* distinct (numPipeOps, regBuff) filters per collective */
#define MAX_TABLE_BYTES (16 << 20) /* a larger table is refused whole: NCCL decides */
#define DATA_ENV "NCCLRL_TUNER_TABLE_DATA"

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
  ncclrl_logger_t log;
  int version;
  int trace;
  size_t nranks, nnodes;
  part_t parts[NCCLRL_NUM_COLLS][MAX_KEYS];
  int nparts[NCCLRL_NUM_COLLS];
  row_t* storage;
  int nrows, rejected, applicable;
  char path[512];
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

static int name_index(const char* s, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) return i;
  return -1;
}

/* Whole decimal number, optionally -1; returns 0 on success. */
static int parse_int(const char* s, long long lo, long long hi, long long* out) {
  if (*s == '\0') return -1;
  if (strcmp(s, "max") == 0) { *out = 4294967295LL; return *out <= hi ? 0 : -1; }
  const char* p = s;
  if (*p == '-' || *p == '+') p++;
  if (*p == '\0') return -1;
  for (; *p; p++)
    if (!isdigit((unsigned char)*p)) return -1;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno != 0 || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static char* trim(char* s) {
  while (isspace((unsigned char)*s)) s++;
  char* e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
  return s;
}

static void lower(char* s) {
  for (; *s; s++) *s = (char)tolower((unsigned char)*s);
}

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

static int keys_compatible(int32_t p1, int8_t r1, int32_t p2, int8_t r2) {
  return (p1 == p2 || p1 == -1 || p2 == -1) && (r1 == r2 || r1 == -1 || r2 == -1);
}

static int cmp_rows(const void* x, const void* y) {
  const row_t* a = (const row_t*)x;
  const row_t* b = (const row_t*)y;
  if (a->coll != b->coll) return a->coll < b->coll ? -1 : 1;
  if (a->pipe != b->pipe) return a->pipe < b->pipe ? -1 : 1;
  if (a->regbuff != b->regbuff) return a->regbuff < b->regbuff ? -1 : 1;
  return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : 0;
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

/* Parse, validate and index a table text of len bytes for this communicator; origin names it in
 * log lines (a path, or the environment variable). Never fails: problems are WARNs, and anything
 * odd leaves NCCL's decisions in place. */
static void load_text(ctx_t* ctx, const char* origin, const char* text, size_t len) {
  snprintf(ctx->path, sizeof(ctx->path), "%s", origin);
  uint64_t hash = fnv1a64(text, len);
  int cap = 256;
  row_t* rows = malloc(sizeof(row_t) * (size_t)cap);
  if (!rows) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s: NCCL's own decisions everywhere", origin);
    return;
  }
  int n = 0;
  char line[MAX_LINE];
  int lineno = 0;
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
    if (memchr(start, '\0', line_len)) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: line holds a NUL byte; rejected", origin, lineno);
      ctx->rejected++;
      continue;
    }
    memcpy(line, start, line_len);
    line[line_len] = '\0';
    row_t r;
    int rc = parse_line(ctx, origin, lineno, line, &r);
    if (rc < 0) { ctx->rejected++; continue; }
    if (rc == 0) continue;
    ctx->nrows++;
    if ((r.nnodes != -1 && (size_t)r.nnodes != ctx->nnodes) || (r.nranks != -1 && (size_t)r.nranks != ctx->nranks))
      continue; /* for another communicator shape */
    int clash = -1;
    for (int i = 0; i < n; i++) {
      const row_t* o = &rows[i];
      if (o->coll == r.coll && keys_compatible(o->pipe, o->regbuff, r.pipe, r.regbuff) && r.lo <= o->hi &&
          o->lo <= r.hi) { clash = i; break; }
    }
    if (clash >= 0) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field min_bytes: range %llu-%llu of %s overlaps line %d; rejected",
          origin, lineno, (unsigned long long)r.lo, (unsigned long long)r.hi, COLL_NAMES[(int)r.coll],
          rows[clash].line);
      ctx->rejected++;
      continue;
    }
    if (n == cap) {
      row_t* bigger = realloc(rows, sizeof(row_t) * (size_t)cap * 2);
      if (!bigger) {
        /* a partial table could differ between ranks: apply none of it */
        free(rows);
        LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s at line %d: NCCL's own decisions everywhere",
            origin, lineno);
        ctx->nrows = 0;
        return;
      }
      rows = bigger;
      cap *= 2;
    }
    rows[n++] = r;
  }
  /* Group by (collective, numPipeOps, regBuff); each group a run sorted by min_bytes. */
  qsort(rows, (size_t)n, sizeof(row_t), cmp_rows);
  int pos = 0;
  for (int i = 0; i < n;) {
    int c = rows[i].coll, j = i;
    while (j < n && rows[j].coll == c && rows[j].pipe == rows[i].pipe && rows[j].regbuff == rows[i].regbuff) j++;
    if (ctx->nparts[c] == MAX_KEYS) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s:%d: field numPipeOps: more than %d distinct numPipeOps/regBuff filters "
          "for %s; rejected", origin, rows[i].line, MAX_KEYS, COLL_NAMES[c]);
      ctx->rejected += j - i;
    } else {
      part_t* part = &ctx->parts[c][ctx->nparts[c]++];
      part->pipe = rows[i].pipe;
      part->regbuff = rows[i].regbuff;
      part->rows = rows + i;
      part->n = j - i;
      pos += j - i;
    }
    i = j;
  }
  ctx->storage = rows;
  ctx->applicable = pos;
  LOG(ctx, NCCLRL_LOG_INFO, PREFIX "table from %s (%zu bytes, %d rows, fingerprint %016llx): %d for this "
      "communicator (%zu ranks, %zu nodes), %d rejected; tuner ABI v%d", origin, len, ctx->nrows,
      (unsigned long long)hash, ctx->applicable, ctx->nranks, ctx->nnodes, ctx->rejected, ctx->version);
}

/* The whole file as one buffer (*len bytes), or NULL (logged) when it cannot be read in full. */
static char* read_file(ctx_t* ctx, const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    LOG(ctx, NCCLRL_LOG_INFO, PREFIX "no table at %s (%s): NCCL's own decisions everywhere", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char* buf = malloc(cap);
  while (buf && n <= MAX_TABLE_BYTES) {
    if (n == cap) {
      char* bigger = realloc(buf, cap * 2);
      if (!bigger) { free(buf); buf = NULL; break; }
      buf = bigger;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  int failed = buf ? ferror(f) : 0;
  fclose(f);
  if (!buf) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s: NCCL's own decisions everywhere", path);
    return NULL;
  }
  if (failed) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "cannot read %s: NCCL's own decisions everywhere", path);
    free(buf);
    return NULL;
  }
  if (n > MAX_TABLE_BYTES) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table %s is larger than %d bytes: NCCL's own decisions everywhere", path,
        MAX_TABLE_BYTES);
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

/* The table's source, in order: the content of NCCLRL_TUNER_TABLE_DATA (if set and non-empty),
 * the file NCCLRL_TUNER_TABLE, the file NCCL_TUNER_CONFIG_FILE, ./nccl_tuner.conf. */
static void load_table(ctx_t* ctx) {
  const char* data = getenv(DATA_ENV);
  if (data && *data) {
    size_t len = strlen(data);
    if (len > MAX_TABLE_BYTES) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "table from %s is larger than %d bytes (%zu): NCCL's own decisions "
          "everywhere", DATA_ENV, MAX_TABLE_BYTES, len);
      return;
    }
    char* copy = malloc(len + 1); /* parse a private copy: the environment may change under us */
    if (!copy) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "out of memory reading %s: NCCL's own decisions everywhere", DATA_ENV);
      return;
    }
    memcpy(copy, data, len + 1);
    load_text(ctx, DATA_ENV, copy, len);
    free(copy);
    return;
  }
  const char* path = getenv("NCCLRL_TUNER_TABLE");
  if (!path || !*path) path = getenv("NCCL_TUNER_CONFIG_FILE");
  if (!path || !*path) path = "nccl_tuner.conf";
  size_t len = 0;
  char* text = read_file(ctx, path, &len);
  if (!text) return;
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

static ctx_t* new_ctx(size_t nranks, size_t nnodes, ncclrl_logger_t logger, int version) {
  ctx_t* ctx = calloc(1, sizeof(ctx_t));
  if (!ctx) return NULL;
  ctx->log = logger ? logger : nolog;
  ctx->version = version;
  ctx->nranks = nranks;
  ctx->nnodes = nnodes;
  const char* dbg = getenv("NCCL_DEBUG");
  ctx->trace = dbg && strcasecmp(dbg, "TRACE") == 0;
  load_table(ctx);
  return ctx;
}

static ncclrl_result_t destroy_ctx(void* c) {
  ctx_t* ctx = (ctx_t*)c;
  if (ctx) { free(ctx->storage); free(ctx); }
  return NCCLRL_SUCCESS;
}

/* Apply a row to NCCL's cost table (v3+). */
static ncclrl_result_t apply(ctx_t* ctx, int coll, size_t nBytes, int pipe, int regbuff, float** costTable,
                             int numAlgo, int numProto, int* nChannels) {
  if (!ctx || !nChannels) return NCCLRL_SUCCESS; /* anything unexpected: NCCL decides */
  const row_t* r = lookup(ctx, coll, nBytes, pipe, regbuff);
  if (!r) return NCCLRL_SUCCESS;
  if (r->algo >= 0) {
    if (!costTable || r->algo >= numAlgo || r->proto >= numProto) return NCCLRL_SUCCESS;
    float (*table)[numProto] = (float (*)[numProto])costTable;
    if (table[r->algo][r->proto] < 0.0f) {
      if (ctx->trace)
        LOG(ctx, NCCLRL_LOG_TRACE, PREFIX "%s %zu B: %s/%s disabled by NCCL (line %d); NCCL decides",
            COLL_NAMES[coll], nBytes, ALGO_NAMES[(int)r->algo], PROTO_NAMES[(int)r->proto], r->line);
      return NCCLRL_SUCCESS;
    }
    table[r->algo][r->proto] = 0.0f;
  }
  if (r->channels > 0) *nChannels = r->channels;
  if (ctx->trace)
    LOG(ctx, NCCLRL_LOG_TRACE, PREFIX "%s %zu B -> %s/%s channels %d (line %d)", COLL_NAMES[coll], nBytes,
        r->algo >= 0 ? ALGO_NAMES[(int)r->algo] : "nccl", r->proto >= 0 ? PROTO_NAMES[(int)r->proto] : "nccl",
        (int)r->channels, r->line);
  return NCCLRL_SUCCESS;
}

/* ---- v2 ---- */
static ncclrl_result_t init_v2(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx) {
  *ctx = new_ctx(nRanks, nNodes, logger, 2);
  return *ctx ? NCCLRL_SUCCESS : NCCLRL_SYSTEM_ERROR;
}
static ncclrl_result_t get_v2(void* c, int collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                              int numPipeOps, int* algorithm, int* protocol, int* nChannels) {
  ctx_t* ctx = (ctx_t*)c;
  if (!ctx || !algorithm || !protocol || !nChannels) return NCCLRL_SUCCESS;
  const row_t* r = lookup(ctx, collType, nBytes, numPipeOps, -2);
  if (!r) return NCCLRL_SUCCESS;
  if (r->algo >= 0) {
    /* No cost table in v2: only force what this call says is available. PAT is unknown to v2 NCCLs. */
    int ok = r->algo == NCCLRL_RING || r->algo == NCCLRL_TREE ||
             ((r->algo == NCCLRL_NVLS || r->algo == NCCLRL_NVLS_TREE) && nvlsSupport) ||
             ((r->algo == NCCLRL_COLLNET_DIRECT || r->algo == NCCLRL_COLLNET_CHAIN) && collNetSupport);
    if (r->algo == NCCLRL_TREE && (collType == NCCLRL_BROADCAST || collType == NCCLRL_REDUCE)) ok = 0;
    if (!ok) return NCCLRL_SUCCESS;
    *algorithm = r->algo;
    *protocol = r->proto;
  }
  if (r->channels > 0) *nChannels = r->channels;
  return NCCLRL_SUCCESS;
}

/* ---- v3 / v4 ---- */
static ncclrl_result_t init_v3(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx) {
  *ctx = new_ctx(nRanks, nNodes, logger, 3);
  return *ctx ? NCCLRL_SUCCESS : NCCLRL_SYSTEM_ERROR;
}
static ncclrl_result_t init_v4(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx) {
  *ctx = new_ctx(nRanks, nNodes, logger, 4);
  return *ctx ? NCCLRL_SUCCESS : NCCLRL_SYSTEM_ERROR;
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
  (void)commId; (void)nvl; (void)constants;
  *ctx = new_ctx(nRanks, nNodes, logger, 5);
  return *ctx ? NCCLRL_SUCCESS : NCCLRL_SYSTEM_ERROR;
}
static ncclrl_result_t init_v6(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                               ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v5_t* constants) {
  (void)commId; (void)nvl; (void)constants;
  *ctx = new_ctx(nRanks, nNodes, logger, 6);
  return *ctx ? NCCLRL_SUCCESS : NCCLRL_SYSTEM_ERROR;
}
static ncclrl_result_t chunk_v6(void* c, int collType, size_t nBytes, int algo, int proto, int nChannels,
                                size_t* chunkSize) {
  (void)nChannels;
  ctx_t* ctx = (ctx_t*)c;
  if (!ctx || !chunkSize) return NCCLRL_SUCCESS;
  const row_t* r = lookup(ctx, collType, nBytes, -2, -2);
  if (r && r->chunk > 0 && (r->algo < 0 || (r->algo == algo && r->proto == proto))) *chunkSize = (size_t)r->chunk;
  return NCCLRL_SUCCESS;
}

EXPORT const ncclrl_tuner_v2_t ncclTunerPlugin_v2 = {"ncclrl", init_v2, get_v2, destroy_ctx};
EXPORT const ncclrl_tuner_v3_t ncclTunerPlugin_v3 = {"ncclrl", init_v3, get_v3, destroy_ctx};
EXPORT const ncclrl_tuner_v4_t ncclTunerPlugin_v4 = {"ncclrl", init_v4, get_v4, destroy_ctx};
EXPORT const ncclrl_tuner_v5_t ncclTunerPlugin_v5 = {"ncclrl", init_v5, get_v4, destroy_ctx};
EXPORT const ncclrl_tuner_v6_t ncclTunerPlugin_v6 = {"ncclrl", init_v6, get_v4, destroy_ctx, chunk_v6};
