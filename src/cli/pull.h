/*
 * Tensors a writer pulls from a checkpoint as it writes them
 * (ckptio_writer_add_fill): `convert` adds every input tensor that has no
 * view of its bytes this way (a DCP or multi-rank checkpoint's split
 * tensors, strided or big-endian PyTorch storages, compressed files), so no
 * copy of the model is held anywhere while the output is written.
 */
#ifndef CKPTIO_CLI_PULL_H
#define CKPTIO_CLI_PULL_H

#include "ckptio.h"

typedef struct cli_pull cli_pull;

/* The checkpoint at `path`, read on a context of its own (fills run on the
 * writer's workers, which a load on the writer's context could wait for),
 * with up to `readers` readers open at once (a reader serves one thread at
 * a time). CRCs are not checked again: convert verifies the input first.
 * @return 0 and *out, or a negative code (cli_open_error says why). */
int cli_pull_open(const char *path, int readers, cli_pull **out);
/* Adds tensor `index` of the checkpoint to w, its bytes pulled at commit;
 * the tensor's name, dtype and shape are the checkpoint's.
 * @return ckptio_writer_add_fill's. */
int cli_pull_add(cli_pull *p, ckptio_writer *w, size_t index);
/* After the writer's commit returned (or the writer is closed). */
void cli_pull_close(cli_pull *p);

#endif
