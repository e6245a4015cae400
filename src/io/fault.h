/* Fault injection for the tests: makes the N-th call of one file operation
 * fail with a chosen errno, or write only half and then stop (a short write,
 * as a full disk does). Armed by the unit tests through ckptio_fault_arm, or
 * for whole programs by the environment: CKPTIO_FAULT="pwrite:3:ENOSPC"
 * (op: pwrite, pread, fsync, rename; error: ENOSPC, EIO, EROFS or short). */
#ifndef CKPTIO_IO_FAULT_H
#define CKPTIO_IO_FAULT_H

typedef enum ckptio_fault_op {
  CKPTIO_FAULT_PWRITE,
  CKPTIO_FAULT_PREAD,
  CKPTIO_FAULT_FSYNC,
  CKPTIO_FAULT_RENAME,
  CKPTIO_FAULT_OPS
} ckptio_fault_op;

#define CKPTIO_FAULT_SHORT 1  /* errno value meaning "short write" */

/* The nth (1-based) call of op from now fails with -err (or short). */
void ckptio_fault_arm(ckptio_fault_op op, long nth, int err);
void ckptio_fault_clear(void);
/* Called by the io room before each operation: 0, or the errno to inject. */
int ckptio_fault_check(ckptio_fault_op op);

#endif
