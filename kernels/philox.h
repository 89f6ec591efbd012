// Counter-based random numbers shared by the CPU and CUDA kernels, so both give the same bits for
// every element whatever the thread count, grid or device: normal variates for parameter init
// (kernels/cpu/random.cpp, kernels/cuda/random.cu) and dropout's mask (kernels/cpu/dropout.cpp,
// kernels/cuda/dropout.cu; at the end of this file).
//
// Bits: Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011, §4 and table 2): a keyed bijection of a 128-bit counter, ten rounds of two 32x32
// → 64-bit products whose halves are xored with the other words and the round key, the key
// bumped by the Weyl constants between rounds. Element i of a tensor drawn with key k takes
// word i mod 4 of philox(counter = (i / 4 as two words, 0, 0), k): the bits depend on
// (k, i) only, so any slice of a tensor can be drawn on its own (a shard, a thread's range).
//
// Normals: Box–Muller on words (0, 1) and (2, 3) of a block: r = sqrt(−2 ln u), u = (w0 + 1) /
// 2^32 in (0, 1], and angle 2π · w1 / 2^32; elements 4j, 4j+1 get r cos, r sin, 4j+2, 4j+3
// likewise from words 2, 3. The library sin, cos and log are not the same functions on the host
// and on a GPU (CUDA's are within 1-2 ulp, glibc's differ), so they are not used: ln and
// sin/cos are written here from operations IEEE 754 rounds exactly on both (integer ops,
// +, −, ×, ÷, sqrt and fused multiply-add in double), each product that meets a sum written as
// an explicit fma so neither compiler may contract differently. ln: the integer u·2^32 split
// into 2^e · m with m in [√2/2, √2) (exact), ln m = 2 atanh(s), s = (m − 1) / (m + 1), by its
// odd series to s^17 (|s| ≤ 0.172: the next term is below 1e-15 of the result). sin/cos: the
// angle's quadrant comes from the integer w1 exactly (the nearest multiple of 2^30, so the rest
// is in [−π/4, π/4)), then Taylor series to x^17 and x^18 (truncation below 1e-16). So the
// normals are accurate to double rounding well inside the fp32 result's half ulp, and the
// largest |z| is sqrt(2 · 32 ln 2) = 6.66 (a draw beyond that has probability 3e-11).
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__) || defined(FT_CUDA_EMU_HEADER_INCLUDED)
#define FT_PHILOX_FN __host__ __device__ inline
#else
#define FT_PHILOX_FN inline
#endif

namespace ft::kernels::philox {

struct Block {
  uint32_t w[4];
};

// Philox-4x32-10 of counter c under key (k0, k1) (the paper's constants).
FT_PHILOX_FN Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                 uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The polynomial with coefficients c_n, c_{n−1}, …, c_0 (highest first) at z, by Horner's rule:
// p = c_n, then p = fma(p, z, c_k) for each next coefficient, one rounding per step. Expanded at
// compile time (no loop), so it adds nothing to the CPU's vectorized loop over blocks.
FT_PHILOX_FN double horner(double /*z*/, double p) { return p; }
template <typename... Rest>
FT_PHILOX_FN double horner(double z, double p, double next, Rest... rest) {
  return horner(z, fma(p, z, next), rest...);
}

// ln(v / 2^32) for v in [1, 2^32], from exactly rounded double operations only. Branch-free
// (selects), so the CPU's loop over blocks vectorizes.
FT_PHILOX_FN double log_scaled(uint64_t v) {
  // v = 2^e · m, m in [1, 2): e = floor(log2 v) by halving steps (v ≤ 2^32), written out so
  // that no inner loop stops the CPU's loop over blocks from vectorizing.
  int e = (v >> 32) != 0 ? 32 : 0;
  e += (v >> (e + 16)) != 0 ? 16 : 0;
  e += (v >> (e + 8)) != 0 ? 8 : 0;
  e += (v >> (e + 4)) != 0 ? 4 : 0;
  e += (v >> (e + 2)) != 0 ? 2 : 0;
  e += (v >> (e + 1)) != 0 ? 1 : 0;
  // m = v · 2^−e: v shifted so its top bit is bit 32, then scaled by 2^−32 (both exact).
  double m = double(v << (32 - e)) * (1.0 / 4294967296.0);
  const bool high = m > 1.4142135623730951;  // to [√2/2, √2): |s| ≤ 0.172 below
  m = high ? m * 0.5 : m;
  e += high ? 1 : 0;
  const double s = (m - 1.0) / (m + 1.0);  // m − 1 and m + 1 are exact (m has ≤ 33 bits)
  const double z = s * s;
  // ln m = 2 (s + s³/3 + s⁵/5 + ... + s¹⁷/17) = 2s (1 + z P(z)).
  const double p =
      horner(z, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3);
  const double sz = s * z;
  const double ln_m = 2.0 * fma(sz, p, s);
  return fma(double(e - 32), 0.69314718055994531, ln_m);  // + (e − 32) ln 2
}

// cos and sin of 2π · w / 2^32.
FT_PHILOX_FN void sincos_turn(uint32_t w, double* c, double* s) {
  // Quadrant q of the nearest multiple of 2^30; d = w − q · 2^30 in [−2^29, 2^29).
  const uint32_t q = ((w + (1u << 29)) >> 30) & 3u;
  const int32_t d = int32_t(w - (q << 30));
  const double x = double(d) * (3.141592653589793 / 2147483648.0);  // · 2π / 2^32: |x| ≤ π/4
  const double z = x * x;
  // sin x = x + x z S(z), cos x = 1 + z C(z): Taylor coefficients (−1)^k / (2k+1)!, / (2k)!.
  // From −1/17! and 1/18! down to 1/3! and 1/2!.
  const double sp =
      horner(z, -1.0 / 355687428096000.0, 1.0 / 1307674368000.0, -1.0 / 6227020800.0,
             1.0 / 39916800.0, -1.0 / 362880.0, 1.0 / 5040.0, -1.0 / 120.0, 1.0 / 6.0);
  const double xz = x * z;
  const double sin_x = fma(xz, -sp, x);
  const double cp = horner(z, 1.0 / 6402373705728000.0, -1.0 / 20922789888000.0,
                           1.0 / 87178291200.0, -1.0 / 479001600.0, 1.0 / 3628800.0, -1.0 / 40320.0,
                           1.0 / 720.0, -1.0 / 24.0, 1.0 / 2.0);
  const double cos_x = fma(z, -cp, 1.0);
  // Rotate by q quarter turns (selects, not a switch, so the CPU's loop vectorizes).
  const double c01 = q == 0 ? cos_x : -sin_x, s01 = q == 0 ? sin_x : cos_x;
  const double c23 = q == 2 ? -cos_x : sin_x, s23 = q == 2 ? -sin_x : -cos_x;
  *c = q < 2 ? c01 : c23;
  *s = q < 2 ? s01 : s23;
}

// r = sqrt(−2 ln u), u = (w + 1) / 2^32 in (0, 1]: Box–Muller's radius.
FT_PHILOX_FN double radius(uint32_t w) { return sqrt(-2.0 * log_scaled(uint64_t(w) + 1)); }

// The four standard normals of block j of key (k0, k1): elements 4j .. 4j + 3.
FT_PHILOX_FN void normals4(uint64_t j, uint32_t k0, uint32_t k1, double out[4]) {
  const Block b = philox4x32_10(uint32_t(j), uint32_t(j >> 32), 0u, 0u, k0, k1);
  for (int pair = 0; pair < 2; ++pair) {
    const double r = radius(b.w[2 * pair]);
    double c, s;
    sincos_turn(b.w[2 * pair + 1], &c, &s);
    out[2 * pair] = r * c;
    out[2 * pair + 1] = r * s;
  }
}

// out[j] = float(std · z(first + j)) for j in [begin, end): the body every kernel runs over its
// range of elements (first + j is the tensor's element index). The whole blocks in the middle
// go through a loop without branches, which the CPU compiler vectorizes across blocks.
FT_PHILOX_FN void fill_normal(float* out, size_t begin, size_t end, uint64_t key, uint64_t first,
                              double std) {
  const uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  size_t j = begin;
  // A partial block at the start: elements up to the next multiple of 4 of first + j.
  while (j < end && ((first + j) % 4 != 0 || end - j < 4)) {
    const uint64_t i = first + j;
    double z[4];
    normals4(i / 4, k0, k1, z);
    for (uint64_t lane = i % 4; lane < 4 && j < end; ++lane, ++j) out[j] = float(std * z[lane]);
  }
  const size_t whole = (end - j) / 4;
  float* o = out + j;
  const uint64_t b0 = (first + j) / 4;
  for (size_t b = 0; b < whole; ++b) {
    double z[4];
    normals4(b0 + b, k0, k1, z);
    for (int lane = 0; lane < 4; ++lane) o[4 * b + lane] = float(std * z[lane]);
  }
  j += 4 * whole;
  // The partial block at the end.
  if (j < end) {
    double z[4];
    normals4((first + j) / 4, k0, k1, z);
    for (int lane = 0; j < end; ++lane, ++j) out[j] = float(std * z[lane]);
  }
}

// ---- Dropout's mask: element (i, c) of a matrix (row i, column c of the whole matrix, not of a
// column slice) takes word c mod 4 of philox(counter = (c / 4 as two words, i as two words),
// key) as its uniform u = w / 2^32 in [0, 1), and is kept when u ≥ p. Integers only, so the
// bits depend on (key, i, c) alone: a tensor-parallel rank's column slice draws the whole
// matrix's mask there. (Row 0 has random_normal's counters: a key of dropout's own keeps the
// two streams apart.) ----

// The Philox block of row i, columns 4·cb .. 4·cb + 3.
FT_PHILOX_FN Block dropout_block(uint64_t i, uint64_t cb, uint64_t key) {
  return philox4x32_10(uint32_t(cb), uint32_t(cb >> 32), uint32_t(i), uint32_t(i >> 32),
                       uint32_t(key), uint32_t(key >> 32));
}

// u = w / 2^32 ≥ p exactly when w ≥ ceil(p · 2^32), p in [0, 1): the double product of a float
// and a power of two is exact, so the comparison is an integer one. The largest float below 1
// is 1 − 2^−24, so the threshold is at most 2^32 − 2^8: 32 bits hold it.
FT_PHILOX_FN uint32_t dropout_threshold(float p) {
  return uint32_t(ceil(double(p) * 4294967296.0));
}

// What a kept element is multiplied by: f / (1 − p) in double, rounded to fp32 once; f itself
// when p = 0. Computed on the host by both backends' launchers, so both multiply by one float.
FT_PHILOX_FN float dropout_factor(float p, float f) {
  return p == 0.0f ? f : float(double(f) / (1.0 - double(p)));
}

}  // namespace ft::kernels::philox

#undef FT_PHILOX_FN
