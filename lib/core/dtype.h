// Element types that can appear in parameters, checkpoints and token shards.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/half.h"

namespace ft {

enum class DType : uint8_t { kF32, kBF16, kF16, kU8, kU16, kU32, kI32, kI64, kU64, kF64 };

size_t dtype_size(DType t);
std::string dtype_name(DType t);  // safetensors spelling: F32, BF16, F16, U8, ...
// Parses a safetensors dtype name; returns false if unknown.
bool dtype_from_name(const std::string& name, DType* out);

// One implementation of the bf16 rounding for the whole program: core/half.h's.
inline float bf16_to_f32(uint16_t h) { return to_f32(bf16{h}); }

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) { return to_bf16(f).bits; }

// IEEE binary16, written independently of core/half.h's (test_dtype checks they agree on
// every pattern).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace ft
