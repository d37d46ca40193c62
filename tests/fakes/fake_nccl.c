/* A stand-in for libnccl.so with the entry points runners/nccl_direct.py declares: it records
 * each call's arguments so a test can check what crossed the ctypes boundary (argument order, a
 * 128-byte unique id passed by value, counts, data types, the stream), and fails on request. */
#include <stddef.h>
#include <string.h>

typedef struct { unsigned char internal[128]; } fakeUniqueId;

static unsigned char got_uid[128];
static int got_nranks = -1, got_rank = -1, got_type = -1, got_op = -1, got_root = -1, comm_token;
static size_t got_count;
static const void *got_send;
static void *got_recv, *got_stream, *got_comm;
static char got_call[32];
static int fail_with;  /* the next collective returns this */

int ncclGetVersion(int *v) { *v = 22809; return 0; }
int ncclGetUniqueId(fakeUniqueId *u) {
  for (int i = 0; i < 128; i++) u->internal[i] = (unsigned char)(i * 7 + 1);
  return 0;
}
int ncclCommInitRank(void **comm, int nranks, fakeUniqueId id, int rank) {
  memcpy(got_uid, id.internal, 128);
  got_nranks = nranks;
  got_rank = rank;
  *comm = &comm_token;
  return (nranks < 1 || rank < 0 || rank >= nranks) ? 4 : 0;
}
int ncclCommDestroy(void *comm) { return comm == &comm_token ? 0 : 4; }
int ncclCommGetAsyncError(void *comm, int *err) { *err = comm == &comm_token ? 0 : 4; return 0; }
const char *ncclGetErrorString(int rc) { return rc == 4 ? "invalid argument" : "unhandled error"; }

static int record(const char *name, const void *s, void *r, size_t count, int type, int op, int root, void *comm,
                  void *stream) {
  strncpy(got_call, name, sizeof got_call - 1);
  got_send = s; got_recv = r; got_count = count; got_type = type; got_op = op; got_root = root;
  got_comm = comm; got_stream = stream;
  int rc = fail_with;
  fail_with = 0;
  return rc;
}
int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
  return record("ncclAllReduce", s, r, n, t, op, -1, c, st);
}
int ncclAllGather(const void *s, void *r, size_t n, int t, void *c, void *st) {
  return record("ncclAllGather", s, r, n, t, -1, -1, c, st);
}
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, void *c, void *st) {
  return record("ncclReduceScatter", s, r, n, t, op, -1, c, st);
}
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, void *c, void *st) {
  return record("ncclBroadcast", s, r, n, t, -1, root, c, st);
}
int ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, void *c, void *st) {
  return record("ncclReduce", s, r, n, t, op, root, c, st);
}

/* for the test */
void fake_fail_next(int rc) { fail_with = rc; }
const unsigned char *fake_uid(void) { return got_uid; }
const char *fake_call(void) { return got_call; }
void fake_args(long long *out) {
  out[0] = got_nranks; out[1] = got_rank; out[2] = (long long)got_count; out[3] = got_type; out[4] = got_op;
  out[5] = got_root; out[6] = (long long)(size_t)got_send; out[7] = (long long)(size_t)got_recv;
  out[8] = (long long)(size_t)got_stream; out[9] = got_comm == &comm_token;
}
