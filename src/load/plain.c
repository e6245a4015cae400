/* The plain file source: a safetensors file or a PyTorch archive, its
 * tensors' bytes as they are in the file. Jobs are at most one staging slot
 * of output and read with one method per load — pread straight into a host
 * destination, memcpy from the map a step at a time (populated, copied with
 * the CRC, dropped; behind a filler of the page cache, io/fill.h, for
 * AUTO's cold load that fits), or O_DIRECT: in place where the host destination
 * agrees with the file in O_DIRECT's alignment, else through a slot — a
 * PyTorch view gathered from the map; a GPU destination gets its bytes
 * through the slot. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/align.h"
#include "core/crc32.h"
#include "device/transfer.h"
#include "formats/safetensors.h"
#include "formats/torch_read.h"
#include "io/cache.h"
#include "io/file.h"
#include "io/fill.h"
#include "load/exec.h"
#include "load/view.h"
#include "storage/storage.h"

#define PAGE_DOWN(x) ((x) & ~(uint64_t)(CKPTIO_IO_ALIGN - 1))
#define PAGE_UP(x) PAGE_DOWN((x) + CKPTIO_IO_ALIGN - 1)
/* Runs below this go through AUTO as pread even from a cold file: one
 * O_DIRECT request per small run costs more than the bytes it saves. */
#define DIRECT_MIN_RUN (1u << 20)
/* Mapped runs of a slice from this size on are populated and dropped. */
#define MAP_POPULATE_MIN (64u << 10)
/* Smaller tensors are read through a slot: two ragged ends would be most of
 * the request. */
#define IN_PLACE_MIN (64u << 10)
/* Of an object in a storage, the wanted bytes of one grid cell at most
 * this far apart are read by one request, the bytes between read and
 * dropped (ckptio's writer pads tensors to a page, other writers not at
 * all); a wider gap starts another request (plan_object). */
#define COALESCE_GAP (64u << 10)
/* Of an object, a pair of grid cells whose parts all go to host memory is
 * read by one GET (two whole 8 MiB parts; a slot holds one cell, so a part
 * for a GPU keeps its cell to itself). SeaweedFS served a 1 GiB object by
 * 16 MiB GETs in 1.08 s against 1.43 s by 8 MiB ones (median of 8
 * alternating rounds, a plain client into fresh memory; bench/RESULTS_S3.md). */
#define HOST_CELLS 2

typedef struct plain {
  ckptio_source s;
  ckptio_rfile f;
  int registered;          /* the map is pinned for GPU copies (this load) */
  ckptio_fill *fill;       /* this load's filler of the page cache, or NULL */
  int fill_private;        /* the load checking a private map fills it ahead */
} plain;

#define P(src) ((plain *)(src))

/* ------------------------------------------------------------ open */

/* Header bytes [off, off + len) into buf (an object's from the first bytes
 * its open read, when they hold them: ckptio_rfile_pread); a failure says
 * why (a storage's own sentence for an object). */
static int read_header(plain *p, void *buf, size_t len, uint64_t off) {
  char why[CKPTIO_ERRLEN] = "";
  int rc = ckptio_rfile_pread(&p->f, buf, len, off, why, sizeof(why));
  if (rc < 0 && why[0]) return ckptio_fail(p->s.err, rc, "%s", why);
  if (rc < 0) return ckptio_fail(p->s.err, rc, "%s: reading the header: %s", p->s.path, ckptio_strerror(rc));
  return 0;
}

static int parse_safetensors(plain *p) {
  ckptio_source *s = &p->s;
  uint8_t prefix[8] = {0};
  uint64_t n, size = p->f.size;
  char msg[CKPTIO_ERRLEN];
  int rc = read_header(p, prefix, size < 8 ? (size_t)size : 8, 0);
  if (rc < 0) return rc;
  if ((rc = ckptio_st_header_length(prefix, size, &n, msg, sizeof(msg))) < 0)
    return ckptio_fail(s->err, rc, "%s: %s", s->path, msg);
  uint8_t *hdr = malloc(n ? n : 1);
  if (!hdr) return -ENOMEM;
  ckptio_st_index st;
  memset(&st, 0, sizeof(st));
  rc = read_header(p, hdr, (size_t)n, 8);
  if (rc == 0 && (rc = ckptio_st_parse(hdr, n, size, &st, msg, sizeof(msg))) < 0)
    ckptio_fail(s->err, rc, "%s: %s", s->path, msg);
  else if (rc == 0)
    rc = ckptio_st_to_index(&st, &s->idx);
  free(hdr);
  ckptio_st_index_free(&st);
  return rc;
}

/* A zip is a PyTorch archive (the parser refuses other zips and names what
 * it found); anything else is taken for safetensors, whose checks explain
 * what is wrong with a file that is neither. An object's archive is indexed
 * by ranged reads (load/torch_object.c); its first bytes were read at open. */
static int parse_header(plain *p) {
  const unsigned char *first = p->f.store ? p->f.head : p->f.map;
  uint64_t have = p->f.store ? p->f.nhead : p->f.size;
  if (have >= 4 && memcmp(first, "PK\x03\x04", 4) == 0) {
    unsigned flags = p->s.opts->open_flags & CKPTIO_OPEN_TORCH_RECORDS ? CKPTIO_TORCH_RECORDS : 0;
    if (p->f.store) return ckptio_torch_index_object(&p->f, p->s.ctx->pool, flags, &p->s.idx, p->s.err);
    char msg[CKPTIO_ERRLEN];
    int rc = ckptio_torch_parse_flags(p->f.map, p->f.size, flags, &p->s.idx, msg, sizeof(msg));
    return rc < 0 ? ckptio_fail(p->s.err, rc, "%s: %s", p->s.path, msg) : 0;
  }
  return parse_safetensors(p);
}

/* ------------------------------------------------------------ plan */

static int gathers(const ckptio_xreq *q) { return q->e->strided && !q->raw; }

/* Whether a request is one stretch of the file into host memory: what the
 * filler's copies take (run_contiguous). */
static int host_stretch(const ckptio_xreq *q) {
  return ckptio_xreq_host(q) && q->g.count == 1 && !gathers(q);
}

static ckptio_load_method pick_method(plain *p, const ckptio_plan *pl, ckptio_xreq **qs, size_t n, int *fill) {
  ckptio_load_method method = pl->opts->load_method; /* the call's (a group load's may differ) */
  *fill = 0;
  if (method == CKPTIO_LOAD_AUTO) {
    /* pread from a warm cache. From a cold one, when the load fits in
     * memory (io/cache.h), through the page cache too, so that it leaves
     * the file cached for the next load, a restarted process's included:
     * filled ahead by threads of the load and copied from the map behind
     * them where every request is a stretch into host memory (io/fill.h:
     * 0.9x the speed of O_DIRECT where pread was 0.6x), else pread.
     * O_DIRECT for a cold load that does not fit. pread wins beyond speed
     * where it is as fast: a file cut short under us is a read error, not
     * a SIGBUS, and GPU loads need no registration of the file's pages. */
    uint64_t *off = calloc(2 * n + 1, sizeof(uint64_t)), *len = off ? off + n : NULL, min_run = UINT64_MAX;
    int stretches = 1;
    for (size_t i = 0; i < n; i++) {
      if (!qs[i]->g.full && qs[i]->g.nbytes && qs[i]->g.run < min_run) min_run = qs[i]->g.run;
      stretches &= host_stretch(qs[i]);
      if (off) off[i] = qs[i]->e->offset, len[i] = qs[i]->e->nbytes;
    }
    if (!off || min_run < DIRECT_MIN_RUN || ckptio_rfile_mostly_cached(&p->f, off, len, n)) method = CKPTIO_LOAD_PREAD;
    else if (!ckptio_cache_fits(pl->load_bytes)) method = CKPTIO_LOAD_DIRECT; /* reads /proc: a cold file only */
    else if (stretches && p->f.map && !p->f.store) method = CKPTIO_LOAD_MMAP, *fill = 1;
    else method = CKPTIO_LOAD_PREAD;
    free(off);
  }
  if (method == CKPTIO_LOAD_DIRECT && ckptio_rfile_direct(&p->f) < 0) method = CKPTIO_LOAD_PREAD;
  if (method == CKPTIO_LOAD_MMAP && !p->f.map) method = CKPTIO_LOAD_PREAD;
  return method;
}

/* Whether O_DIRECT reads of a request land in its host destination itself,
 * with no slot and no copy: a contiguous stretch of the file into
 * contiguous host memory that agrees with it in the alignment O_DIRECT
 * needs (a page-aligned buffer and a tensor on a page, as ckptio's writer
 * places every tensor of whole pages). Anything else goes through a slot. */
static int reads_in_place(const plain *p, const ckptio_xreq *q, ckptio_load_method method) {
  const unsigned char *h = ckptio_xreq_host(q);
  return method == CKPTIO_LOAD_DIRECT && h && q->g.count == 1 && !gathers(q) && q->g.nbytes >= IN_PLACE_MIN &&
         ckptio_rfile_in_place_ok(&p->f, h, q->e->offset + q->g.src0);
}

/* Output bytes one job moves: a slot, less room for the page edges where
 * the slot takes O_DIRECT reads (half of it when the other half assembles
 * a slice's runs for a GPU); a multiple of the page, so of any element. */
static uint64_t job_cap(const ckptio_xreq *q, ckptio_load_method method, uint64_t slot) {
  if (gathers(q) || method != CKPTIO_LOAD_DIRECT) return slot;
  return (q->gpu >= 0 && q->g.count > 1 ? PAGE_DOWN(slot / 2) : slot) - 2 * CKPTIO_IO_ALIGN;
}

/* The jobs of one request, as many as its bytes need at `cap` a job. */
static int plan_one(plain *p, ckptio_plan *pl, ckptio_xreq *q, ckptio_load_method method, uint64_t slot) {
  int in_place = reads_in_place(p, q, method);
  uint64_t cap = in_place ? slot : job_cap(q, method, slot);
  for (uint64_t off = 0; off < q->g.nbytes; off += cap) {
    ckptio_job *j = ckptio_plan_job(pl, &p->s, 1);
    if (!j) return -ENOMEM;
    j->method = method;
    /* A GPU job holds a slot even when mapped: its event tracks the copy. */
    /* A scattered box always: its bytes are assembled there first. */
    j->need_slot = q->gpu >= 0 || q->dpitch || (!q->dst && method != CKPTIO_LOAD_MMAP) ||
                   (method == CKPTIO_LOAD_DIRECT && !gathers(q) && !in_place);
    pl->parts[j->first] = (ckptio_part){q, off, q->g.nbytes - off < cap ? q->g.nbytes - off : cap, 0};
  }
  return 0;
}

/* Where a contiguous request's bytes start in the file. */
static uint64_t req_start(const ckptio_xreq *q) { return q->e->offset + q->g.src0; }

/* Where a part of a contiguous request starts in the file. */
static uint64_t part_start(const ckptio_part *t) { return req_start(t->q) + t->off; }

/* The last grid cell a job of an object starting at piece i may reach: the
 * end of its cell's pair (HOST_CELLS cells, aligned to the pair) when every
 * piece from i to there goes to host memory, else its own cell. */
static uint64_t job_reach(const ckptio_part *pc, size_t np, size_t i, uint64_t slot) {
  uint64_t cell = part_start(&pc[i]) / slot, last = (cell / HOST_CELLS + 1) * HOST_CELLS - 1;
  for (size_t k = i; k < np && part_start(&pc[k]) / slot <= last; k++)
    if (!ckptio_xreq_host(pc[k].q)) return cell;
  return last;
}

static int by_start(const void *a, const void *b) {
  uint64_t x = req_start(*(ckptio_xreq *const *)a), y = req_start(*(ckptio_xreq *const *)b);
  return x < y ? -1 : x > y;
}

/* An object's requests. Every read is a request to the server (an HTTP
 * GET), and a server reads a multipart object a part at a time, so a GET
 * across a part boundary reads two parts (S3's guidance: GETs aligned to
 * the parts). SeaweedFS served 8 MiB GETs shifted 3 MiB off its 8 MiB
 * chunks 1.3-1.6x slower, with 1.3x its CPU (bench/RESULTS_S3.md). So the
 * contiguous requests are read by the cells of a grid of slot-sized
 * stretches of the object (8 MiB: the part size of ckptio's saves and of
 * boto3's; parts of any multiple of it hold whole cells): one GET per cell,
 * or per pair of cells where all goes to host memory (HOST_CELLS), for
 * what every request wants there, the bytes between read and dropped (a
 * gap over COALESCE_GAP, or requests that overlap, start another GET).
 * The GET lands straight in the parts' host destinations; a job with a
 * part for a GPU or with no destination reads into its slot and delivers
 * from there. Slices of many runs and gathered views are planned as a
 * file's (their runs share GETs too: object_runs). */
static int plan_object(plain *p, ckptio_plan *pl, ckptio_xreq **qs, size_t n, uint64_t slot) {
  ckptio_xreq **c = malloc((n + 1) * sizeof(*c));
  size_t m = 0, np = 0, cap = 0;
  ckptio_part *pc = NULL;
  int rc = 0;
  if (!c) return -ENOMEM;
  for (size_t i = 0; i < n && rc == 0; i++) {
    ckptio_xreq *q = qs[i];
    if (q->g.count == 1 && !gathers(q) && q->g.nbytes) c[m++] = q;
    else rc = plan_one(p, pl, q, CKPTIO_LOAD_PREAD, slot);
  }
  qsort(c, m, sizeof(*c), by_start);
  /* Every request cut where it crosses a grid line. */
  for (size_t i = 0; i < m && rc == 0; i++) {
    for (uint64_t off = 0, len; off < c[i]->g.nbytes && rc == 0; off += len) {
      uint64_t at = req_start(c[i]) + off, line = (at / slot + 1) * slot;
      len = c[i]->g.nbytes - off < line - at ? c[i]->g.nbytes - off : line - at;
      if (np == cap) {
        ckptio_part *grown = realloc(pc, (cap = cap ? 2 * cap : 64) * sizeof(*pc));
        if (!grown) rc = -ENOMEM;
        else pc = grown;
      }
      if (rc == 0) pc[np++] = (ckptio_part){c[i], off, len, 0};
    }
  }
  /* A job: the pieces that follow each other in one cell (in its pair of
   * cells where every piece there goes to host memory). */
  for (size_t i = 0, k; i < np && rc == 0; i = k) {
    uint64_t reach = job_reach(pc, np, i, slot), end = part_start(&pc[i]) + pc[i].len;
    int slotted = !ckptio_xreq_host(pc[i].q);
    for (k = i + 1; k < np; k++) {
      uint64_t at = part_start(&pc[k]);
      if (at / slot > reach || at < end || at - end > COALESCE_GAP) break;
      end = at + pc[k].len;
      slotted |= !ckptio_xreq_host(pc[k].q);
    }
    ckptio_job *j = ckptio_plan_job(pl, &p->s, k - i);
    if (!j) {
      rc = -ENOMEM;
      break;
    }
    j->method = CKPTIO_LOAD_PREAD;
    j->need_slot = slotted;
    memcpy(&pl->parts[j->first], &pc[i], (k - i) * sizeof(*pc));
  }
  free(pc);
  free(c);
  return rc;
}

static int plain_plan(ckptio_source *s, ckptio_plan *pl, ckptio_xreq **qs, size_t n) {
  plain *p = P(s);
  int fill;
  ckptio_load_method method = pick_method(p, pl, qs, n, &fill);
  uint64_t slot = ckptio_source_slot_bytes(s);
  if (fill || p->fill_private) {
    uint64_t *off = calloc(2 * n + 1, sizeof(uint64_t)), *len = off ? off + n : NULL;
    for (size_t i = 0; off && i < n; i++) off[i] = req_start(qs[i]), len[i] = qs[i]->g.nbytes;
    p->fill = off ? ckptio_fill_start(&p->f, off, len, n, fill) : NULL;
    free(off);
    if (fill && !p->fill) method = CKPTIO_LOAD_PREAD; /* as AUTO read a cold file without it */
  }
  if (p->f.store && method == CKPTIO_LOAD_PREAD) return plan_object(p, pl, qs, n, slot);
  int gpu = 0;
  for (size_t i = 0; i < n; i++) gpu |= qs[i]->gpu >= 0;
  if (gpu && method == CKPTIO_LOAD_MMAP && !p->registered) {
    /* GPU copies read the file's pages directly: pin the whole mapping. */
    char msg[CKPTIO_ERRLEN];
    int rc = ckptio_gpu_register(s->ctx->gpu, p->f.map, (size_t)PAGE_UP(p->f.size), 1, msg, sizeof(msg));
    if (rc < 0) return ckptio_fail(s->err, rc, "%s: %s of the file mapping", s->path, msg);
    p->registered = 1;
  }
  for (size_t i = 0; i < n; i++) {
    int rc = plan_one(p, pl, qs[i], method, slot);
    if (rc < 0) return rc;
  }
  return 0;
}

static void plain_finish(ckptio_source *s) {
  plain *p = P(s);
  ckptio_fill_stop(p->fill);
  p->fill = NULL;
  if (p->registered) ckptio_gpu_unregister(s->ctx->gpu, p->f.map);
  p->registered = 0;
}

/* ------------------------------------------------------------ run */

/* An object's view: its runs (storage bytes, in logical order) copied out
 * of a window of the storage record read ahead, a window being one read of
 * up to a slot from the first run it lacks; a run longer than the window is
 * read straight to its place. */
typedef struct gather_win {
  plain *p;
  const ckptio_entry *e;
  unsigned char *out, *win;
  uint64_t cap, at, have;   /* the window holds record bytes [at, at + have) */
  char *msg;
  size_t mlen;
  int rc;
} gather_win;

static void gather_run(void *arg, uint64_t off, uint64_t len) {
  gather_win *g = arg;
  if (g->rc < 0) return;
  if (len > g->cap) {
    g->rc = ckptio_rfile_pread(&g->p->f, g->out, (size_t)len, g->e->offset + off, g->msg, g->mlen);
  } else {
    if (off < g->at || off + len > g->at + g->have) {
      g->at = off;
      g->have = g->e->nbytes - off < g->cap ? g->e->nbytes - off : g->cap;
      g->rc = ckptio_rfile_pread(&g->p->f, g->win, (size_t)g->have, g->e->offset + off, g->msg, g->mlen);
      if (g->rc < 0) return;
    }
    memcpy(g->out, g->win + (off - g->at), (size_t)len);
  }
  g->out += len;
}

static int gather_object(plain *p, ckptio_run *x, ckptio_part *t, unsigned char *out) {
  const ckptio_xreq *q = t->q;
  uint64_t es = ckptio_entry_elem(q->e), end = t->off + t->len, src, nb;
  gather_win g = {p, q->e, out, NULL, ckptio_run_slot_bytes(x), 0, 0, NULL, 0, 0};
  if (!(g.win = malloc((size_t)g.cap))) return -ENOMEM;
  g.msg = ckptio_run_msg(x, &g.mlen);
  for (uint64_t o = t->off; o < end && g.rc == 0; o += nb) {
    ckptio_geom_subrun(&q->g, o, end, &src, &nb);
    ckptio_view_runs(q->e, src / es, nb / es, gather_run, &g);
  }
  free(g.win);
  return g.rc;
}

/* A view's logical bytes of the part, gathered from its storage. */
static int run_gather(plain *p, ckptio_run *x, ckptio_part *t, unsigned char *out) {
  const ckptio_xreq *q = t->q;
  uint64_t es = ckptio_entry_elem(q->e), end = t->off + t->len, src, nb;
  int rc = p->f.store ? gather_object(p, x, t, out) : 0;
  if (rc < 0) return rc;
  for (uint64_t o = t->off; o < end && !p->f.store; o += nb) {
    ckptio_geom_subrun(&q->g, o, end, &src, &nb);
    ckptio_view_gather(out + (o - t->off), p->f.map + q->e->offset, q->e, src / es, nb / es);
  }
  atomic_fetch_add((_Atomic uint64_t *)&t->q->read, t->len);
  return ckptio_run_deliver(x, 0, out, 1);
}

/* One contiguous stretch of the file [abs, abs + len): what whole tensors
 * and checks read. Brings it to the host destination if there is one, else
 * into the slot (or, mapped, leaves it in the map), continuing the CRC. */
static int run_contiguous(plain *p, ckptio_run *x, ckptio_part *t, unsigned char *host, uint64_t abs) {
  ckptio_job *j = ckptio_run_job(x);
  uint32_t *crc = t->q->check ? &t->crc : NULL;
  const unsigned char *bytes;
  int writable = 1, rc;
  atomic_fetch_add((_Atomic uint64_t *)&t->q->read, t->len);
  if (j->method == CKPTIO_LOAD_MMAP && host) {
    /* A step at a time: map, copy with the CRC, drop, so what is mapped at
     * once is a few steps per worker, not a piece (behind a filler, what
     * it has read ahead). */
    if (p->fill) ckptio_fill_wait(p->fill, abs + t->len);
    for (uint64_t o = 0; o < t->len; o += CKPTIO_CRC_STEP) {
      size_t n = (size_t)(t->len - o < CKPTIO_CRC_STEP ? t->len - o : CKPTIO_CRC_STEP);
      if ((rc = ckptio_rfile_populate(p->f.map + abs + o, n)) < 0) return rc;
      ckptio_copy_crc(host + o, p->f.map + abs + o, n, crc);
      ckptio_rfile_drop(p->f.map + abs + o, n);
    }
    bytes = host;
  } else if (j->method == CKPTIO_LOAD_MMAP) {
    bytes = p->f.map + abs;
    writable = 0;
    if (p->fill) ckptio_fill_wait(p->fill, abs + t->len);
    if ((rc = ckptio_rfile_populate(bytes, t->len)) < 0) return rc;
    if (crc) *crc = ckptio_crc32(0, bytes, (size_t)t->len);
  } else if (j->method == CKPTIO_LOAD_DIRECT && host && !j->slot) { /* planned in place */
    if ((rc = ckptio_rfile_read_in_place(&p->f, host, abs, t->len)) < 0) return rc;
    ckptio_run_direct(x, t->len);
    bytes = host;
    if (crc) *crc = ckptio_crc32(0, bytes, (size_t)t->len);
  } else if (j->method == CKPTIO_LOAD_DIRECT) {
    int64_t at = ckptio_rfile_read_direct(&p->f, j->slot, abs, t->len);
    if (at < 0) return (int)at;
    bytes = j->slot + at;
    if (crc) *crc = ckptio_crc32(0, bytes, (size_t)t->len);
  } else {
    unsigned char *to = host ? host : j->slot;
    /* A file is read a CRC step at a time, checked while in cache; an
     * object in one read, as each read is a request (an HTTP GET: 256 KiB
     * steps sent 32x the requests and ran 2-3x slower, bench/RESULTS_S3.md). */
    uint64_t step = p->f.store ? t->len : CKPTIO_CRC_STEP;
    for (uint64_t o = 0; o < t->len; o += step) {
      size_t n = (size_t)(t->len - o < step ? t->len - o : step);
      size_t len;
      char *msg = ckptio_run_msg(x, &len);
      if ((rc = ckptio_rfile_pread(&p->f, to + o, n, abs + o, msg, len)) < 0) return rc;
      if (crc) *crc = ckptio_crc32(*crc, to + o, n);
    }
    bytes = to;
  }
  return ckptio_run_deliver(x, 0, bytes, writable);
}

/* O_DIRECT reads of a slice's runs: runs whose pages touch or overlap are
 * read by one request (a shared page once); a page-sized gap, or a full
 * bounce buffer, starts a new one. */
static int direct_runs(plain *p, ckptio_run *x, ckptio_part *t, unsigned char *out, unsigned char *bounce,
                       uint64_t cap) {
  const ckptio_xreq *q = t->q;
  uint64_t end = t->off + t->len, gx0 = t->off, ga = 0, ge = 0, last = 0, src, nb, o;
  for (o = t->off; o <= end; o += nb) {
    uint64_t abs = 0, a = 0, b = 0;
    nb = 0;
    if (o < end) {
      ckptio_geom_subrun(&q->g, o, end, &src, &nb);
      abs = q->e->offset + src, a = PAGE_DOWN(abs), b = PAGE_UP(abs + nb);
    }
    if (o > gx0 && (o == end || a > ge || b - ga > cap)) { /* flush [gx0, o) */
      int rc = ckptio_pread_min(p->f.fd_direct, bounce, (size_t)(ge - ga), ga, (size_t)(last - ga));
      if (rc < 0) return rc;
      atomic_fetch_add((_Atomic uint64_t *)&t->q->read, ge - ga);
      uint64_t s2, n2;
      for (uint64_t y = gx0; y < o; y += n2) {
        ckptio_geom_subrun(&q->g, y, o, &s2, &n2);
        memcpy(out + (y - t->off), bounce + (q->e->offset + s2 - ga), (size_t)n2);
      }
      gx0 = o;
    }
    if (o == end) break;
    if (o == gx0) ga = a, ge = b;
    else if (b > ge) ge = b;
    last = abs + nb;
  }
  (void)x;
  return 0;
}

/* Object bytes [off, off + the spans' lengths) into the spans: from the
 * bytes its open read when they hold them all, else by its storage (the
 * built-in S3 one with one GET). */
static int read_spans(plain *p, const ckptio_scatter *spans, size_t n, uint64_t off, char *msg, size_t len) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += spans[i].len;
  if (off + total > p->f.nhead)
    return ckptio_storage_read_spans(p->f.store, p->f.store_self, p->f.obj, spans, n, off, msg, len);
  for (size_t i = 0; i < n; off += spans[i++].len) {
    int rc = spans[i].dst ? ckptio_rfile_pread(&p->f, spans[i].dst, spans[i].len, off, msg, len) : 0;
    if (rc < 0) return rc;
  }
  return 0;
}

/* An object's runs of a slice into out: runs at most COALESCE_GAP apart
 * read by one GET (the bytes between dropped), up to a slot of the object
 * a GET, each run's bytes going straight to its place. A GET per run was a
 * request per row of a column slice. */
static int object_runs(plain *p, ckptio_run *x, ckptio_part *t, unsigned char *out) {
  const ckptio_xreq *q = t->q;
  uint64_t end = t->off + t->len, slot = ckptio_run_slot_bytes(x), src, nb, start = 0, at = 0, got = 0;
  /* A gap and a run each, for every run (whole or cut) of the part. */
  size_t max = 2 * (size_t)(t->len / (q->g.run ? q->g.run : 1) + 2), ns = 0, len;
  ckptio_scatter *spans = malloc(max * sizeof(*spans));
  char *msg = ckptio_run_msg(x, &len);
  int rc = 0;
  if (!spans) return -ENOMEM;
  for (uint64_t o = t->off; o < end && rc == 0; o += nb) {
    ckptio_geom_subrun(&q->g, o, end, &src, &nb);
    uint64_t abs = q->e->offset + src;
    if (ns && (abs < at || abs - at > COALESCE_GAP || abs + nb - start > slot)) {
      rc = read_spans(p, spans, ns, start, msg, len);
      got += at - start;
      ns = 0;
    }
    if (!ns) start = at = abs;
    if (abs > at) spans[ns++] = (ckptio_scatter){NULL, (size_t)(abs - at)};
    spans[ns++] = (ckptio_scatter){out + (o - t->off), (size_t)nb};
    at = abs + nb;
  }
  if (rc == 0 && ns) rc = read_spans(p, spans, ns, start, msg, len);
  free(spans);
  if (rc < 0) return rc;
  atomic_fetch_add((_Atomic uint64_t *)&t->q->read, got + (at - start));
  return ckptio_run_deliver(x, 0, out, 1);
}

/* A slice's runs, assembled in out (the host destination or the slot). */
static int run_runs(plain *p, ckptio_run *x, ckptio_part *t, unsigned char *out) {
  ckptio_job *j = ckptio_run_job(x);
  const ckptio_xreq *q = t->q;
  uint64_t end = t->off + t->len, src, nb;
  int rc;
  if (p->f.store) return object_runs(p, x, t, out);
  if (j->method == CKPTIO_LOAD_DIRECT) {
    uint64_t slot = ckptio_run_slot_bytes(x), half = q->gpu >= 0 ? PAGE_DOWN(slot / 2) : 0;
    if ((rc = direct_runs(p, x, t, out, j->slot + half, slot - half)) < 0) return rc;
    return ckptio_run_deliver(x, 0, out, 1);
  }
  if (j->method == CKPTIO_LOAD_PREAD && q->g.run < DIRECT_MIN_RUN) {
    /* Many small runs: one blocking pread after another keeps one request
     * in flight per worker, 3x slower from a cold file than reading the
     * whole tensor (bench/RESULTS_SLICE.md). Asking for all of the job's
     * runs first puts them in flight together. Best effort. */
    for (uint64_t o = t->off; o < end; o += nb) {
      ckptio_geom_subrun(&q->g, o, end, &src, &nb);
      posix_fadvise(p->f.fd, (off_t)(q->e->offset + src), (off_t)nb, POSIX_FADV_WILLNEED);
    }
  }
  for (uint64_t o = t->off; o < end; o += nb) {
    ckptio_geom_subrun(&q->g, o, end, &src, &nb);
    uint64_t abs = q->e->offset + src;
    if (j->method == CKPTIO_LOAD_MMAP) {
      int big = nb >= MAP_POPULATE_MIN;
      if (big && (rc = ckptio_rfile_populate(p->f.map + abs, nb)) < 0) return rc;
      memcpy(out + (o - t->off), p->f.map + abs, (size_t)nb);
      if (big) ckptio_rfile_drop(p->f.map + abs, nb);
    } else {
      size_t len;
      char *msg = ckptio_run_msg(x, &len);
      if ((rc = ckptio_rfile_pread(&p->f, out + (o - t->off), (size_t)nb, abs, msg, len)) < 0) return rc;
    }
    atomic_fetch_add((_Atomic uint64_t *)&t->q->read, nb);
  }
  return ckptio_run_deliver(x, 0, out, 1);
}

/* The parts of one cell of an object (plan_object), read by one request:
 * straight into their host destinations (the bytes between dropped), or
 * into the slot and each part delivered from there (copied with the CRC
 * when it goes to host memory); each part's CRC over its bytes. */
static int run_cell(plain *p, ckptio_run *x) {
  ckptio_job *j = ckptio_run_job(x);
  const ckptio_part *first = ckptio_run_part(x, 0), *last = ckptio_run_part(x, j->nparts - 1);
  uint64_t start = part_start(first), end = part_start(last) + last->len;
  size_t len;
  char *msg = ckptio_run_msg(x, &len);
  int rc;
  if (j->slot) {
    rc = ckptio_rfile_pread(&p->f, j->slot, (size_t)(end - start), start, msg, len);
  } else {
    ckptio_scatter *spans = malloc(2 * j->nparts * sizeof(*spans));
    size_t ns = 0;
    if (!spans) return -ENOMEM;
    uint64_t at = start;
    for (size_t k = 0; k < j->nparts; k++) {
      const ckptio_part *t = ckptio_run_part(x, k);
      uint64_t from = part_start(t);
      if (from > at) spans[ns++] = (ckptio_scatter){NULL, (size_t)(from - at)};
      spans[ns++] = (ckptio_scatter){ckptio_xreq_host(t->q) + t->off, (size_t)t->len};
      at = from + t->len;
    }
    rc = read_spans(p, spans, ns, start, msg, len);
    free(spans);
  }
  for (size_t k = 0; k < j->nparts && rc == 0; k++) {
    ckptio_part *t = ckptio_run_part(x, k);
    unsigned char *host = ckptio_xreq_host(t->q) ? ckptio_xreq_host(t->q) + t->off : NULL;
    const unsigned char *bytes = j->slot ? j->slot + (part_start(t) - start) : host;
    uint32_t *crc = t->q->check ? &t->crc : NULL;
    atomic_fetch_add((_Atomic uint64_t *)&t->q->read, t->len);
    if (host && bytes != host) {
      ckptio_copy_crc(host, bytes, (size_t)t->len, crc);
      bytes = host;
    } else if (crc) {
      *crc = ckptio_crc32(0, bytes, (size_t)t->len);
    }
    rc = ckptio_run_deliver(x, k, bytes, 1);
  }
  return rc;
}

static int plain_run(ckptio_source *s, ckptio_run *x) {
  plain *p = P(s);
  if (ckptio_run_job(x)->nparts > 1) return run_cell(p, x);
  ckptio_part *t = ckptio_run_part(x, 0);
  const ckptio_xreq *q = t->q;
  unsigned char *host = ckptio_xreq_host(q) ? ckptio_xreq_host(q) + t->off : NULL;
  unsigned char *out = host ? host : ckptio_run_job(x)->slot;
  if (gathers(q)) return run_gather(p, x, t, out);
  if (q->g.count == 1) return run_contiguous(p, x, t, host, q->e->offset + q->g.src0 + t->off);
  return run_runs(p, x, t, out);
}

/* ------------------------------------------------------------ the rest */

static int plain_view(ckptio_source *s, size_t index, const void **data, uint64_t *nbytes) {
  const ckptio_entry *e = &s->idx.entries[index];
  if (e->strided || e->byteswap)
    return ckptio_fail(s->err, CKPTIO_E_FORMAT, "%s: tensor '%s' is %s in the file: load it instead of viewing it",
                       s->path, e->name, e->strided ? "a strided view" : "big-endian");
  if (P(s)->f.store)
    return ckptio_fail(s->err, CKPTIO_E_FORMAT, "%s: an object in a storage has no view of its bytes: load them",
                       s->path);
  *data = P(s)->f.map ? P(s)->f.map + e->offset : NULL;
  if (nbytes) *nbytes = e->nbytes;
  return 0;
}

typedef struct view_emit {
  void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len);
  void *arg;
  uint64_t base;
} view_emit;

static void emit_view_run(void *arg, uint64_t off, uint64_t len) {
  view_emit *v = arg;
  v->emit(v->arg, 0, v->base + off, len);
}

static void plain_ranges(ckptio_source *s, size_t index, const ckptio_geom *g,
                         void (*emit)(void *arg, uint32_t file, uint64_t off, uint64_t len), void *arg) {
  const ckptio_entry *e = &s->idx.entries[index];
  uint64_t es = ckptio_entry_elem(e);
  view_emit v = {emit, arg, e->offset};
  for (uint64_t k = 0; k < g->count; k++) {
    uint64_t src = g->src0 + k * g->pitch;
    if (e->strided) ckptio_view_runs(e, src / es, g->run / es, emit_view_run, &v);
    else emit(arg, 0, e->offset + src, g->run);
  }
}

static double plain_resident(ckptio_source *s) {
  plain *p = P(s);
  size_t n = s->idx.count;
  uint64_t *off = calloc(2 * n + 1, sizeof(uint64_t)), *len = off ? off + n : NULL;
  if (!off) return 0;
  for (size_t i = 0; i < n; i++) off[i] = s->idx.entries[i].offset, len[i] = s->idx.entries[i].nbytes;
  double share = ckptio_rfile_resident(&p->f, off, len, n);
  free(off);
  return share;
}

/* Checks every recorded CRC over the private map instead of the shared one:
 * MMAP is forced so each page is read (and faulted in) where the caller will
 * read it, and what is checked is what the caller gets. */
static int plain_map_private(ckptio_source *s, const ckptio_exec_out *out, void **base, uint64_t *size) {
  plain *p = P(s);
  if (!p->f.size) return 0;
  if ((uint64_t)(size_t)p->f.size != p->f.size)
    return ckptio_fail(s->err, CKPTIO_E_OVERFLOW, "%s: %llu bytes cannot be mapped in this address space", s->path,
                       (unsigned long long)p->f.size);
  void *m;
  int rc = ckptio_rfile_map_private(&p->f, &m, s->err, CKPTIO_ERRLEN);
  if (rc < 0) return rc;
  if (s->opts->crc) {
    ckptio_xreq *qs = calloc(s->idx.count + 1, sizeof(*qs));
    size_t n = 0;
    if (!qs) rc = -ENOMEM;
    for (size_t i = 0; qs && i < s->idx.count; i++) {
      const ckptio_entry *e = &s->idx.entries[i];
      if (e->has_crc)
        qs[n++] = (ckptio_xreq){.src = s, .e = e, .gpu = -1, .raw = 1, .check = 1,
                                .g = {0, e->nbytes, e->nbytes, e->nbytes ? 1 : 0, e->nbytes, 1}};
    }
    ckptio_options o = *s->opts;
    int cold = plain_resident(s) < 0.5;
    const unsigned char *own = p->f.map;
    o.load_method = CKPTIO_LOAD_MMAP;
    const ckptio_options *keep = s->opts;
    s->opts = &o;
    p->f.map = m;
    /* A cold file is read in by the filler (io/fill.h) as AUTO reads it;
     * the checks populate the pages the caller gets behind it. */
    p->fill_private = cold;
    if (qs) rc = ckptio_exec(s->ctx, &o, qs, n, out);
    p->fill_private = 0;
    p->f.map = own;
    s->opts = keep;
    free(qs);
  }
  if (rc < 0) {
    ckptio_rfile_unmap(m, p->f.size);
    return rc;
  }
  *base = m;
  *size = p->f.size;
  return 0;
}

static void plain_close(ckptio_source *s) {
  ckptio_rfile_close(&P(s)->f);
  ckptio_index_free(&s->idx);
}

static const ckptio_source_ops plain_ops = {
    .noun = "file",
    .plan = plain_plan,
    .run = plain_run,
    .finish = plain_finish,
    .view = plain_view,
    .ranges = plain_ranges,
    .member = ckptio_source_member_self,
    .file = ckptio_source_file_self,
    .map_private = plain_map_private,
    .resident = plain_resident,
    .close = plain_close,
};

int ckptio_plain_from(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_rfile *f, char *err, ckptio_source **out) {
  plain *p = calloc(1, sizeof(*p));
  int rc = -ENOMEM;
  if (!p) {
    ckptio_rfile_close(f);
    return rc;
  }
  p->f = *f;
  if ((rc = ckptio_source_init(&p->s, &plain_ops, ctx, opts, f->path, err)) < 0 || (rc = parse_header(p)) < 0) {
    ckptio_source_close(&p->s);
    return rc;
  }
  *out = &p->s;
  return 0;
}

int ckptio_plain_with_index(ckptio_ctx *ctx, const ckptio_options *opts, ckptio_rfile *f, ckptio_index *idx, char *err,
                            ckptio_source **out) {
  plain *p = calloc(1, sizeof(*p));
  int rc = -ENOMEM;
  if (!p) {
    ckptio_rfile_close(f);
    ckptio_index_free(idx);
    return rc;
  }
  p->f = *f;
  p->s.idx = *idx;
  memset(idx, 0, sizeof(*idx));
  if ((rc = ckptio_source_init(&p->s, &plain_ops, ctx, opts, f->path, err)) < 0) {
    ckptio_source_close(&p->s);
    return rc;
  }
  *out = &p->s;
  return 0;
}
