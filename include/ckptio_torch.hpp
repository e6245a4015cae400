/* ckptio for libtorch: save and load named torch::Tensors (a module's
 * parameters and buffers, or any list) through ckptio.hpp. Header-only,
 * used only when included; needs libtorch's headers and libraries and
 * libckptio.
 *
 *   ckptio::context ctx;
 *   ckptio::libtorch::save(ctx, "model.safetensors", ckptio::libtorch::state_of(*net));
 *   ckptio::libtorch::load_into(ctx, "model.safetensors", *net);   // in place, on their devices
 *
 * Every dtype safetensors knows (bool, integers, float16/bfloat16/32/64,
 * complex64, the float8 kinds) maps to torch's; others are refused with
 * CKPTIO_E_DTYPE. CPU and CUDA tensors: CUDA tensors are read and written
 * by ckptio's device path, ordered after the current CUDA stream of their
 * device (what torch's own kernels queue on). Non-contiguous tensors are
 * saved from a contiguous copy and loaded through one. */
#ifndef CKPTIO_TORCH_HPP
#define CKPTIO_TORCH_HPP

#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckptio.hpp"

namespace ckptio {
namespace libtorch {

using named_tensors = std::vector<std::pair<std::string, at::Tensor>>;

inline ckptio_dtype dtype_of(c10::ScalarType t) {
  using S = c10::ScalarType;
  switch (t) {
    case S::Bool: return CKPTIO_BOOL;
    case S::Byte: return CKPTIO_U8;
    case S::Char: return CKPTIO_I8;
    case S::Short: return CKPTIO_I16;
    case S::UInt16: return CKPTIO_U16;
    case S::Int: return CKPTIO_I32;
    case S::UInt32: return CKPTIO_U32;
    case S::Long: return CKPTIO_I64;
    case S::UInt64: return CKPTIO_U64;
    case S::Half: return CKPTIO_F16;
    case S::BFloat16: return CKPTIO_BF16;
    case S::Float: return CKPTIO_F32;
    case S::Double: return CKPTIO_F64;
    case S::ComplexFloat: return CKPTIO_C64;
    case S::Float8_e5m2: return CKPTIO_F8_E5M2;
    case S::Float8_e4m3fn: return CKPTIO_F8_E4M3;
    case S::Float8_e8m0fnu: return CKPTIO_F8_E8M0;
    case S::Float8_e4m3fnuz: return CKPTIO_F8_E4M3FNUZ;
    case S::Float8_e5m2fnuz: return CKPTIO_F8_E5M2FNUZ;
    default: throw error(CKPTIO_E_DTYPE, "ckptio::libtorch::dtype_of", std::string("torch dtype ") + c10::toString(t) +
                                                                          " has no safetensors dtype");
  }
}

inline c10::ScalarType scalar_type_of(ckptio_dtype d) {
  for (auto t : {c10::kBool, c10::kByte, c10::kChar, c10::kShort, c10::kUInt16, c10::kInt, c10::kUInt32, c10::kLong,
                 c10::kUInt64, c10::kHalf, c10::kBFloat16, c10::kFloat, c10::kDouble, c10::kComplexFloat,
                 c10::ScalarType::Float8_e5m2, c10::ScalarType::Float8_e4m3fn, c10::ScalarType::Float8_e8m0fnu,
                 c10::ScalarType::Float8_e4m3fnuz, c10::ScalarType::Float8_e5m2fnuz})
    if (dtype_of(t) == d) return t;
  const char *name = ckptio_dtype_name(d);
  throw error(CKPTIO_E_DTYPE, "ckptio::libtorch::scalar_type_of",
              std::string("safetensors dtype ") + (name ? name : "?") + " has no torch dtype");
}

/* CKPTIO_DEVICE_HOST or CKPTIO_DEVICE_CUDA(n). */
inline int ckptio_device_of(const at::Tensor &t) {
  if (t.device().is_cpu()) return CKPTIO_DEVICE_HOST;
  if (t.device().is_cuda()) return CKPTIO_DEVICE_CUDA(t.device().index());
  throw error(CKPTIO_E_DEVICE, "ckptio::libtorch::ckptio_device_of", "tensors on " + t.device().str() + " are not supported");
}

/* The current stream of a CUDA device as a cudaStream_t, without CUDA headers. */
inline void *current_stream(const c10::Device &d) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(d).native_handle();
}

/* A module's parameters and buffers, as its state_dict names them. */
inline named_tensors state_of(const torch::nn::Module &m) {
  named_tensors out;
  for (const auto &p : m.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto &b : m.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

/* A save running in the background: tensors must not change before
 * wait_snapshot; the checkpoint is in place after wait_durable. Holds the
 * contiguous copies it saves from until then. */
class pending_save {
 public:
  explicit pending_save(ckptio::writer w, std::vector<at::Tensor> keep) : w_(std::move(w)), keep_(std::move(keep)) {}
  void wait_snapshot() {
    w_.wait_snapshot();
    keep_.clear();
  }
  void wait_durable() {
    w_.wait_durable();
    keep_.clear();
  }
  ckptio::writer &writer() { return w_; }

 private:
  ckptio::writer w_;
  std::vector<at::Tensor> keep_;
};

/* Adds tensors to w (its streams set for their CUDA devices); @return the
 * contiguous tensors whose memory the save reads. */
inline std::vector<at::Tensor> add_all(ckptio::writer &w, const named_tensors &tensors) {
  std::vector<at::Tensor> keep;
  std::set<int> streams;
  for (const auto &[name, t] : tensors) {
    at::Tensor c = t.contiguous();
    if (c.dim() > CKPTIO_MAX_DIMS)
      throw error(CKPTIO_E_SHAPE, "ckptio::libtorch::save", "tensor '" + name + "' has more than 8 dims");
    ckptio_tensor d{};
    d.name = name.c_str();
    d.dtype = dtype_of(c.scalar_type());
    d.ndim = static_cast<int>(c.dim());
    for (int64_t k = 0; k < c.dim(); k++) d.shape[k] = c.size(k);
    d.data = c.data_ptr();
    d.device = ckptio_device_of(c);
    if (d.device != CKPTIO_DEVICE_HOST && streams.insert(d.device).second)
      w.set_stream(d.device, current_stream(c.device()));
    w.add(d);
    keep.push_back(std::move(c));
  }
  return keep;
}

/* Starts saving; the caller waits on the result. */
inline pending_save save_async(context &ctx, const std::string &path, const named_tensors &tensors,
                               const std::map<std::string, std::string> &metadata = {},
                               ckptio_format format = CKPTIO_FORMAT_SAFETENSORS) {
  auto w = ckptio::writer::open(ctx, path, format);
  for (const auto &[k, v] : metadata) w.set_metadata(k, v);
  auto keep = add_all(w, tensors);
  w.commit_async();
  return pending_save(std::move(w), std::move(keep));
}

/* Saves and returns when the file is in place. */
inline void save(context &ctx, const std::string &path, const named_tensors &tensors,
                 const std::map<std::string, std::string> &metadata = {},
                 ckptio_format format = CKPTIO_FORMAT_SAFETENSORS) {
  save_async(ctx, path, tensors, metadata, format).wait_durable();
}

/* Loads into existing tensors, in place, on whatever device each is: every
 * name must be in the checkpoint with the same dtype and shape (strict: and
 * the checkpoint must hold nothing else). One pass over all of them. */
inline void load_into(context &ctx, const std::string &path, const named_tensors &targets, bool strict = true) {
  auto r = ckptio::reader::open(ctx, path);
  std::vector<ckptio_load_request> reqs;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (staging, target) for non-contiguous targets
  std::set<int> streams;
  torch::NoGradGuard no_grad;
  for (const auto &[name, t] : targets) {
    auto i = r.find(name);
    if (!i) throw error(CKPTIO_E_NOT_FOUND, "ckptio::libtorch::load_into", path + ": no tensor '" + name + "'");
    ckptio_tensor_info info = r.info(*i);
    bool same = info.dtype == dtype_of(t.scalar_type()) && info.ndim == t.dim();
    for (int k = 0; same && k < info.ndim; k++) same = info.shape[k] == t.size(k);
    if (!same)
      throw error(CKPTIO_E_SHAPE, "ckptio::libtorch::load_into",
                  path + ": tensor '" + name + "' differs in dtype or shape from its target");
    at::Tensor dst = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
    if (!t.is_contiguous()) copy_back.emplace_back(dst, t);
    int device = ckptio_device_of(dst);
    if (device != CKPTIO_DEVICE_HOST && streams.insert(device).second) r.set_stream(device, current_stream(dst.device()));
    reqs.push_back({*i, dst.data_ptr(), static_cast<uint64_t>(dst.nbytes()), device});
  }
  if (strict && reqs.size() != r.size())
    throw error(CKPTIO_E_NOT_FOUND, "ckptio::libtorch::load_into",
                path + ": holds " + std::to_string(r.size()) + " tensors, the targets are " +
                    std::to_string(reqs.size()));
  r.load_many(reqs);
  for (auto &[src, dst] : copy_back) dst.copy_(src);
}

inline void load_into(context &ctx, const std::string &path, torch::nn::Module &m, bool strict = true) {
  load_into(ctx, path, state_of(m), strict);
}

/* Loads every tensor of a checkpoint into new tensors on `device`. */
inline named_tensors load(context &ctx, const std::string &path, const c10::Device &device = c10::kCPU) {
  auto r = ckptio::reader::open(ctx, path);
  named_tensors out;
  std::vector<ckptio_load_request> reqs;
  for (size_t i = 0; i < r.size(); i++) {
    ckptio_tensor_info info = r.info(i);
    at::Tensor t = at::empty(std::vector<int64_t>(info.shape, info.shape + info.ndim),
                             at::TensorOptions().dtype(scalar_type_of(info.dtype)).device(device));
    int dev = ckptio_device_of(t);
    if (dev != CKPTIO_DEVICE_HOST && out.empty()) r.set_stream(dev, current_stream(device));
    reqs.push_back({i, t.data_ptr(), static_cast<uint64_t>(t.nbytes()), dev});
    out.emplace_back(info.name, std::move(t));
  }
  r.load_many(reqs);
  return out;
}

}  // namespace libtorch
}  // namespace ckptio

#endif
