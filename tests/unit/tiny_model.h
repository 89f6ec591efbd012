// A tiny model for unit tests whose layout has several groups (embed, two blocks, head) of
// several tensors.
#pragma once

#include "model/config.h"

namespace ft {

inline ModelConfig tiny_model_config() {
  ModelConfig c;
  c.dim = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn_dim = 12;
  c.vocab_size = 11;
  c.max_seq_len = 4;
  return c;
}

// A small GQA model for the linear-layer tests (test_linear_hooks, test_lora): dim 16, 2 layers,
// 4 heads over 2 kv heads, ffn 24, vocab 19, sequences of up to 8.
inline ModelConfig linear_test_config() {
  ModelConfig c;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 24;
  c.vocab_size = 19;
  c.max_seq_len = 8;
  return c;
}

}  // namespace ft
