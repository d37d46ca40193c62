/*
 * HMAC-SHA256 (FIPS 180-4, RFC 2104) in plain C (libc only): the online mode's proofs that a
 * connection holds the job's secret. Static functions, included by ncclrl_online.c and by the
 * online mode's benchmark (tests/bench_online.c), which plays a coordinator.
 */
#ifndef NCCLRL_HMAC_H
#define NCCLRL_HMAC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct { uint32_t h[8]; uint64_t len; uint8_t buf[64]; size_t n; } sha256_t;

static const uint32_t SHA_K[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
  0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
  0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
  0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2};

static uint32_t ror32(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }

static void sha256_block(sha256_t* s, const uint8_t* p) {
  uint32_t w[64], v[8];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  memcpy(v, s->h, sizeof(v));
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = v[7] + (ror32(v[4], 6) ^ ror32(v[4], 11) ^ ror32(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) +
                  SHA_K[i] + w[i];
    uint32_t t2 = (ror32(v[0], 2) ^ ror32(v[0], 13) ^ ror32(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
    memmove(v + 1, v, 7 * sizeof(uint32_t));
    v[4] += t1;
    v[0] = t1 + t2;
  }
  for (int i = 0; i < 8; i++) s->h[i] += v[i];
}

static void sha256_init(sha256_t* s) {
  static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, H0, sizeof(H0));
  s->len = 0;
  s->n = 0;
}

static void sha256_put(sha256_t* s, const void* data, size_t len) {
  const uint8_t* p = (const uint8_t*)data;
  s->len += len;
  while (len) {
    size_t take = 64 - s->n < len ? 64 - s->n : len;
    memcpy(s->buf + s->n, p, take);
    s->n += take;
    p += take;
    len -= take;
    if (s->n == 64) { sha256_block(s, s->buf); s->n = 0; }
  }
}

static void sha256_end(sha256_t* s, uint8_t out[32]) {
  uint64_t bits = s->len * 8;
  uint8_t pad = 0x80, zero = 0, lenb[8];
  sha256_put(s, &pad, 1);
  while (s->n != 56) sha256_put(s, &zero, 1);
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha256_put(s, lenb, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24); out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8); out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

/* hex of HMAC-SHA256(key, msg) into out (65 bytes) */
static void hmac_hex(const char* key, size_t klen, const char* msg, char out[65]) {
  uint8_t k[64] = {0}, ipad[64], opad[64], inner[32], mac[32];
  if (klen > 64) { sha256_t t; sha256_init(&t); sha256_put(&t, key, klen); sha256_end(&t, k); }
  else memcpy(k, key, klen);
  for (int i = 0; i < 64; i++) { ipad[i] = k[i] ^ 0x36; opad[i] = k[i] ^ 0x5c; }
  sha256_t s;
  sha256_init(&s); sha256_put(&s, ipad, 64); sha256_put(&s, msg, strlen(msg)); sha256_end(&s, inner);
  sha256_init(&s); sha256_put(&s, opad, 64); sha256_put(&s, inner, 32); sha256_end(&s, mac);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* equal strings, in time that does not depend on where they differ */
__attribute__((unused)) static int ct_equal(const char* a, const char* b) {
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = (unsigned char)(la != lb);
  for (size_t i = 0; i < la && i < lb; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

#endif
