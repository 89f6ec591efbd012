#include "train/throughput.h"

#include <cstring>

#include "core/log.h"
#include "model/config.h"

namespace ft {
namespace {

// A projection's weights, by its Hugging Face name (the whole model, not a tensor slice).
double proj_weights(const ModelConfig& m, const std::string& p) {
  const double C = m.dim, HD = double(m.n_heads) * head_dim_of(m),
               KD = double(m.n_kv_heads) * head_dim_of(m), F = m.ffn_dim;
  if (p == "q_proj") return C * HD;
  if (p == "k_proj" || p == "v_proj") return C * KD;
  if (p == "o_proj") return HD * C;
  return C * F;  // gate_proj, up_proj, down_proj
}

// A projection's (in, out).
std::pair<double, double> proj_shape(const ModelConfig& m, const std::string& p) {
  const double C = m.dim, HD = double(m.n_heads) * head_dim_of(m),
               KD = double(m.n_kv_heads) * head_dim_of(m), F = m.ffn_dim;
  if (p == "q_proj") return {C, HD};
  if (p == "k_proj" || p == "v_proj") return {C, KD};
  if (p == "o_proj") return {HD, C};
  if (p == "down_proj") return {F, C};
  return {C, F};  // gate_proj, up_proj
}

// Dense peak FLOP/s of NVIDIA GPUs (the vendors' data sheets, without sparsity): 16-bit tensor
// cores, TF32 tensor cores, fp32 CUDA cores. Matched by name, the more specific name first.
struct Peak {
  const char* name;
  double bf16, tf32, fp32;  // TFLOP/s
};
constexpr Peak kPeaks[] = {
    {"B200", 2250, 1100, 80},        {"H200", 989.4, 494.7, 66.9}, {"H100 PCIe", 756, 378, 51.2},
    {"H100 NVL", 835, 417.5, 60},    {"H100", 989.4, 494.7, 66.9}, {"A100", 312, 156, 19.5},
    {"L40S", 362.05, 183.2, 91.6},   {"L40", 181, 90.5, 90.5},     {"L4", 121, 60, 30.3},
    {"RTX 4090", 165.2, 82.6, 82.6}, {"A10G", 70, 35, 31.2},       {"A6000", 154.8, 77.4, 38.7},
};

}  // namespace

double step_model_flops(const Recipe& r) {
  const ModelConfig& m = r.model;
  const double L = m.n_layers, T = r.data.seq_len, C = m.dim, V = m.vocab_size;
  const bool adapter = r.adapter.enabled();
  double layer = 0;
  for (const char* p :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    layer += proj_weights(m, p);
  const double n_base = L * layer + V * C;  // every matmul weight, lm_head included
  double per_token = 12 * L * T * C;        // attention's products, forward and backward
  if (!adapter) {
    per_token += 6 * n_base;
  } else {
    const bool head_trains =
        r.adapter.saves("lm_head") || (m.tie_embeddings && r.adapter.saves("embed_tokens"));
    per_token += 4 * L * layer + (head_trains ? 6 : 4) * V * C;
    double adapters = 0;  // A (r, in) and B (out, r) of each adapted projection
    for (const std::string& p : r.adapter.targets()) {
      const auto [in, out] = proj_shape(m, p);
      adapters += double(r.adapter.r) * (in + out);
    }
    per_token += 6 * L * adapters;
  }
  const bool dpo = r.training.objective == "dpo";
  if (dpo && r.dpo.reference == "base") per_token += 2 * n_base + 4 * L * T * C;
  const double rows = double(r.training.global_batch_size) * (dpo ? 2 : 1);
  return per_token * rows * T;
}

double device_peak_flops(const Recipe& r, const std::string& device_name, bool cuda) {
  if (r.logging.peak_tflops > 0) return r.logging.peak_tflops * 1e12;
  if (!cuda) return 0;
  for (const Peak& p : kPeaks) {
    if (device_name.find(p.name) == std::string::npos) continue;
    const double t = r.training.precision != "fp32" ? p.bf16 : r.runtime.tf32 ? p.tf32 : p.fp32;
    return t * 1e12;
  }
  return 0;
}

int slowest_rank(const std::vector<RankUsage>& ranks) {
  int slowest = -1;
  for (int r = 0; r < int(ranks.size()); ++r)
    if (ranks[size_t(r)].known &&
        (slowest < 0 || ranks[size_t(r)].util_percent < ranks[size_t(slowest)].util_percent))
      slowest = r;
  return slowest;
}

GpuLoad gather_gpu_load(Communicator& world, Device& dev) {
  const Device::Usage own = dev.usage();
  // Doubles hold the bytes exactly up to 2^53 (8 PiB).
  const double mine[3] = {own.known ? 1.0 : 0.0, own.util_percent, double(own.mem_used_bytes)};
  std::vector<double> all(3 * size_t(world.size()));
  world.all_gather(Stream{}, CRef(mine, DType::kF64), Ref(all.data(), DType::kF64), 3).wait();
  std::vector<RankUsage> ranks(size_t(world.size()));
  for (size_t r = 0; r < ranks.size(); ++r)
    ranks[r] = RankUsage{all[3 * r] > 0, all[3 * r + 1], uint64_t(all[3 * r + 2])};

  if (!own.why_not.empty() && (world.rank() == 0 || ranks[0].known))
    log_warn("gpu_util: ", own.why_not,
             world.rank() == 0
                 ? "; the metrics lines go without gpu_util and gpu_mem_used_bytes from here on"
                 : "; rank 0's gpu_util_slowest is over the ranks with a reading");
  GpuLoad load;
  load.own_known = own.known;
  load.util_percent = own.util_percent;
  load.mem_used_bytes = own.mem_used_bytes;
  load.slowest_rank = slowest_rank(ranks);
  if (load.slowest_rank >= 0) {
    load.slowest_util_percent = ranks[size_t(load.slowest_rank)].util_percent;
    load.slowest_mem_used_bytes = ranks[size_t(load.slowest_rank)].mem_used_bytes;
  }
  return load;
}

}  // namespace ft
