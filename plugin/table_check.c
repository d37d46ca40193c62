/*
 * ncclrl-table-check: the plugin's own reading of a table, row by row, for `ncclrl show` and
 * `ncclrl validate`. It compiles the plugin's source in, reads the file as the plugin does
 * (read_file: regular files only, the size cap), and runs the same parser (parse_text) and the same
 * per-communicator selection (select_rows: overlaps, filter limit) for every communicator shape the
 * table can meet: each nNodes value the rows name, and one other, times each nRanks value, and one
 * other. A row is accepted when every such shape it applies to loads it.
 *
 *   ncclrl-table-check PATH
 *
 * Output, one record a line, fields separated by tabs:
 *   ncclrl-table-check  1
 *   table     BYTES  FINGERPRINT  ROWS                      (ROWS: well-formed rows, every shape)
 *   nccl_choice  N                                          (rows marked as NCCL's choice: not loaded)
 *   refused   MESSAGE                                      (the whole table: NCCL decides everywhere)
 *   shape     NNODES  NRANKS  ACCEPTED                     (-1: a value no row names)
 *   accepted  LINE  COLL  MIN  MAX  ALGO  PROTO  CHANNELS  NNODES  NRANKS  PIPEOPS  REGBUFF  CHUNK
 *   rejected  LINE  MESSAGE                                (the plugin's WARN, first one for that line)
 * Exit status 0 when the table was read (rows may still be rejected), 2 on a usage error.
 */
#include "ncclrl_tuner.c"

#define CHECK_MAX_SHAPES 4096
#define OTHER_NODES ((1 << 20) + 1) /* larger than any nNodes a row may name */
#define OTHER_RANKS ((1 << 24) + 1) /* larger than any nRanks a row may name */

static const char* check_origin;
static char** line_msgs; /* per line (1-based), the first WARN naming it */
static int max_line;
static char* refused;
static char shape_note[128];

static void check_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (level != NCCLRL_LOG_WARN && level != NCCLRL_LOG_INFO) return;
  char msg[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* m = msg;
  size_t plen = strlen(PREFIX), olen = strlen(check_origin);
  if (strncmp(m, PREFIX, plen) == 0) m += plen;
  if (level == NCCLRL_LOG_INFO) { /* only a missing file says nothing at WARN */
    if (strncmp(m, "no table at ", 12) == 0 && !refused) refused = strdup(m);
    return;
  }
  /* "ORIGIN:LINE: ..." names a row; anything else refuses the table */
  if (strncmp(m, check_origin, olen) == 0 && m[olen] == ':' && ascii_digit((unsigned char)m[olen + 1])) {
    long ln = 0;
    const char* p = m + olen + 1;
    while (ascii_digit((unsigned char)*p) && ln < INT32_MAX / 10) ln = ln * 10 + (*p++ - '0');
    if (*p == ':' && ln >= 1 && ln <= max_line && !line_msgs[ln]) {
      p++;
      while (*p == ' ') p++;
      size_t n = strlen(p) + strlen(shape_note) + 1;
      line_msgs[ln] = malloc(n);
      if (line_msgs[ln]) snprintf(line_msgs[ln], n, "%s%s", p, shape_note);
    }
    return;
  }
  if (!refused) refused = strdup(m);
}

static int cmp_int(const void* x, const void* y) {
  int a = *(const int*)x, b = *(const int*)y;
  return a < b ? -1 : a > b;
}

/* Distinct values of one column (-1 dropped), then `other`; returns the count. */
static int distinct(const row_t* rows, int n, int ranks, int other, int* out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    int v = ranks ? rows[i].nranks : rows[i].nnodes;
    if (v != -1) out[k++] = v;
  }
  qsort(out, (size_t)k, sizeof(int), cmp_int);
  int d = 0;
  for (int i = 0; i < k; i++)
    if (d == 0 || out[d - 1] != out[i]) out[d++] = out[i];
  out[d++] = other;
  return d;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH\n", argv[0]);
    return 2;
  }
  check_origin = argv[1];
  ctx_t ctx;
  memset(&ctx, 0, sizeof(ctx));
  ctx.log = check_logger;
  ctx.version = 0;
  printf("ncclrl-table-check\t1\n");
  size_t len = 0;
  char* text = read_file(&ctx, argv[1], &len);
  if (!text) {
    printf("refused\t%s\n", refused ? refused : "cannot be read");
    return 0;
  }
  max_line = 1;
  for (size_t i = 0; i < len; i++) max_line += text[i] == '\n';
  line_msgs = calloc((size_t)max_line + 1, sizeof(char*));
  if (!line_msgs) { printf("refused\tout of memory\n"); return 0; }
  const char* nul = memchr(text, '\0', len);
  row_t* rows = NULL;
  int n = 0;
  if (nul) { /* load_text's own check and WARN */
    load_text(&ctx, argv[1], text, len);
  } else if (parse_text(&ctx, argv[1], text, len, &rows, &n) != 0) {
    rows = NULL;
  }
  printf("table\t%zu\t%016llx\t%d\n", len, (unsigned long long)fnv1a64(text, len), n);
  printf("nccl_choice\t%d\n", ctx.nccl_choice); /* rows marked as NCCL's choice: skipped, NCCL decides */
  if (refused) {
    printf("refused\t%s\n", refused);
    return 0;
  }
  int* nodes = malloc(sizeof(int) * ((size_t)n + 1));
  int* ranks = malloc(sizeof(int) * ((size_t)n + 1));
  int* verdict = calloc((size_t)max_line + 1, sizeof(int)); /* 1 accepted somewhere, -1 rejected */
  row_t* work = malloc(sizeof(row_t) * ((size_t)n + 1));
  if (!nodes || !ranks || !verdict || !work) { printf("refused\tout of memory\n"); return 0; }
  int nn = distinct(rows, n, 0, OTHER_NODES, nodes), nr = distinct(rows, n, 1, OTHER_RANKS, ranks);
  if ((long long)nn * nr > CHECK_MAX_SHAPES) { /* too many to cross: the named pairs only */
    nn = nr = 0;
  }
  /* shapes: every (nodes, ranks) crossing, or the (nNodes, nRanks) pairs rows name (-1 as "other") */
  long long nshapes = nn ? (long long)nn * nr : n + 1;
  for (long long s = 0; s < nshapes; s++) {
    size_t sn, sr;
    if (nn) { sn = (size_t)nodes[s / nr]; sr = (size_t)ranks[s % nr]; }
    else if (s < n) {
      sn = rows[s].nnodes == -1 ? OTHER_NODES : (size_t)rows[s].nnodes;
      sr = rows[s].nranks == -1 ? OTHER_RANKS : (size_t)rows[s].nranks;
    } else { sn = OTHER_NODES; sr = OTHER_RANKS; }
    ctx.nnodes = sn;
    ctx.nranks = sr;
    char a[32], b[32];
    snprintf(a, sizeof(a), sn == OTHER_NODES ? "any other number of" : "%zu", sn);
    snprintf(b, sizeof(b), sr == OTHER_RANKS ? "any other number of" : "%zu", sr);
    snprintf(shape_note, sizeof(shape_note), " (on communicators of %s nodes and %s ranks)", a, b);
    memcpy(work, rows, sizeof(row_t) * (size_t)n);
    int k = select_rows(&ctx, argv[1], work, n);
    if (k < 0) { printf("refused\tout of memory\n"); return 0; }
    for (int i = 0; i < n; i++) { /* applicable here and not kept: rejected */
      const row_t* r = &rows[i];
      if ((r->nnodes != -1 && (size_t)r->nnodes != sn) || (r->nranks != -1 && (size_t)r->nranks != sr)) continue;
      if (verdict[r->line] == 0) verdict[r->line] = -2; /* provisional: kept below if found */
    }
    for (int i = 0; i < k; i++)
      if (verdict[work[i].line] == -2) verdict[work[i].line] = 0;
    for (int i = 0; i < n; i++) {
      int ln = rows[i].line;
      if (verdict[ln] == -2) verdict[ln] = -1;
    }
    printf("shape\t%d\t%d\t%d\n", sn == OTHER_NODES ? -1 : (int)sn, sr == OTHER_RANKS ? -1 : (int)sr, k);
  }
  shape_note[0] = '\0';
  int row_i = 0;
  for (int ln = 1; ln <= max_line; ln++) {
    const row_t* r = row_i < n && rows[row_i].line == ln ? &rows[row_i++] : NULL;
    if (r && verdict[ln] == 0) {
      printf("accepted\t%d\t%s\t%llu\t%llu\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%llu\n", ln, COLL_NAMES[(int)r->coll],
             (unsigned long long)r->lo, (unsigned long long)r->hi, r->algo >= 0 ? ALGO_NAMES[(int)r->algo] : "-1",
             r->proto >= 0 ? PROTO_NAMES[(int)r->proto] : "-1", r->channels > 0 ? r->channels : -1, r->nnodes,
             r->nranks, r->pipe, r->regbuff, (unsigned long long)r->chunk);
    } else if (line_msgs[ln]) {
      printf("rejected\t%d\t%s\n", ln, line_msgs[ln]);
    }
  }
  return 0;
}
