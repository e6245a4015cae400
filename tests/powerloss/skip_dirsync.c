/* The power-loss test's control (powerloss_test.py --expect-loss): preloaded
 * into a saver, it turns every fsync of a directory into a no-op, as a save
 * that forgot to make its rename durable would behave. The test must catch
 * that save losing a checkpoint; a harness that passes it does not bite. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  return real(fd);
}
