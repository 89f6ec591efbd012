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

}  // namespace ft
