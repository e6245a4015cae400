/* Small growth helpers the writers share: an array that doubles, and a set
 * of names (open addressing over item indices) that keeps "is this name
 * taken?" O(1) for checkpoints of many thousands of tensors. The names stay
 * the caller's: the set stores indices and asks for a name by index. */
#ifndef CKPTIO_CORE_NAMESET_H
#define CKPTIO_CORE_NAMESET_H

#include <stddef.h>

/* Grows *arr (of *cap elements of size elem) to hold len + 1. @return 0 or -ENOMEM. */
int ckptio_array_grow(void **arr, size_t *cap, size_t len, size_t elem);

typedef struct ckptio_nameset {
  size_t *slots; /* item index + 1; 0: empty */
  size_t cap;    /* a power of two, at least twice the items */
} ckptio_nameset;

/* The name of item i of `items`. */
typedef const char *(*ckptio_name_of)(const void *items, size_t i);

/* Adds `name`, about to be item `count` (items 0..count-1 are in the set).
 * @return 1 if new, 0 if an item already has it, -ENOMEM. */
int ckptio_nameset_insert(ckptio_nameset *s, const char *name, size_t count, ckptio_name_of name_of,
                          const void *items);
void ckptio_nameset_free(ckptio_nameset *s);

#endif
