/* The alignment O_DIRECT asks of I/O: every buffer address, file offset and
 * length of a direct read or write is a multiple of it (4096: the logical
 * block size of the disks ckptio meets, and the page size). In core because
 * both sides name it: the staging ring hands out buffers aligned to it, and
 * the files read and write with it. */
#ifndef CKPTIO_CORE_ALIGN_H
#define CKPTIO_CORE_ALIGN_H

#define CKPTIO_IO_ALIGN 4096u

#endif
