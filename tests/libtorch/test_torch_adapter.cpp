// The libtorch adapter (include/ckptio_torch.hpp) against the real libtorch
// of the torch wheel: every dtype round-trips bit for bit, non-contiguous
// tensors save and load, a module's parameters and buffers load in place,
// an async save keeps what it saved after wait_snapshot while the tensors
// change, mismatches are refused with the rule broken. Prints one line per
// check; exits 1 on the first failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ckptio_torch.hpp"

namespace lt = ckptio::libtorch;

static int checks = 0;
#define EXPECT(cond, what)                                             \
  do {                                                                \
    checks++;                                                         \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, what); \
      std::exit(1);                                                   \
    }                                                                 \
  } while (0)

// Bitwise equality (NaN-safe, and float8 has no eq kernel everywhere).
static bool same_bits(const at::Tensor &a, const at::Tensor &b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.contiguous().cpu(), y = b.contiguous().cpu();
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

static at::Tensor sample(c10::ScalarType t) {
  at::Tensor f = torch::randn({5, 7});
  if (t == c10::kBool) return f > 0;
  if (c10::isIntegralType(t, false)) return torch::randint(0, 100, {5, 7}).to(t);
  if (t == c10::kComplexFloat) return torch::complex(f, -f);
  return f.to(t);
}

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

int main() {
  const char *tmp = std::getenv("CKPTIO_TEST_TMPDIR");
  std::string dir = tmp ? tmp : "/tmp";
  torch::manual_seed(0);
  ckptio::context ctx;

  // Every dtype, plus a non-contiguous view.
  lt::named_tensors all;
  for (auto t : {c10::kBool, c10::kByte, c10::kChar, c10::kShort, c10::kUInt16, c10::kInt, c10::kUInt32, c10::kLong,
                 c10::kUInt64, c10::kHalf, c10::kBFloat16, c10::kFloat, c10::kDouble, c10::kComplexFloat,
                 c10::ScalarType::Float8_e5m2, c10::ScalarType::Float8_e4m3fn, c10::ScalarType::Float8_e4m3fnuz,
                 c10::ScalarType::Float8_e5m2fnuz})
    all.emplace_back(std::string("t_") + c10::toString(t), sample(t));
  all.emplace_back("transposed", torch::randn({6, 3}).t());
  std::string path = dir + "/libtorch_all.safetensors";
  lt::save(ctx, path, all, {{"step", "12"}});
  auto back = lt::load(ctx, path);
  EXPECT(back.size() == all.size(), "every tensor comes back");
  for (const auto &[name, t] : all) {
    bool found = false;
    for (const auto &[n2, u] : back)
      if (n2 == name) {
        found = true;
        EXPECT(same_bits(t, u), name.c_str());
      }
    EXPECT(found, name.c_str());
  }
  EXPECT(ckptio::reader::open(ctx, path).metadata("step").value_or("") == "12", "metadata is kept");
  std::printf("ok: %zu dtypes and a transposed view round-trip bit for bit\n", all.size() - 1);

  // A module into a fresh one, in place; a non-contiguous target too.
  Net a, b;
  a.train();
  a.forward(torch::randn({4, 8}));  // moves the batch-norm running stats
  std::string mpath = dir + "/libtorch_net.pt";
  lt::save(ctx, mpath, lt::state_of(a), {}, CKPTIO_FORMAT_PYTORCH);
  const void *where = b.fc1->weight.data_ptr();
  lt::load_into(ctx, mpath, b);
  EXPECT(b.fc1->weight.data_ptr() == where, "loaded in place");
  auto sa = lt::state_of(a), sb = lt::state_of(b);
  for (size_t i = 0; i < sa.size(); i++) EXPECT(same_bits(sa[i].second, sb[i].second), sa[i].first.c_str());
  a.eval();
  b.eval();
  auto x = torch::randn({3, 8});
  EXPECT(torch::equal(a.forward(x), b.forward(x)), "the restored module computes the same");
  at::Tensor target = torch::zeros({6, 3}).t();  // non-contiguous [3, 6]
  lt::load_into(ctx, path, {{"transposed", target}}, false);
  EXPECT(same_bits(target, all.back().second), "a non-contiguous target is filled");
  std::printf("ok: a module's %zu parameters and buffers load in place (torch.save format)\n", sa.size());

  // Async: the save holds what was there at commit.
  at::Tensor w = torch::randn({256, 256}), before = w.clone();
  auto pending = lt::save_async(ctx, dir + "/libtorch_async.safetensors", {{"w", w}});
  pending.wait_snapshot();
  w.add_(1.0);
  pending.wait_durable();
  EXPECT(same_bits(lt::load(ctx, dir + "/libtorch_async.safetensors")[0].second, before), "the snapshot holds");
  std::printf("ok: an async save keeps the snapshot while the tensor changes\n");

  // Refusals.
  try {
    lt::load_into(ctx, path, {{"t_Float", torch::zeros({7, 5})}}, false);
    EXPECT(false, "a shape mismatch is refused");
  } catch (const ckptio::error &e) {
    EXPECT(e.code() == CKPTIO_E_SHAPE, e.what());
  }
  try {
    lt::load_into(ctx, mpath, {{"fc1.weight", b.fc1->weight}}, true);
    EXPECT(false, "strict refuses a checkpoint holding more");
  } catch (const ckptio::error &e) {
    EXPECT(e.code() == CKPTIO_E_NOT_FOUND, e.what());
  }
  try {
    lt::save(ctx, dir + "/x.safetensors", {{"c128", torch::zeros({2}, torch::kComplexDouble)}});
    EXPECT(false, "complex128 is refused");
  } catch (const ckptio::error &e) {
    EXPECT(e.code() == CKPTIO_E_DTYPE, e.what());
  }
  std::printf("ok: mismatched shapes, extra tensors and unknown dtypes are refused\n");

  if (torch::cuda::is_available()) {
    auto g = lt::load(ctx, path, c10::Device(c10::kCUDA, 0));
    for (size_t i = 0; i < g.size(); i++) EXPECT(same_bits(g[i].second, back[i].second), g[i].first.c_str());
    std::printf("ok: loaded onto cuda:0\n");
  } else {
    std::printf("note: no CUDA device: the adapter's CUDA path (device pointers, current stream) was not run\n");
  }
  std::printf("%d checks passed\n", checks);
  return 0;
}
