// bf16 / f16 conversions: known values, rounding ties, subnormals, overflow, inf/NaN, every
// 16-bit pattern round-tripped, and random floats against independent references (a
// double-precision nearest-even search for bf16, the compiler's _Float16 for f16).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "core/half.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Independent bf16 reference: the two bf16 neighbours of x are its top 16 bits and the next
// pattern up (in magnitude); pick the nearer in double, ties to the even pattern. Rounding past
// the largest finite bf16 is judged against 2^128, the value the next exponent would have had
// (IEEE overflow rule).
uint16_t bf16_reference(float x) {
  const uint32_t u = bits(x);
  const uint16_t lo = uint16_t(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  const uint16_t hi = uint16_t(lo + 1);
  const double dx = std::fabs(double(x));
  const double dlo = std::fabs(double(ft::bf16_to_f32(lo)));
  const double dhi =
      (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs(double(ft::bf16_to_f32(hi)));
  const double below = dx - dlo, above = dhi - dx;
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

TEST_CASE("dtype: bf16 known values") {
  CHECK(ft::f32_to_bf16(1.0f) == 0x3f80);
  CHECK(ft::f32_to_bf16(-2.5f) == 0xc020);
  CHECK(ft::f32_to_bf16(0.0f) == 0x0000);
  CHECK(ft::f32_to_bf16(-0.0f) == 0x8000);
  CHECK(ft::bf16_to_f32(0x3f80) == 1.0f);
  CHECK(ft::bf16_to_f32(0xc020) == -2.5f);
  // bf16 has 8 significant bits: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7.
  CHECK(ft::f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);             // tie → even (down)
  CHECK(ft::f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);         // tie → even (up)
  CHECK(ft::f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // just above the tie
  CHECK(ft::f32_to_bf16(-(1.0f + 0x1p-8f + 0x1p-20f)) == 0xbf81);
  // Largest finite bf16 is 0x7f7f; the f32 maximum lies past its half-ulp and overflows.
  CHECK(ft::f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(ft::f32_to_bf16(ft::bf16_to_f32(0x7f7f)) == 0x7f7f);
  // f32 subnormals keep bf16 subnormals (same exponent range).
  CHECK(ft::f32_to_bf16(from_bits(0x00010000)) == 0x0001);
  CHECK(ft::f32_to_bf16(from_bits(0x00008000)) == 0x0000);  // tie with 0 → even
  CHECK(ft::f32_to_bf16(from_bits(0x00018000)) == 0x0002);  // tie → even (up)
}

TEST_CASE("dtype: bf16 inf and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(ft::f32_to_bf16(inf) == 0x7f80);
  CHECK(ft::f32_to_bf16(-inf) == 0xff80);
  CHECK(std::isinf(ft::bf16_to_f32(0x7f80)));
  CHECK(std::isnan(ft::bf16_to_f32(ft::f32_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low 16 bits must not truncate (or round) to inf.
  const uint16_t low_payload = ft::f32_to_bf16(from_bits(0x7f800001));
  CHECK(std::isnan(ft::bf16_to_f32(low_payload)));
  CHECK(std::isnan(ft::bf16_to_f32(ft::f32_to_bf16(from_bits(0xff800001)))));
  CHECK((ft::f32_to_bf16(from_bits(0xffc00000)) & 0x8000) == 0x8000);  // sign kept
}

TEST_CASE("dtype: bf16 every pattern round-trips, random floats match the reference") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = ft::bf16_to_f32(uint16_t(h));
    CHECK(bits(f) == h << 16);  // widening is exact: just the high half
    if (std::isnan(f)) {
      CHECK(std::isnan(ft::bf16_to_f32(ft::f32_to_bf16(f))));
    } else if (ft::f32_to_bf16(f) != h) {
      FAIL_CHECK("bf16 pattern " << h << " does not round-trip");
    }
  }
  std::mt19937 rng(1234);
  int mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(uint32_t(rng()));
    if (std::isnan(x)) continue;
    if (ft::f32_to_bf16(x) != bf16_reference(x) && ++mismatches <= 5)
      FAIL_CHECK("bf16 of bits " << bits(x) << ": got " << ft::f32_to_bf16(x) << ", expected "
                                 << bf16_reference(x));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("dtype: f16 known values") {
  CHECK(ft::f32_to_f16(1.0f) == 0x3c00);
  CHECK(ft::f32_to_f16(-2.5f) == 0xc100);
  CHECK(ft::f32_to_f16(0.0f) == 0x0000);
  CHECK(ft::f32_to_f16(-0.0f) == 0x8000);
  CHECK(ft::f32_to_f16(65504.0f) == 0x7bff);  // largest finite half
  CHECK(ft::f32_to_f16(65519.0f) == 0x7bff);  // below the half-ulp: stays finite
  CHECK(ft::f32_to_f16(65520.0f) == 0x7c00);  // the tie: 0x7bff is odd, so it rounds to inf
  CHECK(ft::f32_to_f16(-1e6f) == 0xfc00);
  CHECK(ft::f16_to_f32(0x7bff) == 65504.0f);
  CHECK(ft::f16_to_f32(0x3c00) == 1.0f);
  CHECK(ft::f16_to_f32(0xc100) == -2.5f);
  // Ties at 11 significant bits.
  CHECK(ft::f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(ft::f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(ft::f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  // Subnormals: 2^-24 is the smallest, 2^-14 the smallest normal.
  CHECK(ft::f32_to_f16(0x1p-24f) == 0x0001);
  CHECK(ft::f32_to_f16(0x1p-25f) == 0x0000);  // tie with 0 → even
  CHECK(ft::f32_to_f16(0x1p-25f * 1.0001f) == 0x0001);
  CHECK(ft::f32_to_f16(3 * 0x1p-25f) == 0x0002);     // 1.5 ulp → 2 (even)
  CHECK(ft::f32_to_f16(1023 * 0x1p-24f) == 0x03ff);  // largest subnormal
  CHECK(ft::f32_to_f16(0x1p-14f) == 0x0400);
  CHECK(ft::f32_to_f16(0x1p-14f - 0x1p-26f) == 0x0400);  // rounds up out of the subnormals
  CHECK(ft::f32_to_f16(-0x1p-24f) == 0x8001);
  CHECK(ft::f32_to_f16(1e-10f) == 0x0000);
  CHECK(ft::f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(ft::f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(ft::f16_to_f32(0x8001) == -0x1p-24f);
}

TEST_CASE("dtype: f16 inf and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(ft::f32_to_f16(inf) == 0x7c00);
  CHECK(ft::f32_to_f16(-inf) == 0xfc00);
  CHECK(ft::f16_to_f32(0x7c00) == inf);
  CHECK(ft::f16_to_f32(0xfc00) == -inf);
  CHECK(std::isnan(ft::f16_to_f32(ft::f32_to_f16(std::nanf("")))));
  CHECK(std::isnan(ft::f16_to_f32(ft::f32_to_f16(from_bits(0x7f800001)))));  // low payload
  CHECK(std::isnan(ft::f16_to_f32(0x7c01)));
  CHECK(std::isnan(ft::f16_to_f32(0xfe00)));
}

TEST_CASE("dtype: f16 every pattern round-trips") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = ft::f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(ft::f16_to_f32(ft::f32_to_f16(f))));
    } else if (ft::f32_to_f16(f) != h) {
      FAIL_CHECK("f16 pattern " << h << " does not round-trip");
    }
  }
}

#if defined(__FLT16_MANT_DIG__)
// GCC and Clang on x86-64 convert to _Float16 with correct IEEE rounding (F16C or libgcc).
TEST_CASE("dtype: f16 agrees with the compiler's _Float16") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 hv;
    const uint16_t h16 = uint16_t(h);
    std::memcpy(&hv, &h16, 2);
    const float want = float(hv);
    const float got = ft::f16_to_f32(h16);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else if (bits(got) != bits(want)) {
      FAIL_CHECK("f16_to_f32(" << h << ") = " << got << ", expected " << want);
    }
  }
  std::mt19937 rng(99);
  int mismatches = 0;
  for (int i = 0; i < 300000; ++i) {
    // Half the samples anywhere in f32, half near the f16 range (exponents 2^-27..2^17) where
    // rounding and the subnormal / overflow boundaries happen.
    uint32_t u = uint32_t(rng());
    if (i % 2) u = (u & 0x807fffffu) | (uint32_t(100 + rng() % 45) << 23);
    const float x = from_bits(u);
    if (std::isnan(x)) continue;
    const _Float16 hv = _Float16(x);
    uint16_t want;
    std::memcpy(&want, &hv, 2);
    if (ft::f32_to_f16(x) != want && ++mismatches <= 5)
      FAIL_CHECK("f32_to_f16 of bits " << u << ": got " << ft::f32_to_f16(x) << ", expected "
                                       << want);
  }
  CHECK(mismatches == 0);
}
#endif

TEST_CASE("dtype: names and sizes") {
  for (ft::DType t :
       {ft::DType::kF32, ft::DType::kBF16, ft::DType::kF16, ft::DType::kU8, ft::DType::kU16,
        ft::DType::kU32, ft::DType::kI32, ft::DType::kI64, ft::DType::kU64}) {
    ft::DType back;
    REQUIRE(ft::dtype_from_name(ft::dtype_name(t), &back));
    CHECK(back == t);
  }
  ft::DType t;
  CHECK_FALSE(ft::dtype_from_name("f32", &t));  // safetensors names are upper case
  CHECK_FALSE(ft::dtype_from_name("F64", &t));
  CHECK_FALSE(ft::dtype_from_name("", &t));
  CHECK(ft::dtype_size(ft::DType::kBF16) == 2);
  CHECK(ft::dtype_size(ft::DType::kI64) == 8);
}

// core/half.h carries its own inline f16 conversions (kernels do not link lib/core); they
// must give the same bits as lib/core's, which the cases above check against the compiler.
// (bf16: lib/core calls core/half.h, so the cases above test that one implementation.)
TEST_CASE("dtype: core/half.h conversions equal lib/core's, every half and bf16 pattern") {
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = ft::to_f32(ft::f16{uint16_t(h)});
    const float b = ft::f16_to_f32(uint16_t(h));
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    if (ua != ub && ++mismatches <= 5) FAIL_CHECK("f16 bits " << h << ": " << ua << " vs " << ub);
    const float c = ft::to_f32(ft::bf16{uint16_t(h)});
    const float d = ft::bf16_to_f32(uint16_t(h));
    std::memcpy(&ua, &c, 4);
    std::memcpy(&ub, &d, 4);
    if (ua != ub && ++mismatches <= 5) FAIL_CHECK("bf16 bits " << h);
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = uint32_t(rng());
    // Half of the draws land near f16's range (2^-27 .. 2^17) where its rounding cases are.
    if (i % 2) u = (u & 0x807fffffu) | (uint32_t(100 + rng() % 45) << 23);
    float x;
    std::memcpy(&x, &u, 4);
    const uint16_t h1 = ft::to_f16(x).bits, h2 = ft::f32_to_f16(x);
    const uint16_t b1 = ft::to_bf16(x).bits, b2 = ft::f32_to_bf16(x);
    if (std::isnan(x)) {  // any quiet NaN will do; the sign is kept
      if (((h1 & 0x7c00u) != 0x7c00u || !(h1 & 0x3ffu) || ((b1 & 0x7f80u) != 0x7f80u)) &&
          ++mismatches <= 5)
        FAIL_CHECK("NaN bits " << u << " did not stay NaN");
      continue;
    }
    if ((h1 != h2 || b1 != b2) && ++mismatches <= 5)
      FAIL_CHECK("bits " << u << ": f16 " << h1 << " vs " << h2 << ", bf16 " << b1 << " vs " << b2);
  }
  CHECK(mismatches == 0);
}
