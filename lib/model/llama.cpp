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
#include "kernels/kernels.h"
#include "model/rope.h"

namespace ft {
namespace k = kernels;

// Activations of one layer, (N = B*T rows).
struct LayerActs {
  Buffer<float> ln1, rstd1;  // (N, C), (N)
  Buffer<float> q, kk, v;    // (N, H*D), (N, K*D), (N, K*D) — q and k after RoPE
  Buffer<float> lse;         // (B, H, T) attention logsumexp per row, fp32
  Buffer<float> att;         // (N, H*D) attention output before o_proj
  Buffer<float> mid;         // (N, C) residual after attention
  Buffer<float> ln2, rstd2;  // (N, C), (N)
  Buffer<float> g, u, h;     // (N, F) each
};

struct LlamaModel::Acts {
  int B = 0, T = 0;
  bool backward = false;
  const int32_t* inputs = nullptr;
  std::vector<Buffer<float>> resid;  // L+1 of (N, C): resid[l] is layer l's input
  std::vector<LayerActs> layers;     // L, or 1 with activation checkpointing
  Buffer<float> lnf, rstdf;          // (N, C), (N)
  Buffer<float> logits;              // (N, V / tensor); becomes dlogits in backward
  // tensor parallelism: a row-parallel layer's partial output (N, C); cross-entropy statistics
  Buffer<float> tp_partial, row_max;         // (N, C), (N)
  Buffer<double> sumexp, target_logit;       // (N), (N)
  // backward scratch
  Buffer<float> dresid, dtmp;        // (N, C)
  Buffer<float> dq, dk, dv, datt;    // (N, H*D), (N, K*D), (N, K*D), (N, H*D)
  Buffer<float> dg, du, dh;          // (N, F)
  Buffer<float> attn_scratch;        // k::attention_backward_scratch_elems: (B, H, T) in fp32
};

LlamaModel::LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing,
                       Communicator* tensor_comm, StageSpec stage)
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
      rope_inv_freq_(rope_inv_freq(cfg, layout_.head_dim())),
      stage_(stage) {
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

const float* LlamaModel::stage_output(int slot) const {
  return slots_[size_t(slot)]->resid[size_t(stage_.last_layer)].data();
}

const float* LlamaModel::input_grad() const { return acts_->dresid.data(); }

std::vector<Buffer<float>>& LlamaModel::grads() {
  if (grads_.empty())
    for (size_t g = 0; g < layout_.groups().size(); ++g) {
      grads_.emplace_back(dev_, owns_group(int(g)) ? layout_.groups()[g].numel : 0);
      grads_.back().zero();
    }
  return grads_;
}

LlamaModel::~LlamaModel() = default;

std::vector<float*> LlamaModel::param_ptrs() {
  std::vector<float*> p;
  for (auto& b : params_) p.push_back(b.data());
  return p;
}

void LlamaModel::init_random(uint64_t seed, double std) {
  const auto& groups = layout_.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (!owns_group(int(gi))) continue;
    for (const auto& e : groups[gi].entries) {
      float* p = params_[gi].data() + e.offset;
      if (e.shape.size() < 2) {
        for (size_t i = 0; i < e.numel; ++i) p[i] = 1.0f;
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
  const size_t HD = size_t(H_) * layout_.head_dim();
  const size_t KD = size_t(K_) * layout_.head_dim();
  const int L = cfg_.n_layers;
  // Residual stream: resid[l] is layer l's input; only this stage's [first, last] exist.
  for (int l = 0; l <= L; ++l)
    a->resid.emplace_back(dev_, l >= stage_.first_layer && l <= stage_.last_layer ? N * C : 0);
  const int stage_layers = stage_.last_layer - stage_.first_layer;
  int nsets = (ckpt_ || !need_backward) ? std::min(1, stage_layers) : stage_layers;
  for (int i = 0; i < nsets; ++i) {
    LayerActs la;
    la.ln1 = Buffer<float>(dev_, N * C);
    la.rstd1 = Buffer<float>(dev_, N);
    la.q = Buffer<float>(dev_, N * HD);
    la.kk = Buffer<float>(dev_, N * KD);
    la.v = Buffer<float>(dev_, N * KD);
    la.lse = Buffer<float>(dev_, size_t(B) * H_ * T);
    la.att = Buffer<float>(dev_, N * HD);
    la.mid = Buffer<float>(dev_, N * C);
    la.ln2 = Buffer<float>(dev_, N * C);
    la.rstd2 = Buffer<float>(dev_, N);
    la.g = Buffer<float>(dev_, N * F);
    la.u = Buffer<float>(dev_, N * F);
    la.h = Buffer<float>(dev_, N * F);
    a->layers.push_back(std::move(la));
  }
  if (stage_.head) {
    a->lnf = Buffer<float>(dev_, N * C);
    a->rstdf = Buffer<float>(dev_, N);
    a->logits = Buffer<float>(dev_, N * V);
  }
  if (tp_ > 1) {
    a->tp_partial = Buffer<float>(dev_, N * C);
    a->row_max = Buffer<float>(dev_, N);
    a->sumexp = Buffer<double>(dev_, N);
    a->target_logit = Buffer<double>(dev_, N);
  }
  if (need_backward) {
    a->dresid = Buffer<float>(dev_, N * C);
    a->dtmp = Buffer<float>(dev_, N * C);
    a->dq = Buffer<float>(dev_, N * HD);
    a->dk = Buffer<float>(dev_, N * KD);
    a->dv = Buffer<float>(dev_, N * KD);
    a->datt = Buffer<float>(dev_, N * HD);
    a->dg = Buffer<float>(dev_, N * F);
    a->du = Buffer<float>(dev_, N * F);
    a->dh = Buffer<float>(dev_, N * F);
    a->attn_scratch = Buffer<float>(
        dev_, k::attention_backward_scratch_elems<float>(B, T, H_, layout_.head_dim()));
  }
  cur = std::move(a);
  acts_ = cur.get();
}

// y += x·Wᵀ for a row-parallel layer (o_proj, down_proj): with tensor parallelism each rank
// multiplies its slice of the input features and the partial sums are all-reduced (Megatron's g).
void LlamaModel::row_parallel_forward(float* y, const float* x, const float* W, int N, int in,
                                      int out) {
  if (tp_ == 1) {
    k::linear_forward(y, x, W, N, in, out, /*accumulate=*/true);
    return;
  }
  float* partial = acts_->tp_partial.data();
  k::linear_forward(partial, x, W, N, in, out);
  tp_comm_->all_reduce_sum(partial, size_t(N) * out);
  k::add_inplace(y, partial, size_t(N) * out);
}

void LlamaModel::layer_forward(int l, int B, int T) {
  Acts& a = *acts_;
  LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : size_t(l - stage_.first_layer)];
  const int N = B * T, C = cfg_.dim, F = F_, H = H_, K = K_;
  const int D = layout_.head_dim();
  const BlockOffsets& o = layout_.block_offsets();
  const float* w = P(1 + l);
  const float* x = a.resid[l].data();
  float* y = a.resid[l + 1].data();

  k::rmsnorm_forward(la.ln1.data(), la.rstd1.data(), x, w + o.attn_norm, N, C, float(cfg_.norm_eps));
  k::linear_forward(la.q.data(), la.ln1.data(), w + o.wq, N, C, H * D);
  k::linear_forward(la.kk.data(), la.ln1.data(), w + o.wk, N, C, K * D);
  k::linear_forward(la.v.data(), la.ln1.data(), w + o.wv, N, C, K * D);
  k::rope_forward(la.q.data(), rope_inv_freq_.data(), B, T, H, D);
  k::rope_forward(la.kk.data(), rope_inv_freq_.data(), B, T, K, D);
  k::attention_forward(la.att.data(), la.lse.data(), la.q.data(), la.kk.data(), la.v.data(), B, T,
                       H, K, D);
  std::memcpy(la.mid.data(), x, sizeof(float) * size_t(N) * C);
  row_parallel_forward(la.mid.data(), la.att.data(), w + o.wo, N, H * D, C);

  k::rmsnorm_forward(la.ln2.data(), la.rstd2.data(), la.mid.data(), w + o.mlp_norm, N, C,
                     float(cfg_.norm_eps));
  k::linear_forward(la.g.data(), la.ln2.data(), w + o.w_gate, N, C, F);
  k::linear_forward(la.u.data(), la.ln2.data(), w + o.w_up, N, C, F);
  k::swiglu_forward(la.h.data(), la.g.data(), la.u.data(), size_t(N) * F);
  std::memcpy(y, la.mid.data(), sizeof(float) * size_t(N) * C);
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
  const float* w = P(1 + l);
  float* dw = G(1 + l);
  const float* x = a.resid[l].data();
  float* dy = a.dresid.data();

  // MLP: x' = mid + h·Wdᵀ
  k::linear_backward(a.dh.data(), dw + o.w_down, dy, la.h.data(), w + o.w_down, N, F, C);
  k::swiglu_backward(a.dg.data(), a.du.data(), a.dh.data(), la.g.data(), la.u.data(), size_t(N) * F);
  // d ln2 = dg·Wg + du·Wu  (into dtmp)
  k::linear_backward(a.dtmp.data(), dw + o.w_gate, a.dg.data(), la.ln2.data(), w + o.w_gate, N, C, F);
  k::linear_backward(a.dtmp.data(), dw + o.w_up, a.du.data(), la.ln2.data(), w + o.w_up, N, C, F,
                     /*accumulate_dx=*/true);
  tensor_all_reduce(a.dtmp.data(), size_t(N) * C);  // column-parallel backward: sum the partials
  // rmsnorm_backward may not write in place, so d mid lands in la.ln2, whose forward value is
  // no longer needed once the gate/up weight gradients above are done.
  k::rmsnorm_backward(la.ln2.data(), dw + o.mlp_norm, a.dtmp.data(), la.mid.data(), w + o.mlp_norm,
                      la.rstd2.data(), N, C);
  k::add_inplace(dy, la.ln2.data(), size_t(N) * C);  // dy is now dL/d mid

  // Attention: mid = x + att·Woᵀ
  k::linear_backward(a.datt.data(), dw + o.wo, dy, la.att.data(), w + o.wo, N, H * D, C);
  k::attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(), la.att.data(),
                        la.lse.data(), la.q.data(), la.kk.data(), la.v.data(),
                        a.attn_scratch.data(), B, T, H, K, D);
  k::rope_backward(a.dq.data(), rope_inv_freq_.data(), B, T, H, D);
  k::rope_backward(a.dk.data(), rope_inv_freq_.data(), B, T, K, D);
  k::linear_backward(a.dtmp.data(), dw + o.wq, a.dq.data(), la.ln1.data(), w + o.wq, N, C, H * D);
  k::linear_backward(a.dtmp.data(), dw + o.wk, a.dk.data(), la.ln1.data(), w + o.wk, N, C, K * D, true);
  k::linear_backward(a.dtmp.data(), dw + o.wv, a.dv.data(), la.ln1.data(), w + o.wv, N, C, K * D, true);
  tensor_all_reduce(a.dtmp.data(), size_t(N) * C);
  k::rmsnorm_backward(la.ln1.data(), dw + o.attn_norm, a.dtmp.data(), x, w + o.attn_norm,
                      la.rstd1.data(), N, C);
  k::add_inplace(dy, la.ln1.data(), size_t(N) * C);  // dL/d x
  release(1 + l);
  grads_ready(1 + l);
}

double LlamaModel::forward_part(int slot, const int32_t* inputs, const float* x_in,
                                const int32_t* targets, const uint8_t* mask, int B, int T,
                                float token_weight, bool backward) {
  FT_CHECK(T <= cfg_.max_seq_len, "sequence length ", T, " exceeds model.max_seq_len ", cfg_.max_seq_len);
  ensure_acts(slot, B, T, backward);
  Acts& a = *acts_;
  a.inputs = inputs;
  const int N = B * T, C = cfg_.dim, V = V_, L = cfg_.n_layers;
  const int hg = L + 1;  // head group
  const int first = stage_.first_layer, last = stage_.last_layer;

  if (stage_.embed) {
    for (int n = 0; n < N; ++n)
      FT_CHECK(inputs[n] >= 0 && inputs[n] < cfg_.vocab_size, "input token id ", inputs[n],
               " out of range for vocab_size ", cfg_.vocab_size);
    // Vocabulary-parallel embedding: each tensor rank looks up the ids in its rows, zeros
    // elsewhere, and the all-reduce assembles the rows.
    k::embedding_forward(a.resid[0].data(), inputs, P(0), N, C, v_begin_, tp_ > 1 ? V : -1);
    release(0);
    tensor_all_reduce(a.resid[0].data(), size_t(N) * C);
  } else {
    std::memcpy(a.resid[size_t(first)].data(), x_in, sizeof(float) * size_t(N) * C);
  }
  for (int l = first; l < last; ++l) layer_forward(l, B, T);
  if (!stage_.head) return 0.0;

  for (int n = 0; n < N; ++n)
    FT_CHECK(!mask[n] || (targets[n] >= 0 && targets[n] < cfg_.vocab_size), "target token id ",
             targets[n], " out of range for vocab_size ", cfg_.vocab_size);
  const float* wf = P(hg);
  const float* Wh = cfg_.tie_embeddings ? P(0) : wf + C;
  k::rmsnorm_forward(a.lnf.data(), a.rstdf.data(), a.resid[L].data(), wf, N, C, float(cfg_.norm_eps));
  k::linear_forward(a.logits.data(), a.lnf.data(), Wh, N, C, V);  // (N, V / tensor)
  float* dlogits = backward ? a.logits.data() : nullptr;
  double loss_sum;
  if (tp_ == 1) {
    loss_sum = k::cross_entropy_forward_backward(dlogits, a.logits.data(), targets, mask, N, V,
                                                 token_weight);
  } else {  // vocabulary-parallel cross-entropy: no rank ever holds full-vocabulary logits
    k::row_max(a.row_max.data(), a.logits.data(), N, V);
    tp_comm_->all_reduce_max(a.row_max.data(), size_t(N));
    k::ce_partial(a.sumexp.data(), a.target_logit.data(), a.logits.data(), targets, mask,
                  a.row_max.data(), N, V, v_begin_);
    tp_comm_->all_reduce_sum(a.sumexp.data(), size_t(N));
    tp_comm_->all_reduce_sum(a.target_logit.data(), size_t(N));
    loss_sum = k::ce_finish(dlogits, a.logits.data(), targets, mask, a.row_max.data(),
                            a.sumexp.data(), a.target_logit.data(), N, V, v_begin_, token_weight);
  }
  release(hg);
  if (cfg_.tie_embeddings) release(0);
  return loss_sum;
}

void LlamaModel::backward_part(int slot, const float* dy_in) {
  acts_ = slots_[size_t(slot)].get();
  Acts& a = *acts_;
  const int B = a.B, T = a.T, N = B * T, C = cfg_.dim, V = V_, L = cfg_.n_layers;
  const int hg = L + 1;
  if (stage_.head) {
    // logits = f·Whᵀ; a.logits holds dlogits since forward_part.
    const float* wf = P(hg);
    const float* Wh = cfg_.tie_embeddings ? P(0) : wf + C;
    float* dhead = G(hg);
    float* dWh = cfg_.tie_embeddings ? G(0) : dhead + C;
    k::linear_backward(a.dtmp.data(), dWh, a.logits.data(), a.lnf.data(), Wh, N, C, V);
    tensor_all_reduce(a.dtmp.data(), size_t(N) * C);  // each rank saw only its vocabulary columns
    k::rmsnorm_backward(a.dresid.data(), dhead, a.dtmp.data(), a.resid[L].data(), wf,
                        a.rstdf.data(), N, C);
    release(hg);
    grads_ready(hg);
    if (cfg_.tie_embeddings) {
      release(0);
      if (!stage_.embed) grads_ready(0);  // the embedding's other half is on the first stage
    }
  } else {
    std::memcpy(a.dresid.data(), dy_in, sizeof(float) * size_t(N) * C);
  }
  for (int l = stage_.last_layer - 1; l >= stage_.first_layer; --l) layer_backward(l, B, T);
  if (stage_.embed) {
    k::embedding_backward(G(0), a.inputs, a.dresid.data(), N, C, v_begin_, tp_ > 1 ? V : -1);
    grads_ready(0);
  }
}

double LlamaModel::forward_backward(const int32_t* inputs, const int32_t* targets,
                                    const uint8_t* mask, int B, int T, float token_weight) {
  const double loss = forward_part(0, inputs, nullptr, targets, mask, B, T, token_weight, true);
  backward_part(0, nullptr);
  return loss;
}

double LlamaModel::forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                                int B, int T) {
  return forward_part(0, inputs, nullptr, targets, mask, B, T, 0.0f, false);
}

}  // namespace ft
