// Forward: x0 = E[ids]; for each layer
//   a = rmsnorm(x, w1); q,k,v = a·Wqᵀ (+ bq), a·Wkᵀ (+ bk), a·Wvᵀ (+ bv) (qwen2's biases);
//   qwen3: q, k = rmsnorm(q, wqn), rmsnorm(k, wkn) over each head's D channels (a (N·H, D)
//   matrix of rows, so the plain rmsnorm op serves); rope(q, k); o = attn(q, k, v)
//   y = x + o·Woᵀ; b = rmsnorm(y, w2); g, u = b·Wgᵀ, b·Wuᵀ; x' = y + (silu(g)∘u)·Wdᵀ
// then f = rmsnorm(x_L, wf); logits = f·Whᵀ (Wh = E when tied); cross-entropy.
// Backward walks the same steps in reverse. With activation checkpointing only each layer's
// input x is kept; the layer's forward is recomputed into one shared set of buffers before its
// backward.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/kernels.h"
#include "model/arch.h"
#include "model/rope.h"

namespace ft {
// Activations of one layer, (N = B*T rows), in the compute dtype; statistics in fp32.
struct LayerActs {
  DBuffer ln1;          // (N, C)
  Buffer<float> rstd1;  // (N)
  DBuffer q, kk, v;     // (N, H*D), (N, K*D), (N, K*D) — q and k after RoPE
  // qwen3: q and k as projected, before their per-head norms; the norms' rstd, (N·H), (N·K)
  DBuffer q_raw, k_raw;
  Buffer<float> rstd_q, rstd_k;
  Buffer<float> lse;    // (B, H, T) attention logsumexp per row, fp32
  DBuffer att;          // (N, H*D) attention output before o_proj
  DBuffer mid;          // (N, C) residual after attention
  DBuffer ln2;          // (N, C)
  Buffer<float> rstd2;  // (N)
  DBuffer g, u, h;      // (N, F) each
};

struct LlamaModel::Acts {
  int B = 0, T = 0;
  bool backward = false;
  // The micro-batch in this slot: whether it will be differentiated, and the run-wide index of
  // its first sample (LinearContext::training, first_sample).
  bool training = false;
  uint64_t first_sample = 0;
  // The micro-batch, copied to the device: token ids (first stage), targets and mask (last).
  Buffer<int32_t> inputs, targets;  // (N)
  Buffer<uint8_t> mask;             // (N)
  std::vector<DBuffer> resid;       // L+1 of (N, C): resid[l] is layer l's input
  std::vector<LayerActs> layers;    // L, or 1 with activation checkpointing
  DBuffer lnf;                      // (N, C)
  Buffer<float> rstdf;              // (N)
  // (head_rows, V / tensor): one chunk of the micro-batch's logits, dlogits in place; the head's
  // backward for the chunk is taken in the forward (see forward_part), so no more rows are kept.
  int head_rows = 0;
  DBuffer logits;
  // tensor parallelism: a row-parallel layer's partial output (N, C); cross-entropy statistics;
  // with a 16-bit compute dtype, the fp32 copy an all-reduce sums in
  DBuffer tp_partial;                   // (N, C)
  Buffer<float> row_max, tp_f32;        // (N), (N, C)
  Buffer<double> sumexp, target_logit;  // (N), (N)
  // With a RowObjective: each row's summed loss (B), and a last element that takes the sums of
  // the backward pass, which nobody reads; each row's gradient scale (B), for the ops to read.
  Buffer<double> row_loss;
  Buffer<float> row_scale;
  // The adapters' dropout keys of the micro-batch in this slot (LinearHooks::dropout_keys), for
  // dropout_samples samples; empty without dropout.
  Buffer<uint64_t> dropout_keys;
  int dropout_samples = 0;
  // backward scratch
  DBuffer dresid, dtmp;        // (N, C)
  DBuffer dq, dk, dv, datt;    // (N, H*D), (N, K*D), (N, K*D), (N, H*D)
  DBuffer dq_raw, dk_raw;      // qwen3: the gradients of q_raw, k_raw
  Buffer<float> norm_dw;       // qwen3 with tensor parallelism: (D) a q/k norm's partial dw
  DBuffer dg, du, dh;          // (N, F)
  Buffer<float> attn_scratch;  // Ops::attention_backward_scratch_elems, fp32
  // Packed samples (forward_part's seg): segment ids and the RoPE positions derived from them,
  // (N) each; empty without segments.
  Buffer<int32_t> seg, pos;
};

namespace {

// The stage with last_layer resolved, checked against the model.
StageSpec resolve_stage(StageSpec stage, const ModelConfig& cfg) {
  if (stage.last_layer < 0) stage.last_layer = cfg.n_layers;
  FT_CHECK(0 <= stage.first_layer && stage.first_layer <= stage.last_layer &&
               stage.last_layer <= cfg.n_layers,
           "bad pipeline stage layers [", stage.first_layer, ", ", stage.last_layer, ")");
  return stage;
}

// The model's own small buffers count with the activations in ft plan (they serve the step's
// computation; MemoryCategory, runtime/device.h).
Buffer<float> rope_buffer(const ModelConfig& cfg, int head_dim, Device* dev) {
  const std::vector<float> inv_freq = rope_inv_freq(cfg, head_dim);
  const MemoryScope tag(MemoryCategory::kActivations);
  Buffer<float> b(dev, inv_freq.size());
  b.upload(inv_freq.data(), inv_freq.size());
  return b;
}

// A micro-batch's host array into its device buffer, in stream order and without waiting for
// the device (Device::upload_async): the host may queue the micro-batch's kernels while the
// device still runs the previous one.
template <typename T>
void upload_async(Device* dev, Stream st, Buffer<T>& b, const T* host, size_t n) {
  if (n) dev->upload_async(st, b.data(), host, n * sizeof(T));
}

template <typename T>
Buffer<T> model_scalars(Device* dev, size_t n) {
  const MemoryScope tag(MemoryCategory::kActivations);
  return Buffer<T>(dev, n);
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing,
                       Communicator* tensor_comm, StageSpec stage, DType compute_dtype,
                       const ModelConverters* converters, GroupSink* sink)
    : cfg_(cfg),
      dev_(dev),
      ckpt_(activation_checkpointing),
      tp_(tensor_comm, dev),
      H_(cfg.n_heads / tp_.size()),
      K_(cfg.n_kv_heads / tp_.size()),
      F_(cfg.ffn_dim / tp_.size()),
      V_(cfg.vocab_size / tp_.size()),
      layout_(converted_layout(cfg, tp_.size(), converters)),
      stage_(resolve_stage(stage, cfg)),
      rope_inv_freq_(rope_buffer(cfg, layout_.head_dim(), dev)),
      loss_acc_(model_scalars<double>(dev, 1)),
      token_weight_(model_scalars<float>(dev, 1)),
      st_(dev->stream()),
      flat_(dev, layout_.groups(), owned_groups(), compute_dtype, sink) {
  const int C = cfg.dim, HD = H_ * layout_.head_dim(), KD = K_ * layout_.head_dim();
  q_proj_ = {Proj::kQ, C, HD};
  k_proj_ = {Proj::kK, C, KD};
  v_proj_ = {Proj::kV, C, KD};
  o_proj_ = {Proj::kO, HD, C};
  gate_proj_ = {Proj::kGate, C, F_};
  up_proj_ = {Proj::kUp, C, F_};
  down_proj_ = {Proj::kDown, F_, C};
  lm_head_ = {Proj::kHead, C, V_};
  embed_ = {C, tp_.rank() * V_, V_};
  loss_ = {tp_.rank() * V_, V_};
  loss_acc_.zero();
  token_weight_.zero();  // 0.0f, token_weight_host_'s value
  if (dev_->graphs_enabled() && !graphs_refusal().empty())
    log_warn("FT_CUDA_GRAPHS=1: no micro-batch of this run is recorded: ", graphs_refusal());
  // The tensor group's agreement on a recording, made now so that ft plan counts it where a run
  // would record.
  if (tp_.size() > 1 && dev_->plans_graphs() && graphs_refusal().empty()) {
    const MemoryScope tag(MemoryCategory::kActivations);
    tp_agree_ = RankAgreement(*dev_, *tp_.comm());
  }
}

LinearContext LlamaModel::linear_context() const {
  LinearContext c;
  c.dev = dev_;
  c.tp = &tp_;
  c.hooks = hooks_enabled_ ? hooks_ : nullptr;
  if (acts_) {
    c.tp_partial = acts_->tp_partial.data();
    c.tp_f32 = acts_->tp_f32.data();
    c.training = acts_->training;
    c.first_sample = acts_->first_sample;
    c.seq_len = acts_->T;
    c.dropout_keys = acts_->dropout_keys.data();
    c.dropout_samples = acts_->dropout_samples;
  }
  return c;
}

void LlamaModel::set_linear_hooks(const LinearHooks* hooks) {
  hooks_ = hooks;
  slots_.clear();  // an adapted head cuts its chunks otherwise (head_rows)
  acts_ = nullptr;
}

void LlamaModel::set_loss_chunk_tokens(int tokens) {
  FT_CHECK(tokens >= 0, "training.loss_chunk_tokens ", tokens, " is negative");
  loss_chunk_tokens_ = tokens;
  slots_.clear();  // their logits were sized for the chunks before
  acts_ = nullptr;
}

void LlamaModel::set_row_objective(RowObjective* objective) {
  objective_ = objective;
  slots_.clear();  // its chunks are whole rows (head_rows), and it keeps a sum per row
  acts_ = nullptr;
}

// Tokens, not logits: every tensor layout cuts the rows alike, so the loss sums the same chunks.
int LlamaModel::head_rows(int B, int T) const {
  const int N = B * T;
  if (loss_chunk_tokens_ == 0 || loss_chunk_tokens_ >= N) return N;
  if (objective_ || (hooks_ && hooks_->adapts(LinearSite{-1, Proj::kHead})))
    return std::min(N, (loss_chunk_tokens_ + T - 1) / T * T);
  return loss_chunk_tokens_;
}

bool LlamaModel::owns_group(int g) const {
  const int L = cfg_.n_layers;
  if (const int to = layout_.groups()[size_t(g)].attached_to; to >= 0) return owns_group(to);
  if (g == 0) return stage_.embed || (stage_.head && cfg_.tie_embeddings);
  // The head group, and the final norm's when a converter split it off (layout.h).
  if (g == L + 1 || g == layout_.final_norm().group) return stage_.head;
  return g - 1 >= stage_.first_layer && g - 1 < stage_.last_layer;
}

std::vector<bool> LlamaModel::owned_groups() const {
  std::vector<bool> owned;
  for (size_t g = 0; g < layout_.groups().size(); ++g) owned.push_back(owns_group(int(g)));
  return owned;
}

CRef LlamaModel::stage_output(int slot) const {
  return slots_[size_t(slot)]->resid[size_t(stage_.last_layer)].data();
}

CRef LlamaModel::input_grad() const { return acts_->dresid.data(); }

void LlamaModel::copy(Ref dst, CRef src, size_t n) {
  FT_CHECK(dst.dtype == src.dtype, "copy of ", dtype_name(src.dtype), " into ",
           dtype_name(dst.dtype));
  dev_->copy(st_, dst.ptr, src.ptr, n * dtype_size(dst.dtype));
}

LlamaModel::~LlamaModel() {
  try {
    int recorded = 0;
    int64_t launches = 0;
    for (const MicroBatchGraph& g : graphs_) recorded += g.recorded, launches += g.launches;
    for (const MicroBatchGraph& g : part_graphs_) recorded += g.recorded, launches += g.launches;
    if (recorded)
      log_info("FT_CUDA_GRAPHS: ", launches,
               pipelined() ? " halves of training micro-batches (this pipeline stage's)"
                           : " training micro-batches",
               " launched from ", recorded, " recording(s)");
  } catch (...) {  // in a destructor: the count is not worth an exception
  }
  for (MicroBatchGraph& g : graphs_) drop_graph(g);
  for (MicroBatchGraph& g : part_graphs_) drop_graph(g);
}

namespace {

// Norm weights start at one, biases at zero (torch's Linear bias under HF's _init_weights).
float vector_init_value(const ParamEntry& e) {
  const bool is_bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
  return is_bias ? 0.0f : 1.0f;
}

}  // namespace

uint64_t init_random_key(uint64_t seed, const std::string& name) {
  uint64_t key = seed * 0x100000001b3ull + 0xcbf29ce484222325ull;
  for (char c : name) key = (key ^ uint8_t(c)) * 0x100000001b3ull;
  return key;
}

void init_random_group(const ParamLayout& layout, int g, uint64_t seed, double std, float* out) {
  FT_CHECK(layout.tensor() == 1, "init_random_group: a layout of whole tensors");
  FT_CHECK(g >= 0 && size_t(g) < layout.groups().size(), "init_random_group: no group ", g);
  for (const ParamEntry& e : layout.groups()[size_t(g)].entries) {
    float* dst = out + e.offset;
    if (e.shape.size() < 2)
      std::fill(dst, dst + e.numel, vector_init_value(e));
    else
      kernels::random_normal(dst, e.numel, init_random_key(seed, e.name), 0, std);
  }
}

void LlamaModel::init_random(uint64_t seed, double std) {
  // Matrices: N(0, std) drawn on the device by the random_normal op (kernels/philox.h), each
  // element's bits a function of (seed, the tensor's name, its index in the whole tensor) only:
  // every thread count, device and layout draws the same model. A tensor-parallel rank draws
  // only its slices, at their indices in the whole tensor (a row split is one run, a column
  // split one 2-D draw of its block of columns), and a pipeline stage only its groups, so no
  // rank holds more than it keeps. Vectors (the norms' weights): ones.
  // A frozen group held in the compute dtype only is drawn through FlatParams::write's staging
  // buffer, piece by piece (a column slice cut between rows): the same bits, converted.
  const auto& groups = layout_.groups();
  std::vector<float> ones;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (!owns_group(int(gi))) continue;
    for (const auto& e : groups[gi].entries) {
      if (e.shape.size() < 2) {
        ones.assign(e.numel, vector_init_value(e));
        flat_.write(int(gi), e.offset, e.numel, 1, [&](float* dst, size_t b, size_t k) {
          dev_->copy_from_host(dst, ones.data() + b, k * sizeof(float));
        });
        continue;
      }
      const uint64_t key = init_random_key(seed, e.name);
      if (e.split == TensorSplit::kCols) {
        // Rank t's columns [t·cols, (t+1)·cols) of every row of the (rows, whole_cols) tensor:
        // one 2-D draw, the elements for_each_slice_run's runs name (not a launch per row).
        const size_t cols = size_t(e.shape[1]), whole_cols = size_t(e.global_shape[1]);
        flat_.write(int(gi), e.offset, e.numel, cols, [&](float* dst, size_t b, size_t k) {
          const size_t r0 = b / cols;
          ops().random_normal(st_, dst, k / cols, cols, whole_cols, key,
                              r0 * whole_cols + size_t(tp_.rank()) * cols, std);
        });
        continue;
      }
      for_each_slice_run(e, tp_.rank(), [&](size_t whole, size_t local, size_t n) {
        flat_.write(int(gi), e.offset + local, n, 1, [&](float* dst, size_t b, size_t k) {
          ops().random_normal(st_, dst, 1, k, k, key, whole + b, std);
        });
      });
    }
    flat_.group_written(int(gi));  // a QLoRA block: quantized now
  }
}

void LlamaModel::ensure_acts(int slot, int B, int T, bool need_backward, bool segments) {
  if (size_t(slot) >= slots_.size()) slots_.resize(size_t(slot) + 1);
  std::unique_ptr<Acts>& cur = slots_[size_t(slot)];
  acts_ = cur.get();
  if (cur && cur->B == B && cur->T == T && (cur->backward || !need_backward) &&
      (cur->seg.size() > 0) == segments)
    return;
  cur.reset();  // free the old set first so the peak is not two sets
  const MemoryScope tag(MemoryCategory::kActivations);
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->T = T;
  a->backward = need_backward;
  const size_t N = size_t(B) * T, C = cfg_.dim, F = F_, V = V_;
  if (stage_.embed) a->inputs = Buffer<int32_t>(dev_, N);
  if (need_backward && hooks_)
    if (const size_t keys = hooks_->dropout_key_count(B, cfg_.n_layers))
      a->dropout_keys = Buffer<uint64_t>(dev_, keys);
  if (segments) {
    a->seg = Buffer<int32_t>(dev_, N);
    a->pos = Buffer<int32_t>(dev_, N);
  }
  if (stage_.head) {
    a->targets = Buffer<int32_t>(dev_, N);
    a->mask = Buffer<uint8_t>(dev_, N);
  }
  const size_t HD = size_t(H_) * layout_.head_dim();
  const size_t KD = size_t(K_) * layout_.head_dim();
  const int L = cfg_.n_layers;
  // Residual stream: resid[l] is layer l's input; only this stage's [first, last] exist.
  const DType ct = flat_.compute_dtype();
  for (int l = 0; l <= L; ++l)
    a->resid.emplace_back(dev_, ct, l >= stage_.first_layer && l <= stage_.last_layer ? N * C : 0);
  const int stage_layers = stage_.last_layer - stage_.first_layer;
  int nsets = (ckpt_ || !need_backward) ? std::min(1, stage_layers) : stage_layers;
  for (int i = 0; i < nsets; ++i) {
    LayerActs la;
    la.ln1 = DBuffer(dev_, ct, N * C);
    la.rstd1 = Buffer<float>(dev_, N);
    la.q = DBuffer(dev_, ct, N * HD);
    la.kk = DBuffer(dev_, ct, N * KD);
    if (arch_of(cfg_).qk_norm) {
      la.q_raw = DBuffer(dev_, ct, N * HD);
      la.k_raw = DBuffer(dev_, ct, N * KD);
      la.rstd_q = Buffer<float>(dev_, N * H_);
      la.rstd_k = Buffer<float>(dev_, N * K_);
    }
    la.v = DBuffer(dev_, ct, N * KD);
    la.lse = Buffer<float>(dev_, size_t(B) * H_ * T);
    la.att = DBuffer(dev_, ct, N * HD);
    la.mid = DBuffer(dev_, ct, N * C);
    la.ln2 = DBuffer(dev_, ct, N * C);
    la.rstd2 = Buffer<float>(dev_, N);
    la.g = DBuffer(dev_, ct, N * F);
    la.u = DBuffer(dev_, ct, N * F);
    la.h = DBuffer(dev_, ct, N * F);
    a->layers.push_back(std::move(la));
  }
  if (stage_.head) {
    a->lnf = DBuffer(dev_, ct, N * C);
    a->rstdf = Buffer<float>(dev_, N);
    a->head_rows = head_rows(B, T);
    a->logits = DBuffer(dev_, ct, size_t(a->head_rows) * V);
    if (objective_) {
      a->row_loss = Buffer<double>(dev_, size_t(B) + 1);
      if (need_backward) a->row_scale = Buffer<float>(dev_, size_t(B));
    }
  }
  if (tp_.size() > 1) {
    a->tp_partial = DBuffer(dev_, ct, N * C);
    if (ct != DType::kF32) a->tp_f32 = Buffer<float>(dev_, N * C);
    a->row_max = Buffer<float>(dev_, N);
    a->sumexp = Buffer<double>(dev_, N);
    a->target_logit = Buffer<double>(dev_, N);
  }
  if (need_backward) {
    a->dresid = DBuffer(dev_, ct, N * C);
    a->dtmp = DBuffer(dev_, ct, N * C);
    a->dq = DBuffer(dev_, ct, N * HD);
    a->dk = DBuffer(dev_, ct, N * KD);
    a->dv = DBuffer(dev_, ct, N * KD);
    a->datt = DBuffer(dev_, ct, N * HD);
    if (arch_of(cfg_).qk_norm) {
      a->dq_raw = DBuffer(dev_, ct, N * HD);
      a->dk_raw = DBuffer(dev_, ct, N * KD);
      if (tp_.size() > 1) a->norm_dw = Buffer<float>(dev_, size_t(layout_.head_dim()));
    }
    a->dg = DBuffer(dev_, ct, N * F);
    a->du = DBuffer(dev_, ct, N * F);
    a->dh = DBuffer(dev_, ct, N * F);
    a->attn_scratch = Buffer<float>(
        dev_, ops().attention_backward_scratch_elems(ct, B, T, H_, layout_.head_dim()));
  }
  cur = std::move(a);
  acts_ = cur.get();
}

void LlamaModel::layer_forward(int l, int B, int T) {
  Acts& a = *acts_;
  LinearContext lc = linear_context();
  const int ag = layout_.attached_group(1 + l);  // the block's adapters, or -1
  if (ag >= 0) lc.adapter = flat_.acquire(ag);
  LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : size_t(l - stage_.first_layer)];
  const int N = B * T, C = cfg_.dim, F = F_, H = H_, K = K_;
  const int D = layout_.head_dim();
  const BlockOffsets& o = layout_.block_offsets();
  const CRef w = flat_.acquire(1 + l);
  const CRef x = a.resid[l].data();
  const Ref y = a.resid[l + 1].data();

  ops().rmsnorm_forward(st_, la.ln1.data(), la.rstd1.data(), x, w + o.attn_norm, N, C,
                        float(cfg_.norm_eps));
  const bool qk_norm = arch_of(cfg_).qk_norm;
  const Ref q = qk_norm ? la.q_raw.data() : la.q.data();
  const Ref k = qk_norm ? la.k_raw.data() : la.kk.data();
  linear_forward(lc, q_proj_, l, q, la.ln1.data(), w + o.wq, N);
  linear_forward(lc, k_proj_, l, k, la.ln1.data(), w + o.wk, N);
  linear_forward(lc, v_proj_, l, la.v.data(), la.ln1.data(), w + o.wv, N);
  if (o.bq != BlockOffsets::kAbsent) {  // column-parallel biases: this rank's slices
    ops().bias_add(st_, q, w + o.bq, N, H * D);
    ops().bias_add(st_, k, w + o.bk, N, K * D);
    ops().bias_add(st_, la.v.data(), w + o.bv, N, K * D);
  }
  if (qk_norm) {
    ops().rmsnorm_forward(st_, la.q.data(), la.rstd_q.data(), q, w + o.q_norm, N * H, D,
                          float(cfg_.norm_eps));
    ops().rmsnorm_forward(st_, la.kk.data(), la.rstd_k.data(), k, w + o.k_norm, N * K, D,
                          float(cfg_.norm_eps));
  }
  const int32_t* seg = a.seg.size() ? a.seg.data() : nullptr;
  const int32_t* pos = a.pos.size() ? a.pos.data() : nullptr;
  ops().rope_forward(st_, la.q.data(), rope_inv_freq_.data(), B, T, H, D, pos);
  ops().rope_forward(st_, la.kk.data(), rope_inv_freq_.data(), B, T, K, D, pos);
  ops().attention_forward(st_, la.att.data(), la.lse.data(), la.q.data(), la.kk.data(), la.v.data(),
                          seg, B, T, H, K, D);
  linear_forward(lc, o_proj_, l, la.mid.data(), la.att.data(), w + o.wo, N, /*residual=*/x);

  ops().rmsnorm_forward(st_, la.ln2.data(), la.rstd2.data(), la.mid.data(), w + o.mlp_norm, N, C,
                        float(cfg_.norm_eps));
  linear_forward(lc, gate_proj_, l, la.g.data(), la.ln2.data(), w + o.w_gate, N);
  linear_forward(lc, up_proj_, l, la.u.data(), la.ln2.data(), w + o.w_up, N);
  ops().swiglu_forward(st_, la.h.data(), la.g.data(), la.u.data(), size_t(N) * F);
  linear_forward(lc, down_proj_, l, y, la.h.data(), w + o.w_down, N, /*residual=*/la.mid.data());
  flat_.release(1 + l);
  if (ag >= 0) flat_.release(ag);
}

// On entry a.dresid holds dL/d(resid[l+1]); on exit dL/d(resid[l]).
void LlamaModel::layer_backward(int l, int B, int T) {
  Acts& a = *acts_;
  if (ckpt_) layer_forward(l, B, T);  // recompute this layer's activations
  LinearContext lc = linear_context();
  const int ag = layout_.attached_group(1 + l);  // the block's adapters, or -1
  if (ag >= 0) {
    lc.adapter = flat_.acquire(ag);
    lc.adapter_grad = flat_.grad(ag);
  }
  LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : size_t(l - stage_.first_layer)];
  const int N = B * T, C = cfg_.dim, F = F_, H = H_, K = K_;
  const int D = layout_.head_dim();
  const BlockOffsets& o = layout_.block_offsets();
  const CRef w = flat_.acquire(1 + l);
  float* const dw = flat_.grad(1 + l);  // null: a frozen block, input gradients only
  auto dW = [dw](size_t offset) { return dw ? dw + offset : nullptr; };
  const CRef x = a.resid[l].data();
  const Ref dy = a.dresid.data();

  // MLP: x' = mid + h·Wdᵀ
  linear_backward(lc, down_proj_, l, a.dh.data(), dW(o.w_down), dy, la.h.data(), w + o.w_down, N,
                  /*accumulate_dx=*/false);
  ops().swiglu_backward(st_, a.dg.data(), a.du.data(), a.dh.data(), la.g.data(), la.u.data(),
                        size_t(N) * F);
  // d ln2 = dg·Wg + du·Wu  (into dtmp)
  linear_backward(lc, gate_proj_, l, a.dtmp.data(), dW(o.w_gate), a.dg.data(), la.ln2.data(),
                  w + o.w_gate, N, /*accumulate_dx=*/false);
  linear_backward(lc, up_proj_, l, a.dtmp.data(), dW(o.w_up), a.du.data(), la.ln2.data(),
                  w + o.w_up, N,
                  /*accumulate_dx=*/true);
  reduce_input_grad(tp_, a.dtmp.data(), size_t(N) * C, a.tp_f32.data());  // f's backward
  // The norm's input gradient is added straight into dy (accumulate_dx): dy is now dL/d mid.
  ops().rmsnorm_backward(st_, dy, dW(o.mlp_norm), a.dtmp.data(), la.mid.data(), w + o.mlp_norm,
                         la.rstd2.data(), N, C, /*accumulate_dx=*/true);

  // Attention: mid = x + att·Woᵀ
  linear_backward(lc, o_proj_, l, a.datt.data(), dW(o.wo), dy, la.att.data(), w + o.wo, N,
                  /*accumulate_dx=*/false);
  const int32_t* seg = a.seg.size() ? a.seg.data() : nullptr;
  const int32_t* pos = a.pos.size() ? a.pos.data() : nullptr;
  ops().attention_backward(st_, a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(), la.att.data(),
                           la.lse.data(), la.q.data(), la.kk.data(), la.v.data(), seg,
                           a.attn_scratch.data(), B, T, H, K, D);
  ops().rope_backward(st_, a.dq.data(), rope_inv_freq_.data(), B, T, H, D, pos);
  ops().rope_backward(st_, a.dk.data(), rope_inv_freq_.data(), B, T, K, D, pos);
  Ref dq = a.dq.data(), dk = a.dk.data();  // become dL/d(the projections' outputs)
  if (arch_of(cfg_).qk_norm) {
    norm_backward(a.dq_raw.data(), dW(o.q_norm), dq, la.q_raw.data(), w + o.q_norm,
                  la.rstd_q.data(), N * H, D);
    norm_backward(a.dk_raw.data(), dW(o.k_norm), dk, la.k_raw.data(), w + o.k_norm,
                  la.rstd_k.data(), N * K, D);
    dq = a.dq_raw.data();
    dk = a.dk_raw.data();
  }
  if (o.bq != BlockOffsets::kAbsent && dw) {
    ops().bias_grad(st_, dW(o.bq), dq, N, H * D);
    ops().bias_grad(st_, dW(o.bk), dk, N, K * D);
    ops().bias_grad(st_, dW(o.bv), a.dv.data(), N, K * D);
  }
  linear_backward(lc, q_proj_, l, a.dtmp.data(), dW(o.wq), dq, la.ln1.data(), w + o.wq, N,
                  /*accumulate_dx=*/false);
  linear_backward(lc, k_proj_, l, a.dtmp.data(), dW(o.wk), dk, la.ln1.data(), w + o.wk, N,
                  /*accumulate_dx=*/true);
  linear_backward(lc, v_proj_, l, a.dtmp.data(), dW(o.wv), a.dv.data(), la.ln1.data(), w + o.wv, N,
                  /*accumulate_dx=*/true);
  reduce_input_grad(tp_, a.dtmp.data(), size_t(N) * C, a.tp_f32.data());  // f's backward
  ops().rmsnorm_backward(st_, dy, dW(o.attn_norm), a.dtmp.data(), x, w + o.attn_norm,
                         la.rstd1.data(), N, C, /*accumulate_dx=*/true);  // dy is now dL/d x
  flat_.release(1 + l);
  flat_.grads_ready(1 + l);
  if (ag >= 0) {
    flat_.release(ag);
    flat_.grads_ready(ag);
  }
}

// A q/k norm's backward over rows (R, D) of heads. Its weight is replicated over the tensor
// group but each rank sees only its own heads, so with tensor parallelism the weight's gradient
// is this rank's partial sum: it is formed apart (norm_dw), summed over the group, then added,
// so that gradients accumulated over earlier micro-batches are not summed again.
void LlamaModel::norm_backward(Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd,
                               int R, int D) {
  if (tp_.size() == 1 || dw == nullptr) {  // null dw: a frozen block, dx alone
    ops().rmsnorm_backward(st_, dx, dw, dout, x, w, rstd, R, D, /*accumulate_dx=*/false);
    return;
  }
  float* part = acts_->norm_dw.data();
  acts_->norm_dw.zero();
  ops().rmsnorm_backward(st_, dx, part, dout, x, w, rstd, R, D, /*accumulate_dx=*/false);
  tp_.all_reduce(Ref(part), size_t(D), nullptr);
  ops().add(st_, Ref(dw), CRef(part), size_t(D));
}

void LlamaModel::stage_inputs(int slot, const int32_t* inputs, const int32_t* targets,
                              const uint8_t* mask, int B, int T, float token_weight, bool backward,
                              const int32_t* seg, uint64_t first_sample) {
  FT_CHECK(T <= cfg_.max_seq_len, "sequence length ", T, " exceeds model.max_seq_len ",
           cfg_.max_seq_len);
  ensure_acts(slot, B, T, backward, seg != nullptr);
  Acts& a = *acts_;
  a.training = backward;
  a.first_sample = first_sample;
  const int N = B * T;
  if (seg) {
    // Each sample's positions restart at 0 where its segment starts (DESIGN.md §6 packing).
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const size_t n = size_t(b) * T + t;
        FT_CHECK(t == 0 || seg[n] >= seg[n - 1], "segment ids decrease along row ", b,
                 " at position ", t, " (", seg[n - 1], " then ", seg[n], ")");
        pos[n] = t == 0 || seg[n] != seg[n - 1] ? 0 : pos[n - 1] + 1;
      }
    upload_async(dev_, st_, a.seg, seg, size_t(N));
    upload_async(dev_, st_, a.pos, pos.data(), size_t(N));
  }

  if (stage_.embed) {
    // The ids are checked on the host, where they arrive, before they reach the device.
    for (int n = 0; n < N; ++n)
      FT_CHECK(inputs[n] >= 0 && inputs[n] < cfg_.vocab_size, "input token id ", inputs[n],
               " out of range for vocab_size ", cfg_.vocab_size);
    upload_async(dev_, st_, a.inputs, inputs, size_t(N));
  }
  if (backward && a.dropout_keys.size()) {
    std::vector<uint64_t> keys(a.dropout_keys.size());  // hooks_->dropout_key_count's
    hooks_->dropout_keys(first_sample, B, cfg_.n_layers, keys.data());
    upload_async(dev_, st_, a.dropout_keys, keys.data(), keys.size());
    a.dropout_samples = B;
  }
  if (!stage_.head) return;
  for (int n = 0; n < N; ++n)
    FT_CHECK(!mask[n] || (targets[n] >= 0 && targets[n] < cfg_.vocab_size), "target token id ",
             targets[n], " out of range for vocab_size ", cfg_.vocab_size);
  upload_async(dev_, st_, a.targets, targets, size_t(N));
  upload_async(dev_, st_, a.mask, mask, size_t(N));
  if (backward && !objective_ && token_weight != token_weight_host_) {
    upload_async(dev_, st_, token_weight_, &token_weight, 1);
    token_weight_host_ = token_weight;
  }
}

void LlamaModel::forward_compute(CRef x_in, bool backward, float token_weight,
                                 const uint8_t* host_mask) {
  Acts& a = *acts_;
  const int B = a.B, T = a.T, N = B * T, C = cfg_.dim;
  const int first = stage_.first_layer, last = stage_.last_layer;
  if (stage_.embed) {
    // Vocabulary-parallel embedding: each tensor rank looks up the ids in its rows, zeros
    // elsewhere, and the all-reduce assembles the rows.
    embed_.forward(*dev_, tp_, a.resid[0].data(), a.inputs.data(), flat_.acquire(0), N,
                   a.tp_f32.data());
    flat_.release(0);
  } else {
    copy(a.resid[size_t(first)].data(), x_in, size_t(N) * C);
  }
  for (int l = first; l < last; ++l) layer_forward(l, B, T);
  if (!stage_.head) return;

  const int32_t* tgt = a.targets.data();
  const uint8_t* msk = a.mask.data();
  LinearContext lc = linear_context();
  const HeadWeights hw = acquire_head();
  const CRef wf = hw.norm, Wh = hw.out;
  ops().rmsnorm_forward(st_, a.lnf.data(), a.rstdf.data(), a.resid[cfg_.n_layers].data(), wf, N, C,
                        float(cfg_.norm_eps));
  // The head a chunk of rows at a time (head_rows: training.loss_chunk_tokens, DESIGN.md §3 "The
  // head in chunks"): the chunk's logits (k, V / tensor), its loss and dlogits in their place,
  // then in training the head's whole backward for those rows: f's gradient into a.dtmp (which
  // backward_part reads first) and, for a trained head, dWh += dlogitsᵀ·f into its gradient
  // (held from here to backward_part's grads_ready, as any group's gradient within a
  // micro-batch). So the micro-batch's (N, V) logits and their gradient never exist at once, and
  // nothing of the head outlives the forward but f's gradient. Vocabulary-parallel: no rank ever
  // holds full-vocabulary logits; the softmax's statistics are reduced over the tensor group
  // chunk by chunk.
  const int rows = a.head_rows;
  float* dWh = nullptr;  // null: an evaluation, or a frozen head weight
  if (backward) {
    const TensorAt w = layout_.output_weight();
    dWh = flat_.grad(w.group);
    if (dWh) dWh += w.offset;
  }
  if (objective_) {
    objective_head(Wh, dWh, backward, token_weight, host_mask);
    release_head();
    return;
  }
  for (int n0 = 0; n0 < N; n0 += rows) {
    const int k = std::min(rows, N - n0);
    const Ref logits = a.logits.data();
    const CRef f = a.lnf.data() + size_t(n0) * C;
    lc.first_sample = a.first_sample + uint64_t(n0 / T);  // an adapted head's chunks: whole samples
    linear_forward(lc, lm_head_, -1, logits, f, Wh, k);
    const Ref dlogits = backward ? logits : Ref(nullptr, flat_.compute_dtype());
    VocabParallelCrossEntropy::Scratch scratch;
    if (tp_.size() > 1)
      scratch = {a.row_max.data() + n0, a.sumexp.data() + n0, a.target_logit.data() + n0};
    loss_.forward_backward(*dev_, tp_, dlogits, logits, tgt + n0, msk + n0, k, token_weight_.data(),
                           loss_acc_.data(), scratch);
    if (backward)
      linear_backward(lc, lm_head_, -1, a.dtmp.data() + size_t(n0) * C, dWh, dlogits, f, Wh, k,
                      /*accumulate_dx=*/false);
  }
  release_head();
}

// The head under a RowObjective, in whole rows. Pass 1 takes each row's loss sum (−log p of its
// trained targets) with the cross-entropy op run row by row into row_loss; the host reads them
// (one wait for the device per micro-batch: the objective needs every row before any gradient)
// and asks the objective for d loss / d log p(row). Pass 2 forms each row's dlogits with that
// factor, negated (log p = −loss, so dlogits = −dlogp · (softmax − onehot)), and runs the head's
// backward as the token loss does. With more than one chunk the logits are computed again in
// pass 2 (one more head GEMM); with one, pass 1's are still in place.
void LlamaModel::objective_head(CRef Wh, float* dWh, bool backward, float weight,
                                const uint8_t* host_mask) {
  Acts& a = *acts_;
  const int B = a.B, T = a.T, N = B * T, C = cfg_.dim, rows = a.head_rows;
  FT_CHECK(T > 0 && rows > 0 && rows % T == 0, "a row objective's head chunks must be whole rows (",
           rows, " rows of ", T, ")");
  const int32_t* tgt = a.targets.data();
  const uint8_t* msk = a.mask.data();
  LinearContext lc = linear_context();
  const DType ct = flat_.compute_dtype();
  auto chunk_logits = [&](int n0, int k) {
    lc.first_sample = a.first_sample + uint64_t(n0 / T);
    linear_forward(lc, lm_head_, -1, a.logits.data(), a.lnf.data() + size_t(n0) * C, Wh, k);
  };
  // Row b's cross-entropy in the chunk starting at token n0; dlogits null: the loss only.
  auto row_ce = [&](bool grad, int b, int n0, double* acc) {
    const size_t n = size_t(b) * T;
    VocabParallelCrossEntropy::Scratch scratch;
    if (tp_.size() > 1)
      scratch = {a.row_max.data() + n, a.sumexp.data() + n, a.target_logit.data() + n};
    const Ref logits = a.logits.data() + (n - size_t(n0)) * size_t(V_);
    loss_.forward_backward(*dev_, tp_, grad ? logits : Ref(nullptr, ct), logits, tgt + n, msk + n,
                           T, grad ? a.row_scale.data() + b : nullptr, acc, scratch);
  };
  a.row_loss.zero();
  for (int n0 = 0; n0 < N; n0 += rows) {
    const int k = std::min(rows, N - n0);
    chunk_logits(n0, k);
    for (int b = n0 / T; b < (n0 + k) / T; ++b) row_ce(false, b, n0, a.row_loss.data() + b);
  }
  std::vector<double> logp(size_t(B) + 1), targets(size_t(B), 0.0), dlogp(size_t(B), 0.0);
  a.row_loss.download(logp.data(), size_t(B) + 1);
  for (int b = 0; b < B; ++b) {
    logp[size_t(b)] = -logp[size_t(b)];
    for (int t = 0; t < T; ++t) targets[size_t(b)] += host_mask[size_t(b) * T + t] ? 1 : 0;
  }
  objective_loss_ += objective_->rows(logp.data(), targets.data(), B, a.first_sample, weight,
                                      backward ? dlogp.data() : nullptr);
  if (!backward) return;
  std::vector<float> row_scale(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) row_scale[size_t(b)] = float(-dlogp[size_t(b)]);
  upload_async(dev_, st_, a.row_scale, row_scale.data(), size_t(B));
  double* sink = a.row_loss.data() + B;
  for (int n0 = 0; n0 < N; n0 += rows) {
    const int k = std::min(rows, N - n0);
    if (rows < N) chunk_logits(n0, k);
    for (int b = n0 / T; b < (n0 + k) / T; ++b) row_ce(true, b, n0, sink);
    linear_backward(lc, lm_head_, -1, a.dtmp.data() + size_t(n0) * C, dWh, a.logits.data(),
                    a.lnf.data() + size_t(n0) * C, Wh, k, /*accumulate_dx=*/false);
  }
}

LlamaModel::HeadWeights LlamaModel::acquire_head() {
  const TensorAt n = layout_.final_norm(), w = layout_.output_weight();
  const CRef norm = flat_.acquire(n.group);
  const CRef base = w.group == n.group ? norm : flat_.acquire(w.group);
  return {norm + n.offset, base + w.offset};
}

void LlamaModel::release_head() {
  const TensorAt n = layout_.final_norm(), w = layout_.output_weight();
  flat_.release(n.group);
  if (w.group != n.group) flat_.release(w.group);
}

double LlamaModel::take_loss_sum() {
  double sum = 0;
  loss_acc_.download(&sum, 1);
  loss_acc_.zero();
  sum += objective_loss_;
  objective_loss_ = 0;
  return sum;
}

void LlamaModel::backward_compute(int slot, CRef dy_in) {
  acts_ = slots_[size_t(slot)].get();
  Acts& a = *acts_;
  const int B = a.B, T = a.T, N = B * T, C = cfg_.dim, L = cfg_.n_layers;
  if (stage_.head) {
    // forward_part ran the head's backward (logits = f·Whᵀ) chunk by chunk: a.dtmp holds f's
    // gradient and the head's weight gradient is in. Only the final norm's backward is left, so
    // only the norm's weight is acquired.
    const TensorAt n = layout_.final_norm(), w = layout_.output_weight();
    const CRef wf = flat_.acquire(n.group) + n.offset;
    float* dnorm = flat_.grad(n.group);  // null when frozen
    if (dnorm) dnorm += n.offset;
    // f's backward: each rank saw only its vocabulary columns.
    reduce_input_grad(tp_, a.dtmp.data(), size_t(N) * C, a.tp_f32.data());
    // The final norm is the residual stream's only consumer: its dx starts dL/d resid[L].
    ops().rmsnorm_backward(st_, a.dresid.data(), dnorm, a.dtmp.data(), a.resid[L].data(), wf,
                           a.rstdf.data(), N, C, /*accumulate_dx=*/false);
    flat_.release(n.group);
    flat_.grads_ready(L + 1);
    if (n.group != L + 1) flat_.grads_ready(n.group);
    // Tied: the embedding's other half is on the first stage, ready after its backward there.
    if (w.group == 0 && !stage_.embed) flat_.grads_ready(0);
  } else {
    copy(a.dresid.data(), dy_in, size_t(N) * C);
  }
  for (int l = stage_.last_layer - 1; l >= stage_.first_layer; --l) layer_backward(l, B, T);
  if (stage_.embed) {
    if (float* dtable = flat_.grad(0))
      embed_.backward(*dev_, dtable, a.inputs.data(), a.dresid.data(), N);
    flat_.grads_ready(0);
  }
}

void LlamaModel::forward_backward(const int32_t* inputs, const int32_t* targets,
                                  const uint8_t* mask, int B, int T, float token_weight,
                                  const int32_t* seg) {
  forward_part(0, inputs, CRef(), targets, mask, B, T, token_weight, true, seg);
  backward_part(0, CRef());
}

void LlamaModel::forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                              int B, int T, const int32_t* seg) {
  forward_part(0, inputs, CRef(), targets, mask, B, T, 0.0f, false, seg);
}

}  // namespace ft
