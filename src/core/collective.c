/* Gathers and status agreements over a caller's communicator
 * (collective.h). */
#include "core/collective.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int comm_failed(const ckptio_comm *c, int rc, const char *what, const char *call, char *err) {
  return ckptio_err_fmt(err, CKPTIO_ERRLEN, rc, "%s%srank %d: the communicator's %s failed: %s", what ? what : "",
                        what ? ": " : "", c->rank, call, ckptio_strerror(rc));
}

int ckptio_comm_gather(const ckptio_comm *c, const void *mine, uint64_t len, unsigned char **all, uint64_t **lens,
                       uint64_t *stride, char *err) {
  size_t n = (size_t)c->nranks;
  uint64_t max = 0;
  *all = NULL;
  *lens = calloc(n, sizeof(uint64_t));
  if (!*lens) return -ENOMEM;
  int rc = c->allgather(c->user, &len, *lens, sizeof(len));
  if (rc < 0) return comm_failed(c, rc, NULL, "all-gather", err);
  for (size_t r = 0; r < n; r++) max = (*lens)[r] > max ? (*lens)[r] : max;
  unsigned char *send = calloc(1, (size_t)max + 1);
  *all = calloc(n, (size_t)max + 1);
  if (!send || !*all) {
    free(send);
    return -ENOMEM;
  }
  if (len) memcpy(send, mine, len);
  rc = c->allgather(c->user, send, *all, (size_t)max);
  free(send);
  *stride = max;
  return rc < 0 ? comm_failed(c, rc, NULL, "all-gather", err) : 0;
}

typedef struct status {
  int32_t rc;
  char msg[CKPTIO_ERRLEN];
} status;

static int verdict(const ckptio_comm *comm, const status *all, size_t n, int rc, const char *what, char *err) {
  for (size_t r = 0; r < n; r++)
    if (all[r].rc < 0) {
      if (rc < 0) return rc; /* this rank failed too: its own code and message stand */
      return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK, "%s: rank %zu of %d failed: %.*s", what, r,
                            comm->nranks, CKPTIO_ERRLEN - 64, all[r].msg);
    }
  return 0;
}

int ckptio_comm_status_exchange(const ckptio_comm *comm, int rc, const char *msg, const char *what, char *err) {
  status mine = {.rc = rc < 0 ? rc : 0};
  snprintf(mine.msg, sizeof(mine.msg), "%s", rc < 0 && msg ? msg : "");
  status *all = calloc((size_t)comm->nranks, sizeof(status));
  if (!all) return rc < 0 ? rc : -ENOMEM;
  int crc = comm->allgather(comm->user, &mine, all, sizeof(status));
  int out = crc < 0 ? comm_failed(comm, crc, what, "all-gather", err)
                    : verdict(comm, all, (size_t)comm->nranks, rc, what, err);
  free(all);
  return out;
}

int ckptio_comm_status_broadcast(const ckptio_comm *comm, int root, int rc, const char *msg, const char *what,
                                 char *err) {
  status s = {.rc = rc < 0 ? rc : 0};
  snprintf(s.msg, sizeof(s.msg), "%s", rc < 0 && msg ? msg : "");
  int crc = comm->broadcast(comm->user, &s, sizeof(s), root);
  if (crc < 0) return comm_failed(comm, crc, what, "broadcast", err);
  if (comm->rank == root || s.rc >= 0) return comm->rank == root ? (rc < 0 ? rc : 0) : 0;
  return ckptio_err_fmt(err, CKPTIO_ERRLEN, CKPTIO_E_RANK, "%s: rank %d of %d failed: %.*s", what, root, comm->nranks,
                        CKPTIO_ERRLEN - 64, s.msg);
}
