// Dropout and scaling on the CPU: the contract of kernels/kernels.h dropout_scale, the mask from
// kernels/philox.h (integer operations only), so the bits depend on (key, row, column) alone: not
// on the thread count, on how a row is cut into chunks, or on the device (kernels/cuda/
// dropout.cu gives the same).
//
// OpenMP items are (row, chunk of kChunk columns) pairs, so one long row and many short ones
// both spread over the threads. A chunk goes in staged blocks of kBlock columns: first the
// block's Philox words in column order, four columns a Philox call (a loop over the calls, which
// the compiler vectorizes, as random.cpp's batches), then one fp32 product per element, masked,
// and rounded once on store (half_vec.h's staging).
#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"
#include "kernels/philox.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {

constexpr size_t kBlock = 512;   // columns per staged block
constexpr size_t kChunk = 4096;  // columns per OpenMP item, a multiple of kBlock
// Below this many elements a thread team costs more than it saves.
constexpr size_t kSerial = 16384;

// y (m) = the kept x · s, 0 elsewhere, for columns c0 .. c0 + m − 1 of row i (m ≤ kBlock).
template <typename T>
void masked_block(T* y, const T* x, size_t m, uint64_t i, uint64_t c0, uint32_t threshold, float s,
                  uint64_t key) {
  const uint64_t b0 = c0 / 4;
  const size_t blocks = size_t((c0 % 4 + m + 3) / 4);
  uint32_t w[kBlock + 4];  // column 4·b0 + k's word at [k]
  for (size_t b = 0; b < blocks; ++b) {
    const philox::Block blk = philox::dropout_block(i, b0 + b, key);
    for (int q = 0; q < 4; ++q) w[4 * b + size_t(q)] = blk.w[q];
  }
  float xbuf[cpu::staging<T>(kBlock) + 1], ybuf[cpu::staging<T>(kBlock) + 1];
  const float* xf = cpu::in_f32(x, m, xbuf);
  float* yf = cpu::out_f32(y, ybuf);  // may be xf (float in place): element j is read first
  const uint32_t* wc = w + c0 % 4;    // column c0 + j's word at [j]
  // The product's bits anded with an all-ones or all-zeros mask (+0 where dropped): GCC does
  // not vectorize the select `kept ? x · s : 0` under -ftrapping-math, it does this.
  for (size_t j = 0; j < m; ++j) {
    const uint32_t keep = 0u - uint32_t(wc[j] >= threshold);
    yf[j] = std::bit_cast<float>(std::bit_cast<uint32_t>(xf[j] * s) & keep);
  }
  cpu::store_out(y, yf, m);
}

}  // namespace

template <typename T>
void dropout_scale(T* y, const T* x, size_t rows, size_t cols, size_t col0, float p, float f,
                   uint64_t key) {
  const size_t n = rows * cols;
  if (n == 0) return;
  if (p == 0.0f) {  // the scaling alone: no Philox
#pragma omp parallel for schedule(static) if (n > kSerial)
    for (size_t b = 0; b < n; b += kBlock) {
      const size_t m = std::min(kBlock, n - b);
      float xbuf[cpu::staging<T>(kBlock) + 1], ybuf[cpu::staging<T>(kBlock) + 1];
      const float* xf = cpu::in_f32(x + b, m, xbuf);
      float* yf = cpu::out_f32(y + b, ybuf);
      for (size_t j = 0; j < m; ++j) yf[j] = xf[j] * f;
      cpu::store_out(y + b, yf, m);
    }
    return;
  }
  const uint32_t threshold = philox::dropout_threshold(p);
  const float s = philox::dropout_factor(p, f);
  const size_t per_row = (cols + kChunk - 1) / kChunk, items = rows * per_row;
#pragma omp parallel for schedule(static) if (n > kSerial)
  for (size_t it = 0; it < items; ++it) {
    const size_t r = it / per_row, begin = (it % per_row) * kChunk;
    const size_t end = std::min(cols, begin + kChunk);
    for (size_t j = begin; j < end; j += kBlock) {
      const size_t o = r * cols + j;  // (rows, cols)
      masked_block(y + o, x + o, std::min(kBlock, end - j), r, col0 + j, threshold, s, key);
    }
  }
}

#define FT_INSTANTIATE(T) \
  template void dropout_scale(T*, const T*, size_t, size_t, size_t, float, float, uint64_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
