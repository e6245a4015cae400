// A small model for pipeline tests: named tensors with owned bytes, saved
// through the public API and compared after loading.
#pragma once
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckptio.h"
#include "test_util.h"

namespace ckptio_test {

struct Tensor {
  std::string name;
  ckptio_dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Shape's bytes filled with pattern(seed).
Tensor make_tensor(const std::string &name, ckptio_dtype dtype, std::vector<int64_t> shape, uint64_t seed);

// The box [off, off + size) of t's row-major bytes, contiguous.
std::vector<uint8_t> extract(const Tensor &t, const std::vector<int64_t> &off, const std::vector<int64_t> &size);

// The descriptor of t's bytes in host memory (name and data borrowed from t).
ckptio_tensor host_desc(const Tensor &t);

// Context options with a small chunk and ring so tests cross many chunk
// boundaries quickly.
ckptio_options small_options(size_t chunk = 64 << 10, size_t staging = 256 << 10, int threads = 3);

// A context for one test, freed at the end of its scope.
struct TestContext {
  explicit TestContext(const ckptio_options &o = small_options()) {
    EXPECT_EQ(ckptio_ctx_create(&o, &ctx), 0) << ckptio_last_open_error();
  }
  ~TestContext() { ckptio_ctx_free(ctx); }
  TestContext(const TestContext &) = delete;
  TestContext &operator=(const TestContext &) = delete;
  ckptio_ctx *ctx = nullptr;
};

// Saves with a blocking commit. Returns the code; *err gets last_error (the
// open's when the open fails).
int save(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts,
         const ckptio_options *opts = nullptr, std::string *err = nullptr);
// save() in another format.
int save_format(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts, ckptio_format format,
                const ckptio_options *opts, std::string *err);

// True in the GPU variants of a test: cuda-fake (CKPTIO_TEST_DEVICE=cuda,
// the fake runtime) and gpu (CKPTIO_TEST_DEVICE=cuda-real, the real one,
// run by tests/gpu/gpu_run only where a driver sees a GPU). save() then
// uploads every tensor to a GPU (round robin over the GPUs) and saves from
// device memory, and expect_loads() loads onto GPUs and downloads.
bool on_gpu();
// The cuda-fake variant only: the fake's controls (injected failures,
// modeled copy rates, call counts and statistics) exist.
bool fake_gpu();
// The gpu variant only: the real CUDA runtime.
bool real_gpu();
// The CUDA runtime the library uses, for uploads and downloads in the
// tests: CKPTIO_CUDART (the fake), or on the real stack the one the library
// loads (CKPTIO_CUDART if set, else libcudart.so.13, then .12); nullptr
// when not on_gpu().
void *cudart();
int gpu_count();
// A function of that runtime, or of the fake's own controls
// (fake_cudart_set_*: only when fake_gpu()), by name.
template <typename F>
F sym(const char *name) {
  return reinterpret_cast<F>(dlsym(cudart(), name));
}
// In the cuda-fake variant, for tests timed against a modeled copy engine:
// the fake's copies run at `mbps` with no fixed delay until
// default_copies() puts back the suite's (2000 us, 20000 MB/s). No-ops on
// the host and on the real runtime.
void model_copies(long mbps);
void default_copies();
// For a test that needs the fake's controls: skips in the gpu variant,
// saying which control and where the test does run.
#define CKPTIO_SKIP_ON_REAL_GPU(needs) \
  if (::ckptio_test::real_gpu()) GTEST_SKIP() << "needs " needs " of the fake CUDA runtime: runs in the cuda-fake variant"
// Copies between host and a GPU pointer through the runtime's cudaMemcpy.
void to_gpu(void *dst, const void *src, size_t n);
void from_gpu(void *dst, const void *src, size_t n);

// Opens path and checks every tensor's info and bytes (through load_many
// with the given method, and through view).
void expect_loads(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts,
                  ckptio_load_method method = CKPTIO_LOAD_AUTO);

// This process's descriptors of removed files whose path contains `part`:
// old checkpoints held open so that their blocks are freed after a save,
// not inside it.
int open_removed_files(const char *part);

}  // namespace ckptio_test
