// A frozen parameter group (ParamEntry::trainable, set here by lib/adapt/freeze.h's converter) at
// every ZeRO stage, in fp32 and bf16: no gradient, no master, no moments, no place in the norm or
// the NaN scan, and its weights never move while the others train. (tests/cli/test_freeze.sh
// runs the same across processes and layouts; this one also runs under the sanitizers.)
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "adapt/freeze.h"
#include "comm/communicator.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/zero.h"
#include "runtime/device.h"
#include "tiny_model.h"

namespace ft {
namespace {

std::vector<char> compute_bytes(LlamaModel& m, ZeroSharding& zero, int g) {
  const CRef p = zero.acquire_params(g);
  std::vector<char> out(m.layout().groups()[size_t(g)].numel * dtype_size(p.dtype));
  m.device()->copy_to_host(out.data(), p.ptr, out.size());
  zero.release_params(g);
  return out;
}

}  // namespace

TEST_CASE("frozen groups: no gradient, master or moments, unchanged weights, at every ZeRO stage") {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(dtype_name(dt));
      CAPTURE(stage);
      auto dev = make_device("cpu");
      auto comm = make_single_process_communicator();
      ModelConverters convs;
      convs.push_back(
          std::make_unique<FreezeGroups>(std::vector<std::string>{"embed", "layers.0"}));
      LlamaModel model(tiny_model_config(), dev.get(), false, nullptr, {}, dt, &convs);
      model.init_random(3, 0.2);
      const auto& groups = model.layout().groups();
      REQUIRE(groups.size() == 4);  // embed, layers.0, layers.1, head
      CHECK_FALSE(groups[0].trains());
      CHECK_FALSE(groups[1].trains());
      CHECK(groups[2].trains());
      CHECK(groups[3].trains());
      const size_t trained = groups[2].numel + groups[3].numel;

      ZeroSharding zero(stage, model.flat_params(), *comm, dev.get());
      OptimizerConfig oc;
      oc.lr = 0.05;
      oc.weight_decay = 0.1;
      AdamW adamw(model.layout(), oc, dev.get(), zero.ranges());
      // m and v of the trained groups, and the step's constants (two kernels::AdamwArgs).
      CHECK(adamw.state_bytes() == 2 * 4 * trained + 2 * sizeof(kernels::AdamwArgs));
      CHECK(zero.grads_bytes() == 4 * trained);
      for (int g : {0, 1}) {
        CHECK(zero.param_bases()[size_t(g)] == nullptr);
        CHECK(zero.grad_bases()[size_t(g)] == nullptr);
        CHECK(model.flat_params().grad(g) == nullptr);
      }
      for (int g : {2, 3}) CHECK(zero.param_bases()[size_t(g)] != nullptr);

      std::vector<std::vector<char>> before;
      for (int g = 0; g < 4; ++g) before.push_back(compute_bytes(model, zero, g));
      const int B = 1, T = 4;
      const int32_t in[T] = {1, 5, 7, 2}, tgt[T] = {5, 7, 2, 9};
      const uint8_t mask[T] = {1, 1, 1, 1};
      for (int step = 0; step < 2; ++step) {
        zero.begin_step(1);
        model.forward_backward(in, tgt, mask, B, T, 1.0f / T);
        zero.finish_backward();
        CHECK(zero.grad_sum_squares() > 0);
        CHECK(zero.first_nonfinite_grad() == -1);
        adamw.step(zero.param_bases(), zero.grad_bases(), oc.lr, 1.0f, zero.compute_bases());
        zero.finish_update();
      }
      for (int g = 0; g < 4; ++g) {
        CAPTURE(groups[size_t(g)].name);
        CHECK((compute_bytes(model, zero, g) == before[size_t(g)]) == !groups[size_t(g)].trains());
      }
      // The test hook poisons the first group that has a gradient: layers.1, whose first tensor
      // comes after embed's one and layers.0's nine in the layout's count.
      zero.begin_step(1);
      zero.inject_nan_grad_for_test();
      model.forward_backward(in, tgt, mask, B, T, 1.0f / T);
      zero.finish_backward();
      CHECK(zero.first_nonfinite_grad() == int64_t(1 + groups[1].entries.size()));
    }
}

// ft export --merge draws a seeded frozen base again on the host (init_random_group); it must be
// the model the run trained on, bit for bit: every family's tensors (qwen2's biases start at
// zero, qwen3's q/k norms at one), odd sizes, and a tied head.
TEST_CASE("init_random_group: the host's draw of a group has init_random's bits") {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    CAPTURE(arch);
    ModelConfig c = tiny_model_config();
    c.arch = arch;
    c.dim = 12;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.ffn_dim = 19;
    c.vocab_size = 37;
    c.tie_embeddings = std::string(arch) == "qwen2";
    auto dev = make_device("cpu");
    LlamaModel model(c, dev.get());
    model.init_random(7, 0.05);
    const ParamLayout whole(c, 1);
    for (size_t g = 0; g < whole.groups().size(); ++g) {
      CAPTURE(whole.groups()[g].name);
      std::vector<float> drawn(whole.groups()[g].numel), held(drawn.size());
      init_random_group(whole, int(g), 7, 0.05, drawn.data());
      model.flat_params().params()[g].download(held.data(), held.size());
      CHECK(std::memcmp(drawn.data(), held.data(), drawn.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace ft
