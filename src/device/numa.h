/* NUMA placement: staging memory and worker threads on the node nearest a
 * GPU, found through hwloc's PCI locality. On a one-node machine, or when
 * the GPU's PCI device is not in the topology, nothing moves and the
 * report says why. */
#ifndef CKPTIO_DEVICE_NUMA_H
#define CKPTIO_DEVICE_NUMA_H

#include <pthread.h>
#include <stddef.h>

/* Binds [mem, mem + bytes) and the threads to the NUMA node(s) local to the
 * PCI device `busid` ("dddd:bb:dd.f"). Writes what was done into report.
 * @return 1 when placed, 0 when nothing needed or could be done (not an
 * error: placement is an optimisation), negative only for bad arguments. */
int ckptio_numa_place(const char *busid, void *mem, size_t bytes, const pthread_t *threads,
                      int nthreads, char *report, size_t len);

#endif
