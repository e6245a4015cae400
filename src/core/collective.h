/* The two steps every collective of the library takes over a caller's
 * ckptio_comm: gather byte strings of any length from every rank, and
 * agree on whether every rank succeeded (naming the first that did not).
 * The multi-rank save's agreement and the group load both use them. */
#ifndef CKPTIO_CORE_COLLECTIVE_H
#define CKPTIO_CORE_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "ckptio.h"

/* Collective. Every rank's `len` bytes at `mine`: an all-gather of the
 * lengths, then of the strings padded to the longest. Rank r's bytes are
 * (*all) + r * *stride, (*lens)[r] of them (both malloc'd, the caller's to
 * free, also on failure). @return 0, -ENOMEM, or the communicator's code
 * with err (CKPTIO_ERRLEN) naming this rank. */
int ckptio_comm_gather(const ckptio_comm *c, const void *mine, uint64_t len, unsigned char **all, uint64_t **lens,
                       uint64_t *stride, char *err);

/* Collective. Every rank tells the others its status rc (and, failing, the
 * message msg). @return 0 when every rank succeeded; else this rank's rc
 * when it failed, or CKPTIO_E_RANK with err naming the lowest failed rank
 * and its reason ("what" says which step). */
int ckptio_comm_status_exchange(const ckptio_comm *comm, int rc, const char *msg, const char *what, char *err);

/* Collective. Rank `root`'s status reaches every rank, as above. */
int ckptio_comm_status_broadcast(const ckptio_comm *comm, int root, int rc, const char *msg, const char *what,
                                 char *err);

#endif
