/* The page cache filled ahead of a load's copies: two threads of the load
 * read a file's spans into the page cache through its map, in file order,
 * while the load's workers copy what it has passed into the destinations.
 * What CKPTIO_LOAD_AUTO does with a cold file that fits in memory (io/cache.h):
 * one read of the disk that leaves the file cached for the next load.
 *
 * Why threads of its own and huge pages: on this project's virtual disk
 * (2026-11-29, bench/RESULTS_PEERS.md) the page cache's 4 KiB pages cut
 * the reads into requests of 0.5-1.5 MiB against O_DIRECT's 4 MiB, and the
 * readahead of many copying workers came in no fixed order: a cold pread
 * load of 1 GiB took 1.4x an O_DIRECT one. The map advised MADV_HUGEPAGE
 * is filled by 2 MiB folios, read as 4 MiB requests, and two threads
 * reading in file order keep the disk streaming: 0.89x the speed of an
 * O_DIRECT load, against pread's 0.6x (medians of 8 rotated rounds, fresh
 * processes, memory primed). */
#ifndef CKPTIO_IO_FILL_H
#define CKPTIO_IO_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "io/rfile.h"

typedef struct ckptio_fill ckptio_fill;

/* Starts filling the spans [off[i], off[i] + len[i]) of f's map (a local
 * file; any order, overlaps allowed). unmap: each step is unmapped once
 * read (a load whose copies take the bytes elsewhere), else left mapped
 * (a private map that is the caller's memory). @return the filler, or
 * NULL when it does not start (no map, no memory, no thread, or as many
 * fillers running in the process as it allows): the caller then reads
 * the file as it did without one. */
ckptio_fill *ckptio_fill_start(const ckptio_rfile *f, const uint64_t *off, const uint64_t *len, size_t n, int unmap);
/* Returns once every span byte before file offset `end` is in the page
 * cache, or the filler has stopped (the file cut short under it, or
 * ckptio_fill_stop): the caller's own populate then reports what is
 * missing. Safe on many threads at once. */
void ckptio_fill_wait(ckptio_fill *fl, uint64_t end);
/* Stops the filler between steps, joins and frees it; NULL: nothing. */
void ckptio_fill_stop(ckptio_fill *fl);

#endif
