/* The fields of ckptio_options that take a fixed set of values, checked in
 * one place wherever options come in: the context, every writer and reader
 * (per call), the manager (at open, not at its first save). */
#ifndef CKPTIO_CORE_OPTIONS_H
#define CKPTIO_CORE_OPTIONS_H

#include <stddef.h>

#include "ckptio.h"

/* 0, or CKPTIO_E_INVALID_ARG with err (if not NULL) naming the field and
 * its allowed values. */
int ckptio_options_check(const ckptio_options *o, char *err, size_t errlen);

#endif
