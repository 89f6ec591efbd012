// Vector conversions between fp32 and the 16-bit storage types, and the fp32 staging that lets
// one fp32 loop body serve T in {float, bf16, f16}. Internal to kernels/cpu/.
//
// Every routine here gives exactly the bits of core/half.h's scalar conversions (the unit
// test checks every 16-bit pattern and sampled fp32 patterns, NaN, inf, subnormals and ties
// included). The hardware instructions differ from those in one corner, fixed up per lane:
//   VCVTPH2PS quiets a signalling f16 NaN; half.h keeps the payload as it is.
// Which instructions a level uses is chosen by FT_CPU_ISA_LEVEL (isa.h). The functions are serial:
// kernels call them per row or per block inside their own OpenMP loops.
#pragma once

#include "kernels/cpu/isa.h"

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/intrinsics.h"

#include "core/half.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS::cpu {

// dst (n) = fp32 values of src (n)
inline void load_f32(float* dst, const bf16* src, size_t n) {
  size_t i = 0;
#if FT_CPU_ISA_LEVEL >= 2
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
  }
#elif FT_CPU_ISA_LEVEL >= 1
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(src + i)));
    _mm256_storeu_si256((__m256i*)(dst + i), _mm256_slli_epi32(w, 16));
  }
#endif
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

inline void load_f32(float* dst, const f16* src, size_t n) {
  size_t i = 0;
#if FT_CPU_ISA_LEVEL >= 2
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256((const __m256i*)(src + i));
    __m512i r = _mm512_castps_si512(_mm512_cvtph_ps(h));
    // Signalling NaN lanes (exponent all ones, quiet bit clear, payload non-zero): the hardware
    // set the quiet bit (fp32 bit 22); clear it again.
    const __m512i w = _mm512_cvtepu16_epi32(h);
    const __mmask16 snan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7e00)),
                                                   _mm512_set1_epi32(0x7c00)) &
                           _mm512_test_epi32_mask(w, _mm512_set1_epi32(0x3ff));
    if (snan) r = _mm512_mask_and_epi32(r, snan, r, _mm512_set1_epi32(~0x400000));
    _mm512_storeu_si512(dst + i, r);
  }
#elif FT_CPU_ISA_LEVEL >= 1
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128((const __m128i*)(src + i));
    const __m256i r = _mm256_castps_si256(_mm256_cvtph_ps(h));
    // As above: the quiet bit the hardware set in signalling NaN lanes is cleared again.
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i snan = _mm256_andnot_si256(
        _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3ff)), _mm256_setzero_si256()),
        _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7e00)),
                           _mm256_set1_epi32(0x7c00)));
    _mm256_storeu_si256(
        (__m256i*)(dst + i),
        _mm256_andnot_si256(_mm256_and_si256(snan, _mm256_set1_epi32(0x400000)), r));
  }
#endif
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

// dst (n) = src (n) rounded to nearest even
inline void store_f32(bf16* dst, const float* src, size_t n) {
  size_t i = 0;
#if FT_CPU_ISA_LEVEL >= 2
  // half.h's integer rounding, 16 lanes at a time (AVX-512 F/BW only: AVX512-BF16's
  // VCVTNE2PS2BF16 would also flush subnormals to zero): add 0x7fff plus the kept part's lowest
  // bit, keep the upper half; a NaN keeps its upper half, quieted.
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                quiet = _mm512_set1_epi32(0x40);
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    r = _mm512_mask_or_epi32(r, nan, hi, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
#elif FT_CPU_ISA_LEVEL >= 1
  // The same, 8 lanes at a time (|u| > inf compared signed: both sides are below 2^31).
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
    // 32 -> 16 bits (every lane fits: packus saturates nothing), lanes 0-3 and 4-7 brought
    // together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) dst[i] = to_bf16(src[i]);
}

inline void store_f32(f16* dst, const float* src, size_t n) {
  size_t i = 0;
#if FT_CPU_ISA_LEVEL >= 2
  for (; i + 16 <= n; i += 16) {
    const __m256i h =
        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256((__m256i*)(dst + i), h);
  }
#elif FT_CPU_ISA_LEVEL >= 1
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i*)(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = to_f16(src[i]);
}

// ---- fp32 staging -------------------------------------------------------------------------------
// A kernel written once over fp32 rows runs for every T: in_f32 gives an fp32 view of n inputs
// (float: the input itself, no copy; 16-bit: converted into buf), out_f32 gives where the fp32
// results go (float: the output itself; 16-bit: buf), and store_out rounds buf into the output
// once (float: nothing to do). The float instantiation thus runs exactly the fp32 loop.
template <typename T>
const float* in_f32(const T* src, size_t n, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    load_f32(buf, src, n);
    return buf;
  }
}

template <typename T>
float* out_f32(T* dst, float* buf) {
  if constexpr (std::is_same_v<T, float>)
    return dst;
  else
    return buf;
}

template <typename T>
void store_out(T* dst, const float* buf, size_t n) {
  if constexpr (!std::is_same_v<T, float>) store_f32(dst, buf, n);
}

// Scratch size for a staged row: nothing for float.
template <typename T>
constexpr size_t staging(size_t n) {
  return std::is_same_v<T, float> ? 0 : n;
}

}  // namespace ft::kernels::FT_CPU_ISA_NS::cpu
FT_CPU_ISA_END
