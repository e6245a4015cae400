/* A stand-in for the NVIDIA driver's libcuda.so.1 with the two calls the
 * suite's GPU detection makes (tests/unit/real_gpu.c): one GPU. With it and
 * the fake runtime on LD_LIBRARY_PATH, this machine looks like one with a
 * GPU to the library and to the tests (tests/gpu/sim_test.sh). */
int cuInit(unsigned flags);
int cuDeviceGetCount(int *count);

int cuInit(unsigned flags) {
  (void)flags;
  return 0;
}

int cuDeviceGetCount(int *count) {
  *count = 1;
  return 0;
}
