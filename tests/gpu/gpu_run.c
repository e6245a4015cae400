/* Runs a test binary on the real CUDA runtime (label gpu), or says why it
 * cannot and exits 77 (ctest's skip) when this machine has no NVIDIA driver,
 * no GPU, no CUDA runtime, or a build of ckptio without the CUDA device.
 * Usage: gpu_run <test binary> [its arguments]. The last line printed on a
 * skip is the reason, which scripts/test.sh shows. */
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "real_gpu.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gpu_run <test binary> [arguments]\n");
    return 2;
  }
  char why[512] = "";
  int n = ckptio_test_real_gpus(why, sizeof(why));
  char name[4096];
  snprintf(name, sizeof(name), "%s", argv[1]);
  if (n <= 0) {
    printf("SKIP %s on the real CUDA runtime: %s\n", basename(name), why);
    return 77;
  }
  printf("gpu_run: the driver sees %d GPU(s): %s runs on the real CUDA runtime\n", n, basename(name));
  fflush(stdout);
  execv(argv[1], argv + 1);
  perror(argv[1]);
  return 1;
}
