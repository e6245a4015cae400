/* What a save that owns several writers (a sharded set) needs from
 * writer.c beyond the public API: reserved metadata keys, and stopping a
 * save at "temp file written and synced" so that the owner can publish
 * every file of the set together (io/publish.h). */
#ifndef CKPTIO_WRITER_HOOKS_H
#define CKPTIO_WRITER_HOOKS_H

#include "ckptio.h"
#include "io/file.h"

/* ckptio_writer_set_metadata without the "ckptio." reservation. */
int ckptio_writer_set_reserved_metadata(ckptio_writer *w, const char *key, const char *value);

/* Before commit: the save ends with its temp file synced but not renamed
 * ("durable" then means that). The file is removed by ckptio_writer_close
 * unless taken. */
int ckptio_writer_hold_publish(ckptio_writer *w);

/* After a held save succeeded (wait_durable returned 0): moves the synced
 * temp file, still open, to *out; the caller then owns it (publish or
 * ckptio_tmpfile_abort). @return 0 or CKPTIO_E_STATE. */
int ckptio_writer_take_file(ckptio_writer *w, ckptio_tmpfile *out);

#endif
