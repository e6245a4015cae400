/*
 * Writes a torch.save file through ckptio_torch_layout, the way the writer
 * pipeline does (extents, tensor bytes, then set_crc and the CRC extents
 * again), for test_torch_write.py to load with the real torch.
 *
 * Usage: torch_write_driver SPEC DATA OUT
 * SPEC lines (names, keys and values hex-encoded UTF-8):
 *   A <archive>                      archive folder name (default: none given)
 *   C <0|1>                          with_crc (default 1)
 *   M <hexkey> <hexvalue>            metadata
 *   T <hexname> <DTYPE> <offset> <ndim> <dims...>
 *                                    a tensor whose bytes are DATA[offset, +nbytes);
 *                                    offset -1: all zero bytes (not read)
 * Prints "tensor <i> <offset> <nbytes>" per input and "file_size <n>".
 * Exit 0, or 1 with ckptio's message on stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/crc32.h"
#include "core/error.h"
#include "formats/layout.h"
#include "formats/torch_write.h"

#define MAX_INPUTS 100000

static char *unhex(const char *h) {
  size_t n = strlen(h) / 2;
  char *s = malloc(n + 1);
  for (size_t k = 0; s && k < n; k++) {
    unsigned v;
    if (sscanf(h + 2 * k, "%2x", &v) != 1) v = '?';
    s[k] = (char)v;
  }
  if (s) s[n] = 0;
  return s;
}

static int pwrite_all(int fd, const void *buf, uint64_t len, uint64_t off) {
  const uint8_t *p = buf;
  while (len) {
    size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
    ssize_t w = pwrite(fd, p, chunk, (off_t)off);
    if (w <= 0) return -1;
    p += w, off += (uint64_t)w, len -= (uint64_t)w;
  }
  return 0;
}

int main(int argc, char **argv) {
  static ckptio_layout_input in[MAX_INPUTS];
  static int64_t shapes[MAX_INPUTS][CKPTIO_MAX_DIMS];
  static int64_t src_off[MAX_INPUTS];
  static ckptio_kv meta[1024];
  static uint8_t zeros[1 << 20];
  char line[1 << 16], err[CKPTIO_ERRLEN] = "", *archive = NULL;
  size_t n = 0, nmeta = 0;
  int with_crc = 1, fd = -1, dfd = -1, status = 1;
  const uint8_t *data = NULL;
  struct stat sb = {0};
  ckptio_layout l = {0};
  if (argc != 4) {
    fprintf(stderr, "usage: %s SPEC DATA OUT\n", argv[0]);
    return 2;
  }
  FILE *spec = fopen(argv[1], "r");
  if (!spec) {
    perror(argv[1]);
    return 1;
  }
  while (fgets(line, sizeof(line), spec)) {
    char a[sizeof(line)], b[sizeof(line)];
    int nchar = 0;
    if (line[0] == 'A' && sscanf(line, "A %s", a) == 1) {
      free(archive);
      archive = strdup(a);
    } else if (line[0] == 'C') {
      with_crc = atoi(line + 2);
    } else if (line[0] == 'M' && sscanf(line, "M %s %s", a, b) == 2 && nmeta < 1024) {
      meta[nmeta].key = unhex(a);
      meta[nmeta++].value = unhex(b);
    } else if (line[0] == 'T' && n < MAX_INPUTS) {
      ckptio_layout_input *t = &in[n];
      char dt[32];
      if (sscanf(line, "T %s %31s %" SCNd64 " %d%n", a, dt, &src_off[n], &t->ndim, &nchar) != 4 ||
          ckptio_dtype_parse(dt, &t->dtype) < 0 || t->ndim < 0 || t->ndim > CKPTIO_MAX_DIMS) {
        fprintf(stderr, "bad spec line: %s", line);
        goto out;
      }
      const char *p = line + nchar;
      for (int d = 0; d < t->ndim; d++) {
        int used = 0;
        sscanf(p, " %" SCNd64 "%n", &shapes[n][d], &used);
        p += used;
      }
      t->name = unhex(a);
      t->shape = shapes[n++];
      int64_t nb = ckptio_tensor_nbytes(t->dtype, t->ndim, t->shape);
      if (nb < 0) {
        fprintf(stderr, "tensor %s: %s\n", t->name, ckptio_strerror((int)nb));
        goto out;
      }
      t->nbytes = (uint64_t)nb;
    }
  }
  fclose(spec);
  spec = NULL;

  dfd = open(argv[2], O_RDONLY);
  if (dfd >= 0 && fstat(dfd, &sb) == 0 && sb.st_size > 0) {
    data = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, dfd, 0);
    if (data == MAP_FAILED) data = NULL;
  }
  int rc = ckptio_torch_layout(in, n, meta, nmeta, with_crc, archive, &l, err, sizeof(err));
  if (rc < 0) {
    fprintf(stderr, "ckptio_torch_layout: %s: %s\n", ckptio_strerror(rc), err);
    goto out;
  }
  fd = open(argv[3], O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0 || ftruncate(fd, (off_t)l.file_size) < 0) goto io;
  for (size_t e = 0; e < l.nextents; e++)
    if (pwrite_all(fd, l.extents[e].bytes, l.extents[e].len, l.extents[e].offset) < 0) goto io;
  for (size_t i = 0; i < n; i++) {
    uint32_t crc = 0;
    if (src_off[i] >= 0) {
      if (!data || (uint64_t)src_off[i] + in[i].nbytes > (uint64_t)sb.st_size) {
        fprintf(stderr, "tensor %s: DATA too short\n", in[i].name);
        goto out;
      }
      if (pwrite_all(fd, data + src_off[i], in[i].nbytes, l.offset[i]) < 0) goto io;
      crc = ckptio_crc32(0, data + src_off[i], in[i].nbytes);
    } else {  /* zeros: ftruncate made them; only the CRC is needed */
      for (uint64_t done = 0; done < in[i].nbytes;) {
        uint64_t c = in[i].nbytes - done < sizeof(zeros) ? in[i].nbytes - done : sizeof(zeros);
        crc = ckptio_crc32(crc, zeros, c);
        done += c;
      }
    }
    if (l.set_crc) l.set_crc(&l, i, crc);
    printf("tensor %zu %" PRIu64 " %" PRIu64 "\n", i, l.offset[i], in[i].nbytes);
  }
  for (size_t e = 0; e < l.nextents; e++)
    if (l.extents[e].holds_crc &&
        pwrite_all(fd, l.extents[e].bytes, l.extents[e].len, l.extents[e].offset) < 0)
      goto io;
  printf("file_size %" PRIu64 "\n", l.file_size);
  status = 0;
io:
  if (status) perror(argv[3]);
out:
  if (fd >= 0 && close(fd) < 0 && !status) status = 1, perror(argv[3]);
  if (spec) fclose(spec);
  if (data) munmap((void *)data, (size_t)sb.st_size);
  if (dfd >= 0) close(dfd);
  ckptio_layout_free(&l);
  for (size_t i = 0; i < n; i++) free((char *)in[i].name);
  for (size_t m = 0; m < nmeta; m++) free((char *)meta[m].key), free((char *)meta[m].value);
  free(archive);
  return status;
}
