// Element types that can appear in parameters, checkpoints and token shards.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ft {

enum class DType : uint8_t { kF32, kBF16, kF16, kU8, kU16, kU32, kI32, kI64, kU64 };

size_t dtype_size(DType t);
std::string dtype_name(DType t);  // safetensors spelling: F32, BF16, F16, U8, ...
// Parses a safetensors dtype name; returns false if unknown.
bool dtype_from_name(const std::string& name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace ft
