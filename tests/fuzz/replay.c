/* The regression build of a fuzz target: replays every file named on the
 * command line, or every regular file of a named directory, through
 * LLVMFuzzerTestOneInput. A crash or a sanitizer report fails the test;
 * replaying nothing fails too, so a lost corpus cannot pass silently. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    uint8_t *grown = realloc(buf, cap * 2);
    if (!grown) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = grown;
    cap *= 2;
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    free(buf);
    return -1;
  }
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Files of a directory in name order, so a failure names the same input on
 * every machine. @return the count replayed, or -1. */
static long replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: cannot open %s: %s\n", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  long done = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      char **grown = realloc(names, ncap * sizeof *names);
      if (!grown) goto fail;
      names = grown;
      cap = ncap;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    if (!(names[n] = malloc(len))) goto fail;
    snprintf(names[n++], len, "%s/%s", dir, e->d_name);
  }
  if (n) qsort(names, n, sizeof *names, cmp_names);
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (stat(names[i], &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (replay_file(names[i]) != 0) goto fail;
    done++;
  }
  goto out;
fail:
  done = -1;
out:
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
  return done;
}

int main(int argc, char **argv) {
  long total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    long n = S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : (replay_file(argv[i]) == 0 ? 1 : -1);
    if (n < 0) return 1;
    total += n;
  }
  if (total == 0) {
    fprintf(stderr, "replay: no input replayed (usage: %s corpus-dir-or-file...)\n", argv[0]);
    return 1;
  }
  printf("replay: %ld inputs, no crash\n", total);
  return 0;
}
