// RoPE inverse frequencies as transformers computes them (see rope.h). Every step is an fp32
// operation like the torch one it mirrors, with Python scalars rounded to float first, as torch
// does when a Python number meets a float32 tensor; `x / t` of a scalar by a tensor is
// reciprocal(t) · x in torch (Tensor.__rtruediv__), and is written so here. Contraction into
// fused multiply-adds is switched off below, so each product is rounded as torch rounds it
// whatever -march the file is built with (tests/unit/test_rope.cpp pins the bits).
#include "model/rope.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ft {

const std::vector<std::string>& rope_types() {
  static const std::vector<std::string> types = {"default", "linear", "llama3"};
  return types;
}

bool is_rope_type(const std::string& type) {
  for (const std::string& t : rope_types())
    if (t == type) return true;
  return false;
}

namespace {

// Entry i of the table (see rope.h), on its own: every entry depends only on its index.
float inv_freq_at(const ModelConfig& m, int i, int head_dim) {
  // _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2).float() / dim))
  const float base = float(m.rope_theta);
  const float exponent = float(2 * i) / float(head_dim);
  const float f = 1.0f / std::pow(base, exponent);
  if (m.rope_type == "linear") return f / float(m.rope_factor);
  if (m.rope_type != "llama3") return f;
  const float factor = float(m.rope_factor);
  const double orig = double(m.rope_original_max_seq_len);
  const float low_ff = float(m.rope_low_freq_factor);
  // Python doubles, compared with the float32 wavelengths after rounding to float.
  const float low_freq_wavelen = float(orig / m.rope_low_freq_factor);
  const float high_freq_wavelen = float(orig / m.rope_high_freq_factor);
  const float band = float(m.rope_high_freq_factor - m.rope_low_freq_factor);
  const float wavelen = (1.0f / f) * float(2 * M_PI);
  const float scaled = wavelen > low_freq_wavelen ? f / factor : f;  // inv_freq_llama
  if (wavelen < high_freq_wavelen || wavelen > low_freq_wavelen) return scaled;
  const float smooth = ((1.0f / wavelen) * float(orig) - low_ff) / band;
  const float a = (1.0f - smooth) * scaled / factor;
  const float b = smooth * scaled;
  return a + b;
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& m, int head_dim) {
  FT_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim ", head_dim,
           " is not a positive even number");
  FT_CHECK(is_rope_type(m.rope_type), "rope_inv_freq: rope type '", m.rope_type,
           "' is not implemented");
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) inv[size_t(i)] = inv_freq_at(m, i, head_dim);
  return inv;
}

std::string rope_table_problem(const ModelConfig& m, int head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0 || !is_rope_type(m.rope_type)) return "";
  // θ^(-2i/D) is monotonic in i and every type scales it by a factor between 1/factor and 1,
  // so the extremes sit at the two ends of the unscaled and the scaled table: check those
  // rather than build a table as large as a hostile config's head_dim.
  ModelConfig scaled = m, unscaled = m;
  scaled.rope_type = m.rope_type == "default" ? "default" : "linear";
  unscaled.rope_type = "default";
  const ModelConfig* configs[] = {&m, &scaled, &unscaled};
  for (const ModelConfig* c : configs) {
    for (int i : {0, head_dim / 2 - 1}) {
      const float f = inv_freq_at(*c, i, head_dim);
      if (std::isfinite(f) && f > 0) continue;
      std::ostringstream os;
      os.precision(10);
      os << "RoPE inverse frequency " << i << " of head_dim " << head_dim << " is " << f
         << " in fp32 (rope_theta " << m.rope_theta;
      if (m.rope_type != "default") os << ", factor " << m.rope_factor;
      os << "): the values are beyond what fp32 angles can represent";
      return os.str();
    }
  }
  return "";
}

std::string rope_description(const ModelConfig& m) {
  std::ostringstream os;
  os.precision(10);
  os << m.rope_type;
  if (m.rope_type == "linear") os << " (factor " << m.rope_factor << ")";
  if (m.rope_type == "llama3")
    os << " (factor " << m.rope_factor << ", low/high frequency factors " << m.rope_low_freq_factor
       << "/" << m.rope_high_freq_factor << ", original max positions "
       << m.rope_original_max_seq_len << ")";
  return os.str();
}

}  // namespace ft
