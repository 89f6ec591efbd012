// bf16 and f16 linear layers (oneDNN, ft's packed kernel or the widened-fp32 fallback, whichever
// this CPU and FT_GEMM16 choose) against the fp32 reference (OpenBLAS) on the same rounded
// inputs, at awkward sizes, with and without accumulation; and the packed kernel against the
// scalar FMA chain it promises, bit for bit.
//
// Tolerance, per output element, with r the fp32 reference and A = Σ|terms| (the same sum over
// absolute values, including the accumulated old output):
//   |out − r| ≤ u_T·|r| + (1 + u_T)·2K·2^-24·A
// u_T·|r| is the single rounding of the output to T (round to nearest: half an ulp, u = 2^-8
// for bf16's 8-bit significand, 2^-11 for f16's 11 bits); the second term bounds two fp32 sums
// of K terms added in different orders (K·2^-24·A each, the classic worst case). dW is fp32, so
// only the second term. A lost or doubled term moves a sum by about A/K, far above 2K·2^-24·A
// for every K here (K ≤ 1408: 2K·2^-24 ≤ 1.7e-4, A/K ≥ 7e-4·A), so the tests can fail.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/half.h"
#include "kernels/kernels.h"

namespace k = ft::kernels;

namespace {

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

template <typename T>
std::vector<T> round_to(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = ft::from_f32<T>(v[i]);
  return r;
}

template <typename T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = ft::to_f32(v[i]);
  return r;
}

std::vector<float> absolute(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = std::fabs(v[i]);
  return r;
}

template <typename T>
constexpr double unit_roundoff() {
  return std::is_same_v<T, ft::bf16> ? 0x1p-8 : 0x1p-11;
}

// Checks every element of out against ref within the tolerance above; abs_sum is A.
void check_close(const std::vector<float>& out, const std::vector<float>& ref,
                 const std::vector<float>& abs_sum, double u, int K, const std::string& what) {
  CAPTURE(what);
  double worst = 0;  // largest error / tolerance
  size_t worst_i = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double tol = u * std::fabs(ref[i]) + (1 + u) * 2.0 * K * 0x1p-24 * abs_sum[i] + 1e-30;
    const double ratio = std::fabs(double(out[i]) - ref[i]) / tol;
    if (!(ratio <= worst)) {  // NaN counts as the worst
      worst = std::isnan(ratio) ? INFINITY : ratio;
      worst_i = i;
    }
  }
  CAPTURE(worst_i);
  CAPTURE(out[worst_i]);
  CAPTURE(ref[worst_i]);
  CHECK(worst <= 1.0);
}

template <typename T>
void check_linear(int N, int in, int out, bool accumulate, uint32_t seed) {
  CAPTURE(N);
  CAPTURE(in);
  CAPTURE(out);
  CAPTURE(accumulate);
  const double u = unit_roundoff<T>();
  // Inputs rounded to T once; the reference sees exactly the same values in fp32.
  const auto x = round_to<T>(uniform(size_t(N) * in, seed));        // (N, in)
  const auto W = round_to<T>(uniform(size_t(out) * in, seed + 1));  // (out, in)
  const auto dy = round_to<T>(uniform(size_t(N) * out, seed + 2));  // (N, out)
  const auto y0 = round_to<T>(uniform(size_t(N) * out, seed + 3));  // (N, out) old y
  const auto dx0 = round_to<T>(uniform(size_t(N) * in, seed + 4));  // (N, in) old dx
  const auto dW0 = uniform(size_t(out) * in, seed + 5);             // (out, in) old dW, fp32
  const auto x32 = widen(x), W32 = widen(W), dy32 = widen(dy);
  const auto ax = absolute(x32), aW = absolute(W32), ady = absolute(dy32);

  // forward: y (N, out) (+)= x · Wᵀ
  std::vector<T> y = y0;
  k::linear_forward(y.data(), x.data(), W.data(), N, in, out, accumulate);
  std::vector<float> yr = accumulate ? widen(y0) : std::vector<float>(y.size());
  std::vector<float> ya = absolute(yr);
  k::linear_forward(yr.data(), x32.data(), W32.data(), N, in, out, accumulate);
  k::linear_forward(ya.data(), ax.data(), aW.data(), N, in, out, accumulate);
  check_close(widen(y), yr, ya, u, in, "y");

  // backward: dx (N, in) (+)= dy · W in T; dW (out, in) += dyᵀ · x in fp32
  std::vector<T> dx = dx0;
  std::vector<float> dW = dW0;
  k::linear_backward(dx.data(), dW.data(), dy.data(), x.data(), W.data(), N, in, out, accumulate);
  std::vector<float> dxr = accumulate ? widen(dx0) : std::vector<float>(dx.size());
  std::vector<float> dxa = absolute(dxr), dWr = dW0, dWa = absolute(dW0);
  k::linear_backward(dxr.data(), dWr.data(), dy32.data(), x32.data(), W32.data(), N, in, out,
                     accumulate);
  k::linear_backward(dxa.data(), dWa.data(), ady.data(), ax.data(), aW.data(), N, in, out,
                     accumulate);
  check_close(widen(dx), dxr, dxa, u, out, "dx");
  check_close(dW, dWr, dWa, 0.0, N, "dW");

  // A null output is skipped, and the other one is the same as when both are computed.
  std::vector<float> dW_only = dW0;
  k::linear_backward<T>(nullptr, dW_only.data(), dy.data(), x.data(), W.data(), N, in, out);
  CHECK(dW_only == dW);
  std::vector<T> dx_only = dx0;
  k::linear_backward(dx_only.data(), nullptr, dy.data(), x.data(), W.data(), N, in, out,
                     accumulate);
  CHECK(widen(dx_only) == widen(dx));
}

// (N, in, out): single elements, odd sizes each way round, and a bench-model MLP shape.
const int kShapes[][3] = {{1, 1, 1},    {1, 19, 111}, {19, 111, 1},    {111, 19, 19},
                          {19, 1, 111}, {7, 111, 19}, {64, 512, 1408}, {111, 1408, 19}};

}  // namespace

TEST_CASE_TEMPLATE("linear bf16/f16: forward and backward match fp32 on the same inputs", T,
                   ft::bf16, ft::f16) {
  uint32_t seed = 10;
  for (const auto& s : kShapes)
    for (bool acc : {false, true}) check_linear<T>(s[0], s[1], s[2], acc, seed += 10);
  // The same shape again hits the primitive cache and must give the same bits.
  const int N = 19, in = 111, out = 19;
  const auto x = round_to<T>(uniform(size_t(N) * in, 1)), W = round_to<T>(uniform(out * in, 2));
  std::vector<T> y1(N * out), y2(N * out);
  k::linear_forward(y1.data(), x.data(), W.data(), N, in, out);
  k::linear_forward(y2.data(), x.data(), W.data(), N, in, out);
  CHECK(widen(y1) == widen(y2));
}

TEST_CASE_TEMPLATE("linear bf16/f16: concurrent callers share the primitive cache", T, ft::bf16,
                   ft::f16) {
  // Two threads run the same new shapes at once (one creating what the other looks up); each
  // result must equal the one computed alone.
  const int shapes[][3] = {{5, 23, 17}, {23, 17, 5}, {17, 5, 23}};
  std::vector<std::vector<T>> together(2 * 3);  // thread a: 0..2, thread b: 3..5
  auto run = [&](int s, std::vector<T>& y) {
    const int N = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    const auto x = round_to<T>(uniform(size_t(N) * in, 30 + s));
    const auto W = round_to<T>(uniform(size_t(out) * in, 40 + s));
    y.assign(size_t(N) * out, T{});
    k::linear_forward(y.data(), x.data(), W.data(), N, in, out);
  };
  {
    std::thread a([&] {
      for (int s = 0; s < 3; ++s) run(s, together[s]);
    });
    std::thread b([&] {
      for (int s = 2; s >= 0; --s) run(s, together[3 + s]);
    });
    a.join();
    b.join();
  }
  for (int s = 0; s < 3; ++s) {
    std::vector<T> y;
    run(s, y);
    CHECK(widen(together[s]) == widen(y));
    CHECK(widen(together[3 + s]) == widen(y));
  }
}

TEST_CASE("linear f16 keeps f16's mantissa, overflows to inf, and propagates NaN") {
  // 1 + 2^-10 is exact in f16 but not in bf16 (it rounds to 1 there): an f16 GEMM that went
  // through bf16 would lose it.
  const float fine = 1.0f + 0x1p-10f;
  std::vector<ft::f16> x = {ft::to_f16(fine), ft::to_f16(300.0f), ft::to_f16(NAN)};  // (3, 1)
  std::vector<ft::f16> W = {ft::to_f16(1.0f)};                                       // (1, 1)
  std::vector<ft::f16> y(3);
  k::linear_forward(y.data(), x.data(), W.data(), 3, 1, 1);
  CHECK(ft::to_f32(y[0]) == fine);
  CHECK(ft::to_f32(y[1]) == 300.0f);
  CHECK(std::isnan(ft::to_f32(y[2])));
  // 300 · 300 = 90000 > 65504: inf, as torch.half gives, so fp16 loss scaling sees the overflow.
  W[0] = ft::to_f16(300.0f);
  k::linear_forward(y.data(), x.data(), W.data(), 3, 1, 1);
  CHECK(std::isinf(ft::to_f32(y[1])));
  // dW is fp32: the same product does not overflow there.
  std::vector<float> dW = {0.0f};
  std::vector<ft::f16> dy = {ft::to_f16(0.0f), ft::to_f16(300.0f), ft::to_f16(0.0f)};  // (3, 1)
  x[2] = ft::to_f16(0.0f);
  k::linear_backward<ft::f16>(nullptr, dW.data(), dy.data(), x.data(), W.data(), 3, 1, 1);
  CHECK(dW[0] == 90000.0f);
}

TEST_CASE("linear bf16 propagates NaN and inf into every output they touch") {
  const int N = 3, in = 19, out = 5;
  auto x = round_to<ft::bf16>(uniform(N * in, 7));
  const auto W = round_to<ft::bf16>(uniform(out * in, 8));
  x[1 * in + 4] = ft::to_bf16(NAN);       // row 1 of y is all NaN
  x[2 * in + 0] = ft::to_bf16(INFINITY);  // row 2 is ±inf or NaN, never finite
  std::vector<ft::bf16> y(N * out);
  k::linear_forward(y.data(), x.data(), W.data(), N, in, out);
  for (int o = 0; o < out; ++o) {
    CHECK(std::isfinite(ft::to_f32(y[0 * out + o])));
    CHECK(std::isnan(ft::to_f32(y[1 * out + o])));
    CHECK(!std::isfinite(ft::to_f32(y[2 * out + o])));
  }
}

TEST_CASE_TEMPLATE("linear bf16/f16: one product rounds once, to nearest even, bit for bit", T,
                   ft::bf16, ft::f16) {
  // in = 1: each output is one product of two 16-bit values, exact in fp32, so the only rounding
  // is the output's and it must give to_bf16's / to_f16's bits (ties to even, on every path:
  // oneDNN's, and the widened one's vector conversions). Values near 1 make many ties: a product
  // of (1 + a·2^-7)(1 + b·2^-7) needs up to 16 bits.
  const int N = 3, out = 4099;  // long rows (the conversions' vector loops), an odd tail
  std::vector<T> x(N), W(out);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> steps(0, 255);
  for (int n = 0; n < N; ++n) x[size_t(n)] = ft::from_f32<T>(1.0f + float(2 * n + 1) / 128.0f);
  for (int o = 0; o < out; ++o)
    W[size_t(o)] = ft::from_f32<T>((o % 2 ? -1.0f : 1.0f) * (1.0f + float(steps(rng)) / 128.0f));
  std::vector<T> y(size_t(N) * out);
  k::linear_forward(y.data(), x.data(), W.data(), N, 1, out);
  int mismatches = 0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      const T want = ft::from_f32<T>(ft::to_f32(x[size_t(n)]) * ft::to_f32(W[size_t(o)]));
      mismatches += std::memcmp(&want, &y[size_t(n) * out + o], sizeof(T)) != 0;
    }
  CHECK(mismatches == 0);
}

TEST_CASE("gemm_isa names the instruction set oneDNN dispatches to") {
  const std::string isa = k::gemm_isa();
  CHECK(isa != "unknown");
  CHECK(!isa.empty());
  // tests/cli/test_gemm_isa.sh caps oneDNN with ONEDNN_MAX_CPU_ISA; the name follows the cap.
  if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA")) {
    CAPTURE(cap);
    if (std::string(cap) == "AVX2") CHECK((isa == "avx2" || isa == "avx" || isa == "sse41"));
    if (std::string(cap) == "AVX512_CORE") CHECK(isa.find("bf16") == std::string::npos);
  }
}

namespace {

// One case of the packed kernel against the scalar chain it promises (kernels.h): every output
// c = fma(a_k, b_k, c) for k in order from 0 (or from the old output), rounded once to T.
template <typename T>
void check_packed_chain(bool ta, bool tb, int M, int N, int K, bool c32, bool accumulate,
                        uint32_t seed) {
  CAPTURE(ta);
  CAPTURE(tb);
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(c32);
  CAPTURE(accumulate);
  const auto A = round_to<T>(uniform(size_t(M) * K, seed));      // (M, K), or (K, M) when ta
  const auto B = round_to<T>(uniform(size_t(K) * N, seed + 1));  // (K, N), or (N, K) when tb
  const auto C0 = uniform(size_t(M) * N, seed + 2);
  std::vector<T> C = round_to<T>(C0);
  std::vector<float> C32 = C0;
  const bool done =
      k::gemm16_packed<T>(ta, tb, M, N, K, A.data(), B.data(), c32 ? nullptr : C.data(),
                          c32 ? C32.data() : nullptr, accumulate);
  // The baseline level has no packed kernel: nothing is done, and the caller widens.
  REQUIRE(done == (k::cpu_isa() >= k::CpuIsa::avx2));
  if (!done) {
    CHECK(widen(C) == widen(round_to<T>(C0)));
    CHECK(C32 == C0);
    return;
  }
  const auto A32 = widen(A), B32 = widen(B);
  int mismatches = 0, first_bad = -1;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const size_t o = size_t(i) * N + j;
      float c = !accumulate ? 0.0f : c32 ? C0[o] : ft::to_f32(ft::from_f32<T>(C0[o]));
      for (int p = 0; p < K; ++p)
        c = std::fma(ta ? A32[size_t(p) * M + i] : A32[size_t(i) * K + p],
                     tb ? B32[size_t(j) * K + p] : B32[size_t(p) * N + j], c);
      bool same;
      if (c32) {
        same = std::memcmp(&c, &C32[o], sizeof c) == 0;
      } else {
        const T want = ft::from_f32<T>(c);
        same = std::memcmp(&want, &C[o], sizeof(T)) == 0;
      }
      if (!same && first_bad < 0) first_bad = int(o);
      mismatches += !same;
    }
  CAPTURE(first_bad);
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("kernels16: the packed GEMM is the fp32 FMA chain in k order, bit for bit", T,
                   ft::bf16, ft::f16) {
  // Shapes around the kernel's tiles (avx512: 14 rows x 32 columns, 16 k a transpose; avx2:
  // 6 x 16, 8 k a transpose; up to 1024 (avx2: 512) of k a block): edges of every kind, whole tiles
  // (read and written in place), K over one block (a 16-bit C's chains continue in fp32 scratch), M
  // over the 1024 rows of that scratch, and sizes large enough to be split between threads.
  const int shapes[][3] = {{1, 1, 1},      {14, 32, 16},   {15, 33, 17}, {12, 48, 24},
                           {13, 31, 1025}, {28, 64, 2100}, {100, 7, 40}, {7, 100, 40}};
  uint32_t seed = 500;
  for (const auto& s : shapes)
    for (int layout = 0; layout < 4; ++layout)
      for (bool c32 : {false, true})
        for (bool acc : {false, true})
          check_packed_chain<T>(layout & 1, layout & 2, s[0], s[1], s[2], c32, acc, seed += 3);
  // The large ones once per layout (a few seconds in the sanitizer build otherwise).
  for (int layout = 0; layout < 4; ++layout) {
    check_packed_chain<T>(layout & 1, layout & 2, 1100, 64, 1100, false, layout % 2, seed += 3);
    check_packed_chain<T>(layout & 1, layout & 2, 60, 300, 1000, layout / 2, true, seed += 3);
  }
}
