// A tensor rank or pipeline stage builds only its share of the model (train/setup.cpp): its
// random init draws its slices straight from the counter-based generator, and its HF import
// reads only its slices and groups. Both must give exactly the bits of the whole tensor sliced
// (slice_for_tensor_rank), which is what every rank built before.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "adapt/freeze.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "comm/counting_communicator.h"
#include "core/error.h"
#include "model/llama.h"
#include "parallel/tensor_parallel.h"
#include "runtime/device.h"
#include "temp_dir.h"

namespace {

// Every split kind (rows, columns, replicated; biases split with their rows), and columns
// whose count is not a multiple of the generator's 4-element block, so that a column slice's
// runs start inside a block.
ft::ModelConfig share_config() {
  ft::ModelConfig c;
  c.arch = "qwen2";  // q/k/v biases
  c.dim = 12;
  c.n_layers = 3;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.ffn_dim = 10;  // down_proj: 5 columns per rank
  c.vocab_size = 14;
  c.max_seq_len = 8;
  return c;
}

std::vector<const float*> const_ptrs(const std::vector<std::vector<float>>& h) {
  std::vector<const float*> p;
  for (const auto& g : h) p.push_back(g.empty() ? nullptr : g.data());
  return p;
}

std::vector<float*> ptrs(std::vector<std::vector<float>>& h) {
  std::vector<float*> p;
  for (auto& g : h) p.push_back(g.empty() ? nullptr : g.data());
  return p;
}

// Tensor rank t's slices of `whole` (groups of the one-rank layout), for the groups `local`
// holds (the others empty).
std::vector<std::vector<float>> sliced(const ft::ParamLayout& whole_layout,
                                       const std::vector<std::vector<float>>& whole,
                                       const ft::ParamLayout& local_layout,
                                       const std::vector<std::vector<float>>& local, int t) {
  std::vector<std::vector<float>> want;
  for (const auto& g : local) want.emplace_back(g.size());
  ft::slice_for_tensor_rank(whole_layout.groups(), const_ptrs(whole), local_layout.groups(),
                            ptrs(want), t);
  return want;
}

// Groups a rank does not hold are empty (data() may be null, which memcmp must not be given).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("init_random: a tensor rank and a pipeline stage draw the bits of the whole, sliced") {
  const ft::ModelConfig cfg = share_config();
  auto dev = ft::make_device("cpu");
  ft::LlamaModel whole(cfg, dev.get());
  whole.init_random(7, 0.02);
  const std::vector<std::vector<float>> w = whole.flat_params().to_host();
  for (int T : {1, 2}) {
    for (int t = 0; t < T; ++t) {
      // Stage: layers [1, 3) and the head, without the embedding.
      ft::CountingCommunicator comm(T, t, "tensor");
      ft::StageSpec stage;
      stage.first_layer = 1;
      stage.embed = false;
      ft::LlamaModel part(cfg, dev.get(), false, T > 1 ? &comm : nullptr, stage);
      part.init_random(7, 0.02);
      const std::vector<std::vector<float>> got = part.flat_params().to_host();
      const std::vector<std::vector<float>> want = sliced(whole.layout(), w, part.layout(), got, t);
      for (size_t g = 0; g < got.size(); ++g) {
        CAPTURE(T);
        CAPTURE(t);
        CAPTURE(g);
        CHECK(got[g].empty() == !part.owns_group(int(g)));
        CHECK(same_bits(got[g], want[g]));
      }
    }
  }
}

TEST_CASE("hf import: a tensor rank reads only its slices, a stage only its groups") {
  const ft::ModelConfig cfg = share_config();
  const ft::ParamLayout whole_layout(cfg);
  // Every tensor, in BF16 (converted on read), with values distinct per tensor and position.
  std::vector<std::vector<uint16_t>> bytes;
  std::vector<ft::SafetensorsTensorOut> outs;
  for (const auto& g : whole_layout.groups())
    for (const auto& e : g.entries) {
      bytes.emplace_back(e.numel);
      for (size_t i = 0; i < e.numel; ++i)
        bytes.back()[i] = ft::f32_to_bf16(std::sin(float(outs.size() * 131 + i)));
      outs.push_back({e.name, ft::DType::kBF16, e.global_shape, bytes.back().data()});
    }
  TempDir dir;
  ft::write_safetensors(dir.file("model.safetensors"), outs);

  std::vector<std::vector<float>> whole;
  for (const auto& g : whole_layout.groups()) whole.emplace_back(g.numel);
  ft::load_hf_weights(dir.path, whole_layout, ptrs(whole));

  const ft::ParamLayout half(cfg, 2);
  for (int t = 0; t < 2; ++t) {
    CAPTURE(t);
    // NaN everywhere, so an element never read shows; layer 0 (group 1) is another stage's.
    std::vector<std::vector<float>> got;
    for (const auto& g : half.groups())
      got.emplace_back(g.numel, std::numeric_limits<float>::quiet_NaN());
    got[1].clear();
    ft::load_hf_weights(dir.path, half, ptrs(got), t);
    const std::vector<std::vector<float>> want = sliced(whole_layout, whole, half, got, t);
    for (size_t g = 0; g < got.size(); ++g) {
      CAPTURE(g);
      CHECK(same_bits(got[g], want[g]));
    }
  }
  std::vector<std::vector<float>> bad;
  for (const auto& g : half.groups()) bad.emplace_back(g.numel);
  CHECK_THROWS_AS(ft::load_hf_weights(dir.path, half, ptrs(bad), 2), ft::Error);
}

// A frozen group with a 16-bit compute dtype is held in it alone (FlatParams::compute_only): the
// random init and the HF import write it through a staging buffer, piece by piece (here pieces
// of 7 elements, or of whole rows for a column slice: down_proj's 5 columns per rank), each
// converted. The bits are the fp32 path's, rounded once: what make_compute_copy made of them.
TEST_CASE("a frozen group in bf16 is held in bf16 only, written in pieces with fp32's bits") {
  const ft::ModelConfig cfg = share_config();
  auto dev = ft::make_device("cpu");
  ft::LlamaModel whole(cfg, dev.get());
  whole.init_random(7, 0.02);
  const std::vector<std::vector<float>> w = whole.flat_params().to_host();
  auto rounded = [](std::vector<std::vector<float>> v) {
    for (auto& g : v)
      for (float& x : g) x = ft::bf16_to_f32(ft::f32_to_bf16(x));
    return v;
  };
  for (int T : {1, 2})
    for (int t = 0; t < T; ++t) {
      CAPTURE(T);
      CAPTURE(t);
      ft::ModelConverters convs;
      convs.push_back(std::make_unique<ft::FreezeGroups>(
          std::vector<std::string>{"embed", "layers.0", "layers.1", "layers.2", "head"}));
      ft::CountingCommunicator comm(T, t, "tensor");
      ft::StageSpec stage;
      stage.first_layer = 1;
      stage.embed = false;
      ft::LlamaModel part(cfg, dev.get(), false, T > 1 ? &comm : nullptr, stage, ft::DType::kBF16,
                          &convs);
      ft::FlatParams& fp = part.flat_params();
      fp.set_staging_elems(7);
      const auto& groups = part.layout().groups();
      for (size_t g = 0; g < groups.size(); ++g) {
        CAPTURE(g);
        CHECK(fp.compute_only(int(g)) == part.owns_group(int(g)));
        CHECK(fp.params()[g].size() == 0);  // no fp32 buffer, ever
      }
      part.init_random(7, 0.02);
      std::vector<std::vector<float>> got = fp.to_host();
      std::vector<std::vector<float>> want =
          rounded(sliced(whole.layout(), w, part.layout(), got, t));
      for (size_t g = 0; g < got.size(); ++g) {
        CAPTURE(g);
        CHECK(got[g].empty() == !part.owns_group(int(g)));
        CHECK(same_bits(got[g], want[g]));
      }
      // The import's path: a group from fp32 values on the host.
      std::vector<std::vector<float>> host(groups.size());
      for (size_t g = 0; g < groups.size(); ++g) {
        if (!part.owns_group(int(g))) continue;
        host[g].resize(groups[g].numel);
        for (size_t i = 0; i < host[g].size(); ++i) host[g][i] = std::sin(float(37 * g + i));
        fp.upload_group(int(g), host[g].data());
      }
      got = fp.to_host();
      want = rounded(host);
      for (size_t g = 0; g < got.size(); ++g) {
        CAPTURE(g);
        CHECK(same_bits(got[g], want[g]));
      }
    }
}
