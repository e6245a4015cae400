// A C++ training loop with libtorch that checkpoints through ckptio: a small
// MLP learns y = sin(x); every N steps the parameters (and the step) are
// saved in the background, the next step waits only for the snapshot, and at
// the end a fresh model restored from the last checkpoint must compute
// exactly what the trained one computes.
//
//   train [DIR] [STEPS] [EVERY]
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "ckptio_torch.hpp"

namespace lt = ckptio::libtorch;

struct Mlp : torch::nn::Module {
  Mlp() {
    l1 = register_module("l1", torch::nn::Linear(1, 64));
    l2 = register_module("l2", torch::nn::Linear(64, 64));
    l3 = register_module("l3", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return l3(torch::tanh(l2(torch::tanh(l1(x))))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};

int main(int argc, char **argv) {
  std::string dir = argc > 1 ? argv[1] : ".";
  int steps = argc > 2 ? std::atoi(argv[2]) : 200, every = argc > 3 ? std::atoi(argv[3]) : 50;
  std::string path = dir + "/mlp.safetensors";
  torch::manual_seed(1);
  ckptio::context ctx;
  Mlp net;
  torch::optim::Adam opt(net.parameters(), 1e-2);
  std::optional<lt::pending_save> save;
  try {
    for (int step = 1; step <= steps; step++) {
      torch::Tensor x = torch::rand({128, 1}) * 6 - 3, loss = torch::mse_loss(net.forward(x), torch::sin(x));
      opt.zero_grad();
      loss.backward();
      if (save) save->wait_snapshot();  // the optimizer may now change the weights
      opt.step();
      if (step % every == 0) {
        if (save) save->wait_durable();
        save.emplace(lt::save_async(ctx, path, lt::state_of(net), {{"step", std::to_string(step)}}));
        std::printf("step %d: loss %.5f, checkpoint started\n", step, loss.item<float>());
      }
    }
    if (save) save->wait_durable();
    Mlp restored;
    lt::load_into(ctx, path, restored);
    torch::NoGradGuard no_grad;
    torch::Tensor x = torch::linspace(-3, 3, 101).unsqueeze(1);
    bool same = torch::equal(net.forward(x), restored.forward(x));
    auto r = ckptio::reader::open(ctx, path);
    std::printf("restored step %s from %s: %s\n", std::string(r.metadata("step").value_or("?")).c_str(), path.c_str(),
                same ? "identical outputs" : "OUTPUTS DIFFER");
    return same ? 0 : 1;
  } catch (const ckptio::error &e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
