/*
 * ckptio over MPI: a ckptio_comm (ckptio.h, "ranks") made from an MPI
 * communicator, for multi-rank saves and group loads. Header only: the library links no MPI;
 * include this in a program that does (after mpi.h is on the include path).
 *
 *   MPI_Comm world = MPI_COMM_WORLD;
 *   ckptio_comm comm;
 *   ckptio_comm_from_mpi(&world, &comm);
 *   ckptio_writer_open_ranks(ctx, &comm, dir, "model", NULL, &w);
 *
 * Licensed under the Apache License, Version 2.0.
 */
#ifndef CKPTIO_MPI_H
#define CKPTIO_MPI_H

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <mpi.h>

#include "ckptio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each collective is one MPI call on the communicator; a failure (when the
 * communicator's error handler returns instead of aborting) fails the save
 * on this rank with CKPTIO_E_RANK. At most INT_MAX bytes per rank per call
 * (MPI's count): the library's messages are a few hundred bytes per tensor. */
static inline int ckptio_mpi_allgather_(void *user, const void *send, void *recv, size_t bytes) {
  if (bytes > (size_t)INT_MAX) return CKPTIO_E_INVALID_ARG;
  return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, *(MPI_Comm *)user) == MPI_SUCCESS
             ? 0
             : CKPTIO_E_RANK;
}

static inline int ckptio_mpi_broadcast_(void *user, void *buf, size_t bytes, int root) {
  if (bytes > (size_t)INT_MAX) return CKPTIO_E_INVALID_ARG;
  return MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, *(MPI_Comm *)user) == MPI_SUCCESS ? 0 : CKPTIO_E_RANK;
}

/* MPI_Alltoallv with int counts and displacements (in this rank's buffers:
 * a group load's rounds keep them far below INT_MAX). */
static inline int ckptio_mpi_alltoallv_(void *user, const void *send, const size_t *send_counts, void *recv,
                                        const size_t *recv_counts) {
  int n = 0, rc = CKPTIO_E_RANK;
  MPI_Comm c = *(MPI_Comm *)user;
  if (MPI_Comm_size(c, &n) != MPI_SUCCESS || n < 1) return CKPTIO_E_RANK;
  int *v = (int *)malloc(4 * (size_t)n * sizeof(int));
  if (!v) return -ENOMEM;
  int *sc = v, *sd = v + n, *rcn = v + 2 * n, *rd = v + 3 * n;
  size_t so = 0, ro = 0;
  for (int r = 0; r < n; r++) {
    if (send_counts[r] > (size_t)INT_MAX || recv_counts[r] > (size_t)INT_MAX || so > (size_t)INT_MAX ||
        ro > (size_t)INT_MAX) {
      free(v);
      return CKPTIO_E_INVALID_ARG;
    }
    sc[r] = (int)send_counts[r], sd[r] = (int)so, rcn[r] = (int)recv_counts[r], rd[r] = (int)ro;
    so += send_counts[r], ro += recv_counts[r];
  }
  if (MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rcn, rd, MPI_BYTE, c) == MPI_SUCCESS) rc = 0;
  free(v);
  return rc;
}

/*! ckptio_comm_from_mpi() :
 *  Fills *out with this process's rank and the size of *comm, and collectives
 *  over it (MPI_Allgather, MPI_Bcast, MPI_Alltoallv).
 *  @comm  borrowed: the variable itself (its address is kept, whatever an
 *         MPI_Comm is in this MPI), and the communicator, must stay valid
 *         until every writer opened with *out is closed. Use a communicator
 *         that no other thread uses while ckptio's collectives run (MPI
 *         orders collectives per communicator: MPI_Comm_dup one for ckptio
 *         if the training loop runs its own collectives concurrently).
 *  @return 0, or CKPTIO_E_RANK when MPI cannot say the rank or size (MPI
 *          not initialised). */
static inline int ckptio_comm_from_mpi(MPI_Comm *comm, ckptio_comm *out) {
  int rank = 0, size = 0, init = 0;
  if (!comm || !out) return CKPTIO_E_INVALID_ARG;
  if (MPI_Initialized(&init) != MPI_SUCCESS || !init || MPI_Comm_rank(*comm, &rank) != MPI_SUCCESS ||
      MPI_Comm_size(*comm, &size) != MPI_SUCCESS)
    return CKPTIO_E_RANK;
  out->size = sizeof(ckptio_comm);
  out->rank = rank;
  out->nranks = size;
  out->user = comm;
  out->allgather = ckptio_mpi_allgather_;
  out->broadcast = ckptio_mpi_broadcast_;
  out->alltoallv = ckptio_mpi_alltoallv_;
  return 0;
}

#ifdef __cplusplus
}
#endif

#endif
