#include "core/hold.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/nameset.h"

int ckptio_hold_blocks(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
  }
  return fd;
}

void ckptio_held_add(ckptio_held *h, int fd) {
  if (fd < 0) return;
  if (h->n < CKPTIO_HELD_MAX && ckptio_array_grow((void **)&h->fds, &h->cap, h->n, sizeof(int)) == 0)
    h->fds[h->n++] = fd;
  else
    ckptio_held_close(fd);
}

void ckptio_held_close_all(ckptio_held *h) {
  for (size_t i = 0; i < h->n; i++) ckptio_held_close(h->fds[i]);
  free(h->fds);
  *h = (ckptio_held){0};
}

static _Atomic uint64_t close_ns;

void ckptio_held_slow_closes(uint64_t ns) { atomic_store(&close_ns, ns); }

void ckptio_held_close(int fd) {
  uint64_t ns = atomic_load_explicit(&close_ns, memory_order_relaxed);
  if (ns) nanosleep(&(struct timespec){(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)}, NULL);
  close(fd);
}
