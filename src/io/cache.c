/* The page cache policy of CKPTIO_LOAD_AUTO (io/cache.h): how much memory
 * is left, from /proc/meminfo and the process's cgroup. */
#include "io/cache.h"

#include <stdio.h>
#include <string.h>

/* The first number of a file, or UINT64_MAX ("max", absent, unreadable). */
static uint64_t read_number(const char *path) {
  FILE *f = fopen(path, "re");
  unsigned long long v;
  int ok = f && fscanf(f, "%llu", &v) == 1;
  if (f) fclose(f);
  return ok ? (uint64_t)v : UINT64_MAX;
}

static uint64_t meminfo_available(void) {
  FILE *f = fopen("/proc/meminfo", "re");
  char line[256];
  unsigned long long kib;
  uint64_t out = UINT64_MAX;
  while (f && fgets(line, sizeof(line), f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      out = (uint64_t)kib << 10;
      break;
    }
  if (f) fclose(f);
  return out;
}

/* limit - usage of one cgroup directory (dir + the two file names);
 * UINT64_MAX when it has no limit ("max", or v1's page-rounded 2^63) or
 * cannot be read. */
static uint64_t headroom_in(const char *dir, const char *limit, const char *usage) {
  char path[4400];
  snprintf(path, sizeof(path), "%s/%s", dir, limit);
  uint64_t max = read_number(path);
  snprintf(path, sizeof(path), "%s/%s", dir, usage);
  uint64_t cur = read_number(path);
  if (max == UINT64_MAX || max >= (1ull << 62) || cur == UINT64_MAX) return UINT64_MAX;
  return max > cur ? max - cur : 0;
}

/* The headroom of this process's memory cgroup, v2 ("0::/path" in
 * /proc/self/cgroup: memory.max - memory.current) or v1 ("N:memory:/path":
 * memory.limit_in_bytes - memory.usage_in_bytes), the smaller where both
 * are mounted; UINT64_MAX when there is no limit. Parents' limits are not
 * walked: a job's limit sits on the group it starts its processes in. */
static uint64_t cgroup_headroom(void) {
  FILE *f = fopen("/proc/self/cgroup", "re");
  char line[4096], dir[4200];
  uint64_t out = UINT64_MAX, h;
  while (f && fgets(line, sizeof(line), f)) {
    line[strcspn(line, "\n")] = '\0';
    const char *v1 = strstr(line, ":memory:");
    if (!strncmp(line, "0::", 3)) {
      const char *roots[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
      for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof(dir), "%s%s", roots[i], line + 3);
        if ((h = headroom_in(dir, "memory.max", "memory.current")) < out) out = h;
      }
    } else if (v1) {
      snprintf(dir, sizeof(dir), "/sys/fs/cgroup/memory%s", v1 + 8);
      if ((h = headroom_in(dir, "memory.limit_in_bytes", "memory.usage_in_bytes")) < out) out = h;
    }
  }
  if (f) fclose(f);
  return out;
}

uint64_t ckptio_memory_available(void) {
  uint64_t a = meminfo_available(), c = cgroup_headroom();
  return a < c ? a : c;
}

int ckptio_cache_fits(uint64_t bytes) {
  uint64_t avail = ckptio_memory_available();
  return avail != UINT64_MAX && bytes <= avail / 2; /* unknown: as before, nothing cached */
}
