/* A program outside the project: saves a tensor, loads it back, checks the
 * CRCs, using nothing but the installed header and library. */
#include <stdio.h>
#include <string.h>

#include <ckptio.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  float w[64], back[64];
  for (int i = 0; i < 64; i++) w[i] = (float)i * 0.5f;
  ckptio_ctx *ctx;
  ckptio_writer *wr;
  ckptio_reader *r;
  ckptio_tensor t = {.name = "w", .dtype = CKPTIO_F32, .ndim = 1, .shape = {64}, .data = w,
                     .device = CKPTIO_DEVICE_HOST};
  size_t unchecked = 1;
  if (ckptio_ctx_create(NULL, &ctx) < 0 || ckptio_writer_open(ctx, argv[1], CKPTIO_FORMAT_SAFETENSORS, NULL, &wr) < 0 ||
      ckptio_writer_add(wr, &t) < 0 || ckptio_writer_commit(wr) < 0 || ckptio_writer_close(wr) < 0 ||
      ckptio_reader_open(ctx, argv[1], NULL, &r) < 0 || ckptio_reader_load(r, 0, back, sizeof back) < 0 ||
      ckptio_reader_verify(r, &unchecked) < 0) {
    fprintf(stderr, "consumer: %s\n", ckptio_last_open_error());
    return 1;
  }
  ckptio_reader_close(r);
  ckptio_ctx_free(ctx);
  if (memcmp(w, back, sizeof w) != 0 || unchecked != 0) {
    fprintf(stderr, "consumer: the tensor did not come back (or was not checked)\n");
    return 1;
  }
  printf("consumer: ckptio %s round trip ok\n", ckptio_version_string());
  return 0;
}
