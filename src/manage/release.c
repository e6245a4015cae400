/* Removed checkpoints' blocks freed after save_end, not inside it.
 *
 * Unlinking a file frees its blocks in that call unless something holds it
 * open: 0.1-0.2 s of every 1 GiB save_end whose retention removed a 1 GiB
 * step on this machine (bench/RESULTS.md). Retention, and the removal of an
 * older checkpoint of the step just saved, open each file before unlinking
 * it, so the directory is exactly as it was when save_end returns and every
 * error is still reported there; only the closes that free the
 * blocks run on the manager's thread, which the next retention and
 * ckptio_manager_close wait for. */
#include "manage/manage.h"

static void *close_all(void *arg) {
  ckptio_held_close_all(arg);
  return NULL;
}

void mgr_close_later(ckptio_manager *m, ckptio_held *h) {
  mgr_closes_join(m);
  if (!h->n) return;
  m->closing = *h;
  *h = (ckptio_held){0};
  m->closer_running = pthread_create(&m->closer, NULL, close_all, &m->closing) == 0;
  if (!m->closer_running) ckptio_held_close_all(&m->closing);
}

void mgr_closes_join(ckptio_manager *m) {
  if (m->closer_running) pthread_join(m->closer, NULL);
  m->closer_running = 0;
}
