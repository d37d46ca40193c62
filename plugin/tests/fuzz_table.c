/* libFuzzer target: any bytes as a table, from a file and from NCCLRL_TUNER_TABLE_DATA, must load
 * without a crash, leak or UB, and every lookup on the result must be safe. The file is read with no
 * fingerprint expected (refused whole) and with NCCLRL_TUNER_TABLE_FINGERPRINT=any (parsed). Built
 * with the plugin's source compiled in. */
#include "../ncclrl_tuner.c"

#include <unistd.h>

static void exercise(void) {
  void* ctx = NULL;
  ncclrl_nvl_domain_info_v5_t nvl = {1, 4, 4};
  init_v5(&ctx, 1, 4, 1, NULL, &nvl, NULL);
  if (!ctx) return;
  float t[7][3];
  for (int c = 0; c < NCCLRL_NUM_COLLS; c++)
    for (size_t s = 1; s < ((size_t)1 << 40); s *= 7) {
      for (int a = 0; a < 7; a++)
        for (int p = 0; p < 3; p++) t[a][p] = (a + p) % 3 == 0 ? -1.0f : 1.0f;
      int nch = 0;
      get_v4(ctx, c, s, 1, (float**)t, 7, 3, 0, &nch);
      if (nch < 0 || nch > MAX_CHANNELS) __builtin_trap();
      for (int a = 0; a < 7; a++)
        for (int p = 0; p < 3; p++)
          if ((a + p) % 3 == 0 && t[a][p] != -1.0f) __builtin_trap(); /* forced a disabled entry */
      size_t chunk = 0;
      chunk_v6(ctx, c, s, 1, 2, nch, &chunk);
    }
  destroy_ctx(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* the raw bytes (NULs included) as a file */
  char path[] = "/tmp/ncclrl-fuzz-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 0;
  if (write(fd, data, size) != (ssize_t)size) { close(fd); unlink(path); return 0; }
  close(fd);
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  setenv("NCCLRL_TUNER_TABLE", path, 1);
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT"); /* no fingerprint expected: refused whole */
  exercise();
  setenv("NCCLRL_TUNER_TABLE_FINGERPRINT", "any", 1); /* loaded unchecked: the parser's input */
  exercise();
  unsetenv("NCCLRL_TUNER_TABLE_FINGERPRINT");
  unlink(path);
  /* the same bytes up to the first NUL as the environment variable's content (the path unused) */
  char* text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  setenv("NCCLRL_TUNER_TABLE_DATA", text, 1);
  setenv("NCCLRL_TUNER_TABLE", "/nonexistent/ncclrl-fuzz.csv", 1);
  exercise();
  unsetenv("NCCLRL_TUNER_TABLE_DATA");
  free(text);
  return 0;
}
