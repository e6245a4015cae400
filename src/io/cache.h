/* Whether a load may leave the file it reads in the page cache: the policy
 * CKPTIO_LOAD_AUTO follows for a cold file (ckptio.h). Reading through the
 * cache makes every later load of the file, a restarted process's too, a
 * read of memory, for the price of the cache's fill on the first (pages
 * allocated besides the destinations': bench/RESULTS_PEERS.md, issue 45,
 * has what it costs on this VM); the pages it keeps are memory, so only a
 * load that fits comfortably takes it. */
#ifndef CKPTIO_IO_CACHE_H
#define CKPTIO_IO_CACHE_H

#include <stdint.h>

/* The memory this process can still take without pushing anything out:
 * MemAvailable of /proc/meminfo, or less where its memory cgroup (v1 or
 * v2) has a limit: the limit less the group's usage. UINT64_MAX when
 * neither can be read. */
uint64_t ckptio_memory_available(void);

/* 1 when a load of `bytes` may read through the page cache: its pages and
 * the destinations it fills (as many bytes again) fit in the memory
 * available, bytes <= available / 2; else 0 (O_DIRECT, nothing cached),
 * and 0 when the available memory is unknown. */
int ckptio_cache_fits(uint64_t bytes);

#endif
