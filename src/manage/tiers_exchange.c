/* Moving parts between ranks (tiers_exchange in tiers.h): the peer copies
 * a save sends and the parts a restore fetches from their holders. The
 * moves go in rounds in which a rank sends at most one part and receives at
 * most one, each round in chunks of at most TIERS_CHUNK bytes per rank, so
 * a rank holds two chunk buffers whatever the parts' sizes (and the MPI
 * adapter's int counts are never exceeded). A part is sent from its file's
 * mapping, and received into a restore's tensor itself where a chunk falls
 * in one: no copy of the bytes besides the communicator's own. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "manage/tiers.h"

#define TIERS_CHUNK ((uint64_t)8 << 20)

/* The chunk: TIERS_CHUNK; test builds (as io/fault.c's variables) take
 * CKPTIO_FAULT_TIERS_CHUNK=BYTES, so small parts cross chunks too. */
static uint64_t chunk_bytes(void) {
#ifdef CKPTIO_FAULT_INJECTION
  const char *v = getenv("CKPTIO_FAULT_TIERS_CHUNK");
  if (v && strtoull(v, NULL, 10) > 0) return strtoull(v, NULL, 10);
#endif
  return TIERS_CHUNK;
}

/* This rank's ends of one round: the move it sends (or -1) and the one it
 * receives (or -1), with their files. */
typedef struct ends {
  long send, recv;
  int in, out;                /* descriptors, -1 when not open (or failed) */
  const unsigned char *map;   /* the sent file mapped whole (sent from there, no read), or NULL */
  size_t map_len;
  char tmp[4200];             /* the receiving file's temp name */
} ends;

static void open_ends(ends *e, const tiers_move *moves) {
  e->in = e->out = -1;
  e->map = NULL;
  if (e->send >= 0) {
    e->in = open(moves[e->send].path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    size_t bytes = (size_t)moves[e->send].bytes;
    /* Mapped only when the file holds every byte sent (a shorter one would fault). */
    if (e->in >= 0 && bytes && fstat(e->in, &st) == 0 && (uint64_t)st.st_size >= bytes) {
      void *m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, e->in, 0);
      if (m != MAP_FAILED) e->map = m, e->map_len = bytes;
    }
  }
  if (e->recv >= 0 && !moves[e->recv].into) {
    snprintf(e->tmp, sizeof(e->tmp), "%s.%d.tmp", moves[e->recv].path, (int)getpid());
    e->out = open(e->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  }
}

/* The pieces of one chunk: what this rank sends (read into sbuf; zeros
 * when its file failed, the move then failed already) and what it keeps. */
static int read_piece(ends *e, unsigned char *sbuf, uint64_t off, uint64_t len) {
  uint64_t got = 0;
  while (e->in >= 0 && got < len) {
    ssize_t r = pread(e->in, sbuf + got, (size_t)(len - got), (off_t)(off + got));
    if (r <= 0) break;
    got += (uint64_t)r;
  }
  if (got < len) memset(sbuf + got, 0, (size_t)(len - got));
  return got == len ? 0 : -EIO;
}

static int write_piece(ends *e, tiers_stream *into, const unsigned char *rbuf, uint64_t off, uint64_t len) {
  if (into) return tiers_stream_feed(into, rbuf, off, len);
  uint64_t put = 0;
  while (e->out >= 0 && put < len) {
    ssize_t w = pwrite(e->out, rbuf + put, (size_t)(len - put), (off_t)(off + put));
    if (w <= 0) break;
    put += (uint64_t)w;
  }
  return put == len ? 0 : -EIO;
}

static uint64_t piece(uint64_t bytes, uint64_t off, uint64_t chunk) {
  return off >= bytes ? 0 : (bytes - off < chunk ? bytes - off : chunk);
}

/* One round: the moves in `round` (n of them, each rank at most once per
 * side), chunk after chunk (of the buffers' size, `chunk`). */
static int run_round(ckptio_tiers *t, tiers_move *moves, const long *round, size_t n, uint64_t chunk,
                     unsigned char *sbuf, unsigned char *rbuf, size_t *sc, size_t *rc_) {
  int me = t->comm.rank;
  ends e = {.send = -1, .recv = -1};
  uint64_t longest = 0;
  for (size_t i = 0; i < n; i++) {
    const tiers_move *m = &moves[round[i]];
    if (m->src == me) e.send = round[i];
    if (m->dst == me) e.recv = round[i];
    longest = m->bytes > longest ? m->bytes : longest;
  }
  open_ends(&e, moves);
  tiers_stream *into = e.recv >= 0 ? moves[e.recv].into : NULL;
  int sent_ok = e.send < 0 || e.in >= 0, recv_ok = e.recv < 0 || e.out >= 0 || into, rc = 0;
  for (uint64_t off = 0; rc == 0 && (off < longest || (longest == 0 && off == 0)); off += chunk) {
    memset(sc, 0, (size_t)t->comm.nranks * sizeof(size_t));
    memset(rc_, 0, (size_t)t->comm.nranks * sizeof(size_t));
    uint64_t slen = e.send >= 0 ? piece(moves[e.send].bytes, off, chunk) : 0;
    uint64_t rlen = e.recv >= 0 ? piece(moves[e.recv].bytes, off, chunk) : 0;
    const unsigned char *from = e.map && slen ? e.map + off : sbuf;
    if (slen) {
      sc[moves[e.send].dst] = (size_t)slen;
      if (!e.map && read_piece(&e, sbuf, off, slen) < 0) sent_ok = 0;
    }
    /* Bytes that all fall in one tensor of a stream are received in place. */
    unsigned char *to = rlen && into ? tiers_stream_target(into, off, rlen) : NULL;
    if (rlen) rc_[moves[e.recv].src] = (size_t)rlen;
    rc = t->comm.alltoallv(t->comm.user, from, sc, to ? to : rbuf, rc_);
    if (rc < 0) {
      ckptio_fail(t->err, rc, "rank %d: the communicator's alltoallv failed moving a part: %s", me,
                  ckptio_strerror(rc));
      break;
    }
    /* A stream keeps its own failure (tiers_stream_end says it); recv_ok is the transport's. */
    if (to) tiers_stream_landed(into, off, rlen);
    else if (rlen && write_piece(&e, into, rbuf, off, rlen) < 0 && !into) recv_ok = 0;
    if (longest == 0) break;
  }
  if (e.map) munmap((void *)e.map, e.map_len);
  if (e.in >= 0) close(e.in);
  if (e.out >= 0 && close(e.out) != 0) recv_ok = 0;
  if (e.recv >= 0 && !into) {
    if (rc == 0 && recv_ok && rename(e.tmp, moves[e.recv].path) != 0) recv_ok = 0;
    if (!(rc == 0 && recv_ok)) unlink(e.tmp);
  }
  if (e.recv >= 0) moves[e.recv].ok = rc == 0 && recv_ok;
  if (e.send >= 0) moves[e.send].ok = rc == 0 && sent_ok;
  return rc;
}

int tiers_exchange(ckptio_tiers *t, tiers_move *moves, size_t n) {
  size_t nr = (size_t)t->comm.nranks;
  long *round = malloc((n + 1) * sizeof(long));
  unsigned char *done = calloc(n + 1, 1), *busy = malloc(2 * nr);
  size_t *sc = malloc(2 * nr * sizeof(size_t));
  uint64_t chunk = chunk_bytes(); /* once: the buffers' size and every round's */
  unsigned char *sbuf = malloc((size_t)chunk), *rbuf = malloc((size_t)chunk);
  int rc = 0;
  if (!round || !done || !busy || !sc || !sbuf || !rbuf) {
    rc = ckptio_fail(t->err, -ENOMEM, "rank %d: no memory to move parts", t->comm.rank);
    /* Every rank allocates the same; a failure here fails the job's collectives anyway. */
    goto out;
  }
  for (size_t i = 0; i < n; i++) moves[i].ok = 0;
  /* Greedy rounds, the same on every rank: each move joins the first
   * round where neither its sender sends nor its receiver receives. */
  for (size_t left = n; left > 0 && rc == 0;) {
    size_t k = 0;
    memset(busy, 0, 2 * nr);
    for (size_t i = 0; i < n; i++) {
      if (done[i] || busy[moves[i].src] || busy[nr + (size_t)moves[i].dst]) continue;
      busy[moves[i].src] = busy[nr + (size_t)moves[i].dst] = 1;
      done[i] = 1;
      round[k++] = (long)i;
    }
    left -= k;
    rc = run_round(t, moves, round, k, chunk, sbuf, rbuf, sc, sc + nr);
  }
out:
  free(round);
  free(done);
  free(busy);
  free(sc);
  free(sbuf);
  free(rbuf);
  return rc;
}
