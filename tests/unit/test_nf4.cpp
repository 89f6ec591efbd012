// NF4, QLoRA's 4-bit storage (kernels/nf4.h; the ops quantize_nf4 and dequantize_nf4 on the CPU
// device) against a reference written here from the paper's definitions (Dettmers et al.,
// "QLoRA", 2023, §3): the table derived from the normal quantile function, quantization to the
// nearest level by distance, the blockwise absmax, the double quantization of the absmaxes,
// dequantization; exactly, for fp32, bf16 and fp16 inputs and outputs, at lengths that are not
// whole blocks or whole groups. Then what the format costs: the error of a Gaussian tensor read
// back. (That the CUDA kernels give the CPU's bits, and every level the same: tests/ops/,
// test_cpu_isa.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "kernels/nf4.h"
#include "random_values.h"
#include "runtime/device.h"

namespace k = ft::kernels;
using ft::bf16;
using ft::DType;
using ft::f16;

namespace {

// ---- The table from Φ⁻¹ ----
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
// Φ⁻¹(p) by bisection in double, to where the bracket stops shrinking.
double normal_quantile(double p) {
  double lo = -10, hi = 10;
  for (;;) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) return mid;
    (normal_cdf(mid) < p ? lo : hi) = mid;
  }
}

// torch.linspace(start, end, steps) in fp32 as ATen computes it: step = (end − start) /
// (steps − 1), the first half start + step·i, the second end − step·(steps − 1 − i), each
// operation rounded to fp32 (x86-64's baseline has no fma to contract them into).
std::vector<float> linspace_f32(float start, float end, int steps) {
  const float step = (end - start) / float(steps - 1);
  std::vector<float> v(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i)
    v[size_t(i)] = i < steps / 2 ? start + step * float(i) : end - step * float(steps - 1 - i);
  return v;
}

// The 16 levels: the 8 positive quantiles at linspace(δ, ½, 9) but the last, the 7 negative ones
// at linspace(δ, ½, 8) but the last, and 0, sorted and divided by the largest.
std::vector<float> nf4_levels_bitsandbytes() {
  // bitsandbytes' create_normal_map: the offset rounded to 0.9677083, the points in fp32
  // (torch.linspace), Φ⁻¹ in double (scipy), the values to fp32, the division in fp32.
  std::vector<float> v{0.0f};
  const auto p9 = linspace_f32(0.9677083f, 0.5f, 9), p8 = linspace_f32(0.9677083f, 0.5f, 8);
  for (int i = 0; i < 8; ++i) v.push_back(float(normal_quantile(p9[size_t(i)])));
  for (int i = 0; i < 7; ++i) v.push_back(float(-normal_quantile(p8[size_t(i)])));
  std::sort(v.begin(), v.end());
  const float top = v.back();
  for (float& x : v) x = x / top;
  return v;
}
std::vector<double> nf4_levels_exact() {
  // The paper's definition in double throughout: δ = 1 − ½(1/30 + 1/32).
  const double d = 1.0 - 0.5 * (1.0 / 30 + 1.0 / 32);
  std::vector<double> v{0.0};
  for (int i = 0; i < 8; ++i) v.push_back(normal_quantile(d + (0.5 - d) * i / 8));
  for (int i = 0; i < 7; ++i) v.push_back(-normal_quantile(d + (0.5 - d) * i / 7));
  std::sort(v.begin(), v.end());
  const double top = normal_quantile(d);
  for (double& x : v) x /= top;
  return v;
}

// ---- Quantization by distance ----
// The index of the level nearest to v (distances exact in double), the lower on a tie.
uint8_t nearest_level(float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i)
    if (std::fabs(double(v) - k::kNf4Codes[i]) < std::fabs(double(v) - k::kNf4Codes[best]))
      best = i;
  return uint8_t(best);
}

struct Quantized {
  std::vector<uint8_t> codes;  // one index per element, unpacked
  std::vector<float> absmax;   // (nb)
};
template <typename T>
Quantized quantize_reference(const std::vector<T>& x) {
  const size_t n = x.size(), nb = (n + 63) / 64;
  Quantized r{std::vector<uint8_t>(n), std::vector<float>(nb, 0.0f)};
  for (size_t i = 0; i < n; ++i)
    r.absmax[i / 64] = std::max(r.absmax[i / 64], std::fabs(ft::to_f32(x[i])));
  for (size_t i = 0; i < n; ++i) {
    const float a = r.absmax[i / 64];
    r.codes[i] = nearest_level(a == 0.0f ? 0.0f : ft::to_f32(x[i]) / a);
  }
  return r;
}
// The packed codes' index of element i.
uint8_t index_at(const std::vector<uint8_t>& packed, size_t i) {
  return i % 2 ? packed[i / 2] & 15u : packed[i / 2] >> 4;
}

// ---- Double quantization ----
struct DoubleQuantized {
  std::vector<int8_t> q;
  std::vector<float> scale;
  float mean = 0;
};
DoubleQuantized double_quantize_reference(const std::vector<float>& absmax) {
  const size_t nb = absmax.size(), groups = (nb + 255) / 256;
  DoubleQuantized r{std::vector<int8_t>(nb), std::vector<float>(groups, 0.0f), 0};
  double sum = 0;
  for (float a : absmax) sum += a;
  r.mean = float(sum / double(nb));
  for (size_t b = 0; b < nb; ++b)
    r.scale[b / 256] = std::max(r.scale[b / 256], std::fabs(absmax[b] - r.mean));
  for (size_t b = 0; b < nb; ++b) {
    const float s = r.scale[b / 256];
    const float t = s == 0.0f ? 0.0f : (absmax[b] - r.mean) / s * 127.0f;
    r.q[b] = int8_t(std::clamp(std::rint(t), -127.0f, 127.0f));  // rint: ties to even
  }
  return r;
}

template <typename T>
std::vector<T> dequantize_reference(const std::vector<uint8_t>& packed, const DoubleQuantized& dq,
                                    size_t n) {
  std::vector<T> y(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / 64;
    const float a = float(dq.q[b]) * dq.scale[b / 256] / 127.0f + dq.mean;
    y[i] = ft::from_f32<T>(k::kNf4Codes[index_at(packed, i)] * a);
  }
  return y;
}

template <typename T>
std::vector<T> cast(const std::vector<float>& x) {
  std::vector<T> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ft::from_f32<T>(x[i]);
  return r;
}

// The ops on the CPU device.
struct Nf4 {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};
template <typename T>
Nf4 quantize(ft::Device& dev, const std::vector<T>& x) {
  Nf4 r{std::vector<uint8_t>(k::nf4_code_bytes(x.size()), 0xee),
        std::vector<float>(k::nf4_blocks(x.size()), NAN)};
  dev.ops().quantize_nf4(dev.stream(), r.codes.data(), r.absmax.data(), x.data(), x.size());
  return r;
}
DoubleQuantized double_quantize(const std::vector<float>& absmax) {
  DoubleQuantized r{std::vector<int8_t>(absmax.size(), 99),
                    std::vector<float>(k::nf4_groups(absmax.size()), NAN), NAN};
  k::nf4_double_quantize(absmax.data(), absmax.size(), r.q.data(), r.scale.data(), &r.mean);
  return r;
}
template <typename T>
std::vector<T> dequantize(ft::Device& dev, const Nf4& nf, const DoubleQuantized& dq, size_t n) {
  std::vector<T> y(n, ft::from_f32<T>(NAN));
  dev.ops().dequantize_nf4(dev.stream(), y.data(), nf.codes.data(), dq.q.data(), dq.scale.data(),
                           dq.mean, n);
  return y;
}

template <typename A>
bool same_bits(const std::vector<A>& a, const std::vector<A>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
}

}  // namespace

TEST_CASE("NF4: the table is bitsandbytes', derived from the normal quantile function") {
  // bitsandbytes' recipe (its offset, fp32 points and division) gives the table to the bit.
  const auto bnb = nf4_levels_bitsandbytes();
  for (int i = 0; i < 16; ++i) {
    CAPTURE(i);
    CHECK(bnb[size_t(i)] == k::kNf4Codes[i]);
  }
  // The paper's definition in exact arithmetic differs from it by at most 1.9e-7 (index 14, 3
  // fp32 ulp; up to 8 ulp at index 6): the rounded offset and the fp32 points move the
  // quantiles. Far below the levels' smallest gap (0.08): the same format.
  const auto exact = nf4_levels_exact();
  double worst = 0;
  for (int i = 0; i < 16; ++i)
    worst = std::max(worst, std::fabs(exact[size_t(i)] - k::kNf4Codes[i]));
  MESSAGE("NF4 table against the exact definition: worst ", worst);
  CHECK(worst <= 3e-7);
  // Ascending, −1, an exact 0 at index 7, +1; the midpoints between neighbours.
  CHECK(k::kNf4Codes[0] == -1.0f);
  CHECK(k::kNf4Codes[7] == 0.0f);
  CHECK(k::kNf4Codes[15] == 1.0f);
  for (int i = 0; i < 15; ++i) {
    CHECK(k::kNf4Codes[i] < k::kNf4Codes[i + 1]);
    CHECK(k::kNf4Mids.v[i] == (k::kNf4Codes[i] + k::kNf4Codes[i + 1]) * 0.5f);
  }
  CHECK(k::nf4_blocks(1) == 1);
  CHECK(k::nf4_blocks(64) == 1);
  CHECK(k::nf4_blocks(65) == 2);
  CHECK(k::nf4_code_bytes(7) == 4);
  CHECK(k::nf4_groups(256) == 1);
  CHECK(k::nf4_groups(257) == 2);
}

TEST_CASE_TEMPLATE("NF4: quantize, double quantize and dequantize are the paper's, bit for bit", T,
                   float, bf16, f16) {
  auto dev = ft::make_device("cpu");
  // Below a block, odd; one block and one past; nb = 301 (two groups, the second short); and
  // past the kernels' serial threshold (32768: the OpenMP path), at weight scale.
  for (size_t n : {size_t(1), size_t(17), size_t(63), size_t(64), size_t(65), size_t(1000),
                   size_t(19217), size_t(70001)}) {
    CAPTURE(n);
    const auto x = cast<T>(ft::unit_test::randn(n, uint32_t(n), 0.02f));
    const Nf4 got = quantize(*dev, x);
    const Quantized want = quantize_reference(x);
    CHECK(same_bits(got.absmax, want.absmax));
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += index_at(got.codes, i) != want.codes[i];
    CHECK(wrong == 0);
    if (n % 2) CHECK((got.codes.back() & 15u) == 0);  // an odd n's last low nibble

    const DoubleQuantized dq = double_quantize(got.absmax),
                          dq_want = double_quantize_reference(want.absmax);
    CHECK(dq.mean == dq_want.mean);
    CHECK(same_bits(dq.scale, dq_want.scale));
    CHECK(same_bits(dq.q, dq_want.q));
    // Each group's extreme is ±127, and the absmax reads back within half a step of its scale
    // (scale / 254) and the fp32 roundings.
    for (size_t j = 0; j < dq.scale.size(); ++j) {
      int top = 0;
      for (size_t b = j * 256; b < std::min(got.absmax.size(), j * 256 + 256); ++b)
        top = std::max(top, std::abs(int(dq.q[b])));
      CHECK(top == (dq.scale[j] > 0 ? 127 : 0));
    }
    for (size_t b = 0; b < got.absmax.size(); ++b) {
      const float back = float(dq.q[b]) * dq.scale[b / 256] / 127.0f + dq.mean;
      CHECK(std::fabs(back - got.absmax[b]) <= dq.scale[b / 256] / 254.0f * 1.001f + 1e-9f);
    }

    // Every output type from every input type's codes.
    CHECK(same_bits(dequantize<float>(*dev, got, dq, n),
                    dequantize_reference<float>(got.codes, dq, n)));
    CHECK(same_bits(dequantize<bf16>(*dev, got, dq, n),
                    dequantize_reference<bf16>(got.codes, dq, n)));
    CHECK(
        same_bits(dequantize<f16>(*dev, got, dq, n), dequantize_reference<f16>(got.codes, dq, n)));
  }
}

TEST_CASE("NF4: nibble order, zeros, ties at the midpoints") {
  auto dev = ft::make_device("cpu");
  // Element 2j in the high nibble of byte j (bitsandbytes' order), an odd n's last low nibble 0:
  // 1 → 15, −1 → 0, 0.5 → 12 (0.5 lies below the midpoint 0.5017 of 0.4407 and 0.5626).
  {
    const std::vector<float> x{1.0f, -1.0f, 0.5f};
    const Nf4 q = quantize(*dev, x);
    CHECK(q.codes == std::vector<uint8_t>{0xf0, 0xc0});
    CHECK(q.absmax == std::vector<float>{1.0f});
  }
  // A block of zeros beside a nonzero one: absmax 0, every index 7 (the level 0), read back as 0.
  {
    std::vector<float> x(150, 0.0f);
    for (size_t i = 64; i < 128; ++i) x[i] = 0.01f * float(int(i) - 100);
    const Nf4 q = quantize(*dev, x);
    CHECK(q.absmax[0] == 0.0f);
    CHECK(q.absmax[1] == std::fabs(x[64]));  // |0.01 · (64 − 100)|, the block's largest
    for (size_t j = 0; j < 32; ++j) CHECK(q.codes[j] == 0x77);
    const auto y = dequantize<float>(*dev, q, double_quantize(q.absmax), x.size());
    for (size_t i = 0; i < 64; ++i) CHECK(y[i] == 0.0f);
    const std::vector<float> zeros(70, 0.0f);
    const Nf4 z = quantize(*dev, zeros);
    const DoubleQuantized dz = double_quantize(z.absmax);
    CHECK(dz.mean == 0.0f);
    CHECK(dz.scale[0] == 0.0f);
    CHECK(dz.q == std::vector<int8_t>{0, 0});
    CHECK(same_bits(dequantize<bf16>(*dev, z, dz, zeros.size()), cast<bf16>(zeros)));
  }
  // v on a midpoint goes to the lower level, the next float up to the upper (absmax 1: v = x).
  // Where fp32 rounded the midpoint up (k = 0, 1, 3, 4, 12, 14, by up to 3e-8) the upper level is
  // the nearer to it, by less than fp32's spacing there: the one v where the thresholds (the
  // product's, and bitsandbytes') and the exact nearest level part.
  {
    int parted = 0;
    for (int m = 0; m < 15; ++m) {
      CAPTURE(m);
      const float mid = k::kNf4Mids.v[m];
      const Nf4 q = quantize(*dev, std::vector<float>{1.0f, mid, std::nextafter(mid, 2.0f),
                                                      std::nextafter(mid, -2.0f)});
      CHECK(index_at(q.codes, 1) == m);
      CHECK(index_at(q.codes, 2) == m + 1);
      CHECK(index_at(q.codes, 3) == m);
      CHECK(nearest_level(std::nextafter(mid, 2.0f)) == m + 1);
      CHECK(nearest_level(std::nextafter(mid, -2.0f)) == m);
      parted += nearest_level(mid) != m;
    }
    CHECK(parted == 6);
  }
}

TEST_CASE("NF4: a Gaussian tensor reads back within the format's error") {
  // 2^20 elements of N(0, 0.02²) (a weight's scale; the error is relative, so any scale), the
  // whole path: quantize, double quantize, dequantize to fp32. Measured here: relative RMS error
  // ‖x̂ − x‖ / ‖x‖ = 0.0919 (0.0919 too with the absmaxes kept in fp32: double quantization adds
  // 0.01 %), mean |x̂ − x| / mean |x| = 0.0913. Bounds 10 % above those.
  auto dev = ft::make_device("cpu");
  const size_t n = size_t(1) << 20;
  const auto x = ft::unit_test::randn(n, 2026, 0.02f);
  const Nf4 q = quantize(*dev, x);
  const auto y = dequantize<float>(*dev, q, double_quantize(q.absmax), n);
  double se = 0, ss = 0, ae = 0, as = 0, se_fp32 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = double(y[i]) - x[i];
    se += e * e, ss += double(x[i]) * x[i], ae += std::fabs(e), as += std::fabs(x[i]);
    const double e32 = double(k::kNf4Codes[index_at(q.codes, i)]) * q.absmax[i / 64] - x[i];
    se_fp32 += e32 * e32;
  }
  const double rms = std::sqrt(se / ss), mean_abs = ae / as, rms_fp32 = std::sqrt(se_fp32 / ss);
  MESSAGE("NF4 of N(0, 0.02²), 2^20 elements: relative RMS error ", rms,
          " (absmax in fp32: ", rms_fp32, "), mean |error| / mean |x| ", mean_abs);
  CHECK(rms <= 0.101);
  CHECK(mean_abs <= 0.100);
  CHECK(rms <= rms_fp32 * 1.01);  // the 8-bit absmaxes cost little
}
