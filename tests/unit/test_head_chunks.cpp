// The head in chunks (LlamaModel::set_loss_chunk_tokens, training.loss_chunk_tokens; DESIGN.md
// §3 "The head in chunks"): the model runs the output projection, the cross-entropy and the
// head's backward over chunks of tokens, and a micro-batch cut in chunks of 5 tokens (12 tokens:
// 5, 5 and a short 2) computes the loss, the evaluation's loss and every gradient of the same
// micro-batch in one chunk (to fp32's rounding: the GEMMs' kernels round a short block of rows
// otherwise, and a trained head's weight gradient sums its rows chunk by chunk), while holding
// fewer bytes at its peak. For every kind of head: trained (untied and tied to the embedding),
// frozen under a LoRA adapter (an adapter's base) and lm_head trained whole beside one
// (modules_to_save, the final norm then in a group of its own); each with one tensor rank and as
// tensor rank 0 of 2, whose counting communicator reduces nothing but which takes the
// vocabulary-parallel cross-entropy's path, its statistics chunk by chunk. ZeRO's gradient
// buffers, pipeline stages and the emulated GPU are the CLI test's (test_loss_chunks.sh).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "adapt/lora.h"
#include "comm/counting_communicator.h"
#include "model/llama.h"
#include "runtime/device.h"
#include "tiny_model.h"

namespace ft {
namespace {

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The largest difference relative to the largest magnitude of `want`.
float rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  const float scale = std::max(max_abs(want), 1e-20f);
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  return worst;
}

enum class Head { kTrained, kFrozen, kSavedBesideLora };

const char* head_name(Head h) {
  return h == Head::kTrained ? "trained" : h == Head::kFrozen ? "frozen (LoRA)" : "modules_to_save";
}

struct Result {
  double loss = 0, eval = 0;
  std::vector<std::vector<float>> grads;  // every trained group's, in layout order
  std::vector<std::string> names;
  size_t peak_bytes = 0;
};

// One forward and backward of a fixed micro-batch (B 2 × T 6, one target masked), then an
// evaluation of it, with the head cut in chunks of `chunk` tokens (0: one chunk).
Result run(Head head, bool tied, int tensor, int chunk) {
  auto dev = make_device("cpu");  // its own, for the peak
  ModelConfig cfg = linear_test_config();
  cfg.vocab_size = 20;  // divisible by two tensor ranks
  cfg.tie_embeddings = tied;
  const int B = 2, T = 6, N = B * T, V = cfg.vocab_size;
  std::vector<int32_t> in(N), tgt(N);
  std::vector<uint8_t> mask(N, 1);
  mask[3] = 0;
  for (int n = 0; n < N; ++n) in[size_t(n)] = (5 * n + 3) % V, tgt[size_t(n)] = (7 * n + 1) % V;

  ModelConverters convs;
  if (head != Head::kTrained) {
    AdapterConfig ac;
    ac.type = "lora";
    ac.r = 2;
    ac.alpha = 4;
    ac.target_modules = {"all-linear"};
    if (head == Head::kSavedBesideLora) ac.modules_to_save = {"lm_head"};
    convs.push_back(std::make_unique<LoraConverter>(ac));
  }
  CountingCommunicator comm(tensor, 0, "tensor");
  LlamaModel m(cfg, dev.get(), false, tensor > 1 ? &comm : nullptr, {}, DType::kF32, &convs);
  m.set_loss_chunk_tokens(chunk);
  m.init_random(7, 0.1);
  const ParamLayout& layout = m.layout();
  if (!convs.empty()) {
    convs.front()->convert_model(m, 11);
    for (int l = 0; l < cfg.n_layers; ++l) {  // B ≠ 0, so that every term acts
      const int ag = layout.attached_group(1 + l);
      std::vector<float> p(m.flat_params().params()[size_t(ag)].size());
      m.flat_params().params()[size_t(ag)].download(p.data(), p.size());
      for (size_t i = 0; i < p.size(); ++i) p[i] += 0.2f * std::sin(float(3 * i + l));
      m.flat_params().params()[size_t(ag)].upload(p.data(), p.size());
    }
  }
  m.forward_backward(in.data(), tgt.data(), mask.data(), B, T, 1.0f / float(N));
  Result r;
  r.loss = m.take_loss_sum();
  for (size_t g = 0; g < layout.groups().size(); ++g) {
    if (!layout.groups()[g].trains()) continue;
    Buffer<float>& b = m.flat_params().grads()[g];
    r.grads.emplace_back(b.size());
    b.download(r.grads.back().data(), b.size());
    r.names.push_back(layout.groups()[g].name);
  }
  r.peak_bytes = dev->stats().peak_bytes;
  m.forward_loss(in.data(), tgt.data(), mask.data(), B, T);
  r.eval = m.take_loss_sum();
  return r;
}

}  // namespace

TEST_CASE("the head in chunks of tokens: the loss and gradients of one chunk, with less memory") {
  for (Head head : {Head::kTrained, Head::kFrozen, Head::kSavedBesideLora})
    for (bool tied : {false, true})
      for (int tensor : {1, 2}) {
        CAPTURE(head_name(head));
        CAPTURE(tied);
        CAPTURE(tensor);
        const Result one = run(head, tied, tensor, 0), cut = run(head, tied, tensor, 5);
        // fp32 sums in another order: the loss sums its chunks' sums (double), the head's
        // weight gradient its chunks' products; seen within 3e-9 (loss) and 2.3e-7 (gradients).
        CHECK(cut.loss == doctest::Approx(one.loss).epsilon(1e-6));
        CHECK(cut.eval == doctest::Approx(one.eval).epsilon(1e-6));
        CHECK(one.eval == doctest::Approx(one.loss).epsilon(1e-6));
        REQUIRE(cut.grads.size() == one.grads.size());
        REQUIRE(!one.grads.empty());
        for (size_t g = 0; g < one.grads.size(); ++g) {
          CAPTURE(one.names[g]);
          CHECK(max_abs(one.grads[g]) > 0);
          CHECK(rel_diff(cut.grads[g], one.grads[g]) < 1e-6f);
        }
        // One chunk holds 12 rows of logits (N, V / tensor) in fp32; chunks of 5 hold 5, and
        // that is the whole difference at the peak.
        CHECK(one.peak_bytes - cut.peak_bytes == size_t(12 - 5) * size_t(20 / tensor) * 4);
      }
}

// A chunk as large as the micro-batch, or larger, is one chunk: the same bits as 0.
TEST_CASE("the head in chunks: a chunk of the whole micro-batch is one chunk, bit for bit") {
  for (int chunk : {12, 13, 1024}) {
    CAPTURE(chunk);
    const Result one = run(Head::kTrained, false, 1, 0),
                 same = run(Head::kTrained, false, 1, chunk);
    CHECK(same.loss == one.loss);
    for (size_t g = 0; g < one.grads.size(); ++g) CHECK(same.grads[g] == one.grads[g]);
    CHECK(same.peak_bytes == one.peak_bytes);
  }
}

}  // namespace ft
