// 16-bit float element types: bf16 (1-8-7, fp32's range) and f16 (IEEE binary16).
// They are storage types only: every kernel loads them into fp32, computes in fp32 (or wider)
// and rounds once on store, round-to-nearest-even as PyTorch does. Kernel templates take
// T in {float, bf16, f16}; the float instantiation is the reference the others are tested
// against.
//
// The scalar conversions here are portable and exact (subnormals, inf and NaN included); hot
// loops may use vector conversions (AVX-512 BF16 / F16C) that must give the same bits.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ft {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);

inline float to_f32(float x) { return x; }

inline float to_f32(bf16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float to_f32(f16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1fu;
  uint32_t man = x.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf, NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise the mantissa
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

inline f16 to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // ≥ 65520 rounds to inf
  if (a < 0x38800000u) {                                       // below 2^-14: subnormal or 0
    if (a < 0x33000000u) return f16{sign};                     // below 2^-25 rounds to 0
    const uint32_t exp = a >> 23;
    const uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24: man >> shift is the subnormal mantissa
    uint32_t h = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return f16{uint16_t(sign | h)};
  }
  uint32_t h = ((a >> 13) - (112u << 10));  // rebias exponent, keep 10 mantissa bits
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return f16{uint16_t(sign | h)};
}

// from_f32<T>(x): the rounding store every kernel uses.
template <typename T>
inline T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(x);
  else {
    static_assert(std::is_same_v<T, f16>, "kernel element types: float, bf16, f16");
    return to_f16(x);
  }
}

}  // namespace ft
