/* Removed checkpoints' blocks freed after save_end, not inside it.
 *
 * Unlinking a file frees its blocks in that call unless something holds it
 * open: 0.1-0.2 s of every 1 GiB save_end whose retention removed a 1 GiB
 * step on this machine (bench/RESULTS.md). Retention opens each file before
 * unlinking it, so the directory is exactly as it was when save_end returns
 * and every error is still reported there; only the closes that free the
 * blocks run on the manager's thread, which the next retention and
 * ckptio_manager_close wait for. */
#include <stdlib.h>
#include <unistd.h>

#include "core/nameset.h"
#include "manage/manage.h"

/* Descriptors held at once, at most: beyond, a file is freed as before. */
#define MGR_HELD_MAX 1024

void mgr_hold(mgr_held *h, int fd) {
  if (fd < 0) return;
  if (h->n < MGR_HELD_MAX && ckptio_array_grow((void **)&h->fds, &h->cap, h->n, sizeof(int)) == 0)
    h->fds[h->n++] = fd;
  else
    close(fd);
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
