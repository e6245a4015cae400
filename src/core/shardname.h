/* The file name of one file of a set, in one home (issue 43): Hugging
 * Face's "<prefix>-00001-of-00004.safetensors" for file 1 of 4 of a set
 * (save/set.c) or of a multi-rank checkpoint (save/ranks.c), and, in a
 * storage, where an object cannot be renamed into place and each save
 * names its own, "<prefix>-00001-of-00004-<first 8 of the save id>
 * .safetensors". Formatted by those two writers; parsed by the sweeps of
 * older saves' files and of killed saves' temp files (io/publish.c,
 * save/objects.c) and by the manager on a storage (manage/objects.c).
 *
 * The numbers take 5 digits ("%05zu"). A count above 99999 is written with
 * the digits it needs, and the parser refuses such a name (so did every
 * parser of these names before this home): sweeps pass those files by. */
#ifndef CKPTIO_CORE_SHARDNAME_H
#define CKPTIO_CORE_SHARDNAME_H

#include <stddef.h>

/* At least what a name adds to its prefix, its NUL included, for any k and
 * n: strlen(prefix) + this bytes always hold one. */
#define CKPTIO_SHARDNAME_EXTRA 80
/* The characters of the save id that a storage's name carries. */
#define CKPTIO_SHARDNAME_ID_LEN 8

/* The name of file k (0-based) of n of prefix into buf[len], cut short as
 * snprintf cuts; with save_id (not NULL) the storage's form, naming its
 * first CKPTIO_SHARDNAME_ID_LEN characters. @return snprintf's. */
int ckptio_shardname_format(char *buf, size_t len, const char *prefix, size_t k, size_t n, const char *save_id);

/* What a name says. */
typedef struct ckptio_shardname {
  size_t k, n;    /* file k (0-based) of n */
  const char *id; /* the save id's characters in the name (not terminated), or NULL: a local name */
  size_t idlen;
} ckptio_shardname;

/* Whether name begins with a name the formatter writes for prefix: prefix,
 * "-", 5 digits K, "-of-", 5 digits N with 1 <= K <= N, then either
 * nothing or "-" and 1 to CKPTIO_SHARDNAME_ID_LEN letters or digits, then
 * ".safetensors". @return what follows ".safetensors" in name ("" when
 * name is a file's own name, ".ckptio-tmp-..." for its temp file), and
 * *out (when not NULL) filled; NULL when name is not one. */
const char *ckptio_shardname_parse(const char *name, const char *prefix, ckptio_shardname *out);

#endif
