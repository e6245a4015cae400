/* What both MPI drivers of tests/dist count a failed check with: the
 * rank and the condition on stderr, and one more failure of this rank. */
#ifndef CKPTIO_TESTS_DIST_CHECK_H
#define CKPTIO_TESTS_DIST_CHECK_H

#include <stdio.h>

/* The including driver defines: static int rank, failures. */
#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "rank %d: FAILED %s: ", rank, #cond); \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      failures++;                                           \
    }                                                       \
  } while (0)

#endif
