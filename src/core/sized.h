/* The one rule for the public structs whose first field is `size_t size`
 * (ckptio_options, ckptio_stats, ckptio_comm, ckptio_manager_options,
 * ckptio_checkpoint_info, ckptio_device_info), stated at "Versioned
 * structs" in include/ckptio.h: every call that takes one goes through
 * these three. */
#ifndef CKPTIO_CORE_SIZED_H
#define CKPTIO_CORE_SIZED_H

#include <stddef.h>

/* How far past this library's struct a caller's size may reach: a newer
 * header's fields. Beyond it the size is taken for garbage (a struct not
 * started from its _INIT macro) and the tail is not read. */
#define CKPTIO_SIZED_MAX_EXTRA 1024

/* Checks the caller's struct at p (whose first field is its size) against
 * this library's `known` = sizeof(the struct): the size must hold the size
 * field itself and at most CKPTIO_SIZED_MAX_EXTRA more than known, and
 * every byte past known must be zero. Returns the bytes both sides know,
 * min(size, known), or CKPTIO_E_INVALID_ARG with err (if not NULL) naming
 * `what` (the struct's name) and the rule broken. */
long ckptio_sized_check(const void *p, size_t known, const char *what, char *err, size_t errlen);

/* An input struct: out holds the defaults (the _INIT macro's values, zero
 * where the struct has none) on entry; the caller's fields replace those
 * its size covers, the others keep the defaults, and out's size becomes
 * known. NULL in leaves the defaults. Returns 0 or ckptio_sized_check's
 * error (out then keeps the defaults). */
int ckptio_sized_in(const void *in, void *out, size_t known, const char *what, char *err, size_t errlen);

/* An output struct: ours is this library's whole struct; the fields the
 * caller's struct has room for are written into out, and its size field
 * and anything past known are left as they are. Returns 0 or
 * ckptio_sized_check's error (out then untouched); NULL out is
 * CKPTIO_E_INVALID_ARG. */
int ckptio_sized_out(void *out, const void *ours, size_t known, const char *what, char *err, size_t errlen);

#endif
