/*
 * The raw limits a save or load is measured against, taken in the same run:
 * the best of several ways of writing and of reading the same file (O_DIRECT
 * with 32 requests of 8 MiB in flight, what fio --direct=1 --ioengine=libaio
 * --iodepth=32 --bs=8M measures; buffered ways through the page cache), each
 * reported, and a single-thread memcpy between touched buffers.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "cli/cli.h"

/* The deepest way (CLI_RAW_READ_DEEP) holds 64 requests in flight. */
#define RAW_MAX_THREADS 64

/* Blocking threads stand in for libaio: with 8 or more of them each holding
 * one request, the disk sees the same queue depth and reaches the same
 * figure, and the code needs no extra library. */
typedef struct raw_job {
  int fd;
  int writing;
  uint8_t *buf;
  uint64_t window;  /* requests cycle through this much of buf (0: all of n) */
  uint64_t n;
  uint64_t block;   /* bytes per request */
  atomic_uint_fast64_t next;
  atomic_int err;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int go;
} raw_job;

static void *raw_worker(void *arg) {
  raw_job *j = arg;
  pthread_mutex_lock(&j->mu);
  while (!j->go) pthread_cond_wait(&j->cv, &j->mu);
  pthread_mutex_unlock(&j->mu);
  for (;;) {
    uint64_t off = atomic_fetch_add(&j->next, j->block);
    if (off >= j->n || atomic_load(&j->err)) break;
    uint64_t len = j->n - off < j->block ? j->n - off : j->block;
    uint8_t *mem = j->buf + (j->window ? off % j->window : off);
    uint64_t done = 0;
    while (done < len) {
      ssize_t r = j->writing ? pwrite(j->fd, mem + done, len - done, (off_t)(off + done))
                             : pread(j->fd, mem + done, len - done, (off_t)(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        int e = r < 0 ? -errno : -EIO;
        int zero = 0;
        atomic_compare_exchange_strong(&j->err, &zero, e);
        return NULL;
      }
      done += (uint64_t)r;
    }
  }
  return NULL;
}

/* Runs `threads` workers over [0, n) of fd, `block` bytes per request; the
 * clock starts when all exist and stops after the last one (and the sync,
 * when writing). One worker is a plain sequential loop. */
static int raw_run_with(int fd, int writing, void *buf, uint64_t window, uint64_t n, int threads,
                        uint64_t block, double *seconds) {
  raw_job j;
  j.fd = fd;
  j.writing = writing;
  j.buf = buf;
  j.window = window;
  j.n = n;
  j.block = block;
  atomic_init(&j.next, 0);
  atomic_init(&j.err, 0);
  pthread_mutex_init(&j.mu, NULL);
  pthread_cond_init(&j.cv, NULL);
  j.go = 0;
  pthread_t th[RAW_MAX_THREADS];
  int started = 0, rc = 0;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  if (threads > RAW_MAX_THREADS) threads = RAW_MAX_THREADS;
  for (; started < threads; started++) {
    if (pthread_create(&th[started], &attr, raw_worker, &j) != 0) break;
  }
  pthread_attr_destroy(&attr);
  /* Fewer threads would measure a shallower queue than asked: fail instead. */
  if (started < threads) atomic_store(&j.err, -EAGAIN);
  pthread_mutex_lock(&j.mu);
  j.go = 1;
  pthread_cond_broadcast(&j.cv);
  pthread_mutex_unlock(&j.mu);
  double t0 = cli_now();
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  rc = atomic_load(&j.err);
  if (!rc && writing && fdatasync(fd) != 0) rc = -errno;
  *seconds = cli_now() - t0;
  pthread_cond_destroy(&j.cv);
  pthread_mutex_destroy(&j.mu);
  return rc;
}

static int raw_run(int fd, int writing, void *buf, uint64_t window, uint64_t n, double *seconds) {
  return raw_run_with(fd, writing, buf, window, n, CLI_RAW_DEPTH, CLI_RAW_BLOCK, seconds);
}

/* O_DIRECT is refused by some filesystems (tmpfs): measure buffered I/O then,
 * and say so. */
static int open_maybe_direct(const char *path, int flags, int *direct) {
  int fd = open(path, flags | O_DIRECT | O_CLOEXEC, 0644);
  *direct = 1;
  if (fd < 0 && errno == EINVAL) {
    fd = open(path, flags | O_CLOEXEC, 0644);
    *direct = 0;
  }
  return fd < 0 ? -errno : fd;
}

static int raw_write(const char *path, const void *buf, uint64_t window, uint64_t n, double *seconds,
                     int *direct) {
  int fd = open_maybe_direct(path, O_WRONLY | O_CREAT | O_TRUNC, direct);
  if (fd < 0) return fd;
  /* fio lays a file out with fallocate before its clock starts (its default
   * fallocate=native), so do the same: on ext4 a write past the end of the
   * file takes the inode lock exclusively, and without preallocation fio's
   * figure halves (measured here: 1.16-1.34 GB/s vs 0.66-0.68). */
  int rc = -posix_fallocate(fd, 0, (off_t)n);
  if (rc == -EOPNOTSUPP || rc == -EINVAL) rc = 0; /* nothing to lay out: measure as is */
  if (!rc) rc = raw_run(fd, 1, (void *)buf, window, n, seconds);
  if (close(fd) != 0 && !rc) rc = -errno;
  return rc;
}

static int raw_read(const char *path, void *buf, uint64_t window, uint64_t n, double *seconds, int *direct) {
  int fd = open_maybe_direct(path, O_RDONLY, direct);
  if (fd < 0) return fd;
  int rc = raw_run(fd, 0, buf, window, n, seconds);
  close(fd);
  return rc;
}

int cli_raw_write(const char *path, const void *buf, uint64_t n, double *seconds, int *direct) {
  return raw_write(path, buf, 0, n, seconds, direct);
}

int cli_raw_read(const char *path, void *buf, uint64_t n, double *seconds, int *direct) {
  return raw_read(path, buf, 0, n, seconds, direct);
}

const char *cli_raw_write_way_name(int way) {
  switch (way) {
    case CLI_RAW_WRITE_DIRECT: return "O_DIRECT, 32 x 8 MiB in flight";
    case CLI_RAW_WRITE_BUFFERED: return "buffered 8 MiB writes + fdatasync";
    default: return "?";
  }
}

const char *cli_raw_read_way_name(int way) {
  switch (way) {
    case CLI_RAW_READ_DIRECT: return "O_DIRECT, 32 x 8 MiB in flight";
    case CLI_RAW_READ_SEQ: return "buffered, 1 thread, 1 MiB";
    case CLI_RAW_READ_PAR: return "buffered, 16 threads x 8 MiB";
    case CLI_RAW_READ_DEEP: return "O_DIRECT, 64 x 8 MiB in flight";
    default: return "?";
  }
}

/* A buffered write as most programs write: one thread, sequential 8 MiB
 * writes into the page cache, then fdatasync inside the time (the kernel
 * writes back behind the copies). The file is laid out first, as for the
 * O_DIRECT way, so the two differ only in how the bytes travel. */
static int raw_write_buffered(const char *path, const void *buf, uint64_t n, double *seconds) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  int rc = -posix_fallocate(fd, 0, (off_t)n);
  if (rc == -EOPNOTSUPP || rc == -EINVAL) rc = 0;
  if (!rc) rc = raw_run_with(fd, 1, (void *)buf, 0, n, 1, CLI_RAW_BLOCK, seconds);
  if (close(fd) != 0 && !rc) rc = -errno;
  return rc;
}

int cli_raw_write_ways(const char *path, const void *buf, uint64_t n,
                       double seconds[CLI_RAW_WRITE_WAYS], int *direct) {
  int rc = cli_raw_write(path, buf, n, &seconds[CLI_RAW_WRITE_DIRECT], direct);
  /* The buffered way leaves the file in the page cache: drop it so a read
   * of it that follows is cold. */
  if (!rc) rc = raw_write_buffered(path, buf, n, &seconds[CLI_RAW_WRITE_BUFFERED]);
  if (!rc) rc = cli_drop_cache(path);
  return rc;
}

/* Concurrency and request size of the parallel buffered read: those of
 * runai-model-streamer's file system reads (RUNAI_STREAMER_CONCURRENCY,
 * default 16 workers; file system chunks of 8 MiB, 2 MiB blocks, as its
 * 0.17 prints at RUNAI_STREAMER_LOG_LEVEL=DEBUG). Its default strategy there
 * is io_uring O_DIRECT at a queue depth of 64 x 8 MiB (the deep way below),
 * with 16 workers doing buffered preads ("sync_buffered") as the fallback
 * (this one). */
#define RAW_PAR_THREADS 16
#define RAW_PAR_BLOCK (8u << 20)
/* The sequential read: 1 MiB requests, the kernel's readahead ahead of them
 * (what cat, dd bs=1M or a plain Python read loop get). */
#define RAW_SEQ_BLOCK (1u << 20)

static int raw_read_buffered(const char *path, void *buf, uint64_t n, int threads, uint64_t block,
                             double *seconds) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = raw_run_with(fd, 0, buf, 0, n, threads, block, seconds);
  close(fd);
  return rc;
}

/* O_DIRECT at twice the depth: runai-model-streamer's default (io_uring, 64
 * reads of 8 MiB in flight) read this disk faster than depth 32 at times.
 * O_DIRECT refused: buffered, as the other O_DIRECT way. */
static int raw_read_deep(const char *path, void *buf, uint64_t n, double *seconds) {
  int direct;
  int fd = open_maybe_direct(path, O_RDONLY, &direct);
  if (fd < 0) return fd;
  int rc = raw_run_with(fd, 0, buf, 0, n, 2 * CLI_RAW_DEPTH, CLI_RAW_BLOCK, seconds);
  close(fd);
  return rc;
}

int cli_raw_read_ways(const char *path, void *buf, uint64_t n, double seconds[CLI_RAW_READ_WAYS],
                      int *direct) {
  /* Each way starts from a cold file: the one before it may have left its
   * pages in the cache. */
  int rc = cli_drop_cache(path);
  if (!rc) rc = cli_raw_read(path, buf, n, &seconds[CLI_RAW_READ_DIRECT], direct);
  if (!rc) rc = cli_drop_cache(path);
  if (!rc) rc = raw_read_buffered(path, buf, n, 1, RAW_SEQ_BLOCK, &seconds[CLI_RAW_READ_SEQ]);
  if (!rc) rc = cli_drop_cache(path);
  if (!rc)
    rc = raw_read_buffered(path, buf, n, RAW_PAR_THREADS, RAW_PAR_BLOCK, &seconds[CLI_RAW_READ_PAR]);
  if (!rc) rc = cli_drop_cache(path);
  if (!rc) rc = raw_read_deep(path, buf, n, &seconds[CLI_RAW_READ_DEEP]);
  if (!rc) rc = cli_drop_cache(path);
  return rc;
}

double cli_raw_best(const double *seconds, int ways) {
  double best = 0;
  for (int i = 0; i < ways; i++)
    if (seconds[i] > 0 && (best == 0 || seconds[i] < best)) best = seconds[i];
  return best;
}

#define HUGE_PAGE (2u << 20)
#define THP_WINDOW ((uint64_t)CLI_RAW_DEPTH * CLI_RAW_BLOCK)

int cli_raw_thp(const char *path, uint64_t n, double *write_s, double *read_s) {
  /* One block per request in flight, as fio's buffers are, in 2 MiB pages:
   * a request is then a few physically contiguous pieces instead of 2048
   * pages, and some disks (this virtual one) move those much faster. */
  uint64_t window = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  if (window > THP_WINDOW) window = THP_WINDOW;
  size_t len = (size_t)window + HUGE_PAGE;
  uint8_t *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return -errno;
  uint8_t *buf = (uint8_t *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
  (void)madvise(buf, (size_t)window, MADV_HUGEPAGE);
#endif
  memset(buf, 0x5a, (size_t)window);
  int direct = 1;
  unlink(path);
  int rc = raw_write(path, buf, window, n, write_s, &direct);
  if (!rc) rc = cli_drop_cache(path);
  if (!rc) rc = raw_read(path, buf, window, n, read_s, &direct);
  munmap(map, len);
  return rc;
}

double cli_raw_memcpy(void *dst, const void *src, uint64_t n) {
  double t0 = cli_now();
  memcpy(dst, src, n);
  double t = cli_now() - t0;
  /* Keep the copy from being proven dead. */
  __asm__ __volatile__("" : : "r"(dst) : "memory");
  return t;
}

int cli_drop_cache(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = 0;
  /* Dirty pages are not dropped, so write them first (a --no-fsync save
   * leaves them). */
  if (fdatasync(fd) != 0) rc = -errno;
  int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (!rc && e) rc = -e;
  close(fd);
  return rc;
}

int cli_warm_cache(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t len = 8u << 20;
  char *buf = malloc(len);
  int rc = buf ? 0 : -ENOMEM;
  while (!rc) {
    ssize_t r = read(fd, buf, len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = -errno;
    if (r <= 0) break;
  }
  free(buf);
  close(fd);
  return rc;
}
