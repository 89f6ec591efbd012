// Forward: x0 = E[ids]; for each layer
//   a = rmsnorm(x, w1); q,k,v = a·Wqᵀ, a·Wkᵀ, a·Wvᵀ; rope(q, k); o = attn(q, k, v)
//   y = x + o·Woᵀ; b = rmsnorm(y, w2); g, u = b·Wgᵀ, b·Wuᵀ; x' = y + (silu(g)∘u)·Wdᵀ
// then f = rmsnorm(x_L, wf); logits = f·Whᵀ (Wh = E when tied); cross-entropy.
// Backward walks the same steps in reverse. With activation checkpointing only each layer's
// input x is kept; the layer's forward is recomputed into one shared set of buffers before its
// backward.
#include "model/llama.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/random.h"
#include "model/rope.h"

namespace ft {
// Activations of one layer, (N = B*T rows).
// Activations of one layer, (N = B*T rows), in the compute dtype; statistics in fp32.
struct LayerActs {
  DBuffer ln1;               // (N, C)
  Buffer<float> rstd1;       // (N)
  DBuffer q, kk, v;          // (N, H*D), (N, K*D), (N, K*D) — q and k after RoPE
  Buffer<float> lse;         // (B, H, T) attention logsumexp per row, fp32
  DBuffer att;               // (N, H*D) attention output before o_proj
  DBuffer mid;               // (N, C) residual after attention
  DBuffer ln2;               // (N, C)
  Buffer<float> rstd2;       // (N)
  DBuffer g, u, h;           // (N, F) each
};

struct LlamaModel::Acts {
  int B = 0, T = 0;
  bool backward = false;
  // The micro-batch, copied to the device: token ids (first stage), targets and mask (last).
  Buffer<int32_t> inputs, targets;   // (N)
  Buffer<uint8_t> mask;              // (N)
  std::vector<DBuffer> resid;        // L+1 of (N, C): resid[l] is layer l's input
  std::vector<LayerActs> layers;     // L, or 1 with activation checkpointing
  DBuffer lnf;                       // (N, C)
  Buffer<float> rstdf;               // (N)
  DBuffer logits;                    // (N, V / tensor); becomes dlogits in backward
  // tensor parallelism: a row-parallel layer's partial output (N, C); cross-entropy statistics;
  // with a 16-bit compute dtype, the fp32 copy an all-reduce sums in
  DBuffer tp_partial;                        // (N, C)
  Buffer<float> row_max, tp_f32;             // (N), (N, C)
  Buffer<double> sumexp, target_logit;       // (N), (N)
  // backward scratch
  DBuffer dresid, dtmp;              // (N, C)
  DBuffer dq, dk, dv, datt;          // (N, H*D), (N, K*D), (N, K*D), (N, H*D)
  DBuffer dg, du, dh;                // (N, F)
  Buffer<float> attn_scratch;        // Ops::attention_backward_scratch_elems, fp32
};

LlamaModel::LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing,
                       Communicator* tensor_comm, StageSpec stage, DType compute_dtype)
    : cfg_(cfg),
      dev_(dev),
      ckpt_(activation_checkpointing),
      tp_comm_(tensor_comm),
      tp_(tensor_comm ? tensor_comm->size() : 1),
      tp_rank_(tensor_comm ? tensor_comm->rank() : 0),
      H_(cfg.n_heads / tp_),
      K_(cfg.n_kv_heads / tp_),
      F_(cfg.ffn_dim / tp_),
      V_(cfg.vocab_size / tp_),
      v_begin_(tp_rank_ * V_),
      layout_(cfg, tp_),
      cdt_(compute_dtype),
      stage_(stage) {
  FT_CHECK(cdt_ == DType::kF32 || cdt_ == DType::kBF16 || cdt_ == DType::kF16,
           "compute dtype must be F32, BF16 or F16, not ", dtype_name(cdt_));
  const std::vector<float> inv_freq = rope_inv_freq(cfg, layout_.head_dim());
  rope_inv_freq_ = Buffer<float>(dev_, inv_freq.size());
  rope_inv_freq_.upload(inv_freq.data(), inv_freq.size());
  loss_acc_ = Buffer<double>(dev_, 1);
  loss_acc_.zero();
  st_ = dev_->stream();
  if (stage_.last_layer < 0) stage_.last_layer = cfg.n_layers;
  FT_CHECK(0 <= stage_.first_layer && stage_.first_layer <= stage_.last_layer &&
               stage_.last_layer <= cfg.n_layers,
           "bad pipeline stage layers [", stage_.first_layer, ", ", stage_.last_layer, ")");
  const auto& groups = layout_.groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    params_.emplace_back(dev_, owns_group(int(g)) ? groups[g].numel : 0);
    params_.back().zero();
  }
}

bool LlamaModel::owns_group(int g) const {
  const int L = cfg_.n_layers;
  if (g == 0) return stage_.embed || (stage_.head && cfg_.tie_embeddings);
  if (g == L + 1) return stage_.head;
  return g - 1 >= stage_.first_layer && g - 1 < stage_.last_layer;
}

CRef LlamaModel::stage_output(int slot) const {
  return slots_[size_t(slot)]->resid[size_t(stage_.last_layer)].data();
}

CRef LlamaModel::input_grad() const { return acts_->dresid.data(); }

void LlamaModel::make_compute_copy() {
  if (cdt_ == DType::kF32) return;
  FT_CHECK(params_.size() == layout_.groups().size(), "make_compute_copy: no fp32 parameters");
  compute_params_.clear();
  for (size_t g = 0; g < params_.size(); ++g) {
    compute_params_.emplace_back(dev_, cdt_, params_[g].size());
    ops().convert(st_, compute_params_[g].data(), params_[g].data(), params_[g].size());
    params_[g] = Buffer<float>();  // freed group by group: the peak is one fp32 group more
  }
  params_.clear();
}

size_t LlamaModel::param_bytes() const {
  size_t b = 0;
  for (const auto& x : params_) b += x.bytes();
  for (const auto& x : compute_params_) b += x.bytes();
  return b;
}

Ref LlamaModel::compute_params(int g) {
  if (!compute_params_.empty()) return compute_params_[size_t(g)].data();
  return params_[size_t(g)].data();
}

void LlamaModel::copy(Ref dst, CRef src, size_t n) {
  FT_CHECK(dst.dtype == src.dtype, "copy of ", dtype_name(src.dtype), " into ",
           dtype_name(dst.dtype));
  dev_->copy(st_, dst.ptr, src.ptr, n * dtype_size(dst.dtype));
}

void LlamaModel::tensor_all_reduce(Ref x, size_t n) {
  if (tp_ == 1) return;
  if (x.dtype == DType::kF32) {
    tp_comm_->all_reduce_sum(static_cast<float*>(x.ptr), n);
    return;
  }
  float* f = acts_->tp_f32.data();
  FT_CHECK(n <= acts_->tp_f32.size(), "tensor all-reduce of ", n, " elements");
  ops().convert(st_, f, x, n);
  tp_comm_->all_reduce_sum(f, n);
  ops().convert(st_, x, f, n);
}

std::vector<Buffer<float>>& LlamaModel::grads() {
  if (grads_.empty())
    for (size_t g = 0; g < layout_.groups().size(); ++g) {
      grads_.emplace_back(dev_, owns_group(int(g)) ? layout_.groups()[g].numel : 0);
      grads_.back().zero();
    }
  return grads_;
}

LlamaModel::~LlamaModel() = default;

std::vector<std::vector<float>> LlamaModel::params_to_host() const {
  std::vector<std::vector<float>> host(params_.size());
  for (size_t g = 0; g < params_.size(); ++g) {
    host[g].resize(params_[g].size());
    params_[g].download(host[g].data(), params_[g].size());
  }
  return host;
}

void LlamaModel::params_from_host(const std::vector<std::vector<float>>& host) {
  FT_CHECK(host.size() == params_.size(), "params_from_host: ", host.size(), " groups for ",
           params_.size());
  for (size_t g = 0; g < params_.size(); ++g) {
    FT_CHECK(host[g].size() == params_[g].size(), "params_from_host: group ", g, " has ",
             host[g].size(), " elements, expected ", params_[g].size());
    params_[g].upload(host[g].data(), host[g].size());
  }
}

void LlamaModel::init_random(uint64_t seed, double std) {
  // Drawn on the host, one tensor at a time, then copied to the device.
  const auto& groups = layout_.groups();
  std::vector<float> host;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (!owns_group(int(gi))) continue;
    for (const auto& e : groups[gi].entries) {
      host.assign(e.numel, 1.0f);
      float* p = host.data();
      if (e.shape.size() < 2) {
        params_[gi].upload(p, e.numel, e.offset);
        continue;
      }
      // One stream per tensor, keyed by its name, so adding a tensor never shifts the others.
      uint64_t h = seed * 0x100000001b3ull + 0xcbf29ce484222325ull;
      for (char c : e.name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
      SplitMix64 rng{h};
      for (size_t i = 0; i < e.numel; i += 2) {  // Box–Muller
        double r = std::sqrt(-2.0 * std::log(rng.uniform()));
        double t = 2.0 * M_PI * rng.uniform();
        p[i] = float(std * r * std::cos(t));
        if (i + 1 < e.numel) p[i + 1] = float(std * r * std::sin(t));
      }
      params_[gi].upload(p, e.numel, e.offset);
    }
  }
}

void LlamaModel::zero_grads() {
  for (auto& g : grads_) g.zero();  // hooks zero their own working buffers
}

void LlamaModel::ensure_acts(int slot, int B, int T, bool need_backward) {
  if (size_t(slot) >= slots_.size()) slots_.resize(size_t(slot) + 1);
  std::unique_ptr<Acts>& cur = slots_[size_t(slot)];
  acts_ = cur.get();
  if (cur && cur->B == B && cur->T == T && (cur->backward || !need_backward)) return;
  cur.reset();  // free the old set first so the peak is not two sets
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->T = T;
  a->backward = need_backward;
  const size_t N = size_t(B) * T, C = cfg_.dim, F = F_, V = V_;
  if (stage_.embed) a->inputs = Buffer<int32_t>(dev_, N);
  if (stage_.head) {
    a->targets = Buffer<int32_t>(dev_, N);
    a->mask = Buffer<uint8_t>(dev_, N);
  }
  const size_t HD = size_t(H_) * layout_.head_dim();
  const size_t KD = size_t(K_) * layout_.head_dim();
  const int L = cfg_.n_layers;
  // Residual stream: resid[l] is layer l's input; only this stage's [first, last] exist.
  const DType ct = cdt_;
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
    a->logits = DBuffer(dev_, ct, N * V);
  }
  if (tp_ > 1) {
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
    a->dg = DBuffer(dev_, ct, N * F);
    a->du = DBuffer(dev_, ct, N * F);
    a->dh = DBuffer(dev_, ct, N * F);
    a->attn_scratch = Buffer<float>(
        dev_, ops().attention_backward_scratch_elems(ct, B, T, H_, layout_.head_dim()));
  }
  cur = std::move(a);
  acts_ = cur.get();
}

// y += x·Wᵀ for a row-parallel layer (o_proj, down_proj): with tensor parallelism each rank
// multiplies its slice of the input features and the partial sums are all-reduced (Megatron's g).
void LlamaModel::row_parallel_forward(Ref y, CRef x, CRef W, int N, int in, int out) {
  if (tp_ == 1) {
    ops().linear_forward(st_, y, x, W, N, in, out, /*accumulate=*/true);
    return;
  }
  Ref partial = acts_->tp_partial.data();
  ops().linear_forward(st_, partial, x, W, N, in, out, false);
  tensor_all_reduce(partial, size_t(N) * out);
  ops().add(st_, y, partial, size_t(N) * out);
}

void LlamaModel::layer_forward(int l, int B, int T) {
  Acts& a = *acts_;
  LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : size_t(l - stage_.first_layer)];
  const int N = B * T, C = cfg_.dim, F = F_, H = H_, K = K_;
  const int D = layout_.head_dim();
  const BlockOffsets& o = layout_.block_offsets();
  const CRef w = P(1 + l);
  const CRef x = a.resid[l].data();
  const Ref y = a.resid[l + 1].data();

  ops().rmsnorm_forward(st_, la.ln1.data(), la.rstd1.data(), x, w + o.attn_norm, N, C, float(cfg_.norm_eps));
  ops().linear_forward(st_, la.q.data(), la.ln1.data(), w + o.wq, N, C, H * D, false);
  ops().linear_forward(st_, la.kk.data(), la.ln1.data(), w + o.wk, N, C, K * D, false);
  ops().linear_forward(st_, la.v.data(), la.ln1.data(), w + o.wv, N, C, K * D, false);
  ops().rope_forward(st_, la.q.data(), rope_inv_freq_.data(), B, T, H, D);
  ops().rope_forward(st_, la.kk.data(), rope_inv_freq_.data(), B, T, K, D);
  ops().attention_forward(st_, la.att.data(), la.lse.data(), la.q.data(), la.kk.data(),
                          la.v.data(), B, T, H, K, D);
  copy(la.mid.data(), x, size_t(N) * C);
  row_parallel_forward(la.mid.data(), la.att.data(), w + o.wo, N, H * D, C);

  ops().rmsnorm_forward(st_, la.ln2.data(), la.rstd2.data(), la.mid.data(), w + o.mlp_norm, N, C,
                     float(cfg_.norm_eps));
  ops().linear_forward(st_, la.g.data(), la.ln2.data(), w + o.w_gate, N, C, F, false);
  ops().linear_forward(st_, la.u.data(), la.ln2.data(), w + o.w_up, N, C, F, false);
  ops().swiglu_forward(st_, la.h.data(), la.g.data(), la.u.data(), size_t(N) * F);
  copy(y, la.mid.data(), size_t(N) * C);
  row_parallel_forward(y, la.h.data(), w + o.w_down, N, F, C);
  release(1 + l);
}

// On entry a.dresid holds dL/d(resid[l+1]); on exit dL/d(resid[l]).
void LlamaModel::layer_backward(int l, int B, int T) {
  Acts& a = *acts_;
  if (ckpt_) layer_forward(l, B, T);  // recompute this layer's activations
  LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : size_t(l - stage_.first_layer)];
  const int N = B * T, C = cfg_.dim, F = F_, H = H_, K = K_;
  const int D = layout_.head_dim();
  const BlockOffsets& o = layout_.block_offsets();
  const CRef w = P(1 + l);
  float* dw = G(1 + l);
  const CRef x = a.resid[l].data();
  const Ref dy = a.dresid.data();

  // MLP: x' = mid + h·Wdᵀ
  ops().linear_backward(st_, a.dh.data(), dw + o.w_down, dy, la.h.data(), w + o.w_down, N, F, C, false);
  ops().swiglu_backward(st_, a.dg.data(), a.du.data(), a.dh.data(), la.g.data(), la.u.data(), size_t(N) * F);
  // d ln2 = dg·Wg + du·Wu  (into dtmp)
  ops().linear_backward(st_, a.dtmp.data(), dw + o.w_gate, a.dg.data(), la.ln2.data(), w + o.w_gate, N, C, F, false);
  ops().linear_backward(st_, a.dtmp.data(), dw + o.w_up, a.du.data(), la.ln2.data(), w + o.w_up, N, C, F,
                     /*accumulate_dx=*/true);
  tensor_all_reduce(a.dtmp.data(), size_t(N) * C);  // column-parallel backward: sum the partials
  // The norm's input gradient is added straight into dy (accumulate_dx): dy is now dL/d mid.
  ops().rmsnorm_backward(st_, dy, dw + o.mlp_norm, a.dtmp.data(), la.mid.data(), w + o.mlp_norm,
                         la.rstd2.data(), N, C, /*accumulate_dx=*/true);

  // Attention: mid = x + att·Woᵀ
  ops().linear_backward(st_, a.datt.data(), dw + o.wo, dy, la.att.data(), w + o.wo, N, H * D, C, false);
  ops().attention_backward(st_, a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(),
                           la.att.data(), la.lse.data(), la.q.data(), la.kk.data(), la.v.data(),
                           a.attn_scratch.data(), B, T, H, K, D);
  ops().rope_backward(st_, a.dq.data(), rope_inv_freq_.data(), B, T, H, D);
  ops().rope_backward(st_, a.dk.data(), rope_inv_freq_.data(), B, T, K, D);
  ops().linear_backward(st_, a.dtmp.data(), dw + o.wq, a.dq.data(), la.ln1.data(), w + o.wq, N, C, H * D, false);
  ops().linear_backward(st_, a.dtmp.data(), dw + o.wk, a.dk.data(), la.ln1.data(), w + o.wk, N, C, K * D, true);
  ops().linear_backward(st_, a.dtmp.data(), dw + o.wv, a.dv.data(), la.ln1.data(), w + o.wv, N, C, K * D, true);
  tensor_all_reduce(a.dtmp.data(), size_t(N) * C);
  ops().rmsnorm_backward(st_, dy, dw + o.attn_norm, a.dtmp.data(), x, w + o.attn_norm,
                         la.rstd1.data(), N, C, /*accumulate_dx=*/true);  // dy is now dL/d x
  release(1 + l);
  grads_ready(1 + l);
}

void LlamaModel::forward_part(int slot, const int32_t* inputs, CRef x_in,
                              const int32_t* targets, const uint8_t* mask, int B, int T,
                              float token_weight, bool backward) {
  FT_CHECK(T <= cfg_.max_seq_len, "sequence length ", T, " exceeds model.max_seq_len ", cfg_.max_seq_len);
  ensure_acts(slot, B, T, backward);
  Acts& a = *acts_;
  const int N = B * T, C = cfg_.dim, V = V_, L = cfg_.n_layers;
  const int hg = L + 1;  // head group
  const int first = stage_.first_layer, last = stage_.last_layer;

  if (stage_.embed) {
    // The ids are checked on the host, where they arrive, before they reach the device.
    for (int n = 0; n < N; ++n)
      FT_CHECK(inputs[n] >= 0 && inputs[n] < cfg_.vocab_size, "input token id ", inputs[n],
               " out of range for vocab_size ", cfg_.vocab_size);
    a.inputs.upload(inputs, size_t(N));
    // Vocabulary-parallel embedding: each tensor rank looks up the ids in its rows, zeros
    // elsewhere, and the all-reduce assembles the rows.
    ops().embedding_forward(st_, a.resid[0].data(), a.inputs.data(), P(0), N, C, v_begin_, V);
    release(0);
    tensor_all_reduce(a.resid[0].data(), size_t(N) * C);
  } else {
    copy(a.resid[size_t(first)].data(), x_in, size_t(N) * C);
  }
  for (int l = first; l < last; ++l) layer_forward(l, B, T);
  if (!stage_.head) return;

  for (int n = 0; n < N; ++n)
    FT_CHECK(!mask[n] || (targets[n] >= 0 && targets[n] < cfg_.vocab_size), "target token id ",
             targets[n], " out of range for vocab_size ", cfg_.vocab_size);
  a.targets.upload(targets, size_t(N));
  a.mask.upload(mask, size_t(N));
  const int32_t* tgt = a.targets.data();
  const uint8_t* msk = a.mask.data();
  const CRef wf = P(hg);
  const CRef Wh = cfg_.tie_embeddings ? P(0) : wf + C;
  ops().rmsnorm_forward(st_, a.lnf.data(), a.rstdf.data(), a.resid[L].data(), wf, N, C,
                        float(cfg_.norm_eps));
  ops().linear_forward(st_, a.logits.data(), a.lnf.data(), Wh, N, C, V, false);  // (N, V / tensor)
  const Ref dlogits = backward ? a.logits.data() : Ref(nullptr, cdt_);
  if (tp_ == 1) {
    ops().cross_entropy(st_, dlogits, a.logits.data(), tgt, msk, N, V, token_weight,
                        loss_acc_.data());
  } else {  // vocabulary-parallel cross-entropy: no rank ever holds full-vocabulary logits
    ops().row_max(st_, a.row_max.data(), a.logits.data(), N, V);
    tp_comm_->all_reduce_max(a.row_max.data(), size_t(N));
    ops().ce_partial(st_, a.sumexp.data(), a.target_logit.data(), a.logits.data(), tgt, msk,
                     a.row_max.data(), N, V, v_begin_);
    tp_comm_->all_reduce_sum(a.sumexp.data(), size_t(N));
    tp_comm_->all_reduce_sum(a.target_logit.data(), size_t(N));
    ops().ce_finish(st_, dlogits, a.logits.data(), tgt, msk, a.row_max.data(), a.sumexp.data(),
                    a.target_logit.data(), N, V, v_begin_, token_weight, loss_acc_.data());
  }
  release(hg);
  if (cfg_.tie_embeddings) release(0);
}

double LlamaModel::take_loss_sum() {
  double sum = 0;
  loss_acc_.download(&sum, 1);
  loss_acc_.zero();
  return sum;
}

void LlamaModel::backward_part(int slot, CRef dy_in) {
  acts_ = slots_[size_t(slot)].get();
  Acts& a = *acts_;
  const int B = a.B, T = a.T, N = B * T, C = cfg_.dim, V = V_, L = cfg_.n_layers;
  const int hg = L + 1;
  if (stage_.head) {
    // logits = f·Whᵀ; a.logits holds dlogits since forward_part.
    const CRef wf = P(hg);
    const CRef Wh = cfg_.tie_embeddings ? P(0) : wf + C;
    float* dhead = G(hg);
    float* dWh = cfg_.tie_embeddings ? G(0) : dhead + C;
    ops().linear_backward(st_, a.dtmp.data(), dWh, a.logits.data(), a.lnf.data(), Wh, N, C, V, false);
    tensor_all_reduce(a.dtmp.data(), size_t(N) * C);  // each rank saw only its vocabulary columns
    // The final norm is the residual stream's only consumer: its dx starts dL/d resid[L].
    ops().rmsnorm_backward(st_, a.dresid.data(), dhead, a.dtmp.data(), a.resid[L].data(), wf,
                           a.rstdf.data(), N, C, /*accumulate_dx=*/false);
    release(hg);
    grads_ready(hg);
    if (cfg_.tie_embeddings) {
      release(0);
      if (!stage_.embed) grads_ready(0);  // the embedding's other half is on the first stage
    }
  } else {
    copy(a.dresid.data(), dy_in, size_t(N) * C);
  }
  for (int l = stage_.last_layer - 1; l >= stage_.first_layer; --l) layer_backward(l, B, T);
  if (stage_.embed) {
    ops().embedding_backward(st_, G(0), a.inputs.data(), a.dresid.data(), N, C, v_begin_, V);
    grads_ready(0);
  }
}

void LlamaModel::forward_backward(const int32_t* inputs, const int32_t* targets,
                                  const uint8_t* mask, int B, int T, float token_weight) {
  forward_part(0, inputs, CRef(), targets, mask, B, T, token_weight, true);
  backward_part(0, CRef());
}

void LlamaModel::forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                              int B, int T) {
  forward_part(0, inputs, CRef(), targets, mask, B, T, 0.0f, false);
}

}  // namespace ft
