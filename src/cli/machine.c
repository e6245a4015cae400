/*
 * What a benchmark report says about the machine: CPUs, memory, kernel, and
 * the filesystem under the benchmark directory (the mount in /proc/mounts
 * with the longest matching mount point, else the statfs magic).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *fs_name(long magic) {
  static const struct {
    long magic;
    const char *name;
  } kFs[] = {
      {0xEF53, "ext4"},          {0x58465342, "xfs"},  {0x9123683E, "btrfs"},
      {0x01021994, "tmpfs"},     {0x6969, "nfs"},      {0x794c7630, "overlay"},
      {0x2fc12fc1, "zfs"},       {0xF2F52010, "f2fs"}, {0x65735546, "fuse"},
      {0x5346544e, "ntfs"},      {0x4d44, "vfat"},     {0x858458f6, "ramfs"},
      {0x47504653, "gpfs"},      {0x0bd00bd0, "lustre"},
  };
  for (size_t i = 0; i < sizeof(kFs) / sizeof(kFs[0]); i++)
    if (kFs[i].magic == magic) return kFs[i].name;
  return NULL;
}

/* The mount whose mount point is the longest prefix of dir. */
static void find_mount(cli_machine *m) {
  FILE *f = fopen("/proc/mounts", "r");
  if (!f) return;
  char dev[256], mnt[256], type[32];
  size_t best = 0;
  while (fscanf(f, "%255s %255s %31s %*[^\n]", dev, mnt, type) == 3) {
    size_t l = strlen(mnt);
    int prefix = !strncmp(m->dir, mnt, l) && (m->dir[l] == '/' || m->dir[l] == 0 || l == 1);
    if (prefix && l >= best) {
      best = l;
      snprintf(m->fs_device, sizeof(m->fs_device), "%s", dev);
      snprintf(m->fs_mount, sizeof(m->fs_mount), "%s", mnt);
      /* /proc/mounts tells ext3 from ext4, which share one statfs magic. */
      snprintf(m->fs_type, sizeof(m->fs_type), "%s", type);
    }
  }
  fclose(f);
}

static void cpu_model(cli_machine *m) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, "model name", 10)) continue;
    char *v = strchr(line, ':');
    if (!v) break;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    v[strcspn(v, "\n")] = 0;
    snprintf(m->cpu, sizeof(m->cpu), "%s", v);
    break;
  }
  fclose(f);
}

void cli_machine_probe(cli_machine *m, const char *dir) {
  memset(m, 0, sizeof(*m));
  m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  if (pages > 0 && psize > 0) m->mem_bytes = (uint64_t)pages * (uint64_t)psize;
  struct utsname u;
  if (uname(&u) == 0) snprintf(m->kernel, sizeof(m->kernel), "%s %s", u.sysname, u.release);
  cpu_model(m);
  char real[PATH_MAX];
  if (!realpath(dir, real)) snprintf(real, sizeof(real), "%s", dir);
  snprintf(m->dir, sizeof(m->dir), "%s", real);
  struct statfs sf;
  const char *name = statfs(real, &sf) == 0 ? fs_name((long)sf.f_type) : NULL;
  snprintf(m->fs_type, sizeof(m->fs_type), "%s", name ? name : "unknown");
  find_mount(m);
}
