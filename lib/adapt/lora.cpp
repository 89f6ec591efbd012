#include "adapt/lora.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/philox.h"
#include "model/layout.h"
#include "model/llama.h"

namespace ft {
namespace {

constexpr size_t kNone = SIZE_MAX;
constexpr int kProjs = 7;  // q, k, v, o, gate, up, down: Proj's block projections

// The projection of a Hugging Face module name, and its module under model.layers.N.
Proj proj_of(const std::string& name) {
  for (int p = 0; p < kProjs; ++p)
    if (name == proj_name(Proj(p))) return Proj(p);
  throw UsageError("adapter.target_modules: unknown module '" + name + "'");
}
std::string module_path(int layer, Proj p) {
  const bool attn = p == Proj::kQ || p == Proj::kK || p == Proj::kV || p == Proj::kO;
  return "model.layers." + std::to_string(layer) + (attn ? ".self_attn." : ".mlp.") + proj_name(p);
}
bool row_parallel(Proj p) { return p == Proj::kO || p == Proj::kDown; }

// Element j of a tensor drawn uniform in (−bound, bound) under key: a function of (key, j) only,
// so every layout draws the same values (Philox, kernels/philox.h; the fourth counter word set
// apart from the normal draws').
float uniform_at(uint64_t key, uint64_t j, double bound) {
  const kernels::philox::Block b = kernels::philox::philox4x32_10(
      uint32_t(j), uint32_t(j >> 32), 0u, 1u, uint32_t(key), uint32_t(key >> 32));
  const double u = (double(b.w[0]) + 0.5) * (1.0 / 4294967296.0);  // in (0, 1)
  return float(bound * (2.0 * u - 1.0));
}

}  // namespace

uint64_t lora_dropout_key(uint64_t seed, uint64_t sample, int layer, Proj proj) {
  auto mix = [](uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed ^ 0x6c6f7261ull) + sample) + uint64_t(layer) * 8 + uint64_t(proj));
}

// The LoRA term of every adapted projection. The forward keeps nothing: the backward recomputes
// t = s·dropout(x)·Aᵀ (N × r, small), so activation checkpointing and the pipeline's slots need
// nothing of it.
//   forward:  t = s·xd·Aᵀ;  y += t·Bᵀ                      (xd = dropout(x), or x)
//   backward: dB += dyᵀ·t;  dt = s·dy·B;  dA += dtᵀ·xd;  dx += dropout'(dt·A)
// Tensor parallelism: a column layer's dy, B and dt are this rank's rows (dt a partial sum:
// summed over the group before dA, after dx took this rank's share, which reduce_input_grad
// sums with the base layer's); a row layer's x and A are this rank's columns (t a partial sum:
// summed before dB; in the forward it joins the base layer's partial sum).
class LoraHooks final : public LinearHooks {
 public:
  LoraHooks(const AdapterConfig& cfg, const ParamLayout& layout, Device* dev, uint64_t seed)
      : r_(cfg.r), s_(float(cfg.scaling())), p_(float(cfg.dropout)), seed_(seed), dev_(dev) {
    slot_.fill({kNone, kNone});
    const int g = layout.attached_group(1);  // every block's adapter group is alike
    FT_CHECK(g >= 0, "LoRA: block 0 has no adapter group");
    const ParamGroup& group = layout.groups()[size_t(g)];
    for (size_t i = 0; i + 1 < group.entries.size(); i += 2) {
      const std::string& a = group.entries[i].name;
      const size_t dot = a.rfind(".lora_A.weight");
      FT_CHECK(dot != std::string::npos, "LoRA: unexpected tensor ", a);
      const Proj p = proj_of(a.substr(a.rfind('.', dot - 1) + 1, dot - a.rfind('.', dot - 1) - 1));
      slot_[size_t(p)] = {group.entries[i].offset, group.entries[i + 1].offset};
    }
  }

  // Key (layer, proj, b) at ((layer · kProjs + proj) · B + b): drop() reads its own. A
  // projection without an adapter keeps its place, with keys of 0 that nothing reads.
  size_t dropout_key_count(int B, int n_layers) const override {
    return p_ == 0.0f ? 0 : size_t(n_layers) * kProjs * size_t(B);
  }
  void dropout_keys(uint64_t first_sample, int B, int n_layers, uint64_t* keys) const override {
    if (p_ == 0.0f) return;
    std::fill_n(keys, dropout_key_count(B, n_layers), uint64_t{0});
    for (int l = 0; l < n_layers; ++l)
      for (int p = 0; p < kProjs; ++p)
        if (slot_[size_t(p)].a != kNone)
          for (int b = 0; b < B; ++b)
            keys[(size_t(l) * kProjs + size_t(p)) * size_t(B) + size_t(b)] =
                lora_dropout_key(seed_, first_sample + uint64_t(b), l, Proj(p));
  }

  bool adapts(const LinearSite& site) const override {
    return site.layer >= 0 && int(site.proj) < kProjs && slot_[size_t(site.proj)].a != kNone;
  }

  void forward(const LinearContext& c, const Linear& l, int layer, Ref y, CRef x,
               int N) const override {
    const Slot& at = slot_[size_t(l.proj)];
    Ops& ops = c.dev->ops();
    const Stream st = c.dev->stream();
    ensure(N, l.in, x.dtype);
    const CRef xd = dropped(c, l, layer, x, N);
    ops.linear_forward(st, t_.data(), xd, c.adapter + at.a, N, l.in, r_, false);
    scale(c, t_.data(), size_t(N) * r_);
    ops.linear_forward(st, y, t_.data(), c.adapter + at.b, N, r_, l.out, /*accumulate=*/true);
  }

  void backward(const LinearContext& c, const Linear& l, int layer, Ref dx, CRef dy, CRef x,
                int N) const override {
    FT_CHECK(c.adapter_grad != nullptr, "LoRA backward without the adapter's gradient");
    const Slot& at = slot_[size_t(l.proj)];
    Ops& ops = c.dev->ops();
    const Stream st = c.dev->stream();
    const size_t Nr = size_t(N) * r_;
    ensure(N, l.in, x.dtype);
    const CRef xd = dropped(c, l, layer, x, N);
    const CRef A = c.adapter + at.a, B = c.adapter + at.b;
    float* const dA = c.adapter_grad + at.a;
    float* const dB = c.adapter_grad + at.b;
    ops.linear_forward(st, t_.data(), xd, A, N, l.in, r_, false);  // the forward's t, again
    scale(c, t_.data(), Nr);
    const bool split = c.tp->size() > 1;
    if (split && l.row_parallel()) c.tp->all_reduce(t_.data(), Nr, t32_.data());
    ops.linear_backward(st, dt_.data(), dB, dy, t_.data(), B, N, r_, l.out, false);
    scale(c, dt_.data(), Nr);
    const bool partial_dt = split && !l.row_parallel();
    const bool dropout_on = dropping(c);
    // dx += dropout'(dt·A): with dropout through dxd_, the mask applied again (the op's backward).
    const Ref dxd = dropout_on ? dxd_.data() : dx;
    ops.linear_backward(st, dxd, partial_dt ? nullptr : dA, dt_.data(), xd, A, N, l.in, r_,
                        /*accumulate_dx=*/!dropout_on);
    if (dropout_on) {
      drop(c, l, layer, dxd, dxd, N);
      ops.add(st, dx, dxd, size_t(N) * l.in);
    }
    if (partial_dt) {
      c.tp->all_reduce(dt_.data(), Nr, t32_.data());
      ops.linear_backward(st, Ref(nullptr, dx.dtype), dA, dt_.data(), xd, A, N, l.in, r_, false);
    }
  }

 private:
  struct Slot {
    size_t a, b;  // offsets of A and B in the block's adapter group; kNone: not adapted
  };

  // Scratch for N rows: t and dt (N, r) in the compute dtype, an fp32 copy of one for a 16-bit
  // tensor all-reduce, and with dropout the dropped input and its gradient (N, in).
  void ensure(int N, int in, DType dt) const {
    const size_t Nr = size_t(N) * r_;
    if (t_.size() < Nr || t_.dtype() != dt) {
      const MemoryScope tag(MemoryCategory::kActivations);
      t_ = DBuffer(dev_, dt, Nr);
      dt_ = DBuffer(dev_, dt, Nr);
      t32_ = Buffer<float>(dev_, dt == DType::kF32 ? 0 : Nr);
    }
    if (p_ > 0 && (xd_.size() < size_t(N) * in || xd_.dtype() != dt)) {
      const MemoryScope tag(MemoryCategory::kActivations);
      xd_ = DBuffer(dev_, dt, size_t(N) * in);
      dxd_ = DBuffer(dev_, dt, size_t(N) * in);
    }
  }

  // y (n) *= s, in its own dtype.
  void scale(const LinearContext& c, Ref y, size_t n) const {
    c.dev->ops().dropout_scale(c.dev->stream(), y, y, n, 1, 0, 0.0f, s_, nullptr);
  }

  bool dropping(const LinearContext& c) const { return p_ > 0 && c.training; }
  // The first column of x in the layer's whole input: a row layer's x is this rank's columns.
  static size_t col0(const LinearContext& c, const Linear& l) {
    return l.row_parallel() ? size_t(c.tp->rank()) * size_t(l.in) : 0;
  }
  // y = dropout(x) (or its backward), sample by sample: each sample's rows under its own key
  // (lora_dropout_key), so that every layout draws the masks one process draws.
  void drop(const LinearContext& c, const Linear& l, int layer, Ref y, CRef x, int N) const {
    const size_t T = size_t(c.seq_len), row = T * size_t(l.in);
    const size_t B = size_t(N) / T;
    FT_CHECK(T > 0 && size_t(N) % T == 0, "LoRA dropout: ", N, " rows of sequences of ", T);
    FT_CHECK(c.dropout_keys && size_t(c.dropout_samples) == B, "LoRA dropout: keys for ",
             c.dropout_samples, " samples staged, ", B, " asked for");
    const uint64_t* keys = c.dropout_keys + (size_t(layer) * kProjs + size_t(l.proj)) * B;
    for (size_t b = 0; b < B; ++b)
      c.dev->ops().dropout_scale(c.dev->stream(), y + b * row, x + b * row, T, size_t(l.in),
                                 col0(c, l), p_, 1.0f, keys + b);
  }

  // The adapter's input: x, or in training with dropout its dropped copy.
  CRef dropped(const LinearContext& c, const Linear& l, int layer, CRef x, int N) const {
    if (!dropping(c)) return x;
    drop(c, l, layer, xd_.data(), x, N);
    return xd_.data();
  }

  int r_;
  float s_, p_;
  uint64_t seed_;
  Device* dev_;
  std::array<Slot, kProjs> slot_;
  mutable DBuffer t_, dt_, xd_, dxd_;
  mutable Buffer<float> t32_;
};

LoraConverter::LoraConverter(AdapterConfig config) : config_(std::move(config)) {}
LoraConverter::~LoraConverter() = default;

void LoraConverter::convert_layout(ParamLayout& layout) const {
  const int model_groups = int(layout.groups().size());
  for (int g = 0; g < model_groups; ++g) layout.set_trainable(g, false);
  // modules_to_save: whole modules of the base trained beside the adapter (PEFT's
  // ModulesToSaveWrapper). The embedding is group 0 alone. lm_head shares the head group with
  // the final norm, which PEFT does not train: the norm moves to a frozen group of its own
  // ("norm", after the model's), and the head group, lm_head.weight alone, trains. With tied
  // embeddings lm_head is the embedding's table (group 0): PEFT's ensure_weight_tying.
  const TensorAt out = layout.output_weight();
  if (config_.saves("embed_tokens")) layout.set_trainable(0, true);
  if (config_.saves("lm_head")) {
    if (out.group != 0 && out.group == layout.final_norm().group)
      layout.split_off("model.norm.weight", "norm");
    layout.set_trainable(layout.output_weight().group, true);
  }
  // QLoRA: the blocks' matrices in NF4 (every linear layer of a block, adapted or not, as
  // QLoRA quantizes every nn.Linear but lm_head); the embedding, the head and the norms stay in
  // the compute dtype.
  if (config_.type == "qlora")
    for (int l = 0; l < layout.n_layers(); ++l) layout.set_nf4(1 + l);
  const int T = layout.tensor();
  const int64_t r = config_.r;
  for (int i = 0; i < layout.n_layers(); ++i) {
    ParamGroup g;
    g.name = "lora.layers." + std::to_string(i);
    g.attached_to = 1 + i;
    for (const std::string& target : config_.targets()) {
      const Proj p = proj_of(target);
      const std::string module = module_path(i, p);
      int base_group = -1;
      const ParamEntry* base = nullptr;
      FT_CHECK(layout.find(module + ".weight", &base_group, &base), "LoRA: the model has no ",
               module, ".weight");
      const int64_t out = base->global_shape[0], in = base->global_shape[1];
      const bool row = row_parallel(p);
      add_param(g, "base_model.model." + module + ".lora_A.weight", {r, in}, T,
                row ? TensorSplit::kCols : TensorSplit::kReplicated);
      add_param(g, "base_model.model." + module + ".lora_B.weight", {out, r}, T,
                row ? TensorSplit::kReplicated : TensorSplit::kRows);
    }
    layout.add_group(std::move(g));
  }
}

void LoraConverter::convert_model(LlamaModel& model, uint64_t seed) const {
  const ParamLayout& layout = model.layout();
  const int t = model.tensor_rank();
  if (config_.from.empty()) {
    // A as PEFT's init_lora_weights: True (Kaiming-uniform with a = √5: bound 1/√in) or
    // "gaussian" (N(0, 1/r)); B stays zero, so the adapted model starts as the base.
    std::vector<float> host;
    for (size_t g = 0; g < layout.groups().size(); ++g) {
      const ParamGroup& group = layout.groups()[g];
      if (group.attached_to < 0 || !model.owns_group(int(g))) continue;
      host.assign(group.numel, 0.0f);
      for (const ParamEntry& e : group.entries) {
        if (e.name.find(".lora_A.") == std::string::npos) continue;
        const uint64_t key = init_random_key(seed, e.name);
        const double in = double(e.global_shape[1]);
        for_each_slice_run(e, t, [&](size_t whole, size_t local, size_t n) {
          float* dst = host.data() + e.offset + local;
          if (config_.init == "gaussian")
            kernels::philox::fill_normal(dst, 0, n, key, whole, 1.0 / config_.r);
          else
            for (size_t j = 0; j < n; ++j) dst[j] = uniform_at(key, whole + j, 1.0 / std::sqrt(in));
        });
      }
      model.flat_params().params()[g].upload(host.data(), host.size());
    }
  }
  hooks_ = std::make_unique<LoraHooks>(config_, layout, model.device(), seed);
  model.set_linear_hooks(hooks_.get());
}

}  // namespace ft
