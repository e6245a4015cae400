/* Fault injection for the tests: makes the N-th call of one file operation
 * fail with a chosen errno, or write only half and then stop (a short write,
 * as a full disk does). Armed by the unit tests through ckptio_fault_arm, or
 * for whole programs by the environment: CKPTIO_FAULT="pwrite:3:ENOSPC"
 * (op: pwrite, pread, fsync, rename, fallocate; error: ENOSPC, EIO, EROFS or
 * short). The environment (this variable and the two *_MBPS ones below) is
 * read only by a build configured with -DCKPTIO_FAULT_INJECTION=ON, as
 * scripts/build.sh configures every test build; the default build, installs
 * and the wheel ignore it. */
#ifndef CKPTIO_IO_FAULT_H
#define CKPTIO_IO_FAULT_H

#include <stdint.h>

typedef enum ckptio_fault_op {
  CKPTIO_FAULT_PWRITE,
  CKPTIO_FAULT_PREAD,
  CKPTIO_FAULT_FSYNC,
  CKPTIO_FAULT_RENAME,
  CKPTIO_FAULT_FALLOCATE,
  CKPTIO_FAULT_OPS
} ckptio_fault_op;

#define CKPTIO_FAULT_SHORT 1  /* errno value meaning "short write" */

/* The nth (1-based) call of op from now fails with -err (or short). */
void ckptio_fault_arm(ckptio_fault_op op, long nth, int err);
void ckptio_fault_clear(void);
/* Called by the io room before each operation: 0, or the errno to inject. */
int ckptio_fault_check(ckptio_fault_op op);

/* A slow disk: from now on writes share one device of bytes_per_second
 * (0: off), each waiting for its turn and its bytes' time, so a save's
 * write time is known and much longer than its copies. Also armed by
 * CKPTIO_FAULT_WRITE_MBPS (MB/s, 10^6 bytes; test builds only, as above). */
void ckptio_fault_slow_writes(uint64_t bytes_per_second);
/* Called by the io room after each write of len bytes. */
void ckptio_fault_write_time(uint64_t len);
/* The same device for reads (CKPTIO_FAULT_READ_MBPS), so a load's read
 * time is known: what the GPU load pipeline must overlap its copies with. */
void ckptio_fault_slow_reads(uint64_t bytes_per_second);
/* Reads from a device that serves all the reads in flight at once, sharing
 * its rate among them: equal reads issued together end together, as the
 * virtual disk of bench/RESULTS.md does (32 reads of 8 MiB in flight all
 * ended at the same moment). ckptio_fault_slow_reads(0) turns it off. */
void ckptio_fault_slow_reads_shared(uint64_t bytes_per_second);
void ckptio_fault_read_time(uint64_t len);

#endif
