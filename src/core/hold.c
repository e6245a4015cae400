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

void ckptio_closer_init(ckptio_closer *c) {
  *c = (ckptio_closer){.running = 0};
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
}

static void *closer_main(void *arg) {
  ckptio_closer *c = arg;
  pthread_mutex_lock(&c->mu);
  while (c->queue.n) {
    ckptio_held h = c->queue;
    c->queue = (ckptio_held){0};
    pthread_mutex_unlock(&c->mu);
    ckptio_held_close_all(&h);
    pthread_mutex_lock(&c->mu);
  }
  c->running = 0;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

void ckptio_closer_add(ckptio_closer *c, ckptio_held *h) {
  if (!h->n) return;
  ckptio_held here = {0};
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < h->n; i++) ckptio_held_add(&c->queue, h->fds[i]);
  free(h->fds);
  *h = (ckptio_held){0};
  if (!c->running) {
    if (c->started) pthread_join(c->th, NULL); /* done: it cleared running */
    c->running = c->started = pthread_create(&c->th, NULL, closer_main, c) == 0;
  }
  if (!c->running) here = c->queue, c->queue = (ckptio_held){0};
  pthread_mutex_unlock(&c->mu);
  ckptio_held_close_all(&here);
}

int ckptio_closer_wait(ckptio_closer *c) {
  pthread_mutex_lock(&c->mu);
  int any = c->running;
  while (c->running) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  return any;
}

void ckptio_closer_fini(ckptio_closer *c) {
  ckptio_closer_wait(c);
  if (c->started) pthread_join(c->th, NULL);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
}

static _Atomic uint64_t close_ns;

void ckptio_held_slow_closes(uint64_t ns) { atomic_store(&close_ns, ns); }

void ckptio_held_close(int fd) {
  uint64_t ns = atomic_load_explicit(&close_ns, memory_order_relaxed);
  if (ns) nanosleep(&(struct timespec){(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)}, NULL);
  close(fd);
}
