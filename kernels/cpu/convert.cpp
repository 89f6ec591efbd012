// Casts between the fp32 master copy and a 16-bit compute copy on the CPU: the vector
// conversions of kernels/cpu/half_vec.h spread over OpenMP threads. Exactly the bits of
// core/half.h's scalar conversions.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

namespace {
// Elements per OpenMP chunk; below kSerial elements a thread team costs more than it saves.
constexpr size_t kChunk = 16384;
constexpr size_t kSerial = 65536;
}  // namespace

void convert(float* dst, const float* src, size_t n) { std::memcpy(dst, src, sizeof(float) * n); }

// A short conversion never enters a parallel region (even a team of one costs a call into the
// OpenMP runtime: the widened GEMM converts row by row, inside its own team).
template <typename T>
void convert(T* dst, const float* src, size_t n) {
  if (n <= kSerial) return cpu::store_f32(dst, src, n);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kChunk) cpu::store_f32(dst + b, src + b, std::min(kChunk, n - b));
}

template <typename T>
void convert(float* dst, const T* src, size_t n) {
  if (n <= kSerial) return cpu::load_f32(dst, src, n);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < n; b += kChunk) cpu::load_f32(dst + b, src + b, std::min(kChunk, n - b));
}

template void convert(bf16*, const float*, size_t);
template void convert(f16*, const float*, size_t);
template void convert(float*, const bf16*, size_t);
template void convert(float*, const f16*, size_t);

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
