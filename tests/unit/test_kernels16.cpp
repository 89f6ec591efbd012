// 16-bit kernels (bf16, f16) against the fp32 kernels on the same inputs rounded to 16 bits
// first, at awkward sizes (1, 19, 111 and one larger), and the casts against core/half.h bit
// for bit. The fp32 kernels themselves are held to plain loops, finite differences and PyTorch
// by test_kernels.cpp and tests/ref/test_llama_numerics.py.
//
// The tolerances follow from the kernels' contract (fp32 math inside, one rounding on store):
//   - an output stored in T is the fp32 result rounded once, so it is within one unit roundoff
//     u of it, relative (u = 2^-8 for bf16, 2^-11 for f16, round to nearest even), or half the
//     subnormal spacing in absolute terms near zero; any intermediate kept in 16 bits (rstd, the
//     softmax sum, ...) would break that bound by a factor of up to |x|/|result|.
//   - an output kept in fp32 or double (rstd, dw, dtable, the loss, row max, sums) comes from
//     the very same fp32 arithmetic on the very same (rounded) inputs, so it is equal bit for
//     bit. (A CUDA port, with its own summation order, will need a tolerance there.)
#include <doctest/doctest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <ios>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/kernels.h"
#include "random_values.h"

namespace k = ft::kernels;
using ft::bf16;
using ft::f16;

namespace {

template <typename T>
constexpr float unit_roundoff = std::is_same_v<T, bf16> ? 0x1p-8f : 0x1p-11f;
// Half the spacing of T's subnormals: the largest rounding error of a result near zero.
template <typename T>
constexpr float half_subnormal_step = std::is_same_v<T, bf16> ? 0x1p-134f : 0x1p-25f;

template <typename T>
const char* type_name() {
  return std::is_same_v<T, bf16> ? "bf16" : "f16";
}

using ft::unit_test::randn;

// An input in T and, beside it, the fp32 values it holds (what the fp32 kernel gets).
template <typename T>
struct Rounded {
  std::vector<T> t;
  std::vector<float> f;
};

template <typename T>
Rounded<T> rounded(const std::vector<float>& x) {
  Rounded<T> r;
  r.t.resize(x.size());
  r.f.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    r.t[i] = ft::from_f32<T>(x[i]);
    r.f[i] = ft::to_f32(r.t[i]);
  }
  return r;
}

template <typename T>
Rounded<T> rounded_randn(size_t n, uint32_t seed, float scale = 1.0f) {
  return rounded<T>(randn(n, seed, scale));
}

template <typename T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> f(x.size());
  for (size_t i = 0; i < x.size(); ++i) f[i] = ft::to_f32(x[i]);
  return f;
}

// got (16-bit) against want (fp32 reference): within one rounding, or the same inf when the
// reference rounds to inf in T (f16 overflow). Reports the worst element only.
template <typename T>
void check_rounded_once(const std::vector<T>& got, const std::vector<float>& want,
                        const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  size_t worst_i = 0;
  bool bad_nonfinite = false;  // a non-finite value where the reference has another
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = ft::to_f32(got[i]), w = want[i];
    const float w16 = ft::to_f32(ft::from_f32<T>(w));
    if (std::isinf(w16) || std::isnan(w) || !std::isfinite(g)) {  // non-finite: exactly alike
      if (!(g == w16 || (std::isnan(g) && std::isnan(w)))) bad_nonfinite = true;
      continue;
    }
    const double excess = std::fabs(double(g) - w) -
                          (double(unit_roundoff<T>) * std::fabs(w) + half_subnormal_step<T>);
    if (excess > worst) worst = excess, worst_i = i;
  }
  INFO(type_name<T>() << " " << what << ": worst element " << worst_i << " got "
                      << ft::to_f32(got[worst_i]) << " want " << want[worst_i]);
  CHECK(worst == 0.0);
  CHECK_FALSE(bad_nonfinite);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

const int kSizes[] = {1, 19, 111};

}  // namespace

// ---- casts --------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: convert T -> fp32 gives half.h's bits for every 16-bit pattern", T,
                   bf16, f16) {
  std::vector<T> all(65536 + 1);
  for (uint32_t h = 0; h < all.size(); ++h) all[h].bits = uint16_t(h);  // the last wraps to 0
  // Offsets 0 and 1 (misaligned vectors) and lengths that leave tails of every size.
  for (size_t off : {size_t(0), size_t(1)})
    for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(65536)}) {
      std::vector<float> got(n);
      k::convert(got.data(), all.data() + off, n);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i)
        if (bits_of(got[i]) != bits_of(ft::to_f32(all[off + i]))) ++bad;
      INFO(type_name<T>() << " offset " << off << " n " << n);
      CHECK(bad == 0);
    }
}

TEST_CASE_TEMPLATE("kernels16: convert fp32 -> T gives half.h's bits (NaN, inf, subnormals, ties)",
                   T, bf16, f16) {
  std::vector<float> x;
  // Every sign and exponent with mantissas at the rounding boundaries of both 16-bit types:
  // bf16 keeps the top 7 mantissa bits (tie at 0x8000 in the low 16), f16 the top 10 of a
  // normal (tie at 0x1000) and fewer in its subnormal range (ties at 1 << (shift − 1)).
  std::vector<uint32_t> mantissas = {0,      1,      0x7fffff, 0x400000, 0x3fffff, 0x7fff,
                                     0x8000, 0x8001, 0x18000,  0x17fff,  0x0fff,   0x1000,
                                     0x1001, 0x3000, 0x2fff,   0x2000,   0x7fe000, 0x7ff000};
  for (uint32_t shift = 14; shift <= 24; ++shift) {
    mantissas.push_back(1u << (shift - 1));
    mantissas.push_back((1u << (shift - 1)) | (1u << shift));
    mantissas.push_back((1u << (shift - 1)) + 1);
  }
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t m : mantissas) x.push_back(float_of(sign | (e << 23) | (m & 0x7fffff)));
  // f16's overflow boundary (65520 rounds to inf, the float below it to 65504) and random bits.
  x.push_back(65520.f);
  x.push_back(std::nextafter(65520.f, 0.f));
  x.push_back(-65520.f);
  std::mt19937 g(7);
  for (int i = 0; i < (1 << 18); ++i) x.push_back(float_of(g()));
  // 1 + offsets so that the vector loops start misaligned; a total beyond one OpenMP chunk.
  for (size_t off : {size_t(0), size_t(1)})
    for (size_t n : {size_t(1), size_t(19), size_t(111), x.size() - 1}) {
      std::vector<T> got(n);
      k::convert(got.data(), x.data() + off, n);
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < n; ++i)
        if (got[i].bits != ft::from_f32<T>(x[off + i]).bits && bad++ == 0) first = i;
      INFO(type_name<T>() << " offset " << off << " n " << n << " first mismatch at 0x" << std::hex
                          << bits_of(x[off + first]));
      CHECK(bad == 0);
    }
}

// ---- embedding.cpp ------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: embedding forward copies T rows; backward adds T into fp32", T, bf16,
                   f16) {
  for (int C : {1, 19, 111, 1000})
    for (int N : kSizes) {
      const int V = 23, v_begin = 5, v_count = 11;  // a vocabulary shard: some ids fall outside
      std::vector<int32_t> ids(N);
      for (int n = 0; n < N; ++n) ids[n] = (n * 7 + 3) % V;
      auto table = rounded_randn<T>(size_t(V) * C, 1);
      std::vector<T> out(size_t(N) * C);
      std::vector<float> want(size_t(N) * C);
      k::embedding_forward(out.data(), ids.data(), table.t.data(), N, C, v_begin, v_count);
      k::embedding_forward(want.data(), ids.data(), table.f.data(), N, C, v_begin, v_count);
      // A copy: exact.
      CHECK(same_bits(widen(out), want));

      auto dout = rounded_randn<T>(size_t(N) * C, 2);
      std::vector<float> dt = randn(size_t(v_count) * C, 3), dt_ref = dt;
      k::embedding_backward(dt.data(), ids.data(), dout.t.data(), N, C, v_begin, v_count);
      k::embedding_backward(dt_ref.data(), ids.data(), dout.f.data(), N, C, v_begin, v_count);
      // dtable is fp32: the same additions in the same order.
      INFO(type_name<T>() << " N " << N << " C " << C);
      CHECK(same_bits(dt, dt_ref));
    }
}

// ---- rmsnorm.cpp --------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: rmsnorm forward and backward against fp32 on rounded inputs", T,
                   bf16, f16) {
  for (int C : {1, 19, 111, 1000})
    for (int N : kSizes) {
      const size_t NC = size_t(N) * C;
      auto x = rounded_randn<T>(NC, 10, 3.f), w = rounded_randn<T>(C, 11);
      auto dy = rounded_randn<T>(NC, 12);
      std::vector<T> out(NC), dx(NC);
      std::vector<float> out_ref(NC), rstd(N), rstd_ref(N), dx_ref(NC);
      k::rmsnorm_forward(out.data(), rstd.data(), x.t.data(), w.t.data(), N, C, 1e-5f);
      k::rmsnorm_forward(out_ref.data(), rstd_ref.data(), x.f.data(), w.f.data(), N, C, 1e-5f);
      const std::string at = "N " + std::to_string(N) + " C " + std::to_string(C);
      check_rounded_once(out, out_ref, "rmsnorm out " + at);  // one rounding
      CHECK(same_bits(rstd, rstd_ref));                       // fp32 statistic

      std::vector<float> dw = randn(C, 13), dw_ref = dw;  // dw accumulates into what is there
      k::rmsnorm_backward(dx.data(), dw.data(), dy.t.data(), x.t.data(), w.t.data(), rstd.data(), N,
                          C);
      k::rmsnorm_backward(dx_ref.data(), dw_ref.data(), dy.f.data(), x.f.data(), w.f.data(),
                          rstd_ref.data(), N, C);
      check_rounded_once(dx, dx_ref, "rmsnorm dx " + at);  // one rounding
      INFO(type_name<T>() << " " << at);
      CHECK(same_bits(dw, dw_ref));  // fp32 gradient of a parameter

      // accumulate_dx: the residual gradient dx0 plus the norm's dx, summed in fp32 and rounded
      // once, so within one rounding of the fp32 sum (rounding dx first and then adding, the
      // unfused path, would round twice and can miss this bound where the sum cancels).
      const auto dx0 = rounded_randn<T>(NC, 14);
      std::vector<T> dx_acc = dx0.t;
      std::vector<float> dw_acc = randn(C, 13), dx_acc_ref(NC);
      k::rmsnorm_backward(dx_acc.data(), dw_acc.data(), dy.t.data(), x.t.data(), w.t.data(),
                          rstd.data(), N, C, /*accumulate_dx=*/true);
      for (size_t i = 0; i < NC; ++i) dx_acc_ref[i] = dx0.f[i] + dx_ref[i];
      check_rounded_once(dx_acc, dx_acc_ref, "rmsnorm dx += " + at);
      CHECK(same_bits(dw_acc, dw));  // dw does not depend on accumulate_dx
    }
}

// ---- rope.cpp -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: rope forward and backward against fp32 on rounded inputs", T, bf16,
                   f16) {
  for (int D : {2, 38, 128})
    for (int T_len : kSizes) {
      const int B = 2, nh = 3;
      std::vector<float> inv_freq(D / 2);
      for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / D);
      auto x = rounded_randn<T>(size_t(B) * T_len * nh * D, 20);
      std::vector<T> y = x.t;
      std::vector<float> y_ref = x.f;
      k::rope_forward(y.data(), inv_freq.data(), B, T_len, nh, D);
      k::rope_forward(y_ref.data(), inv_freq.data(), B, T_len, nh, D);
      const std::string at = "T " + std::to_string(T_len) + " D " + std::to_string(D);
      check_rounded_once(y, y_ref, "rope forward " + at);  // one rounding of a 2x2 rotation
      // Backward on the rounded forward output: again one rounding of the fp32 rotation.
      std::vector<float> back_ref = widen(y);
      k::rope_backward(y.data(), inv_freq.data(), B, T_len, nh, D);
      k::rope_backward(back_ref.data(), inv_freq.data(), B, T_len, nh, D);
      check_rounded_once(y, back_ref, "rope backward " + at);
    }
}

// ---- swiglu.cpp ---------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: swiglu forward and backward against fp32 on rounded inputs", T, bf16,
                   f16) {
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(4099)}) {
    auto g = rounded_randn<T>(n, 30, 3.f), u = rounded_randn<T>(n, 31),
         dh = rounded_randn<T>(n, 32);
    std::vector<T> h(n), dg(n), du(n);
    std::vector<float> h_ref(n), dg_ref(n), du_ref(n);
    k::swiglu_forward(h.data(), g.t.data(), u.t.data(), n);
    k::swiglu_forward(h_ref.data(), g.f.data(), u.f.data(), n);
    const std::string at = "n " + std::to_string(n);
    check_rounded_once(h, h_ref, "swiglu h " + at);  // one rounding (sigmoid stays fp32)
    k::swiglu_backward(dg.data(), du.data(), dh.t.data(), g.t.data(), u.t.data(), n);
    k::swiglu_backward(dg_ref.data(), du_ref.data(), dh.f.data(), g.f.data(), u.f.data(), n);
    check_rounded_once(dg, dg_ref, "swiglu dg " + at);  // one rounding each
    check_rounded_once(du, du_ref, "swiglu du " + at);
  }
}

// ---- cross_entropy.cpp --------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: cross-entropy, whole rows and vocabulary-parallel, against fp32", T,
                   bf16, f16) {
  for (int V : {1, 19, 111, 1000})
    for (int N : kSizes) {
      const size_t NV = size_t(N) * V;
      auto logits = rounded_randn<T>(NV, 40, 4.f);
      std::vector<int32_t> t(N);
      std::vector<uint8_t> mask(N);
      for (int n = 0; n < N; ++n) t[n] = (n * 13 + 2) % V, mask[n] = n % 4 != 1;
      // scale 1/N as a token-weighted mean; large enough that f16 dlogits stay normal mostly
      const float scale = 1.0f / float(N);
      const std::string at = "N " + std::to_string(N) + " V " + std::to_string(V);

      std::vector<T> d(NV);
      std::vector<float> d_ref(NV);
      double loss = k::cross_entropy_forward_backward(d.data(), logits.t.data(), t.data(),
                                                      mask.data(), N, V, scale);
      double loss_ref = k::cross_entropy_forward_backward(d_ref.data(), logits.f.data(), t.data(),
                                                          mask.data(), N, V, scale);
      CHECK(loss == loss_ref);  // max, exp and sums in fp32 / double: exact
      check_rounded_once(d, d_ref, "ce dlogits " + at);  // one rounding of scale·(p − onehot)
      // In place (dlogits aliasing logits), and without dlogits: the same results.
      std::vector<T> inplace = logits.t;
      CHECK(k::cross_entropy_forward_backward(inplace.data(), inplace.data(), t.data(), mask.data(),
                                              N, V, scale) == loss_ref);
      CHECK(std::memcmp(inplace.data(), d.data(), 2 * NV) == 0);
      CHECK(k::cross_entropy_forward_backward(nullptr, logits.t.data(), t.data(), mask.data(), N, V,
                                              scale) == loss_ref);

      // Vocabulary-parallel steps on one shard [v_begin, v_begin + V) of a larger vocabulary.
      const int v_begin = 1;
      std::vector<float> mx(N), mx_ref(N);
      std::vector<double> se(N), tl(N), se_ref(N), tl_ref(N);
      k::row_max(mx.data(), logits.t.data(), N, V);
      k::row_max(mx_ref.data(), logits.f.data(), N, V);
      CHECK(same_bits(mx, mx_ref));  // a max: exact
      k::ce_partial(se.data(), tl.data(), logits.t.data(), t.data(), mask.data(), mx.data(), N, V,
                    v_begin);
      k::ce_partial(se_ref.data(), tl_ref.data(), logits.f.data(), t.data(), mask.data(),
                    mx_ref.data(), N, V, v_begin);
      CHECK(std::memcmp(se.data(), se_ref.data(), 8 * N) == 0);  // double sums, same order
      CHECK(std::memcmp(tl.data(), tl_ref.data(), 8 * N) == 0);
      std::vector<T> dp(NV);
      std::vector<float> dp_ref(NV);
      const double lp = k::ce_finish(dp.data(), logits.t.data(), t.data(), mask.data(), mx.data(),
                                     se.data(), tl.data(), N, V, v_begin, scale);
      const double lp_ref =
          k::ce_finish(dp_ref.data(), logits.f.data(), t.data(), mask.data(), mx_ref.data(),
                       se_ref.data(), tl_ref.data(), N, V, v_begin, scale);
      CHECK(lp == lp_ref);
      check_rounded_once(dp, dp_ref, "ce_finish dlogits " + at);
    }
}

TEST_CASE("kernels16: cross-entropy over bf16 logits of magnitude 1e4 stays finite and exact") {
  // bf16 spacing at 1e4 is 64, so the rounded logits are far apart: the row max must be
  // subtracted before exp (else exp overflows), and the loss must equal fp32's on the same values.
  const int N = 3, V = 1000;
  std::vector<float> x = randn(size_t(N) * V, 50, 3000.f);
  for (int n = 0; n < N; ++n) x[size_t(n) * V + 17 * n] = (n % 2 ? -1.f : 1.f) * 1.2e4f;
  auto logits = rounded<bf16>(x);
  std::vector<int32_t> t = {0, 17, 34};
  std::vector<uint8_t> mask = {1, 1, 1};
  std::vector<bf16> d(x.size());
  std::vector<float> d_ref(x.size());
  const double loss = k::cross_entropy_forward_backward(d.data(), logits.t.data(), t.data(),
                                                        mask.data(), N, V, 1.0f);
  const double loss_ref = k::cross_entropy_forward_backward(d_ref.data(), logits.f.data(), t.data(),
                                                            mask.data(), N, V, 1.0f);
  CHECK(std::isfinite(loss));
  CHECK(loss > 1e4);  // row 1's target is −1.2e4, far below its max; rows 0 and 2 hit theirs
  CHECK(loss == loss_ref);
  check_rounded_once(d, d_ref, "ce dlogits at |logit| 1e4");
  for (size_t i = 0; i < d.size(); ++i) CHECK(std::isfinite(ft::to_f32(d[i])));
}

// ---- reduce.cpp ---------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: add_inplace in T and accumulate of T into fp32", T, bf16, f16) {
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(4099)}) {
    auto y = rounded_randn<T>(n, 60), x = rounded_randn<T>(n, 61);
    std::vector<T> yt = y.t;
    std::vector<float> y_ref = y.f;
    k::add_inplace(yt.data(), x.t.data(), n);
    k::add_inplace(y_ref.data(), x.f.data(), n);
    check_rounded_once(yt, y_ref, "add_inplace n " + std::to_string(n));  // one rounding of y + x
    std::vector<float> acc = randn(n, 62), acc_ref = acc;
    k::accumulate(acc.data(), x.t.data(), n);
    k::add_inplace(acc_ref.data(), x.f.data(), n);
    CHECK(same_bits(acc, acc_ref));  // fp32 += exact widening of x: fp32's add
  }
}

TEST_CASE("kernels16: sum_squares is the found-inf check: non-finite exactly when an input is") {
  std::vector<float> x(1000, FLT_MAX);  // squares far beyond fp32, well within double
  CHECK(std::isfinite(k::sum_squares(x.data(), x.size())));
  x[777] = std::numeric_limits<float>::infinity();
  CHECK(std::isinf(k::sum_squares(x.data(), x.size())));
  x[3] = -std::numeric_limits<float>::infinity();
  CHECK(std::isinf(k::sum_squares(x.data(), x.size())));  // inf², never inf − inf
  x[500] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(k::sum_squares(x.data(), x.size())));
}

TEST_CASE(
    "kernels16: loss and squared-norm sums are the same bits on every call, any thread count") {
  // reduction(+) would add the threads' partials in finishing order; from 3 threads on that can
  // change the last bits from call to call (and a resumed run's gradient clipping with them).
  // The finishing order is often stable on an idle machine, so a regression to reduction(+) is
  // caught only on some runs.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(5);
  std::vector<float> x = randn(1000003, 80);
  const int N = 97, V = 1000;
  std::vector<int32_t> t(N, 3);
  std::vector<uint8_t> mask(N, 1);
  const double sq = k::sum_squares(x.data(), x.size());
  const double loss =
      k::cross_entropy_forward_backward(nullptr, x.data(), t.data(), mask.data(), N, V, 1.f);
  bool same = true;
  for (int r = 0; r < 20; ++r) {
    same = same && k::sum_squares(x.data(), x.size()) == sq;
    same = same && k::cross_entropy_forward_backward(nullptr, x.data(), t.data(), mask.data(), N, V,
                                                     1.f) == loss;
  }
  omp_set_num_threads(saved);
  CHECK(same);
}

// ---- f16 overflow -------------------------------------------------------------------------------

TEST_CASE("kernels16: f16 results beyond 65504 are ±inf, not garbage; bf16 holds them") {
  const size_t n = 37;
  std::vector<float> g(n), u(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = 300.f;                                      // silu(300) = 300
    u[i] = (i % 2 ? -1.f : 1.f) * (200.f + float(i));  // |h| ≥ 60000, most beyond f16's max
  }
  auto g16 = rounded<f16>(g), u16 = rounded<f16>(u);
  std::vector<f16> h(n);
  k::swiglu_forward(h.data(), g16.t.data(), u16.t.data(), n);
  auto gb = rounded<bf16>(g), ub = rounded<bf16>(u);
  std::vector<bf16> hb(n);
  k::swiglu_forward(hb.data(), gb.t.data(), ub.t.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const float want = g16.f[i] * u16.f[i];
    INFO("element " << i << " want " << want);
    if (std::fabs(want) >= 65520.f)
      CHECK(h[i].bits == (want > 0 ? 0x7c00 : 0xfc00));  // exactly ±inf
    else
      CHECK(std::isfinite(ft::to_f32(h[i])));
    CHECK(std::isfinite(ft::to_f32(hb[i])));  // bf16 has fp32's range
  }
  // The residual add overflows the same way.
  std::vector<f16> y(n, ft::to_f16(60000.f)), x(n, ft::to_f16(30000.f));
  k::add_inplace(y.data(), x.data(), n);
  for (size_t i = 0; i < n; ++i) CHECK(y[i].bits == 0x7c00);
}

// ---- adamw.cpp ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("kernels16: fused adamw_update equals the fp32 update plus convert", T, bf16,
                   f16, float) {
  for (size_t n : {size_t(1), size_t(19), size_t(111), size_t(5000)}) {
    std::vector<float> p = randn(n, 70), g = randn(n, 71), m = randn(n, 72, 0.1f),
                       v = randn(n, 73, 0.1f);
    for (auto& vi : v) vi *= vi;
    std::vector<float> p_ref = p, m_ref = m, v_ref = v;
    std::vector<T> pc(n);
    k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3,
                    pc.data());
    k::adamw_update(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.1f, 3);
    INFO("n " << n);
    CHECK(same_bits(p, p_ref));  // the master update is the fp32 one, bit for bit
    CHECK(same_bits(m, m_ref));
    CHECK(same_bits(v, v_ref));
    std::vector<T> pc_ref(n);
    k::convert(pc_ref.data(), p_ref.data(), n);
    CHECK(std::memcmp(pc.data(), pc_ref.data(), sizeof(T) * n) == 0);  // the compute copy
  }
}
