// The conformance cases: for every op of runtime/op_list.h, one function add_<op>_cases that
// appends its cases (all_cases() below calls them from the list). Sizes are odd (1, 19, 111 and
// one larger), every float dtype of a Ref/CRef, the flags (accumulate, optional outputs left
// null, in place), GQA ratios, vocabulary-parallel v_begin offsets and misaligned views.
// Inputs are drawn on the host and rounded to their type, so both devices read the same values;
// where an op reads what another op makes (a norm's rstd, attention's lse), the CPU kernels
// make it here, so each op is checked on its own.
//
// Tolerances: each says why its number. The reference is the CPU kernels; the CUDA kernels do
// the same fp32 math in another order (block trees, tiles), with the device's expf and fused
// multiply-adds. A 16-bit output is that fp32 value rounded once on each side, so two values a
// few fp32 ulp apart can round one 16-bit value apart: `ulps = 1` in the 16-bit tolerances.
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <type_traits>
#include <utility>

#include "core/half.h"
#include "kernels/kernels.h"
#include "kernels/nf4.h"
#include "kernels/philox.h"
#include "tests/ops/op_harness.h"

namespace ft::op_test {
namespace {

namespace k = ft::kernels;

template <typename T>
constexpr Elem elem_of() {
  if constexpr (std::is_same_v<T, float>)
    return Elem::kF32;
  else if constexpr (std::is_same_v<T, bf16>)
    return Elem::kBF16;
  else if constexpr (std::is_same_v<T, f16>)
    return Elem::kF16;
  else if constexpr (std::is_same_v<T, double>)
    return Elem::kF64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return Elem::kI32;
  else
    return Elem::kU8;
}
template <typename T>
constexpr bool is16 = sizeof(T) == 2;

template <typename... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  ((s << a), ...);
  return s.str();
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// n values uniform in [lo, hi), or normal around 0, rounded to T; a seed per tensor, so the
// cases are the same on every run.
template <typename T>
std::vector<T> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = from_f32<T>(d(g));
  return v;
}
template <typename T>
std::vector<T> normal(size_t n, float sd, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<T> v(n);
  for (T& x : v) x = from_f32<T>(d(g));
  return v;
}
std::vector<int32_t> ids(size_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(g);
  return v;
}
// Rows 3, 8, 13, ... left out: every case has masked and unmasked rows (row 0 is always in).
std::vector<uint8_t> mask_of(int N) {
  std::vector<uint8_t> m(size_t(N), 1);
  for (int n = 3; n < N; n += 5) m[size_t(n)] = 0;
  return m;
}
template <typename T>
std::vector<float> f32_of(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = to_f32(v[i]);
  return f;
}

template <typename T>
Tensor in(std::string name, const std::vector<T>& v) {
  Tensor t;
  t.name = std::move(name);
  t.elem = elem_of<T>();
  t.host = bytes_of(v);
  return t;
}
// An output the op overwrites: it starts as NaN bytes, so an element left unwritten differs.
template <typename T>
Tensor out(std::string name, size_t n, Tolerance tol, std::vector<double> scale = {}) {
  Tensor t;
  t.name = std::move(name);
  t.elem = elem_of<T>();
  t.role = Role::kOut;
  t.host.assign(n * sizeof(T), 0xff);
  t.tol = tol;
  t.scale = std::move(scale);
  return t;
}
// An output the op adds into (or updates in place).
template <typename T>
Tensor inout(std::string name, const std::vector<T>& v, Tolerance tol,
             std::vector<double> scale = {}) {
  Tensor t = in(std::move(name), v);
  t.role = Role::kInOut;
  t.tol = tol;
  t.scale = std::move(scale);
  return t;
}
Tensor null_out(std::string name, Elem e) {
  Tensor t;
  t.name = std::move(name);
  t.elem = e;
  t.role = Role::kOut;
  t.null = true;
  return t;
}
// An output in the memory of tensor `of` (an in-place op).
Tensor alias(std::string name, Elem e, size_t n, int of, Tolerance tol) {
  Tensor t;
  t.name = std::move(name);
  t.elem = e;
  t.role = Role::kOut;
  t.host.assign(n * elem_size(e), 0);  // not uploaded: sizes the download
  t.alias = of;
  t.tol = tol;
  return t;
}

// fp32 math on both sides, agreeing to `rel32` relative (plus `abs` · s_i); a 16-bit result
// adds one ulp of its type (the two sides' one rounding each).
template <typename T>
Tolerance rounded(double rel32, double abs = 0) {
  return Tolerance{rel32, abs, is16<T> ? 1.0 : 0.0, false};
}
const Tolerance kExact{};

// Σ|a(i, l) · b(l, j)| over l < K (+ |old(i, j)|): the size of the terms of a GEMM's output,
// against which its summation error is bounded.
template <typename A, typename B>
std::vector<double> abs_sums(int rows, int cols, int K, A a, B b,
                             const std::vector<float>& old = {}) {
  std::vector<double> s(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      const size_t o = size_t(i) * cols + j;
      double t = old.empty() ? 0.0 : std::fabs(old[o]);
      for (int l = 0; l < K; ++l) t += std::fabs(double(a(i, l)) * b(l, j));
      s[o] = t;
    }
  return s;
}

// GEMM: each side sums K fp32 products (exact: 16-bit operands have at most 11 bits) and the
// old output in its own order (OpenBLAS/oneDNN blocks, cuBLASLt tiles, the emulation's index
// order); each is within (K + 1)·2^-24 of the exact sum relative to the terms' size, so they
// differ by twice that; 4 (K + 1)·2^-24 leaves a factor 2 (test_gemm16, lt_gemm_test). A lost
// or doubled term moves the sum by ~1/K of it: far beyond.
template <typename T>
Tolerance gemm_tol(int K) {
  return Tolerance{0, 4.0 * (K + 1) * std::ldexp(1.0, -24), is16<T> ? 1.0 : 0.0, false};
}

using Cases = std::vector<Case>;

// Every float dtype of a Ref.
template <typename F>
void for_each_dtype(F&& f) {
  f(float{});
  f(bf16{});
  f(f16{});
}

// ---- GEMM ----
struct GemmShape {
  int N, in, out;
};
// One element; odd sizes each way; one larger (several of the BLAS's and cuBLASLt's tiles).
const GemmShape kGemmShapes[] = {{1, 1, 1}, {19, 111, 19}, {111, 19, 37}, {67, 256, 131}};

template <typename T>
void linear_forward_case(Cases& cs, int N, int in_, int out_, bool acc) {
  const uint32_t s = uint32_t(N * 7919 + in_ * 31 + out_);
  const auto x = uniform<T>(size_t(N) * in_, -1, 1, s);
  const auto W = uniform<T>(size_t(out_) * in_, -1, 1, s + 1);
  const auto y0 = uniform<T>(size_t(N) * out_, -1, 1, s + 2);
  const auto xf = f32_of(x), Wf = f32_of(W);
  auto A = abs_sums(
      N, out_, in_, [&](int n, int l) { return xf[size_t(n) * in_ + l]; },
      [&](int l, int o) { return Wf[size_t(o) * in_ + l]; },
      acc ? f32_of(y0) : std::vector<float>{});
  Case c{"linear_forward",
         elem_name(elem_of<T>()),
         cat("N=", N, " in=", in_, " out=", out_, acc ? " accumulate" : ""),
         {},
         {}};
  c.tensors = {acc ? inout("y", y0, gemm_tol<T>(in_), A)
                   : out<T>("y", size_t(N) * out_, gemm_tol<T>(in_), A),
               in("x", x), in("W", W)};
  c.run = [=](Device& d, const Args& a) {
    d.ops().linear_forward(d.stream(), a.ref(0), a.cref(1), a.cref(2), N, in_, out_, acc);
  };
  cs.push_back(std::move(c));
}

void add_linear_forward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, in_, out_] : kGemmShapes)
      for (bool acc : {false, true}) linear_forward_case<T>(cs, N, in_, out_, acc);
  });
}

// y = r + x·Wᵀ: against the reference as linear_forward's +=, and on each device the bits of its
// twin there, r copied into y then linear_forward with accumulate (what the model ran before the
// op: a run's bits must not change). r apart from y or y itself (in place); a misaligned view of
// every tensor (the twin's y is as misaligned as r, so cuBLASLt sees the same alignments).
template <typename T>
void linear_forward_residual_case(Cases& cs, int N, int in_, int out_, bool in_place,
                                  size_t offset) {
  const uint32_t s = uint32_t(N * 7919 + in_ * 31 + out_ + 5);
  const auto x = uniform<T>(size_t(N) * in_, -1, 1, s);
  const auto W = uniform<T>(size_t(out_) * in_, -1, 1, s + 1);
  const auto r = uniform<T>(size_t(N) * out_, -1, 1, s + 2);
  const auto xf = f32_of(x), Wf = f32_of(W);
  auto A = abs_sums(
      N, out_, in_, [&](int n, int l) { return xf[size_t(n) * in_ + l]; },
      [&](int l, int o) { return Wf[size_t(o) * in_ + l]; }, f32_of(r));
  const size_t n = size_t(N) * out_;
  Case c{"linear_forward_residual",
         elem_name(elem_of<T>()),
         cat("N=", N, " in=", in_, " out=", out_, in_place ? " in place" : "",
             offset ? " misaligned" : ""),
         {},
         {}};
  c.tensors = {in_place ? alias("y", elem_of<T>(), n, /*of=*/1, gemm_tol<T>(in_))
                        : out<T>("y", n, gemm_tol<T>(in_)),
               in("r", r), in("x", x), in("W", W)};
  c.tensors[0].scale = std::move(A);
  for (Tensor& t : c.tensors) t.offset = offset;
  c.run = [=](Device& d, const Args& a) {
    d.ops().linear_forward_residual(d.stream(), a.ref(0), a.cref(1), a.cref(2), a.cref(3), N, in_,
                                    out_);
  };
  c.twin_what = "r copied into y, then linear_forward with accumulate";
  c.twin = [=](Device& d, const Args& a) {
    const Ref y = a.ref(0);
    const CRef rr = a.cref(1);
    if (y.ptr != rr.ptr) d.copy(d.stream(), y.ptr, rr.ptr, n * sizeof(T));
    d.ops().linear_forward(d.stream(), y, a.cref(2), a.cref(3), N, in_, out_, /*accumulate=*/true);
  };
  cs.push_back(std::move(c));
}

void add_linear_forward_residual_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, in_, out_] : kGemmShapes)
      for (bool in_place : {false, true})
        linear_forward_residual_case<T>(cs, N, in_, out_, in_place, 0);
    linear_forward_residual_case<T>(cs, 19, 111, 37, false, 1);
  });
}

// Outputs: dx (null unless with_dx), dW (null unless with_dw).
template <typename T>
void linear_backward_case(Cases& cs, int N, int in_, int out_, bool with_dx, bool with_dw,
                          bool acc_dx) {
  const uint32_t s = uint32_t(N * 104729 + in_ * 17 + out_ * 3);
  const auto dy = uniform<T>(size_t(N) * out_, -1, 1, s);
  const auto x = uniform<T>(size_t(N) * in_, -1, 1, s + 1);
  const auto W = uniform<T>(size_t(out_) * in_, -1, 1, s + 2);
  const auto dx0 = uniform<T>(size_t(N) * in_, -1, 1, s + 3);
  const auto dW0 = uniform<float>(size_t(out_) * in_, -1, 1, s + 4);  // dW accumulates
  const auto dyf = f32_of(dy), xf = f32_of(x), Wf = f32_of(W);
  // dx (N, in) = dy (N, out) · W (out, in): K = out. dW (out, in) += dyᵀ · x: K = N.
  auto dx_A = abs_sums(
      N, in_, out_, [&](int n, int o) { return dyf[size_t(n) * out_ + o]; },
      [&](int o, int i) { return Wf[size_t(o) * in_ + i]; },
      acc_dx ? f32_of(dx0) : std::vector<float>{});
  auto dW_A = abs_sums(
      out_, in_, N, [&](int o, int n) { return dyf[size_t(n) * out_ + o]; },
      [&](int n, int i) { return xf[size_t(n) * in_ + i]; }, dW0);
  Tensor dx = !with_dx ? null_out("dx", elem_of<T>())
              : acc_dx ? inout("dx", dx0, gemm_tol<T>(out_), dx_A)
                       : out<T>("dx", size_t(N) * in_, gemm_tol<T>(out_), dx_A);
  Tensor dW = with_dw ? inout("dW", dW0, gemm_tol<float>(N), dW_A) : null_out("dW", Elem::kF32);
  Case c{"linear_backward",
         elem_name(elem_of<T>()),
         cat("N=", N, " in=", in_, " out=", out_, with_dx ? (acc_dx ? " dx+=" : " dx") : "",
             with_dw ? " dW" : ""),
         {},
         {}};
  c.tensors = {std::move(dx), std::move(dW), in("dy", dy), in("x", x), in("W", W)};
  c.run = [=](Device& d, const Args& a) {
    d.ops().linear_backward(d.stream(), a.ref(0), a.f32(1), a.cref(2), a.cref(3), a.cref(4), N, in_,
                            out_, acc_dx);
  };
  cs.push_back(std::move(c));
}

void add_linear_backward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, in_, out_] : kGemmShapes) {
      linear_backward_case<T>(cs, N, in_, out_, true, true, false);
      linear_backward_case<T>(cs, N, in_, out_, true, true, true);
    }
    linear_backward_case<T>(cs, 19, 111, 37, true, false, false);  // dx only
    linear_backward_case<T>(cs, 19, 111, 37, false, true, false);  // dW only
  });
}

// ---- Bias ----
struct BiasShape {
  int N, C;
  size_t offset;
};
// One element; odd sizes; rows of whole 16-byte packs, aligned and one element off (the scalar
// path); more rows than one chunk of the CUDA gradient (600, 1000: partial rows summed in
// another order than the CPU's row by row).
const BiasShape kBiasShapes[] = {{1, 1, 0},   {19, 111, 0}, {111, 19, 0},  {19, 64, 0},
                                 {19, 64, 1}, {600, 67, 0}, {1000, 256, 0}};
std::string bias_shape(const BiasShape& b) {
  return cat("N=", b.N, " C=", b.C, b.offset ? " misaligned" : "");
}

// y + b in fp32, rounded once, on both sides: the same bits.
void add_bias_add_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const BiasShape& shape : kBiasShapes) {
      const auto [N, C, offset] = shape;
      const uint32_t s = uint32_t(N * 13 + C);
      Case c{"bias_add", elem_name(elem_of<T>()), bias_shape(shape), {}, {}};
      c.tensors = {inout("y", uniform<T>(size_t(N) * C, -2, 2, s), kExact),
                   in("b", uniform<T>(size_t(C), -1, 1, s + 1))};
      for (Tensor& t : c.tensors) t.offset = offset;
      c.run = [=](Device& d, const Args& a) {
        d.ops().bias_add(d.stream(), a.ref(0), a.cref(1), N, C);
      };
      cs.push_back(std::move(c));
    }
  });
}

// db += Σ_n dy is a GEMM with a column of ones (K = N): the GEMM's bound against the terms'
// size Σ_n |dy| + |db|.
void add_bias_grad_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const BiasShape& shape : kBiasShapes) {
      const auto [N, C, offset] = shape;
      const uint32_t s = uint32_t(N * 17 + C);
      const auto dy = uniform<T>(size_t(N) * C, -1, 1, s);
      const auto db = uniform<float>(size_t(C), -1, 1, s + 1);
      std::vector<double> scale(db.begin(), db.end());
      for (double& x : scale) x = std::fabs(x);
      for (size_t i = 0; i < dy.size(); ++i) scale[i % size_t(C)] += std::fabs(to_f32(dy[i]));
      Case c{"bias_grad", elem_name(elem_of<T>()), bias_shape(shape), {}, {}};
      c.tensors = {inout("db", db, gemm_tol<float>(N), scale), in("dy", dy)};
      c.tensors[1].offset = offset;
      c.run = [=](Device& d, const Args& a) {
        d.ops().bias_grad(d.stream(), a.f32(0), a.cref(1), N, C);
      };
      cs.push_back(std::move(c));
    }
  });
}

// ---- Embedding: a shard [v_begin, v_begin + v_count) of a vocabulary of `vocab` ids ----
struct EmbeddingShape {
  int N, C, vocab, v_begin, v_count;
};
// The whole table; a shard in the middle (ids below and above it give zero rows); many
// tokens over few rows (duplicate ids: the backward's order of additions).
const EmbeddingShape kEmbeddingShapes[] = {{1, 1, 3, 0, 3},
                                           {19, 111, 50, 0, 50},
                                           {111, 19, 200, 37, 100},
                                           {111, 64, 7, 0, 7},
                                           {1000, 67, 512, 128, 256}};

// A copy of table rows or zeros: exact in every type.
void add_embedding_forward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, C, vocab, v_begin, v_count] : kEmbeddingShapes) {
      const uint32_t s = uint32_t(N * 31 + C);
      Case c{"embedding_forward",
             elem_name(elem_of<T>()),
             cat("N=", N, " C=", C, " vocab=", vocab, " shard [", v_begin, ", ", v_begin + v_count,
                 ")"),
             {},
             {}};
      c.tensors = {out<T>("out", size_t(N) * C, kExact), in("ids", ids(size_t(N), 0, vocab, s)),
                   in("table", uniform<T>(size_t(v_count) * C, -1, 1, s + 1))};
      c.run = [=](Device& d, const Args& a) {
        d.ops().embedding_forward(d.stream(), a.ref(0), a.i32(1), a.cref(2), N, C, v_begin,
                                  v_count);
      };
      cs.push_back(std::move(c));
    }
  });
}

// Each table row adds its tokens' rows in token order, in fp32, as the CPU does (the CUDA
// kernel has a thread per column walk the tokens): the same additions, so the same bits.
void add_embedding_backward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, C, vocab, v_begin, v_count] : kEmbeddingShapes) {
      const uint32_t s = uint32_t(N * 37 + C);
      Case c{"embedding_backward",
             elem_name(elem_of<T>()),
             cat("N=", N, " C=", C, " vocab=", vocab, " shard [", v_begin, ", ", v_begin + v_count,
                 ")"),
             {},
             {}};
      c.tensors = {inout("dtable", uniform<float>(size_t(v_count) * C, -1, 1, s), kExact),
                   in("ids", ids(size_t(N), 0, vocab, s + 1)),
                   in("dout", uniform<T>(size_t(N) * C, -1, 1, s + 2))};
      c.run = [=](Device& d, const Args& a) {
        d.ops().embedding_backward(d.stream(), a.f32(0), a.i32(1), a.cref(2), N, C, v_begin,
                                   v_count);
      };
      cs.push_back(std::move(c));
    }
  });
}

// ---- RMSNorm ----
// Rows of 1, 19, 111 and 2051 columns (a ragged last warp; a row wider than a block), more rows
// than the backward's blocks (600), and whole 16-byte packs one element off alignment (the
// scalar path).
struct NormShape {
  int N, C;
  size_t offset;
};
const NormShape kNormShapes[] = {{1, 1, 0},    {19, 111, 0}, {111, 19, 0},
                                 {5, 2051, 0}, {600, 24, 0}, {19, 64, 1}};
constexpr float kEps = 1e-5f;
// Σx² over a row of C in another order (a block tree against the CPU's running sum): each
// carries ~√C·u relative error (a random walk of roundings, u = 2^-24); 2e-7·√C is ~3√C·u,
// over a floor of 1e-6 (~8 u) for the division and square root (test_rmsnorm).
double row_sum_rel(int C) { return 1e-6 + 2e-7 * std::sqrt(double(C)); }

void add_rmsnorm_forward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, C, offset] : kNormShapes) {
      const uint32_t s = uint32_t(N * 1000 + C);
      const size_t nc = size_t(N) * C;
      Case c{"rmsnorm_forward",
             elem_name(elem_of<T>()),
             cat("N=", N, " C=", C, offset ? " misaligned" : ""),
             {},
             {}};
      // rstd: the row sum's error; out = w·(x·rstd): that, plus two roundings (1e-6).
      c.tensors = {out<T>("out", nc, rounded<T>(row_sum_rel(C) + 1e-6)),
                   out<float>("rstd", size_t(N), rounded<float>(row_sum_rel(C))),
                   in("x", uniform<T>(nc, -2, 2, s)),
                   in("w", uniform<T>(size_t(C), 0.5f, 1.5f, s + 1))};
      for (Tensor& t : c.tensors) t.offset = offset;
      c.run = [=](Device& d, const Args& a) {
        d.ops().rmsnorm_forward(d.stream(), a.ref(0), a.f32(1), a.cref(2), a.cref(3), N, C, kEps);
      };
      cs.push_back(std::move(c));
    }
  });
}

template <typename T>
void rmsnorm_backward_case(Cases& cs, const NormShape& shape, bool acc, bool with_dw = true) {
  const auto [N, C, offset] = shape;
  const uint32_t s = uint32_t(N * 1000 + C + 7);
  const size_t nc = size_t(N) * C;
  const auto x = uniform<T>(nc, -2, 2, s), w = uniform<T>(size_t(C), 0.5f, 1.5f, s + 1);
  const auto dy = uniform<T>(nc, -1, 1, s + 2), dx0 = uniform<T>(nc, -1, 1, s + 3);
  const auto dw0 = uniform<float>(size_t(C), -1, 1, s + 4);
  std::vector<T> y(nc);
  std::vector<float> rstd(static_cast<size_t>(N));
  k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  // dx = r·w·dy − k·x cancels: its error is bounded against the terms' size
  // r·(|w·dy| + |x|); dw sums N terms per column against Σ|dy·x·r| + |dw0|.
  std::vector<double> dx_scale(nc), dw_scale(static_cast<size_t>(C));
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < C; ++j) {
      const size_t i = size_t(n) * C + j;
      const double xv = to_f32(x[i]), dyv = to_f32(dy[i]);
      dx_scale[i] = rstd[n] * (std::fabs(to_f32(w[j]) * dyv) + std::fabs(xv));
      dw_scale[j] += std::fabs(dyv * xv * rstd[n]);
    }
  for (int j = 0; j < C; ++j) dw_scale[j] += std::fabs(dw0[j]);
  // dx: the dot Σ w·dy·x is another row sum (the same √C allowance); accumulating adds the
  // sum's own rounding (1e-6 relative). dw: N terms summed per block then across blocks
  // instead of row by row: ~√N·u of the terms' size.
  const Tolerance dx_tol{acc ? 1e-6 : 0.0, row_sum_rel(C) + 1e-6, is16<T> ? 1.0 : 0.0, false};
  const Tolerance dw_tol{0, row_sum_rel(N), 0, false};
  Case c{"rmsnorm_backward",
         elem_name(elem_of<T>()),
         cat("N=", N, " C=", C, acc ? " dx+=" : "", with_dw ? "" : " no dw",
             offset ? " misaligned" : ""),
         {},
         {}};
  c.tensors = {acc ? inout("dx", dx0, dx_tol, dx_scale) : out<T>("dx", nc, dx_tol, dx_scale),
               with_dw ? inout("dw", dw0, dw_tol, dw_scale) : null_out("dw", Elem::kF32),
               in("dout", dy),
               in("x", x),
               in("w", w),
               in("rstd", rstd)};
  for (Tensor& t : c.tensors) t.offset = offset;
  c.run = [=](Device& d, const Args& a) {
    d.ops().rmsnorm_backward(d.stream(), a.ref(0), a.f32(1), a.cref(2), a.cref(3), a.cref(4),
                             a.f32(5), N, C, acc);
  };
  cs.push_back(std::move(c));
}

void add_rmsnorm_backward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const NormShape& shape : kNormShapes)
      for (bool acc : {false, true}) rmsnorm_backward_case<T>(cs, shape, acc);
    rmsnorm_backward_case<T>(cs, kNormShapes[1], true, /*with_dw=*/false);  // a frozen norm
  });
}

// ---- RoPE ----
struct RopeShape {
  int B, T, nh, D;
  int pos0 = -1;  // >= 0: positions pos (B, T), row b's t at pos0 + 5b + t; -1: null (t)
};
// Without positions, then with them: far positions (up to 4096 + T, so the angles are large),
// as `ft generate` rotates the cache's rows pos, pos + 1, ... (lib/model/decode.cpp).
const RopeShape kRopeShapes[] = {{1, 1, 1, 2},        {2, 19, 3, 16},      {1, 111, 2, 64},
                                 {2, 257, 4, 128},    {1, 1, 1, 2, 0},     {1, 1, 3, 16, 7},
                                 {2, 19, 2, 64, 100}, {1, 3, 4, 128, 4096}};

template <typename T>
void rope_case(Cases& cs, const RopeShape& r, bool backward) {
  const auto [B, T_, nh, D, pos0] = r;
  const size_t n = size_t(B) * T_ * nh * D;
  std::vector<float> inv_freq(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * i / D));
  const auto x = uniform<T>(n, -2, 2, uint32_t(std::max(pos0, 0) + T_ * 100 + nh * 10 + D));
  // cos and sin agree with the CPU's to about one rounding and x1·c − x2·s can cancel: the
  // error is bounded against the pair's |x1| + |x2|; 1e-6 of it is ~8 ulp of the larger term
  // (test_rope).
  std::vector<double> scale(n);
  for (size_t h = 0; h < n / size_t(D); ++h)
    for (int i = 0; i < D / 2; ++i) {
      const size_t a = h * D + i, b = a + D / 2;
      scale[a] = scale[b] = std::fabs(to_f32(x[a])) + std::fabs(to_f32(x[b]));
    }
  const bool with_pos = pos0 >= 0;
  std::vector<int32_t> pos;
  for (int b = 0; with_pos && b < B; ++b)
    for (int t = 0; t < T_; ++t) pos.push_back(pos0 + 5 * b + t);
  Case c{backward ? "rope_backward" : "rope_forward",
         elem_name(elem_of<T>()),
         cat("B=", B, " T=", T_, " nh=", nh, " D=", D, with_pos ? cat(" pos=", pos0, "..") : ""),
         {},
         {}};
  c.tensors = {inout("x", x, rounded<T>(0, 1e-6), scale), in("inv_freq", inv_freq)};
  if (with_pos) c.tensors.push_back(in("pos", pos));
  c.run = [=](Device& d, const Args& a) {
    const int32_t* p = with_pos ? a.i32(2) : nullptr;
    if (backward)
      d.ops().rope_backward(d.stream(), a.ref(0), a.f32(1), B, T_, nh, D, p);
    else
      d.ops().rope_forward(d.stream(), a.ref(0), a.f32(1), B, T_, nh, D, p);
  };
  cs.push_back(std::move(c));
}

void add_rope_forward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    for (const RopeShape& r : kRopeShapes) rope_case<decltype(t)>(cs, r, false);
  });
}
void add_rope_backward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    for (const RopeShape& r : kRopeShapes) rope_case<decltype(t)>(cs, r, true);
  });
}

// ---- Attention ----
struct AttentionShape {
  int B, T, H, K, D;
  bool segments = false;  // document masking: attention_segments' ids
};
// One token; GQA ratios 1, 2 and 4; T = 19 inside one tile, 111 across several; head dims 16,
// 40 (not a multiple of 32), 64 and 128 (the SIMT kernels' and the fused kernel's largest).
// With segments, the fused kernel's head dims (64, 128), odd T, GQA 1, 2 and 4.
const AttentionShape kAttentionShapes[] = {{1, 1, 1, 1, 16},         {2, 19, 4, 2, 40},
                                           {1, 19, 4, 1, 16},        {1, 111, 2, 2, 64},
                                           {2, 37, 8, 2, 128},       {1, 19, 4, 1, 64, true},
                                           {2, 111, 4, 2, 64, true}, {1, 37, 2, 2, 128, true}};

// Segment ids (B, T) for document masking: documents of lengths 7 + b, 1, 23, 40, 2 repeated,
// so each batch row packs them differently and one document is a single token. Empty
// without segments.
std::vector<int32_t> attention_segments(const AttentionShape& s) {
  if (!s.segments) return {};
  std::vector<int32_t> seg(size_t(s.B) * s.T);
  for (int b = 0; b < s.B; ++b) {
    const int lengths[] = {7 + b, 1, 23, 40, 2};
    int id = 3 * b, left = lengths[0], next = 1;  // ids need not start at 0
    for (int t = 0; t < s.T; ++t) {
      if (left == 0) {
        ++id;
        left = lengths[next++ % 5];
      }
      seg[size_t(b) * s.T + t] = id;
      --left;
    }
  }
  return seg;
}

// (rel, abs of the output's largest |value|), test_attention's. fp32: both sides compute in
// fp32 and differ in the order of the sums and in exp: a few ulp per element and, where dQ/dK
// cancel, a few ulp of the tensor's largest terms. 16-bit: on tensor cores (the CUDA default)
// P and dS are also rounded to the type before their products, so each term carries one more
// rounding: two units of the type relative to the value (2/128, 2/1024) and to the tensor's
// largest value (2/256, 2/2048). The SIMT kernels keep P in fp32 and meet it with room.
template <typename T>
Tolerance attention_tol() {
  if constexpr (std::is_same_v<T, float>)
    return Tolerance{4e-6, 4e-6, 0, true};
  else if constexpr (std::is_same_v<T, bf16>)
    return Tolerance{2.0 / 128, 2.0 / 256, 0, true};
  else
    return Tolerance{2.0 / 1024, 2.0 / 2048, 0, true};
}

template <typename T>
struct AttentionInputs {
  std::vector<T> q, k, v, out, dout;
  std::vector<float> lse;
  std::vector<int32_t> seg;  // empty: no segments
};
template <typename T>
AttentionInputs<T> attention_inputs(const AttentionShape& s) {
  const int B = s.B, T_ = s.T, H = s.H, K = s.K, D = s.D;
  const size_t nq = size_t(B) * T_ * H * D, nk = size_t(B) * T_ * K * D;
  const uint32_t seed = uint32_t(B * 1000 + T_ * 10 + H + K + D + (s.segments ? 7 : 0));
  // Scores of a few units: softmax rows neither uniform nor one-hot.
  AttentionInputs<T> in{normal<T>(nq, 1.5f, seed),     normal<T>(nk, 1.5f, seed + 1),
                        normal<T>(nk, 1.0f, seed + 2), std::vector<T>(nq),
                        normal<T>(nq, 1.0f, seed + 3), std::vector<float>(size_t(B) * H * T_),
                        attention_segments(s)};
  k::attention_forward<T>(in.out.data(), in.lse.data(), in.q.data(), in.k.data(), in.v.data(), B,
                          T_, H, K, D, in.seg.empty() ? nullptr : in.seg.data());
  return in;
}
std::string attention_shape(const AttentionShape& s) {
  return cat("B=", s.B, " T=", s.T, " H=", s.H, " K=", s.K, " D=", s.D,
             s.segments ? " segments" : "");
}

void add_attention_forward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const AttentionShape& s : kAttentionShapes) {
      const int B = s.B, T_ = s.T, H = s.H, K = s.K, D = s.D;
      const AttentionInputs<T> x = attention_inputs<T>(s);
      Case c{"attention_forward", elem_name(elem_of<T>()), attention_shape(s), {}, {}};
      // lse is fp32 for every type, from the same fp32 scores: a few ulp of a few units.
      c.tensors = {out<T>("out", x.q.size(), attention_tol<T>()),
                   out<float>("lse", x.lse.size(), Tolerance{1e-5, 1e-6, 0, true}), in("q", x.q),
                   in("k", x.k), in("v", x.v)};
      const bool seg = s.segments;
      if (seg) c.tensors.push_back(in("seg", x.seg));
      c.run = [=](Device& d, const Args& a) {
        d.ops().attention_forward(d.stream(), a.ref(0), a.f32(1), a.cref(2), a.cref(3), a.cref(4),
                                  seg ? a.i32(5) : nullptr, B, T_, H, K, D);
      };
      cs.push_back(std::move(c));
    }
  });
}

// attention_decode: one new query (pos 0 and deep in a cache) and a few (a prompt's prefill),
// GQA ratios 1, 2 and 4, head dims 16, 40, 64 and 256 (the CUDA kernel's largest). The CPU
// sums in two passes, CUDA online: attention_forward's tolerances.
void add_attention_decode_cases(Cases& cs) {
  struct Shape {
    int pos, Tq, H, K, D;
  };
  const Shape shapes[] = {{0, 1, 1, 1, 16},
                          {0, 19, 4, 2, 40},
                          {37, 1, 4, 1, 64},
                          {110, 3, 8, 2, 64},
                          {5, 2, 2, 2, 256}};
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const Shape& s : shapes) {
      const auto [pos, Tq, H, K, D] = s;
      const int Tk = pos + Tq;
      const uint32_t seed = uint32_t(pos * 100 + Tq * 10 + H + K + D);
      const auto q = normal<T>(size_t(Tq) * H * D, 1.5f, seed);
      const auto kk = normal<T>(size_t(Tk) * K * D, 1.5f, seed + 1);
      const auto v = normal<T>(size_t(Tk) * K * D, 1.0f, seed + 2);
      Case c{"attention_decode",
             elem_name(elem_of<T>()),
             cat("pos=", pos, " Tq=", Tq, " H=", H, " K=", K, " D=", D),
             {},
             {}};
      c.tensors = {out<T>("out", q.size(), attention_tol<T>()), in("q", q), in("k", kk),
                   in("v", v)};
      c.run = [=](Device& d, const Args& a) {
        d.ops().attention_decode(d.stream(), a.ref(0), a.cref(1), a.cref(2), a.cref(3), pos, Tq, H,
                                 K, D);
      };
      cs.push_back(std::move(c));
    }
  });
}

void add_attention_backward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const AttentionShape& s : kAttentionShapes) {
      const int B = s.B, T_ = s.T, H = s.H, K = s.K, D = s.D;
      const AttentionInputs<T> x = attention_inputs<T>(s);
      Case c{"attention_backward", elem_name(elem_of<T>()), attention_shape(s), {}, {}};
      c.tensors = {out<T>("dq", x.q.size(), attention_tol<T>()),
                   out<T>("dk", x.k.size(), attention_tol<T>()),
                   out<T>("dv", x.v.size(), attention_tol<T>()),
                   in("dout", x.dout),
                   in("out", x.out),
                   in("lse", x.lse),
                   in("q", x.q),
                   in("k", x.k),
                   in("v", x.v)};
      const bool seg = s.segments;
      if (seg) c.tensors.push_back(in("seg", x.seg));
      c.run = [=](Device& d, const Args& a) {
        // The scratch this device asks for (the size query is part of the contract), NaN
        // to start with: a kernel must write what it reads.
        const DType dt = a.ref(0).dtype;
        const size_t n = d.ops().attention_backward_scratch_elems(dt, B, T_, H, D);
        Buffer<float> scratch(&d, n);
        const std::vector<float> nan(n, std::nanf(""));
        scratch.upload(nan.data(), n);
        d.ops().attention_backward(d.stream(), a.ref(0), a.ref(1), a.ref(2), a.cref(3), a.cref(4),
                                   a.f32(5), a.cref(6), a.cref(7), a.cref(8),
                                   seg ? a.i32(9) : nullptr, scratch.data(), B, T_, H, K, D);
        d.synchronize();  // before the scratch goes
      };
      cs.push_back(std::move(c));
    }
  });
}

// ---- SwiGLU and the other elementwise ops: odd lengths (the scalar tail after 16-byte
// packs), one larger (many blocks), and a view one element off alignment (the scalar path) ----
struct Length {
  size_t n, offset;
};
const Length kLengths[] = {{1, 0}, {19, 0}, {111, 0}, {70001, 0}, {111, 1}};
std::string length_shape(const Length& l) { return cat("n=", l.n, l.offset ? " misaligned" : ""); }

// fp32: the device's expf is within 2 ulp of the CPU's and nvcc may fuse multiply-adds: a few
// ulp on the product (1e-6 is ~8 ulp). dg's factor 1 + g(1 − s) cancels near g ≈ −1.28, so
// its error is bounded against |dh·u| (test_swiglu). g in [-8, 8]: both saturated ends.
void add_swiglu_forward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const Length& l : kLengths) {
      const uint32_t s = uint32_t(l.n * 3 + l.offset);
      Case c{"swiglu_forward", elem_name(elem_of<T>()), length_shape(l), {}, {}};
      c.tensors = {out<T>("h", l.n, rounded<T>(1e-6)), in("g", uniform<T>(l.n, -8, 8, s)),
                   in("u", uniform<T>(l.n, -2, 2, s + 1))};
      for (Tensor& t : c.tensors) t.offset = l.offset;
      const size_t n = l.n;
      c.run = [=](Device& d, const Args& a) {
        d.ops().swiglu_forward(d.stream(), a.ref(0), a.cref(1), a.cref(2), n);
      };
      cs.push_back(std::move(c));
    }
  });
}

void add_swiglu_backward_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const Length& l : kLengths) {
      const uint32_t s = uint32_t(l.n * 5 + l.offset);
      const auto g = uniform<T>(l.n, -8, 8, s), u = uniform<T>(l.n, -2, 2, s + 1);
      const auto dh = uniform<T>(l.n, -2, 2, s + 2);
      std::vector<double> dg_scale(l.n);
      for (size_t i = 0; i < l.n; ++i) dg_scale[i] = std::fabs(to_f32(dh[i]) * to_f32(u[i]));
      Case c{"swiglu_backward", elem_name(elem_of<T>()), length_shape(l), {}, {}};
      c.tensors = {out<T>("dg", l.n, rounded<T>(1e-6, 1e-6), dg_scale),
                   out<T>("du", l.n, rounded<T>(1e-6)), in("dh", dh), in("g", g), in("u", u)};
      for (Tensor& t : c.tensors) t.offset = l.offset;
      const size_t n = l.n;
      c.run = [=](Device& d, const Args& a) {
        d.ops().swiglu_backward(d.stream(), a.ref(0), a.ref(1), a.cref(2), a.cref(3), a.cref(4), n);
      };
      cs.push_back(std::move(c));
    }
  });
}

// ---- Cross-entropy ----
// dlogits: exp(x − max)·scale/Σ on both sides, Σ in another order (fp32 per thread on CUDA,
// double on the CPU): a few fp32 ulp (1e-6 is ~8), then the 16-bit rounding; below 1e-9 (a
// row's gradient is at most `scale` in size) nothing matters (test_cross_entropy).
template <typename T>
Tolerance dlogits_tol() {
  return rounded<T>(1e-6, 1e-9);
}
// The loss sum: fp32 statistics per row, double sums; 1e-6 relative is ~10 fp32 ulp of a row's
// logsumexp, far above the differences in summation order.
const Tolerance kLossTol{1e-6, 1e-6, 0, false};
constexpr float kScale = 0.37f;
const std::vector<double> kLoss0{0.25};  // the loss accumulates: a start that is not 0

enum class Grad { kSeparate, kNone, kInPlace };
const char* grad_name(Grad g) {
  return g == Grad::kSeparate ? "" : g == Grad::kNone ? " loss only" : " dlogits in place";
}
// dlogits (tensor 0) as the mode asks; logits are tensor 1.
template <typename T>
Tensor dlogits_tensor(Grad g, size_t n) {
  if (g == Grad::kNone) return null_out("dlogits", elem_of<T>());
  if (g == Grad::kInPlace) return alias("dlogits", elem_of<T>(), n, 1, dlogits_tol<T>());
  return out<T>("dlogits", n, dlogits_tol<T>());
}

struct CeShape {
  int N, V;
};
const CeShape kCeShapes[] = {{1, 1}, {19, 111}, {111, 19}, {7, 4099}};

void add_cross_entropy_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, V] : kCeShapes)
      for (Grad g : {Grad::kSeparate, Grad::kNone, Grad::kInPlace}) {
        const uint32_t s = uint32_t(N * 100 + V);
        const size_t n = size_t(N) * V;
        Case c{
            "cross_entropy", elem_name(elem_of<T>()), cat("N=", N, " V=", V, grad_name(g)), {}, {}};
        // Logits with sd 3: a peaked softmax, as a trained model's.
        c.tensors = {dlogits_tensor<T>(g, n),
                     in("logits", normal<T>(n, 3, s)),
                     in("targets", ids(size_t(N), 0, V, s + 1)),
                     in("mask", mask_of(N)),
                     inout("loss_acc", kLoss0, kLossTol),
                     in("scale", std::vector<float>{kScale})};
        // The scale is read from device memory; without a gradient, none is passed.
        c.run = [=](Device& d, const Args& a) {
          d.ops().cross_entropy(d.stream(), a.ref(0), a.cref(1), a.i32(2), a.u8(3), N, V,
                                g == Grad::kNone ? nullptr : a.f32(5), a.f64(4));
        };
        cs.push_back(std::move(c));
      }
  });
}

// Vocabulary-parallel: this shard holds columns [v_begin, v_begin + V) of `vocab`; targets
// fall inside and outside it.
struct ShardShape {
  int N, V, v_begin, vocab;
};
const ShardShape kShardShapes[] = {
    {1, 1, 0, 1}, {19, 111, 0, 111}, {111, 19, 37, 100}, {7, 4099, 4099, 3 * 4099}};
std::string shard_shape(const ShardShape& s) {
  return cat("N=", s.N, " V=", s.V, " shard [", s.v_begin, ", ", s.v_begin + s.V, ") of ", s.vocab);
}

// The row's max of the same values: exact.
void add_row_max_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const auto [N, V] : kCeShapes) {
      Case c{"row_max", elem_name(elem_of<T>()), cat("N=", N, " V=", V), {}, {}};
      c.tensors = {out<float>("out", size_t(N), kExact),
                   in("x", normal<T>(size_t(N) * V, 3, uint32_t(N + V)))};
      c.run = [=](Device& d, const Args& a) {
        d.ops().row_max(d.stream(), a.f32(0), a.cref(1), N, V);
      };
      cs.push_back(std::move(c));
    }
  });
}

template <typename T>
struct ShardInputs {
  std::vector<T> logits;
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;
  std::vector<float> row_max;
  std::vector<double> sumexp, target_logit;
};
template <typename T>
ShardInputs<T> shard_inputs(const ShardShape& s) {
  const uint32_t seed = uint32_t(s.N * 100 + s.V + s.v_begin);
  ShardInputs<T> x{normal<T>(size_t(s.N) * s.V, 3, seed),
                   ids(size_t(s.N), 0, s.vocab, seed + 1),
                   mask_of(s.N),
                   std::vector<float>(size_t(s.N)),
                   std::vector<double>(size_t(s.N)),
                   std::vector<double>(size_t(s.N))};
  k::row_max(x.row_max.data(), x.logits.data(), s.N, s.V);
  k::ce_partial(x.sumexp.data(), x.target_logit.data(), x.logits.data(), x.targets.data(),
                x.mask.data(), x.row_max.data(), s.N, s.V, s.v_begin);
  return x;
}

void add_ce_partial_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const ShardShape& s : kShardShapes) {
      const ShardInputs<T> x = shard_inputs<T>(s);
      const auto [N, V, v_begin, vocab] = s;
      Case c{"ce_partial", elem_name(elem_of<T>()), shard_shape(s), {}, {}};
      // sumexp: fp32 exps summed in another order (1e-6 relative, as the loss); the target's
      // logit is a copy, exact.
      c.tensors = {out<double>("sumexp", size_t(N), Tolerance{1e-6, 0, 0, false}),
                   out<double>("target_logit", size_t(N), kExact),
                   in("logits", x.logits),
                   in("targets", x.targets),
                   in("mask", x.mask),
                   in("row_max", x.row_max)};
      c.run = [=](Device& d, const Args& a) {
        d.ops().ce_partial(d.stream(), a.f64(0), a.f64(1), a.cref(2), a.i32(3), a.u8(4), a.f32(5),
                           N, V, v_begin);
      };
      cs.push_back(std::move(c));
    }
  });
}

void add_ce_finish_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const ShardShape& s : kShardShapes)
      for (Grad g : {Grad::kSeparate, Grad::kNone, Grad::kInPlace}) {
        const ShardInputs<T> x = shard_inputs<T>(s);
        const auto [N, V, v_begin, vocab] = s;
        Case c{"ce_finish", elem_name(elem_of<T>()), shard_shape(s) + grad_name(g), {}, {}};
        c.tensors = {dlogits_tensor<T>(g, x.logits.size()),
                     in("logits", x.logits),
                     in("targets", x.targets),
                     in("mask", x.mask),
                     in("row_max", x.row_max),
                     in("sumexp", x.sumexp),
                     in("target_logit", x.target_logit),
                     inout("loss_acc", kLoss0, kLossTol),
                     in("scale", std::vector<float>{kScale})};
        c.run = [=](Device& d, const Args& a) {
          d.ops().ce_finish(d.stream(), a.ref(0), a.cref(1), a.i32(2), a.u8(3), a.f32(4), a.f64(5),
                            a.f64(6), N, V, v_begin, g == Grad::kNone ? nullptr : a.f32(8),
                            a.f64(7));
        };
        cs.push_back(std::move(c));
      }
  });
}

// ---- Casts: the bits of core/half.h's conversions, NaN, inf and subnormals included: exact.
// fp32 sources are random bit patterns (every class of value, NaN payloads too); 16-bit ones
// run through every pattern when there are enough elements. ----
template <typename Dst, typename Src>
void convert_cases(Cases& cs) {
  for (const Length& l : kLengths) {
    std::vector<Src> src(l.n);
    std::mt19937 g(uint32_t(l.n + sizeof(Dst) * 10 + sizeof(Src)));
    for (size_t i = 0; i < l.n; ++i) {
      const uint32_t bits = sizeof(Src) == 4 ? uint32_t(g()) : uint32_t(i * 40503u) & 0xffffu;
      std::memcpy(&src[i], &bits, sizeof(Src));
    }
    Case c{"convert",
           cat(elem_name(elem_of<Src>()), " -> ", elem_name(elem_of<Dst>())),
           length_shape(l),
           {},
           {}};
    c.tensors = {out<Dst>("dst", l.n, kExact), in("src", src)};
    for (Tensor& t : c.tensors) t.offset = l.offset;
    const size_t n = l.n;
    c.run = [=](Device& d, const Args& a) { d.ops().convert(d.stream(), a.ref(0), a.cref(1), n); };
    cs.push_back(std::move(c));
  }
}

void add_convert_cases(Cases& cs) {
  // One side fp32 (the contract), and each same-type copy.
  convert_cases<bf16, float>(cs);
  convert_cases<f16, float>(cs);
  convert_cases<float, bf16>(cs);
  convert_cases<float, f16>(cs);
  convert_cases<float, float>(cs);
  convert_cases<bf16, bf16>(cs);
  convert_cases<f16, f16>(cs);
}

// ---- Elementwise and reductions ----
// One fp32 add and one rounding per element on both sides: the same bits.
void add_add_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const Length& l : kLengths) {
      const uint32_t s = uint32_t(l.n * 11 + l.offset);
      Case c{"add", elem_name(elem_of<T>()), length_shape(l), {}, {}};
      c.tensors = {inout("y", uniform<T>(l.n, -3, 3, s), kExact),
                   in("x", uniform<T>(l.n, -1, 1, s + 1))};
      for (Tensor& t : c.tensors) t.offset = l.offset;
      const size_t n = l.n;
      c.run = [=](Device& d, const Args& a) { d.ops().add(d.stream(), a.ref(0), a.cref(1), n); };
      cs.push_back(std::move(c));
    }
  });
}

// One fp32 multiply per element: the same bits.
void add_scale_cases(Cases& cs) {
  for (const Length& l : kLengths) {
    Case c{"scale", "f32", length_shape(l), {}, {}};
    c.tensors = {inout("y", uniform<float>(l.n, -3, 3, uint32_t(l.n)), kExact)};
    c.tensors[0].offset = l.offset;
    const size_t n = l.n;
    c.run = [=](Device& d, const Args& a) { d.ops().scale(d.stream(), a.f32(0), 0.37f, n); };
    cs.push_back(std::move(c));
  }
}

// ---- Parameter init: the same bits on every device (kernels/philox.h builds the normals from
// integer and exactly rounded double operations, each product that meets a sum an explicit
// fma), so the tolerance is none. Starts off a multiple of 4 (a Philox block split between
// calls) and past 2^32 · 4 (the counter's high word), two keys. ----
void add_random_normal_cases(Cases& cs) {
  for (const Length& l : kLengths)
    for (uint64_t first : {uint64_t(0), uint64_t(3), (uint64_t(1) << 34) + 5})
      for (uint64_t key : {uint64_t(0), uint64_t(0x9f1c2e3d4b5a6978)}) {
        Case c{
            "random_normal", "f32", length_shape(l) + cat(" first=", first, " key=", key), {}, {}};
        c.tensors = {out<float>("out", l.n, kExact)};
        c.tensors[0].offset = l.offset;
        const size_t n = l.n;
        c.run = [=](Device& d, const Args& a) {
          d.ops().random_normal(d.stream(), a.f32(0), 1, n, n, key, first, 0.02);
        };
        cs.push_back(std::move(c));
      }
  // The 2-D form (a rank's columns of a tensor, init_random's column splits): block (rows,
  // cols) of a tensor with rows ld apart, from `first` (its column). Beside matching the
  // reference, every element must have the bits of the whole tensor's element (r, first % ld +
  // c) as the CPU kernel's 1-D draw of the whole tensor gives it (the relation, on both
  // devices; the 1-D cases above tie that draw to the device's). Rows and columns off
  // multiples of 4, ld a multiple of 4 (one phase for every row) and not, one row, one column,
  // the counter's high word, a misaligned destination; short rows split among threads
  // (300 × 60 > kChunk) and rows longer than a chunk (17003) take the CPU's other paths.
  struct Block2d {
    size_t rows, cols, ld;
    uint64_t first;
    size_t offset;
  };
  const Block2d blocks[] = {{1, 19, 57, 3, 0},
                            {7, 1, 5, 2, 0},
                            {19, 13, 38, 21, 0},
                            {33, 111, 444, 111, 1},
                            {64, 24, 96, 48, 0},
                            {5, 9, 11, 2, 0},
                            {300, 60, 240, 121, 0},
                            {3, 17003, 34011, 17005, 0},
                            {4, 6, 20, (uint64_t(1) << 34) + 7, 0}};
  for (const Block2d& b : blocks) {
    const uint64_t key = 0x9f1c2e3d4b5a6978;
    const uint64_t first = b.first, col = first % b.ld;
    const size_t rows = b.rows, cols = b.cols, ld = b.ld;
    auto whole = std::make_shared<std::vector<float>>(rows * ld);  // (rows, ld)
    k::random_normal(whole->data(), rows * ld, key, first - col, 0.02);
    Case c{"random_normal",
           "f32",
           cat("rows=", rows, " cols=", cols, " ld=", ld, " first=", first,
               b.offset ? " misaligned" : ""),
           {},
           {}};
    c.tensors = {out<float>("out", rows * cols, kExact)};
    c.tensors[0].offset = b.offset;
    c.run = [=](Device& d, const Args& a) {
      d.ops().random_normal(d.stream(), a.f32(0), rows, cols, ld, key, first, 0.02);
    };
    c.relation = [=](const std::vector<std::vector<uint8_t>>& o) -> std::string {
      for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j)
          if (std::memcmp(&o[0][4 * (r * cols + j)], &(*whole)[r * ld + col + j], 4) != 0)
            return cat("out[", r, ", ", j, "] differs in bits from the whole tensor's element ",
                       first + r * ld + j);
      return "";
    };
    cs.push_back(std::move(c));
  }
}

// ---- Dropout and scaling: the same bits on every device (the mask is philox.h's integers, the
// factor one host-rounded float, each element one fp32 product rounded once). Beside matching
// the reference device, every output must equal a plain loop over the elements (no blocks, no
// threads: philox.h's word for (row, column), then x · s rounded), and a column slice at col0
// the columns of the CPU kernel's call on the whole matrix (what tensor-parallel ranks rely on).
// Shapes: one element, at a column off a Philox block; odd rows and columns; a misaligned view;
// rows longer than the CPU's OpenMP chunk of 4096 columns; many blocks on CUDA; a col0 past 2^34
// (the counter's high column word). p = 0 is the scaling alone (y = f·x, rounded once). ----
struct DropoutShape {
  size_t rows, cols, col0, offset;
};
const DropoutShape kDropoutShapes[] = {
    {1, 1, 0, 0}, {1, 1, 3, 0},        {19, 111, 0, 0},  {111, 19, 7, 1},
    {5, 9, 2, 0}, {3, 17003, 4101, 0}, {7, 10001, 0, 0}, {4, 33, (size_t(1) << 34) + 5, 0}};
constexpr uint64_t kDropoutKey = 0xd20b0e7a11c0ffeeull;

// dropout_scale one element at a time from philox.h: the reference every device's output must
// equal (x (rows, cols) is columns [col0, col0 + cols) of the matrix).
template <typename T>
std::vector<T> dropout_reference(const std::vector<T>& x, size_t rows, size_t cols, size_t col0,
                                 float p, float f, uint64_t key) {
  namespace px = k::philox;
  std::vector<T> y(x.size());
  const float s = px::dropout_factor(p, f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) {
      const uint64_t c = col0 + j;
      const bool kept =
          p == 0.0f || px::dropout_block(i, c / 4, key).w[c % 4] >= px::dropout_threshold(p);
      y[i * cols + j] = from_f32<T>(kept ? to_f32(x[i * cols + j]) * s : 0.0f);
    }
  return y;
}

// Empty when out (bytes of T) has want's bits, else the first element that differs.
template <typename T>
std::string same_bits_as(const std::vector<uint8_t>& out, const std::vector<T>& want,
                         const char* what) {
  for (size_t e = 0; e < want.size(); ++e)
    if (std::memcmp(&out[e * sizeof(T)], &want[e], sizeof(T)) != 0)
      return cat("y[", e, "] = ", to_f32(reinterpret_cast<const T*>(out.data())[e]),
                 " differs in bits from ", what, "'s ", to_f32(want[e]));
  return "";
}

template <typename T>
void dropout_case(Cases& cs, const DropoutShape& sh, float p, float f, bool in_place) {
  const size_t rows = sh.rows, cols = sh.cols, col0 = sh.col0, n = rows * cols;
  const auto x = uniform<T>(n, -3, 3, uint32_t(n * 13 + col0 % 1000 + size_t(p * 100)));
  auto want =
      std::make_shared<std::vector<T>>(dropout_reference(x, rows, cols, col0, p, f, kDropoutKey));
  // A column slice of a small enough matrix: the CPU kernel's call on the whole of it, columns
  // [0, col0 + cols + 5), holding x at [col0, col0 + cols) and other values around it.
  std::shared_ptr<std::vector<T>> wide;
  if (col0 > 0 && col0 < 10000) {
    const size_t ld = col0 + cols + 5;
    std::vector<T> wx = uniform<T>(rows * ld, -3, 3, uint32_t(ld)), wy(rows * ld);
    for (size_t i = 0; i < rows; ++i)
      std::memcpy(&wx[i * ld + col0], &x[i * cols], cols * sizeof(T));
    k::dropout_scale(wy.data(), wx.data(), rows, ld, 0, p, f, kDropoutKey);
    wide = std::make_shared<std::vector<T>>(n);
    for (size_t i = 0; i < rows; ++i)
      std::memcpy(&(*wide)[i * cols], &wy[i * ld + col0], cols * sizeof(T));
  }
  Case c{"dropout_scale",
         elem_name(elem_of<T>()),
         cat("rows=", rows, " cols=", cols, " col0=", col0, " p=", p, " f=", f,
             sh.offset ? " misaligned" : "", in_place ? " in place" : ""),
         {},
         {}};
  if (in_place) {
    c.tensors = {in("x", x), alias("y", elem_of<T>(), n, 0, kExact)};
  } else {
    c.tensors = {in("x", x), out<T>("y", n, kExact)};
    for (Tensor& t : c.tensors) t.offset = sh.offset;
  }
  // The key in device memory: its 8 bytes carried by an f64 input (the harness has no u64);
  // none when p = 0.
  c.tensors.push_back(in("key", std::vector<double>{std::bit_cast<double>(kDropoutKey)}));
  c.run = [=](Device& d, const Args& a) {
    const auto* key = reinterpret_cast<const uint64_t*>(a.f64(2));
    d.ops().dropout_scale(d.stream(), a.ref(1), a.cref(0), rows, cols, col0, p, f,
                          p == 0.0f ? nullptr : key);
  };
  c.relation = [=](const std::vector<std::vector<uint8_t>>& o) -> std::string {
    std::string broken = same_bits_as(o[0], *want, "the plain loop");
    if (broken.empty() && wide) broken = same_bits_as(o[0], *wide, "the whole matrix's call");
    return broken;
  };
  cs.push_back(std::move(c));
}

void add_dropout_scale_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const DropoutShape& sh : kDropoutShapes) {
      dropout_case<T>(cs, sh, 0.0f, 0.37f, false);  // the scaling alone
      dropout_case<T>(cs, sh, 0.1f, 2.0f, false);   // LoRA's usual p, α/r = 2
      dropout_case<T>(cs, sh, 0.5f, 0.37f, false);
    }
    for (const DropoutShape& sh : {kDropoutShapes[3], kDropoutShapes[6]})
      for (float p : {0.0f, 0.25f}) dropout_case<T>(cs, sh, p, 0.5f, true);
  });
}

// ---- NF4 (kernels/nf4.h): the same bits on every device (per element one fp32 quotient and
// fifteen comparisons, or one product; the absmax a max, in any order the same). Beside matching
// the reference device, every output must equal a plain loop over the elements written here from
// the contract (no blocks of work, no threads). Lengths: one element; odd ones below a block and
// past one; whole blocks; nb = 301 blocks (two scale groups, the second short); 70001; a
// misaligned view (the CUDA kernels' scalar path). Quantize's inputs are weight-like (sd 0.02);
// its "awkward" input holds a block of zeros, one with a NaN and an inf, one of values on and
// beside the midpoints (fp32: v exactly at the threshold), one of tiny values (subnormal absmax
// in fp32 and bf16), one whose quotients by 0.7 are the midpoints, then a tail of 5. ----
const Length kNf4Lengths[] = {{1, 0},   {19, 0},    {64, 0},    {111, 0},
                              {128, 0}, {19217, 0}, {70001, 0}, {111, 1}};

// The contract's quantization, element by element: absmax of each block, then the count of
// midpoints below v.
template <typename T>
std::pair<std::vector<uint8_t>, std::vector<float>> nf4_quantize_reference(
    const std::vector<T>& x) {
  const size_t n = x.size(), nb = k::nf4_blocks(n);
  std::vector<uint8_t> codes(k::nf4_code_bytes(n), 0);
  std::vector<float> absmax(nb, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(to_f32(x[i]));
    if (a > absmax[i / 64]) absmax[i / 64] = a;
  }
  for (size_t i = 0; i < n; ++i) {
    const float a = absmax[i / 64], v = a == 0.0f ? 0.0f : to_f32(x[i]) / a;
    unsigned c = 0;
    for (int m = 0; m < 15; ++m) c += v > (k::kNf4Codes[m] + k::kNf4Codes[m + 1]) * 0.5f;
    codes[i / 2] |= uint8_t(i % 2 ? c : c << 4);
  }
  return {codes, absmax};
}

template <typename T>
std::vector<T> nf4_awkward_input() {
  std::vector<float> v(5 * 64 + 5, 0.0f);  // block 0: zeros
  for (size_t j = 0; j < 64; ++j) v[64 + j] = 0.01f * float(int(j) - 30);
  v[64 + 3] = NAN, v[64 + 9] = INFINITY;  // block 1
  v[128] = -1.0f;                         // block 2: absmax 1, so v = x
  for (int m = 0; m < 15; ++m) {
    const float mid = k::kNf4Mids.v[m];
    v[129 + 4 * m] = mid;
    v[130 + 4 * m] = std::nextafter(mid, 2.0f);
    v[131 + 4 * m] = std::nextafter(mid, -2.0f);
  }
  for (size_t j = 0; j < 64; ++j) v[192 + j] = 1e-39f * float(int(j % 7) - 3);  // block 3
  // Block 4: absmax 0.7, and each x whose fp32 quotient x / 0.7 is a midpoint, with its
  // neighbours: a kernel dividing otherwise (x · (1 / a), say) lands elsewhere for some.
  const float a = 0.7f;
  v[256] = -a;
  for (int m = 0; m < 15; ++m) {
    float x = float(double(k::kNf4Mids.v[m]) * a);
    for (int step = 0; step < 8 && x / a != k::kNf4Mids.v[m]; ++step)
      x = std::nextafter(x, x / a < k::kNf4Mids.v[m] ? 2.0f : -2.0f);
    v[257 + 3 * size_t(m)] = x;
    v[258 + 3 * size_t(m)] = std::nextafter(x, 2.0f);
    v[259 + 3 * size_t(m)] = std::nextafter(x, -2.0f);
  }
  for (size_t j = 0; j < 5; ++j) v[320 + j] = 0.3f * float(j) - 0.5f;
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = from_f32<T>(v[i]);
  return r;
}

// Empty when out has want's bytes, else the first that differs.
std::string same_bytes_as(const std::vector<uint8_t>& out, const std::vector<uint8_t>& want,
                          const char* what) {
  for (size_t e = 0; e < want.size(); ++e)
    if (out[e] != want[e])
      return cat("byte ", e, " = ", int(out[e]), " differs from ", what, "'s ", int(want[e]));
  return "";
}

template <typename T>
void quantize_nf4_case(Cases& cs, const std::vector<T>& x, size_t offset, const std::string& what) {
  const size_t n = x.size();
  auto want = std::make_shared<std::pair<std::vector<uint8_t>, std::vector<float>>>(
      nf4_quantize_reference(x));
  Case c{"quantize_nf4", elem_name(elem_of<T>()), what, {}, {}};
  c.tensors = {in("x", x), out<uint8_t>("codes", k::nf4_code_bytes(n), kExact),
               out<float>("absmax", k::nf4_blocks(n), kExact)};
  for (Tensor& t : c.tensors) t.offset = offset;
  c.run = [=](Device& d, const Args& a) {
    d.ops().quantize_nf4(d.stream(), const_cast<uint8_t*>(a.u8(1)), a.f32(2), a.cref(0), n);
  };
  c.relation = [=](const std::vector<std::vector<uint8_t>>& o) -> std::string {
    std::string broken = same_bytes_as(o[0], want->first, "the plain loop");
    if (broken.empty()) broken = same_bits_as(o[1], want->second, "the plain loop");
    return broken;
  };
  cs.push_back(std::move(c));
}

void add_quantize_nf4_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const Length& l : kNf4Lengths)
      quantize_nf4_case(cs, normal<T>(l.n, 0.02f, uint32_t(l.n * 5 + l.offset)), l.offset,
                        length_shape(l));
    quantize_nf4_case(cs, nf4_awkward_input<T>(), 0,
                      "n=325: zeros, NaN and inf, midpoints, tiny values, quotients on midpoints");
  });
}

// The contract's dequantization, element by element.
template <typename T>
std::vector<T> nf4_dequantize_reference(const std::vector<uint8_t>& codes,
                                        const std::vector<uint8_t>& q,
                                        const std::vector<float>& scale, float mean, size_t n) {
  std::vector<T> y(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / 64;
    const float a = float(int8_t(q[b])) * scale[b / 256] / 127.0f + mean;
    const unsigned code = i % 2 ? codes[i / 2] & 15u : codes[i / 2] >> 4;
    y[i] = from_f32<T>(k::kNf4Codes[code] * a);
  }
  return y;
}

template <typename T>
void dequantize_nf4_case(Cases& cs, const Length& l, float mean) {
  const size_t n = l.n, nb = k::nf4_blocks(n);
  std::mt19937 g(uint32_t(n * 3 + l.offset));
  std::vector<uint8_t> codes(k::nf4_code_bytes(n)), q(nb);
  for (uint8_t& c : codes) c = uint8_t(g());
  for (uint8_t& c : q) c = uint8_t(int8_t(int(g() % 255) - 127));  // int8 in [−127, 127]
  const auto scale = uniform<float>(k::nf4_groups(nb), 1e-3f, 0.05f, uint32_t(n + 7));
  auto want =
      std::make_shared<std::vector<T>>(nf4_dequantize_reference<T>(codes, q, scale, mean, n));
  Case c{"dequantize_nf4", elem_name(elem_of<T>()), cat(length_shape(l), " mean=", mean), {}, {}};
  c.tensors = {in("codes", codes), in("qabsmax", q), in("scale", scale), out<T>("out", n, kExact)};
  for (Tensor& t : c.tensors) t.offset = l.offset;
  c.run = [=](Device& d, const Args& a) {
    d.ops().dequantize_nf4(d.stream(), a.ref(3), a.u8(0), reinterpret_cast<const int8_t*>(a.u8(1)),
                           a.f32(2), mean, n);
  };
  c.relation = [=](const std::vector<std::vector<uint8_t>>& o) -> std::string {
    return same_bits_as(o[0], *want, "the plain loop");
  };
  cs.push_back(std::move(c));
}

void add_dequantize_nf4_cases(Cases& cs) {
  for_each_dtype([&](auto t) {
    using T = decltype(t);
    for (const Length& l : kNf4Lengths) dequantize_nf4_case<T>(cs, l, 0.031f);
    dequantize_nf4_case<T>(cs, {19217, 0}, 0.0f);
  });
}

void add_sum_squares_cases(Cases& cs) {
  for (const Length& l : kLengths)
    for (double divisor : {1.0, 7.0}) {
      auto x = normal<float>(l.n, 1, uint32_t(l.n + 1));
      if (l.n > 19) x[l.n / 2] = 3e30f;  // x² overflows fp32: the sum must be in double
      // Both sides add n non-negative doubles in different orders: each within (n − 1)·u of
      // the exact sum (u = 2^-53), so within twice that of each other; the division and the
      // add to the start round once more each (test_reduce).
      const Tolerance tol{(2.0 * double(l.n) + 4.0) * std::ldexp(1.0, -53), 0, 0, false};
      Case c{"sum_squares", "f32", length_shape(l) + cat(" divisor=", divisor), {}, {}};
      c.tensors = {inout("acc", std::vector<double>{1.5}, tol), in("x", x)};
      c.tensors[1].offset = l.offset;
      const size_t n = l.n;
      c.run = [=](Device& d, const Args& a) {
        d.ops().sum_squares(d.stream(), a.f64(0), a.f32(1), n, divisor);
      };
      cs.push_back(std::move(c));
    }
}

// ---- AdamW ----
// m = β1·m + (1 − β1)·g cancels when the terms have opposite signs: bounded against their
// size; v likewise; a fused multiply-add on the GPU changes the last bit of a term (1e-6 is
// ~8 ulp). p moves by an lr-sized step from p ~ 1 and takes m's error scaled by the step:
// 1e-6 of |p| + lr. The compute copy is p rounded once more (test_adamw).
constexpr float kLr = 3e-3f, kBeta1 = 0.9f, kBeta2 = 0.95f, kAdamEps = 1e-8f, kWd = 0.1f;

template <typename T>
void adamw_case(Cases& cs, const Length& l, int64_t step, float grad_scale, bool copy) {
  const size_t n = l.n;
  const uint32_t s = uint32_t(n * 7 + l.offset + size_t(step));
  const auto p = uniform<float>(n, -1, 1, s), g = uniform<float>(n, -2, 2, s + 1);
  auto m = uniform<float>(n, -0.1f, 0.1f, s + 2), v = uniform<float>(n, 0, 0.01f, s + 3);
  if (step == 1) std::fill(m.begin(), m.end(), 0.f), std::fill(v.begin(), v.end(), 0.f);
  std::vector<double> m_scale(n), v_scale(n);
  for (size_t i = 0; i < n; ++i) {
    const double gi = double(g[i]) * grad_scale;
    m_scale[i] = std::fabs(kBeta1 * m[i]) + std::fabs((1 - kBeta1) * gi);
    v_scale[i] = kBeta2 * v[i] + (1 - kBeta2) * gi * gi;
  }
  const Tolerance p_tol{1e-6, 1e-6 * kLr, 0, false};
  Case c{"adamw_update",
         copy ? elem_name(elem_of<T>()) : "f32",
         cat(length_shape(l), " t=", step, " grad_scale=", grad_scale,
             copy ? " with the compute copy" : ""),
         {},
         {}};
  c.tensors = {inout("p", p, p_tol), in("g", g),
               inout("m", m, Tolerance{0, 1e-6, 0, false}, m_scale),
               inout("v", v, Tolerance{0, 1e-6, 0, false}, v_scale),
               copy ? out<T>("p_compute", n, Tolerance{1e-6, 1e-6 * kLr, is16<T> ? 1.0 : 0.0})
                    : null_out("p_compute", elem_of<T>())};
  for (Tensor& t : c.tensors) t.offset = l.offset;
  // The step's constants and grad_scale, read from device memory: seven floats.
  static_assert(sizeof(kernels::AdamwArgs) == 7 * sizeof(float));
  const kernels::AdamwArgs args{kernels::adamw_step(kLr, kBeta1, kBeta2, kAdamEps, kWd, step),
                                grad_scale};
  std::vector<float> args_f(7);
  std::memcpy(args_f.data(), &args, sizeof args);
  c.tensors.push_back(in("args", args_f));
  c.run = [=](Device& d, const Args& a) {
    d.ops().adamw_update(d.stream(), a.f32(0), a.f32(1), a.f32(2), a.f32(3), n,
                         reinterpret_cast<const kernels::AdamwArgs*>(a.f32(5)), a.ref(4));
  };
  cs.push_back(std::move(c));
}

void add_adamw_update_cases(Cases& cs) {
  for (const Length& l : kLengths) {
    adamw_case<float>(cs, l, 1, 1.0f, false);
    adamw_case<float>(cs, l, 1000, 0.5f, false);
  }
  for_each_dtype([&](auto t) {
    for (const Length& l : kLengths) adamw_case<decltype(t)>(cs, l, 10, 0.5f, true);
  });
}

}  // namespace

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  // One function per op of the list: a new op without add_<op>_cases does not compile.
#define FT_OP(name, family, params, args) add_##name##_cases(cases);
#include "runtime/op_list.h"
  return cases;
}

}  // namespace ft::op_test
