/* Removed checkpoints' blocks freed after save_end, not inside it.
 *
 * Unlinking a file frees its blocks in that call unless something holds it
 * open: 0.1-0.2 s of every 1 GiB save_end whose retention removed a 1 GiB
 * step on this machine (bench/RESULTS.md). Retention opens each file before
 * unlinking it, so the directory is exactly as it was when save_end returns
 * and every error is still reported there; only the closes that free the
 * blocks run on the manager's thread, which the next retention and
 * ckptio_manager_close wait for. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manage/manage.h"

/* Descriptors held at once, at most: beyond, a file is freed as before. */
#define MGR_HELD_MAX 1024

int mgr_open_regular(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
  }
  return fd;
}

void mgr_hold(mgr_held *h, int fd) {
  if (fd < 0) return;
  if (h->n == h->cap && h->cap < MGR_HELD_MAX) {
    size_t cap = h->cap ? h->cap * 2 : 16;
    int *fds = realloc(h->fds, cap * sizeof(int));
    if (fds) {
      h->fds = fds;
      h->cap = cap;
    }
  }
  if (h->n < h->cap) h->fds[h->n++] = fd;
  else close(fd);
}

static void *close_all(void *arg) {
  mgr_held *h = arg;
  for (size_t i = 0; i < h->n; i++) close(h->fds[i]);
  free(h->fds);
  h->fds = NULL;
  h->n = h->cap = 0;
  return NULL;
}

void mgr_close_later(ckptio_manager *m, mgr_held *h) {
  mgr_closes_join(m);
  if (!h->n) return;
  m->closing = *h;
  *h = (mgr_held){0};
  m->closer_running = pthread_create(&m->closer, NULL, close_all, &m->closing) == 0;
  if (!m->closer_running) close_all(&m->closing);
}

void mgr_closes_join(ckptio_manager *m) {
  if (m->closer_running) pthread_join(m->closer, NULL);
  m->closer_running = 0;
}
