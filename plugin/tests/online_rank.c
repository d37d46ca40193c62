/*
 * One rank of a job, played without NCCL for the online mode's fault harness: loads the plugin as
 * NCCL 2.28 does (profiler v5 init, then tuner v5 init, same communicator id), replays a call
 * sequence through getCollInfo with NCCL-shaped cost tables, reports each call's collective event
 * and its channels' kernel events (GPU timer values from a simulated time per configuration, with
 * noise) from a second thread, as NCCL's proxy thread does, and writes every decision it got.
 *
 *   online_rank LIB CALLS TIMES OUT --rank R --nranks N [--comm HEX] [--seed S] [--noise SIGMA]
 *               [--die-at I] [--stall-at I --stall-s S] [--skew-ns NS] [--rate X] [--garbage] [--no-profiler]
 *               [--late-us W] [--phases] [--nccl-code N] [--sym-calls]
 *               [--pace-us US]
 *
 * CALLS: lines "coll nbytes" (coll 0..4 as NCCL numbers them). TIMES: lines
 * "coll log2 algo proto channels time_us cost_us": the simulated time of a configuration in that
 * size bucket (channels 0: NCCL's own count), and NCCL's predicted cost for the cost table
 * (channels-0 lines; an (algo, proto) without a line is disabled, -1). OUT gets one line per call:
 * "index coll nbytes algo proto channels" as NCCL would run it. Faults: --die-at kills this process
 * (SIGKILL) at call I; --stall-at stops it for S seconds; --skew-ns/--rate transform its GPU clock;
 * --garbage interleaves malformed profiler events and tuner calls; --pace-us sleeps before each call.
 * --late-us W: every call that runs another configuration than the cost table's own choice waits W us for
 * late ranks at the start of each channel (inside the channel's time); --phases: the library is bound as
 * NCCL 2.32 binds it (tuner and profiler v7) and each channel also reports its kernel phases (the wait as
 * initial_sync, the transfer as compute), as NCCL 2.32 does. --nccl-code N: the version ncclGetVersion
 * answers (2.31.0: 23100; default: none answers); --sym-calls: before each collective, the two calls NCCL
 * 2.31 makes on one NVLink node for its symmetric kernels (every entry -1, then numPipeOps 0).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>

#include "../ncclrl_profiler_abi.h"

#define NA 7
#define NP 3
#define MAXT 4096

static const char* FUNC[5] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
static const char* ALGO[NA] = {"TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
static const char* PROTO[NP] = {"LL", "LL128", "SIMPLE"};

typedef struct { int coll, lg, algo, proto, ch; double time_us, cost_us; } tline_t;
static tline_t T[MAXT];
static int NT;

static const ncclrl_profiler_v5_t* prof;
static void* pctx;
static int nranks_g;

/* the "proxy thread": kernel-channel events of launched collectives, after their "GPU" ran them */
typedef struct { void* coll_handle; int nch; uint64_t t0, dur_ns, late_ns; } job_t;
static int nccl_code = 0;
__attribute__((visibility("default"))) int ncclGetVersion(int* version);
int ncclGetVersion(int* version) { /* the plugin asks the process for NCCL's version (-rdynamic) */
  if (!nccl_code || !version) return 4;
  *version = nccl_code;
  return 0;
}
static int phases = 0;
static job_t Q[1 << 16];
static size_t qh, qt;
static int q_done;
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;
static double skew_ns = 0.0, rate = 1.0;

static uint64_t gpu_timer(uint64_t t) { return (uint64_t)(skew_ns + rate * (double)t); }

static void* proxy_main(void* arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&qmu);
    while (qh == qt && !q_done) pthread_cond_wait(&qcv, &qmu);
    if (qh == qt && q_done) { pthread_mutex_unlock(&qmu); return NULL; }
    job_t j = Q[qt++ % (1 << 16)];
    pthread_mutex_unlock(&qmu);
    for (int c = 0; c < j.nch; c++) {
      ncclrl_profiler_descr_v5_t d;
      memset(&d, 0, sizeof(d));
      d.type = NCCLRL_PROFILE_KERNEL_CH;
      d.parentObj = j.coll_handle;
      d.kernelCh.channelId = (uint8_t)c;
      d.kernelCh.pTimer = gpu_timer(j.t0);
      void* h = NULL;
      prof->startEvent(pctx, &h, &d);
      ncclrl_profiler_state_args_v5_t a;
      memset(&a, 0, sizeof(a));
      for (int ph = 0; phases && h && ph < 3; ph++) { /* initial_sync (the wait), compute, final_sync */
        static const char* const NAMES[3] = {"initial_sync", "compute", "final_sync"};
        uint64_t b0 = ph == 0 ? j.t0 : ph == 1 ? j.t0 + j.late_ns : j.t0 + j.late_ns + j.dur_ns;
        uint64_t b1 = ph == 0 ? j.t0 + j.late_ns : j.t0 + j.late_ns + (ph == 1 ? j.dur_ns : 0);
        ncclrl_profiler_descr_v5_t e;
        memset(&e, 0, sizeof(e));
        e.type = NCCLRL_PROFILE_KERNEL_PHASE;
        e.parentObj = h;
        e.kernelPhase.channelId = (uint8_t)c;
        e.kernelPhase.phaseId = (uint8_t)ph;
        e.kernelPhase.phaseName = NAMES[ph];
        e.kernelPhase.pTimer = gpu_timer(b0);
        void* ph_h = NULL;
        prof->startEvent(pctx, &ph_h, &e);
        a.kernelCh.pTimer = gpu_timer(b1);
        if (ph_h) { prof->recordEventState(ph_h, NCCLRL_PROFILER_KERNEL_PHASE_STOP, &a); prof->stopEvent(ph_h); }
      }
      a.kernelCh.pTimer = gpu_timer(j.t0 + j.late_ns + j.dur_ns);
      if (h) { prof->recordEventState(h, NCCLRL_PROFILER_KERNEL_CH_STOP, &a); prof->stopEvent(h); }
    }
  }
}

static void push_job(job_t j) {
  pthread_mutex_lock(&qmu);
  while (qh - qt >= (1 << 16) - 1) { pthread_mutex_unlock(&qmu); { struct timespec s = {0, 100000}; nanosleep(&s, NULL); } pthread_mutex_lock(&qmu); }
  Q[qh++ % (1 << 16)] = j;
  pthread_cond_signal(&qcv);
  pthread_mutex_unlock(&qmu);
}

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (level > 3) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[%s] ", level == 2 ? "WARN" : "INFO");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static uint64_t rng_state;
static double urand(void) {
  rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
  return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double nrand(void) { return sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()); }

static const tline_t* find(int coll, int lg, int algo, int proto, int ch) {
  const tline_t* def = NULL;
  for (int i = 0; i < NT; i++) {
    if (T[i].coll != coll || T[i].lg != lg || T[i].algo != algo || T[i].proto != proto) continue;
    if (T[i].ch == ch) return &T[i];
    if (T[i].ch == 0) def = &T[i];
  }
  return def;
}

static void garbage(void) {
  ncclrl_profiler_descr_v5_t d;
  void* h = (void*)0x1;
  memset(&d, 0, sizeof(d));
  d.type = NCCLRL_PROFILE_COLL;             /* every string NULL */
  prof->startEvent(pctx, &h, &d);
  d.coll.func = "AllReduce";
  d.coll.datatype = "ncclWhatever";
  d.coll.count = (size_t)-1;
  prof->startEvent(pctx, &h, &d);
  d.coll.datatype = "ncclFloat32";
  d.coll.algo = "NOT_AN_ALGO";
  d.coll.proto = NULL;
  d.coll.nChannels = 255;
  prof->startEvent(pctx, &h, &d);
  int local = 0;
  d.type = NCCLRL_PROFILE_KERNEL_CH;        /* a parent that is not one of ours */
  d.parentObj = &local;
  prof->startEvent(pctx, &h, &d);
  d.parentObj = (void*)0x10;
  prof->startEvent(pctx, &h, &d);
  d.type = (uint64_t)1 << 40;               /* an event type that does not exist */
  prof->startEvent(pctx, &h, &d);
  prof->startEvent(pctx, NULL, &d);
  prof->startEvent(pctx, &h, NULL);
  prof->stopEvent(NULL);
  prof->stopEvent(&local);                  /* a handle that is not one of ours */
  prof->recordEventState(&local, NCCLRL_PROFILER_KERNEL_CH_STOP, NULL);
  prof->recordEventState(NULL, 99, NULL);
}

int main(int argc, char** argv) {
  if (argc < 5) { fprintf(stderr, "usage: online_rank LIB CALLS TIMES OUT --rank R --nranks N ...\n"); return 2; }
  int rank = 0, nranks = 2, die_at = -1, stall_at = -1, garb = 0, no_prof = 0, sym_calls = 0;
  double stall_s = 0.0, noise = 0.05, pace_us = 0.0, late_us = 0.0;
  uint64_t comm = 0x5eed5eed5eed5eedull, seed = 1;
  for (int i = 5; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "0";
    if (!strcmp(a, "--rank")) { rank = atoi(v); i++; }
    else if (!strcmp(a, "--nranks")) { nranks = atoi(v); i++; }
    else if (!strcmp(a, "--comm")) { comm = strtoull(v, NULL, 16); i++; }
    else if (!strcmp(a, "--seed")) { seed = strtoull(v, NULL, 10); i++; }
    else if (!strcmp(a, "--noise")) { noise = atof(v); i++; }
    else if (!strcmp(a, "--die-at")) { die_at = atoi(v); i++; }
    else if (!strcmp(a, "--stall-at")) { stall_at = atoi(v); i++; }
    else if (!strcmp(a, "--stall-s")) { stall_s = atof(v); i++; }
    else if (!strcmp(a, "--skew-ns")) { skew_ns = atof(v); i++; }
    else if (!strcmp(a, "--rate")) { rate = atof(v); i++; }
    else if (!strcmp(a, "--garbage")) { garb = 1; }
    else if (!strcmp(a, "--no-profiler")) { no_prof = 1; }
    else if (!strcmp(a, "--pace-us")) { pace_us = atof(v); i++; }
    else if (!strcmp(a, "--late-us")) { late_us = atof(v); i++; }
    else if (!strcmp(a, "--phases")) { phases = 1; }
    else if (!strcmp(a, "--nccl-code")) { nccl_code = atoi(v); i++; }
    else if (!strcmp(a, "--sym-calls")) { sym_calls = 1; }
    else { fprintf(stderr, "unknown option %s\n", a); return 2; }
  }
  nranks_g = nranks;
  rng_state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull + 1;
  FILE* tf = fopen(argv[3], "r");
  if (!tf) { perror(argv[3]); return 2; }
  while (NT < MAXT && fscanf(tf, "%d %d %d %d %d %lf %lf", &T[NT].coll, &T[NT].lg, &T[NT].algo, &T[NT].proto,
                             &T[NT].ch, &T[NT].time_us, &T[NT].cost_us) == 7) NT++;
  fclose(tf);
  FILE* cf = fopen(argv[2], "r");
  if (!cf) { perror(argv[2]); return 2; }
  size_t ncalls = 0, cap = 1024;
  int* ccoll = malloc(cap * sizeof(int));
  size_t* cbytes = malloc(cap * sizeof(size_t));
  int co; unsigned long long nb;
  while (fscanf(cf, "%d %llu", &co, &nb) == 2) {
    if (ncalls == cap) { cap *= 2; ccoll = realloc(ccoll, cap * sizeof(int)); cbytes = realloc(cbytes, cap * sizeof(size_t)); }
    ccoll[ncalls] = co; cbytes[ncalls] = (size_t)nb; ncalls++;
  }
  fclose(cf);
  FILE* out = fopen(argv[4], "w");
  if (!out) { perror(argv[4]); return 2; }

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  /* the newest versions a NCCL binds: 2.28 v5, 2.32 v7 (v7's init takes v7 constants; none are passed) */
  prof = dlsym(lib, phases ? "ncclProfiler_v7" : "ncclProfiler_v5");
  const ncclrl_tuner_v5_t* tun = dlsym(lib, phases ? "ncclTunerPlugin_v7" : "ncclTunerPlugin_v5");
  if (!prof || !tun) { fprintf(stderr, "missing the profiler or tuner symbol\n"); return 2; }
  int mask = 0;
  if (!no_prof) prof->init(&pctx, comm, &mask, "harness", nranks, nranks, rank, logger);
  if (phases && pctx && !(mask & NCCLRL_PROFILE_KERNEL_PHASE)) { fprintf(stderr, "v7: no kernel phases asked\n"); return 4; }
  void* tctx = NULL;
  ncclrl_nvl_domain_info_v5_t nvl = {nranks, 1, 1};
  if (tun->init(&tctx, comm, (size_t)nranks, (size_t)nranks, logger, &nvl, NULL) != NCCLRL_SUCCESS) {
    fprintf(stderr, "tuner init failed\n");
    return 3;
  }
  pthread_t proxy;
  pthread_create(&proxy, NULL, proxy_main, NULL);
  struct timespec w0, w1;
  clock_gettime(CLOCK_MONOTONIC, &w0);
  uint64_t clock_ns = 1000000;
  for (size_t i = 0; i < ncalls; i++) {
    if ((int)i == die_at) { fflush(out); raise(SIGKILL); }
    if (pace_us > 0) { struct timespec s = {0, (long)(pace_us * 1000.0)}; nanosleep(&s, NULL); }
    if ((int)i == stall_at) { struct timespec s = {(time_t)stall_s, (long)((stall_s - (time_t)stall_s) * 1e9)}; nanosleep(&s, NULL); }
    if (garb && pctx) {
      garbage();
      int nch = 0;
      tun->getCollInfo(tctx, 9, 0, 1, NULL, NA, NP, 0, &nch);
      tun->getCollInfo(tctx, 4, 1024, 1, NULL, NA, NP, 0, NULL);
    }
    int coll = ccoll[i];
    size_t nbytes = cbytes[i];
    int lg = nbytes ? 63 - __builtin_clzll((unsigned long long)nbytes) : 0;
    float table[NA][NP];
    for (int a = 0; a < NA; a++)
      for (int p = 0; p < NP; p++) {
        const tline_t* t = find(coll, lg, a, p, 0);
        table[a][p] = t && t->ch == 0 ? (float)t->cost_us : -1.0f;
      }
    int own_a = -1, own_p = -1; /* the cost table's own choice, before the tuner */
    for (int a = 0; a < NA; a++)
      for (int p = 0; p < NP; p++)
        if (table[a][p] >= 0.0f && (own_a < 0 || table[a][p] < table[own_a][own_p])) { own_a = a; own_p = p; }
    if (sym_calls) { /* NCCL 2.31's symmetric path asks first: every entry -1, then ahead (numPipeOps 0) */
      float ign[NA][NP], ahead[NA][NP];
      for (int a = 0; a < NA; a++)
        for (int p = 0; p < NP; p++) ign[a][p] = -1.0f;
      memcpy(ahead, table, sizeof(ahead));
      int n0 = 0;
      tun->getCollInfo(tctx, coll, nbytes, 0, (float**)ign, NA, NP, 0, &n0);
      n0 = 0;
      tun->getCollInfo(tctx, coll, nbytes, 0, (float**)ahead, NA, NP, 0, &n0);
    }
    int nch = 0;
    tun->getCollInfo(tctx, coll, nbytes, 1, (float**)table, NA, NP, 0, &nch);
    int ba = -1, bp = -1;
    float best = -1.0f;
    for (int a = 0; a < NA; a++)
      for (int p = 0; p < NP; p++)
        if (table[a][p] >= 0.0f && (best < 0.0f || table[a][p] < best)) { best = table[a][p]; ba = a; bp = p; }
    fprintf(out, "%zu %d %zu %d %d %d\n", i, coll, nbytes, ba, bp, nch);
    if (ba < 0 || !pctx) continue;
    const tline_t* t = find(coll, lg, ba, bp, nch);
    double us = t ? t->time_us : 1000.0;
    us *= exp(noise * nrand());
    int ran_ch = nch > 0 ? nch : 8;
    ncclrl_profiler_descr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = NCCLRL_PROFILE_COLL;
    d.rank = rank;
    d.coll.func = FUNC[coll];
    d.coll.count = (coll == 2 || coll == 3) ? nbytes / 4 / (size_t)nranks : nbytes / 4;
    d.coll.datatype = "ncclFloat32";
    d.coll.nChannels = (uint8_t)ran_ch;
    d.coll.algo = ALGO[ba];
    d.coll.proto = PROTO[bp];
    void* h = NULL;
    prof->startEvent(pctx, &h, &d);
    if (h) prof->stopEvent(h); /* NCCL stops the host-side event at launch; its channels report later */
    int other = ba != own_a || bp != own_p || nch != 0;
    job_t j = {h, ran_ch, clock_ns, (uint64_t)(us * 1000.0), other ? (uint64_t)(late_us * 1000.0) : 0};
    clock_ns += j.late_ns + j.dur_ns + 1000;
    if (h) push_job(j);
  }
  pthread_mutex_lock(&qmu);
  q_done = 1;
  pthread_cond_signal(&qcv);
  pthread_mutex_unlock(&qmu);
  pthread_join(proxy, NULL);
  clock_gettime(CLOCK_MONOTONIC, &w1);
  tun->finalize(tctx);
  if (pctx) prof->finalize(pctx);
  dlclose(lib); /* as NCCL unloads its plugins: nothing of the library may run after this */
  { struct timespec s = {0, 50000000}; nanosleep(&s, NULL); }
  fclose(out);
  free(ccoll);
  free(cbytes);
  fprintf(stderr, "rank %d: %zu calls in %.3f s\n", rank, ncalls,
          (w1.tv_sec - w0.tv_sec) + (w1.tv_nsec - w0.tv_nsec) * 1e-9);
  return 0;
}
