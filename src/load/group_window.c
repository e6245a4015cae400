/* Group loads through windows of shared memory (group_run.h), for ranks on
 * one machine that cannot share a page cache (an object in a storage, a
 * file larger than memory): one shared mapping holds two windows, each a
 * region per rank. In round k each rank reads its batch k into its region
 * of window k % 2 (on a thread, one round ahead), every rank copies the
 * pieces of its boxes from every rank's region, and the ranks agree twice
 * a round: after the reads (a failure stops every rank there) and after
 * the copies (so no window is refilled while someone still copies from
 * it). Each received byte is copied once, where an exchange copies it
 * three or four times. The mapping is a POSIX shared memory object that
 * rank 0 makes, sizes with posix_fallocate (a full /dev/shm says so
 * instead of faulting later), names to the others and unlinks once every
 * rank has mapped it; where any rank cannot (another /dev/shm, another
 * user), every rank exchanges instead. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fault.h"
#include "load/group_run.h"

/* What rank 0 tells the others: whether it made the object, and its name. */
typedef struct gname {
  int32_t status;
  char name[60];
} gname;

/* An owner's region: its largest batch (every owner's the same size). */
static uint64_t region_bytes(const ckptio_gplan *p) {
  uint64_t most = 0;
  for (int o = 0; o < p->nranks; o++)
    for (size_t k = 0; k < p->nbatches[o]; k++) {
      uint64_t b = 0;
      for (size_t c = p->batch[o][k]; c < p->batch[o][k + 1]; c++) b += p->chunks[c].bytes;
      most = b > most ? b : most;
    }
  return (most + 4095) / 4096 * 4096;
}

/* Where every owner's chunks of round `round` lie: its region of window
 * round % 2, one after another. */
static void place_window(ckptio_group *g, size_t round) {
  const ckptio_gplan *p = &g->p;
  uint64_t region = g->window_bytes / 2 / (uint64_t)p->nranks; /* load_windows sized it */
  for (int o = 0; o < p->nranks; o++) {
    size_t first, end;
    uint64_t at = ((round & 1) * (uint64_t)p->nranks + (uint64_t)o) * region;
    ckptio_grp_batch(p, o, round, &first, &end);
    for (size_t c = first; c < end; c++) {
      g->where[c] = g->window + at;
      g->direct[c] = SIZE_MAX;
      at += p->chunks[c].bytes;
    }
  }
}

/* Every rank's status: *any set when one failed. @return 0 or the
 * communicator's failure. */
static int agree(ckptio_group *g, int *any) {
  const ckptio_comm *c = g->comm;
  int32_t mine = g->status, *all = calloc((size_t)c->nranks, sizeof(int32_t));
  if (!all) return -ENOMEM;
  int rc = c->allgather(c->user, &mine, all, sizeof(mine));
  for (int r = 0; r < c->nranks && rc == 0; r++) *any |= all[r] != 0;
  free(all);
  if (rc < 0)
    return ckptio_fail(g->r->err, rc, "%s: rank %d: the communicator's all-gather failed: %s", g->r->src->path,
                       c->rank, ckptio_strerror(rc));
  return 0;
}

/* Round `round`: once every rank's batch is in, each copies its pieces
 * from every region; then every rank is done with the window. */
static int step_window(ckptio_group *g, size_t round, int *stop) {
  int rc = agree(g, stop);
  if (rc < 0 || *stop) return rc;
  for (int o = 0; o < g->p.nranks && g->status == 0; o++) {
    ckptio_landing from = {NULL, 0};
    if ((rc = ckptio_grp_pieces(g, round, o, g->p.rank, ckptio_grp_land, &from)) < 0) {
      g->status = rc;
      snprintf(g->why, sizeof(g->why), "%s", g->r->err);
    }
  }
  return agree(g, stop);
}

/* Rank 0 makes the object of `bytes`: *fd and its name in *n (status < 0
 * with the cause in err when it cannot). */
static void make_object(ckptio_group *g, uint64_t bytes, gname *n, int *fd) {
  static _Atomic unsigned serial;
  snprintf(n->name, sizeof(n->name), "/ckptio-group-%ld-%u", (long)getpid(), atomic_fetch_add(&serial, 1));
  *fd = shm_open(n->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  int e = *fd < 0 ? errno : ckptio_fault_check(CKPTIO_FAULT_FALLOCATE);
  if (!e) e = posix_fallocate(*fd, 0, (off_t)bytes);
  if (e) {
    n->status = -e;
    ckptio_fail(g->r->err, -e, "%s: rank 0: no shared memory of %llu bytes (%s): %s", g->r->src->path,
                (unsigned long long)bytes, n->name, ckptio_strerror(-e));
    if (*fd >= 0) close(*fd), shm_unlink(n->name), *fd = -1;
  }
}

int ckptio_grp_load_windows(ckptio_group *g, uint64_t *read) {
  const ckptio_comm *c = g->comm;
  const ckptio_gplan *p = &g->p;
  uint64_t bytes = 2 * (uint64_t)p->nranks * region_bytes(p);
  if (!(g->where = calloc(p->nchunks + 1, sizeof(*g->where))) || !(g->direct = calloc(p->nchunks + 1, sizeof(size_t))))
    g->status = -ENOMEM;
  gname n = {0};
  int fd = -1, rc;
  if (c->rank == 0 && bytes) make_object(g, bytes, &n, &fd);
  if ((rc = c->broadcast(c->user, &n, sizeof(n), 0)) < 0)
    return ckptio_fail(g->r->err, rc, "%s: rank %d: the communicator's broadcast failed: %s", g->r->src->path,
                       c->rank, ckptio_strerror(rc));
  if (bytes && n.status == 0) {
    if (c->rank != 0) fd = shm_open(n.name, O_RDWR, 0);
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) g->window = m, g->window_bytes = (size_t)bytes;
  }
  if (fd >= 0) close(fd);
  /* Everyone mapped it, or everyone exchanges instead. */
  int lost = (bytes && !g->window) || g->status != 0, saved = g->status, any = 0;
  g->status = lost ? -EIO : 0;
  rc = agree(g, &any);
  g->status = saved;
  if (c->rank == 0 && n.status == 0 && bytes) shm_unlink(n.name);
  if (rc < 0) return rc;
  if (any) {
    if (g->window) munmap(g->window, g->window_bytes);
    g->window = NULL, g->window_bytes = 0;
    free(g->where), free(g->direct);
    g->where = NULL, g->direct = NULL;
    return 1;
  }
  return ckptio_grp_rounds(g, read, place_window, step_window);
}
