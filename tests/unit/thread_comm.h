// A communicator for tests whose ranks are threads of one process
// (ckptio_comm's allgather and broadcast over a barrier and a shared buffer).
#ifndef CKPTIO_TESTS_THREAD_COMM_H
#define CKPTIO_TESTS_THREAD_COMM_H

#include <pthread.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "ckptio.h"

namespace ckptio_test {

struct Group {
  explicit Group(int n) : n(n) { pthread_barrier_init(&bar, nullptr, (unsigned)n); }
  ~Group() { pthread_barrier_destroy(&bar); }
  int n;
  pthread_barrier_t bar;
  std::vector<uint8_t> buf;
  std::vector<const uint8_t *> sends;         // alltoallv: each rank's send buffer
  std::vector<const size_t *> send_counts;    // and its counts
  void wait() { pthread_barrier_wait(&bar); }
};

struct Member {
  Group *g;
  int rank;
};

inline int group_allgather(void *user, const void *send, void *recv, size_t bytes) {
  auto *m = static_cast<Member *>(user);
  Group *g = m->g;
  g->wait();
  if (m->rank == 0) g->buf.assign((size_t)g->n * bytes, 0);
  g->wait();
  memcpy(g->buf.data() + (size_t)m->rank * bytes, send, bytes);
  g->wait();
  memcpy(recv, g->buf.data(), (size_t)g->n * bytes);
  g->wait();
  return 0;
}

inline int group_broadcast(void *user, void *buf, size_t bytes, int root) {
  auto *m = static_cast<Member *>(user);
  Group *g = m->g;
  g->wait();
  if (m->rank == root) g->buf.assign((const uint8_t *)buf, (const uint8_t *)buf + bytes);
  g->wait();
  if (m->rank != root) memcpy(buf, g->buf.data(), bytes);
  g->wait();
  return 0;
}

// Each rank publishes its send buffer; then every rank copies its share
// from each sender, checking that the counts agree pairwise.
inline int group_alltoallv(void *user, const void *send, const size_t *send_counts, void *recv,
                           const size_t *recv_counts) {
  auto *m = static_cast<Member *>(user);
  Group *g = m->g;
  g->wait();
  if (m->rank == 0) g->sends.assign((size_t)g->n, nullptr), g->send_counts.assign((size_t)g->n, nullptr);
  g->wait();
  g->sends[(size_t)m->rank] = static_cast<const uint8_t *>(send);
  g->send_counts[(size_t)m->rank] = send_counts;
  g->wait();
  int rc = 0;
  size_t at = 0;
  for (int s = 0; s < g->n; s++) {
    size_t off = 0;
    for (int k = 0; k < m->rank; k++) off += g->send_counts[(size_t)s][k];
    if (g->send_counts[(size_t)s][m->rank] != recv_counts[s]) rc = CKPTIO_E_INVALID_ARG;
    else memcpy(static_cast<uint8_t *>(recv) + at, g->sends[(size_t)s] + off, recv_counts[s]);
    at += recv_counts[s];
  }
  g->wait();
  return rc;
}

// Member m's side of the group, as a communicator.
inline ckptio_comm group_comm(Member *m) {
  return ckptio_comm{sizeof(ckptio_comm), m->rank, m->g->n, m, group_allgather, group_broadcast, group_alltoallv};
}

}  // namespace ckptio_test

#endif
