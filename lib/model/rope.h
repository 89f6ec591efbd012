// RoPE frequencies: the one place where the rope types of transformers' ROPE_INIT_FUNCTIONS that
// Llama checkpoints use are turned into the per-channel-pair inverse frequencies the kernels
// rotate by (kernels.h: rope_forward). Types outside rope_types() are refused before any work
// (read_hf_config, recipe validation), never approximated.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace ft {

// The rope types ft implements, in the order error messages list them.
const std::vector<std::string>& rope_types();
bool is_rope_type(const std::string& type);

// inv_freq (D/2) for head dimension D (even), computed in fp32 in the order transformers'
// _compute_{default,linear_scaling,llama3}_parameters compute it, so that the angles
// position · inv_freq[i] are the same floats (up to the last ulp of powf):
//   default  inv_freq[i] = 1 / θ^(2i/D)
//   linear   inv_freq[i] / factor
//   llama3   wavelen = 2π / inv_freq[i]; with lo = orig / low_freq_factor and
//            hi = orig / high_freq_factor (orig = original max positions):
//            wavelen > lo → inv_freq / factor; wavelen < hi → inv_freq; else, with
//            s = (orig / wavelen − low_freq_factor) / (high_freq_factor − low_freq_factor),
//            (1 − s) · inv_freq / factor + s · inv_freq.
// The attention scaling transformers returns beside inv_freq is 1 for all three types.
std::vector<float> rope_inv_freq(const ModelConfig& m, int head_dim);

// "" when rope_inv_freq(m, head_dim) is a table of finite positive floats; else what is wrong
// (a rope_theta or factor beyond float range makes angles of 0, inf or NaN, which transformers
// would compute too, silently). For validation: the recipe and read_hf_config refuse it.
std::string rope_table_problem(const ModelConfig& m, int head_dim);

// The scaling in words, for people: "default", "linear (factor 2)" or "llama3 (factor 8,
// low/high frequency factors 1/4, original max positions 8192)"; theta is not part of it.
std::string rope_description(const ModelConfig& m);

}  // namespace ft
