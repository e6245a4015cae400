/*
 * The progress bar: a thread that polls a writer's or reader's byte counts
 * every 100 ms while the caller blocks in the library, so timings stay exact
 * and the bar never touches stdout. Silent unless stderr is a terminal.
 */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define POLL_NS (100 * 1000 * 1000)
#define QUIET_SECONDS 1.0

void cli_progress_writer(void *writer, uint64_t *done, uint64_t *total) {
  ckptio_writer_progress((ckptio_writer *)writer, done, total);
}

void cli_progress_reader(void *reader, uint64_t *done, uint64_t *total) {
  ckptio_reader_progress((ckptio_reader *)reader, done, total);
}

static int term_width(void) {
  struct winsize ws;
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
  return 80;
}

static void draw(cli_progress *p, double now) {
  uint64_t done = 0, total = 0;
  p->fn(p->arg, &done, &total);
  double secs = now - p->start;
  double rate = secs > 0 ? (double)done / secs : 0;
  char d[32], t[32], tail[96], eta[32] = "";
  if (rate > 0 && total > done) {
    double left = (double)(total - done) / rate;
    if (left >= 60)
      snprintf(eta, sizeof(eta), " ETA %dm%02ds", (int)(left / 60), (int)left % 60);
    else
      snprintf(eta, sizeof(eta), " ETA %.0fs", left);
  }
  snprintf(tail, sizeof(tail), " %s/%s %.2f GB/s%s", cli_fmt_bytes(done, d, sizeof(d)),
           cli_fmt_bytes(total, t, sizeof(t)), rate / 1e9, eta);
  /* A fixed reserve for the tail, so the bar does not jump as numbers grow. */
  int width = term_width() - 1 - (int)strlen(p->label) - 48 - 3;
  if (width > 40) width = 40;
  char bar[64];
  int fill = 0;
  if (width < 5) {
    width = 0;
  } else if (total) {
    fill = (int)((double)width * (double)(done > total ? total : done) / (double)total);
  }
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = 0;
  fprintf(stderr, "\r\033[K%s [%s]%s", p->label, bar, tail);
  fflush(stderr);
  p->drawn = 1;
}

static void *poll_main(void *arg) {
  cli_progress *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += POLL_NS;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    int rc = pthread_cond_timedwait(&p->cv, &p->mu, &until);
    if (p->stop) break;
    double now = cli_now();
    if (rc == ETIMEDOUT && now - p->start >= QUIET_SECONDS) draw(p, now);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

void cli_progress_start(cli_progress *p, const char *label, cli_progress_fn fn, void *arg) {
  memset(p, 0, sizeof(*p));
  if (!isatty(STDERR_FILENO)) return;
  snprintf(p->label, sizeof(p->label), "%s", label);
  p->fn = fn;
  p->arg = arg;
  p->start = cli_now();
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (pthread_create(&p->thread, NULL, poll_main, p) != 0) {
    /* No bar is better than no command. */
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    return;
  }
  p->active = 1;
}

void cli_progress_stop(cli_progress *p) {
  if (!p->active) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->thread, NULL);
  if (p->drawn) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  p->active = 0;
}
