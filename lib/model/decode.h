// Generation with a KV cache (`ft generate`, DESIGN.md §2): the decoder of llama.h run forward
// on one sequence, keeping each layer's keys and values so that a new token costs one pass of
// one row through the model plus its attention over the cache. The layer math is llama.cpp's
// (rmsnorm, projections and their biases, qwen3's q/k norms, RoPE, grouped-query attention,
// SwiGLU, the final norm and head), on the model's flat parameters; RoPE and attention take
// the cache's positions: rope_forward with positions pos.. and the op attention_decode
// (runtime/op_list.h).
// Sampling is on the host, over the last row's logits.
#pragma once

#include <cstdint>
#include <vector>

#include "model/llama.h"

namespace ft {

class KvDecoder {
 public:
  // model: a whole model on its device (no tensor or pipeline parallelism), parameters loaded
  // (and, with a 16-bit compute dtype, the compute copy made). max_len: the cache's rows, at
  // most model.max_seq_len. Allocates the cache (L · 2 · max_len · K · D) and one set of
  // activations for max_len rows.
  KvDecoder(LlamaModel& model, int max_len);
  ~KvDecoder();

  // Feeds ids (n ≥ 1; a prompt, or the last token sampled) at positions pos() .. pos() + n − 1,
  // appending their keys and values to the cache, and returns the last position's logits
  // (vocab_size, fp32). Throws ft::Error when the cache would overflow or an id is out of range.
  const std::vector<float>& forward(const int32_t* ids, int n);
  int pos() const { return pos_; }
  int max_len() const { return max_len_; }
  void reset() { pos_ = 0; }

 private:
  struct Buffers;
  LlamaModel& model_;
  int max_len_;
  int pos_ = 0;
  std::unique_ptr<Buffers> b_;
  std::vector<float> logits_;
};

// Token choice from a row of logits. temperature 0: greedy (the first of equal maxima, as
// torch.argmax). Otherwise softmax(logits / temperature), then the smallest set of most likely
// tokens whose probabilities sum to at least top_p (nucleus sampling, Holtzman et al. 2020;
// ties in probability kept in id order), renormalised and sampled with `rng`.
class Sampler {
 public:
  Sampler(double temperature, double top_p, uint64_t seed);
  int32_t next(const std::vector<float>& logits);

 private:
  double uniform();  // [0, 1) from a splitmix64 stream: the same numbers on every platform
  double temperature_, top_p_;
  uint64_t state_;
};

}  // namespace ft
