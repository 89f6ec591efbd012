// NF4 quantization and dequantization on the CPU: the contract of kernels/kernels.h quantize_nf4 /
// dequantize_nf4, the format of kernels/nf4.h. kernels/cuda/nf4.cu gives the same bits: every
// value is one IEEE-rounded fp32 operation or a comparison, in the same order, and none is a
// product feeding a sum (the one sum, the absmax's + mean, takes a quotient), so GCC's
// contraction under -std=gnu++20 (-ffp-contract=fast) at the FMA levels has nothing to fuse: the
// same bits on every level too (test_cpu_isa).
//
// OpenMP items are blocks of 64 elements (32 code bytes: a block never shares a byte with the
// next), each staged in fp32 (half_vec.h) and rounded once on store.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"
#include "kernels/nf4.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {

// Below this many elements a thread team costs more than it saves.
constexpr size_t kSerial = 32768;

// The index of v: how many midpoints lie below it (a NaN v: none).
inline uint8_t nf4_index(float v) {
  unsigned c = 0;
  for (int k = 0; k < 15; ++k) c += v > kNf4Mids.v[k] ? 1u : 0u;
  return uint8_t(c);
}

// One block: x (m ≤ 64) → codes ((m + 1) / 2 bytes), *absmax.
template <typename T>
void quantize_block(uint8_t* codes, float* absmax, const T* x, size_t m) {
  float xbuf[cpu::staging<T>(kNf4Block) + 1];
  const float* xf = cpu::in_f32(x, m, xbuf);
  float a = 0.0f;
  for (size_t j = 0; j < m; ++j) {
    const float v = std::fabs(xf[j]);
    a = v > a ? v : a;  // a NaN is never greater: left out
  }
  uint8_t idx[kNf4Block + 1] = {};  // [m] stays 0: an odd block's last low nibble
  if (a == 0.0f) {
    std::fill(idx, idx + m, nf4_index(0.0f));
  } else {
    for (size_t j = 0; j < m; ++j) idx[j] = nf4_index(xf[j] / a);
  }
  for (size_t j = 0; j < (m + 1) / 2; ++j) codes[j] = uint8_t(idx[2 * j] << 4 | idx[2 * j + 1]);
  *absmax = a;
}

// One block: out (m ≤ 64) from codes ((m + 1) / 2 bytes) and the block's absmax a.
template <typename T>
void dequantize_block(T* out, const uint8_t* codes, float a, size_t m) {
  float ybuf[cpu::staging<T>(kNf4Block) + 1];
  float* yf = cpu::out_f32(out, ybuf);
  for (size_t j = 0; j < m; ++j) {
    const unsigned byte = codes[j / 2];
    yf[j] = kNf4Codes[j % 2 ? byte & 15u : byte >> 4] * a;
  }
  cpu::store_out(out, yf, m);
}

}  // namespace

template <typename T>
void quantize_nf4(uint8_t* codes, float* absmax, const T* x, size_t n) {
  const size_t nb = nf4_blocks(n);
#pragma omp parallel for schedule(static) if (n > kSerial)
  for (size_t b = 0; b < nb; ++b) {
    const size_t e = b * kNf4Block;
    quantize_block(codes + e / 2, absmax + b, x + e, std::min(kNf4Block, n - e));
  }
}

template <typename T>
void dequantize_nf4(T* out, const uint8_t* codes, const int8_t* qabsmax, const float* scale,
                    float mean, size_t n) {
  const size_t nb = nf4_blocks(n);
#pragma omp parallel for schedule(static) if (n > kSerial)
  for (size_t b = 0; b < nb; ++b) {
    const size_t e = b * kNf4Block;
    const float a = float(qabsmax[b]) * scale[b / kNf4Group] / 127.0f + mean;
    dequantize_block(out + e, codes + e / 2, a, std::min(kNf4Block, n - e));
  }
}

#define FT_INSTANTIATE(T)                                         \
  template void quantize_nf4(uint8_t*, float*, const T*, size_t); \
  template void dequantize_nf4(T*, const uint8_t*, const int8_t*, const float*, float, size_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
