/* plfs: a FUSE filesystem that forgets, on command, everything that was not
 * made durable — the power-loss test's disk (powerloss_test.py).
 *
 * It passes every operation through to a backing directory and keeps, beside
 * it, what a disk that lost power would still hold:
 *   - a file's data is durable as of its last fsync / fdatasync (its content
 *     before that is kept in the shadow directory from the first change after
 *     a sync, so "the durable bytes" always exist somewhere);
 *   - a directory's entries (create, rename, unlink, link, mkdir, rmdir) are
 *     durable as of the last fsync of that directory, as one snapshot of its
 *     names and the nodes they point to.
 * Nothing else makes anything durable: not close, not sync_file_range, not
 * an fsync of another file. That is the strictest reading of POSIX (a
 * journaling filesystem often persists more), so a save that survives here
 * does not lean on any filesystem's generosity.
 *
 * Control: the file /.plfs (hidden from listings). Reading it gives
 * "syncs=N frozen=F blocked=B cut=C"; writing it one of
 *   freeze          the power is gone: every later call that would change
 *                   something (a write, a create, a rename, an fsync...)
 *                   blocks until cut, so nothing after this instant reaches
 *                   the disk or the cut's torn and reordered states;
 *   freeze-at N     the same from the N-th durability call on (counted from
 *                   the mount; the N-th itself blocks and is not durable);
 *   cut [torn S]    the backing directory is replaced by the durable state;
 *                   blocked calls return EIO, and so does every later call
 *                   that would change something (reads go on).
 *                   "torn S" (S: a seed) keeps, of each file whose unsynced
 *                   writes are lost, a random set of its 4 KiB pages from
 *                   the unsynced content and a random one of the two sizes:
 *                   any subset of unsynced writes may have reached the disk.
 *   cut reorder S   also applies, in each directory, a random subset of the
 *                   entry changes made since its last fsync (each change
 *                   whole, in their order, skipped where it no longer
 *                   applies): a filesystem may persist any of them early,
 *                   e.g. an unlink without the rename before it.
 *                   "cut torn reorder S" does both.
 * The test then kills the saving process (whose durability call may be
 * blocked), unmounts and mounts again on the same backing directory; a new
 * mount takes everything there as durable.
 *
 * usage: plfs BACKING SHADOW MOUNTPOINT [fuse options]
 * SHADOW must be an empty directory on BACKING's filesystem (hard links and
 * renames between the two). */
#define FUSE_USE_VERSION 31
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONTROL "/.plfs"
#define PAGE 4096

enum kind { K_FILE, K_DIR };
/* Where a file's durable content is: none yet (a new file: empty), the live
 * backing file itself (unchanged since its last sync), or shadow/<id>. */
enum durable { D_NONE, D_LIVE, D_COPY };

typedef struct entry {
  char *name;
  int node;
} entry;

/* An entry change not yet made durable by an fsync of its directory. */
enum nsop_kind { OP_ADD, OP_DEL, OP_RENAME, OP_EXCHANGE };
typedef struct nsop {
  enum nsop_kind kind;
  char *a, *b; /* names (b: a rename's or an exchange's second) */
  int node;    /* OP_ADD: what the name points to */
} nsop;

typedef struct node {
  enum kind kind;
  enum durable state;  /* files */
  ino_t ino;           /* of the live backing inode; 0 once it has no name */
  int writers;         /* open for writing through the mount */
  entry *entries;      /* directories: the durable snapshot of the entries */
  size_t nentries;
  nsop *pending;       /* directories: changes since that snapshot */
  size_t npending;
} node;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cut_cv;
  int backing, shadow; /* directory fds */
  node *nodes;
  size_t nnodes, cap;
  uint64_t syncs, freeze_at;
  int frozen, blocked, cut;
} fs = {.mu = PTHREAD_MUTEX_INITIALIZER, .cut_cv = PTHREAD_COND_INITIALIZER};

/* The node each open backing fd belongs to (its inode may lose its name
 * while open). */
#define MAX_FDS 65536
static int fd_node[MAX_FDS];

/* Paths are NULL for operations on a file whose name is gone (hard_remove). */
static int is_control(const char *path) { return path && !strcmp(path, CONTROL); }

static const char *rel(const char *path) { return path[1] ? path + 1 : "."; }

static int new_node(enum kind kind, ino_t ino, enum durable state) {
  if (fs.nnodes == fs.cap) {
    fs.cap = fs.cap ? 2 * fs.cap : 256;
    fs.nodes = realloc(fs.nodes, fs.cap * sizeof(node));
    if (!fs.nodes) abort();
  }
  /* An inode number the backing filesystem hands out again names a new file:
   * the node that had it keeps only its durable past. */
  for (size_t i = 0; i < fs.nnodes; i++)
    if (fs.nodes[i].ino == ino) fs.nodes[i].ino = 0;
  fs.nodes[fs.nnodes] = (node){.kind = kind, .state = state, .ino = ino};
  return (int)fs.nnodes++;
}

static int find_ino(ino_t ino) {
  for (size_t i = 0; i < fs.nnodes; i++)
    if (fs.nodes[i].ino == ino) return (int)i;
  return -1;
}

/* The node behind a live backing path (one is made for a file the mount did
 * not create, taken as durable as it is). */
static int node_at(const char *relpath) {
  struct stat st;
  if (fstatat(fs.backing, relpath, &st, AT_SYMLINK_NOFOLLOW) != 0) return -errno;
  int n = find_ino(st.st_ino);
  return n >= 0 ? n : new_node(S_ISDIR(st.st_mode) ? K_DIR : K_FILE, st.st_ino, D_LIVE);
}

static int copy_fd(int from, int to) {
  char buf[1 << 16];
  off_t off = 0;
  for (;;) {
    ssize_t n = pread(from, buf, sizeof(buf), off);
    if (n < 0) return -errno;
    if (n == 0) return 0;
    if (write(to, buf, (size_t)n) != n) return -EIO;
    off += n;
  }
}

static void shadow_name(int n, char *out, size_t len) { snprintf(out, len, "n%d", n); }

/* Keeps node n's durable content in the shadow directory before its live
 * copy changes or loses its last name. */
static int keep_durable(int n, int live_fd, const char *live_rel) {
  node *x = &fs.nodes[n];
  if (x->kind != K_FILE || x->state != D_LIVE) return 0;
  char name[32];
  shadow_name(n, name, sizeof(name));
  unlinkat(fs.shadow, name, 0);
  /* A hard link is the content for free, unless someone can still write it. */
  if (live_rel && x->writers == 0 && linkat(fs.backing, live_rel, fs.shadow, name, 0) == 0) {
    x->state = D_COPY;
    return 0;
  }
  int from = live_fd >= 0 ? live_fd : openat(fs.backing, live_rel, O_RDONLY);
  if (from < 0) return -errno;
  int to = openat(fs.shadow, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = to < 0 ? -errno : copy_fd(from, to);
  if (to >= 0) close(to);
  if (live_fd < 0) close(from);
  if (rc == 0) x->state = D_COPY;
  return rc;
}

/* Before a path loses its name (unlink, or a rename over it): a file whose
 * last link goes keeps its durable content. *gone: the node that stops
 * being live once the call succeeds (-1: none). */
static int before_unname(const char *relpath, int *gone) {
  struct stat st;
  *gone = -1;
  if (fstatat(fs.backing, relpath, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  int n = find_ino(st.st_ino);
  if (n < 0 || (S_ISREG(st.st_mode) && st.st_nlink > 1)) return 0;
  int rc = keep_durable(n, -1, relpath);
  if (rc == 0) *gone = n;
  return rc;
}

/* ---------------------------------------------------------------- durability */

/* Waits while the power is off (from the freeze to the cut); 0 to go on. */
static int power_gate(void) {
  if (!fs.frozen && !fs.cut) return 0;
  fs.blocked++;
  while (!fs.cut) pthread_cond_wait(&fs.cut_cv, &fs.mu);
  fs.blocked--;
  return -EIO;
}

/* A durability call: counted, and the N-th of freeze-at cuts the power. */
static int durability_gate(void) {
  fs.syncs++;
  if (fs.freeze_at && fs.syncs >= fs.freeze_at) fs.frozen = 1;
  return power_gate();
}

static void free_entries(node *x) {
  for (size_t i = 0; i < x->nentries; i++) free(x->entries[i].name);
  free(x->entries);
  x->entries = NULL;
  x->nentries = 0;
}

static void clear_pending(node *x) {
  for (size_t i = 0; i < x->npending; i++) {
    free(x->pending[i].a);
    free(x->pending[i].b);
  }
  free(x->pending);
  x->pending = NULL;
  x->npending = 0;
}

/* Records an entry change of the directory holding path (a FUSE path). */
static void record(enum nsop_kind kind, const char *path, const char *path_b, int child) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  *slash = 0;
  int d = node_at(dir[0] ? dir + 1 : ".");
  if (d < 0) return;
  node *x = &fs.nodes[d];
  x->pending = realloc(x->pending, (x->npending + 1) * sizeof(nsop));
  if (!x->pending) abort();
  x->pending[x->npending++] =
      (nsop){kind, strdup(strrchr(path, '/') + 1), path_b ? strdup(strrchr(path_b, '/') + 1) : NULL, child};
}

static entry *entry_named(node *x, const char *name) {
  for (size_t i = 0; i < x->nentries; i++)
    if (!strcmp(x->entries[i].name, name)) return &x->entries[i];
  return NULL;
}

static void set_entry(node *x, const char *name, int child) {
  entry *e = entry_named(x, name);
  if (e) {
    e->node = child;
    return;
  }
  x->entries = realloc(x->entries, (x->nentries + 1) * sizeof(entry));
  if (!x->entries) abort();
  x->entries[x->nentries++] = (entry){strdup(name), child};
}

static void drop_entry(node *x, const char *name) {
  entry *e = entry_named(x, name);
  if (!e) return;
  free(e->name);
  *e = x->entries[--x->nentries];
}

static uint64_t rng(void);

/* Some of the directory's unsynced changes reach the disk after all. */
static void apply_some_pending(node *x) {
  for (size_t i = 0; i < x->npending; i++) {
    if (rng() & 1) continue;
    nsop *o = &x->pending[i];
    entry *a = entry_named(x, o->a), *b = o->b ? entry_named(x, o->b) : NULL;
    if (o->kind == OP_ADD) {
      set_entry(x, o->a, o->node);
    } else if (o->kind == OP_DEL) {
      drop_entry(x, o->a);
    } else if (o->kind == OP_RENAME && a && a->node == o->node) {
      drop_entry(x, o->a);
      set_entry(x, o->b, o->node);
    } else if (o->kind == OP_EXCHANGE && a && b) {
      int t = a->node;
      a->node = b->node;
      b->node = t;
    }
  }
}

/* The directory's live entries become its durable ones. */
static int snapshot_dir(int n, const char *relpath) {
  int fd = openat(fs.backing, relpath, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -errno;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -errno;
  }
  node *x = &fs.nodes[n];
  free_entries(x);
  clear_pending(x);
  size_t cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char child[PATH_MAX];
    snprintf(child, sizeof(child), "%s/%s", relpath, e->d_name);
    int c = node_at(child);
    if (c < 0) continue; /* gone between readdir and stat */
    x = &fs.nodes[n];    /* node_at may have grown the array */
    if (x->nentries == cap) {
      cap = cap ? 2 * cap : 16;
      x->entries = realloc(x->entries, cap * sizeof(entry));
      if (!x->entries) abort();
    }
    x->entries[x->nentries++] = (entry){strdup(e->d_name), c};
  }
  closedir(d);
  return 0;
}

/* Every node under relpath as the mount finds it: durable as it is. */
static void scan_tree(int n, const char *relpath) {
  snapshot_dir(n, relpath);
  for (size_t i = 0; i < fs.nodes[n].nentries; i++) {
    entry e = fs.nodes[n].entries[i];
    if (fs.nodes[e.node].kind != K_DIR) continue;
    char child[PATH_MAX];
    snprintf(child, sizeof(child), "%s/%s", relpath, e.name);
    scan_tree(e.node, child);
  }
}

/* ---------------------------------------------------------------- the cut */

typedef struct {
  ino_t ino;
  char path[PATH_MAX];
} live_file;

/* Where each live file is now (its durable content may be that file). */
static void list_live(const char *relpath, live_file **out, size_t *n, size_t *cap) {
  int fd = openat(fs.backing, relpath, O_RDONLY | O_DIRECTORY);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char child[PATH_MAX];
    snprintf(child, sizeof(child), "%s/%s", relpath, e->d_name);
    struct stat st;
    if (fstatat(fs.backing, child, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      list_live(child, out, n, cap);
      continue;
    }
    if (*n == *cap) {
      *cap = *cap ? 2 * *cap : 64;
      *out = realloc(*out, *cap * sizeof(live_file));
      if (!*out) abort();
    }
    (*out)[*n].ino = st.st_ino;
    snprintf((*out)[(*n)++].path, PATH_MAX, "%s", child);
  }
  closedir(d);
}

static const char *live_path(ino_t ino, live_file *live, size_t nlive) {
  for (size_t i = 0; i < nlive; i++)
    if (live[i].ino == ino) return live[i].path;
  return NULL;
}

static uint64_t rng_state;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* A torn file: the durable content with a random set of the live (unsynced)
 * content's pages over it, at one of the two sizes. */
static int write_torn(int durable_fd, int live_fd, int out) {
  struct stat ds = {0}, ls;
  if (durable_fd >= 0 && fstat(durable_fd, &ds) != 0) return -errno;
  if (fstat(live_fd, &ls) != 0) return -errno;
  off_t size = rng() & 1 ? ls.st_size : ds.st_size;
  char buf[PAGE];
  for (off_t off = 0; off < size; off += PAGE) {
    memset(buf, 0, sizeof(buf));
    int from = rng() & 1 ? live_fd : durable_fd;
    if (from >= 0 && pread(from, buf, PAGE, off) < 0) return -errno;
    size_t len = size - off < PAGE ? (size_t)(size - off) : PAGE;
    if (pwrite(out, buf, len, off) != (ssize_t)len) return -EIO;
  }
  return 0;
}

static int place_file(int n, const char *dst, live_file *live, size_t nlive, int torn, int *placed) {
  node *x = &fs.nodes[n];
  char name[32];
  shadow_name(n, name, sizeof(name));
  const char *lp = x->ino ? live_path(x->ino, live, nlive) : NULL;
  if (placed[n] >= 0) { /* a second durable name of the same node */
    char first[32];
    snprintf(first, sizeof(first), "p%d", n);
    return linkat(fs.shadow, first, fs.shadow, dst, 0) == 0 ? 0 : -errno;
  }
  int rc = 0;
  if (x->state == D_LIVE) {
    if (!lp) return -ENOENT; /* a live durable file always has a name */
    rc = linkat(fs.backing, lp, fs.shadow, dst, 0) == 0 ? 0 : -errno;
  } else if (torn && lp) {
    int dfd = x->state == D_COPY ? openat(fs.shadow, name, O_RDONLY) : -1;
    int lfd = openat(fs.backing, lp, O_RDONLY);
    int out = openat(fs.shadow, dst, O_WRONLY | O_CREAT | O_EXCL, 0644);
    rc = lfd < 0 || out < 0 ? -errno : write_torn(dfd, lfd, out);
    if (dfd >= 0) close(dfd);
    if (lfd >= 0) close(lfd);
    if (out >= 0) close(out);
  } else if (x->state == D_COPY) {
    rc = linkat(fs.shadow, name, fs.shadow, dst, 0) == 0 ? 0 : -errno;
  } else {
    int out = openat(fs.shadow, dst, O_WRONLY | O_CREAT | O_EXCL, 0644);
    rc = out < 0 ? -errno : 0;
    if (out >= 0) close(out);
  }
  if (rc == 0) {
    char first[32];
    snprintf(first, sizeof(first), "p%d", n);
    rc = linkat(fs.shadow, dst, fs.shadow, first, 0) == 0 ? 0 : -errno;
    placed[n] = 1;
  }
  return rc;
}

/* Builds under shadow/dst the tree that dir node n durably holds. */
static int rebuild(int n, const char *dst, live_file *live, size_t nlive, int torn, int *placed) {
  if (mkdirat(fs.shadow, dst, 0755) != 0) return -errno;
  node *x = &fs.nodes[n];
  for (size_t i = 0; i < x->nentries; i++) {
    char child[PATH_MAX];
    snprintf(child, sizeof(child), "%s/%s", dst, x->entries[i].name);
    int c = x->entries[i].node;
    int rc = fs.nodes[c].kind == K_DIR ? rebuild(c, child, live, nlive, torn, placed)
                                       : place_file(c, child, live, nlive, torn, placed);
    if (rc < 0) return rc;
  }
  return 0;
}

static int remove_tree(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (fd < 0) return unlinkat(dirfd, name, 0) == 0 ? 0 : -errno;
  DIR *d = fdopendir(fd);
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) remove_tree(fd, e->d_name);
  if (d) closedir(d);
  return unlinkat(dirfd, name, AT_REMOVEDIR) == 0 ? 0 : -errno;
}

/* Replaces the backing directory's content by the durable state. */
static int cut(int torn, int reorder) {
  if (reorder)
    for (size_t i = 0; i < fs.nnodes; i++)
      if (fs.nodes[i].kind == K_DIR) apply_some_pending(&fs.nodes[i]);
  live_file *live = NULL;
  size_t nlive = 0, cap = 0;
  list_live(".", &live, &nlive, &cap);
  int *placed = malloc(fs.nnodes * sizeof(int));
  for (size_t i = 0; i < fs.nnodes; i++) placed[i] = -1;
  int rc = rebuild(0, "root", live, nlive, torn, placed);
  free(placed);
  free(live);
  if (rc < 0) return rc;
  DIR *d = fdopendir(dup(fs.backing));
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) remove_tree(fs.backing, e->d_name);
  if (d) closedir(d);
  int root = openat(fs.shadow, "root", O_RDONLY | O_DIRECTORY);
  d = root >= 0 ? fdopendir(root) : NULL;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && renameat(root, e->d_name, fs.backing, e->d_name) != 0)
      rc = -errno;
  if (d) closedir(d);
  return rc;
}

/* ---------------------------------------------------------------- control */

static int control_write(const char *buf, size_t size) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "%.*s", (int)(size < sizeof(cmd) - 1 ? size : sizeof(cmd) - 1), buf);
  unsigned long long v = 0;
  int rc = 0;
  pthread_mutex_lock(&fs.mu);
  if (!strncmp(cmd, "freeze-at ", 10) && sscanf(cmd + 10, "%llu", &v) == 1 && v > 0) {
    fs.freeze_at = v;
    if (fs.syncs >= v) fs.frozen = 1;
  } else if (!strcmp(cmd, "freeze") || !strcmp(cmd, "freeze\n")) {
    fs.frozen = 1;
  } else if (!strncmp(cmd, "cut", 3) && !fs.cut) {
    const char *seed = strpbrk(cmd, "0123456789");
    if (seed) rng_state = strtoull(seed, NULL, 10) * 2654435761u + 1;
    rc = cut(strstr(cmd, "torn") != NULL, strstr(cmd, "reorder") != NULL);
    if (rc < 0) fprintf(stderr, "plfs: the cut failed: %s\n", strerror(-rc));
    fs.cut = 1;
    pthread_cond_broadcast(&fs.cut_cv);
  } else {
    rc = -EINVAL;
  }
  pthread_mutex_unlock(&fs.mu);
  return rc < 0 ? rc : (int)size;
}

static int control_text(char *out, size_t len) {
  pthread_mutex_lock(&fs.mu);
  int n = snprintf(out, len, "syncs=%" PRIu64 " frozen=%d blocked=%d cut=%d\n", fs.syncs, fs.frozen, fs.blocked,
                   fs.cut);
  pthread_mutex_unlock(&fs.mu);
  return n;
}

/* ---------------------------------------------------------------- operations */

/* Every call that changes something waits out a frozen power and fails
 * after the cut: the machine is off. */
#define LOCKED_OR_EIO()                \
  pthread_mutex_lock(&fs.mu);          \
  if (power_gate() < 0) {              \
    pthread_mutex_unlock(&fs.mu);      \
    return -EIO;                       \
  }

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
  if (is_control(path)) {
    memset(st, 0, sizeof(*st));
    st->st_mode = S_IFREG | 0600;
    st->st_nlink = 1;
    st->st_size = 0;
    return 0;
  }
  int rc = fi ? fstat((int)fi->fh, st) : fstatat(fs.backing, rel(path), st, AT_SYMLINK_NOFOLLOW);
  return rc == 0 ? 0 : -errno;
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
  (void)off, (void)fi, (void)flags;
  int fd = openat(fs.backing, rel(path), O_RDONLY | O_DIRECTORY);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    int e = errno;
    if (fd >= 0) close(fd);
    return -e;
  }
  struct dirent *e;
  while ((e = readdir(d)))
    if (fill(buf, e->d_name, NULL, 0, 0)) break;
  closedir(d);
  return 0;
}

static int op_mkdir(const char *path, mode_t mode) {
  LOCKED_OR_EIO();
  int rc = mkdirat(fs.backing, rel(path), mode) == 0 ? 0 : -errno;
  struct stat st;
  if (rc == 0 && fstatat(fs.backing, rel(path), &st, 0) == 0) record(OP_ADD, path, NULL, new_node(K_DIR, st.st_ino, D_NONE));
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_rmdir(const char *path) {
  LOCKED_OR_EIO();
  int n = node_at(rel(path));
  int rc = unlinkat(fs.backing, rel(path), AT_REMOVEDIR) == 0 ? 0 : -errno;
  if (rc == 0 && n >= 0) fs.nodes[n].ino = 0;
  if (rc == 0) record(OP_DEL, path, NULL, -1);
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_unlink(const char *path) {
  LOCKED_OR_EIO();
  int gone;
  int rc = before_unname(rel(path), &gone);
  if (rc == 0 && unlinkat(fs.backing, rel(path), 0) != 0) rc = -errno;
  if (rc == 0 && gone >= 0) fs.nodes[gone].ino = 0;
  if (rc == 0) record(OP_DEL, path, NULL, -1);
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_rename(const char *from, const char *to, unsigned int flags) {
  LOCKED_OR_EIO();
  int rc = 0, gone = -1;
  struct stat a, b;
  /* Replacing a different inode takes a name from it (an exchange does not). */
  if (!(flags & RENAME_EXCHANGE) && fstatat(fs.backing, rel(to), &b, AT_SYMLINK_NOFOLLOW) == 0 &&
      fstatat(fs.backing, rel(from), &a, AT_SYMLINK_NOFOLLOW) == 0 && a.st_ino != b.st_ino && !(flags & RENAME_NOREPLACE))
    rc = before_unname(rel(to), &gone);
  int moved = rc == 0 ? node_at(rel(from)) : -1;
  if (rc == 0 && renameat2(fs.backing, rel(from), fs.backing, rel(to), flags) != 0) rc = -errno;
  if (rc == 0 && gone >= 0) fs.nodes[gone].ino = 0;
  if (rc == 0) {
    size_t dir_a = strrchr(from, '/') - from, dir_b = strrchr(to, '/') - to;
    if (dir_a == dir_b && !strncmp(from, to, dir_a)) {
      record(flags & RENAME_EXCHANGE ? OP_EXCHANGE : OP_RENAME, from, to, moved);
    } else { /* across directories: each side on its own */
      record(OP_ADD, to, NULL, moved);
      if (flags & RENAME_EXCHANGE) record(OP_ADD, from, NULL, node_at(rel(from)));
      else record(OP_DEL, from, NULL, -1);
    }
  }
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_link(const char *from, const char *to) {
  LOCKED_OR_EIO();
  int rc = linkat(fs.backing, rel(from), fs.backing, rel(to), 0) == 0 ? 0 : -errno;
  if (rc == 0) record(OP_ADD, to, NULL, node_at(rel(to)));
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

/* A write-open or truncate is about to change a file's content. */
static int before_change(int fd) { return keep_durable(fd_node[fd], fd, NULL); }

static int open_backing(const char *path, int flags, mode_t mode, struct fuse_file_info *fi) {
  /* The backing file needs no alignment (O_DIRECT is the mount's business),
   * takes writes at the kernel's offsets (no O_APPEND), and is readable so
   * its durable content can be kept before a truncation. */
  int bflags = flags & ~(O_DIRECT | O_TRUNC | O_APPEND | O_ACCMODE);
  bflags |= (flags & O_ACCMODE) == O_RDONLY ? O_RDONLY : O_RDWR;
  int fd = openat(fs.backing, rel(path), bflags | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  struct stat st;
  int rc = fstat(fd, &st) == 0 ? 0 : -errno;
  int n = rc ? -1 : find_ino(st.st_ino);
  if (rc == 0 && n < 0) n = new_node(K_FILE, st.st_ino, (flags & O_CREAT) && st.st_size == 0 ? D_NONE : D_LIVE);
  if (rc == 0 && fd >= MAX_FDS) rc = -EMFILE;
  if (rc == 0 && (flags & O_TRUNC) && (rc = keep_durable(n, fd, NULL)) == 0 && ftruncate(fd, 0) != 0) rc = -errno;
  if (rc < 0) {
    close(fd);
    return rc;
  }
  if ((flags & O_ACCMODE) != O_RDONLY) fs.nodes[n].writers++;
  fd_node[fd] = n;
  fi->fh = (uint64_t)fd;
  return 0;
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
  LOCKED_OR_EIO();
  struct stat st;
  int existed = fstatat(fs.backing, rel(path), &st, AT_SYMLINK_NOFOLLOW) == 0;
  int rc = open_backing(path, fi->flags | O_CREAT, mode, fi);
  if (rc == 0 && !existed) record(OP_ADD, path, NULL, fd_node[fi->fh]);
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_open(const char *path, struct fuse_file_info *fi) {
  if (is_control(path)) {
    fi->direct_io = 1;
    fi->fh = (uint64_t)-1;
    return 0;
  }
  LOCKED_OR_EIO();
  int rc = open_backing(path, fi->flags, 0, fi);
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
  if (is_control(path)) {
    char text[128];
    int n = control_text(text, sizeof(text));
    if (off >= n) return 0;
    size_t len = (size_t)(n - off) < size ? (size_t)(n - off) : size;
    memcpy(buf, text + off, len);
    return (int)len;
  }
  if (fs.cut) return -EIO;
  ssize_t n = pread((int)fi->fh, buf, size, off);
  return n < 0 ? -errno : (int)n;
}

static int op_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
  if (is_control(path)) return control_write(buf, size);
  LOCKED_OR_EIO(); /* held across the write: none lands after a freeze */
  int rc = before_change((int)fi->fh);
  ssize_t n = rc < 0 ? rc : pwrite((int)fi->fh, buf, size, off);
  if (n < 0 && rc == 0) rc = -errno;
  pthread_mutex_unlock(&fs.mu);
  return rc < 0 ? rc : (int)n;
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
  if (is_control(path)) return 0;
  LOCKED_OR_EIO();
  int fd = fi ? (int)fi->fh : openat(fs.backing, rel(path), O_RDWR | O_CLOEXEC); /* read: keep_durable */
  int n = fi ? fd_node[fd] : node_at(rel(path));
  int rc = fd < 0 ? -errno : n < 0 ? n : keep_durable(n, fd, NULL);
  if (rc == 0 && ftruncate(fd, size) != 0) rc = -errno;
  if (!fi && fd >= 0) close(fd);
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi) {
  if (is_control(path)) return -EOPNOTSUPP;
  LOCKED_OR_EIO();
  int rc = before_change((int)fi->fh);
  if (rc == 0 && fallocate((int)fi->fh, mode, off, len) != 0) rc = -errno;
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_release(const char *path, struct fuse_file_info *fi) {
  if (is_control(path)) return 0;
  int fd = (int)fi->fh;
  pthread_mutex_lock(&fs.mu);
  if ((fi->flags & O_ACCMODE) != O_RDONLY) fs.nodes[fd_node[fd]].writers--;
  pthread_mutex_unlock(&fs.mu);
  close(fd);
  return 0;
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
  (void)datasync;
  if (is_control(path)) return 0;
  LOCKED_OR_EIO();
  int rc = durability_gate();
  int fd = (int)fi->fh, n = fd_node[fd];
  node *x = &fs.nodes[n];
  char name[32];
  shadow_name(n, name, sizeof(name));
  struct stat st;
  if (rc == 0 && fstat(fd, &st) != 0) rc = -errno;
  if (rc == 0 && x->ino == st.st_ino && st.st_nlink > 0) {
    unlinkat(fs.shadow, name, 0);
    x->state = D_LIVE;
  } else if (rc == 0) { /* synced through an fd after its last name went: the bytes go to the shadow */
    unlinkat(fs.shadow, name, 0);
    int to = openat(fs.shadow, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    rc = to < 0 ? -errno : copy_fd(fd, to);
    if (to >= 0) close(to);
    if (rc == 0) x->state = D_COPY;
  }
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
  (void)datasync, (void)fi;
  LOCKED_OR_EIO();
  int rc = durability_gate();
  int n = rc ? rc : node_at(rel(path));
  if (!rc) rc = n < 0 ? n : snapshot_dir(n, rel(path));
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
  LOCKED_OR_EIO();
  int rc = fi ? futimens((int)fi->fh, tv) : utimensat(fs.backing, rel(path), tv, AT_SYMLINK_NOFOLLOW);
  rc = rc == 0 ? 0 : -errno;
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
  LOCKED_OR_EIO();
  int rc = fi ? fchmod((int)fi->fh, mode) : fchmodat(fs.backing, rel(path), mode, 0);
  rc = rc == 0 ? 0 : -errno;
  pthread_mutex_unlock(&fs.mu);
  return rc;
}

static int op_statfs(const char *path, struct statvfs *st) {
  (void)path;
  return fstatvfs(fs.backing, st) == 0 ? 0 : -errno;
}

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
  (void)conn;
  /* The kernel must ask for every name and attribute: the cut changes them. */
  cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 0;
  cfg->hard_remove = 1;
  cfg->use_ino = 0;
  return NULL;
}

static const struct fuse_operations ops = {
    .init = op_init,
    .getattr = op_getattr,
    .readdir = op_readdir,
    .mkdir = op_mkdir,
    .rmdir = op_rmdir,
    .unlink = op_unlink,
    .rename = op_rename,
    .link = op_link,
    .create = op_create,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .truncate = op_truncate,
    .fallocate = op_fallocate,
    .release = op_release,
    .fsync = op_fsync,
    .fsyncdir = op_fsyncdir,
    .utimens = op_utimens,
    .chmod = op_chmod,
    .statfs = op_statfs,
};

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: plfs BACKING SHADOW MOUNTPOINT [fuse options]\n");
    return 2;
  }
  fs.backing = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  fs.shadow = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct stat b, s;
  if (fs.backing < 0 || fs.shadow < 0 || fstat(fs.backing, &b) || fstat(fs.shadow, &s)) {
    perror("plfs: BACKING and SHADOW must be directories");
    return 2;
  }
  if (b.st_dev != s.st_dev) {
    fprintf(stderr, "plfs: SHADOW must be on BACKING's filesystem\n");
    return 2;
  }
  new_node(K_DIR, b.st_ino, D_LIVE); /* node 0: the root */
  scan_tree(0, ".");
  /* fuse_main takes: program, mountpoint, options (foreground by default here). */
  char **fargv = calloc((size_t)argc + 2, sizeof(char *));
  int fargc = 0;
  fargv[fargc++] = argv[0];
  fargv[fargc++] = "-f";
  for (int i = 3; i < argc; i++) fargv[fargc++] = argv[i];
  int rc = fuse_main(fargc, fargv, &ops, NULL);
  free(fargv);
  return rc;
}
