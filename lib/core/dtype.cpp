#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace ft {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kU8:
      return 1;
    case DType::kU16:
      return 2;
    case DType::kU32:
      return 4;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU64:
      return 8;
    case DType::kF64:
      return 8;
  }
  FT_FAIL("unknown dtype");
}

std::string dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kU8:
      return "U8";
    case DType::kU16:
      return "U16";
    case DType::kU32:
      return "U32";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU64:
      return "U64";
    case DType::kF64:
      return "F64";
  }
  return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
  static const struct {
    const char* n;
    DType t;
  } kTable[] = {{"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
                {"U8", DType::kU8},   {"U16", DType::kU16},   {"U32", DType::kU32},
                {"I32", DType::kI32}, {"I64", DType::kI64},   {"U64", DType::kU64}};
  for (const auto& e : kTable)
    if (name == e.n) {
      *out = e.t;
      return true;
    }
  return false;
}

// IEEE half <-> single, exact for every half value (subnormals included).
float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(float(man), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;     // rounds to infinity
  if (a < 6.103515625e-05f) {                  // subnormal half (or zero)
    float m = a * 16777216.0f;                 // a / 2^-24
    uint32_t r = uint32_t(std::nearbyint(m));  // round half to even (default mode)
    return sign | uint16_t(r);
  }
  uint32_t au;
  std::memcpy(&au, &a, 4);
  uint32_t exp = (au >> 23) - 112;
  uint32_t man = au & 0x7fffff;
  uint32_t half = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half += 1;
  return sign | uint16_t(half);
}

}  // namespace ft
