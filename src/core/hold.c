#include "core/hold.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int ckptio_hold_blocks(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fd = -1;
  }
  return fd;
}
