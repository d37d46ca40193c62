/*
 * Online mode of the ncclrl plugin (NCCLRL_TUNER_MODE=online): inside the user's job, per
 * communicator, collective and power-of-two size bucket, explore a few candidate configurations
 * ("arms"), time them with the profiler side of this same library, and switch every rank to the
 * winner a coordinator agrees, at the same call index on every rank. The protocol, its timeouts
 * and its failure cases are docs/design/online.md; this file implements the rank's side.
 *
 * This file is compiled into the library through ncclrl_tuner.c (#include, with NCCLRL_ONLINE
 * defined), so it shares the table code and the logger.
 *
 * Arms of a bucket, fixed at its first call (the same on every rank: they come from the table,
 * the candidates file and NCCL's cost table, which every rank computes alike):
 *   0  the static table's decision for each call (apply() as in static mode)
 *   1  NCCL's own choice: the cheapest enabled entry of the cost table, NCCL's channel count
 *   2+ the rows of NCCLRL_ONLINE_CANDIDATES (the exported model's alternatives) covering the size
 * duplicates dropped, entries NCCL disabled (-1) never used, at most ONLINE_MAX_ARMS.
 *
 * Schedule (a function of the bucket's call index only, so identical on every rank): calls
 * 0 .. W-1 run arm 0 (warm-up); round 0's plan is round-robin over the arms for S slots; a plan
 * covers calls [start, start+len); the G calls after it run arm 0 while the ranks' timings are
 * gathered; at call k = start+len+G the coordinator's verdict for the round applies: a new plan
 * (starting at k), a commit to one arm, or an abort (arm 0, the static table, for good).
 *
 * Threads: NCCL's host thread calls getCollInfo (the hot path) and starts collective events; NCCL's
 * proxy thread reports kernel-channel events; one client thread per process talks to the
 * coordinator. The hot path takes no lock except once per round (its end, and the verdict at k).
 */

#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>

#include "ncclrl_profiler_abi.h"

#define ONLINE_PROTO_VERSION 1
#define ONLINE_MAX_ARMS 8
#define ONLINE_MAX_PLAN 64
#define ONLINE_LOG2 64
#define ONLINE_VSLOTS 4
#define ONLINE_FIFO 512 /* per bucket: calls whose collective event has not started yet */
#define ONLINE_COLL_POOL 2048
#define ONLINE_KCH_POOL 8192
#define ONLINE_MAX_COMMS 256
#define ONLINE_LINE 2048
#define MODE_ENV "NCCLRL_TUNER_MODE"
#define COORD_ENV "NCCLRL_ONLINE_COORD"
#define CAND_ENV "NCCLRL_ONLINE_CANDIDATES"
#define CAND_DATA_ENV "NCCLRL_ONLINE_CANDIDATES_DATA"
#define REC_MAGIC 0x6e636f6cu  /* a collective record in use */
#define KCH_MAGIC 0x6e636b63u  /* a kernel-channel record in use */

enum { B_EXPLORE = 1, B_DONE = 2 };
enum { V_PLAN = 1, V_COMMIT = 2, V_ABORT = 3 };

typedef struct {
  int8_t algo, proto; /* -1: the static table's decision (arm 0) */
  int16_t channels;   /* 0: NCCL's own */
} ocfg_t;

typedef struct obucket {
  int id;             /* coll * 64 + log2(nBytes) */
  int coll;
  /* host thread only */
  int state;
  int narms;
  ocfg_t arms[ONLINE_MAX_ARMS];
  ocfg_t arm0_first;  /* what arm 0 forced at the bucket's first call (for the fingerprint) */
  uint64_t fp;        /* fingerprint of the arm set: every rank must report the same */
  uint64_t calls;     /* index of the next call */
  uint64_t start;     /* the current plan covers [start, start+len) */
  int len;
  uint8_t plan[ONLINE_MAX_PLAN];
  uint64_t next_k;    /* the index at which the current round's verdict applies */
  int round;
  int final_arm;      /* state B_DONE: the arm every later call runs */
  /* host -> collective-event side: the arm each call ran, in call order (single producer, single consumer) */
  int8_t fifo_arm[ONLINE_FIFO];
  ocfg_t fifo_cfg[ONLINE_FIFO];
  uint64_t fifo_nbytes[ONLINE_FIFO];
  _Atomic uint64_t fifo_head;
  _Atomic uint64_t fifo_tail;
  /* verdict mailboxes, one per round modulo ONLINE_VSLOTS: a later round's verdict (an abort sent to
   * every rank when the communicator freezes) never overwrites one this rank has not applied yet. The
   * client thread fills slot r % ONLINE_VSLOTS under the comm's lock, then publishes vtag = r + 1. */
  struct {
    _Atomic int vtag;
    int kind, arm, len;
    uint64_t k;
    uint8_t plan[ONLINE_MAX_PLAN];
    char evidence[512];
  } v[ONLINE_VSLOTS];
  /* evidence and reporting (under the comm's lock) */
  uint64_t n[ONLINE_MAX_ARMS];
  double sum_us[ONLINE_MAX_ARMS], sumsq_us[ONLINE_MAX_ARMS];
  uint64_t done;        /* calls whose collective finished (timed or not) */
  uint64_t dropped;     /* samples refused: another configuration ran, or an impossible duration */
  int report_round;     /* the round whose report is due, -1 none */
  uint64_t report_need; /* calls that must have finished before the report is complete */
  uint64_t report_k;
  double report_due_s;  /* report anyway at this time (CLOCK_MONOTONIC s) */
  int reported_round;
} obucket_t;

typedef struct ocoll {
  uint32_t magic;
  uint32_t gen;
  struct ocomm* comm;
  obucket_t* bucket;
  int arm;              /* -1: not a sample (another configuration ran) */
  int nch, seen;
  uint64_t t0, t1;      /* GPU timer, ns: earliest channel start, latest channel stop */
  int stopped;
} ocoll_t;

typedef struct okch {
  uint32_t magic;
  uint32_t gen;         /* the parent's generation when this channel started */
  ocoll_t* parent;
  uint64_t t0, t1;
  int has_t1;
} okch_t;

typedef struct ocomm {
  uint64_t comm_id;
  int rank, nranks, nnodes;
  int prof_refs, tuner_refs, tuner_claimed;
  int priv;             /* a state no coordinator hears of (the rank cannot report): never registered */
  _Atomic int online;   /* this rank reports to a coordinator (set at attach; cleared when it cannot) */
  _Atomic int frozen;   /* the coordinator froze it (a fault): no verdict will ever come */
  ncclrl_logger_t log;
  pthread_mutex_t mu;
  obucket_t* b[NCCLRL_NUM_COLLS][ONLINE_LOG2];
  row_t* cand;
  int ncand;
  int hello_sent;
  ocoll_t colls[ONLINE_COLL_POOL];
  uint64_t coll_next;
  okch_t kchs[ONLINE_KCH_POOL];
  uint64_t kch_next;
} ocomm_t;

/* ---- process-wide state ---- */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ocomm_t* _Atomic g_comms[ONLINE_MAX_COMMS];
static int g_client_started;
static pthread_t g_client;
static _Atomic int g_lost;       /* the coordinator is gone, refused us, or was never reached (set by the reader only) */
static _Atomic int g_broken;     /* we cannot send any more (outbox full, send error): read what is left, then lost */
static _Atomic int g_welcomed;   /* the coordinator answered VERSION (its round timeout is known) */
static _Atomic int g_coord_timeout_ms = 10000;
static _Atomic int g_stop;
static char g_outbox[1 << 16];   /* lines for the coordinator (under g_mu) */
static size_t g_outlen;
static double g_gather_s = 2.0, g_wait_s = 30.0;
static int g_slots = 16, g_gap = 8, g_warmup = 2, g_settings_read;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int online_requested(void) {
  const char* m = getenv(MODE_ENV);
  return m && ascii_caseeq(m, "online");
}

static double env_double(const char* name, double def, double lo, double hi) {
  const char* v = getenv(name);
  if (!v || !*v) return def;
  char* end = NULL;
  double x = strtod(v, &end);
  return (end && *end == '\0' && x >= lo && x <= hi) ? x : def;
}

static void read_online_settings(void) {
  g_gather_s = env_double("NCCLRL_ONLINE_GATHER_S", 2.0, 0.001, 600.0);
  g_wait_s = env_double("NCCLRL_ONLINE_WAIT_S", 30.0, 0.01, 3600.0);
  g_slots = (int)env_double("NCCLRL_ONLINE_SLOTS", 16, 2, ONLINE_MAX_PLAN);
  g_gap = (int)env_double("NCCLRL_ONLINE_GAP_CALLS", 8, 1, 1 << 20);
  g_warmup = (int)env_double("NCCLRL_ONLINE_WARMUP_CALLS", 2, 0, 1 << 20);
  g_settings_read = 1;
}

/* The verdict wait never ends before the coordinator's own round timeout has passed after the
 * latest moment this rank can have reported: a verdict the coordinator sends always arrives in time. */
static double verdict_wait_s(void) {
  double floor_s = g_gather_s + atomic_load(&g_coord_timeout_ms) / 1000.0 + 2.0;
  return g_wait_s > floor_s ? g_wait_s : floor_s;
}

static void outbox_put(const char* line) {
  size_t n = strlen(line);
  pthread_mutex_lock(&g_mu);
  if (g_outlen + n < sizeof(g_outbox)) {
    memcpy(g_outbox + g_outlen, line, n);
    g_outlen += n;
  } else {
    atomic_store(&g_broken, 1); /* the coordinator does not read: stop sending, drain what it sent */
  }
  pthread_mutex_unlock(&g_mu);
}

/* A whole decimal number in [lo, hi], or -1 (callers pass lo >= 0). */
static long long parse_num(const char* s, long long lo, long long hi, int base) {
  if (!s || !*s) return -1;
  char* end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, base);
  return (errno || !end || *end || v < lo || v > hi) ? -1 : v;
}

static uint64_t fnv_mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) { h ^= (v >> (8 * i)) & 0xff; h *= 1099511628211ull; }
  return h;
}

/* ---- the comm registry (tuner and profiler contexts share one ocomm_t per communicator) ---- */

static ocomm_t* comm_find_locked(uint64_t id) {
  for (int i = 0; i < ONLINE_MAX_COMMS; i++) {
    ocomm_t* c = atomic_load(&g_comms[i]);
    if (c && c->comm_id == id) return c;
  }
  return NULL;
}

static void comm_free(ocomm_t* c) {
  for (int i = 0; i < NCCLRL_NUM_COLLS; i++)
    for (int j = 0; j < ONLINE_LOG2; j++) free(c->b[i][j]);
  free(c->cand);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static void comm_release_locked(ocomm_t* c) {
  if (c->prof_refs > 0 || c->tuner_refs > 0) return;
  for (int i = 0; i < ONLINE_MAX_COMMS; i++)
    if (atomic_load(&g_comms[i]) == c) atomic_store(&g_comms[i], NULL);
  comm_free(c);
}

/* Is p a record of one of our pools (a handle NCCL gave back)? Garbage is ignored, never read. */
static ocomm_t* pool_owner(const void* p, int kch) {
  for (int i = 0; i < ONLINE_MAX_COMMS; i++) {
    ocomm_t* c = atomic_load(&g_comms[i]);
    if (!c) continue;
    const char* lo = kch ? (const char*)c->kchs : (const char*)c->colls;
    size_t sz = kch ? sizeof(c->kchs) : sizeof(c->colls);
    size_t rs = kch ? sizeof(okch_t) : sizeof(ocoll_t);
    const char* q = (const char*)p;
    if (q >= lo && q < lo + sz && (size_t)(q - lo) % rs == 0) return c;
  }
  return NULL;
}

/* ---- the client thread ---- */

static void comm_freeze_all(const char* why) {
  (void)why;
  atomic_store(&g_lost, 1);
}

static int connect_coordinator(const char* spec) {
  char host[256];
  const char* colon = strrchr(spec, ':');
  if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host)) return -1;
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = '\0';
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res) return -1;
  int fd = -1;
  for (struct addrinfo* a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc == 0) break;
    if (errno == EINPROGRESS) {
      struct pollfd p = {fd, POLLOUT, 0};
      int err = 0;
      socklen_t el = sizeof(err);
      int up = 0;
      for (int t = 0; t < 50 && !atomic_load(&g_stop) && !up; t++) /* 5 s at most, ended early on unload */
        up = poll(&p, 1, 100) == 1;
      if (up && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) break;
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

static obucket_t* bucket_by_id(ocomm_t* c, int id) {
  if (id < 0 || id >= NCCLRL_NUM_COLLS * ONLINE_LOG2) return NULL;
  return c->b[id / ONLINE_LOG2][id % ONLINE_LOG2];
}

/* One line from the coordinator. Anything malformed: the coordinator is not one we can trust: lost. */
static void handle_line(char* line, int* welcomed) {
  char* save = NULL;
  char* w = strtok_r(line, " ", &save);
  if (!w) return;
  if (strcmp(w, "WELCOME") == 0) {
    char* v = strtok_r(NULL, " ", &save);
    char* t = strtok_r(NULL, " ", &save);
    long long ms = parse_num(t, 1, 3600000, 10);
    if (parse_num(v, 0, 1 << 30, 10) != ONLINE_PROTO_VERSION || ms < 0) { comm_freeze_all("version"); return; }
    atomic_store(&g_coord_timeout_ms, (int)ms);
    *welcomed = 1;
    atomic_store(&g_welcomed, 1);
    return;
  }
  if (strcmp(w, "FREEZE") == 0) {
    char* id = strtok_r(NULL, " ", &save);
    if (!id) return;
    uint64_t cid = strtoull(id, NULL, 16);
    pthread_mutex_lock(&g_mu);
    ocomm_t* c = comm_find_locked(cid);
    if (c) atomic_store(&c->frozen, 1); /* an unknown id: nothing of ours */
    pthread_mutex_unlock(&g_mu);
    return;
  }
  if (strcmp(w, "VERDICT") != 0) { comm_freeze_all("unknown message"); return; }
  char* f[6];
  for (int i = 0; i < 6; i++) f[i] = strtok_r(NULL, " ", &save);
  char* ev = strtok_r(NULL, "", &save);
  if (!f[5]) { comm_freeze_all("short verdict"); return; }
  uint64_t cid = strtoull(f[0], NULL, 16);
  long long id = parse_num(f[1], 0, NCCLRL_NUM_COLLS * ONLINE_LOG2 - 1, 10);
  long long rnd = parse_num(f[2], 0, 1 << 30, 10);
  long long kk = parse_num(f[3], 0, INT64_MAX, 10);
  if (id < 0 || rnd < 0 || kk < 0) { comm_freeze_all("malformed verdict"); return; }
  int round = (int)rnd;
  uint64_t k = (uint64_t)kk;
  pthread_mutex_lock(&g_mu); /* held throughout: a communicator is freed under it */
  ocomm_t* c = comm_find_locked(cid);
  if (!c) { pthread_mutex_unlock(&g_mu); return; }
  pthread_mutex_lock(&c->mu);
  obucket_t* b = bucket_by_id(c, (int)id);
  if (b && round >= 0 && atomic_load(&b->v[round % ONLINE_VSLOTS].vtag) != round + 1) {
    __typeof__(b->v[0])* m = &b->v[round % ONLINE_VSLOTS];
    atomic_store_explicit(&m->vtag, 0, memory_order_relaxed);
    m->k = k;
    m->len = 0;
    m->evidence[0] = '\0';
    if (ev) snprintf(m->evidence, sizeof(m->evidence), "%s", ev);
    if (strcmp(f[4], "PLAN") == 0) {
      m->kind = V_PLAN;
      char* s2 = NULL;
      for (char* a = strtok_r(f[5], ",", &s2); a; a = strtok_r(NULL, ",", &s2)) {
        long long arm = parse_num(a, 0, ONLINE_MAX_ARMS - 1, 10);
        if (arm < 0 || m->len == ONLINE_MAX_PLAN) { m->len = 0; break; } /* refused at k, alike on every rank */
        m->plan[m->len++] = (uint8_t)arm;
      }
    } else if (strcmp(f[4], "COMMIT") == 0) {
      m->kind = V_COMMIT;
      m->arm = (int)parse_num(f[5], 0, ONLINE_MAX_ARMS - 1, 10);
    } else {
      m->kind = V_ABORT;
    }
    atomic_store_explicit(&m->vtag, round + 1, memory_order_release);
  }
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_unlock(&g_mu);
}

/* Reports due: complete (every call through the round's end has finished) or past the gather time. */
static void send_reports(double now) {
  char line[ONLINE_LINE];
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < ONLINE_MAX_COMMS; i++) {
    ocomm_t* c = atomic_load(&g_comms[i]);
    if (!c || !c->online) continue;
    pthread_mutex_lock(&c->mu);
    if (!c->hello_sent) {
      snprintf(line, sizeof(line), "HELLO %d %016llx %d %d %d %ld\n", ONLINE_PROTO_VERSION,
               (unsigned long long)c->comm_id, c->rank, c->nranks, c->nnodes, (long)getpid());
      size_t n = strlen(line);
      if (g_outlen + n < sizeof(g_outbox)) { memcpy(g_outbox + g_outlen, line, n); g_outlen += n; c->hello_sent = 1; }
    }
    for (int co = 0; co < NCCLRL_NUM_COLLS; co++)
      for (int j = 0; j < ONLINE_LOG2; j++) {
        obucket_t* b = c->b[co][j];
        if (!c->hello_sent || !b || b->report_round < 0 || b->report_round == b->reported_round) continue;
        if (b->done < b->report_need && now < b->report_due_s) continue;
        int off = snprintf(line, sizeof(line), "REPORT %016llx %d %d %d %llu %016llx %d",
                           (unsigned long long)c->comm_id, c->rank, b->id, b->report_round,
                           (unsigned long long)b->report_k, (unsigned long long)b->fp, b->narms);
        for (int a = 0; a < b->narms && off < (int)sizeof(line) - 80; a++)
          off += snprintf(line + off, sizeof(line) - off, " %llu:%.3f:%.3f", (unsigned long long)b->n[a],
                          b->sum_us[a], b->sumsq_us[a]);
        snprintf(line + off, sizeof(line) - off, "\n");
        size_t n = strlen(line);
        if (g_outlen + n < sizeof(g_outbox)) {
          memcpy(g_outbox + g_outlen, line, n);
          g_outlen += n;
          b->reported_round = b->report_round;
        }
      }
    pthread_mutex_unlock(&c->mu);
  }
  pthread_mutex_unlock(&g_mu);
}

static void* client_main(void* arg) {
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  const char* spec = getenv(COORD_ENV);
  int fd = spec && *spec ? connect_coordinator(spec) : -1;
  if (fd < 0) { atomic_store(&g_lost, 1); return NULL; }
  char hello[64];
  snprintf(hello, sizeof(hello), "VERSION %d\n", ONLINE_PROTO_VERSION);
  outbox_put(hello);
  char in[ONLINE_LINE * 4];
  size_t inlen = 0;
  int welcomed = 0, shut = 0;
  double t_start = mono_s(), broken_at = 0.0;
  /* Only this reader decides the coordinator is lost: at EOF, a read error, a malformed line, or
   * (once it cannot send) after draining what the coordinator sent for a round timeout and 2 s. */
  while (!atomic_load(&g_stop) && !atomic_load(&g_lost)) {
    double now = mono_s();
    if (!welcomed && now - t_start > 10.0) { atomic_store(&g_lost, 1); break; }
    if (atomic_load(&g_broken) && !shut) {
      shutdown(fd, SHUT_WR);
      shut = 1;
      broken_at = now;
    }
    if (shut && now - broken_at > atomic_load(&g_coord_timeout_ms) / 1000.0 + 2.0) { atomic_store(&g_lost, 1); break; }
    if (welcomed && !shut) send_reports(now);
    pthread_mutex_lock(&g_mu);
    if (g_outlen > 0 && !shut) {
      ssize_t w = send(fd, g_outbox, g_outlen, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) { memmove(g_outbox, g_outbox + w, g_outlen - (size_t)w); g_outlen -= (size_t)w; }
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) atomic_store(&g_broken, 1);
    }
    pthread_mutex_unlock(&g_mu);
    struct pollfd p = {fd, POLLIN, 0};
    int rc = poll(&p, 1, 1);
    if (rc < 0 && errno != EINTR) { atomic_store(&g_lost, 1); break; }
    if (rc > 0) {
      ssize_t r = recv(fd, in + inlen, sizeof(in) - 1 - inlen, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) { atomic_store(&g_lost, 1); break; }
      if (r > 0) {
        inlen += (size_t)r;
        in[inlen] = '\0';
        char* s = in;
        char* nl;
        while ((nl = memchr(s, '\n', inlen - (size_t)(s - in))) && !atomic_load(&g_lost)) {
          *nl = '\0';
          handle_line(s, &welcomed);
          s = nl + 1;
        }
        size_t rest = inlen - (size_t)(s - in);
        if (rest >= sizeof(in) - 1) { atomic_store(&g_lost, 1); break; } /* a line longer than any we speak */
        memmove(in, s, rest);
        inlen = rest;
      }
    }
  }
  close(fd);
  return NULL;
}

static void client_start_locked(void) {
  if (g_client_started) return;
  g_client_started = 1;
  read_online_settings();
  if (pthread_create(&g_client, NULL, client_main, NULL) != 0) {
    atomic_store(&g_lost, 1);
    g_client_started = 0;
  }
}

/* NCCL unloads the library (dlclose) once its last communicator is gone: the client thread must
 * have ended before the code it runs is unmapped. */
__attribute__((destructor)) static void client_stop(void) {
  pthread_mutex_lock(&g_mu);
  int started = g_client_started;
  g_client_started = 0;
  pthread_mutex_unlock(&g_mu);
  if (!started) return;
  atomic_store(&g_stop, 1);
  pthread_join(g_client, NULL);
}

/* ---- attaching contexts ---- */

static ocomm_t* comm_new_locked(uint64_t id) {
  int slot = -1;
  for (int i = 0; i < ONLINE_MAX_COMMS; i++)
    if (!atomic_load(&g_comms[i])) { slot = i; break; }
  if (slot < 0) return NULL;
  ocomm_t* c = calloc(1, sizeof(ocomm_t));
  if (!c) return NULL;
  c->comm_id = id;
  c->rank = -1;
  pthread_mutex_init(&c->mu, NULL);
  atomic_store(&g_comms[slot], c);
  return c;
}

/* Candidate rows (NVIDIA's CSV columns; ranges may overlap: every row covering a size is an arm), from
 * the text of NCCLRL_ONLINE_CANDIDATES_DATA (set and non-empty) or the file NCCLRL_ONLINE_CANDIDATES. */
static void load_candidates(ctx_t* ctx, ocomm_t* c) {
  const char* data = getenv(CAND_DATA_ENV);
  const char* path = getenv(CAND_ENV);
  char* text = NULL;
  size_t len = 0;
  if (data && *data) {
    len = strlen(data);
    path = CAND_DATA_ENV;
    text = len <= MAX_TABLE_BYTES ? malloc(len + 1) : NULL;
    if (text) memcpy(text, data, len + 1);
  } else {
    if (!path || !*path) return;
    char* raw = read_file(ctx, path, &len);
    if (!raw) return;
    text = malloc(len + 1); /* the file's bytes are not NUL-terminated */
    if (text) { memcpy(text, raw, len); text[len] = '\0'; }
    free(raw);
  }
  if (!text) return;
  if (strlen(text) != len) {
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "online: candidates %s hold a NUL byte: no alternatives", path);
    free(text);
    return;
  }
  int cap = 64;
  c->cand = calloc((size_t)cap, sizeof(row_t));
  char* save = NULL;
  int lineno = 0;
  for (char* line = strtok_r(text, "\n", &save); line && c->cand; line = strtok_r(NULL, "\n", &save)) {
    lineno++;
    row_t r;
    if (parse_line(ctx, path, lineno, line, &r) != 1) continue;
    if (r.algo < 0) continue;
    if ((r.nnodes != -1 && (size_t)r.nnodes != ctx->nnodes) || (r.nranks != -1 && (size_t)r.nranks != ctx->nranks)) continue;
    if (c->ncand == cap) {
      row_t* m = realloc(c->cand, sizeof(row_t) * (size_t)cap * 2);
      if (!m) break;
      c->cand = m;
      cap *= 2;
    }
    c->cand[c->ncand++] = r;
  }
  free(text);
  LOG(ctx, NCCLRL_LOG_INFO, PREFIX "online: %d candidate rows from %s", c->ncand, path);
}

/* Called by the tuner's init (ABI v5+): the online state of this communicator, or NULL (static mode).
 * A rank that cannot take part (no profiler, several ranks of the communicator in this process, no
 * coordinator) still runs the schedule on a private state that never reports: the coordinator then
 * never hears from it, aborts, and every rank freezes at the same call. It never runs the static
 * table on its own while the others explore. */
static ocomm_t* online_attach(ctx_t* ctx, uint64_t comm_id) {
  if (!online_requested()) return NULL;
  pthread_mutex_lock(&g_mu);
  if (!g_settings_read) read_online_settings();
  ocomm_t* c = comm_find_locked(comm_id);
  const char* spec = getenv(COORD_ENV);
  const char* why = NULL;
  if (!c || c->prof_refs == 0 || c->rank < 0)
    why = "this library is not loaded as the profiler too (NCCL_PROFILER_PLUGIN=<the path of NCCL_TUNER_PLUGIN>)";
  else if (c->tuner_claimed)
    why = "the communicator has several ranks in this process";
  else if (!spec || !*spec)
    why = COORD_ENV " is not set (HOST:PORT of ncclrl coordinator)";
  if (why) {
    if (c && c->tuner_claimed) c->online = 0; /* its profiler's rank is ambiguous: that state must not report either */
    ocomm_t* p = calloc(1, sizeof(ocomm_t));
    if (p) {
      pthread_mutex_init(&p->mu, NULL);
      p->comm_id = comm_id;
      p->rank = -1;
      p->priv = 1;
      p->log = ctx->log;
      p->nranks = (int)ctx->nranks;
      p->nnodes = (int)ctx->nnodes;
    }
    pthread_mutex_unlock(&g_mu);
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX "online mode on communicator %016llx cannot report: %s. Every rank freezes on the "
        "static table at each bucket's first verdict point", (unsigned long long)comm_id, why);
    if (p) load_candidates(ctx, p);
    return p;
  }
  c->tuner_claimed = 1;
  c->tuner_refs++;
  c->log = ctx->log;
  c->nranks = (int)ctx->nranks;
  c->nnodes = (int)ctx->nnodes;
  c->online = 1;
  client_start_locked();
  pthread_mutex_unlock(&g_mu);
  load_candidates(ctx, c);
  LOG(ctx, NCCLRL_LOG_INFO, PREFIX "online mode on communicator %016llx (rank %d of %d): coordinator %s, %d slots "
      "per round at most, gap %d calls, warm-up %d calls, verdict wait %.1f s", (unsigned long long)comm_id, c->rank,
      c->nranks, spec, g_slots, g_gap, g_warmup, verdict_wait_s());
  return c;
}

static void online_detach(ocomm_t* c) {
  if (!c) return;
  if (c->priv) { comm_free(c); return; }
  pthread_mutex_lock(&c->mu);
  int said_hello = c->hello_sent;
  pthread_mutex_unlock(&c->mu);
  if (said_hello && atomic_load(&c->online) && !atomic_load(&g_lost)) { /* a rank that leaves on purpose is no fault */
    char bye[64];
    snprintf(bye, sizeof(bye), "BYE %016llx %d\n", (unsigned long long)c->comm_id, c->rank);
    outbox_put(bye);
    struct timespec nap = {0, 1000000};
    for (int i = 0; i < 200 && !atomic_load(&g_lost); i++) {
      pthread_mutex_lock(&g_mu);
      size_t left = g_outlen;
      pthread_mutex_unlock(&g_mu);
      if (!left) break;
      nanosleep(&nap, NULL);
    }
  }
  pthread_mutex_lock(&g_mu);
  c->tuner_refs--;
  c->online = 0;
  comm_release_locked(c);
  pthread_mutex_unlock(&g_mu);
}

/* ---- the hot path ---- */

static int log2_bucket(size_t n) { return n ? 63 - __builtin_clzll((unsigned long long)n) : 0; }

/* NCCL's own choice: the smallest enabled entry (ties: lower algorithm, then lower protocol). */
static int nccl_choice(float** costTable, int numAlgo, int numProto, int* algo, int* proto) {
  if (!costTable) return 0;
  float (*t)[numProto] = (float (*)[numProto])costTable;
  float best = -1.0f;
  for (int a = 0; a < numAlgo; a++)
    for (int p = 0; p < numProto; p++)
      if (t[a][p] >= 0.0f && (best < 0.0f || t[a][p] < best)) { best = t[a][p]; *algo = a; *proto = p; }
  return best >= 0.0f;
}

static int cfg_eq(ocfg_t a, ocfg_t b) { return a.algo == b.algo && a.proto == b.proto && a.channels == b.channels; }

static obucket_t* bucket_new(ocomm_t* c, ctx_t* ctx, int coll, size_t nBytes, int lg, float** costTable, int numAlgo,
                             int numProto, ocfg_t arm0) {
  obucket_t* b = calloc(1, sizeof(obucket_t));
  if (!b) return NULL;
  b->id = coll * ONLINE_LOG2 + lg;
  b->coll = coll;
  b->report_round = -1;
  b->reported_round = -1;
  b->arm0_first = arm0;
  b->arms[0] = (ocfg_t){-1, -1, 0};
  b->narms = 1;
  int na = -1, np = -1;
  if (nccl_choice(costTable, numAlgo, numProto, &na, &np)) {
    ocfg_t nc = {(int8_t)na, (int8_t)np, 0};
    if (!cfg_eq(nc, arm0)) b->arms[b->narms++] = nc;
  }
  float (*t)[numProto] = (float (*)[numProto])costTable;
  for (int i = 0; i < c->ncand && b->narms < ONLINE_MAX_ARMS; i++) {
    const row_t* r = &c->cand[i];
    if (r->coll != coll || r->lo > nBytes || r->hi < nBytes) continue;
    if (!costTable || r->algo >= numAlgo || r->proto >= numProto || t[r->algo][r->proto] < 0.0f) continue;
    ocfg_t x = {r->algo, r->proto, r->channels > 0 ? r->channels : 0};
    int dup = cfg_eq(x, arm0);
    for (int a = 1; a < b->narms && !dup; a++) dup = cfg_eq(x, b->arms[a]);
    if (!dup) b->arms[b->narms++] = x;
  }
  uint64_t fp = 1469598103934665603ull;
  fp = fnv_mix(fp, (uint64_t)b->narms);
  fp = fnv_mix(fp, ((uint64_t)(uint8_t)arm0.algo << 24) | ((uint64_t)(uint8_t)arm0.proto << 16) | (uint16_t)arm0.channels);
  for (int a = 1; a < b->narms; a++)
    fp = fnv_mix(fp, ((uint64_t)(uint8_t)b->arms[a].algo << 24) | ((uint64_t)(uint8_t)b->arms[a].proto << 16) |
                     (uint16_t)b->arms[a].channels);
  b->fp = fp;
  /* Never a function of this rank's connection or timing (those differ between ranks): the same on
   * every rank. Round 0 has no plan: arm 0 runs until call W, where the coordinator's first verdict
   * (a plan every rank received, or an abort) applies; its report asks for it at once. */
  if (b->narms < 2) {
    b->state = B_DONE;
    b->final_arm = 0;
  } else {
    b->state = B_EXPLORE;
    b->start = 0;
    b->len = 0;
    b->next_k = (uint64_t)g_warmup;
    b->round = 0;
    b->report_round = 0;
    b->report_need = 0;
    b->report_k = b->next_k;
    b->report_due_s = 0.0;
  }
  if (ctx->trace || b->state == B_EXPLORE) {
    char arms[256];
    int off = 0;
    for (int a = 1; a < b->narms && off < (int)sizeof(arms) - 40; a++)
      off += snprintf(arms + off, sizeof(arms) - off, " %d=%s/%s/%d", a, ALGO_NAMES[(int)b->arms[a].algo],
                      PROTO_NAMES[(int)b->arms[a].proto], (int)b->arms[a].channels);
    LOG(ctx, NCCLRL_LOG_INFO, PREFIX "online %016llx %s 2^%d B: arms 0=table%s; %s", (unsigned long long)c->comm_id,
        COLL_NAMES[coll], lg, arms, b->state == B_EXPLORE ? "exploring" : "nothing to explore");
  }
  return b;
}

static void freeze_bucket(ocomm_t* c, obucket_t* b, const char* why) {
  b->state = B_DONE;
  b->final_arm = 0;
  c->log(NCCLRL_LOG_WARN, NCCLRL_SUBSYS_TUNING, __FILE__, __LINE__,
         PREFIX "online %016llx %s 2^%d B: frozen on the static table at call %llu (round %d): %s",
         (unsigned long long)c->comm_id, COLL_NAMES[b->coll], b->id % ONLINE_LOG2, (unsigned long long)b->calls,
         b->round, why);
}

/* At call next_k: apply the round's verdict, waiting for it (bounded) if it has not arrived. */
static void resolve_verdict(ocomm_t* c, obucket_t* b) {
  int want = b->round + 1;
  _Atomic int* tag = &b->v[b->round % ONLINE_VSLOTS].vtag;
  if (atomic_load_explicit(tag, memory_order_acquire) != want) {
    double t0 = -1.0; /* the countdown starts once the coordinator's round timeout is known (or it is lost) */
    struct timespec nap = {0, 20000};
    for (;;) {
      if (t0 < 0.0 && (atomic_load(&g_welcomed) || atomic_load(&g_lost) || !atomic_load(&c->online))) t0 = mono_s();
      double limit = verdict_wait_s();
      /* A fault is read after the verdict that preceded it on the connection (one thread reads both, in
       * order): once a fault is seen, a verdict not yet here will never come, and one that came is
       * applied as on the ranks that got it first. */
      const char* fault = !atomic_load(&c->online) ? "this rank cannot reach a coordinator"
                        : atomic_load(&g_lost) ? "the coordinator is gone and no verdict came"
                        : atomic_load(&c->frozen) ? "the coordinator froze this communicator"
                        : t0 >= 0.0 && mono_s() - t0 > limit ? "no verdict within the wait" : NULL;
      if (atomic_load_explicit(tag, memory_order_acquire) == want) break;
      if (fault) { freeze_bucket(c, b, fault); return; }
      nanosleep(&nap, NULL);
      if (nap.tv_nsec < 1000000) nap.tv_nsec *= 2;
    }
  }
  pthread_mutex_lock(&c->mu);
  __typeof__(b->v[0])* m = &b->v[b->round % ONLINE_VSLOTS];
  int kind = m->kind, arm = m->arm, len = m->len;
  uint64_t k = m->k;
  uint8_t plan[ONLINE_MAX_PLAN];
  memcpy(plan, m->plan, sizeof(plan));
  char ev[512];
  snprintf(ev, sizeof(ev), "%s", m->evidence);
  pthread_mutex_unlock(&c->mu);
  /* a verdict that does not fit this bucket is refused alike on every rank (same state, same verdict) */
  if (k != b->next_k) { freeze_bucket(c, b, "a verdict for another call index"); return; }
  if (kind == V_PLAN) {
    int ok = len > 0;
    for (int i = 0; i < len && ok; i++) ok = plan[i] < b->narms;
    if (!ok) { freeze_bucket(c, b, "a plan naming arms this bucket does not have"); return; }
    memcpy(b->plan, plan, sizeof(plan));
    b->len = len;
    b->start = k;
    b->next_k = k + (uint64_t)len + (uint64_t)g_gap;
    b->round++;
    return;
  }
  if (kind == V_COMMIT && arm >= 0 && arm < b->narms) {
    b->state = B_DONE;
    b->final_arm = arm;
    char what[64] = "the static table";
    if (arm > 0)
      snprintf(what, sizeof(what), "%s/%s/%d", ALGO_NAMES[(int)b->arms[arm].algo], PROTO_NAMES[(int)b->arms[arm].proto],
               (int)b->arms[arm].channels);
    c->log(NCCLRL_LOG_INFO, NCCLRL_SUBSYS_TUNING, __FILE__, __LINE__,
           PREFIX "online %016llx %s 2^%d B: commit arm %d (%s) from call %llu after %d rounds; evidence %s",
           (unsigned long long)c->comm_id, COLL_NAMES[b->coll], b->id % ONLINE_LOG2, arm, what, (unsigned long long)k,
           b->round + 1, ev);
    return;
  }
  freeze_bucket(c, b, kind == V_ABORT ? "the coordinator aborted the round" : "a malformed verdict");
}

/* The hot path. Returns the arm this call runs (0: the static table's decision; the caller applies
 * it) and fills *cfg for arms > 0; *bp is the bucket to note the call in afterwards, or NULL. */
static int online_pick(ocomm_t* c, ctx_t* ctx, int coll, size_t nBytes, float** costTable, int numAlgo, int numProto,
                       ocfg_t arm0, obucket_t** bp, ocfg_t* cfg, int* timed) {
  *bp = NULL;
  *timed = 0;
  if (coll < 0 || coll >= NCCLRL_NUM_COLLS) return 0;
  int lg = log2_bucket(nBytes);
  obucket_t* b = c->b[coll][lg];
  if (!b) {
    b = bucket_new(c, ctx, coll, nBytes, lg, costTable, numAlgo, numProto, arm0);
    if (!b) return 0;
    pthread_mutex_lock(&c->mu);
    c->b[coll][lg] = b;
    pthread_mutex_unlock(&c->mu);
  }
  uint64_t i = b->calls++;
  if (b->state != B_EXPLORE) {
    if (b->final_arm > 0) { *cfg = b->arms[b->final_arm]; return b->final_arm; }
    return 0;
  }
  if (i == b->next_k) {
    resolve_verdict(c, b);
    if (b->state != B_EXPLORE) {
      if (b->final_arm > 0) { *cfg = b->arms[b->final_arm]; return b->final_arm; }
      *bp = b; /* still noted: the calls before k may be waiting for their events */
      return 0;
    }
  }
  *bp = b;
  /* only the plan's calls are samples: warm-up and gap calls are noted (their events come and count
   * toward the report's completeness) but the policy reads the plan's counts as the arms it explored */
  if (i >= b->start && i < b->start + (uint64_t)b->len) {
    *timed = 1;
    int arm = b->plan[i - b->start];
    if (i + 1 == b->start + (uint64_t)b->len) { /* the round's last call: its report is due once every call so far finished */
      pthread_mutex_lock(&c->mu);
      b->report_round = b->round;
      b->report_need = atomic_load(&b->fifo_head) + 1;
      b->report_k = b->next_k;
      b->report_due_s = mono_s() + g_gather_s;
      pthread_mutex_unlock(&c->mu);
    }
    if (arm > 0) *cfg = b->arms[arm];
    return arm;
  }
  return 0;
}

/* After the decision: what this call forced (arm, configuration), for its collective event to match. */
static void online_note(obucket_t* b, int arm, ocfg_t ran, size_t nBytes) {
  uint64_t h = atomic_load_explicit(&b->fifo_head, memory_order_relaxed);
  uint64_t t = atomic_load_explicit(&b->fifo_tail, memory_order_acquire);
  if (h - t >= ONLINE_FIFO) return; /* events are not coming (profiler off for these calls): stop noting */
  b->fifo_arm[h % ONLINE_FIFO] = (int8_t)arm;
  b->fifo_cfg[h % ONLINE_FIFO] = ran;
  b->fifo_nbytes[h % ONLINE_FIFO] = nBytes;
  atomic_store_explicit(&b->fifo_head, h + 1, memory_order_release);
}

/* ---- the profiler side ---- */

static int coll_from_name(const char* f) {
  if (!f) return -1;
  if (strcmp(f, "AllReduce") == 0) return NCCLRL_ALLREDUCE;
  if (strcmp(f, "AllGather") == 0) return NCCLRL_ALLGATHER;
  if (strcmp(f, "ReduceScatter") == 0) return NCCLRL_REDUCESCATTER;
  if (strcmp(f, "Broadcast") == 0) return NCCLRL_BROADCAST;
  if (strcmp(f, "Reduce") == 0) return NCCLRL_REDUCE;
  return -1;
}

static size_t dtype_size(const char* d) {
  if (!d) return 0;
  static const struct { const char* name; size_t size; } T[] = {
    {"ncclInt8", 1}, {"ncclUint8", 1}, {"ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", 1}, {"ncclFloat16", 2},
    {"ncclBfloat16", 2}, {"ncclInt32", 4}, {"ncclUint32", 4}, {"ncclFloat32", 4}, {"ncclInt64", 8},
    {"ncclUint64", 8}, {"ncclFloat64", 8}};
  for (size_t i = 0; i < sizeof(T) / sizeof(T[0]); i++)
    if (strcmp(d, T[i].name) == 0) return T[i].size;
  return 0;
}

static int name_of(const char* s, const char* const* names, int n) {
  if (!s) return -1;
  for (int i = 0; i < n; i++)
    if (ascii_caseeq(s, names[i])) return i;
  return -1;
}

static ncclrl_result_t prof_init(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                                 int nNodes, int nranks, int rank, ncclrl_logger_t logfn) {
  (void)commName;
  if (context) *context = NULL;
  if (eActivationMask) *eActivationMask = 0;
  if (!context || !eActivationMask || !online_requested()) return NCCLRL_SUCCESS;
  /* NCCL's mask is one for the whole process: always the events the online mode reads, whatever
   * this communicator's fate (events of contexts we do not own are ignored) */
  *eActivationMask = NCCLRL_PROFILE_COLL | NCCLRL_PROFILE_KERNEL_CH;
  pthread_mutex_lock(&g_mu);
  ocomm_t* c = comm_find_locked(commId);
  if (c && c->prof_refs > 0) { /* a second rank of this communicator in this process */
    c->tuner_claimed = 1;      /* no tuner context may pair with an ambiguous profiler */
    c->online = 0;
    pthread_mutex_unlock(&g_mu);
    return NCCLRL_SUCCESS;
  }
  if (!c) c = comm_new_locked(commId);
  if (c) {
    c->prof_refs++;
    c->rank = rank;
    c->nranks = nranks;
    c->nnodes = nNodes;
    c->log = logfn ? logfn : nolog;
  }
  pthread_mutex_unlock(&g_mu);
  if (!c) return NCCLRL_SUCCESS;
  *context = c;
  return NCCLRL_SUCCESS;
}

static ncclrl_result_t prof_start(void* context, void** eHandle, ncclrl_profiler_descr_v5_t* d) {
  if (eHandle) *eHandle = NULL;
  ocomm_t* c = (ocomm_t*)context;
  if (!c || !eHandle || !d) return NCCLRL_SUCCESS;
  if (d->type == NCCLRL_PROFILE_COLL) {
    int coll = coll_from_name(d->coll.func);
    size_t ds = dtype_size(d->coll.datatype);
    if (coll < 0 || ds == 0 || d->coll.count > ((size_t)1 << 56) / ds) return NCCLRL_SUCCESS;
    size_t nbytes = d->coll.count * ds;
    if ((coll == NCCLRL_ALLGATHER || coll == NCCLRL_REDUCESCATTER) && c->nranks > 0) nbytes *= (size_t)c->nranks;
    obucket_t* b = c->b[coll][log2_bucket(nbytes)];
    if (!b) return NCCLRL_SUCCESS;
    /* the oldest noted call of this bucket with this size (calls NCCL skipped are passed over) */
    uint64_t h = atomic_load_explicit(&b->fifo_head, memory_order_acquire);
    uint64_t t = atomic_load_explicit(&b->fifo_tail, memory_order_relaxed);
    int arm = -2;
    ocfg_t want = {0, 0, 0};
    for (uint64_t q = t; q < h && q < t + 8; q++) { /* notes before the match were calls with no event */
      uint64_t slot = q % ONLINE_FIFO;
      if (b->fifo_nbytes[slot] == nbytes) {
        arm = b->fifo_arm[slot];
        want = b->fifo_cfg[slot];
        atomic_store_explicit(&b->fifo_tail, q + 1, memory_order_release);
        break;
      }
    }
    if (arm == -2) return NCCLRL_SUCCESS; /* no note of this size (an aggregated task, another bucket's call) */
    int ran_algo = name_of(d->coll.algo, ALGO_NAMES, NCCLRL_NUM_ALGOS);
    int ran_proto = name_of(d->coll.proto, PROTO_NAMES, NCCLRL_NUM_PROTOS);
    int match = arm >= 0 && ran_algo == want.algo && ran_proto == want.proto &&
                (want.channels <= 0 || (int)d->coll.nChannels <= want.channels); /* NCCL may run fewer */
    pthread_mutex_lock(&c->mu);
    ocoll_t* r = &c->colls[c->coll_next % ONLINE_COLL_POOL];
    for (int tries = 0; tries < 16 && r->magic == REC_MAGIC; tries++) /* one whose channels are still due: skip */
      r = &c->colls[++c->coll_next % ONLINE_COLL_POOL];
    c->coll_next++;
    r->magic = REC_MAGIC;
    r->gen++;
    r->comm = c;
    r->bucket = b;
    r->arm = match ? arm : -1;
    r->nch = d->coll.nChannels > 0 ? d->coll.nChannels : 1;
    r->seen = 0;
    r->t0 = UINT64_MAX;
    r->t1 = 0;
    r->stopped = 0;
    if (!match) b->dropped++;
    pthread_mutex_unlock(&c->mu);
    *eHandle = r;
    return NCCLRL_SUCCESS;
  }
  if (d->type == NCCLRL_PROFILE_KERNEL_CH) {
    ocoll_t* p = (ocoll_t*)d->parentObj;
    if (!p || pool_owner(p, 0) != c) return NCCLRL_SUCCESS;
    pthread_mutex_lock(&c->mu);
    if (p->magic == REC_MAGIC) {
      okch_t* k = &c->kchs[c->kch_next++ % ONLINE_KCH_POOL];
      k->magic = KCH_MAGIC;
      k->parent = p;
      k->gen = p->gen;
      k->t0 = d->kernelCh.pTimer;
      k->t1 = 0;
      k->has_t1 = 0;
      *eHandle = k;
    }
    pthread_mutex_unlock(&c->mu);
  }
  return NCCLRL_SUCCESS;
}

static ncclrl_result_t prof_record(void* eHandle, int eState, ncclrl_profiler_state_args_v5_t* a) {
  if (!eHandle || eState != NCCLRL_PROFILER_KERNEL_CH_STOP || !a) return NCCLRL_SUCCESS;
  ocomm_t* c = pool_owner(eHandle, 1);
  if (!c) return NCCLRL_SUCCESS;
  pthread_mutex_lock(&c->mu);
  okch_t* k = (okch_t*)eHandle;
  if (k->magic == KCH_MAGIC) { k->t1 = a->kernelCh.pTimer; k->has_t1 = 1; }
  pthread_mutex_unlock(&c->mu);
  return NCCLRL_SUCCESS;
}

/* A channel's work is done: when the collective's last channel is, its GPU time is one sample of its arm. */
static void kch_done_locked(ocomm_t* c, okch_t* k) {
  ocoll_t* p = k->parent;
  k->magic = 0;
  if (!p || p->magic != REC_MAGIC || p->gen != k->gen) return;
  if (k->has_t1) {
    if (k->t0 < p->t0) p->t0 = k->t0;
    if (k->t1 > p->t1) p->t1 = k->t1;
  }
  if (++p->seen < p->nch) return;
  obucket_t* b = p->bucket;
  p->magic = 0;
  if (!b) return;
  b->done++;
  if (p->arm < 0) return;
  double us = p->t1 > p->t0 && p->t0 != UINT64_MAX ? (double)(p->t1 - p->t0) / 1000.0 : -1.0;
  if (!(us > 0.0 && us < 1e8)) { b->dropped++; return; } /* no timer, or one that went backwards */
  b->n[p->arm]++;
  b->sum_us[p->arm] += us;
  b->sumsq_us[p->arm] += us * us;
  (void)c;
}

static ncclrl_result_t prof_stop(void* eHandle) {
  if (!eHandle) return NCCLRL_SUCCESS;
  ocomm_t* c = pool_owner(eHandle, 1);
  if (c) {
    pthread_mutex_lock(&c->mu);
    okch_t* k = (okch_t*)eHandle;
    if (k->magic == KCH_MAGIC) kch_done_locked(c, k);
    pthread_mutex_unlock(&c->mu);
    return NCCLRL_SUCCESS;
  }
  c = pool_owner(eHandle, 0);
  if (c) {
    pthread_mutex_lock(&c->mu);
    ocoll_t* r = (ocoll_t*)eHandle;
    if (r->magic == REC_MAGIC) r->stopped = 1; /* its channels' events may still come */
    pthread_mutex_unlock(&c->mu);
  }
  return NCCLRL_SUCCESS;
}

static ncclrl_result_t prof_finalize(void* context) {
  ocomm_t* c = (ocomm_t*)context;
  if (!c) return NCCLRL_SUCCESS;
  pthread_mutex_lock(&g_mu);
  c->prof_refs--;
  comm_release_locked(c);
  pthread_mutex_unlock(&g_mu);
  return NCCLRL_SUCCESS;
}

EXPORT const ncclrl_profiler_v5_t ncclProfiler_v5 = {"ncclrl", prof_init, prof_start, prof_stop, prof_record,
                                                     prof_finalize};
