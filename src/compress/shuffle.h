/* The byte-shuffle filter: byte k of every element of a piece grouped
 * together (all first bytes, then all second bytes, ...), which lets zstd
 * see the slowly varying sign/exponent bytes of float weights as runs. */
#ifndef CKPTIO_COMPRESS_SHUFFLE_H
#define CKPTIO_COMPRESS_SHUFFLE_H

#include <stddef.h>
#include <stdint.h>

#define CKPTIO_FILTER_KEY "ckptio.filter"
#define CKPTIO_FILTER_SHUFFLE "shuffle"

/* The element size the filter groups by for a dtype of `bits` bits: its
 * bytes for 16 bits and up; 1 (nothing to group) below. */
static inline size_t ckptio_shuffle_elem(int bits) { return bits >= 16 ? (size_t)bits / 8 : 1; }

/* Whether the piece [a, b) of a tensor starting at tensor_off with es-byte
 * elements is shuffled: only whole elements, and only when es > 1. The
 * writer and the reader apply the same rule, so nothing else is recorded. */
static inline int ckptio_shuffle_applies(uint64_t tensor_off, uint64_t a, uint64_t b, size_t es) {
  return es > 1 && b > a && (a - tensor_off) % es == 0 && (b - a) % es == 0;
}

/* dst[k * n + i] = src[i * es + k] for the n = len / es elements. */
void ckptio_shuffle(uint8_t *dst, const uint8_t *src, size_t len, size_t es);
/* The inverse, for output elements [first, first + count) of the piece of
 * len bytes at src: writes count * es bytes at dst. */
void ckptio_unshuffle(uint8_t *dst, const uint8_t *src, size_t len, size_t es, size_t first, size_t count);

#endif
