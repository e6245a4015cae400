/* The staging ring: a fixed set of aligned host buffers ("slots") that the
 * pipelines borrow one at a time. Allocated once per context; a slot's
 * pages are first touched by the first job that uses it (on a worker,
 * beside that save's I/O) and kept, so later saves and loads pay no page
 * faults and a context that saves one small file touches one slot, not the
 * whole ring. Bounded, so a pipeline never holds more than the staging
 * limit whatever the model size. */
#ifndef CKPTIO_STAGING_RING_H
#define CKPTIO_STAGING_RING_H

#include <stddef.h>
#include <stdint.h>

#include "core/align.h"

typedef struct ckptio_ring ckptio_ring;

/* nslots buffers of slot_bytes (a multiple of CKPTIO_IO_ALIGN), aligned to
 * CKPTIO_IO_ALIGN; the first `prefault` of them (the ones handed out first)
 * to be faulted in ahead of use: by ckptio_ring_prepare where the kernel
 * allows it (ckptio_ring_unprepared says how many are left to it), else
 * touched now. @return 0 or -ENOMEM / -EINVAL. */
int ckptio_ring_create(size_t nslots, size_t slot_bytes, size_t prefault, ckptio_ring **out);
/* Faults in the slots left to prepare, on the calling thread (a context
 * runs it on a thread of its own, a save on a worker), while slots are
 * acquired, written and released concurrently: it never writes a byte.
 * Several may run at once (each claims the next slot). Returns early, with
 * -ECANCELED, once ckptio_ring_prepare_stop was called (from any thread).
 * @return 0 or a negative errno (the slots not prepared are then faulted
 * in by their first user, as staging slots are). */
int ckptio_ring_prepare(ckptio_ring *r);
/* Asks for the first n slots (in hand-out order) to be prepared. */
void ckptio_ring_prepare_more(ckptio_ring *r, size_t n);
void ckptio_ring_prepare_stop(ckptio_ring *r);
/* How many slots, in hand-out order, were handed out or prepared (or are
 * being prepared): a save taking no more than these touches no new memory. */
size_t ckptio_ring_touched(ckptio_ring *r);
size_t ckptio_ring_unprepared(ckptio_ring *r);
/* Whoever ran ckptio_ring_prepare must have returned first. */
void ckptio_ring_free(ckptio_ring *r);
/* Blocks until a slot is free and returns its buffer. */
void *ckptio_ring_acquire(ckptio_ring *r);
/* A free slot's buffer, or NULL at once if none is free. */
void *ckptio_ring_try_acquire(ckptio_ring *r);
void ckptio_ring_release(ckptio_ring *r, void *slot);
/* Releases a slot that host-to-device copies may still be reading (a load
 * does not wait for its copies to go on reading): `gpus` is the mask of
 * GPUs whose event for this slot the next user must wait for before writing
 * into it. Such slots are handed out last, so a reader rarely waits. */
void ckptio_ring_release_copying(ckptio_ring *r, void *slot, uint64_t gpus, const void *owner);
/* After acquiring: the mask the slot was released with (0 for none),
 * cleared. */
uint64_t ckptio_ring_take_copying(ckptio_ring *r, void *slot);
/* The owner has waited for its copies from slot number i itself: drops the
 * mark if it is still the one that owner left, so the next user does not
 * wait again (nor hear of that owner's failure). */
void ckptio_ring_clear_copying(ckptio_ring *r, size_t i, const void *owner);
size_t ckptio_ring_slot_bytes(const ckptio_ring *r);
size_t ckptio_ring_slots(const ckptio_ring *r);
/* The one allocation behind every slot (to pin it), and a slot's number. */
void *ckptio_ring_base(const ckptio_ring *r);
size_t ckptio_ring_slot_index(const ckptio_ring *r, const void *slot);

#endif
