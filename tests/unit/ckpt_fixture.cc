#include "ckpt_fixture.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern "C" {
#include "core/crc32.h"
}

namespace ckptio_test {

namespace {
std::string test_device() {
  const char *d = getenv("CKPTIO_TEST_DEVICE");
  return d ? d : "";
}
void *open_cudart() {
  const char *env = getenv("CKPTIO_CUDART");
  if (env && *env) return dlopen(env, RTLD_NOW);
  if (!real_gpu()) return nullptr;
  void *h = dlopen("libcudart.so.13", RTLD_NOW);
  return h ? h : dlopen("libcudart.so.12", RTLD_NOW);
}
}  // namespace

bool fake_gpu() { return test_device() == "cuda"; }
bool real_gpu() { return test_device() == "cuda-real"; }
bool on_gpu() { return fake_gpu() || real_gpu(); }

void *cudart() {
  static void *h = on_gpu() ? open_cudart() : nullptr;
  return h;
}

namespace {
template <typename F>
F rt(const char *name) {
  void *f = cudart() ? dlsym(cudart(), name) : nullptr;
  if (!f) throw std::runtime_error(std::string("CUDA runtime lacks ") + name);
  return reinterpret_cast<F>(f);
}
// cudaMemcpy(dst, src, n, kind): 1 host to device, 2 device to host.
void copy(void *dst, const void *src, size_t n, int kind) {
  if (!n) return;
  int e = rt<int (*)(void *, const void *, size_t, int)>("cudaMemcpy")(dst, src, n, kind);
  if (e) throw std::runtime_error("cudaMemcpy failed: " + std::to_string(e));
}
}  // namespace

int gpu_count() {
  int n = 0;
  rt<int (*)(int *)>("cudaGetDeviceCount")(&n);
  return n;
}
void model_copies(long mbps) {
  if (!fake_gpu()) return;
  sym<void (*)(long)>("fake_cudart_set_delay_us")(0);
  sym<void (*)(long)>("fake_cudart_set_bandwidth_mbps")(mbps);
}
void default_copies() {
  if (!fake_gpu()) return;
  sym<void (*)(long)>("fake_cudart_set_delay_us")(2000);
  sym<void (*)(long)>("fake_cudart_set_bandwidth_mbps")(20000);
}
void to_gpu(void *dst, const void *src, size_t n) { copy(dst, src, n, 1); }
void from_gpu(void *dst, const void *src, size_t n) { copy(dst, src, n, 2); }

Tensor make_tensor(const std::string &name, ckptio_dtype dtype, std::vector<int64_t> shape, uint64_t seed) {
  int64_t n = ckptio_tensor_nbytes(dtype, (int)shape.size(), shape.data());
  EXPECT_GE(n, 0) << name;
  return Tensor{name, dtype, shape, pattern(n < 0 ? 0 : (size_t)n, seed)};
}

ckptio_options small_options(size_t chunk, size_t staging, int threads) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.chunk_bytes = chunk;
  o.staging_bytes = staging;
  o.threads = threads;
  return o;
}

ckptio_tensor host_desc(const Tensor &t) {
  ckptio_tensor d{};
  d.name = t.name.c_str();
  d.dtype = t.dtype;
  d.ndim = (int)t.shape.size();
  for (size_t i = 0; i < t.shape.size(); i++) d.shape[i] = t.shape[i];
  d.data = const_cast<uint8_t *>(t.bytes.data());
  d.device = CKPTIO_DEVICE_HOST;
  return d;
}

int save_format(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts, ckptio_format format,
                const ckptio_options *opts, std::string *err) {
  ckptio_writer *w = nullptr;
  int rc = ckptio_writer_open(ctx, path.c_str(), format, opts, &w);
  if (rc < 0) {
    if (err) *err = ckptio_last_open_error();
    return rc;
  }
  std::vector<std::pair<int, void *>> on_device;
  for (size_t k = 0; k < ts.size() && rc == 0; k++) {
    const Tensor &t = ts[k];
    ckptio_tensor d = host_desc(t);
    if (on_gpu()) {
      d.device = CKPTIO_DEVICE_CUDA((int)(k % (size_t)gpu_count()));
      void *p = nullptr;
      if ((rc = ckptio_device_alloc(ctx, d.device, t.bytes.size(), &p)) < 0) break;
      on_device.push_back({d.device, p});
      to_gpu(p, t.bytes.data(), t.bytes.size());
      d.data = p;
    }
    rc = ckptio_writer_add(w, &d);
  }
  if (rc == 0) rc = ckptio_writer_commit(w);
  if (err) *err = ckptio_writer_last_error(w);
  int rc2 = ckptio_writer_close(w);
  for (auto &dp : on_device) ckptio_device_free(ctx, dp.first, dp.second);
  return rc < 0 ? rc : rc2;
}

int save(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts,
         const ckptio_options *opts, std::string *err) {
  return save_format(ctx, path, ts, CKPTIO_FORMAT_SAFETENSORS, opts, err);
}

void expect_loads(ckptio_ctx *ctx, const std::string &path, const std::vector<Tensor> &ts,
                  ckptio_load_method method) {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  o.load_method = method;
  ckptio_reader *r = nullptr;
  ASSERT_EQ(ckptio_reader_open(ctx, path.c_str(), &o, &r), 0) << ckptio_last_open_error();
  ASSERT_EQ(ckptio_reader_count(r), ts.size());
  std::vector<std::vector<uint8_t>> out(ts.size());
  std::vector<ckptio_load_request> reqs;
  for (size_t i = 0; i < ts.size(); i++) {
    int64_t idx = ckptio_reader_find(r, ts[i].name.c_str());
    ASSERT_GE(idx, 0) << ts[i].name;
    ckptio_tensor_info info;
    ASSERT_EQ(ckptio_reader_info(r, (size_t)idx, &info), 0);
    EXPECT_STREQ(info.name, ts[i].name.c_str());
    EXPECT_EQ(info.dtype, ts[i].dtype);
    ASSERT_EQ(info.ndim, (int)ts[i].shape.size());
    for (int d = 0; d < info.ndim; d++) EXPECT_EQ(info.shape[d], ts[i].shape[d]);
    EXPECT_EQ(info.nbytes, ts[i].bytes.size());
    if (info.has_crc) {
      EXPECT_EQ(info.crc32, ckptio_crc32(0, ts[i].bytes.data(), ts[i].bytes.size())) << ts[i].name;
    }
    out[i].assign(ts[i].bytes.size() + 1, 0xEE);
    reqs.push_back({(size_t)idx, out[i].data(), ts[i].bytes.size(), CKPTIO_DEVICE_HOST});
    if (path.rfind("s3://", 0) == 0) continue;  // an object has no view
    const void *view = nullptr;
    uint64_t vn = 0;
    ASSERT_EQ(ckptio_reader_view(r, (size_t)idx, &view, &vn), 0);
    ASSERT_EQ(vn, ts[i].bytes.size());
    if (vn) {
      EXPECT_EQ(memcmp(view, ts[i].bytes.data(), vn), 0) << "view of " << ts[i].name;
    }
  }
  std::vector<void *> dev(ts.size(), nullptr);
  if (on_gpu()) {
    for (size_t i = 0; i < ts.size(); i++) {
      reqs[i].device = CKPTIO_DEVICE_CUDA((int)(i % (size_t)gpu_count()));
      ASSERT_EQ(ckptio_device_alloc(ctx, reqs[i].device, ts[i].bytes.size(), &dev[i]), 0);
      reqs[i].dst = dev[i];
    }
  }
  int rc = ckptio_reader_load_many(r, reqs.data(), reqs.size());
  for (size_t i = 0; i < ts.size() && on_gpu(); i++) {
    if (rc == 0) from_gpu(out[i].data(), dev[i], ts[i].bytes.size());
    ckptio_device_free(ctx, reqs[i].device, dev[i]);
  }
  ASSERT_EQ(rc, 0) << ckptio_reader_last_error(r);
  for (size_t i = 0; i < ts.size(); i++) {
    EXPECT_TRUE(std::equal(ts[i].bytes.begin(), ts[i].bytes.end(), out[i].begin())) << ts[i].name;
    EXPECT_EQ(out[i].back(), 0xEE) << "wrote past the tensor: " << ts[i].name;
  }
  size_t unchecked = 99;
  EXPECT_EQ(ckptio_reader_verify(r, &unchecked), 0) << ckptio_reader_last_error(r);
  ckptio_reader_close(r);
}

int open_removed_files(const char *part) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  while (dirent *e = d ? readdir(d) : nullptr) {
    char link[4200];
    ssize_t len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
    if (len <= 0) continue;
    link[len] = 0;
    if (strstr(link, part) && strstr(link, " (deleted)")) n++;
  }
  if (d) closedir(d);
  return n;
}

// The box [off, off + size) of a row-major tensor's bytes, contiguous.
std::vector<uint8_t> extract(const Tensor &t, const std::vector<int64_t> &off, const std::vector<int64_t> &size) {
  size_t es = (size_t)ckptio_dtype_bits(t.dtype) / 8, nd = t.shape.size(), total = 1;
  for (auto s : size) total *= (size_t)s;
  std::vector<uint8_t> out(total * es);
  std::vector<int64_t> idx(nd, 0);
  for (size_t i = 0; i < total; i++) {
    size_t rem = i, src = 0;
    for (size_t d = nd; d-- > 0;) {
      idx[d] = (int64_t)(rem % (size_t)size[d]);
      rem /= (size_t)size[d];
    }
    for (size_t d = 0; d < nd; d++) src = src * (size_t)t.shape[d] + (size_t)(off[d] + idx[d]);
    memcpy(&out[i * es], &t.bytes[src * es], es);
  }
  return out;
}

}  // namespace ckptio_test
