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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "ncclrl_profiler_abi.h"

#define ONLINE_PROTO_VERSION 2
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
#define SECRET_ENV "NCCLRL_ONLINE_SECRET"
#define SECRET_FILE_ENV "NCCLRL_ONLINE_SECRET_FILE"
#define SECRET_MIN 32  /* hex digits: 128 bits */
#define SECRET_MAX 256
#define HANDSHAKE_S 5.0 /* per address: connect, WELCOME, proof */
#define PEER_CONNS 32    /* peers' questions answered at once */
#define PEER_S 0.5       /* a peer's question, handshake included, is answered within this or dropped */
#define PEER_MIN_AGE_S 0.05 /* a full peer port drops its oldest connection only once it is this old */
#define PEER_LINE 512
#define PEER_ADDR 80
#define ONLINE_MAX_ASK 4096 /* a communicator of more ranks freezes instead of asking its peers */
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
  int agreed;         /* the ranks' static tables are known to agree: arm 0 may force the table's rows. Until
                       * then (no GO yet, and no expected fingerprint matched) arm 0 leaves the call to NCCL */
  /* host -> collective-event side: the arm each call ran, in call order (single producer, single consumer) */
  int8_t fifo_arm[ONLINE_FIFO];
  ocfg_t fifo_cfg[ONLINE_FIFO];
  uint64_t fifo_nbytes[ONLINE_FIFO];
  _Atomic uint64_t fifo_head;
  _Atomic uint64_t fifo_tail;
  /* verdict mailboxes, one per round modulo ONLINE_VSLOTS: a later round's verdict (an abort sent to
   * every rank when the communicator freezes) never overwrites one this rank has not applied yet. The
   * client thread fills slot r % ONLINE_VSLOTS under the comm's lock, then publishes vtag = r + 1; the
   * coordinator's GO for the round (every rank holds the verdict) publishes gotag = r + 1, its ABORT
   * (no rank will ever get GO) aborttag = r + 1. Only a verdict with its GO is ever applied. */
  struct {
    _Atomic int vtag, gotag, aborttag;
    int kind, arm, len;
    uint64_t k;
    uint8_t plan[ONLINE_MAX_PLAN];
    char evidence[512];
  } v[ONLINE_VSLOTS];
  /* evidence and reporting (under the comm's lock) */
  uint64_t n[ONLINE_MAX_ARMS];
  double sum_us[ONLINE_MAX_ARMS], sumsq_us[ONLINE_MAX_ARMS], max_us[ONLINE_MAX_ARMS];
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
  uint64_t ph_t0, ph_t1; /* profiler v7: the channel's compute phase, without waiting for late ranks */
  int ph_state;          /* 0 none, 1 compute phase started, 2 compute phase ended */
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
  uint64_t table_fp;    /* the static table's fingerprint (0: none): every rank must say the same at HELLO */
  char (*peers)[PEER_ADDR]; /* every rank's peer address (the coordinator's PEER lines), or NULL */
  int npeers;
  int table_known;      /* no table, or one whose fingerprint NCCLRL_TUNER_TABLE_FINGERPRINT expected: the same
                         * on every rank without a word; else only a GO (after HELLOs that agreed) says so */
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
static _Atomic int g_coord_timeout_ms = 10000;
static _Atomic int g_stop;
static char g_outbox[1 << 16];   /* lines for the coordinator (under g_mu), each sealed (seal_locked) */
static char g_session[65];       /* the connection's key, from the secret and both nonces (handshake) */
static uint64_t g_tx_seq, g_rx_seq; /* lines sealed to the coordinator (under g_mu), read from it (client thread) */
static size_t g_outlen;
static double g_gather_s = 2.0, g_wait_s = 30.0, g_connect_s = 10.0;
static int g_gap = 8, g_warmup = 2, g_settings_read;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int online_requested(void) {
  const char* m = getenv(MODE_ENV);
  return m && ascii_caseeq(m, "online");
}

/* A setting of the online mode: unset or empty gives def; a value that is not a number in [lo, hi] (a whole
 * one where whole) gives def too, with a WARN naming the variable and what it allows. */
static double env_setting(ctx_t* ctx, const char* name, double def, double lo, double hi, int whole) {
  const char* v = getenv(name);
  if (!v || !*v) return def;
  char* end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (errno == 0 && end && *end == '\0' && x >= lo && x <= hi && (!whole || x == (double)(long long)x)) return x;
  LOG(ctx, NCCLRL_LOG_WARN, PREFIX "%s='%.32s' is not %s in [%g, %g]: %g is used", name, v,
      whole ? "a whole number" : "a number", lo, hi, def);
  return def;
}

static void read_online_settings(ctx_t* ctx) {
  g_gather_s = env_setting(ctx, "NCCLRL_ONLINE_GATHER_S", 2.0, 0.001, 600.0, 0);
  g_wait_s = env_setting(ctx, "NCCLRL_ONLINE_WAIT_S", 30.0, 0.01, 3600.0, 0);
  g_connect_s = env_setting(ctx, "NCCLRL_ONLINE_CONNECT_S", 10.0, 0.0, 600.0, 0);
  g_gap = (int)env_setting(ctx, "NCCLRL_ONLINE_GAP_CALLS", 8, 1, 1 << 20, 1);
  g_warmup = (int)env_setting(ctx, "NCCLRL_ONLINE_WARMUP_CALLS", 2, 0, 1 << 20, 1);
  g_settings_read = 1;
}

static int seal_locked(const char* text);

static void outbox_put(const char* line) {
  pthread_mutex_lock(&g_mu);
  if (!seal_locked(line)) atomic_store(&g_broken, 1); /* the coordinator does not read: stop sending, drain */
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

#include "ncclrl_hmac.h"

/* ---- sealed lines: after the handshake every line carries " ~" and the first 32 hex digits of
 * HMAC(session key, direction, its sequence number, the line), so no line can be forged, changed,
 * dropped or replayed by whatever relays the connection ---- */

static void line_mac(char dir, uint64_t seq, const char* payload, size_t n, char out[33]) {
  char msg[ONLINE_LINE + 32], mac[65];
  int off = snprintf(msg, sizeof(msg), "%c%llu ", dir, (unsigned long long)seq);
  if (n > sizeof(msg) - (size_t)off - 1) n = sizeof(msg) - (size_t)off - 1;
  memcpy(msg + off, payload, n);
  msg[off + (int)n] = '\0';
  hmac_hex(g_session, strlen(g_session), msg, mac);
  memcpy(out, mac, 32);
  out[32] = '\0';
}

/* Under g_mu: text (one line, its newline optional) sealed into the outbox. 0: no room (nothing queued). */
static int seal_locked(const char* text) {
  size_t n = strlen(text);
  while (n && text[n - 1] == '\n') n--;
  if (n >= ONLINE_LINE || g_outlen + n + 36 >= sizeof(g_outbox)) return 0;
  char mac[33];
  line_mac('r', g_tx_seq, text, n, mac);
  memcpy(g_outbox + g_outlen, text, n);
  g_outlen += n;
  g_outlen += (size_t)snprintf(g_outbox + g_outlen, sizeof(g_outbox) - g_outlen, " ~%s\n", mac);
  g_tx_seq++;
  return 1;
}

/* A line from the coordinator: its seal checked and cut off. 0: not sealed by it (lost). */
static int unseal(char* line) {
  char* t = strrchr(line, ' ');
  if (!t || t[1] != '~' || strlen(t + 2) != 32) return 0;
  char mac[33];
  line_mac('c', g_rx_seq, line, (size_t)(t - line), mac);
  if (!ct_equal(mac, t + 2)) return 0;
  *t = '\0';
  g_rx_seq++;
  return 1;
}

/* ---- the per-job secret: NCCLRL_ONLINE_SECRET (hex) or NCCLRL_ONLINE_SECRET_FILE (a file only its owner
 * can read); never logged. Returns NULL and sets *why when there is none fit to use. ---- */

static char g_secret[SECRET_MAX + 1];
static size_t g_secret_len;

static int secret_ok(const char* s, size_t n) {
  if (n < SECRET_MIN || n > SECRET_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F'))) return 0;
  return 1;
}

static const char* load_secret(void) {
  static char why[320];
  const char* v = getenv(SECRET_ENV);
  if (v && *v) {
    size_t n = strlen(v);
    if (!secret_ok(v, n)) return SECRET_ENV " is not 32 to 256 hex digits";
    memcpy(g_secret, v, n);
    g_secret_len = n;
    return NULL;
  }
  const char* path = getenv(SECRET_FILE_ENV);
  if (!path || !*path)
    return SECRET_ENV " and " SECRET_FILE_ENV " are both unset (the secret ncclrl coordinator wrote)";
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd < 0) { snprintf(why, sizeof(why), SECRET_FILE_ENV " %.200s cannot be opened (%s)", path, strerror(errno)); return why; }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    close(fd);
    snprintf(why, sizeof(why), SECRET_FILE_ENV " %.200s is not a regular file of this user that only they can read "
             "(chmod 600)", path);
    return why;
  }
  char buf[SECRET_MAX + 2];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
  if (n <= 0 || !secret_ok(buf, (size_t)n)) {
    snprintf(why, sizeof(why), SECRET_FILE_ENV " %.200s does not hold 32 to 256 hex digits", path);
    return why;
  }
  memcpy(g_secret, buf, (size_t)n);
  g_secret_len = (size_t)n;
  return NULL;
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
  free(c->peers);
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

/* Wait until fd is ready for ev, at most until the monotonic time end (ended early on unload). */
static int wait_fd(int fd, short ev, double end) {
  struct pollfd p = {fd, ev, 0};
  while (!atomic_load(&g_stop) && mono_s() < end) {
    int rc = poll(&p, 1, 50);
    if (rc > 0) return 1;
    if (rc < 0 && errno != EINTR) return 0;
  }
  return 0;
}

static int send_all(int fd, const char* s, double end) {
  size_t n = strlen(s), off = 0;
  while (off < n) {
    ssize_t w = send(fd, s + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) { off += (size_t)w; continue; }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 0;
    if (!wait_fd(fd, POLLOUT, end)) return 0;
  }
  return 1;
}

static void nonce_hex(char out[33]) {
  uint8_t raw[16];
  if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) { /* no entropy: a nonce that is at least this process's */
    memset(raw, 0, sizeof(raw));
    uint64_t t = (uint64_t)(mono_s() * 1e9), pid = (uint64_t)getpid();
    memcpy(raw, &t, 8);
    memcpy(raw + 8, &pid, 8);
  }
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

/* One line from fd into buf (its newline cut off), byte by byte so that nothing after it is consumed,
 * by the monotonic time end. 1: a line; 0: EOF, an error, the time, or a line longer than cap - 1. */
static int recv_line(int fd, char* buf, size_t cap, double end) {
  size_t n = 0;
  for (;;) {
    if (n + 1 >= cap) return 0;
    ssize_t r = recv(fd, buf + n, 1, MSG_DONTWAIT);
    if (r == 1) {
      if (buf[n] == '\n') { buf[n] = '\0'; return 1; }
      n++;
      continue;
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 0;
    if (!wait_fd(fd, POLLIN, end)) return 0;
  }
}

/* The handshake on a connected socket: VERSION with our nonce; the coordinator's WELCOME must carry
 * its proof of the secret over both nonces; then ours. 1: a coordinator holding the secret. */
static int handshake(int fd, double end) {
  char nonce[33], line[512], mac[65], want[65], msg[160];
  nonce_hex(nonce);
  snprintf(line, sizeof(line), "VERSION %d %s\n", ONLINE_PROTO_VERSION, nonce);
  if (!send_all(fd, line, end) || !recv_line(fd, line, sizeof(line), end)) return 0;
  char* save = NULL;
  char* w[5];
  w[0] = strtok_r(line, " ", &save);
  for (int i = 1; i < 5; i++) w[i] = strtok_r(NULL, " ", &save);
  if (!w[4] || strtok_r(NULL, " ", &save) || strcmp(w[0], "WELCOME") != 0) return 0;
  long long ms = parse_num(w[2], 1, 3600000, 10);
  if (parse_num(w[1], 0, 1 << 30, 10) != ONLINE_PROTO_VERSION || ms < 0 || strlen(w[3]) != 32 || strlen(w[4]) != 64)
    return 0;
  snprintf(msg, sizeof(msg), "ncclrl-coord %s %s", nonce, w[3]);
  hmac_hex(g_secret, g_secret_len, msg, want);
  if (!ct_equal(want, w[4])) return 0;
  snprintf(msg, sizeof(msg), "ncclrl-session %s %s", nonce, w[3]); /* before line, which w[] points into, is reused */
  hmac_hex(g_secret, g_secret_len, msg, g_session);
  g_tx_seq = g_rx_seq = 0;
  snprintf(msg, sizeof(msg), "ncclrl-rank %s %s", w[3], nonce);
  hmac_hex(g_secret, g_secret_len, msg, mac);
  snprintf(line, sizeof(line), "AUTH %s\n", mac);
  if (!send_all(fd, line, end)) return 0;
  atomic_store(&g_coord_timeout_ms, (int)ms);
  return 1;
}

/* Connect to the coordinator: each address HOST resolves to in turn, until one proves it holds the
 * secret (a process squatting the port, or listening on another address family, is passed over). */
static int connect_coordinator(const char* spec, double give_up) {
  char host[256];
  const char* colon = strrchr(spec, ':');
  if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host)) return -1;
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = '\0';
  if (host[0] == '[' && colon - spec >= 2 && host[colon - spec - 1] == ']') { /* [v6]:port */
    memmove(host, host + 1, (size_t)(colon - spec) - 2);
    host[colon - spec - 2] = '\0';
  }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res) return -1;
  int fd = -1;
  for (struct addrinfo* a = res; a && !atomic_load(&g_stop); a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    double end = mono_s() + HANDSHAKE_S;
    if (end > give_up && give_up > mono_s()) end = give_up; /* NCCLRL_ONLINE_CONNECT_S bounds every attempt */
    int rc = connect(fd, a->ai_addr, a->ai_addrlen), err = 0;
    socklen_t el = sizeof(err);
    int up = rc == 0 || (errno == EINPROGRESS && wait_fd(fd, POLLOUT, end) &&
                         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0);
    if (up) {
      int on = 1, idle = 10, intvl = 5, cnt = 3; /* a coordinator host gone without a word: seen in ~25 s */
      setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      if (handshake(fd, end)) break;
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

/* Under g_mu: a line for the coordinator (the client thread, which already holds the lock). */
static void outbox_put_locked(const char* line) {
  if (!seal_locked(line)) atomic_store(&g_broken, 1);
}

/* The bucket a GO or ABORT names, with both locks taken (NULL: none of ours, locks released). */
static obucket_t* bucket_locked(char* cid_s, char* id_s, char* rnd_s, int* round, ocomm_t** cp) {
  long long id = parse_num(id_s, 0, NCCLRL_NUM_COLLS * ONLINE_LOG2 - 1, 10);
  long long rnd = parse_num(rnd_s, 0, 1 << 30, 10);
  if (!cid_s || id < 0 || rnd < 0) return NULL;
  pthread_mutex_lock(&g_mu);
  ocomm_t* c = comm_find_locked(strtoull(cid_s, NULL, 16));
  if (!c) { pthread_mutex_unlock(&g_mu); return NULL; }
  pthread_mutex_lock(&c->mu);
  obucket_t* b = bucket_by_id(c, (int)id);
  if (!b) { pthread_mutex_unlock(&c->mu); pthread_mutex_unlock(&g_mu); return NULL; }
  *round = (int)rnd;
  *cp = c;
  return b;
}

/* One line from the (authenticated) coordinator. Anything malformed: lost. Returns 0 when lost. */
static int handle_line(char* line) {
  uint64_t digest = fnv1a64(line, strlen(line)); /* of the verdict line as read (its seal cut off): HOLD proves it */
  char* save = NULL;
  char* w = strtok_r(line, " ", &save);
  if (!w) return 1;
  if (strcmp(w, "FREEZE") == 0) {
    char* id = strtok_r(NULL, " ", &save);
    if (!id) return 1;
    uint64_t cid = strtoull(id, NULL, 16);
    pthread_mutex_lock(&g_mu);
    ocomm_t* c = comm_find_locked(cid);
    if (c) atomic_store(&c->frozen, 1); /* an unknown id: nothing of ours */
    pthread_mutex_unlock(&g_mu);
    return 1;
  }
  if (strcmp(w, "PEER") == 0) { /* PEER <comm> <rank> <addr>: where to ask that rank, should the coordinator die */
    char* id = strtok_r(NULL, " ", &save);
    long long r = parse_num(strtok_r(NULL, " ", &save), 0, 1 << 30, 10);
    char* addr = strtok_r(NULL, " ", &save);
    if (!id || r < 0 || !addr || strlen(addr) >= PEER_ADDR) return 0;
    pthread_mutex_lock(&g_mu);
    ocomm_t* c = comm_find_locked(strtoull(id, NULL, 16));
    if (c && r < c->nranks) {
      pthread_mutex_lock(&c->mu);
      if (!c->peers) c->peers = calloc((size_t)c->nranks, PEER_ADDR);
      if (c->peers && !c->peers[r][0]) { snprintf(c->peers[r], PEER_ADDR, "%s", addr); c->npeers++; }
      pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&g_mu);
    return 1;
  }
  if (strcmp(w, "GO") == 0 || strcmp(w, "ABORT") == 0) {
    int go = w[0] == 'G', round = 0, ok = 1;
    char* f0 = strtok_r(NULL, " ", &save);
    char* f1 = strtok_r(NULL, " ", &save);
    char* f2 = strtok_r(NULL, " ", &save);
    ocomm_t* c = NULL;
    obucket_t* b = bucket_locked(f0, f1, f2, &round, &c);
    if (!b) return 1;
    __typeof__(b->v[0])* m = &b->v[round % ONLINE_VSLOTS];
    if (!go) atomic_store_explicit(&m->aborttag, round + 1, memory_order_release);
    else if (atomic_load(&m->vtag) == round + 1 && atomic_load(&m->aborttag) != round + 1)
      atomic_store_explicit(&m->gotag, round + 1, memory_order_release);
    else ok = 0; /* a GO for a verdict this rank never confirmed: not a coordinator we follow */
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&g_mu);
    return ok;
  }
  if (strcmp(w, "VERDICT") != 0) return 0;
  char* f[6];
  for (int i = 0; i < 6; i++) f[i] = strtok_r(NULL, " ", &save);
  char* ev = strtok_r(NULL, "", &save);
  if (!f[5]) return 0;
  long long kk = parse_num(f[3], 0, INT64_MAX, 10);
  int round = 0;
  ocomm_t* c = NULL;
  if (kk < 0 || parse_num(f[2], 0, 1 << 30, 10) < 0 || parse_num(f[1], 0, NCCLRL_NUM_COLLS * ONLINE_LOG2 - 1, 10) < 0)
    return 0;
  obucket_t* b = bucket_locked(f[0], f[1], f[2], &round, &c);
  if (!b) return 1;
  __typeof__(b->v[0])* m = &b->v[round % ONLINE_VSLOTS];
  if (atomic_load(&m->vtag) != round + 1) {
    atomic_store_explicit(&m->vtag, 0, memory_order_relaxed);
    atomic_store_explicit(&m->gotag, 0, memory_order_relaxed);
    atomic_store_explicit(&m->aborttag, 0, memory_order_relaxed);
    m->k = (uint64_t)kk;
    m->len = 0;
    m->arm = -1;
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
    char hold[160];
    snprintf(hold, sizeof(hold), "HOLD %016llx %d %d %d %016llx\n", (unsigned long long)c->comm_id, c->rank, b->id,
             round, (unsigned long long)digest);
    outbox_put_locked(hold);
  }
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_unlock(&g_mu);
  return 1;
}

/* ---- peers: the ranks' own word when the coordinator died holding a round's GO half-sent ----
 *
 * Every rank process listens on one port (the address it reaches the coordinator from) and says it in
 * HELLO; the coordinator hands each rank every peer's address (PEER lines) before any verdict of the
 * communicator. A rank that holds a verdict, has no GO for it, and has read the coordinator's end of
 * the connection (nothing more will come) asks every peer what it holds: GO, NOGO (no GO, and nothing
 * more will come from the coordinator: final), or WAIT (still connected: ask again). A GO somewhere
 * means the coordinator sent it, so every rank applies the verdict; NOGO everywhere means it never
 * did, so every rank freezes. The set of ranks holding a GO no longer changes once the coordinator is
 * gone, so every rank that asks computes the same answer. Peers prove they hold the job's secret, as
 * the coordinator does. */

static int g_peer_fd = -1;
static char g_peer_addr[PEER_ADDR] = "-";

typedef struct {
  int fd, stage;        /* stage 0: awaits PEER; 1: awaits PAUTH and the question */
  double end;           /* the connection's last moment */
  char nonce[33];       /* ours */
  char asker[33];       /* the asker's */
  char buf[PEER_LINE];
  size_t n;
} pconn_t;
static pconn_t g_pconns[PEER_CONNS];

/* Listen on the address this process reaches the coordinator from, any port. */
static void peer_listen(int coord_fd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  if (getsockname(coord_fd, (struct sockaddr*)&ss, &sl) != 0) return;
  if (ss.ss_family == AF_INET) ((struct sockaddr_in*)&ss)->sin_port = 0;
  else if (ss.ss_family == AF_INET6) ((struct sockaddr_in6*)&ss)->sin6_port = 0;
  else return;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  if (bind(fd, (struct sockaddr*)&ss, sl) != 0 || listen(fd, 64) != 0 || getsockname(fd, (struct sockaddr*)&ss, &sl)) {
    close(fd);
    return;
  }
  char ip[INET6_ADDRSTRLEN];
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in*)&ss)->sin_addr, ip, sizeof(ip));
    snprintf(g_peer_addr, sizeof(g_peer_addr), "%s:%d", ip, ntohs(((struct sockaddr_in*)&ss)->sin_port));
  } else {
    inet_ntop(AF_INET6, &((struct sockaddr_in6*)&ss)->sin6_addr, ip, sizeof(ip));
    snprintf(g_peer_addr, sizeof(g_peer_addr), "[%s]:%d", ip, ntohs(((struct sockaddr_in6*)&ss)->sin6_port));
  }
  g_peer_fd = fd;
}

/* What this rank holds of (communicator, bucket, round): "GO", "NOGO" (final) or "WAIT". */
static const char* peer_state(char* cid, char* bucket, char* round, int* rank) {
  int r = 0;
  ocomm_t* c = NULL;
  obucket_t* b = bucket_locked(cid, bucket, round, &r, &c); /* it only reads them: the answer's seal covers them */
  const char* st = atomic_load(&g_lost) ? "NOGO" : "WAIT";
  *rank = -1;
  if (b) {
    *rank = c->rank;
    __typeof__(b->v[0])* m = &b->v[r % ONLINE_VSLOTS];
    if (atomic_load(&m->gotag) == r + 1) st = "GO";
    else if (atomic_load(&m->aborttag) == r + 1 || atomic_load(&c->frozen)) st = "NOGO";
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&g_mu);
  }
  return st;
}

static void pconn_close(pconn_t* p) {
  close(p->fd);
  p->fd = -1;
}

/* One line from a peer asking: the handshake, then one question, then the connection ends. */
static void pconn_line(pconn_t* p, char* line) {
  char* save = NULL;
  char* w[6];
  w[0] = strtok_r(line, " ", &save);
  for (int i = 1; i < 6; i++) w[i] = strtok_r(NULL, " ", &save);
  char out[PEER_LINE], msg[256], mac[65];
  double end = mono_s() + 0.5;
  if (p->stage == 0 && w[0] && w[1] && w[2] && !w[3] && strcmp(w[0], "PEER") == 0 &&
      parse_num(w[1], 0, 1 << 30, 10) == ONLINE_PROTO_VERSION && strlen(w[2]) == 32) {
    nonce_hex(p->nonce);
    snprintf(p->asker, sizeof(p->asker), "%s", w[2]);
    snprintf(msg, sizeof(msg), "ncclrl-peer-s %s %s", p->asker, p->nonce);
    hmac_hex(g_secret, g_secret_len, msg, mac);
    snprintf(out, sizeof(out), "PWELCOME %s %s\n", p->nonce, mac);
    p->stage = 1;
    if (!send_all(p->fd, out, end)) pconn_close(p);
    return;
  }
  if (p->stage == 1 && w[0] && w[4] && !w[5] && strcmp(w[0], "PAUTH") == 0) {
    snprintf(msg, sizeof(msg), "ncclrl-peer-q %s %s", p->nonce, p->asker);
    hmac_hex(g_secret, g_secret_len, msg, mac);
    /* the question rides on the proof's line: PAUTH <proof> <comm> <bucket> <round>; the answer is
     * sealed over both nonces, the question and who answers, so no relay can forge or redirect it */
    if (ct_equal(mac, w[1]) && strlen(w[2]) <= 16 && strlen(w[3]) <= 8 && strlen(w[4]) <= 12) {
      int rank = -1;
      const char* st = peer_state(w[2], w[3], w[4], &rank);
      snprintf(msg, sizeof(msg), "ncclrl-peer-state %s %s %s %s %s %d %s", p->asker, p->nonce, w[2], w[3], w[4],
               rank, st);
      hmac_hex(g_secret, g_secret_len, msg, mac);
      snprintf(out, sizeof(out), "STATE %s %d %s\n", st, rank, mac);
      send_all(p->fd, out, end);
    }
  }
  pconn_close(p);
}

/* The client thread's share: accept peers (bounded), read their lines, answer. */
static void peer_serve(int readable) {
  double now = mono_s();
  if (readable) {
    for (;;) {
      int fd = accept(g_peer_fd, NULL, NULL);
      if (fd < 0) break;
      if (fcntl(fd, F_SETFL, O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) { close(fd); continue; }
      int slot = -1;
      for (int j = 0; j < PEER_CONNS && slot < 0; j++) if (g_pconns[j].fd < 0) slot = j;
      if (slot < 0) { /* full: the oldest goes once it had its time (an asker under way is never cut short) */
        slot = 0;
        for (int j = 1; j < PEER_CONNS; j++) if (g_pconns[j].end < g_pconns[slot].end) slot = j;
        if (g_pconns[slot].end - PEER_S + PEER_MIN_AGE_S > now) { close(fd); continue; } /* the asker retries */
        pconn_close(&g_pconns[slot]);
      }
      memset(&g_pconns[slot], 0, sizeof(pconn_t));
      g_pconns[slot].fd = fd;
      g_pconns[slot].end = now + PEER_S;
    }
  }
  for (int j = 0; j < PEER_CONNS; j++) {
    pconn_t* p = &g_pconns[j];
    if (p->fd < 0) continue;
    if (now > p->end) { pconn_close(p); continue; }
    ssize_t r = recv(p->fd, p->buf + p->n, PEER_LINE - 1 - p->n, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) { pconn_close(p); continue; }
    if (r < 0) continue;
    p->n += (size_t)r;
    p->buf[p->n] = '\0';
    char* nl;
    while (p->fd >= 0 && (nl = memchr(p->buf, '\n', p->n))) {
      *nl = '\0';
      char line[PEER_LINE];
      snprintf(line, sizeof(line), "%s", p->buf);
      size_t used = (size_t)(nl - p->buf) + 1;
      memmove(p->buf, nl + 1, p->n - used);
      p->n -= used;
      p->buf[p->n] = '\0';
      pconn_line(p, line);
    }
    if (p->fd >= 0 && p->n >= PEER_LINE - 1) pconn_close(p);
  }
}

/* Ask one peer what it holds of (comm, bucket, round): 1 GO, 0 NOGO, 2 WAIT, -1 no answer. */
static int peer_ask(const char* addr, int rank, uint64_t cid, int bucket, int round) {
  char host[PEER_ADDR], port[16];
  const char* colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof(host) || strlen(colon + 1) >= sizeof(port)) return -1;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = '\0';
  snprintf(port, sizeof(port), "%s", colon + 1);
  if (host[0] == '[') { size_t l = strlen(host); if (l < 3 || host[l - 1] != ']') return -1; host[l - 1] = '\0'; memmove(host, host + 1, l - 1); }
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, port, &hints, &res) != 0 || !res) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), ans = -1;
  double end = mono_s() + 2.0;
  int err = 0;
  socklen_t el = sizeof(err);
  if (fd >= 0) {
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    if (rc == 0 || (errno == EINPROGRESS && wait_fd(fd, POLLOUT, end) &&
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)) {
      char nonce[33], server_nonce[33] = "", line[PEER_LINE], msg[200], mac[65];
      nonce_hex(nonce);
      snprintf(line, sizeof(line), "PEER %d %s\n", ONLINE_PROTO_VERSION, nonce);
      char* save = NULL;
      char *w0, *w1, *w2, *w3, want[65];
      if (send_all(fd, line, end) && recv_line(fd, line, sizeof(line), end)) { /* PWELCOME <nonce> <proof> */
        w0 = strtok_r(line, " ", &save);
        w1 = strtok_r(NULL, " ", &save);
        w2 = strtok_r(NULL, " ", &save);
        if (w0 && w1 && w2 && !strcmp(w0, "PWELCOME") && strlen(w1) == 32) {
          snprintf(server_nonce, sizeof(server_nonce), "%s", w1); /* before line, which w1 points into, is reused */
          snprintf(msg, sizeof(msg), "ncclrl-peer-s %s %s", nonce, server_nonce);
          hmac_hex(g_secret, g_secret_len, msg, want);
          if (ct_equal(want, w2)) { /* a peer of this job: the question, then its sealed answer */
            snprintf(msg, sizeof(msg), "ncclrl-peer-q %s %s", server_nonce, nonce);
            hmac_hex(g_secret, g_secret_len, msg, mac);
            snprintf(line, sizeof(line), "PAUTH %s %016llx %d %d\n", mac, (unsigned long long)cid, bucket, round);
            if (send_all(fd, line, end) && recv_line(fd, line, sizeof(line), end)) { /* STATE <st> <rank> <seal> */
              save = NULL;
              w0 = strtok_r(line, " ", &save);
              w1 = strtok_r(NULL, " ", &save);
              w2 = strtok_r(NULL, " ", &save);
              w3 = strtok_r(NULL, " ", &save);
              if (w0 && w1 && w2 && w3 && !strcmp(w0, "STATE") && parse_num(w2, 0, 1 << 30, 10) == rank) {
                snprintf(msg, sizeof(msg), "ncclrl-peer-state %s %s %016llx %d %d %d %s", nonce, server_nonce,
                         (unsigned long long)cid, bucket, round, rank, w1);
                hmac_hex(g_secret, g_secret_len, msg, want);
                if (ct_equal(want, w3)) /* from that rank, about this round: believed */
                  ans = !strcmp(w1, "GO") ? 1 : !strcmp(w1, "NOGO") ? 0 : !strcmp(w1, "WAIT") ? 2 : -1;
              }
            }
          }
        }
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  return ans;
}

/* The coordinator is gone; this rank holds round r's verdict but no GO: what every rank will do.
 * 1: some rank holds the GO (apply); 0: none does (freeze); -1: not every peer could be asked. */
static int peers_decide(ocomm_t* c, obucket_t* b, int round) {
  if (!c->peers || c->npeers != c->nranks) return -1;
  int done[ONLINE_MAX_ASK], nask = c->nranks < ONLINE_MAX_ASK ? c->nranks : ONLINE_MAX_ASK;
  if (c->nranks > ONLINE_MAX_ASK) return -1;
  memset(done, 0, sizeof(done));
  done[c->rank] = 1;
  double end = mono_s() + 30.0;
  for (int left = nask - 1; left > 0 && mono_s() < end;) {
    for (int r = 0; r < nask; r++) {
      if (done[r]) continue;
      int a = peer_ask(c->peers[r], r, c->comm_id, b->id, round);
      if (a == 1) return 1;
      if (a == 0) { done[r] = 1; left--; }
    }
    if (left > 0) { struct timespec nap = {0, 50000000}; nanosleep(&nap, NULL); }
  }
  for (int r = 0; r < nask; r++) if (!done[r]) return -1;
  return 0;
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
      snprintf(line, sizeof(line), "HELLO %d %016llx %d %d %d %ld %016llx %s\n", ONLINE_PROTO_VERSION,
               (unsigned long long)c->comm_id, c->rank, c->nranks, c->nnodes, (long)getpid(),
               (unsigned long long)c->table_fp, g_peer_addr);
      if (seal_locked(line)) c->hello_sent = 1;
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
          off += snprintf(line + off, sizeof(line) - off, " %llu:%.3f:%.3f:%.3f", (unsigned long long)b->n[a],
                          b->sum_us[a], b->sumsq_us[a], b->max_us[a]);
        if (seal_locked(line)) b->reported_round = b->report_round;
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
  for (int j = 0; j < PEER_CONNS; j++) g_pconns[j].fd = -1;
  /* tried again with backoff for NCCLRL_ONLINE_CONNECT_S: a coordinator starting after the ranks, or
   * one whose handshake queue an outsider keeps full, is reached yet; the ranks wait at their verdict calls */
  double give_up = mono_s() + g_connect_s, nap_s = 0.05;
  int fd = -1;
  while (spec && *spec && !atomic_load(&g_stop)) {
    fd = connect_coordinator(spec, give_up);
    if (fd >= 0 || mono_s() + nap_s > give_up) break;
    struct timespec nap = {(time_t)nap_s, (long)((nap_s - (double)(time_t)nap_s) * 1e9)};
    nanosleep(&nap, NULL);
    nap_s = nap_s * 2 < 1.0 ? nap_s * 2 : 1.0;
  }
  if (fd < 0) { atomic_store(&g_lost, 1); return NULL; }
  peer_listen(fd);
  char in[ONLINE_LINE * 4];
  size_t inlen = 0;
  int shut = 0;
  /* Only this reader decides the coordinator is lost: at EOF, a read error, or a line no coordinator
   * of ours sends. Once it cannot send, it keeps reading: the coordinator, missing this rank's word,
   * ends every round it waits on with ABORT or FREEZE, and those are read here. Once it is lost, the
   * thread goes on answering peers until the library is unloaded. */
  while (!atomic_load(&g_stop)) {
    if (fd >= 0 && atomic_load(&g_lost)) { close(fd); fd = -1; }
    if (fd < 0) {
      if (g_peer_fd < 0) break;
      struct pollfd q = {g_peer_fd, POLLIN, 0};
      int rc = poll(&q, 1, 10);
      peer_serve(rc > 0);
      continue;
    }
    double now = mono_s();
    if (atomic_load(&g_broken) && !shut) {
      shutdown(fd, SHUT_WR);
      shut = 1;
    }
    if (!shut) send_reports(now);
    pthread_mutex_lock(&g_mu);
    if (g_outlen > 0 && !shut) {
      ssize_t w = send(fd, g_outbox, g_outlen, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) { memmove(g_outbox, g_outbox + w, g_outlen - (size_t)w); g_outlen -= (size_t)w; }
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) atomic_store(&g_broken, 1);
    }
    pthread_mutex_unlock(&g_mu);
    struct pollfd p[2] = {{fd, POLLIN, 0}, {g_peer_fd, POLLIN, 0}};
    int rc = poll(p, g_peer_fd >= 0 ? 2 : 1, 1);
    if (rc < 0 && errno != EINTR) { atomic_store(&g_lost, 1); continue; }
    if (g_peer_fd >= 0) peer_serve(rc > 0 && (p[1].revents & POLLIN));
    if (rc > 0 && p[0].revents) {
      ssize_t r = recv(fd, in + inlen, sizeof(in) - 1 - inlen, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) { atomic_store(&g_lost, 1); continue; }
      if (r > 0) {
        inlen += (size_t)r;
        in[inlen] = '\0';
        char* s = in;
        char* nl;
        while ((nl = memchr(s, '\n', inlen - (size_t)(s - in))) && !atomic_load(&g_lost)) {
          *nl = '\0';
          if (!unseal(s) || !handle_line(s)) atomic_store(&g_lost, 1);
          s = nl + 1;
        }
        size_t rest = inlen - (size_t)(s - in);
        if (rest >= sizeof(in) - 1) { atomic_store(&g_lost, 1); continue; } /* a line longer than any we speak */
        memmove(in, s, rest);
        inlen = rest;
      }
    }
  }
  if (fd >= 0) close(fd);
  for (int j = 0; j < PEER_CONNS; j++) if (g_pconns[j].fd >= 0) pconn_close(&g_pconns[j]);
  if (g_peer_fd >= 0) { close(g_peer_fd); g_peer_fd = -1; }
  return NULL;
}

static void client_start_locked(void) {
  if (g_client_started) return;
  g_client_started = 1;
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
    if (access(path, R_OK) != 0) {
      LOG(ctx, NCCLRL_LOG_WARN, PREFIX "online: " CAND_ENV " %s cannot be read (%s): this rank has no "
          "alternatives; unless every rank lacks them, the arms differ and the coordinator freezes the communicator "
          "(the static table everywhere)", path, strerror(errno));
      return;
    }
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
  const char* mode = getenv(MODE_ENV);
  if (mode && *mode && !ascii_caseeq(mode, "online") && !ascii_caseeq(mode, "static"))
    LOG(ctx, NCCLRL_LOG_WARN, PREFIX MODE_ENV "='%.32s' is not static or online: static mode", mode);
  if (!online_requested()) return NULL;
  pthread_mutex_lock(&g_mu);
  if (!g_settings_read) read_online_settings(ctx);
  static const char* secret_why = "";
  if (secret_why && !*secret_why) secret_why = load_secret(); /* once per process: NULL when it loaded */
  ocomm_t* c = comm_find_locked(comm_id);
  const char* spec = getenv(COORD_ENV);
  const char* why = NULL;
  if (!c || c->prof_refs == 0 || c->rank < 0)
    why = "this library is not loaded as the profiler too (NCCL_PROFILER_PLUGIN=<the path of NCCL_TUNER_PLUGIN>)";
  else if (c->tuner_claimed)
    why = "the communicator has several ranks in this process";
  else if (!spec || !*spec)
    why = COORD_ENV " is not set (HOST:PORT of ncclrl coordinator)";
  else if (secret_why)
    why = secret_why;
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
      p->table_known = !ctx->loaded || (ctx->has_expect && ctx->table_fp == ctx->expect);
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
  c->table_fp = ctx->loaded ? ctx->table_fp : 0;
  c->table_known = !ctx->loaded || (ctx->has_expect && ctx->table_fp == ctx->expect);
  c->online = 1;
  client_start_locked();
  pthread_mutex_unlock(&g_mu);
  load_candidates(ctx, c);
  LOG(ctx, NCCLRL_LOG_INFO, PREFIX "online mode on communicator %016llx (rank %d of %d): coordinator %s, gap %d "
      "calls, warm-up %d calls, a WARN every %.0f s a verdict waits", (unsigned long long)comm_id, c->rank, c->nranks,
      spec, g_gap, g_warmup, g_wait_s);
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
  b->agreed = c->table_known;
  { /* even a bucket with nothing to explore asks round 0's verdict: its GO says the tables agree */
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
  if (ctx->trace || b->narms > 1) {
    char arms[256];
    int off = 0;
    for (int a = 1; a < b->narms && off < (int)sizeof(arms) - 40; a++)
      off += snprintf(arms + off, sizeof(arms) - off, " %d=%s/%s/%d", a, ALGO_NAMES[(int)b->arms[a].algo],
                      PROTO_NAMES[(int)b->arms[a].proto], (int)b->arms[a].channels);
    LOG(ctx, NCCLRL_LOG_INFO, PREFIX "online %016llx %s 2^%d B: arms 0=table%s; %s", (unsigned long long)c->comm_id,
        COLL_NAMES[coll], lg, arms, b->narms > 1 ? "exploring" : "nothing to explore");
  }
  return b;
}

static void freeze_bucket(ocomm_t* c, obucket_t* b, const char* why) {
  b->state = B_DONE;
  b->final_arm = 0;
  c->log(NCCLRL_LOG_WARN, NCCLRL_SUBSYS_TUNING, __FILE__, __LINE__,
         PREFIX "online %016llx %s 2^%d B: frozen on %s at call %llu (round %d): %s",
         (unsigned long long)c->comm_id, COLL_NAMES[b->coll], b->id % ONLINE_LOG2,
         b->agreed ? "the static table" : "NCCL's own choice (the ranks' tables were never shown to agree)",
         (unsigned long long)b->calls, b->round, why);
}

/* At call next_k: apply the round's verdict once the coordinator has said every rank holds it (GO).
 * Until it says GO or ABORT, or its connection ends, this rank waits: deciding alone while the
 * coordinator can still decide is how ranks split. A fault is read after every line that came
 * before it on the connection (one thread reads them in order): a GO sent before the coordinator
 * died or froze the communicator is applied, exactly as on the ranks that read it first. */
static void resolve_verdict(ocomm_t* c, obucket_t* b) {
  int want = b->round + 1;
  __typeof__(b->v[0])* mb = &b->v[b->round % ONLINE_VSLOTS];
  if (atomic_load_explicit(&mb->gotag, memory_order_acquire) != want) {
    double t0 = mono_s(), warn_at = t0 + g_wait_s;
    struct timespec nap = {0, 20000};
    for (;;) {
      int lost = atomic_load(&g_lost), frozen = atomic_load(&c->frozen), alone = !atomic_load(&c->online);
      int aborted = atomic_load(&mb->aborttag) == want;
      if (atomic_load_explicit(&mb->gotag, memory_order_acquire) == want) break;
      if (lost && !frozen && !aborted && !alone && atomic_load(&mb->vtag) == want) {
        /* it died between the verdict and this rank's GO: maybe another rank has the GO. Ask them all. */
        int d = peers_decide(c, b, b->round);
        if (d == 1) { atomic_store(&mb->gotag, want); break; }
        freeze_bucket(c, b, d == 0 ? "the coordinator is gone; no rank holds a GO for the round (asked them all)"
                                   : "the coordinator is gone, no GO came, and not every rank could be asked");
        return;
      }
      if (alone || lost || frozen || aborted) {
        freeze_bucket(c, b, alone ? "this rank cannot reach a coordinator" : lost ? "the coordinator is gone and no "
                      "GO came" : frozen ? "the coordinator froze this communicator" : "the coordinator aborted the round");
        return;
      }
      double now = mono_s();
      if (now > warn_at) {
        c->log(NCCLRL_LOG_WARN, NCCLRL_SUBSYS_TUNING, __FILE__, __LINE__,
               PREFIX "online %016llx %s 2^%d B: waiting %.0f s at call %llu for the coordinator's word on round %d; "
               "its connection is open (a stopped coordinator? every rank waits alike; ending it freezes them all)",
               (unsigned long long)c->comm_id, COLL_NAMES[b->coll], b->id % ONLINE_LOG2, now - t0,
               (unsigned long long)b->next_k, b->round);
        warn_at = now + g_wait_s;
      }
      nanosleep(&nap, NULL);
      if (nap.tv_nsec < 1000000) nap.tv_nsec *= 2;
    }
  }
  b->agreed = 1; /* a GO: every rank said HELLO with the same table before any verdict was sent */
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

/* The hot path. Returns the arm this call runs (0: the static table's decision, -1: NCCL's own; the
 * caller applies it) and fills *cfg for arms > 0; *bp is the bucket to note the call in afterwards, or NULL. */
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
  /* arm 0 is the static table only once the ranks' tables are known to agree; before, NCCL decides (-1) */
  int arm0_or_nccl = b->agreed ? 0 : -1;
  if (b->state != B_EXPLORE) {
    if (b->final_arm > 0) { *cfg = b->arms[b->final_arm]; return b->final_arm; }
    return arm0_or_nccl;
  }
  if (i == b->next_k) {
    resolve_verdict(c, b);
    arm0_or_nccl = b->agreed ? 0 : -1;
    if (b->state != B_EXPLORE) {
      if (b->final_arm > 0) { *cfg = b->arms[b->final_arm]; return b->final_arm; }
      *bp = b; /* still noted: the calls before k may be waiting for their events */
      return arm0_or_nccl;
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
  return arm0_or_nccl;
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

/* A kernel-phase event's handle is its channel's record with the lowest bit set: never a record itself. */
#define PHASE_TAG ((uintptr_t)1)
static int is_phase_handle(const void* h) { return ((uintptr_t)h & PHASE_TAG) != 0; }

static ncclrl_result_t prof_start(void* context, void** eHandle, ncclrl_profiler_descr_v5_t* d) {
  if (eHandle) *eHandle = NULL;
  ocomm_t* c = (ocomm_t*)context;
  if (!c || !eHandle || !d) return NCCLRL_SUCCESS;
  if (d->type == NCCLRL_PROFILE_KERNEL_PHASE) { /* v7: only the compute phase is kept */
    okch_t* k = (okch_t*)d->parentObj;
    if (!k || is_phase_handle(k) || d->kernelPhase.phaseId != NCCLRL_PHASE_COMPUTE || pool_owner(k, 1) != c)
      return NCCLRL_SUCCESS;
    pthread_mutex_lock(&c->mu);
    if (k->magic == KCH_MAGIC && k->ph_state == 0) {
      k->ph_t0 = d->kernelPhase.pTimer;
      k->ph_state = 1;
      *eHandle = (void*)((uintptr_t)k | PHASE_TAG);
    }
    pthread_mutex_unlock(&c->mu);
    return NCCLRL_SUCCESS;
  }
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
      k->ph_state = 0;
      *eHandle = k;
    }
    pthread_mutex_unlock(&c->mu);
  }
  return NCCLRL_SUCCESS;
}

static ncclrl_result_t prof_record(void* eHandle, int eState, ncclrl_profiler_state_args_v5_t* a) {
  if (!eHandle || !a) return NCCLRL_SUCCESS;
  if (is_phase_handle(eHandle)) {
    okch_t* k = (okch_t*)((uintptr_t)eHandle & ~PHASE_TAG);
    ocomm_t* c = eState == NCCLRL_PROFILER_KERNEL_PHASE_STOP ? pool_owner(k, 1) : NULL;
    if (!c) return NCCLRL_SUCCESS;
    pthread_mutex_lock(&c->mu);
    if (k->magic == KCH_MAGIC && k->ph_state == 1) { k->ph_t1 = a->kernelCh.pTimer; k->ph_state = 2; }
    pthread_mutex_unlock(&c->mu);
    return NCCLRL_SUCCESS;
  }
  if (eState != NCCLRL_PROFILER_KERNEL_CH_STOP) return NCCLRL_SUCCESS;
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
  /* the transfer's time: the compute phase where NCCL reports phases (v7), else the whole channel */
  if (k->ph_state == 2 && k->ph_t1 >= k->ph_t0) {
    if (k->ph_t0 < p->t0) p->t0 = k->ph_t0;
    if (k->ph_t1 > p->t1) p->t1 = k->ph_t1;
  } else if (k->has_t1) {
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
  if (us > b->max_us[p->arm]) b->max_us[p->arm] = us;
  (void)c;
}

static ncclrl_result_t prof_stop(void* eHandle) {
  if (!eHandle || is_phase_handle(eHandle)) return NCCLRL_SUCCESS; /* a phase ends by its state record */
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

/* v7 (NCCL 2.32): kernel-phase events too, so that a sample is the transfer without the wait for late ranks */
static ncclrl_result_t prof_init_v7(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                                    int nNodes, int nranks, int rank, ncclrl_logger_t logfn) {
  ncclrl_result_t r = prof_init(context, commId, eActivationMask, commName, nNodes, nranks, rank, logfn);
  if (r == NCCLRL_SUCCESS && eActivationMask && *eActivationMask) *eActivationMask |= NCCLRL_PROFILE_KERNEL_PHASE;
  return r;
}

/* One set of functions for every version: v6 adds union members we never read, v7 adds members after the
 * ones we read and the kernel-phase event. NCCL takes the newest it knows (2.30-2.31: v6; 2.32: v7). */
EXPORT const ncclrl_profiler_v5_t ncclProfiler_v5 = {"ncclrl", prof_init, prof_start, prof_stop, prof_record,
                                                     prof_finalize};
EXPORT const ncclrl_profiler_v5_t ncclProfiler_v6 = {"ncclrl", prof_init, prof_start, prof_stop, prof_record,
                                                     prof_finalize};
EXPORT const ncclrl_profiler_v5_t ncclProfiler_v7 = {"ncclrl", prof_init_v7, prof_start, prof_stop, prof_record,
                                                     prof_finalize};
