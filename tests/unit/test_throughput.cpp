// The model FLOPs of a step and the device peaks (train/throughput.h), against figures worked by
// hand from the formula 6·N + 12·L·T·C per token.
#include <doctest/doctest.h>

#include "train/throughput.h"

using namespace ft;

namespace {

// dim 64, 2 layers, 4 heads of 16 (HD 64), 2 kv heads (KD 32), ffn 96, vocabulary 100:
// a layer's matmuls 64·64 + 2·64·32 + 64·64 + 3·64·96 = 30720, lm_head 6400.
Recipe small() {
  Recipe r;
  r.model.dim = 64;
  r.model.n_layers = 2;
  r.model.n_heads = 4;
  r.model.n_kv_heads = 2;
  r.model.ffn_dim = 96;
  r.model.vocab_size = 100;
  r.data.seq_len = 8;
  r.training.global_batch_size = 3;
  return r;
}

constexpr double kLayer = 30720, kHead = 6400, kAttn = 12.0 * 2 * 8 * 64;

}  // namespace

TEST_CASE("throughput: 6N + 12LTC per token, over the global batch's tokens") {
  Recipe r = small();
  const double tokens = 3 * 8;
  CHECK(step_model_flops(r) == doctest::Approx((6 * (2 * kLayer + kHead) + kAttn) * tokens));

  SUBCASE("LoRA: the frozen base 4 per weight, the adapter 6") {
    r.adapter.type = "lora";
    r.adapter.r = 4;
    r.adapter.target_modules = {"q_proj", "down_proj"};
    // q: A (4, 64) + B (64, 4) = 512; down: A (4, 96) + B (64, 4) = 640; per layer 1152.
    const double base = 4 * (2 * kLayer + kHead), adapters = 6 * 2 * 1152.0;
    CHECK(step_model_flops(r) == doctest::Approx((base + adapters + kAttn) * tokens));
    r.adapter.modules_to_save = {"lm_head"};  // lm_head trains: 6 per weight
    CHECK(step_model_flops(r) == doctest::Approx((base + 2 * kHead + adapters + kAttn) * tokens));
  }
  SUBCASE("DPO: two rows a pair; reference base adds a forward") {
    r.training.objective = "dpo";
    const double train = 6 * (2 * kLayer + kHead) + kAttn;
    CHECK(step_model_flops(r) == doctest::Approx(train * 2 * tokens));
    r.dpo.reference = "base";
    const double ref = 2 * (2 * kLayer + kHead) + kAttn / 3;
    CHECK(step_model_flops(r) == doctest::Approx((train + ref) * 2 * tokens));
  }
}

TEST_CASE("throughput: device peaks by name and precision, or logging.peak_tflops") {
  Recipe r = small();
  r.training.precision = "bf16";
  CHECK(device_peak_flops(r, "NVIDIA H100 80GB HBM3", true) == doctest::Approx(989.4e12));
  CHECK(device_peak_flops(r, "NVIDIA H100 PCIe", true) == doctest::Approx(756e12));
  CHECK(device_peak_flops(r, "NVIDIA L40S", true) == doctest::Approx(362.05e12));
  CHECK(device_peak_flops(r, "NVIDIA L4", true) == doctest::Approx(121e12));
  CHECK(device_peak_flops(r, "an unknown GPU", true) == 0);
  CHECK(device_peak_flops(r, "cpu (x86-64)", false) == 0);
  r.training.precision = "fp32";
  CHECK(device_peak_flops(r, "NVIDIA A100-SXM4-80GB", true) == doctest::Approx(19.5e12));
  r.runtime.tf32 = true;
  CHECK(device_peak_flops(r, "NVIDIA A100-SXM4-80GB", true) == doctest::Approx(156e12));
  r.logging.peak_tflops = 2.5;
  CHECK(device_peak_flops(r, "cpu (x86-64)", false) == doctest::Approx(2.5e12));
}

TEST_CASE("throughput: the slowest rank is the least busy GPU with a reading") {
  using V = std::vector<RankUsage>;
  CHECK(slowest_rank(V{}) == -1);
  CHECK(slowest_rank(V{{false, 0, 0}, {false, 0, 0}}) == -1);  // no readings (the CPU)
  CHECK(slowest_rank(V{{true, 90, 5}}) == 0);                  // one rank: itself
  CHECK(slowest_rank(V{{true, 90, 5}, {true, 40, 7}, {true, 60, 9}}) == 1);
  CHECK(slowest_rank(V{{true, 40, 5}, {true, 40, 7}, {true, 60, 9}}) == 0);  // tie: lowest rank
  CHECK(slowest_rank(V{{true, 0, 5}, {true, 40, 7}}) == 0);                  // 0 % counts
  // A rank without a reading is never the slowest, even where its 0 would be the lowest.
  CHECK(slowest_rank(V{{false, 0, 0}, {true, 70, 7}, {true, 50, 9}}) == 2);
}
