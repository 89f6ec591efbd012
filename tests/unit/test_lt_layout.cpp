// lib/runtime/cuda/lt_layout: the mapping of ft's row-major linear layers to cuBLASLt's
// column-major GEMM, checked without CUDA in two ways: the exact fields for known shapes, and a
// column-major interpreter that applies an LtProblem as cuBLASLt defines it (D = alpha·op(A)·
// op(B) + beta·C, layouts as stored, column stride ld) and must reproduce the row-major
// products at every mix of 1, 19 and 111. Inputs are small integers, so every product and sum
// is exact in float and the comparison is equality: no tolerance to hide a wrong mapping.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/cuda/lt_layout.h"

using ft::DType;
using namespace ft::cuda;

namespace {

// Integers in [-3, 3]: |sums| ≤ 111·9 + 999, exact in float.
std::vector<float> small_ints(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(g));
  return v;
}

// Element (i, j) of a column-major stored matrix.
float at(const LtMatrix& m, int64_t i, int64_t j) {
  return static_cast<const float*>(m.ptr)[i + j * m.ld];
}

// cuBLASLt's definition, for fp32 buffers, checking that the layouts fit m, n, k.
void interpret(const LtProblem& p) {
  const bool ta = p.transa == LtOp::kT, tb = p.transb == LtOp::kT;
  REQUIRE(p.A.rows == (ta ? p.k : p.m));
  REQUIRE(p.A.cols == (ta ? p.m : p.k));
  REQUIRE(p.B.rows == (tb ? p.n : p.k));
  REQUIRE(p.B.cols == (tb ? p.k : p.n));
  for (const LtMatrix* c : {&p.C, &p.D}) {
    REQUIRE(c->rows == p.m);
    REQUIRE(c->cols == p.n);
  }
  for (const LtMatrix* c : {&p.A, &p.B, &p.C, &p.D}) REQUIRE(c->ld >= c->rows);
  float* d = const_cast<float*>(static_cast<const float*>(p.D.ptr));
  std::vector<float> result(static_cast<size_t>(p.m * p.n));
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t i = 0; i < p.m; ++i) {
      float acc = 0;
      for (int64_t l = 0; l < p.k; ++l)
        acc += (ta ? at(p.A, l, i) : at(p.A, i, l)) * (tb ? at(p.B, j, l) : at(p.B, l, j));
      float v = p.alpha * acc;
      if (p.beta != 0.0f) v += p.beta * at(p.C, i, j);
      result[static_cast<size_t>(i + j * p.m)] = v;
    }
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t i = 0; i < p.m; ++i) d[i + j * p.D.ld] = result[static_cast<size_t>(i + j * p.m)];
}

LinearCall call_of(LinearGemm g, DType t, void* out, const void* a, const void* b, int N, int in,
                   int out_f, bool acc) {
  LinearCall c;
  c.gemm = g;
  c.dtype = t;
  c.out_ptr = out;
  c.a = a;
  c.b = b;
  c.N = N;
  c.in = in;
  c.out = out_f;
  c.accumulate = acc;
  return c;
}

}  // namespace

TEST_CASE("lt_layout: forward maps y = x·Wᵀ to yᵀ = op_T(W)·x, column-major") {
  float x[1], W[1], y[1];
  const LtProblem p =
      map_linear(call_of(LinearGemm::kForward, DType::kBF16, y, x, W, 19, 111, 1, false));
  CHECK(p.transa == LtOp::kT);
  CHECK(p.transb == LtOp::kN);
  CHECK(p.m == 1);
  CHECK(p.n == 19);
  CHECK(p.k == 111);
  CHECK(p.A.ptr == W);
  CHECK(p.A.rows == 111);  // W (out=1, in=111) row-major = (111, 1) column-major
  CHECK(p.A.cols == 1);
  CHECK(p.A.ld == 111);
  CHECK(p.B.ptr == x);
  CHECK(p.B.rows == 111);
  CHECK(p.B.cols == 19);
  CHECK(p.B.ld == 111);
  CHECK(p.D.ptr == y);
  CHECK(p.D.rows == 1);
  CHECK(p.D.cols == 19);
  CHECK(p.D.ld == 1);
  CHECK(p.C.ptr == y);
  for (const LtMatrix* m : {&p.A, &p.B, &p.C, &p.D}) CHECK(m->type == LtType::kBF16);
  CHECK(p.compute == LtCompute::k32F);
  CHECK(p.scale_type == LtType::kF32);
  CHECK(p.alpha == 1.0f);
  CHECK(p.beta == 0.0f);
  CHECK(map_linear(call_of(LinearGemm::kForward, DType::kBF16, y, x, W, 19, 111, 1, true)).beta ==
        1.0f);
}

TEST_CASE("lt_layout: a forward residual is C read apart from D, with D's layout") {
  const int N = 19, in = 111, out = 7;
  const std::vector<float> x = small_ints(size_t(N) * in, 1), W = small_ints(size_t(out) * in, 2),
                           r = small_ints(size_t(N) * out, 3);
  std::vector<float> y(size_t(N) * out, -99.0f);
  LinearCall c =
      call_of(LinearGemm::kForward, DType::kF32, y.data(), x.data(), W.data(), N, in, out, true);
  c.residual = r.data();
  const LtProblem p = map_linear(c);
  CHECK(p.D.ptr == y.data());
  CHECK(p.C.ptr == r.data());
  CHECK(p.C.rows == p.D.rows);
  CHECK(p.C.cols == p.D.cols);
  CHECK(p.C.ld == p.D.ld);
  CHECK(p.C.type == p.D.type);
  CHECK(p.beta == 1.0f);
  interpret(p);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      float want = r[size_t(n) * out + o];
      for (int i = 0; i < in; ++i) want += x[size_t(n) * in + i] * W[size_t(o) * in + i];
      CHECK(y[size_t(n) * out + o] == want);  // small integers: exact
    }
  // Only an accumulating forward product reads a residual.
  c.accumulate = false;
  CHECK_THROWS_AS(map_linear(c), ft::Error);
  c.accumulate = true;
  c.gemm = LinearGemm::kBackwardData;
  CHECK_THROWS_AS(map_linear(c), ft::Error);
}

TEST_CASE("lt_layout: dx = dy·W is W·dy column-major; dW is fp32 and always accumulates") {
  float dy[1], x[1], W[1], dx[1], dW[1];
  const LtProblem d =
      map_linear(call_of(LinearGemm::kBackwardData, DType::kF16, dx, dy, W, 19, 111, 7, false));
  CHECK(d.transa == LtOp::kN);
  CHECK(d.transb == LtOp::kN);
  CHECK(d.m == 111);
  CHECK(d.n == 19);
  CHECK(d.k == 7);
  CHECK(d.A.ptr == W);
  CHECK(d.B.ptr == dy);
  CHECK(d.B.ld == 7);
  CHECK(d.D.ld == 111);
  CHECK(d.D.type == LtType::kF16);
  CHECK(d.beta == 0.0f);

  const LtProblem w =
      map_linear(call_of(LinearGemm::kBackwardWeight, DType::kF16, dW, dy, x, 19, 111, 7, false));
  CHECK(w.transa == LtOp::kN);
  CHECK(w.transb == LtOp::kT);
  CHECK(w.m == 111);
  CHECK(w.n == 7);
  CHECK(w.k == 19);
  CHECK(w.A.ptr == x);
  CHECK(w.A.type == LtType::kF16);
  CHECK(w.B.ptr == dy);
  CHECK(w.B.rows == 7);
  CHECK(w.B.cols == 19);
  CHECK(w.D.ptr == dW);
  CHECK(w.C.ptr == dW);
  CHECK(w.D.type == LtType::kF32);  // fp32 weight gradients in every precision
  CHECK(w.C.type == LtType::kF32);
  CHECK(w.beta == 1.0f);  // += even though accumulate was false: dW sums over micro-batches
}

TEST_CASE("lt_layout: TF32 only for fp32 inputs and only when allowed") {
  float buf[1];
  LinearCall c = call_of(LinearGemm::kForward, DType::kF32, buf, buf, buf, 1, 1, 1, false);
  CHECK(map_linear(c).compute == LtCompute::k32F);
  c.allow_tf32 = true;
  CHECK(map_linear(c).compute == LtCompute::k32FFastTF32);
  c.dtype = DType::kBF16;
  CHECK(map_linear(c).compute == LtCompute::k32F);
  c.dtype = DType::kF16;
  CHECK(map_linear(c).compute == LtCompute::k32F);
}

TEST_CASE("lt_layout: refuses non-compute dtypes and negative sizes, naming the product") {
  float buf[1];
  LinearCall c = call_of(LinearGemm::kBackwardData, DType::kI32, buf, buf, buf, 1, 1, 1, false);
  CHECK_THROWS_WITH_AS(map_linear(c), doctest::Contains("backward dx"), ft::Error);
  c.dtype = DType::kF32;
  c.in = -1;
  CHECK_THROWS_WITH_AS(map_linear(c), doctest::Contains("negative size"), ft::Error);
}

TEST_CASE("lt_layout: the column-major problems reproduce the row-major products") {
  const int sizes[] = {1, 19, 111};
  uint32_t seed = 1;
  for (int N : sizes)
    for (int in : sizes)
      for (int out : sizes)
        for (bool acc : {false, true}) {
          CAPTURE(N);
          CAPTURE(in);
          CAPTURE(out);
          CAPTURE(acc);
          const auto x = small_ints(size_t(N) * in, seed++);
          const auto W = small_ints(size_t(out) * in, seed++);
          const auto dy = small_ints(size_t(N) * out, seed++);
          const auto y0 = small_ints(size_t(N) * out, seed++);
          const auto dx0 = small_ints(size_t(N) * in, seed++);
          const auto dW0 = small_ints(size_t(out) * in, seed++);

          // Row-major references, written from kernels.h's definitions.
          std::vector<float> y_ref(y0), dx_ref(dx0), dW_ref(dW0);
          for (int r = 0; r < N; ++r)
            for (int o = 0; o < out; ++o) {
              float s = 0;
              for (int i = 0; i < in; ++i) s += x[r * in + i] * W[o * in + i];
              y_ref[r * out + o] = (acc ? y0[r * out + o] : 0.0f) + s;
            }
          for (int r = 0; r < N; ++r)
            for (int i = 0; i < in; ++i) {
              float s = 0;
              for (int o = 0; o < out; ++o) s += dy[r * out + o] * W[o * in + i];
              dx_ref[r * in + i] = (acc ? dx0[r * in + i] : 0.0f) + s;
            }
          for (int o = 0; o < out; ++o)
            for (int i = 0; i < in; ++i) {
              float s = 0;
              for (int r = 0; r < N; ++r) s += dy[r * out + o] * x[r * in + i];
              dW_ref[o * in + i] = dW0[o * in + i] + s;
            }

          std::vector<float> y(y0), dx(dx0), dW(dW0);
          interpret(map_linear(call_of(LinearGemm::kForward, DType::kF32, y.data(), x.data(),
                                       W.data(), N, in, out, acc)));
          interpret(map_linear(call_of(LinearGemm::kBackwardData, DType::kF32, dx.data(), dy.data(),
                                       W.data(), N, in, out, acc)));
          interpret(map_linear(call_of(LinearGemm::kBackwardWeight, DType::kF32, dW.data(),
                                       dy.data(), x.data(), N, in, out, acc)));
          REQUIRE(y == y_ref);
          REQUIRE(dx == dx_ref);
          REQUIRE(dW == dW_ref);
        }
}

TEST_CASE("lt_layout: map_gemm reproduces row-major products with transposes and padded lds") {
  // One matrix of a batch (the interpreter runs one); the batch fields are checked separately.
  const int M = 7, N = 19, K = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      GemmCall g;
      g.M = M, g.N = N, g.K = K;
      g.lda = (ta ? M : K) + 2, g.ldb = (tb ? K : N) + 3, g.ldc = N + 1;
      const auto A = small_ints(size_t((ta ? K : M) * g.lda), 1);
      const auto B = small_ints(size_t((tb ? N : K) * g.ldb), 2);
      std::vector<float> C(size_t(M * g.ldc), 42.0f);
      g.a = A.data(), g.trans_a = ta;
      g.b = B.data(), g.trans_b = tb;
      g.c = C.data();
      g.alpha = 2.0f;
      interpret(map_gemm(g));
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < g.ldc; ++c) {
          float want = 42.0f;  // the padding column keeps its value
          if (c < N) {
            want = 0;
            for (int l = 0; l < K; ++l)
              want += (ta ? A[size_t(l * g.lda + r)] : A[size_t(r * g.lda + l)]) *
                      (tb ? B[size_t(c * g.ldb + l)] : B[size_t(l * g.ldb + c)]);
            want *= 2.0f;
          }
          CHECK(C[size_t(r * g.ldc + c)] == want);
        }
    }
}

TEST_CASE("lt_layout: map_gemm carries batch strides to the right operands, and checks") {
  GemmCall g;
  g.in = DType::kBF16, g.out = DType::kF32;
  g.M = 3, g.N = 4, g.K = 2, g.batch = 5;
  g.lda = 2, g.stride_a = 100;
  g.ldb = 4, g.stride_b = 200;
  g.ldc = 4, g.stride_c = 300;
  const LtProblem p = map_gemm(g);
  // cuBLASLt's A is our B and its B our A (Cᵀ = op(B)ᵀ · op(A)ᵀ).
  CHECK(p.A.batch == 5);
  CHECK(p.A.batch_stride == 200);
  CHECK(p.B.batch_stride == 100);
  CHECK(p.D.batch_stride == 300);
  CHECK(p.C.batch_stride == 300);
  CHECK(p.A.type == LtType::kBF16);
  CHECK(p.D.type == LtType::kF32);
  g.batch = 1;
  CHECK(map_gemm(g).A.batch_stride == 0);  // unbatched: no stride attribute to set

  GemmCall bad = g;
  bad.out = DType::kF16;  // bf16 inputs may write bf16 or fp32, not f16
  CHECK_THROWS_WITH_AS(map_gemm(bad), doctest::Contains("output type"), ft::Error);
  bad = g;
  bad.lda = 1;  // shorter than a row of K = 2
  CHECK_THROWS_WITH_AS(map_gemm(bad), doctest::Contains("row stride shorter"), ft::Error);
  bad = g;
  bad.batch = 0;
  CHECK_THROWS_WITH_AS(map_gemm(bad), doctest::Contains("batch 0"), ft::Error);
}
