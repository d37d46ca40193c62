/* getCollInfo's cost per call in online mode, median over single calls (the clock's own cost, measured
 * the same way, subtracted), for buckets that are exploring (a plan every round, a stand-in coordinator
 * in a thread answering each report at once, and each HOLD with its GO) and for buckets committed to
 * an arm; and static mode for comparison. 16 buckets (AllReduce, 2^10 .. 2^25 bytes), 3 arms each.
 *
 *   bench_online LIB CANDIDATES
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../ncclrl_hmac.h"
#include "../ncclrl_profiler_abi.h"

#define SECRET "0123456789abcdef0123456789abcdef"

#define CALLS 200000
static int commit_mode;
static int lfd;
static int n_go; /* GOs the stand-in sent: the buckets really explored (a rank it failed to convince sends none) */

/* a line to the rank, sealed as the coordinator seals it (the session key, 'c', its sequence number) */
static void send_sealed(int fd, const char* key, unsigned long long* seq, const char* text) {
  char msg[4200], mac[65], out[4200];
  snprintf(msg, sizeof(msg), "c%llu %s", *seq, text);
  hmac_hex(key, strlen(key), msg, mac);
  mac[32] = '\0';
  snprintf(out, sizeof(out), "%s ~%s\n", text, mac);
  send(fd, out, strlen(out), 0);
  (*seq)++;
}

static void* coordinator(void* arg) {
  (void)arg;
  char key[65] = "";
  unsigned long long seq = 0;
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) return NULL;
  char buf[1 << 16], line[4096];
  size_t n = 0;
  for (;;) {
    ssize_t r = recv(fd, buf + n, sizeof(buf) - 1 - n, 0);
    if (r <= 0) break;
    n += (size_t)r;
    char* s = buf;
    char* nl;
    while ((nl = memchr(s, '\n', n - (size_t)(s - buf)))) {
      *nl = '\0';
      char nonce[40], msg[160], mac[65];
      if (sscanf(s, "VERSION 2 %32s", nonce) == 1) { /* the proof over the rank's nonce and ours */
        snprintf(msg, sizeof(msg), "ncclrl-coord %s %s", nonce, "00000000000000000000000000000000");
        hmac_hex(SECRET, strlen(SECRET), msg, mac);
        snprintf(line, sizeof(line), "WELCOME 2 1000 00000000000000000000000000000000 %s\n", mac);
        send(fd, line, strlen(line), 0);
        snprintf(msg, sizeof(msg), "ncclrl-session %s %s", nonce, "00000000000000000000000000000000");
        hmac_hex(SECRET, strlen(SECRET), msg, key);
      } else if (!strncmp(s, "HOLD", 4)) {
        char comm[32];
        int rank, bucket, round;
        if (sscanf(s, "HOLD %31s %d %d %d", comm, &rank, &bucket, &round) == 4) {
          snprintf(line, sizeof(line), "GO %s %d %d", comm, bucket, round);
          send_sealed(fd, key, &seq, line);
          n_go++;
        }
      } else if (!strncmp(s, "REPORT", 6)) {
        char comm[32];
        int rank, bucket, round;
        unsigned long long k;
        if (sscanf(s, "REPORT %31s %d %d %d %llu", comm, &rank, &bucket, &round, &k) == 5) {
          if (commit_mode && round > 0)
            snprintf(line, sizeof(line), "VERDICT %s %d %d %llu COMMIT 1 bench", comm, bucket, round, k);
          else
            snprintf(line, sizeof(line), "VERDICT %s %d %d %llu PLAN 0,1,2,0,1,2,0,1,2,0,1,2,0,1,2,0 bench", comm,
                     bucket, round, k);
          send_sealed(fd, key, &seq, line);
        }
      }
      s = nl + 1;
    }
    memmove(buf, s, n - (size_t)(s - buf));
    n -= (size_t)(s - buf);
  }
  close(fd);
  return NULL;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double* samples;

static double median_call(const ncclrl_tuner_v5_t* v5, void* ctx, double* p90) {
  float table[7][3];
  for (int i = 0; i < CALLS; i++) {
    for (int a = 0; a < 7; a++)
      for (int p = 0; p < 3; p++) table[a][p] = (a <= 1) ? 10.0f + (float)(a * 3 + p) : -1.0f;
    int nch = 0;
    size_t nbytes = (size_t)1 << (10 + (i * 7) % 16);
    double t0 = now_ns();
    v5->getCollInfo(ctx, 4, nbytes, 1, (float**)table, 7, 3, 0, &nch);
    samples[i] = now_ns() - t0;
  }
  qsort(samples, CALLS, sizeof(double), cmp);
  *p90 = samples[CALLS * 9 / 10];
  return samples[CALLS / 2];
}

static double clock_cost(void) {
  for (int i = 0; i < CALLS; i++) {
    double t0 = now_ns();
    samples[i] = now_ns() - t0;
  }
  qsort(samples, CALLS, sizeof(double), cmp);
  return samples[CALLS / 2];
}

static void run(const char* lib_path, const char* label, int online, int commit) {
  commit_mode = commit;
  pthread_t th;
  if (online) {
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(lfd, (struct sockaddr*)&a, sizeof(a));
    socklen_t al = sizeof(a);
    getsockname(lfd, (struct sockaddr*)&a, &al);
    listen(lfd, 4);
    char spec[64];
    snprintf(spec, sizeof(spec), "127.0.0.1:%d", ntohs(a.sin_port));
    setenv("NCCLRL_ONLINE_COORD", spec, 1);
    setenv("NCCLRL_TUNER_MODE", "online", 1);
    pthread_create(&th, NULL, coordinator, NULL);
  } else {
    unsetenv("NCCLRL_TUNER_MODE");
  }
  /* a fresh copy of the library for each mode: its process-wide state (one coordinator connection) starts anew */
  char copy[256];
  snprintf(copy, sizeof(copy), "/tmp/ncclrl-bench-online-%d-%d.so", online, commit);
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", lib_path, copy);
  if (system(cmd) != 0) { fprintf(stderr, "cannot copy the library\n"); exit(2); }
  void* lib = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); exit(2); }
  const ncclrl_tuner_v5_t* v5 = dlsym(lib, "ncclTunerPlugin_v5");
  const ncclrl_profiler_v5_t* prof = dlsym(lib, "ncclProfiler_v5");
  void *pctx = NULL, *ctx = NULL;
  int mask = 0;
  prof->init(&pctx, 42, &mask, "bench", 1, 1, 0, NULL);
  ncclrl_nvl_domain_info_v5_t nvl = {1, 1, 1};
  v5->init(&ctx, 42, 1, 1, NULL, &nvl, NULL);
  double p90 = 0.0;
  median_call(v5, ctx, &p90); /* warm: every bucket past its first rounds */
  double med = median_call(v5, ctx, &p90);
  double clk = clock_cost();
  printf("getCollInfo, %s: %.1f ns/call median (90th percentile %.1f ns; %d single calls over 16 buckets, the "
         "clock's %.1f ns subtracted)\n", label, med - clk, p90 - clk, CALLS, clk);
  if (online) printf("  (%d verdicts applied: the stand-in coordinator's GOs)\n", n_go);
  if (online && n_go == 0) { /* the figures above are a frozen bucket's, not an exploring one's */
    fprintf(stderr, "bench_online: the stand-in coordinator got no verdict applied (protocol mismatch?)\n");
    exit(3);
  }
  n_go = 0;
  v5->finalize(ctx);
  prof->finalize(pctx);
  if (online) { shutdown(lfd, SHUT_RDWR); close(lfd); }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  samples = malloc(sizeof(double) * CALLS);
  setenv("NCCLRL_ONLINE_CANDIDATES", argv[2], 1);
  setenv("NCCLRL_ONLINE_SECRET", SECRET, 1);
  setenv("NCCLRL_ONLINE_GATHER_S", "0.001", 1);
  setenv("NCCLRL_ONLINE_WARMUP_CALLS", "2", 1);
  setenv("NCCLRL_TUNER_TABLE_DATA", "allreduce,0,max,ring,simple,8,-1,-1\n", 1);
  run(argv[1], "static table", 0, 0);
  run(argv[1], "online, exploring (a new plan every round)", 1, 0);
  run(argv[1], "online, committed", 1, 1);
  free(samples);
  return 0;
}
