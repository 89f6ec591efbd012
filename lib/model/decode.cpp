// KvDecoder: llama.cpp's forward for n new rows of one sequence at positions pos .. pos + n − 1,
// with the keys and values of earlier positions read from the cache instead of recomputed:
//   x = E[ids]; per layer: a = rmsnorm(x); q = a·Wqᵀ (+bq); k, v = a·Wkᵀ (+bk), a·Wvᵀ (+bv)
//   written straight into the cache's rows pos..; qwen3's per-head norms; RoPE of q and k at
//   positions pos.. (rope_forward with a slice of an iota buffer: the training op, bit for bit);
//   o = attention_decode(q, cache); x += o·Woᵀ; x += (silu(b·Wgᵀ) ∘ b·Wuᵀ)·Wdᵀ, b = rmsnorm(x)
// then the last row's final norm and head. Each step rounds as the training forward does, so
// a prompt's logits here are the training forward's (up to the attention's order of sums).
#include "model/decode.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model/arch.h"
#include "model/rope.h"

namespace ft {

struct KvDecoder::Buffers {
  std::vector<DBuffer> k, v;  // per layer (max_len, K·D)
  Buffer<int32_t> ids;        // (max_len)
  Buffer<int32_t> positions;  // (max_len): 0, 1, 2, ...; rows pos.. rotate with positions + pos
  DBuffer x, ln, q, q_raw, k_raw, att, g, u, h;
  Buffer<float> rstd;  // (max_len · H): a row's, or a head's (qwen3's q/k norms)
  DBuffer lnf, logits;
  Buffer<float> logits32, inv_freq;
};

KvDecoder::KvDecoder(LlamaModel& model, int max_len) : model_(model), max_len_(max_len) {
  const ModelConfig& c = model.config();
  FT_CHECK(model.layout().tensor() == 1 && model.stage().embed && model.stage().head &&
               model.stage().first_layer == 0 && model.stage().last_layer == c.n_layers,
           "KvDecoder: the model must be whole (no tensor or pipeline parallelism)");
  FT_CHECK(max_len >= 1 && max_len <= c.max_seq_len, "KvDecoder: cache length ", max_len,
           " outside [1, model.max_seq_len = ", c.max_seq_len, "]");
  Device* dev = model.device();
  const DType ct = model.compute_dtype();
  const size_t D = size_t(model.layout().head_dim()), HD = size_t(c.n_heads) * D,
               KD = size_t(c.n_kv_heads) * D, N = size_t(max_len), C = size_t(c.dim),
               F = size_t(c.ffn_dim), V = size_t(c.vocab_size);
  const MemoryScope tag(MemoryCategory::kActivations);
  b_ = std::make_unique<Buffers>();
  Buffers& b = *b_;
  for (int l = 0; l < c.n_layers; ++l) {
    b.k.emplace_back(dev, ct, N * KD);
    b.v.emplace_back(dev, ct, N * KD);
  }
  b.ids = Buffer<int32_t>(dev, N);
  std::vector<int32_t> iota(N);
  std::iota(iota.begin(), iota.end(), 0);
  b.positions = Buffer<int32_t>(dev, N);
  b.positions.upload(iota.data(), N);
  b.x = DBuffer(dev, ct, N * C);
  b.ln = DBuffer(dev, ct, N * C);
  b.q = DBuffer(dev, ct, N * HD);
  if (arch_of(c).qk_norm) {
    b.q_raw = DBuffer(dev, ct, N * HD);
    b.k_raw = DBuffer(dev, ct, N * KD);
  }
  b.att = DBuffer(dev, ct, N * HD);
  b.g = DBuffer(dev, ct, N * F);
  b.u = DBuffer(dev, ct, N * F);
  b.h = DBuffer(dev, ct, N * F);
  b.rstd = Buffer<float>(dev, N * size_t(std::max(c.n_heads, 1)));
  b.lnf = DBuffer(dev, ct, C);
  b.logits = DBuffer(dev, ct, V);
  b.logits32 = Buffer<float>(dev, V);
  const std::vector<float> inv = rope_inv_freq(c, int(D));
  b.inv_freq = Buffer<float>(dev, inv.size());
  b.inv_freq.upload(inv.data(), inv.size());
  logits_.resize(V);
}

KvDecoder::~KvDecoder() = default;

const std::vector<float>& KvDecoder::forward(const int32_t* ids, int n) {
  const ModelConfig& c = model_.config();
  FT_CHECK(n >= 1, "KvDecoder::forward: no tokens");
  FT_CHECK(pos_ + n <= max_len_, "generation reached the cache length ", max_len_, " (position ",
           pos_ + n, "); the model's max_seq_len is ", c.max_seq_len);
  for (int i = 0; i < n; ++i)
    FT_CHECK(ids[i] >= 0 && ids[i] < c.vocab_size, "token id ", ids[i],
             " out of range for vocab_size ", c.vocab_size);
  Buffers& b = *b_;
  Device* dev = model_.device();
  Ops& ops = dev->ops();
  const Stream s = dev->stream();
  FlatParams& fp = model_.flat_params();
  const int C = c.dim, H = c.n_heads, K = c.n_kv_heads, F = c.ffn_dim, V = c.vocab_size,
            L = c.n_layers, D = model_.layout().head_dim(), p = pos_;
  const float eps = float(c.norm_eps);
  const BlockOffsets& o = model_.layout().block_offsets();
  const bool qk_norm = arch_of(c).qk_norm;
  // The model's linear layers, whole (model/linear.h), with its adapters' hooks.
  const TensorGroup one(nullptr, dev);
  LinearContext lc;
  lc.dev = dev;
  lc.tp = &one;
  lc.hooks = model_.linear_hooks();
  const Linear wq{Proj::kQ, C, H * D}, wk{Proj::kK, C, K * D}, wv{Proj::kV, C, K * D},
      wo{Proj::kO, H * D, C}, wg{Proj::kGate, C, F}, wu{Proj::kUp, C, F}, wd{Proj::kDown, F, C},
      head{Proj::kHead, C, V};

  b.ids.upload(ids, size_t(n));
  ops.embedding_forward(s, b.x.data(), b.ids.data(), fp.acquire(0), n, C, 0, V);
  fp.release(0);
  const Ref x = b.x.data();
  for (int l = 0; l < L; ++l) {
    const CRef w = fp.acquire(1 + l);
    const int ag = model_.layout().attached_group(1 + l);  // the block's adapters, or -1
    lc.adapter = ag >= 0 ? fp.acquire(ag) : CRef();
    const Ref kc = b.k[size_t(l)].data() + size_t(p) * K * D;  // this call's rows of the cache
    const Ref vc = b.v[size_t(l)].data() + size_t(p) * K * D;
    ops.rmsnorm_forward(s, b.ln.data(), b.rstd.data(), x, w + o.attn_norm, n, C, eps);
    const Ref q = qk_norm ? b.q_raw.data() : b.q.data();
    const Ref k = qk_norm ? b.k_raw.data() : kc;
    linear_forward(lc, wq, l, q, b.ln.data(), w + o.wq, n);
    linear_forward(lc, wk, l, k, b.ln.data(), w + o.wk, n);
    linear_forward(lc, wv, l, vc, b.ln.data(), w + o.wv, n);
    if (o.bq != BlockOffsets::kAbsent) {
      ops.bias_add(s, q, w + o.bq, n, H * D);
      ops.bias_add(s, k, w + o.bk, n, K * D);
      ops.bias_add(s, vc, w + o.bv, n, K * D);
    }
    if (qk_norm) {
      ops.rmsnorm_forward(s, b.q.data(), b.rstd.data(), q, w + o.q_norm, n * H, D, eps);
      ops.rmsnorm_forward(s, kc, b.rstd.data(), k, w + o.k_norm, n * K, D, eps);
    }
    ops.rope_forward(s, b.q.data(), b.inv_freq.data(), 1, n, H, D, b.positions.data() + p);
    ops.rope_forward(s, kc, b.inv_freq.data(), 1, n, K, D, b.positions.data() + p);
    ops.attention_decode(s, b.att.data(), b.q.data(), b.k[size_t(l)].data(), b.v[size_t(l)].data(),
                         p, n, H, K, D);
    linear_forward(lc, wo, l, x, b.att.data(), w + o.wo, n);  // x += o·Woᵀ
    ops.rmsnorm_forward(s, b.ln.data(), b.rstd.data(), x, w + o.mlp_norm, n, C, eps);
    linear_forward(lc, wg, l, b.g.data(), b.ln.data(), w + o.w_gate, n);
    linear_forward(lc, wu, l, b.u.data(), b.ln.data(), w + o.w_up, n);
    ops.swiglu_forward(s, b.h.data(), b.g.data(), b.u.data(), size_t(n) * F);
    linear_forward(lc, wd, l, x, b.h.data(), w + o.w_down, n);  // x += h·Wdᵀ
    fp.release(1 + l);
    if (ag >= 0) fp.release(ag);
  }
  // The final norm and the output weight where the layout has them (model/layout.h).
  const TensorAt nat = model_.layout().final_norm(), wat = model_.layout().output_weight();
  const CRef wf = fp.acquire(nat.group) + nat.offset;
  const CRef Wh = fp.acquire(wat.group) + wat.offset;
  ops.rmsnorm_forward(s, b.lnf.data(), b.rstd.data(), x + size_t(n - 1) * C, wf, 1, C, eps);
  linear_forward(lc, head, -1, b.logits.data(), b.lnf.data(), Wh, 1);
  fp.release(nat.group);
  fp.release(wat.group);
  ops.convert(s, Ref(b.logits32.data()), b.logits.data(), size_t(V));
  b.logits32.download(logits_.data(), size_t(V));
  pos_ += n;
  return logits_;
}

Sampler::Sampler(double temperature, double top_p, uint64_t seed)
    : temperature_(temperature), top_p_(top_p), state_(seed) {
  // NaN compares false with everything: unchecked, a NaN temperature turned every probability
  // into NaN and every choice into token 0.
  if (!(std::isfinite(temperature) && temperature >= 0))
    throw UsageError(detail::concat("temperature ", temperature,
                                    ": must be a finite number, 0 (greedy) or more"));
  if (!(top_p > 0 && top_p <= 1))
    throw UsageError(detail::concat("top_p ", top_p, ": must be in (0, 1]"));
}

double Sampler::uniform() {
  // splitmix64 (Steele, Lea and Flood 2014), top 53 bits as a double in [0, 1).
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::next(const std::vector<float>& logits) {
  const int V = int(logits.size());
  FT_CHECK(V > 0, "Sampler: no logits");
  // A NaN or infinite logit (weights that hold one, or a 16-bit overflow) would make every
  // choice the same meaningless token: refused, naming the first.
  bool finite = true;
  for (int i = 0; i < V; ++i)
    finite &= std::fabs(logits[size_t(i)]) <= std::numeric_limits<float>::max();
  if (!finite) {
    int i = 0;
    while (std::isfinite(logits[size_t(i)])) ++i;
    throw Error(detail::concat(
        "the model computed ", std::isnan(logits[size_t(i)]) ? "NaN" : "an infinite value",
        " as the logit of token id ", i,
        ": its weights hold a non-finite value or the computation overflowed (with a 16-bit "
        "dtype, try f32)"));
  }
  int32_t best = 0;
  for (int i = 1; i < V; ++i)
    if (logits[size_t(i)] > logits[size_t(best)]) best = i;
  if (temperature_ <= 0) return best;
  // Probabilities in double, relative to the largest logit.
  std::vector<double> prob(static_cast<size_t>(V));
  const double top = logits[size_t(best)];
  double sum = 0;
  for (int i = 0; i < V; ++i)
    sum += prob[size_t(i)] = std::exp((double(logits[size_t(i)]) - top) / temperature_);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return prob[size_t(a)] > prob[size_t(b)]; });
  // The nucleus: the most likely tokens until their mass reaches top_p (at least one).
  size_t keep = 0;
  double mass = 0;
  while (keep < order.size() && (keep == 0 || mass < top_p_ * sum))
    mass += prob[size_t(order[keep++])];
  double r = uniform() * mass;
  for (size_t i = 0; i < keep; ++i) {
    r -= prob[size_t(order[i])];
    if (r < 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace ft
