/*
 * torch_dump FILE: runs ckptio_torch_parse on a mapped file and prints the
 * index as one JSON object, for tests/interop/test_torch_read.py to compare
 * with what the real torch sees. Exit 0 when parsed, 1 when refused (the
 * JSON then carries the code and message), 2 on a usage or I/O error.
 * Links the static library (the parser is internal).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptio.h"
#include "core/error.h"
#include "formats/index.h"
#include "formats/json.h"
#include "formats/torch_read.h"

static void put_string(const char *s) {
  ckptio_json_out o = {0};
  if (ckptio_json_out_string(&o, s) < 0) exit(2);
  fwrite(o.data, 1, o.len, stdout);
  free(o.data);
}

static void put_i64s(const int64_t *v, int n) {
  putchar('[');
  for (int d = 0; d < n; d++) printf("%s%" PRId64, d ? "," : "", v[d]);
  putchar(']');
}

static void dump(const ckptio_index *ix) {
  printf("{\"ok\":true,\"format\":");
  put_string(ckptio_index_format_name(ix->format));
  printf(",\"header_bytes\":%" PRIu64 ",\"tensors\":[", ix->header_bytes);
  for (size_t i = 0; i < ix->count; i++) {
    const ckptio_entry *e = &ix->entries[i];
    printf("%s{\"name\":", i ? "," : "");
    put_string(e->name);
    printf(",\"dtype\":\"%s\",\"shape\":", ckptio_dtype_name(e->dtype));
    put_i64s(e->shape, e->ndim);
    printf(",\"strided\":%d,\"offset\":%" PRIu64 ",\"nbytes\":%" PRIu64 ",\"has_crc\":%d,\"crc\":%u",
           e->strided, e->offset, e->nbytes, e->has_crc, e->crc);
    printf(",\"elem_offset\":%" PRIu64 ",\"stride\":", e->elem_offset);
    put_i64s(e->stride, e->strided ? e->ndim : 0);
    printf(",\"byteswap\":%d}", e->byteswap);
  }
  printf("],\"metadata\":[");
  for (size_t i = 0; i < ix->meta_count; i++) {
    printf("%s[", i ? "," : "");
    put_string(ix->meta[i].key);
    putchar(',');
    put_string(ix->meta[i].value);
    putchar(']');
  }
  printf("]}\n");
}

int main(int argc, char **argv) {
  char err[CKPTIO_ERRLEN] = "";
  ckptio_index ix = {0};
  struct stat st;
  const uint8_t *map = NULL;
  int fd, rc;
  if (argc != 2) {
    fprintf(stderr, "usage: torch_dump FILE\n");
    return 2;
  }
  if ((fd = open(argv[1], O_RDONLY)) < 0 || fstat(fd, &st) < 0) {
    perror(argv[1]);
    return 2;
  }
  if (st.st_size > 0) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      perror("mmap");
      return 2;
    }
    map = m;
  }
  rc = ckptio_torch_parse(map, (uint64_t)st.st_size, &ix, err, sizeof(err));
  if (rc < 0) {
    printf("{\"ok\":false,\"code\":%d,\"code_name\":", rc);
    put_string(ckptio_strerror(rc));
    printf(",\"error\":");
    put_string(err);
    printf("}\n");
  } else {
    dump(&ix);
  }
  ckptio_index_free(&ix);
  if (map) munmap((void *)map, (size_t)st.st_size);
  close(fd);
  return rc < 0 ? 1 : 0;
}
