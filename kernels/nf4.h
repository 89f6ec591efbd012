// NF4 (4-bit NormalFloat), the storage of QLoRA's frozen base weights (Dettmers, Pagnoni,
// Holtzman, Zettlemoyer, "QLoRA: Efficient Finetuning of Quantized LLMs", 2023, §3): the code
// table, the block and group sizes, and the host half of the format, the double quantization of
// the block absmaxes. The device half is two ops (kernels.h quantize_nf4 / dequantize_nf4,
// runtime/op_list.h), the same bits on the CPU and CUDA.
//
// The format of a tensor of n elements (any n ≥ 1):
//   - blocks of kNf4Block = 64 consecutive elements (the last may be shorter), nb of them; block
//     b's absmax is max |x| over it, in fp32;
//   - each element x of block b is coded as the index (0..15) of the level of kNf4Codes nearest
//     to v = x / absmax_b (fp32 division; v = 0 when absmax_b = 0), ties to the lower: the count
//     of the midpoints kNf4Mids below v (the thresholds bitsandbytes' dQuantizeNF4 compares
//     with). Two indices a byte: element 2j in the high nibble of byte j, 2j + 1 in the low one
//     (bitsandbytes' order); for odd n the last byte's low nibble is 0;
//   - double quantization (the paper's DQ): the nb absmaxes, in groups of kNf4Group = 256
//     consecutive ones (the last may be shorter), are stored as int8 q_b with an fp32 scale per
//     group and one fp32 mean (nf4_double_quantize below), read back as
//       absmax_b = float(q_b) · scale[b / 256] / 127 + mean   (fp32, left to right, no fma);
//   - element i of block b then reads as kNf4Codes[code_i] · absmax_b in fp32, rounded once to
//     the output's type.
// Memory per element: 0.5 B of codes + 1/64 B of q + 4/(64·256) B of scale (+ the mean).
//
// The table (index 0..15 ascending) is bitsandbytes' NF4 (functional.py create_normal_map with
// offset 0.9677083, as hard-coded in its CUDA kernels): the paper's quantiles q_i of N(0, 1),
// Φ⁻¹ at 8 points linspace(δ, 1/2, 9) without the last for the positive half and −Φ⁻¹ at
// linspace(δ, 1/2, 8) without the last for the negative half, plus an exact 0, divided by
// Φ⁻¹(δ), δ = 1 − ½(1/30 + 1/32) (the paper's offset, there written 0.9677083). tests/unit/
// test_nf4.cpp derives it from Φ⁻¹ and says how its bits come about.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace ft::kernels {

inline constexpr size_t kNf4Block = 64;   // elements per absmax
inline constexpr size_t kNf4Group = 256;  // absmaxes per double-quantization scale

inline constexpr float kNf4Codes[16] = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};

// The midpoints the coding compares with: mid[k] = (code[k] + code[k + 1]) · 0.5 in fp32 (one
// rounding, of the sum). Six of them (k = 0, 1, 3, 4, 12, 14) lie up to 3e-8 above the exact
// midpoint, so a v equal to one of those goes to the lower level though the upper is nearer by
// less than fp32's spacing there; bitsandbytes' thresholds are these same floats.
struct Nf4Mids {
  float v[15];
};
inline constexpr Nf4Mids kNf4Mids = [] {
  Nf4Mids m{};
  for (int k = 0; k < 15; ++k) m.v[k] = (kNf4Codes[k] + kNf4Codes[k + 1]) * 0.5f;
  return m;
}();

// Sizes of a tensor of n elements in NF4.
constexpr size_t nf4_blocks(size_t n) { return (n + kNf4Block - 1) / kNf4Block; }    // absmaxes
constexpr size_t nf4_code_bytes(size_t n) { return (n + 1) / 2; }                    // codes
constexpr size_t nf4_groups(size_t nb) { return (nb + kNf4Group - 1) / kNf4Group; }  // scales

// The double quantization of nb ≥ 1 block absmaxes (what quantize_nf4 wrote), on the host:
// *mean = float(Σ absmax (summed in double, in order) / nb); for each group j of kNf4Group
// consecutive absmaxes (the last may be shorter), scale[j] = max over it of |absmax_b − mean|
// (fp32 subtraction), and q[b] = clamp(nearbyint((absmax_b − mean) / scale[j] · 127), −127, 127)
// in fp32, rounding to nearest even (q[b] = 0 where scale[j] = 0). q (nb), scale
// (nf4_groups(nb)). dequantize_nf4 reads them back. Finite absmaxes assumed (the caller checks
// the weights first): a NaN or inf gives meaningless, but defined, q and scales.
inline void nf4_double_quantize(const float* absmax, size_t nb, int8_t* q, float* scale,
                                float* mean) {
  double sum = 0.0;
  for (size_t b = 0; b < nb; ++b) sum += double(absmax[b]);
  const float m = nb ? float(sum / double(nb)) : 0.0f;
  *mean = m;
  for (size_t j = 0; j < nf4_groups(nb); ++j) {
    const size_t b0 = j * kNf4Group, b1 = b0 + kNf4Group < nb ? b0 + kNf4Group : nb;
    float s = 0.0f;
    for (size_t b = b0; b < b1; ++b) {
      const float d = std::fabs(absmax[b] - m);
      s = d > s ? d : s;
    }
    scale[j] = s;
    for (size_t b = b0; b < b1; ++b) {
      // A quotient then a product: nothing a compiler may fuse.
      float r = s == 0.0f ? 0.0f : std::nearbyint((absmax[b] - m) / s * 127.0f);
      r = r > -127.0f ? r : -127.0f;  // NaN (from a non-finite absmax) too: no UB in the cast
      r = r < 127.0f ? r : 127.0f;
      q[b] = int8_t(r);
    }
  }
}

}  // namespace ft::kernels
