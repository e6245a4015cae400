/*
 * A tiny protocol-2 pickle emitter: just the opcodes torch.save's data.pkl
 * uses, with Python's choices (int widths, TUPLE1-3, BINPUT after every
 * memoized object), so a dict of tensors pickles to the bytes torch.save
 * would write. Pure buffer code: no files, no threads.
 */
#ifndef CKPTIO_FORMATS_PICKLE_WRITE_H
#define CKPTIO_FORMATS_PICKLE_WRITE_H

#include <stddef.h>
#include <stdint.h>

/* Opcodes without arguments, for ckptio_pickle_w_op. */
#define CKPTIO_PICKLE_MARK '('
#define CKPTIO_PICKLE_STOP '.'
#define CKPTIO_PICKLE_TUPLE 't'
#define CKPTIO_PICKLE_EMPTY_TUPLE ')'
#define CKPTIO_PICKLE_EMPTY_DICT '}'
#define CKPTIO_PICKLE_REDUCE 'R'
#define CKPTIO_PICKLE_BINPERSID 'Q'
#define CKPTIO_PICKLE_NEWFALSE '\x89'
#define CKPTIO_PICKLE_NEWTRUE '\x88'
#define CKPTIO_PICKLE_SETITEM 's'
#define CKPTIO_PICKLE_SETITEMS 'u'

/* Python's pickler writes dict items in batches of this many. */
#define CKPTIO_PICKLE_BATCH 1000

/* The output buffer. Zero it (or ckptio_pickle_w_init) before use. Errors
 * are sticky: after the first failure every call returns it and writes
 * nothing, so a sequence of calls can be checked once at the end. */
typedef struct ckptio_pickle_w {
  uint8_t *data;         /* owned; ckptio_pickle_w_free releases it */
  size_t len, cap;
  uint32_t memo;         /* next memo index, as Python's len(memo) */
  int err;               /* 0, -ENOMEM or CKPTIO_E_OVERFLOW */
} ckptio_pickle_w;

void ckptio_pickle_w_init(ckptio_pickle_w *p);
void ckptio_pickle_w_free(ckptio_pickle_w *p);

/* Every call returns 0 or p->err. */

/* PROTO 2: the first opcode. */
int ckptio_pickle_w_proto(ckptio_pickle_w *p);
/* One argument-less opcode (CKPTIO_PICKLE_*). */
int ckptio_pickle_w_op(ckptio_pickle_w *p, uint8_t op);
/* BINPUT / LONG_BINPUT of the next memo index: what Python writes after
 * each object it memoizes. *idx (if not NULL) gets the index for _get. */
int ckptio_pickle_w_put(ckptio_pickle_w *p, uint32_t *idx);
/* BINGET / LONG_BINGET: a memoized object again. */
int ckptio_pickle_w_get(ckptio_pickle_w *p, uint32_t idx);
/* GLOBAL 'module\nname\n', then memoized (*idx as for _put). Module and
 * name must not contain '\n'. */
int ckptio_pickle_w_global(ckptio_pickle_w *p, const char *module, const char *name, uint32_t *idx);
/* An int as Python writes it: BININT1, BININT2, BININT or LONG1. */
int ckptio_pickle_w_int(ckptio_pickle_w *p, int64_t v);
/* BINUNICODE of len bytes of UTF-8 (the caller validates), then memoized. */
int ckptio_pickle_w_unicode(ckptio_pickle_w *p, const char *s, size_t len, uint32_t *idx);

/* A tuple of n items, as Python writes it: n == 0 is EMPTY_TUPLE (from
 * _begin; _end then writes nothing); n <= 3 is the items then TUPLE1-3;
 * larger is MARK, the items, TUPLE. Non-empty tuples are memoized. */
int ckptio_pickle_w_tuple_begin(ckptio_pickle_w *p, size_t n);
int ckptio_pickle_w_tuple_end(ckptio_pickle_w *p, size_t n);

/* Dict items, in batches as Python writes them: call _begin with the
 * number of items left (it writes MARK when this batch holds more than
 * one), write the batch's keys and values, then _end with the same count
 * (SETITEMS, or SETITEM for a batch of one). Each pair returns the batch
 * size; loop while items remain. */
size_t ckptio_pickle_w_items_begin(ckptio_pickle_w *p, size_t left);
int ckptio_pickle_w_items_end(ckptio_pickle_w *p, size_t batch);

#endif
