/*
 * ckptio.h — save and load model checkpoints at the speed of the hardware.
 *
 * This header is the manual. Conventions that hold for every function:
 *   - Functions return 0 (or a count) on success and a negative code on
 *     failure: -errno from the operating system passes through unchanged, the
 *     library's own failures are the CKPTIO_E_* codes below. ckptio_strerror()
 *     names any code; ckptio_*_last_error() gives the detail (file, tensor,
 *     rule) of the last failure on that handle.
 *   - Handles are opaque. Every close/free function accepts NULL.
 *   - Strings passed in are copied unless a function says "borrowed".
 *   - Stable and experimental. Everything declared before the section
 *     "experimental" at the end of this header is stable: its name,
 *     signature and meaning hold for every release of this major version
 *     (versioned structs grow by their rule, below; two fields of
 *     ckptio_stats say they are experimental). The calls of that
 *     section are still moving and are declared only when the program
 *     defines CKPTIO_EXPERIMENTAL before it includes this header (as
 *     zstd's ZSTD_STATIC_LINKING_ONLY); what they promise is said there.
 */
#ifndef CKPTIO_H
#define CKPTIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is exported; the rest of the library is hidden. */
#pragma GCC visibility push(default)

#define CKPTIO_VERSION_MAJOR 1
#define CKPTIO_VERSION_MINOR 1
#define CKPTIO_VERSION_PATCH 0
#define CKPTIO_VERSION_NUMBER \
  (CKPTIO_VERSION_MAJOR * 10000 + CKPTIO_VERSION_MINOR * 100 + CKPTIO_VERSION_PATCH)

/*! ckptio_version_number(), ckptio_version_string() :
 *  @return the version of the linked library, as CKPTIO_VERSION_NUMBER, and
 *          as text ("1.1.0"; static). */
unsigned ckptio_version_number(void);
const char *ckptio_version_string(void);

/* ---------------------------------------------------------------- errors */

/* Library codes count down from -1000, clear of every -errno. */
typedef enum ckptio_error {
  CKPTIO_OK = 0,
  CKPTIO_E_INVALID_ARG = -1000,   /* a NULL pointer, a bad enum, a bad size */
  CKPTIO_E_STATE = -1001,         /* call not allowed in the handle's state */
  CKPTIO_E_HEADER_TOO_SMALL = -1002, /* file shorter than the 8-byte length prefix */
  CKPTIO_E_HEADER_TOO_LARGE = -1003, /* header length above 100,000,000 bytes */
  CKPTIO_E_HEADER_LENGTH = -1004, /* 8 + header length exceeds the file */
  CKPTIO_E_HEADER_UTF8 = -1005,   /* header bytes are not UTF-8 */
  CKPTIO_E_HEADER_JSON = -1006,   /* header is not JSON of the safetensors schema */
  CKPTIO_E_INVALID_OFFSET = -1007, /* data_offsets leave a hole, overlap or go backwards */
  CKPTIO_E_OVERFLOW = -1008,      /* shape x element size overflows 64 bits */
  CKPTIO_E_MISALIGNED = -1009,    /* sub-byte dtype whose bits are not a multiple of 8 */
  CKPTIO_E_TENSOR_INFO = -1010,   /* byte range length differs from shape x dtype */
  CKPTIO_E_INCOMPLETE_BUFFER = -1011, /* data buffer not exactly covered by the tensors */
  CKPTIO_E_CHECKSUM = -1012,      /* stored CRC32 differs from the data */
  CKPTIO_E_NOT_FOUND = -1013,     /* no tensor (or key) of that name */
  CKPTIO_E_DUPLICATE = -1014,     /* two tensors (or keys) with one name */
  CKPTIO_E_DTYPE = -1015,         /* unknown dtype */
  CKPTIO_E_SHAPE = -1016,         /* more than CKPTIO_MAX_DIMS dims, or a negative dim */
  CKPTIO_E_FORMAT = -1017,        /* format not supported by this build */
  CKPTIO_E_BUFFER_TOO_SMALL = -1018, /* destination smaller than the tensor */
  CKPTIO_E_DEVICE = -1019,        /* device unavailable or device call failed */
  CKPTIO_E_SHORT_IO = -1020,      /* read or write moved fewer bytes than asked */
  CKPTIO_E_PICKLE = -1021,        /* pickle refused (opcode or global not allowed) or malformed */
  CKPTIO_E_ZIP = -1022,           /* corrupt zip archive (directory, headers, bounds) */
  CKPTIO_E_ZSTD = -1023,          /* corrupt zstd frame or seek table */
  CKPTIO_E_SHARD = -1024,         /* invalid shard index or inconsistent shard set */
  CKPTIO_E_RANK = -1025,          /* another rank of a multi-rank save failed,
                                     or the ranks' tensors disagree */
  CKPTIO_E_ERROR_MIN = CKPTIO_E_RANK
} ckptio_error;

/*! ckptio_strerror() :
 *  @return a static, human-readable name for any code this library returns,
 *          including -errno values. Never NULL. Thread-safe (unlike
 *          strerror(3), which the library never calls). */
const char *ckptio_strerror(int code);

/*! ckptio_error_name() :
 *  @return the enum's name of a library code without its prefix ("CHECKSUM"
 *          for CKPTIO_E_CHECKSUM), the errno's symbol of a -errno code
 *          ("ENOMEM" for -ENOMEM, "EIO" for -EIO), both static; NULL for 0,
 *          positive values and anything that is neither (an errno value the
 *          C library does not know, a code below CKPTIO_E_ERROR_MIN). With
 *          ckptio_strerror, what a binding needs to build its own table of
 *          codes without copying this header, and to name an OS failure.
 *          Thread-safe, as ckptio_strerror. */
const char *ckptio_error_name(int code);

/*! ckptio_last_open_error() :
 *  The detail of the calling thread's last open-type call when it failed
 *  (there is no handle to keep it), else "". The open-type calls are
 *  ckptio_ctx_create, ckptio_reader_open, ckptio_writer_open,
 *  ckptio_writer_open_sharded, ckptio_writer_open_ranks,
 *  ckptio_manager_open, and the experimental ckptio_ctx_storage_register
 *  and device calls (ckptio_device_describe, ckptio_device_copy,
 *  ckptio_host_pin, ckptio_host_unpin): each clears it on entry and, when it fails (a NULL
 *  argument included), leaves a sentence naming the path or the call. No
 *  other call changes it (a set's commit opens its files without it; the
 *  manager's save_begin and latest put back what was there). Thread-local;
 *  the string is valid until the next open-type call in this thread. */
const char *ckptio_last_open_error(void);

/* ---------------------------------------------------------------- dtypes */

/* Every dtype of the safetensors format, with its name there. */
typedef enum ckptio_dtype {
  CKPTIO_BOOL, CKPTIO_F4, CKPTIO_F6_E2M3, CKPTIO_F6_E3M2, CKPTIO_U8, CKPTIO_I8,
  CKPTIO_F8_E5M2, CKPTIO_F8_E4M3, CKPTIO_F8_E8M0, CKPTIO_F8_E4M3FNUZ,
  CKPTIO_F8_E5M2FNUZ, CKPTIO_I16, CKPTIO_U16, CKPTIO_F16, CKPTIO_BF16,
  CKPTIO_I32, CKPTIO_U32, CKPTIO_F32, CKPTIO_C64, CKPTIO_F64, CKPTIO_I64,
  CKPTIO_U64,
  CKPTIO_DTYPE_COUNT
} ckptio_dtype;

/*! ckptio_dtype_bits() :
 *  @return bits per element (4, 6, 8, 16, 32 or 64), or 0 for a bad dtype. */
int ckptio_dtype_bits(ckptio_dtype dtype);
/*! ckptio_dtype_name() :
 *  @return the safetensors name ("BF16"), or NULL for a bad dtype. */
const char *ckptio_dtype_name(ckptio_dtype dtype);
/*! ckptio_dtype_parse() :
 *  Parses a safetensors dtype name. @return 0, or CKPTIO_E_DTYPE. */
int ckptio_dtype_parse(const char *name, ckptio_dtype *out);

/* ---------------------------------------------------------------- tensors */

#define CKPTIO_MAX_DIMS 8
/* Where tensor memory lives. Zero (what an initializer leaves) is the host;
 * GPU n is CKPTIO_DEVICE_CUDA(n). */
#define CKPTIO_DEVICE_HOST 0
#define CKPTIO_DEVICE_CUDA(ordinal) ((ordinal) + 1)

/* A tensor handed to a writer. Plain value struct; the library copies it
 * (and the name) when it is added. `data` is borrowed: see ckptio_writer_add.
 * ndim 0 is a scalar; a zero in shape is an empty tensor. */
typedef struct ckptio_tensor {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[CKPTIO_MAX_DIMS];
  const void *data;
  int device;          /* CKPTIO_DEVICE_HOST or CKPTIO_DEVICE_CUDA(n) */
} ckptio_tensor;

/* What a reader knows of one stored tensor. `name` is borrowed from the
 * reader and valid until ckptio_reader_close. */
typedef struct ckptio_tensor_info {
  const char *name;
  ckptio_dtype dtype;
  int ndim;
  int64_t shape[CKPTIO_MAX_DIMS];
  uint64_t nbytes;     /* bytes of data */
  uint64_t offset;     /* absolute offset of the data in the file (of a
                          compressed file: in its decompressed stream) */
  int has_crc;         /* 1 when the file records a CRC32 of this tensor */
  uint32_t crc32;      /* the recorded CRC32 (zip polynomial), if has_crc */
  int strided;         /* 1: a view into a larger storage (PyTorch); loads
                          gather it contiguously, views are refused, and
                          offset / crc32 describe the whole storage record */
} ckptio_tensor_info;

/*! ckptio_tensor_nbytes() :
 *  Bytes of a tensor of this dtype and shape.
 *  @return the byte count, or CKPTIO_E_SHAPE / CKPTIO_E_OVERFLOW /
 *          CKPTIO_E_MISALIGNED / CKPTIO_E_DTYPE. */
int64_t ckptio_tensor_nbytes(ckptio_dtype dtype, int ndim, const int64_t *shape);

/* ---------------------------------------------------------------- options */

/* Versioned structs. ckptio_options, ckptio_stats, ckptio_comm,
 * ckptio_manager_options, ckptio_checkpoint_info and (experimental)
 * ckptio_device_info begin with `size_t size`,
 * which the caller sets to sizeof the struct as its ckptio.h declares it
 * (the _INIT macros do; ckptio_comm_single fills a whole ckptio_comm).
 * New fields are only ever appended, and every call that takes one of
 * these follows one rule:
 *  - An older, shorter struct is accepted. Passed in, the fields past its
 *    size take their defaults (the _INIT macro's values; zero for
 *    ckptio_comm, whose missing collectives are then refused as NULL ones).
 *    Filled out, only the fields within its size are written.
 *  - A larger size than this library knows (a program built against a
 *    newer ckptio.h) is accepted when every byte past this library's struct
 *    is zero, as the newer _INIT macro leaves fields it does not use:
 *    nothing the caller set is ignored. Otherwise, or when size is smaller
 *    than the size field itself or more than 1 KiB past this library's
 *    struct (a size never set), the call fails with CKPTIO_E_INVALID_ARG:
 *    the open-type calls (context, writers, readers, manager) say why,
 *    naming the struct, in ckptio_last_open_error; the calls that fill a
 *    struct (the stats, ckptio_manager_checkpoint) return the code alone.
 *    The caller's size field and those tail bytes are never written.
 * A size ends at a field boundary: sizeof of an older version of the
 * struct does.
 *
 * Frozen structs. The structs without a size field are frozen for every
 * 1.x release: no field is added, removed, moved or retyped, and no
 * meaning of a value changes, so a program built against any 1.x header
 * passes or receives them as this library lays them out. They are
 * ckptio_tensor and ckptio_tensor_info (one tensor), the request structs
 * ckptio_load_request, ckptio_slice_request and ckptio_box_request (arrays
 * of them are passed, so a size field would not make them growable), and,
 * experimental, ckptio_byte_range and ckptio_tiers_file. What 1.x needs
 * beyond them comes as a new struct and a new call, never as a longer
 * one. Enums are open: a later 1.x may add values (a dtype, a format, a
 * load method, an error code), and a program must treat a value it does
 * not know as "other", not as an error of the library's. */

typedef enum ckptio_format {
  CKPTIO_FORMAT_SAFETENSORS = 0,  /* .safetensors, with CRC32s in __metadata__ */
  CKPTIO_FORMAT_PYTORCH = 1,      /* torch.save zip (.pt); torch.load(weights_only=True,
                                     mmap=True) opens it; CRC32s in the zip records */
} ckptio_format;

typedef enum ckptio_load_method {
  CKPTIO_LOAD_AUTO = 0,  /* PREAD when the page cache holds most of the data
                            (a sample of pages, mincore: the experimental
                            ckptio_reader_resident), and when the load fits
                            in memory: its bytes at most half the memory
                            this process can still take (MemAvailable, or
                            its memory cgroup's limit less its usage, v1 or
                            v2), so that the file's pages and the
                            destinations both fit. Such a cold load leaves
                            the file there, so that the next load of it (a
                            restarted process's too) reads memory. Where
                            every request is a whole stretch of the file
                            into host memory, two threads of the load fill
                            the page cache through the file's mapping (in
                            transparent huge pages where the filesystem
                            has them, in file order) while the workers
                            copy behind them: MMAP in the stats, 0.9x the
                            speed of an O_DIRECT load here (pread: 0.6x);
                            other loads (slices of many runs, GPU
                            destinations, views) read by PREAD, which pays
                            more for the cache's fill (figures:
                            bench/RESULTS_PEERS.md), and so do the files
                            past the fourth filled at once in a process
                            (the members of a large set). Else DIRECT: a
                            load that does not fit leaves the cache as it
                            was. ckptio_stats.load_methods says which ran;
                            CKPTIO_LOAD_DIRECT always bypasses the cache.
                            A cold DIRECT load into fresh memory pays a
                            fault per page it fills: destinations in
                            transparent huge pages (MADV_HUGEPAGE, from a
                            2 MiB boundary) take one fault per 2 MiB, not
                            per 4 KiB, and load faster
                            (bench/RESULTS_PEERS.md) */
  CKPTIO_LOAD_PREAD,     /* parallel pread straight into the destinations,
                            through the page cache (which keeps the file) */
  CKPTIO_LOAD_MMAP,      /* parallel memcpy from the file mapping; pages the file
                            lost since it was opened give CKPTIO_E_SHORT_IO
                            (strided PyTorch views gather from the map
                            unchecked, as any mapping would: SIGBUS) */
  CKPTIO_LOAD_DIRECT,    /* O_DIRECT reads into staging (or in place), then
                            copies: the page cache neither read nor filled */
} ckptio_load_method;

#define CKPTIO_AUTO (-1)

/* Options of a context, and per save or load. Versioned (see above): start
 * from CKPTIO_OPTIONS_INIT (which sets `size` and the defaults), then change
 * fields. Zero threads, chunk_bytes or staging_bytes means the default.
 *
 * Context and per call. The fields marked "context only" (threads,
 * chunk_bytes, staging_bytes, cuda, numa, snapshot_bytes) build what a
 * context's saves and loads share: its pool, its ring, its GPU state. They
 * are set once, at ckptio_ctx_create. The others (crc, direct_io, fsync,
 * load_method, compress_level, shuffle) are per call: given to
 * ckptio_ctx_create they are the defaults of the context's saves and
 * loads, given to an open (ckptio_writer_open, _open_sharded, _open_ranks,
 * ckptio_reader_open, ckptio_manager_open) they are that save's or load's.
 * A struct given to an open may hold the context-only fields only as
 * CKPTIO_OPTIONS_INIT leaves them or as the context has them (the struct
 * the context was created from, or what ckptio_ctx_options gives): any
 * other value is refused with CKPTIO_E_INVALID_ARG and
 * ckptio_last_open_error naming the field, both values and where to set
 * it, never ignored. One struct may serve saves and loads: a load does not
 * use the fields marked "save only" nor direct_io and fsync (writes), a
 * save does not use load_method. */
typedef struct ckptio_options {
  size_t size;              /* sizeof(ckptio_options) */
  int threads;              /* worker threads (context only), each holding one read
                               or write in flight; 0: default (32) */
  size_t chunk_bytes;       /* pipeline chunk (context only); 0: 8 MiB */
  size_t staging_bytes;     /* staging memory limit (context only); 0: 256 MiB */
  int crc;                  /* 1: compute CRC32 on save, verify on load; 0: off */
  int direct_io;            /* CKPTIO_AUTO, 0 or 1: O_DIRECT for writes */
  int fsync;                /* 1: fdatasync + directory fsync on commit; 0: off */
  ckptio_load_method load_method;
  int cuda;                 /* context only. CKPTIO_AUTO: use the CUDA runtime when
                               it loads and sees a GPU; 1: require it; 0: never */
  int numa;                 /* context only. CKPTIO_AUTO / 1: place staging and
                               workers on the NUMA node nearest the GPU; 0: off */
  int compress_level;       /* save only. 0: plain file; else the zstd level (1-22,
                               negative for the fast levels): the safetensors file
                               wrapped in the zstd seekable format, which `zstd -d`
                               turns back into the plain file. Safetensors only.
                               Frames are chunk_bytes at most; besides the ring a
                               save holds up to min(threads, 8) + 2 compressed
                               frames, and as many zstd contexts (and with shuffle
                               chunks of scratch) as it compresses at once: at
                               most min(threads, 8).
                               Loads decompress only the frames they need. */
  int shuffle;              /* save only, with compress_level. 1: group byte k of
                               every element of a tensor before compressing (the
                               file records it under "ckptio.filter"; ckptio undoes
                               it on load, `zstd -d` does not); 0: off */
  size_t snapshot_bytes;    /* context only. Pinned host memory that holds
                               snapshots, beyond staging_bytes (rounded down to
                               whole chunks; allocated at ckptio_ctx_create,
                               faulted in and pinned by a thread of the context
                               right after, and reused by every save: see
                               ckptio_ctx_create). 0 (the default): none, memory stays bounded
                               by staging_bytes. CKPTIO_SNAPSHOT_AUTO: a quarter
                               of the machine's physical memory. See "The
                               snapshot point" at ckptio_writer_commit_async. */
  unsigned open_flags;      /* load only (1.1). CKPTIO_OPEN_* bits; 0: none */
} ckptio_options;

/* open_flags: a torch.save archive is indexed as its records, not its
 * tensors: "data.pkl" and each storage record its pickle uses,
 * "data/<key>", each a 1-D CKPTIO_U8 tensor of the whole record (CRC
 * checked on load as a tensor is), so that a caller can rebuild the saved
 * object itself: nested containers, scalars, views and shared storages
 * (ckptio.torch.load_checkpoint does). Every check of a plain open is
 * still made (the pickle's allowlist, each storage's record and size,
 * each tensor's view inside its record). Other formats ignore it; a
 * big-endian archive is refused. */
#define CKPTIO_OPEN_TORCH_RECORDS 1u

#define CKPTIO_SNAPSHOT_AUTO ((size_t)-1)

#define CKPTIO_OPTIONS_INIT \
  { sizeof(ckptio_options), 0, 0, 0, 1, CKPTIO_AUTO, 1, CKPTIO_LOAD_AUTO, CKPTIO_AUTO, CKPTIO_AUTO, 0, 0, 0, 0 }

/* ---------------------------------------------------------------- context */

/* A context owns the worker pool and the staging ring, allocated once and
 * reused by every save and load. Creating one is cheap: the ring's pages
 * are touched by the first save or load that uses them (on the workers,
 * beside that save's I/O) and kept, so a one-shot save of a small file
 * touches a slot, not the ring, and a training loop that saves every N
 * steps pays page faults in its first save only. With CUDA, the whole ring
 * is pinned (cudaHostRegister, which touches it) by the first save or load
 * that copies to or from a GPU, so a context that only moves host memory
 * pins nothing.
 * Snapshot memory is made ready in the background: ckptio_ctx_create
 * returns at once and a thread of the context faults the memory in (with
 * MADV_POPULATE_WRITE) and, with CUDA, then pins the whole ring. A save that starts meanwhile is not held back: it faults
 * in the slots it takes that the thread has not reached yet, as a first
 * save without snapshot memory does, and its first GPU copy waits for the
 * pin. ckptio_ctx_free stops the thread between slots and joins it. On a
 * kernel older than 5.14 (no MADV_POPULATE_WRITE) the memory is touched
 * inside ckptio_ctx_create instead.
 * Thread safety: any number of writers and readers of one context may run
 * at once from different threads; they share the pool and the ring.
 * Fork: a context belongs to the process that created it. fork() copies
 * only the calling thread, so a child's copy of its parent's context has
 * no workers: there, every call that would use them (an open on the
 * context, a load of a reader opened before the fork, a writer's commit,
 * waits and close) fails at once with CKPTIO_E_STATE and says to create a
 * context in the child, and ckptio_ctx_free of it returns without
 * touching it (the parent's memory is the parent's). A child creates its
 * own context and uses it as any process does; the library keeps no
 * process-wide lock a fork could leave held. CUDA does not survive a
 * fork (the CUDA runtime's rule): a child that loads onto GPUs must not
 * have inherited an initialised CUDA context, whichever library made it. */
typedef struct ckptio_ctx ckptio_ctx;

/*! ckptio_ctx_create() :
 *  @opts  may be NULL for the defaults; copied. Its per-call fields (see
 *         ckptio_options) become the defaults of this context's saves and
 *         loads.
 *  @return 0 and *out, or a negative code (*out is then NULL). */
int ckptio_ctx_create(const ckptio_options *opts, ckptio_ctx **out);
/*! ckptio_ctx_free() :
 *  Joins the workers and frees the ring. Every writer and reader of this
 *  context must have been closed first. Accepts NULL; in a forked child,
 *  a parent's context is left as it is (see above). */
void ckptio_ctx_free(ckptio_ctx *ctx);
/*! ckptio_ctx_options() :
 *  The options in force (defaults resolved) into *out, whose size the
 *  caller sets (start from CKPTIO_OPTIONS_INIT; the rule of versioned
 *  structs). With ctx NULL, *out gets CKPTIO_OPTIONS_INIT's values (nothing
 *  resolved).
 *  @return 0, or CKPTIO_E_INVALID_ARG (out NULL or its size refused: out
 *  untouched). */
int ckptio_ctx_options(const ckptio_ctx *ctx, ckptio_options *out);

/*! ckptio_ctx_cuda() :
 *  @return 1 when this context drives GPUs (CUDA runtime loaded, at least one
 *          GPU; the ring is pinned later, by the first save or load that
 *          copies to or from a GPU), else 0 with *why (if not NULL) set to
 *          "CUDA unavailable: <reason>" (static or context-owned string). */
int ckptio_ctx_cuda(const ckptio_ctx *ctx, const char **why);

/*! ckptio_device_alloc(), ckptio_device_free() :
 *  Device memory for load destinations, when the caller has none of its own.
 *  ckptio_device_alloc returns 0 and *ptr, or CKPTIO_E_DEVICE; free the
 *  memory with ckptio_device_free on the same context. */
int ckptio_device_alloc(ckptio_ctx *ctx, int device, uint64_t nbytes, void **ptr);
int ckptio_device_free(ckptio_ctx *ctx, int device, void *ptr);

/* ---------------------------------------------------------------- storage */

/* Where checkpoints live besides local files. A path that starts with
 * "SCHEME://" (SCHEME: a letter, then letters, digits, '+', '-', '.') names
 * an object of the storage registered for SCHEME on the context; any other
 * path is a local file, read and written as always (O_DIRECT, the page
 * cache, fsync, rename). "s3://bucket/key" is built in where the library
 * was built with libcurl (no registration needed): S3-compatible object
 * storage, credentials and endpoint from AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (or
 * AWS_DEFAULT_REGION) and AWS_ENDPOINT_URL (path-style addressing for a
 * custom endpoint), read when the context first opens an s3:// path.
 * Other schemes are served by storages a program registers: the storage
 * interface (ckptio_storage_ops, ckptio_ctx_storage_register) is in the
 * experimental section.
 *
 * On a storage, loads read the object's first 256 KiB with one read (the
 * format, and the header of most safetensors files) and the tensors with
 * many reads in flight at once (one per worker, each at most a staging
 * chunk; neighbouring small tensors, up to a chunk of them, are one read
 * into the ring), into the staging ring or straight into host destinations, every
 * CRC checked as for a file. Objects are never mapped and never read with
 * O_DIRECT: a zero-copy load (the experimental ckptio_reader_map_private,
 * ckptio_reader_view) of one returns CKPTIO_E_FORMAT. Saves write each chunk of the ring to the
 * object from the worker that filled it, the chunk holding the header
 * last (once its CRCs are known; a .pt's chunks holding a tensor's data
 * descriptor as soon as the chunks before them are written), then
 * publish: the object appears whole, or not at all. Supported: safetensors
 * files, .pt archives (their index read by a few ranged reads: the tail
 * with the zip directory, the local headers) and compressed files (the
 * seek table from the tail; each frame one read), loaded and saved, and
 * Hugging Face sharded sets. A compressed file's size is known only at its
 * end, so it is saved only to a storage that takes an object of unknown
 * size (the built-in S3 one: a multipart upload of growing parts, the
 * first held until the header frame is in); to another storage it is
 * refused with CKPTIO_E_FORMAT at open. A set in a storage names
 * its shards after the save ("model-00001-of-00003-<save id>.safetensors":
 * an object cannot be renamed, so a save never writes over the shards the
 * old index names), publishes them, then the index (the moment the set
 * changes), then removes the older saves' shards. The checkpoint manager
 * takes a storage's prefix as its directory ("s3://bucket/ckpts": see
 * "manager"), and multi-rank checkpoints are saved to a prefix (see
 * ckptio_writer_open_ranks). */

/* ---------------------------------------------------------------- writer */

/* One save: open, add tensors, commit, close. A writer is opened for one
 * file (ckptio_writer_open) or for a Hugging Face sharded set
 * (ckptio_writer_open_sharded, in the "shards" section below); every other
 * ckptio_writer_* call works on both. A writer is used by one thread at a
 * time, except the poll / wait / progress calls, which any thread may call
 * while a commit runs. A NULL writer gives CKPTIO_E_INVALID_ARG (close: 0). */
typedef struct ckptio_writer ckptio_writer;

/*! ckptio_writer_open() :
 *  Nothing is created at `path` until commit; the final file appears there
 *  atomically (temp file in the same directory, fdatasync, rename, directory
 *  fsync), and a failed save leaves whatever was at `path` untouched. A
 *  process killed mid-save leaves `path` as it was and a hidden temp file
 *  (".NAME.ckptio-tmp-*") next to it, which the next successful save of
 *  `path` removes. A live save's temp file holds an advisory lock (flock)
 *  that a dead process drops, and only unlocked ones are removed, so saves
 *  of one path may run at once, from threads or processes: each succeeds,
 *  the last to rename wins, and `path` always holds one whole save.
 *  The file's blocks are allocated at commit (-ENOSPC before any write when
 *  they do not fit; a save that finds no space first waits for the blocks
 *  of files that earlier saves replaced, below, and tries once more). A
 *  file the rename replaces is kept open across it and closed by a worker
 *  after the durable point, so that freeing its blocks (done inside the
 *  rename when the rename drops the last reference) is not part of the
 *  save; its space comes back moments later, and ckptio_ctx_free waits for
 *  those closes.
 *  @path  copied.  @opts  NULL for the context's defaults; copied.
 *  @return 0 and *out, or a negative code. */
int ckptio_writer_open(ckptio_ctx *ctx, const char *path, ckptio_format format,
                       const ckptio_options *opts, ckptio_writer **out);

/*! ckptio_writer_set_metadata() :
 *  Adds a string to the file's metadata. Key and value copied. Keys starting
 *  with "ckptio." are reserved. @return 0, CKPTIO_E_DUPLICATE, ... */
int ckptio_writer_set_metadata(ckptio_writer *w, const char *key, const char *value);

/*! ckptio_writer_add() :
 *  Adds one tensor. The descriptor and the name are copied. The memory at
 *  `t->data` is borrowed: it must stay valid and unchanged until the snapshot
 *  point (ckptio_writer_wait_snapshot returns). Names must be unique.
 *  @return 0, or CKPTIO_E_DUPLICATE / CKPTIO_E_SHAPE / CKPTIO_E_DTYPE /
 *          CKPTIO_E_OVERFLOW / CKPTIO_E_DEVICE / CKPTIO_E_STATE. */
int ckptio_writer_add(ckptio_writer *w, const ckptio_tensor *t);

/* Supplies bytes of a tensor added by ckptio_writer_add_fill: writes the
 * `nbytes` bytes that start `offset` bytes into the tensor's stored bytes
 * (row-major, little-endian, as the file holds them) to `dst`, host memory
 * of the save's pipeline. Called on the context's workers, several at once
 * (so it must be thread-safe), each byte range once, in no set order, after
 * commit_async and before the snapshot point. It must not wait for work of
 * the same context (e.g. load with a reader of that context): the workers
 * it would wait for may all be in fills. @return 0, or a negative code: the
 * save fails with it, and with the message written to why (why_len bytes),
 * naming the tensor. */
typedef int (*ckptio_fill_fn)(void *arg, uint64_t offset, void *dst, uint64_t nbytes, char *why, size_t why_len);

/*! ckptio_writer_add_fill() :
 *  Adds one tensor whose bytes `fill` supplies while the save runs, instead
 *  of memory the save reads: a tensor assembled from other sources (another
 *  checkpoint's chunks, a stream) is written without a copy of it in
 *  memory. `t->data` must be NULL and `t->device` CKPTIO_DEVICE_HOST; `arg`
 *  is passed to every call and borrowed until the snapshot point. Otherwise
 *  as ckptio_writer_add (every writer kind takes it). */
int ckptio_writer_add_fill(ckptio_writer *w, const ckptio_tensor *t, ckptio_fill_fn fill, void *arg);

/*! ckptio_writer_set_stream() :
 *  The CUDA stream (a cudaStream_t) on which the training loop produces the
 *  tensors of GPU `device` (CKPTIO_DEVICE_CUDA(n)). At commit, ckptio records
 *  an event on it and its own copy streams wait for that event: the snapshot
 *  holds the values of all work queued there before the commit call, and the
 *  device is never synchronised. Without a stream, ckptio orders its copies
 *  after the legacy default stream (cudaStreamLegacy), which waits for every
 *  blocking stream. Borrowed until the commit call returns. */
int ckptio_writer_set_stream(ckptio_writer *w, int device, void *stream);

/*! ckptio_writer_commit_async() :
 *  Starts the save and returns at once. Two completion points follow:
 *    snapshot: every byte of every tensor has been copied out of the caller's
 *              memory (into staging or onto disk); the tensors may change.
 *    durable:  the file is complete, synced and renamed into place.
 *
 *  The snapshot point. The save takes pinned slots of the context's memory
 *  (M = staging_bytes + snapshot_bytes) in file order, copies into every
 *  slot it holds before any of its writes (all workers for host tensors,
 *  each GPU's copy stream for device tensors), and writes behind: its
 *  writes, and the CRC32s of what it copied, start at the snapshot point,
 *  or earlier only when it must wait for a slot. So for a save of B bytes
 *  (the file's size):
 *    B <= M: the snapshot comes after the copies alone: B / copy bandwidth
 *            (memcpy, or pinned device-to-host), however slow the disk;
 *    B >  M: the bytes beyond M wait for slots that writes free: the stall
 *            is the copy time plus the time to write B - M bytes.
 *  With the default (no snapshot memory, 256 MiB of staging) that is the
 *  0.1 rule: all but the last staging-sized part must reach the disk first.
 *  A save started while another is still writing takes slots as that one
 *  frees them: its snapshot waits until the memory its bytes need is free.
 *  The durable point comes after the writes, at the disk's speed.
 *  @return 0 if the save started; its outcome comes from wait / poll. */
int ckptio_writer_commit_async(ckptio_writer *w);

/*! ckptio_writer_wait_snapshot() :
 *  Blocks until the snapshot point. @return 0, or the save's error. */
int ckptio_writer_wait_snapshot(ckptio_writer *w);
/*! ckptio_writer_wait_durable() :
 *  Blocks until the file is durable. @return 0, or the save's error. */
int ckptio_writer_wait_durable(ckptio_writer *w);
/*! ckptio_writer_poll_snapshot(), ckptio_writer_poll_durable() :
 *  @return 1 when reached, 0 when not yet, or the save's (negative) error. */
int ckptio_writer_poll_snapshot(ckptio_writer *w);
int ckptio_writer_poll_durable(ckptio_writer *w);
/*! ckptio_writer_progress() :
 *  Bytes of tensor data written so far and in all. Either pointer may be NULL. */
void ckptio_writer_progress(ckptio_writer *w, uint64_t *done, uint64_t *total);

/* Where the time of one save or load went. Stage times are summed over the
 * worker threads (busy time), so bytes / stage seconds x threads bounds that
 * stage's throughput; `seconds` is the wall time of the whole operation. */
typedef struct ckptio_stats {
  size_t size;              /* sizeof(ckptio_stats): set before the call */
  uint64_t bytes;           /* tensor bytes moved */
  double seconds;           /* wall time: commit_async to durable; load start to end */
  double snapshot_seconds;  /* save: commit_async to the snapshot point */
  double device_seconds;    /* save: waiting for device-to-host copies;
                               load: host-to-device copies until complete */
  double copy_seconds;      /* save: host tensors into staging (with their CRC);
                               load: file into host memory (with its CRC) */
  double write_seconds;     /* save: pwrite of chunks and headers */
  double commit_seconds;    /* save: fdatasync, rename, directory fsync */
  int threads;              /* workers of the context */
  uint64_t staging_bytes;   /* pinned / staging memory of the context (its peak) */
  uint64_t direct_bytes;    /* (experimental: what it counts may change, see
                               the end of this header) of `bytes`, moved by
                               O_DIRECT straight between the file and the
                               caller's memory, with no staging copy (memory
                               that agrees with the file offset in O_DIRECT's
                               alignment; see README) */
  uint32_t load_methods;    /* (experimental, as direct_bytes) load: the ways
                               its bytes were read, as bits
                               1u << CKPTIO_LOAD_PREAD / _MMAP / _DIRECT (what
                               CKPTIO_LOAD_AUTO chose; a set may mix them;
                               ckptio_reader_map_private reads with MMAP);
                               0 for a save */
} ckptio_stats;

#define CKPTIO_STATS_INIT { sizeof(ckptio_stats), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/*! ckptio_writer_stats() :
 *  Stage timings of the finished (or running) save / of the last load. */
int ckptio_writer_stats(const ckptio_writer *w, ckptio_stats *out);

/*! ckptio_writer_commit() :
 *  Blocking save: commit_async then wait_durable. */
int ckptio_writer_commit(ckptio_writer *w);

/*! ckptio_writer_close() :
 *  Waits for a running commit, then frees the writer. A writer closed without
 *  a commit writes nothing. Accepts NULL. @return the save's outcome. */
int ckptio_writer_close(ckptio_writer *w);

/*! ckptio_writer_last_error() :
 *  The detail of the last failure of this writer, or "" if none. Borrowed
 *  until the next call on the writer. */
const char *ckptio_writer_last_error(const ckptio_writer *w);

/*! ckptio_writer_shard_count() :
 *  Files the save writes: 1 for a writer from ckptio_writer_open; for one
 *  from ckptio_writer_open_sharded, its shards once committed (0 before).
 *  0 for NULL. */
size_t ckptio_writer_shard_count(const ckptio_writer *w);

/* ---------------------------------------------------------------- reader */

/* An open checkpoint. Its header is parsed and validated at open; the data is
 * mapped read-only. A reader is used by one thread at a time; its loads run
 * in parallel on the context's pool. */
typedef struct ckptio_reader ckptio_reader;

/*! ckptio_reader_open() :
 *  @path  copied: a file, a sharded set (its index or directory), or a
 *         torch.distributed.checkpoint directory (holding .metadata; read
 *         without running its pickle: docs/FORMATS.md).  @opts  NULL for the
 *         context's defaults; copied.
 *  @return 0 and *out, or a header error (CKPTIO_E_HEADER_*, ...) whose
 *          detail names the rule and the tensor. */
int ckptio_reader_open(ckptio_ctx *ctx, const char *path, const ckptio_options *opts,
                       ckptio_reader **out);
/*! ckptio_reader_close() :
 *  Frees the reader, closing its files and mappings; what it lent (names,
 *  metadata, views) is invalid after. Accepts NULL. */
void ckptio_reader_close(ckptio_reader *r);

/*! ckptio_reader_count() :
 *  @return the number of tensors. */
size_t ckptio_reader_count(const ckptio_reader *r);
/*! ckptio_reader_format() :
 *  @return "safetensors", "pytorch", "safetensors-sharded" or "dcp" (static). */
const char *ckptio_reader_format(const ckptio_reader *r);
/*! ckptio_reader_info() :
 *  Fills *out for tensor `index` (file order, by offset). */
int ckptio_reader_info(const ckptio_reader *r, size_t index, ckptio_tensor_info *out);
/*! ckptio_reader_find() :
 *  @return the index of the tensor named `name`, or CKPTIO_E_NOT_FOUND. */
int64_t ckptio_reader_find(const ckptio_reader *r, const char *name);

/*! ckptio_reader_metadata_count(), ckptio_reader_metadata_at() :
 *  Metadata: count, and the key / value at an index (borrowed until close). */
size_t ckptio_reader_metadata_count(const ckptio_reader *r);
int ckptio_reader_metadata_at(const ckptio_reader *r, size_t index,
                              const char **key, const char **value);
/*! ckptio_reader_metadata_get() :
 *  @return the value of `key` (borrowed until close), or NULL. */
const char *ckptio_reader_metadata_get(const ckptio_reader *r, const char *key);

/* One tensor to load: copy tensor `index` into `dst` (at least `dst_bytes`),
 * which is memory of `device` (CKPTIO_DEVICE_HOST or CKPTIO_DEVICE_CUDA(n)). */
typedef struct ckptio_load_request {
  size_t index;
  void *dst;
  uint64_t dst_bytes;
  int device;
} ckptio_load_request;

/*! ckptio_reader_load_many() :
 *  Loads the tensors in parallel on the pool. `dst` memory is the caller's;
 *  it is written, never kept. With crc on, each tensor that has a recorded
 *  CRC32 is checked and a mismatch fails with CKPTIO_E_CHECKSUM naming it.
 *  @return 0, or the first error (other destinations may be partly written). */
int ckptio_reader_load_many(ckptio_reader *r, const ckptio_load_request *reqs, size_t n);
/*! ckptio_reader_load() :
 *  One tensor: ckptio_reader_load_many with one request. */
int ckptio_reader_load(ckptio_reader *r, size_t index, void *dst, uint64_t dst_bytes);

/*! ckptio_reader_view() :
 *  A zero-copy, read-only pointer into the file mapping (no CRC check: use
 *  ckptio_reader_verify). Valid until ckptio_reader_close. A compressed file
 *  has no plain bytes to point at: CKPTIO_E_FORMAT (load the tensor). */
int ckptio_reader_view(ckptio_reader *r, size_t index, const void **data, uint64_t *nbytes);

/*! ckptio_reader_set_stream() :
 *  The CUDA stream (a cudaStream_t) on which the caller queues work that
 *  uses the load destinations on GPU `device` (CKPTIO_DEVICE_CUDA(n)). Each
 *  load's host-to-device copies wait on an event recorded on it when the
 *  load starts, so kernels queued earlier that still read or write the
 *  destination buffers finish first; the device is never synchronised.
 *  Without a stream the copies wait for the legacy default stream. Loads
 *  return once the data is on the GPU, so work queued afterwards sees it.
 *  Borrowed until the reader is closed or the stream is replaced. */
int ckptio_reader_set_stream(ckptio_reader *r, int device, void *stream);

/*! ckptio_reader_verify() :
 *  Checks every recorded CRC32 in parallel. @return 0, CKPTIO_E_CHECKSUM
 *  (detail names the first bad tensor), or an I/O error. Tensors without a
 *  recorded CRC are counted in *unchecked when it is not NULL. */
int ckptio_reader_verify(ckptio_reader *r, size_t *unchecked);

/*! ckptio_reader_compression() :
 *  For a compressed (zstd seekable) file: 1, with its frame count, its size
 *  on disk and its decompressed size (the plain safetensors file) in the
 *  pointers that are not NULL. 0 for a plain file (pointers set to 0). */
int ckptio_reader_compression(const ckptio_reader *r, uint64_t *frames, uint64_t *compressed_bytes,
                              uint64_t *decompressed_bytes);

/*! ckptio_reader_stats() :
 *  Stage timings of the last load_many / verify. */
int ckptio_reader_stats(const ckptio_reader *r, ckptio_stats *out);

/*! ckptio_reader_progress() :
 *  Bytes loaded so far by the running load / verify, and in all. */
void ckptio_reader_progress(ckptio_reader *r, uint64_t *done, uint64_t *total);

/*! ckptio_reader_last_error() :
 *  The detail of the last failure of this reader, or "" if none. Borrowed
 *  until the next call on the reader. */
const char *ckptio_reader_last_error(const ckptio_reader *r);

/* ---------------------------------------------------------------- slices */

/* Partial loads for tensor-parallel ranks: a range start:stop of ONE
 * dimension of a tensor, read from the file without reading the rest.
 *
 * The slice lands in `dst` contiguous and row-major, shaped as the tensor
 * with shape[dim] replaced by stop - start. In the file those bytes are one
 * run when the slice is on the leading dimension (or every dimension before
 * `dim` has size 1), else one run per index of the dimensions before `dim`;
 * only those runs are read (O_DIRECT reads round each run out to pages, and
 * neighbours that share a page are read together). PyTorch views (strided)
 * are gathered element runs by element runs from the file mapping, and
 * big-endian files are swapped, as whole loads do.
 *
 * CRC: a recorded CRC32 covers a whole tensor, so a partial slice cannot be
 * verified and is loaded unchecked (`verified` = 0). A slice that covers the
 * whole tensor (start 0, stop shape[dim]) is loaded exactly as
 * ckptio_reader_load_many loads it, CRC checked when crc is on and the file
 * records one (`verified` = 1). No format ckptio reads records CRCs of parts
 * of a tensor today; if one does, partial slices will check the parts they
 * cover. ckptio_reader_verify checks the whole file.
 *
 * Sub-byte dtypes (F4, F6_*): each run must start and end on a byte
 * boundary, else CKPTIO_E_MISALIGNED.
 *
 * Sharded sets: each slice is read from the shard holding its tensor.
 * Compressed files: a slice decompresses only the frames that hold its runs,
 * each frame once however many runs it holds (a quarter of a tensor's rows:
 * about a quarter of its frames), undoing the shuffle filter element range
 * by element range. */

/* One slice to load. `dst` is memory of `device` (as in
 * ckptio_load_request), written, never kept; it may be NULL when the slice
 * is empty. `verified` and `bytes_read` are outputs. */
typedef struct ckptio_slice_request {
  size_t index;        /* the tensor */
  int dim;             /* 0 .. ndim - 1 */
  int64_t start, stop; /* 0 <= start <= stop <= shape[dim] */
  void *dst;
  uint64_t dst_bytes;  /* at least ckptio_reader_slice_nbytes() */
  int device;          /* CKPTIO_DEVICE_HOST or CKPTIO_DEVICE_CUDA(n) */
  int verified;        /* out: 1 when the bytes were checked against a recorded
                          CRC32 (full slices only, see above), else 0 */
  uint64_t bytes_read; /* out: bytes this request read from the file: the
                          slice's bytes for PREAD and MMAP (of an object in a
                          storage, plus the gaps of under 64 KiB between runs
                          that one GET reads and drops); for DIRECT plus
                          the page rounding of each O_DIRECT request (at
                          most 8 KiB per run and per staging chunk); a
                          verified slice counts the bytes its CRC covers (a
                          view's whole storage record, once more); for a
                          compressed file, the plain bytes of the frames
                          decompressed */
} ckptio_slice_request;

/*! ckptio_reader_slice_nbytes() :
 *  Checks a slice against tensor `index` without reading anything.
 *  @return the bytes of the slice (what dst must hold), or
 *          CKPTIO_E_INVALID_ARG (no such tensor, dim outside 0 .. ndim - 1,
 *          start < 0, start > stop, stop > shape[dim]) or
 *          CKPTIO_E_MISALIGNED (a sub-byte dtype cut inside a byte), with
 *          the detail in ckptio_reader_last_error. */
int64_t ckptio_reader_slice_nbytes(ckptio_reader *r, size_t index, int dim, int64_t start,
                                   int64_t stop);

/*! ckptio_reader_load_slices() :
 *  Loads the slices in parallel on the context's pool (jobs of one staging
 *  chunk of output each), with the load method of the reader's options.
 *  PREAD and MMAP put every run straight into its place in a host
 *  destination. DIRECT reads through the bounded staging ring: runs whose
 *  pages touch share one O_DIRECT request, a run longer than a chunk is
 *  read a chunk at a time. AUTO is PREAD for a warm file, DIRECT for a cold
 *  one, but PREAD whenever the runs are under 1 MiB (an O_DIRECT request per
 *  small run costs more than the bytes it saves). GPU destinations get
 *  their runs gathered into a pinned staging slot, one host-to-device copy
 *  per slot, ordered as ckptio_reader_set_stream says.
 *  Sets each request's `verified` and `bytes_read`. Same threading rules as
 *  ckptio_reader_load_many; ckptio_reader_stats reports the slices' bytes.
 *  @return 0, or the first error (other destinations may be partly written):
 *          the codes of ckptio_reader_slice_nbytes, CKPTIO_E_BUFFER_TOO_SMALL,
 *          CKPTIO_E_DEVICE, CKPTIO_E_CHECKSUM (full slices), I/O errors. */
int ckptio_reader_load_slices(ckptio_reader *r, ckptio_slice_request *reqs, size_t n);

/*! ckptio_reader_load_slice() :
 *  One slice into host memory: ckptio_reader_load_slices with one request.
 *  @verified  may be NULL; else gets the request's `verified`. */
int ckptio_reader_load_slice(ckptio_reader *r, size_t index, int dim, int64_t start, int64_t stop,
                             void *dst, uint64_t dst_bytes, int *verified);

/*! ckptio_split_rank() :
 *  The range of a dimension of `size` that rank `rank` of `nranks` owns, by
 *  torch.chunk's rule: chunks of ceil(size / nranks), in rank order, so that
 *  rank r gets [min(r * c, size), min((r + 1) * c, size)). When nranks
 *  divides size this is Megatron-LM's split (size / nranks each, which
 *  Megatron requires); otherwise the last ranks get less, and a rank past
 *  the last chunk gets an empty range (start == stop == size).
 *  @return 0, or CKPTIO_E_INVALID_ARG (size < 0, nranks < 1, rank outside
 *          0 .. nranks - 1, NULL pointer). */
int ckptio_split_rank(int64_t size, int rank, int nranks, int64_t *start, int64_t *stop);

/* ---------------------------------------------------------------- shards */

/* Sharded checkpoints, the Hugging Face way: `{prefix}-00001-of-0000N.safetensors`
 * ... plus `{prefix}.safetensors.index.json` =
 *   {"metadata": {"total_size": <sum of tensor bytes>, "ckptio.save_id": ID},
 *    "weight_map": {tensor: file}}   (keys sorted, 2-space indent)
 *
 * Reading: ckptio_reader_open on a `*.index.json` path, or on a directory
 * holding exactly one `*.safetensors.index.json` (else exactly one
 * `*.safetensors`, opened as a single file), opens the set as one checkpoint:
 * count / find / info / metadata / load_many / view / verify cover every
 * shard; ckptio_reader_format says "safetensors-sharded"; info's `offset` is
 * within the tensor's own shard file. The index is checked: file names are
 * plain names in the index's directory (no '/', '\\', "..", NUL, not empty;
 * a symbolic link of that name is followed, as the Hugging Face cache needs),
 * every named file is a valid safetensors file holding the tensors mapped to
 * it, and every tensor of every shard is mapped to its own file (so none is in
 * two shards); the index is at most 100,000,000 bytes; total_size is not used.
 * When the index metadata carries "ckptio.save_id", every shard must carry
 * the same id and "ckptio.shard" = "k/N": see the crash note below.
 * Failures are CKPTIO_E_SHARD (or the shard's own header error), naming the
 * index, the shard and the tensor. Metadata of a set: the index's metadata
 * (numbers as decimal strings), then each shard's keys not seen before
 * (ckptio.shard excepted). */

/*! ckptio_reader_shard_count() :
 *  Shard files of a set opened through an index: their count, or 0 when the
 *  reader is a single file, and also for a DCP directory, whose .distcp
 *  files do not open on their own (ckptio_reader_shard still names them). */
size_t ckptio_reader_shard_count(const ckptio_reader *r);
/*! ckptio_reader_shard() :
 *  Shard k of a set (or file k of a DCP directory): its path (borrowed until
 *  close), its tensor count and tensor bytes. Any out pointer may be NULL.
 *  @return 0 or CKPTIO_E_INVALID_ARG. */
int ckptio_reader_shard(const ckptio_reader *r, size_t k, const char **path, size_t *tensors,
                        uint64_t *bytes);
/*! ckptio_reader_shard_of() :
 *  @return the shard holding tensor `index` (0 for a single file), or
 *  CKPTIO_E_INVALID_ARG. */
int64_t ckptio_reader_shard_of(const ckptio_reader *r, size_t index);

/* Sharded saves: a ckptio_writer opened with ckptio_writer_open_sharded
 * takes every ckptio_writer_* call (add, set_metadata, set_stream,
 * commit_async / commit, the waits and polls, progress, stats, close,
 * last_error, shard_count); only what differs from one file is said here.
 *
 * The tensors are spread over shard files, each filled up to
 * max_shard_bytes of tensor data (a tensor larger than the limit gets a
 * shard of its own); see ckptio_shard_order for where that shard goes. The
 * shards are written concurrently, one pipeline each, sharing the context's
 * pool and staging ring.
 *
 * Atomic as a set: every shard is written to a temp file in `dir` and synced
 * but not renamed; only when all are durable are they renamed into place
 * (an existing file of the same name is exchanged with the new one, so it can
 * be put back), then the index is written last (temp, fsync, rename,
 * directory fsync). A failure at any point before the index's rename puts
 * every replaced shard back, removes every temp file and leaves no existing
 * file changed. Exception: a filesystem without renameat2(RENAME_EXCHANGE)
 * (NFS, some FUSE) gets plain renames, and a shard replaced that way cannot
 * be put back; the old set is then refused by the save-id check below rather
 * than read mixed. A crash between the renames cannot be hidden by rename
 * alone, so it is made detectable and readable: a random save id goes into
 * the index metadata ("ckptio.save_id") and into every shard's __metadata__
 * (with "ckptio.shard" = "k/N"). A shard that does not carry the index's id
 * is looked for in the hidden temp files the exchange left in `dir`
 * (".NAME.ckptio-tmp-*"), where a killed save leaves the old shards: one
 * with the index's id and place stands in for it, so the old set still
 * reads whole until a later save publishes. Without one, the reader refuses
 * the set, naming the shard (CKPTIO_E_SHARD). After a crash, left-over
 * hidden temp files (".NAME.ckptio-tmp-*") remain in `dir` until the next
 * save of the set publishes and removes those of its own names (a live
 * save's temps are locked and stay, as for one file). Saves of one set may
 * run at once: each publish (the swaps and the index) holds an advisory
 * lock on `dir`, so publishes never interleave and the last wins whole, and
 * a reader opening the set holds it shared (10 s at most) so that it never
 * pairs an index with another save's shards. Once the new
 * index is in place, shards of an earlier save with another shard count
 * (`{prefix}-NNNNN-of-MMMMM.safetensors`, MMMMM != N) are removed, as
 * transformers' save_pretrained does; no other file is touched.
 *
 * On a sharded writer:
 *   set_metadata  the keys go into every shard's __metadata__.
 *   set_stream    handed to every shard's pipeline: the same ordering and
 *                 legacy-stream default as for one file.
 *   add           dtype, shape and duplicate names are refused here; the
 *                 device of the pointer is checked at commit.
 *   commit_async  at least one tensor (else CKPTIO_E_INVALID_ARG); starts
 *                 every shard's save; a failure here writes nothing.
 *   wait_snapshot every shard's snapshot point.
 *   wait_durable  the set and its index are durable and in place.
 *   poll_*        1 once every shard reached its snapshot point / once the
 *                 set and its index are durable, 0 not yet, or the set's
 *                 error once it has failed (a failing shard reads as 0 until
 *                 the set's error is settled).
 *   stats         bytes and stage busy seconds summed over the shards,
 *                 `seconds` from commit_async to the index's publication,
 *                 `snapshot_seconds` the latest shard's, `commit_seconds` the
 *                 shards' syncs plus the publication (renames, index,
 *                 directory fsyncs). All zero (threads aside) before commit.
 *   shard_count   the shards of the committed (or committing) set; 0 before
 *                 commit. */

/* Where a tensor larger than max_shard_bytes goes. Either way the other
 * tensors fill shards in the order added, and a shard closes when the next
 * tensor would push it over the limit. */
typedef enum ckptio_shard_order {
  CKPTIO_SHARD_ORDER_ADDED = 0, /* in the order added: it starts a shard of its
                                   own where it comes */
  CKPTIO_SHARD_ORDER_HF = 1,    /* as huggingface_hub's split_torch_state_dict_
                                   into_shards: its shard comes at once, before
                                   the shard still being filled, so a dict
                                   added in order gives that function's files */
} ckptio_shard_order;

/*! ckptio_writer_open_sharded() :
 *  Opens a save of a Hugging Face sharded set:
 *  `{prefix}-00001-of-0000N.safetensors` ... and
 *  `{prefix}.safetensors.index.json` in `dir`.
 *  @dir     the directory of the set (must exist); copied.
 *  @prefix  file name prefix, e.g. "model" (no '/'); copied.
 *  @format  CKPTIO_FORMAT_SAFETENSORS (the only sharded format; else
 *           CKPTIO_E_FORMAT).
 *  @max_shard_bytes  tensor bytes per shard, > 0.
 *  @order   CKPTIO_SHARD_ORDER_ADDED or CKPTIO_SHARD_ORDER_HF.
 *  @opts    NULL for the context's defaults; copied. compress_level must be
 *           0 (shards are plain safetensors, as Hugging Face tools read
 *           them): else CKPTIO_E_FORMAT.
 *  @return 0 and *out (free it with ckptio_writer_close), or a negative code
 *          with *out NULL and the detail in ckptio_last_open_error:
 *          CKPTIO_E_INVALID_ARG (bad prefix, max_shard_bytes 0, unknown
 *          order), CKPTIO_E_FORMAT, -ENOENT / -ENOTDIR for `dir`.
 *  Thread safety: as any writer (one thread at a time; the waits, polls and
 *  progress from any thread while a commit runs). */
int ckptio_writer_open_sharded(ckptio_ctx *ctx, const char *dir, const char *prefix, ckptio_format format,
                               uint64_t max_shard_bytes, ckptio_shard_order order, const ckptio_options *opts,
                               ckptio_writer **out);

/* ---------------------------------------------------------------- ranks */

/* Multi-rank checkpoints: N processes (ranks) save one checkpoint together,
 * and any number of ranks load any box of any tensor of it.
 *
 * The model. A checkpoint holds global tensors (name, dtype, global shape).
 * Each rank adds the parts it holds: a whole tensor (ckptio_writer_add), or
 * an N-dimensional box of one (ckptio_writer_add_part: offsets and sizes per
 * dimension, as row or column tensor-parallel splits, FSDP's dim-0 shards and
 * 2-D meshes cut them). A tensor or box added by several ranks (replicated) is
 * written once: by one of its holders, chosen deterministically to balance
 * the bytes each rank writes (so N data-parallel replicas each write 1/N).
 *
 * The files, in `dir`: `{prefix}-KKKKK-of-MMMMM.safetensors`, one per rank
 * that has bytes to write (M of them, numbered in rank order), each a valid
 * safetensors file whose keys are the tensor names (a part is stored under
 * its tensor's name, with the part's shape), and `{prefix}.safetensors.
 * index.json`, the Hugging Face index: whole tensors in "weight_map"; split
 * tensors in a "ckptio" section that other tools ignore (docs/FORMATS.md has
 * it byte for byte). When every tensor is whole, the checkpoint is exactly a
 * sharded set as ckptio_writer_open_sharded writes it, which transformers
 * and huggingface tools load.
 *
 * The commit. Atomic as a whole: every rank writes and syncs its file as a
 * temporary file; the ranks agree through the communicator that all
 * succeeded; each rank then swaps its file into place, the ranks agree
 * again, and rank 0 writes the index last. Any failure before the index is
 * renamed — on any rank — puts every replaced file back and removes every
 * temporary file: each rank's save returns an error naming the failed rank
 * and its reason (the failed rank its own code, the others CKPTIO_E_RANK),
 * and the previous checkpoint at that path is complete. A process killed
 * mid-save leaves the previous checkpoint readable: before the swaps it is
 * untouched; between them, its files are in the hidden temp files the
 * exchanges left, which the reader finds by the save id (see "shards"). The
 * killed save's temp files remain until a later save to `dir` with the
 * same prefix publishes and removes them.
 *
 * The communicator. The library links no MPI or NCCL: the caller passes the
 * rank, the size and two collectives as callbacks. They are called only from
 * the thread that calls ckptio_writer_commit_async, ckptio_writer_wait_durable,
 * ckptio_writer_commit or ckptio_writer_close on a multi-rank writer, never
 * from the pool; those calls are collective (every rank makes them, in the
 * same order). include/ckptio_mpi.h fills one from an MPI communicator;
 * ckptio_comm_single is the one-process one. */

/* Rank `rank` of `nranks`, with two collectives over the caller's engine.
 * Each returns 0, or a negative code that fails the save on this rank. */
typedef struct ckptio_comm {
  size_t size;     /* sizeof(ckptio_comm) */
  int rank;        /* 0 <= rank < nranks */
  int nranks;
  void *user;      /* handed to the callbacks */
  /* Every rank gives `bytes` bytes at `send` (the same count on all ranks);
   * `recv` (nranks * bytes) receives rank r's at r * bytes, on every rank. */
  int (*allgather)(void *user, const void *send, void *recv, size_t bytes);
  /* The `bytes` bytes at `buf` on rank `root` are copied to `buf` on every
   * rank. */
  int (*broadcast)(void *user, void *buf, size_t bytes, int root);
  /* Since 1.1 (what a group load exchanges; saves do not call it). Every
   * rank sends send_counts[r] bytes to rank r and receives recv_counts[r]
   * bytes from rank r: both buffers packed in rank order (rank 0's bytes
   * first, no gaps), this rank's own share included. What rank a sends
   * rank b is what b expects from a. NULL in a 1.0 communicator. */
  int (*alltoallv)(void *user, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts);
} ckptio_comm;

/*! ckptio_comm_single() :
 *  The one-process communicator: rank 0 of 1, collectives are copies.
 *  Fills the whole ckptio_comm of the header the program was built with: a
 *  program built against 1.0's header calls the symbol of version
 *  CKPTIO_1.0, which writes 1.0's shorter struct and nothing past it. */
void ckptio_comm_single(ckptio_comm *out);

/*! ckptio_writer_open_ranks() :
 *  Opens this rank's side of a multi-rank save into `dir` (which must exist
 *  and be the same directory on every rank: a shared filesystem, or one
 *  machine; or a storage's prefix, s3://bucket/prefix, where each rank
 *  uploads an object named for the save and rank 0 writes the index last,
 *  the moment the checkpoint changes). Not collective.
 *  @comm    copied (the callbacks and `user` are borrowed until close).
 *  @dir @prefix  copied; prefix as for ckptio_writer_open_sharded.
 *  @opts    NULL for the context's defaults; copied; compress_level must be 0.
 *  @return 0 and *out, or CKPTIO_E_INVALID_ARG (bad comm, prefix),
 *          CKPTIO_E_FORMAT (compression), -ENOENT / -ENOTDIR for dir.
 *  On the writer: add (a whole tensor), add_part, set_metadata (into every
 *  file's __metadata__), set_stream, commit_async
 *  (collective: gathers every rank's parts, checks them — the same global
 *  shape and dtype on every rank, parts inside it, not overlapping unless
 *  identical, covering every tensor exactly; a violation fails every rank
 *  with CKPTIO_E_RANK naming the tensor and the ranks — then starts this
 *  rank's file; a failure here is this rank's alone — it returns it, and
 *  must still call wait_durable or close, where the others learn of it),
 *  wait_snapshot / poll_snapshot (this rank's snapshot point:
 *  local), wait_durable / commit / close (collective: the agreement and the
 *  publication described above), poll_durable (1 only once wait_durable
 *  has published), progress and stats (this rank's file), shard_count (the
 *  checkpoint's files once committed). */
int ckptio_writer_open_ranks(ckptio_ctx *ctx, const ckptio_comm *comm, const char *dir, const char *prefix,
                             const ckptio_options *opts, ckptio_writer **out);

/*! ckptio_writer_add_part() :
 *  Adds a box of a global tensor: `t` describes the box as a tensor (its
 *  name is the global tensor's, t->shape the box's sizes, t->data the box's
 *  bytes row-major, borrowed as for ckptio_writer_add), `global_shape` and
 *  `offsets` (t->ndim each, copied) place it: dimension d covers
 *  [offsets[d], offsets[d] + t->shape[d]) of global_shape[d]. A rank adds at
 *  most one part of a tensor. Other writers take only boxes that are the
 *  whole tensor (then it is ckptio_writer_add).
 *  @return 0, CKPTIO_E_INVALID_ARG (box outside the global shape; a part on a
 *          writer that is not multi-rank), CKPTIO_E_DUPLICATE, or the codes
 *          of ckptio_writer_add. */
int ckptio_writer_add_part(ckptio_writer *w, const ckptio_tensor *t, const int64_t *global_shape,
                           const int64_t *offsets);

/*! ckptio_writer_abort() :
 *  Gives up a save before its commit, on this rank, when this rank cannot
 *  take part (its tensors could not be prepared, say): on a multi-rank
 *  writer it is collective in place of commit_async — the other ranks'
 *  commit_async fails with CKPTIO_E_RANK naming this rank and `why` — so no
 *  rank waits for it; on other writers nothing is written. The writer may
 *  then only be closed: every other call on it (commit, commit_async, the
 *  waits and polls, add, set_metadata, a second abort) fails with
 *  CKPTIO_E_STATE and writes nothing, on every kind of writer.
 *  @code  this rank's failure (< 0; CKPTIO_E_INVALID_ARG if not)
 *  @why   copied; NULL for ckptio_strerror(code)
 *  @return `code` (with last_error naming this rank and `why`), or
 *          CKPTIO_E_STATE after commit_async or a first abort. */
int ckptio_writer_abort(ckptio_writer *w, int code, const char *why);

/* Reading: ckptio_reader_open on the index (or its directory) opens the
 * checkpoint as one: count / find / info list the global tensors (info's
 * offset is 0 and has_crc 0 for a split tensor: each part has its own CRC),
 * load_many and slices assemble them from their parts, each part's CRC
 * checked when the part is read whole; verify checks every part. A split
 * tensor has no bytes in place: view refuses it, and so do slice_ranges and
 * plan_rank (CKPTIO_E_FORMAT; ckptio_reader_part lists its parts). The index
 * is checked when opened: every rule of a sharded set, plus for the "ckptio"
 * section: parts inside the global shape, of the tensor's dtype, never
 * overlapping, covering it exactly, each file's entry of the part's shape;
 * failures are CKPTIO_E_SHARD naming the tensor, the part and the file. */

/*! ckptio_reader_part_count() :
 *  Parts of tensor `index`: 1 for a tensor stored whole, else its parts. */
size_t ckptio_reader_part_count(const ckptio_reader *r, size_t index);
/*! ckptio_reader_part() :
 *  Part k of tensor `index`: the file holding it (borrowed until close), its
 *  offsets and sizes in the global tensor (ndim values each, into arrays of
 *  CKPTIO_MAX_DIMS). Any out pointer may be NULL. @return 0 or
 *  CKPTIO_E_INVALID_ARG. */
int ckptio_reader_part(const ckptio_reader *r, size_t index, size_t k, const char **path, int64_t *offsets,
                       int64_t *sizes);

/* A box of a tensor to load: dimension d from start[d] to stop[d] (0 <=
 * start <= stop <= shape), landing in `dst` contiguous and row-major, shaped
 * stop - start. Any checkpoint takes boxes (a plain file's tensor is one
 * part). */
typedef struct ckptio_box_request {
  size_t index;
  int64_t start[CKPTIO_MAX_DIMS];
  int64_t stop[CKPTIO_MAX_DIMS];
  void *dst;           /* memory of `device`, written, never kept */
  uint64_t dst_bytes;  /* at least ckptio_reader_box_nbytes() */
  int device;          /* CKPTIO_DEVICE_HOST or CKPTIO_DEVICE_CUDA(n) */
  int verified;        /* out: 1 when every byte was covered by a checked
                          CRC (every stored part it touches lies inside the
                          box), else 0 */
  uint64_t bytes_read; /* out: bytes read from the files (PREAD reads exactly
                          the box's bytes of each part; of objects in a
                          storage, plus the gaps of under 64 KiB between
                          runs that one GET reads and drops) */
} ckptio_box_request;

/*! ckptio_reader_box_nbytes() :
 *  @return the bytes of the box (what dst must hold), or
 *          CKPTIO_E_INVALID_ARG (no such tensor, a box outside it),
 *          CKPTIO_E_MISALIGNED (a sub-byte dtype cut off a byte boundary). */
int64_t ckptio_reader_box_nbytes(ckptio_reader *r, size_t index, const int64_t *start, const int64_t *stop);
/*! ckptio_reader_load_boxes() :
 *  Loads the boxes in parallel on the pool, reading from each stored part
 *  only the bytes that overlap the box. @return 0, or the codes of
 *  ckptio_reader_box_nbytes, CKPTIO_E_BUFFER_TOO_SMALL, CKPTIO_E_DEVICE,
 *  CKPTIO_E_CHECKSUM, I/O errors. */
int ckptio_reader_load_boxes(ckptio_reader *r, ckptio_box_request *reqs, size_t n);

/* ---------------------------------------------------------------- manager */

/* A directory of checkpoints for a training loop, one per step, crash-safe:
 *
 *   DIR/step-00001000/model.safetensors          (single file; .pt for
 *                                                 CKPTIO_FORMAT_PYTORCH,
 *                                                 .safetensors.zst when
 *                                                 compress_level != 0)
 *   DIR/step-00002000/model-00001-of-00002.safetensors ...
 *   DIR/step-00002000/model.safetensors.index.json    (sharded set)
 *   DIR/latest                                    "step-00002000\n"
 *
 * Step directories are named "step-" and the step in decimal, at least 8
 * digits (zero-padded); only that exact spelling is a checkpoint of the
 * manager. A save goes:
 *   1. ckptio_manager_save_begin: removes stray temporaries of an earlier
 *      killed save, creates a hidden temporary step directory
 *      (".ckptio-mgr-tmp-step-...") and opens a writer in it;
 *   2. the caller adds tensors and commits (commit_async: the snapshot and
 *      durable points of any writer);
 *   3. ckptio_manager_save_end: once the writer's save is durable, renames
 *      the temporary directory to its step name and fsyncs DIR (the
 *      checkpoint is now published), replaces `latest` atomically (temp
 *      file, fsync, rename, fsync DIR), then applies retention.
 * A process killed at any point leaves every published checkpoint intact
 * and at most hidden ".ckptio-mgr-*" entries, which the next save_begin
 * removes. (Durability across power loss relies on the fsyncs, which the
 * `fsync` option may turn off.)
 *
 * Retention (after publication, never before): of the step directories
 * older than the new checkpoint, keep the keep_last newest complete
 * checkpoints (the new one and any newer ones count), and those whose step
 * is a multiple of keep_every; remove the rest, incomplete ones included
 * (each is first renamed to a hidden ".ckptio-mgr-del-*" name, so a killed
 * removal never leaves a half-deleted checkpoint; its files are held open
 * and closed on a thread of the manager once save_end has returned, so
 * that freeing their blocks does not lengthen the save: the next save_end
 * and ckptio_manager_close wait for it). The new checkpoint is
 * never removed, so a complete checkpoint always exists once one was
 * published. A directory whose check fails for a reason other than its
 * content (out of memory, too many open files; on a storage also a short
 * read or a refused request, which may be the network's) is kept.
 *
 * "Complete" means: published under its step name and opened by
 * ckptio_reader_open (every header parsed and checked; for a set, every
 * shard present with the index's save id). "Verified" means
 * ckptio_reader_verify passed (every recorded CRC32 read and checked).
 *
 * Saving: one saving process per directory. save_begin takes an exclusive
 * flock(2) on DIR until save_end, and refuses (-EBUSY) when another
 * process (or another manager) holds it; list and latest take no lock and
 * may run in other processes, where a checkpoint removed by retention
 * meanwhile shows as incomplete.
 *
 * On a storage. DIR may be a storage's prefix ("s3://bucket/ckpts", or any
 * scheme registered with (experimental) ckptio_ctx_storage_register whose storage has the
 * list verb; saves also need create and remove). A step directory is then
 * the objects under "DIR/step-N/" and `latest` the object "DIR/latest".
 * Objects cannot be renamed, so a save writes its step's objects in place
 * and the step exists once its checkpoint's object is published: a single
 * file appears whole at its publish (S3: CompleteMultipartUpload), a set's
 * index after every shard. Objects under a step's prefix that no published
 * checkpoint names (a killed set's shards, an older save of the step) are
 * not a step, and list and latest never show them. The same guarantees
 * hold: `latest` is written after the step is published, retention runs
 * after that (each step removed by its checkpoint's object first, so one
 * cut short never leaves a step that opens damaged), a step saved again
 * replaces the old one when the new one is published (and on another kind,
 * the old set's index goes first), and save_begin first abandons the
 * uploads killed saves left open under "DIR/step-" (the storage's sweep)
 * and removes the checkpoint files and shards no step uses (other objects
 * under a step's prefix are the caller's: only retention, removing the
 * whole step as on a disk, touches them). There is no lock: one saving
 * process per prefix is the caller's to keep (a second one's save_begin
 * would sweep the first one's uploads). Durability is the storage's
 * publish. Failures name the URL and carry the storage's sentence (S3: the
 * HTTP status and S3's error code); open fails when the storage cannot
 * list DIR (a missing bucket, wrong credentials).
 *
 * Thread safety: a manager is used by one thread at a time (its calls are
 * not concurrent); the writer from save_begin follows the writer's rules
 * (its waits and polls from any thread while the commit runs). Managers of
 * one context on different directories are independent. */
typedef struct ckptio_manager ckptio_manager;

/* Options of a manager. Versioned: start from CKPTIO_MANAGER_OPTIONS_INIT. */
typedef struct ckptio_manager_options {
  size_t size;              /* sizeof(ckptio_manager_options) */
  int keep_last;            /* keep this many newest complete checkpoints (>= 1);
                               0: keep every checkpoint (no retention) */
  uint64_t keep_every;      /* also keep every checkpoint whose step is a multiple
                               of this; 0: off */
  ckptio_format format;     /* file format of a single-file checkpoint */
  uint64_t max_shard_bytes; /* 0: one file per checkpoint; else a Hugging Face
                               sharded set (safetensors) with this many tensor
                               bytes per shard (CKPTIO_SHARD_ORDER_ADDED) */
  int verify;               /* 1: ckptio_manager_latest also verifies every CRC32
                               of the checkpoint it returns (reads it whole);
                               0: the structural check only */
} ckptio_manager_options;

#define CKPTIO_MANAGER_OPTIONS_INIT \
  { sizeof(ckptio_manager_options), 3, 0, CKPTIO_FORMAT_SAFETENSORS, 0, 0 }

/* Receives each warning: a checkpoint skipped by ckptio_manager_latest
 * (named by its directory, with the code of its check), a stale or missing
 * `latest` record, a step directory retention could not remove. `message`
 * is borrowed for the call. Called on the thread of the manager call. */
typedef void (*ckptio_manager_warn_fn)(void *arg, uint64_t step, int code, const char *message);

/*! ckptio_manager_open() :
 *  @ctx   borrowed: must outlive the manager.
 *  @dir   the checkpoint directory; created (one level, mode 0777 less umask)
 *         when missing; copied. Or a storage's prefix (see "On a
 *         storage"): nothing is created, and the storage is asked to list
 *         it once.
 *  @mopts NULL for CKPTIO_MANAGER_OPTIONS_INIT; copied.
 *  @opts  NULL for the context's defaults; copied; used for every writer and
 *         reader the manager opens (crc, direct_io, fsync, load_method,
 *         compress_level). With fsync 0 the manager skips its own fsyncs too.
 *  Nothing in DIR is changed by open.
 *  @return 0 and *out (free with ckptio_manager_close), or a negative code
 *          with *out NULL and the detail in ckptio_last_open_error:
 *          CKPTIO_E_INVALID_ARG (NULL, bad size, keep_last < 0, unknown
 *          format, a sharded PyTorch format or compressed set), -errno for
 *          `dir`. */
int ckptio_manager_open(ckptio_ctx *ctx, const char *dir, const ckptio_manager_options *mopts,
                        const ckptio_options *opts, ckptio_manager **out);

/*! ckptio_manager_close() :
 *  A save begun and not ended is abandoned: its writer is closed (waiting
 *  for a running commit) and its temporary directory removed. Accepts NULL. */
void ckptio_manager_close(ckptio_manager *m);

/*! ckptio_manager_set_warning() :
 *  Where warnings go; fn NULL (the default) drops them (ckptio_manager_list
 *  still shows every incomplete checkpoint and why). `arg` is borrowed. */
void ckptio_manager_set_warning(ckptio_manager *m, ckptio_manager_warn_fn fn, void *arg);

/*! ckptio_manager_save_begin() :
 *  Starts the checkpoint of `step`: takes the directory's lock, removes
 *  stray ".ckptio-mgr-*" entries left by a killed save, creates the
 *  temporary step directory and opens a writer in it (ckptio_writer_open, or
 *  ckptio_writer_open_sharded with the prefix "model").
 *  @out   the writer, owned by the manager: add tensors, set metadata and
 *         streams, commit_async (or commit), wait as with any writer, then
 *         hand it to ckptio_manager_save_end; never ckptio_writer_close it.
 *  A checkpoint of the same step already published is replaced when this
 *  save is published (exchanged atomically; on a filesystem without
 *  renameat2(RENAME_EXCHANGE) the old one is moved aside first, and a crash
 *  between those two renames leaves neither under the step name, so there
 *  save a new step rather than the newest one again). The old copy's files
 *  are freed as retention's are (see above): after save_end, not in it.
 *  @return 0 and *out, or a negative code with *out NULL:
 *          CKPTIO_E_STATE (a save of this manager is open), -EBUSY (another
 *          save holds the directory), the writer's open errors, -errno. */
int ckptio_manager_save_begin(ckptio_manager *m, uint64_t step, ckptio_writer **out);

/*! ckptio_manager_save_end() :
 *  Ends the save of `w` (the writer of the last save_begin): waits until it
 *  is durable, closes it, then publishes the checkpoint, writes `latest` and
 *  applies retention (see above), and releases the directory's lock.
 *  Blocking; call it from any one thread (e.g. a background one, or when
 *  the next save begins). A writer never committed, or whose save failed,
 *  publishes nothing: it is closed and its temporary directory removed.
 *  `w` is freed in every case.
 *  @return 0 once published, or a negative code: the save's error,
 *          CKPTIO_E_STATE (never committed), CKPTIO_E_INVALID_ARG (not the
 *          open save's writer; then nothing is done), -errno of the
 *          publication. A failure after the step directory's rename (the
 *          `latest` record, a removal) leaves the checkpoint published and
 *          says so in ckptio_manager_last_error. */
int ckptio_manager_save_end(ckptio_manager *m, ckptio_writer *w);

/*! ckptio_manager_latest() :
 *  The checkpoint to resume from: the newest complete one (see above; with
 *  the verify option, also verified), walking the step directories from
 *  the newest. Each one skipped (incomplete, or failing verification) is
 *  reported to the warning callback by its directory and code; a `latest`
 *  record that is missing, unreadable or names another step is reported
 *  too and otherwise ignored: the directory is the truth, the record a
 *  convenience for other tools.
 *  @step  may be NULL; else the step.
 *  @path  may be NULL (with len 0); else gets what ckptio_reader_open takes
 *         (the file, or the index of a set), NUL-terminated.
 *  @return 1 when found, 0 when no complete checkpoint exists (*step and
 *          path untouched), or a negative code: CKPTIO_E_BUFFER_TOO_SMALL
 *          (path needs more than len bytes), -errno reading DIR. */
int ckptio_manager_latest(ckptio_manager *m, uint64_t *step, char *path, size_t len);

/* One checkpoint of the directory, as ckptio_manager_list saw it. Strings are
 * borrowed from the manager until its next list, latest, save_end or close. */
typedef struct ckptio_checkpoint_info {
  size_t size;          /* sizeof(ckptio_checkpoint_info): set before the call */
  uint64_t step;
  const char *dir;      /* the step directory */
  const char *path;     /* what ckptio_reader_open takes */
  uint64_t bytes;       /* bytes of the files in the step directory */
  uint32_t files;       /* files in the step directory */
  int complete;         /* 1: opened by ckptio_reader_open */
  int verified;         /* 1: ckptio_reader_verify passed (list with verify) */
  int error;            /* 0, or why not complete / not verified */
  const char *detail;   /* the error's detail, or "" */
} ckptio_checkpoint_info;

#define CKPTIO_CHECKPOINT_INFO_INIT { sizeof(ckptio_checkpoint_info), 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/*! ckptio_manager_list() :
 *  Scans DIR: every step directory, oldest first, checked (opened; with
 *  verify 1, also every CRC32 read and checked). Temporaries are not listed.
 *  Read the entries with ckptio_manager_checkpoint.
 *  @return the number of checkpoints, or -errno reading DIR. */
int64_t ckptio_manager_list(ckptio_manager *m, int verify);

/*! ckptio_manager_checkpoint() :
 *  Entry i (0 .. count - 1, oldest first) of the last ckptio_manager_list.
 *  @return 0, or CKPTIO_E_INVALID_ARG (i out of range, out NULL, or out's
 *  size refused: see "Versioned structs"). */
int ckptio_manager_checkpoint(const ckptio_manager *m, size_t i, ckptio_checkpoint_info *out);

/*! ckptio_manager_last_error() :
 *  The detail of the last failure of this manager, or "". Borrowed until
 *  the next call on the manager. */
const char *ckptio_manager_last_error(const ckptio_manager *m);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif /* CKPTIO_H */

/* ================================================================
 * experimental
 *
 * Calls still moving, declared only for a program that defines
 * CKPTIO_EXPERIMENTAL before it includes this header (#define
 * CKPTIO_EXPERIMENTAL, or -DCKPTIO_EXPERIMENTAL), as zstd declares its
 * ZSTD_STATIC_LINKING_ONLY section: using one is a choice made in the
 * source, where a reader sees it. What they promise, against the stable
 * calls above:
 *  - An experimental call may change its signature or meaning, or go
 *    away, in any minor release; the release's notes say which. One that
 *    changes takes a new name, so that a program built against the old
 *    one fails to start, naming the symbol it misses, instead of calling
 *    it wrongly.
 *  - Until then it is exported as every other call: by name in
 *    src/ckptio.map, under the same version node (not one of its own: a
 *    node per stability level would rename symbols that programs already
 *    link the day a call becomes stable), and the ABI check of the tests
 *    covers it. A call leaves this section for the stable part once its
 *    shape has held through a release.
 *  - The field open_flags of ckptio_options is experimental as its bit
 *    CKPTIO_OPEN_TORCH_RECORDS is: where it is is stable.
 *  - The fields direct_bytes and load_methods of ckptio_stats are
 *    experimental in the same way: where they are is stable (the struct's
 *    layout is), what they count may change (a new read method).
 * This section has its own guard, so a file that includes ckptio.h again
 * after defining CKPTIO_EXPERIMENTAL gets it.
 * ================================================================ */
#if defined(CKPTIO_EXPERIMENTAL) && !defined(CKPTIO_H_EXPERIMENTAL)
#define CKPTIO_H_EXPERIMENTAL

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* ---------------------------------------------------------------- context */

/* Why experimental: free text for a benchmark's report; what NUMA
 * placement does, and when (at ckptio_ctx_create, near GPU 0), is not
 * settled. */
/*! ckptio_ctx_numa_report() :
 *  What NUMA placement did for this context ("NUMA: one node on this
 *  machine; nothing to place", ...), or "" when CUDA is off. Borrowed. */
const char *ckptio_ctx_numa_report(const ckptio_ctx *ctx);

/* Why experimental: new, with one user so far (`ckptio bench`); whether a
 * copy should order itself after the caller's stream, and what else a
 * description of a GPU holds, are not settled. They let a program that
 * measures or stages GPU memory itself do it through the context's CUDA
 * runtime instead of loading one of its own. Each is open-type: it fails
 * with the detail (the call, the GPU, the runtime's call and error) in
 * ckptio_last_open_error. */

/* A GPU as the context's CUDA runtime describes it. Versioned (see
 * "Versioned structs"): start from CKPTIO_DEVICE_INFO_INIT. */
typedef struct ckptio_device_info {
  size_t size;          /* sizeof(ckptio_device_info) */
  char name[256];       /* "NVIDIA H100 80GB HBM3"; "" when the runtime cannot say */
  char pci_bus_id[32];  /* "0000:17:00.0" */
  char runtime[256];    /* the file the CUDA runtime was loaded from */
} ckptio_device_info;

#define CKPTIO_DEVICE_INFO_INIT { sizeof(ckptio_device_info), "", "", "" }

/*! ckptio_device_describe() : (experimental)
 *  GPU `device` (CKPTIO_DEVICE_CUDA(n)) into *out.
 *  @return 0, CKPTIO_E_INVALID_ARG (NULL, or out's size refused), or
 *          CKPTIO_E_DEVICE (CUDA unavailable on this context, no such GPU). */
int ckptio_device_describe(const ckptio_ctx *ctx, int device, ckptio_device_info *out);

/*! ckptio_device_copy() : (experimental)
 *  Copies nbytes from src to dst, one of them host memory
 *  (CKPTIO_DEVICE_HOST) and the other memory of a GPU of this context
 *  (CKPTIO_DEVICE_CUDA(n)), and returns when the bytes are there. It runs on
 *  the context's copy stream of that direction, after the copies saves and
 *  loads of this context queued there, and is not ordered after the
 *  caller's streams: synchronize them first. Host memory pinned (by
 *  ckptio_host_pin or the caller's runtime) copies at the copy engines'
 *  speed, other host memory at a fraction of it. The calling thread's
 *  current GPU is kept.
 *  @return 0, CKPTIO_E_INVALID_ARG (NULL pointers, two host or two GPU
 *          sides), CKPTIO_E_OVERFLOW, or CKPTIO_E_DEVICE. */
int ckptio_device_copy(ckptio_ctx *ctx, void *dst, int dst_device, const void *src, int src_device,
                       uint64_t nbytes);

/*! ckptio_host_pin(), ckptio_host_unpin() : (experimental)
 *  Pins nbytes of host memory at ptr for DMA with every GPU
 *  (cudaHostRegister, portable), and unpins it: ptr must be what was pinned,
 *  and memory is unpinned before it is freed.
 *  @return 0, CKPTIO_E_INVALID_ARG (NULL, 0 bytes), or CKPTIO_E_DEVICE (CUDA
 *          unavailable on this context, or the runtime refused: memory
 *          already pinned, or not pinned when unpinning). */
int ckptio_host_pin(ckptio_ctx *ctx, void *ptr, uint64_t nbytes);
int ckptio_host_unpin(ckptio_ctx *ctx, void *ptr);

/* ---------------------------------------------------------------- reader */

/* Why experimental: a figure for tools (`ckptio inspect`); what it counts
 * for a set, a compressed file or a DCP directory is not settled. */
/*! ckptio_reader_header_bytes() :
 *  @return bytes before the first tensor's data (header, zip records). */
uint64_t ckptio_reader_header_bytes(const ckptio_reader *r);

/* Why experimental: zero-copy loads hand the caller a mapping that
 * outlives the reader, refuse sets and compressed files, and choose by a
 * page-cache sample whose size and threshold follow measurements. */
/*! ckptio_reader_map_private() :
 *  Maps the whole file copy-on-write (MAP_PRIVATE, readable and writable):
 *  a tensor's bytes are at *base + ckptio_tensor_info.offset (not for
 *  strided or big-endian entries: load those). Pages stay the page cache's
 *  until written; a write copies that page into this process and never
 *  reaches the file. With the reader's crc option on, every recorded CRC32
 *  is checked over this mapping, in parallel on the pool, before it is
 *  returned (which also maps the pages in; the reader's load_method does
 *  not apply); a mismatch returns CKPTIO_E_CHECKSUM naming the tensor, and
 *  no mapping. Tensors without a recorded CRC are not checked.
 *  It maps the file the reader opened: a file renamed over the path later
 *  (as every ckptio save does) does not change it. A file truncated in place
 *  under it raises SIGBUS on access to the lost pages, as any file mapping
 *  does, and bytes written in place by another program show through the
 *  pages not yet written here.
 *  @base @size  owned by the caller after return and independent of the
 *         reader (it may be closed first); release with ckptio_map_free.
 *         An empty file gives NULL and 0.
 *  @return 0, CKPTIO_E_CHECKSUM, CKPTIO_E_FORMAT (a sharded set or a
 *          compressed file: no single mapping holds the tensors' bytes; load
 *          them instead), or -errno (mmap). */
int ckptio_reader_map_private(ckptio_reader *r, void **base, uint64_t *size);
/*! ckptio_reader_resident() :
 *  The share (0 to 1) of the checkpoint's stored tensor bytes that the page
 *  cache holds now, from a sample of up to 64 pages of each file (mincore:
 *  no I/O; a compressed file's share of its compressed bytes). One of
 *  what CKPTIO_LOAD_AUTO decides by (PREAD from a half on; below, PREAD
 *  when the load fits in memory, else DIRECT), and what a caller choosing
 *  between ckptio_reader_map_private and a copying load asks: a mapping of
 *  a resident file reads nothing, while a cold one faults the page cache
 *  in a page at a time, slower than parallel reads on many disks
 *  (bench/RESULTS_PEERS.md). @return 0, or CKPTIO_E_INVALID_ARG. */
int ckptio_reader_resident(ckptio_reader *r, double *share);
/*! ckptio_reader_fits_cache() :
 *  Whether a load of every stored tensor byte of the checkpoint fits in
 *  memory by CKPTIO_LOAD_AUTO's rule (at most half of what this process can
 *  still take: MemAvailable, or its memory cgroup's limit less its usage),
 *  so that reading it through the page cache, which then keeps it, is
 *  what AUTO does with it cold. What a caller choosing between
 *  ckptio_reader_map_private (the page cache's pages, shared, cached for
 *  the next load) and an O_DIRECT copy asks of a cold file. Since 1.1
 *  (symbol version CKPTIO_1.1). @return 1, 0, or CKPTIO_E_INVALID_ARG. */
int ckptio_reader_fits_cache(ckptio_reader *r);

/* ------------------------------------------------------ group loads (1.1) */

/* ckptio_reader_load_boxes_group's flags. */
#define CKPTIO_GROUP_EXCHANGE 1u /* alltoallv even where the ranks share a machine (below) */

/*! ckptio_reader_load_boxes_group() :
 *  Collective over `comm` (every rank calls it, with the same checkpoint
 *  opened, each with its own boxes: whole tensors, slices, any mix, none):
 *  every stored byte that any rank needs is read from storage once for the
 *  group, and every rank gets exactly the bytes of its boxes.
 *  Three ways, chosen alike on every rank from what they all report:
 *  - Ranks on one machine (one kernel boot id) that opened one local file
 *    (one device and inode) that fits in the page cache by
 *    CKPTIO_LOAD_AUTO's rule, on every rank, share that page cache: each
 *    rank loads its own boxes through it (PREAD), and the kernel reads
 *    each page from storage once for all of them; nothing is exchanged.
 *  - Otherwise the stored parts needed are ordered as they lie in the
 *    files and split between the ranks by bytes in contiguous spans; a
 *    part is read whole by one rank (a cold local file by O_DIRECT, so no
 *    read-ahead runs into another rank's span), which checks its CRC32 (a
 *    part that some rank needs only a corner of is still read whole: its
 *    CRC is what makes the others' bytes trustworthy), in rounds of at
 *    most about `staging_bytes` per rank (0: 256 MiB; the smallest of the
 *    ranks' values), the read of the next round beside the moving of this
 *    one. Ranks on one machine (an object storage's object, a copy of the
 *    file per rank, a file too large for the cache) move bytes through
 *    two windows of shared memory (a POSIX shared memory object, sized
 *    first, unlinked once every rank has it): each rank reads into its
 *    region and copies its boxes' bytes from every region, each received
 *    byte copied once. Ranks on several machines, ranks that cannot share
 *    memory (every rank falls back alike), or CKPTIO_GROUP_EXCHANGE:
 *    each rank sends every other rank exactly the bytes of its boxes
 *    (ckptio_comm's alltoallv), reading a part straight into its own box
 *    when the box holds it contiguous on the host.
 *  Failures are the group's: a bad box, a missing tensor, another
 *  checkpoint opened on some rank (its tensors, shapes, parts or CRCs
 *  differ), a failed read or CRC on the reading rank, or a failed
 *  collective stop every rank after the round in flight, and every rank
 *  returns an error naming the failed rank and its cause (CKPTIO_E_RANK
 *  on the others; the failed rank its own code); then no box counts as
 *  loaded (their contents are unspecified). A rank that dies is the
 *  communicator's to report: the call returns when its collective does
 *  (MPI ends the job; torch.distributed's collectives time out).
 *  Boxes land on the host or a GPU as in ckptio_reader_load_boxes;
 *  `verified` says every stored part the box touches had its CRC checked
 *  (by whichever rank read it); `bytes_read` counts what this rank read:
 *  sharing a page cache, its boxes' bytes and the parts they cut (read
 *  whole from the cache to check their CRCs); otherwise what it read for
 *  the group, all of it under its first box (a rank with no box reads its
 *  share too, and has nowhere to report it). ckptio_reader_stats and
 *  progress count what landed in this rank's boxes.
 *  @comm  with alltoallv (a 1.0 communicator is refused); its allgather
 *         and alltoallv are called from this thread only.
 *  @flags 0, or CKPTIO_GROUP_EXCHANGE.
 *  @return 0, CKPTIO_E_RANK, CKPTIO_E_INVALID_ARG, or this rank's own
 *          failure (the codes of ckptio_reader_load_boxes, -ENOMEM). */
int ckptio_reader_load_boxes_group(ckptio_reader *r, const ckptio_comm *comm, ckptio_box_request *reqs, size_t n,
                                   uint64_t staging_bytes, unsigned flags);

/* ------------------------------------------------ nested PyTorch objects */

/* Why experimental: a save of any object torch.save would write (nested
 * containers, scalars, views and shared storages), the caller pickling
 * it, is new in 1.1; its reading half is the open_flags bit
 * CKPTIO_OPEN_TORCH_RECORDS. Both serve ckptio.torch.save_checkpoint and
 * load_checkpoint. */

/*! ckptio_writer_set_torch_pickle() :
 *  For a writer of one CKPTIO_FORMAT_PYTORCH file, before commit: the
 *  archive's data.pkl is pickle[0, len) (copied) instead of the
 *  OrderedDict of the tensors added, and the tensors added are its storage
 *  records, in order: the i-th added (counting from 0) is record
 *  "data/<i>", its bytes written as they are (dtype and shape only say
 *  how many). The pickle's persistent ids, ('storage', class, "<i>",
 *  location, numel) as torch.save writes them, must name exactly those
 *  records with their byte counts. At commit the pickle is run on ckptio's
 *  safe reader: anything outside torch's weights_only allowlist, or a
 *  storage that is not an added tensor of its size, fails the save
 *  before a byte is written (CKPTIO_E_PICKLE, CKPTIO_E_INVALID_ARG).
 *  @return 0; CKPTIO_E_INVALID_ARG (another kind of writer, pickle NULL);
 *          CKPTIO_E_STATE (committed already); -ENOMEM. */
int ckptio_writer_set_torch_pickle(ckptio_writer *w, const void *pickle, size_t len);
/*! ckptio_map_free() :
 *  Releases a mapping of ckptio_reader_map_private. Accepts NULL. @return 0 or -errno. */
int ckptio_map_free(void *base, uint64_t size);

/* ---------------------------------------------------------------- slices */

/* Why experimental: the file bytes behind a slice, for loaders that
 * schedule their own reads, expose the layout (shard numbers, compressed
 * frames, PyTorch storages), refuse the split tensors of a multi-rank
 * checkpoint and take one dimension where loads take boxes. */
/* A range of bytes of a checkpoint's file. */
typedef struct ckptio_byte_range {
  uint32_t file;       /* which file: 0 for a single file, else the shard number
                          (ckptio_reader_shard gives its path) */
  uint64_t offset;     /* absolute offset in that file */
  uint64_t length;
} ckptio_byte_range;

/*! ckptio_reader_slice_ranges() :
 *  The bytes of the file that the slice start:stop of `dim` of tensor
 *  `index` is read from: (file, offset, length) ranges in the order of the
 *  slice's bytes, adjacent ones merged. For a plain tensor they are sorted
 *  and disjoint; for a PyTorch view they are the storage bytes its elements
 *  live in (several ranks of a broadcast view may share them). The first
 *  min(count, cap) ranges go to `ranges`; ask the count first with cap 0
 *  (ranges may then be NULL).
 *  For a compressed file the ranges are the zstd frames holding the slice
 *  (each frame is read and decompressed whole, so neighbouring ranks may
 *  share a frame).
 *  @return the number of ranges (>= 0), or the codes of
 *          ckptio_reader_slice_nbytes. */
int64_t ckptio_reader_slice_ranges(ckptio_reader *r, size_t index, int dim, int64_t start,
                                   int64_t stop, ckptio_byte_range *ranges, size_t cap);

/*! ckptio_reader_plan_rank() :
 *  What rank `rank` of `nranks` reads of tensor `index` split on `dim`:
 *  ckptio_split_rank on shape[dim] gives *start / *stop (either may be
 *  NULL), then ckptio_reader_slice_ranges of that slice. Loading that slice
 *  with ckptio_reader_load_slices reads exactly these ranges (PREAD).
 *  @return the number of ranges, or a negative code. */
int64_t ckptio_reader_plan_rank(ckptio_reader *r, size_t index, int dim, int rank, int nranks,
                                int64_t *start, int64_t *stop, ckptio_byte_range *ranges,
                                size_t cap);

/* ---------------------------------------------------------------- storage */

/* Why experimental: the table is code the caller writes, new since 0.2.0,
 * and what the library asks of it is still growing (list, remove and sweep
 * came after the rest, for sharded saves and the manager): a verb added or
 * a contract changed (what sweep may touch, which verb runs on which
 * thread) breaks a storage in a way its size field cannot catch. */
/* A storage is a table of verbs and the caller's `self` handed back to
 * each. The pipelines use them for every byte they move to or from an
 * object (the paths it serves: see "storage" above).
 *
 * Contract of the verbs. Each returns 0 or a negative ckptio code or
 * -errno (-ENOENT: no such object), and on failure writes a sentence into
 * err (errlen bytes) naming the object and the cause.
 *  open_read   the object `path` (the whole string, scheme included):
 *              *obj (the storage's handle) and its size in bytes. Called
 *              from the thread opening a reader.
 *  read        exactly len bytes at offset into buf (the caller's memory,
 *              len bytes); anything short is an error. Called from many
 *              workers at once on one obj, for ranges inside its size:
 *              must be thread-safe.
 *  close_read  releases obj; called once, after every read has returned.
 *  create      a new object `path` of exactly `size` bytes (known before
 *              any byte is written), invisible until publish: *obj. The
 *              bytes come in chunks of `chunk` bytes: ranges
 *              [k * chunk, min((k + 1) * chunk, size)).
 *  write       one such chunk at offset, len bytes from buf (borrowed for
 *              the call); each chunk exactly once, in any order, from many
 *              workers at once: must be thread-safe.
 *  publish     every chunk written: make the object visible whole,
 *              replacing an older one of the path atomically (a reader sees
 *              the old object or the new, never a mix), durable when it
 *              returns (what "durable" means is the storage's: S3's
 *              CompleteMultipartUpload; a file's fsync and rename). Frees
 *              obj whether it succeeds or not (a failed publish leaves the
 *              path as it was, and undoes what it started).
 *  abandon     nothing is published, the path keeps what it had (an S3
 *              multipart upload is aborted, so no part stays stored); frees
 *              obj. Called instead of publish after any failure.
 *  list        calls fn(arg, path, size) for every published object whose
 *              path starts with `prefix` (a whole path, scheme included),
 *              in any order; fn's nonzero return stops the walk and is
 *              returned. What a sharded save cleans up by.
 *  remove      deletes the published object `path`; a path that is not
 *              there is not an error.
 *  sweep       abandons every unpublished object under `prefix` (what saves
 *              that died before publish or abandon left stored): called by
 *              a save after its own publish, so it must not touch what is
 *              published. Saves of the same set or file from two processes
 *              at once are not supported: one may sweep the other's.
 * The write verbs (create, write, publish, abandon) may all be NULL for a
 * read-only storage (saves to it are refused); list, remove and sweep may
 * be NULL (a sharded save then leaves the files of older saves and
 * crashed ones in place). The table is versioned (its `size` first, the
 * rule above): set size = sizeof(ckptio_storage_ops). */
typedef struct ckptio_storage_ops {
  size_t size;
  int (*open_read)(void *self, const char *path, void **obj, uint64_t *size, char *err, size_t errlen);
  int (*read)(void *self, void *obj, void *buf, size_t len, uint64_t offset, char *err, size_t errlen);
  void (*close_read)(void *self, void *obj);
  int (*create)(void *self, const char *path, uint64_t size, uint64_t chunk, void **obj, char *err, size_t errlen);
  int (*write)(void *self, void *obj, const void *buf, size_t len, uint64_t offset, char *err, size_t errlen);
  int (*publish)(void *self, void *obj, char *err, size_t errlen);
  void (*abandon)(void *self, void *obj);
  int (*list)(void *self, const char *prefix, int (*fn)(void *arg, const char *path, uint64_t size), void *arg,
              char *err, size_t errlen);
  int (*remove)(void *self, const char *path, char *err, size_t errlen);
  int (*sweep)(void *self, const char *prefix, char *err, size_t errlen);
} ckptio_storage_ops;

/*! ckptio_path_scheme() : (experimental)
 *  The length of `path`'s scheme when it is a storage's path: 2 for
 *  "s3://bucket/key", 0 for a local path (and for NULL). A scheme is RFC
 *  3986's (a letter, then letters, digits, '+', '-' or '.') followed by
 *  "://"; every path the library opens is routed by this rule, so a
 *  program that tells a local path from an object's asks it here. */
size_t ckptio_path_scheme(const char *path);

/*! ckptio_ctx_storage_register() :
 *  Routes paths "SCHEME://..." opened on this context to `ops` (copied) and
 *  `self` (borrowed: it must outlive the context). Replaces a storage
 *  registered before for the scheme, "s3" included. Not thread-safe
 *  against opens on the same context: register first.
 *  @return 0, or CKPTIO_E_INVALID_ARG (a scheme not of letters, digits,
 *          '+', '-', '.' or longer than 31 bytes, "file", ops NULL or
 *          missing a read verb, some but not all write verbs, ops->size
 *          refused), -ENOMEM (more than 16
 *          schemes); the reason in ckptio_last_open_error. */
int ckptio_ctx_storage_register(ckptio_ctx *ctx, const char *scheme, const ckptio_storage_ops *ops, void *self);

/*! ckptio_ctx_storage() : (experimental)
 *  The storage that serves `path` on this context: its verbs and its
 *  `self`, so that code built on the public API calls the very verbs the
 *  library calls (the checkpoint manager lists, removes and sweeps a
 *  storage's objects so). The built-in S3 storage is made here when `path`
 *  is the context's first s3:// path. *ops is the context's copy of the
 *  table (its size field is this library's); both are borrowed until the
 *  context is freed or the scheme is registered again. Thread-safe against
 *  opens on the same context.
 *  @return 1 and *ops, *self; 0 when `path` is a local file (no
 *          "SCHEME://"; *ops and *self NULL); or a negative code with a
 *          sentence naming the path in err (errlen bytes; err may be NULL):
 *          CKPTIO_E_INVALID_ARG (a NULL argument, no storage registered for
 *          the scheme), CKPTIO_E_FORMAT (s3:// in a build without libcurl),
 *          the S3 storage's own (no credentials), -ENOMEM. */
int ckptio_ctx_storage(ckptio_ctx *ctx, const char *path, const ckptio_storage_ops **ops, void **self, char *err,
                       size_t errlen);

/* ---------------------------------------------------------------- tracing */

/* Why experimental: new in 1.1; the stages' names and the args of
 * their events may change as profiles ask for more. */

/*! ckptio_trace_start() : (experimental)
 *  Writes the stages of every save and load of this process (a chunk's
 *  snapshot, CRC, write, the commit; a load's open, reads, copies to a
 *  GPU, CRC check), each on the thread that ran it, to `path` in the
 *  Chrome trace-event format: a JSON array that Perfetto
 *  (ui.perfetto.dev) and chrome://tracing open. The file is complete once
 *  ckptio_trace_stop returns, or at the process's exit. Setting
 *  CKPTIO_TRACE=path in the environment does the same from the process's
 *  first ckptio_ctx_create. Each "%p" in path is the process id: processes
 *  that share the variable (ranks, spawned workers) write a file each.
 *  One trace at a time per process; a child of fork writes none unless it
 *  starts its own. Thread-safe.
 *  @return 0, CKPTIO_E_INVALID_ARG (path NULL, "" or, expanded, longer
 *          than 4095 bytes), CKPTIO_E_STATE (a
 *          trace is already being written), -errno (creating the file). */
int ckptio_trace_start(const char *path);

/*! ckptio_trace_stop() : (experimental)
 *  Ends the trace: its last events and the array's end are written and the
 *  file closed. Stages still running are left out.
 *  @return 0, CKPTIO_E_STATE (no trace), or the -errno of the first write
 *          of the trace that failed (the file is then incomplete). */
int ckptio_trace_stop(void);

/* ------------------------------------------------------------ tiers */

/* Why experimental: new in 1.1 (see docs/TIERS.md).
 *
 * Multi-rank checkpoints kept in tiers, restored from the fastest that
 * holds a whole, verified step. Each rank's part (its tensors, one
 * safetensors file with CRC32s) goes, at every save, to:
 *   memory   MEMORY_DIR/step-N/rank-R.safetensors, a node-local directory
 *            (a tmpfs such as /dev/shm/JOB): it survives the process, not
 *            the machine;
 *   peers    `peers` copies in the memory directories of ranks on other
 *            nodes (the k-th copy of rank R is held by rank
 *            (R + k * ranks_per_node) mod nranks, as copy-R.safetensors),
 *            sent over the communicator's alltoallv;
 *   durable  every `durable_every`-th step, DURABLE_DIR/step-N/rank-R.
 *            safetensors (a local or shared directory, fsync'd);
 *   storage  every `storage_every`-th step, the object STORAGE_DIR/step-N/
 *            rank-R.safetensors of a storage (s3://bucket/job, or a scheme
 *            registered on the context), uploaded from the rank's file in
 *            a faster tier (or written there when it is the only tier due).
 * A step counts as published in a tier once every rank's part of it is
 * there, agreed by all ranks: then each rank marks the step in its tier
 * directories (a file PUBLISHED; in storage, one object PUBLISHED that
 * rank 0 writes) and retires the steps beyond the tier's `keep`. A crash at any point before the marks leaves the step unmarked
 * and the older steps as they were.
 *
 * The restore is collective: the ranks gather which published copies each
 * holds, take the newest step whose every part has a holder, and each part
 * comes from the fastest (its rank's own memory, a peer's copy sent over
 * the communicator, the durable directory, the storage), its every CRC32
 * checked before the path is handed out. A copy that fails its check is skipped with a
 * warning naming the rank, the step and the tier, and the next holder, an
 * older step or a lower tier serves. The ranks must be as many as at the
 * save (same nranks and ranks_per_node); steps saved with places
 * (ckptio_tiers_save_placed) restore at any number of ranks from the
 * durable or the storage tier (ckptio_tiers_restore_global). */

typedef struct ckptio_tiers ckptio_tiers;

/* Versioned (see "Versioned structs"): start from CKPTIO_TIERS_OPTIONS_INIT. */
typedef struct ckptio_tiers_options {
  size_t size;               /* sizeof(ckptio_tiers_options) */
  const char *memory_dir;    /* node-local directory, created if missing; NULL: no memory tier */
  int memory_keep;           /* steps kept in memory (own parts and copies); >= 1 */
  int peers;                 /* copies of each part on other nodes; needs memory_dir and
                              * peers < nranks / ranks_per_node */
  int ranks_per_node;        /* node of rank R: R / ranks_per_node; divides nranks */
  const char *durable_dir;   /* created if missing; NULL: no durable tier */
  int durable_every;         /* durable save when step % durable_every == 0; >= 1 */
  int durable_keep;          /* steps kept there; >= 1 */
  int fatal;                 /* 0: a failing tier warns and the save returns 0 (training goes
                              * on; the tier is tried again at the next step); 1: it fails */
  int background;            /* 1: a save returns at its snapshot point and a thread of the
                              * handle fills the tiers and publishes (calling the communicator
                              * and the warning callback from that thread); 0: it returns
                              * when every tier is published */
  const char *storage_dir;   /* a storage's prefix ("s3://bucket/job"); NULL: no storage tier */
  int storage_every;         /* storage save when step % storage_every == 0; >= 1 */
  int storage_keep;          /* steps kept there; >= 1 */
} ckptio_tiers_options;
#define CKPTIO_TIERS_OPTIONS_INIT { sizeof(ckptio_tiers_options), NULL, 2, 0, 1, NULL, 1, 2, 0, 0, NULL, 1, 2 }

/* The tiers a restore can take a part from, fastest first. */
typedef enum ckptio_tier {
  CKPTIO_TIER_MEMORY = 0,  /* the rank's own memory directory */
  CKPTIO_TIER_PEER = 1,    /* a copy held by another rank */
  CKPTIO_TIER_DURABLE = 2,
  CKPTIO_TIER_STORAGE = 3,
  CKPTIO_TIERS = 4
} ckptio_tier;

/* What this rank's handle did. Versioned: start from CKPTIO_TIERS_STATS_INIT. */
typedef struct ckptio_tiers_stats {
  size_t size;                         /* sizeof(ckptio_tiers_stats) */
  uint64_t saved_bytes[CKPTIO_TIERS];  /* written by this rank per tier (peer: copies received) */
  uint64_t restored_bytes[CKPTIO_TIERS]; /* read by this rank's last restore per tier */
  uint64_t skipped_copies;             /* copies a restore found damaged */
  uint64_t failed_tier_saves;          /* tier saves that failed and were skipped */
} ckptio_tiers_stats;
#define CKPTIO_TIERS_STATS_INIT { sizeof(ckptio_tiers_stats), {0}, {0}, 0, 0 }

/* Receives each warning: a tier's save that failed, a copy skipped by a
 * restore. step is the step concerned, tier a ckptio_tier. */
typedef void (*ckptio_tiers_warn_fn)(void *arg, uint64_t step, int tier, int code, const char *message);

/*! ckptio_tiers_open() : (experimental)
 *  Not collective. @comm copied (callbacks borrowed until close; the peer
 *  tier and restores from peers need its alltoallv). @opts copied (the
 *  directories too). @return 0 and *out, or CKPTIO_E_INVALID_ARG with the
 *  reason in ckptio_last_open_error (no tier, a bad count, peers that
 *  cannot land on another node, a storage_dir that is a local path or
 *  whose storage cannot write, list and remove), the storage's own code
 *  (ckptio_ctx_storage: no credentials), -errno creating a directory. */
int ckptio_tiers_open(ckptio_ctx *ctx, const ckptio_comm *comm, const ckptio_tiers_options *opts,
                      ckptio_tiers **out);

/*! ckptio_tiers_set_warning() :
 *  Where warnings go (NULL: dropped; ckptio_tiers_last_error keeps the last). */
void ckptio_tiers_set_warning(ckptio_tiers *t, ckptio_tiers_warn_fn fn, void *arg);

/*! ckptio_tiers_save() : (experimental)
 *  Collective: saves this rank's `n` tensors (host or device memory,
 *  borrowed until the call returns) as its part of `step` into every tier
 *  due at this step, then agrees and publishes as above. Steps must grow.
 *  The part is written by one writer of the context (into the memory tier
 *  when there is one, else the durable tier; the durable part is then a
 *  copy of the memory one), so the call returns at that writer's snapshot
 *  point when `background` is set: with the context's snapshot memory as
 *  large as the part (ckptio_options.snapshot_bytes), after one copy of
 *  the tensors; without it, once the ring has taken them all. In
 *  background mode a save first waits for the previous one's finish; the
 *  communicator must then take calls from the handle's thread while the
 *  program's own threads run (MPI: MPI_THREAD_MULTIPLE and a communicator
 *  only ckptio uses, MPI_Comm_dup).
 *  @return 0 (with fatal 0 also when a tier failed: it is then not
 *          published for this step, and a warning says why; in background
 *          mode, also when the finish is still running), or the first
 *          failure (fatal 1, or every tier failed; in background mode with
 *          fatal 1, the previous save's failure), the reason in
 *          ckptio_tiers_last_error. */
int ckptio_tiers_save(ckptio_tiers *t, uint64_t step, const ckptio_tensor *tensors, size_t n);

/* Where one tensor of a rank's part lies in the job's global tensor of its
 * name: dimension d covers [offsets[d], offsets[d] + shape[d]) of
 * global_shape[d], as for ckptio_writer_add_part (a tensor every rank holds
 * whole and alike: offsets 0 and global_shape its shape). */
typedef struct ckptio_tiers_place {
  int64_t global_shape[CKPTIO_MAX_DIMS];
  int64_t offsets[CKPTIO_MAX_DIMS];
} ckptio_tiers_place;

/*! ckptio_tiers_save_placed() : (experimental)
 *  ckptio_tiers_save with where each tensor lies in the job's global
 *  tensors (places[i] for tensors[i]), so that the durable and storage
 *  tiers' steps can be restored at another world size
 *  (ckptio_tiers_restore_global). Those tiers then hold such a step as a
 *  multi-rank checkpoint (ckptio_writer_open_ranks' layout,
 *  docs/FORMATS.md: DIR/step-N/model-KKKKK-of-MMMMM.safetensors, rank R's
 *  part as file R + 1, and the index model.safetensors.index.json), made
 *  from the part's file in the memory tier (without one, from its file on
 *  the durable tier, removed after; a storage tier due with neither fails
 *  for that step). Its collective checks (the same global shape and dtype
 *  on every rank, parts covering each tensor exactly) fail that tier for
 *  that step, not the others. The other tiers, and restores at the same
 *  world size, are as for ckptio_tiers_save. @return as ckptio_tiers_save;
 *  CKPTIO_E_INVALID_ARG for a box outside its global shape. */
int ckptio_tiers_save_placed(ckptio_tiers *t, uint64_t step, const ckptio_tensor *tensors,
                             const ckptio_tiers_place *places, size_t n);

/*! ckptio_tiers_restore_global() : (experimental)
 *  Collective, at any world size (a job restarted on more or fewer ranks
 *  opens its handle with its own nranks): takes the newest step saved with
 *  places that the durable tier or the storage holds (the durable tier's
 *  when both do), has its every CRC32 checked (each rank checks a share of
 *  its files; a damaged or missing one skips that tier's step with a
 *  warning naming the file, and the other tier's copy or an older step
 *  serves), and puts the step directory's path (or the storage's prefix,
 *  s3://...) in path[0, len): open it with
 *  ckptio_reader_open (crc 0 skips a second check) and load this rank's
 *  boxes with ckptio_reader_load_boxes.
 *  @return 0 and *step; -ENOENT when no such step is whole; another
 *          negative code when the restore itself failed (the communicator),
 *          the reason in ckptio_tiers_last_error. */
int ckptio_tiers_restore_global(ckptio_tiers *t, uint64_t *step, char *path, size_t len);

/*! ckptio_tiers_wait() : (experimental)
 *  Collective in background mode: waits for the last save's finish.
 *  @return what ckptio_tiers_save would have returned for it without
 *          background (0 when there is none). */
int ckptio_tiers_wait(ckptio_tiers *t);

/*! ckptio_tiers_restore() : (experimental)
 *  Collective: finds the newest step restorable as described above and
 *  makes this rank's part of it a verified file: its path (in the memory
 *  directory when a peer sent it or it was downloaded from the storage,
 *  else where it was found: the storage's object itself when there is no
 *  memory tier) goes to path[0, len), to open with ckptio_reader_open.
 *  Every CRC32 of it has just been checked: open it with crc 0 to skip a
 *  second pass.
 *  @return 0 and *step; -ENOENT when no step is whole anywhere (nothing
 *          published, or every holder lost or damaged); another negative
 *          code when the restore itself failed (the communicator, memory),
 *          the reason in ckptio_tiers_last_error. */
int ckptio_tiers_restore(ckptio_tiers *t, uint64_t *step, char *path, size_t len);

/* Where ckptio_tiers_restore_load puts one tensor of this rank's part. */
typedef struct ckptio_tiers_dest {
  const char *name;    /* the tensor's name in the part */
  void *dst;           /* memory of `device`, written, never kept */
  uint64_t dst_bytes;  /* at least the tensor's bytes */
  int device;          /* CKPTIO_DEVICE_HOST or CKPTIO_DEVICE_CUDA(n) */
} ckptio_tiers_dest;

/*! ckptio_tiers_restore_load() : (experimental)
 *  ckptio_tiers_restore, loading this rank's part straight into `dests`
 *  instead of handing out its path: one pass over the part, each named
 *  tensor's CRC32 checked as it lands (ckptio_tiers_restore's own check
 *  pass and the caller's load become one; a part from the storage is read
 *  once, straight from its object). A part that fails a check, or
 *  lacks a named tensor, is skipped as a damaged copy is (a warning; the
 *  next holder, an older step or a lower tier, whose bytes then overwrite
 *  the destinations); tensors of the part not named are neither loaded nor
 *  checked. @return as ckptio_tiers_restore. */
int ckptio_tiers_restore_load(ckptio_tiers *t, uint64_t *step, const ckptio_tiers_dest *dests, size_t n);

/*! ckptio_tiers_stats_get() :
 *  Copies this handle's counters into *out (out->size set by the caller). */
int ckptio_tiers_stats_get(const ckptio_tiers *t, ckptio_tiers_stats *out);

/* One file of a tier directory, as ckptio_tiers_list finds it. Not
 * versioned: an output array, which may change while experimental. */
typedef struct ckptio_tiers_file {
  uint64_t step;
  int rank;          /* whose part */
  int copy;          /* 1: a copy held for that rank (copy-R), 0: the rank's own part (rank-R) */
  int published;     /* 1: its step is marked for it (PUBLISHED for parts, COPIES for copies) */
  uint64_t bytes;
  char path[4096];
} ckptio_tiers_file;

/*! ckptio_tiers_list() : (experimental)
 *  The parts and copies in the step directories of a tier directory (a
 *  node's memory directory or a durable one) or of a storage tier's prefix
 *  (s3://bucket/job: its parts, through the storage `ctx` serves it by; ctx
 *  may be NULL for a directory), by step, then parts before copies, then
 *  rank. Not collective; reads only.
 *  @return the count, *out malloc'd (free() it; NULL when 0), or -errno
 *          (-ENOENT: no such directory), CKPTIO_E_INVALID_ARG (a storage's
 *          prefix without ctx), or the storage's code. */
int64_t ckptio_tiers_list(ckptio_ctx *ctx, const char *dir, ckptio_tiers_file **out);
/*! ckptio_tiers_last_error() :
 *  The last error or warning of this handle ("" if none). Borrowed. */
const char *ckptio_tiers_last_error(const ckptio_tiers *t);
/*! ckptio_tiers_close() :
 *  Waits for the last save's finish first (collective then, in background
 *  mode, when one is running). Accepts NULL. */
void ckptio_tiers_close(ckptio_tiers *t);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif /* CKPTIO_EXPERIMENTAL */
