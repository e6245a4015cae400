/* ckptio for C++17: RAII handles over the C API of ckptio.h, failures as
 * exceptions carrying the code and the detail. Header-only; link libckptio
 * as for C. Every object here owns exactly one C handle and frees it in its
 * destructor; objects move, they do not copy. Thread safety is the C
 * handle's (ckptio.h): a context is shared, a writer or reader is used by one
 * thread at a time. A context must outlive its writers and readers.
 *
 *   ckptio::context ctx;
 *   ckptio::writer w = ckptio::writer::open(ctx, "model.safetensors");
 *   w.add(ckptio::tensor_of("w", CKPTIO_F32, {1024, 1024}, data));
 *   w.commit_async();
 *   w.wait_snapshot();   // data may change from here on
 *   w.wait_durable();    // the file is in place
 *
 * The libtorch adapter is ckptio_torch.hpp. */
#ifndef CKPTIO_HPP
#define CKPTIO_HPP

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckptio.h"

namespace ckptio {

/* A failed call: code() is the C code (a CKPTIO_E_* value or -errno), what()
 * reads "<call>: <code's name>: <detail>" (detail: file, tensor, rule). */
class error : public std::runtime_error {
 public:
  error(int code, const std::string &call, const std::string &detail)
      : std::runtime_error(call + ": " + ckptio_strerror(code) + (detail.empty() ? "" : ": " + detail)),
        code_(code),
        detail_(detail) {}
  int code() const noexcept { return code_; }
  const std::string &detail() const noexcept { return detail_; }

 private:
  int code_;
  std::string detail_;
};

namespace detail {
template <class T>
inline T check(T rc, const char *call, const char *why) {
  if (rc < 0) throw error(static_cast<int>(rc), call, why ? why : "");
  return rc;
}
}  // namespace detail

/* A tensor descriptor for writer::add: name (NUL-terminated) borrowed until
 * add returns (the writer copies it), data borrowed until the snapshot point. */
inline ckptio_tensor tensor_of(const char *name, ckptio_dtype dtype, std::initializer_list<int64_t> shape,
                               const void *data, int device = CKPTIO_DEVICE_HOST) {
  if (shape.size() > CKPTIO_MAX_DIMS) throw error(CKPTIO_E_SHAPE, "ckptio::tensor_of", name);
  ckptio_tensor t{};
  t.name = name;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  t.data = data;
  t.device = device;
  return t;
}

/* Options with the library's defaults (CKPTIO_OPTIONS_INIT). */
inline ckptio_options default_options() {
  ckptio_options o = CKPTIO_OPTIONS_INIT;
  return o;
}

/* The worker pool and staging ring: one per process, reused. */
class context {
 public:
  explicit context(const ckptio_options *opts = nullptr) {
    detail::check(ckptio_ctx_create(opts, &p_), "ckptio_ctx_create", ckptio_last_open_error());
  }
  explicit context(const ckptio_options &opts) : context(&opts) {}
  context(context &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  context &operator=(context &&o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  context(const context &) = delete;
  context &operator=(const context &) = delete;
  ~context() { ckptio_ctx_free(p_); }

  ckptio_ctx *get() const noexcept { return p_; }
  ckptio_options options() const {
    ckptio_options o = CKPTIO_OPTIONS_INIT;
    ckptio_ctx_options(p_, &o);
    return o;
  }
  /* Whether CUDA is in use; why not in *why. */
  bool cuda(std::string *why = nullptr) const {
    const char *w = "";
    bool on = ckptio_ctx_cuda(p_, &w) == 1;
    if (why) *why = w ? w : "";
    return on;
  }

 private:
  ckptio_ctx *p_ = nullptr;
};

/* A save: one file, or a Hugging Face sharded set (open_sharded). Tensors
 * are added, then committed; commit_async returns as soon as the save has
 * started, wait_snapshot when the tensors' memory may change again, and
 * wait_durable when the checkpoint is in place. Destroying a writer whose
 * save is running waits for it (and keeps the previous checkpoint if it
 * failed). */
class writer {
 public:
  static writer open(context &ctx, const std::string &path, ckptio_format format = CKPTIO_FORMAT_SAFETENSORS,
                     const ckptio_options *opts = nullptr) {
    ckptio_writer *w = nullptr;
    detail::check(ckptio_writer_open(ctx.get(), path.c_str(), format, opts, &w), "ckptio_writer_open",
                  ckptio_last_open_error());
    return writer(w);
  }
  static writer open_sharded(context &ctx, const std::string &dir, const std::string &prefix,
                             uint64_t max_shard_bytes, ckptio_shard_order order = CKPTIO_SHARD_ORDER_ADDED,
                             ckptio_format format = CKPTIO_FORMAT_SAFETENSORS, const ckptio_options *opts = nullptr) {
    ckptio_writer *w = nullptr;
    detail::check(ckptio_writer_open_sharded(ctx.get(), dir.c_str(), prefix.c_str(), format, max_shard_bytes, order,
                                             opts, &w),
                  "ckptio_writer_open_sharded", ckptio_last_open_error());
    return writer(w);
  }
  writer(writer &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  writer &operator=(writer &&o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  writer(const writer &) = delete;
  writer &operator=(const writer &) = delete;
  ~writer() { ckptio_writer_close(p_); }

  writer &add(const ckptio_tensor &t) { return call(ckptio_writer_add(p_, &t), "ckptio_writer_add"); }
  writer &set_metadata(const std::string &key, const std::string &value) {
    return call(ckptio_writer_set_metadata(p_, key.c_str(), value.c_str()), "ckptio_writer_set_metadata");
  }
  /* Device copies of GPU `device` are ordered after work queued on `stream`
   * (a cudaStream_t) before commit. */
  writer &set_stream(int device, void *stream) {
    return call(ckptio_writer_set_stream(p_, device, stream), "ckptio_writer_set_stream");
  }
  void commit() { call(ckptio_writer_commit(p_), "ckptio_writer_commit"); }
  void commit_async() { call(ckptio_writer_commit_async(p_), "ckptio_writer_commit_async"); }
  void wait_snapshot() { call(ckptio_writer_wait_snapshot(p_), "ckptio_writer_wait_snapshot"); }
  void wait_durable() { call(ckptio_writer_wait_durable(p_), "ckptio_writer_wait_durable"); }
  bool snapshot_done() { return poll(ckptio_writer_poll_snapshot(p_), "ckptio_writer_poll_snapshot"); }
  bool durable_done() { return poll(ckptio_writer_poll_durable(p_), "ckptio_writer_poll_durable"); }
  std::pair<uint64_t, uint64_t> progress() const {
    uint64_t done = 0, total = 0;
    ckptio_writer_progress(p_, &done, &total);
    return {done, total};
  }
  ckptio_stats stats() const {
    ckptio_stats s{};
    s.size = sizeof(s);
    detail::check(ckptio_writer_stats(p_, &s), "ckptio_writer_stats", ckptio_writer_last_error(p_));
    return s;
  }
  size_t shard_count() const noexcept { return ckptio_writer_shard_count(p_); }
  /* Closes now (waiting for a running save) and reports its failure. */
  void close() {
    int rc = ckptio_writer_close(std::exchange(p_, nullptr));
    detail::check(rc, "ckptio_writer_close", "");
  }
  ckptio_writer *get() const noexcept { return p_; }

 private:
  explicit writer(ckptio_writer *p) : p_(p) {}
  writer &call(int rc, const char *what) {
    detail::check(rc, what, ckptio_writer_last_error(p_));
    return *this;
  }
  bool poll(int rc, const char *what) { return detail::check(rc, what, ckptio_writer_last_error(p_)) == 1; }
  ckptio_writer *p_ = nullptr;
};

/* An opened checkpoint: a file, a sharded set (its index or directory), or a
 * compressed file. Tensors load into memory the caller owns, host or GPU. */
class reader {
 public:
  static reader open(context &ctx, const std::string &path, const ckptio_options *opts = nullptr) {
    ckptio_reader *r = nullptr;
    detail::check(ckptio_reader_open(ctx.get(), path.c_str(), opts, &r), "ckptio_reader_open",
                  ckptio_last_open_error());
    return reader(r);
  }
  reader(reader &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  reader &operator=(reader &&o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  reader(const reader &) = delete;
  reader &operator=(const reader &) = delete;
  ~reader() { ckptio_reader_close(p_); }

  size_t size() const noexcept { return ckptio_reader_count(p_); }
  std::string_view format() const noexcept { return ckptio_reader_format(p_); }
  /* The index of a tensor, or nullopt. */
  std::optional<size_t> find(const std::string &name) const {
    int64_t i = ckptio_reader_find(p_, name.c_str());
    if (i == CKPTIO_E_NOT_FOUND) return std::nullopt;
    detail::check(i, "ckptio_reader_find", ckptio_reader_last_error(p_));
    return static_cast<size_t>(i);
  }
  size_t index(const std::string &name) const {
    auto i = find(name);
    if (!i) throw error(CKPTIO_E_NOT_FOUND, "ckptio::reader::index", "no tensor '" + name + "'");
    return *i;
  }
  /* Name, dtype, shape, bytes; the name lives as long as the reader. */
  ckptio_tensor_info info(size_t index) const {
    ckptio_tensor_info t{};
    detail::check(ckptio_reader_info(p_, index, &t), "ckptio_reader_info", ckptio_reader_last_error(p_));
    return t;
  }
  std::vector<std::string_view> names() const {
    std::vector<std::string_view> out;
    for (size_t i = 0; i < size(); i++) out.emplace_back(info(i).name);
    return out;
  }
  std::optional<std::string_view> metadata(const std::string &key) const {
    const char *v = ckptio_reader_metadata_get(p_, key.c_str());
    return v ? std::optional<std::string_view>(v) : std::nullopt;
  }
  /* Loads tensor `index` into dst (dst_bytes at least its bytes), checking
   * its CRC32 when the file has one. */
  void load(size_t index, void *dst, uint64_t dst_bytes, int device = CKPTIO_DEVICE_HOST) {
    ckptio_load_request q{index, dst, dst_bytes, device};
    load_many(&q, 1);
  }
  /* Many tensors in one pass (the fast way: one pipeline over all). */
  void load_many(const ckptio_load_request *reqs, size_t n) {
    call(ckptio_reader_load_many(p_, reqs, n), "ckptio_reader_load_many");
  }
  void load_many(const std::vector<ckptio_load_request> &reqs) { load_many(reqs.data(), reqs.size()); }
  /* start:stop of dimension dim; @return whether a CRC32 checked it. */
  bool load_slice(size_t index, int dim, int64_t start, int64_t stop, void *dst, uint64_t dst_bytes) {
    int verified = 0;
    call(ckptio_reader_load_slice(p_, index, dim, start, stop, dst, dst_bytes, &verified), "ckptio_reader_load_slice");
    return verified == 1;
  }
  /* Loads GPU destinations after work queued on `stream` for that GPU. */
  void set_stream(int device, void *stream) {
    call(ckptio_reader_set_stream(p_, device, stream), "ckptio_reader_set_stream");
  }
  /* Checks every recorded CRC32; @return how many tensors have none. */
  size_t verify() {
    size_t unchecked = 0;
    call(ckptio_reader_verify(p_, &unchecked), "ckptio_reader_verify");
    return unchecked;
  }
  ckptio_stats stats() const {
    ckptio_stats s{};
    s.size = sizeof(s);
    detail::check(ckptio_reader_stats(p_, &s), "ckptio_reader_stats", ckptio_reader_last_error(p_));
    return s;
  }
  ckptio_reader *get() const noexcept { return p_; }

 private:
  explicit reader(ckptio_reader *p) : p_(p) {}
  void call(int rc, const char *what) { detail::check(rc, what, ckptio_reader_last_error(p_)); }
  ckptio_reader *p_ = nullptr;
};

}  // namespace ckptio

#endif
