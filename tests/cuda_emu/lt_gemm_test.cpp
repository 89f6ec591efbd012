// lib/runtime/cuda/lt_gemm through the emulated cuBLASLt (tests/cuda_emu/cublaslt_emu: a test
// tool that reads the descriptors as cuBLASLt defines them; emulation, no claim about a GPU)
// against the CPU reference kernels::linear_forward / linear_backward<float> on the same
// rounded inputs: fp32, bf16, f16, every mix of N, in, out in {1, 19, 111}, with and without
// accumulation, on aligned buffers and on views one element in. A wrong mapping (a swapped
// transpose, a wrong ld) fails these by O(1).
//
// The same file, built with FT_LT_GEMM_GPU against the real cuBLASLt and CUDA runtime
// (lt_gemm_gpu_tests, for the GPU machine), runs the sweeps on the GPU: buffers then live in
// device memory (Buffer below) and the emulator-only cases are left out.
//
// Tolerance per element, with r the fp32 reference, A = Σ|terms| (with the old output when
// accumulating) and K the inner dimension, as tests/unit/test_gemm16.cpp:
//   |out − r| ≤ u_T·|r| + h_T + (1 + u_T)·2(K + 1)·2^-24·A
// u_T·|r| is the one rounding of the output to T (half an ulp: 2^-8 bf16, 2^-11 f16, 0 for
// fp32 outputs); h_T is that rounding below T's normal range, where the spacing is absolute
// (half the smallest subnormal: 2^-25 f16, 2^-134 bf16; f16 outputs of small sums land there);
// the last term bounds two fp32 sums of K + 1 terms added in different orders (the emulator in
// index order, OpenBLAS in blocks, a GPU in tiles). A lost or doubled term moves a sum by ~A/K,
// far above 2(K + 1)·2^-24·A for K ≤ 111.
#include "runtime/cuda/lt_gemm.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/kernels.h"
#ifdef FT_LT_GEMM_GPU
#include <cuda_runtime.h>
#else
#include "tests/cuda_emu/cublaslt_emu.h"
#endif

namespace k = ft::kernels;
using ft::DType;
using ft::cuda::LtGemm;

namespace {

// `n` elements of T where lt_gemm reads and writes them, starting `offset` elements into the
// allocation (offset 1 makes a view aligned to only the element size). Emulated build: host
// memory; GPU build: device memory.
template <typename T>
class Buffer {
 public:
  Buffer(const std::vector<T>& host, size_t offset) : n_(host.size()), offset_(offset) {
#ifdef FT_LT_GEMM_GPU
    REQUIRE(cudaMalloc(&base_, (n_ + offset_) * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(base_ + offset_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) ==
            cudaSuccess);
#else
    storage_.resize(n_ + offset_);
    std::copy(host.begin(), host.end(), storage_.begin() + offset_);
    base_ = storage_.data();
#endif
  }
  ~Buffer() {
#ifdef FT_LT_GEMM_GPU
    cudaFree(base_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() { return base_ + offset_; }
  std::vector<T> download() const {
    std::vector<T> h(n_);
#ifdef FT_LT_GEMM_GPU
    REQUIRE(cudaMemcpy(h.data(), base_ + offset_, n_ * sizeof(T), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
#else
    std::copy(storage_.begin() + offset_, storage_.end(), h.begin());
#endif
    return h;
  }

 private:
  size_t n_, offset_;
  T* base_ = nullptr;
#ifndef FT_LT_GEMM_GPU
  std::vector<T> storage_;
#endif
};

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, ft::bf16>) return DType::kBF16;
  return DType::kF16;
}

// Half the smallest subnormal of T: the rounding error of outputs below T's normal range.
template <typename T>
double subnormal_half_step() {
  if constexpr (std::is_same_v<T, float>) return 0.0;
  if constexpr (std::is_same_v<T, ft::bf16>) return std::ldexp(1.0, -134);
  return std::ldexp(1.0, -25);
}

template <typename T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, float>) return 0.0;
  if constexpr (std::is_same_v<T, ft::bf16>) return 1.0 / 256;
  return 1.0 / 2048;
}

// Values in [-1, 1] rounded to T, and their exact fp32 widening for the reference.
template <typename T>
struct Operand {
  std::vector<T> t;
  std::vector<float> f;
};

template <typename T>
Operand<T> make(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  Operand<T> o;
  o.t.resize(n);
  o.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    o.t[i] = ft::from_f32<T>(d(g));
    o.f[i] = ft::to_f32(o.t[i]);
  }
  return o;
}

// Σ|terms| of each output of P (rows, K) · Q (K, cols) given as element accessors, plus |old|.
template <typename PA, typename QA>
std::vector<double> abs_sums(int rows, int cols, int K, PA p, QA q, const float* old) {
  std::vector<double> s(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      double a = old ? std::fabs(old[size_t(i) * cols + j]) : 0.0;
      for (int l = 0; l < K; ++l) a += std::fabs(double(p(i, l)) * q(l, j));
      s[size_t(i) * cols + j] = a;
    }
  return s;
}

template <typename T>
void check_close(const char* what, const std::vector<T>& got, const std::vector<float>& ref,
                 const std::vector<double>& abs_sum, int K, double u, double h) {
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = ft::to_f32(got[i]), r = ref[i];
    const double tol =
        u * std::fabs(r) + h + (1 + u) * 2.0 * (K + 1) * std::ldexp(1.0, -24) * abs_sum[i];
    if (!(std::fabs(g - r) <= tol)) {
      if (bad == 0) worst = g - r;
      ++bad;
    }
  }
  INFO(std::string(what) << ": " << bad << " of " << got.size()
                         << " outside the bound, first off by " << worst);
  CHECK(bad == 0);
}

template <typename T>
void compare_with_cpu(LtGemm& lt, int N, int in, int out, bool acc, size_t offset, uint32_t seed) {
  CAPTURE(offset);
  CAPTURE(N);
  CAPTURE(in);
  CAPTURE(out);
  CAPTURE(acc);
  const double u = unit_roundoff<T>(), h = subnormal_half_step<T>();
  const auto x = make<T>(size_t(N) * in, seed);
  const auto W = make<T>(size_t(out) * in, seed + 1);
  const auto dy = make<T>(size_t(N) * out, seed + 2);
  const auto y0 = make<T>(size_t(N) * out, seed + 3);
  const auto dx0 = make<T>(size_t(N) * in, seed + 4);
  std::vector<float> dW0 = make<float>(size_t(out) * in, seed + 5).f;

  // The CPU reference on the widened inputs.
  std::vector<float> y_ref = y0.f, dx_ref = dx0.f, dW_ref = dW0;
  k::linear_forward<float>(y_ref.data(), x.f.data(), W.f.data(), N, in, out, acc);
  k::linear_backward<float>(dx_ref.data(), dW_ref.data(), dy.f.data(), x.f.data(), W.f.data(), N,
                            in, out, acc);

  Buffer<T> x_d(x.t, offset), W_d(W.t, offset), dy_d(dy.t, offset), y_d(y0.t, offset),
      dx_d(dx0.t, offset);
  Buffer<float> dW_d(dW0, offset);
  const DType t = dtype_of<T>();
  lt.linear_forward(y_d.get(), x_d.get(), W_d.get(), t, N, in, out, acc, nullptr);
  lt.linear_backward(dx_d.get(), dW_d.get(), dy_d.get(), x_d.get(), W_d.get(), t, N, in, out, acc,
                     nullptr);
  const std::vector<T> y = y_d.download(), dx = dx_d.download();
  const std::vector<float> dW = dW_d.download();

  const auto& xf = x.f;
  const auto& Wf = W.f;
  const auto& dyf = dy.f;
  check_close(
      "y", y, y_ref,
      abs_sums(
          N, out, in, [&](int r, int l) { return xf[size_t(r) * in + l]; },
          [&](int l, int o) { return Wf[size_t(o) * in + l]; }, acc ? y0.f.data() : nullptr),
      in, u, h);
  check_close(
      "dx", dx, dx_ref,
      abs_sums(
          N, in, out, [&](int r, int l) { return dyf[size_t(r) * out + l]; },
          [&](int l, int i) { return Wf[size_t(l) * in + i]; }, acc ? dx0.f.data() : nullptr),
      out, u, h);
  check_close("dW", dW, dW_ref,
              abs_sums(
                  out, in, N, [&](int o, int l) { return dyf[size_t(l) * out + o]; },
                  [&](int l, int i) { return xf[size_t(l) * in + i]; }, dW0.data()),
              N, 0.0, 0.0);  // dW is fp32: no output rounding
}

// runtime.gemm_algos: measure's LtChoice, timed as the CUDA ops time it (events around the work,
// device scratch) on the GPU, with the host's clock and memory under the emulation (whose calls
// complete at once). `record`: the file of choices, "" none.
ft::cuda::LtChoice measuring(std::string record = "") {
  ft::cuda::LtChoice c;
  c.measure = true;
  c.record = std::move(record);
  c.device = "the test's GPU";
#ifdef FT_LT_GEMM_GPU
  c.time_ms = [](void* s, const std::function<void()>& work) {
    cudaEvent_t a, b;
    REQUIRE(cudaEventCreate(&a) == cudaSuccess);
    REQUIRE(cudaEventCreate(&b) == cudaSuccess);
    REQUIRE(cudaEventRecord(a, static_cast<cudaStream_t>(s)) == cudaSuccess);
    work();
    REQUIRE(cudaEventRecord(b, static_cast<cudaStream_t>(s)) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(b) == cudaSuccess);
    float ms = 0;
    REQUIRE(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms;
  };
  c.alloc = [](size_t n) -> void* {
    void* p = nullptr;
    return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
  };
  c.free = [](void* p, size_t) { cudaFree(p); };
  c.copy = [](void* d, const void* src, size_t n, void* s) {
    REQUIRE(cudaMemcpyAsync(d, src, n, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)) ==
            cudaSuccess);
  };
#else
  c.time_ms = [](void*, const std::function<void()>& work) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  c.alloc = [](size_t n) { return ::operator new(n); };
  c.free = [](void* p, size_t) { ::operator delete(p); };
  c.copy = [](void* d, const void* src, size_t n, void*) { std::memcpy(d, src, n); };
#endif
  return c;
}

// Every product of the sweep below against the CPU; with `measure`, through algorithms timed
// among the heuristic's candidates (an accumulating output put back between the tries: one not
// restored fails the += cases by the size of the old output).
template <typename T>
void sweep(bool measure = false) {
#ifdef FT_LT_GEMM_GPU
  int dev = 0, major = 0;
  REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess);
  Buffer<unsigned char> workspace(std::vector<unsigned char>(ft::cuda::lt_workspace_bytes(major)),
                                  0);
  const size_t workspace_bytes = ft::cuda::lt_workspace_bytes(major);
#else
  Buffer<unsigned char> workspace(
      std::vector<unsigned char>(ft::cuda_emu::kCublasLtEmuWorkspaceBytes), 0);
  const size_t workspace_bytes = ft::cuda_emu::kCublasLtEmuWorkspaceBytes;
#endif
  LtGemm lt(workspace.get(), workspace_bytes, /*allow_tf32=*/false,
            measure ? measuring() : ft::cuda::LtChoice{});
  const int sizes[] = {1, 19, 111};
  uint32_t seed = 7;
  for (size_t offset : {0, 1})
    for (int N : sizes)
      for (int in : sizes)
        for (int out : sizes)
          for (bool acc : {false, true})
            compare_with_cpu<T>(lt, N, in, out, acc, offset, seed += 10);
}

// A strided-batched row-major product (lt_gemm.h gemm, the form attention uses) against a
// naive loop: every transpose pair, padded row strides, strides between the matrices of a batch
// larger than one matrix, output in T or fp32, with and without accumulation.
template <typename T, typename Out>
void batched_case(LtGemm& lt, bool ta, bool tb, bool acc, uint32_t seed) {
  const int M = 7, N = 19, K = 5, batch = 3;
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
  const int64_t sa = (ta ? K : M) * lda + 5, sb = (tb ? N : K) * ldb + 1, sc = M * ldc + 4;
  CAPTURE(ta);
  CAPTURE(tb);
  CAPTURE(acc);
  const auto A = make<T>(size_t(sa) * batch, seed);
  const auto B = make<T>(size_t(sb) * batch, seed + 1);
  const auto C0 = make<Out>(size_t(sc) * batch, seed + 2);
  const float alpha = 0.5f;
  std::vector<float> ref = C0.f;
  std::vector<double> abs_sum(ref.size(), 0.0);
  for (int i = 0; i < batch; ++i)
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) {
        double sum = 0, asum = 0;
        for (int l = 0; l < K; ++l) {
          const double a = A.f[size_t(i * sa + (ta ? l * lda + r : r * lda + l))];
          const double b = B.f[size_t(i * sb + (tb ? c * ldb + l : l * ldb + c))];
          sum += a * b;
          asum += std::fabs(a * b);
        }
        const size_t o = size_t(i * sc + r * ldc + c);
        ref[o] = float(alpha * sum + (acc ? ref[o] : 0.0));
        abs_sum[o] = alpha * asum + (acc ? std::fabs(C0.f[o]) : 0.0);
      }
  Buffer<T> A_d(A.t, 0), B_d(B.t, 0);
  Buffer<Out> C_d(C0.t, 0);
  ft::cuda::GemmCall g;
  g.in = dtype_of<T>();
  g.out = dtype_of<Out>();
  g.M = M, g.N = N, g.K = K, g.batch = batch;
  g.a = A_d.get(), g.lda = lda, g.stride_a = sa, g.trans_a = ta;
  g.b = B_d.get(), g.ldb = ldb, g.stride_b = sb, g.trans_b = tb;
  g.c = C_d.get(), g.ldc = ldc, g.stride_c = sc;
  g.alpha = alpha;
  g.beta = acc ? 1.0f : 0.0f;
  g.what = "batched test";
  lt.gemm(g, nullptr);
  std::vector<Out> got = C_d.download();
  // Padding between and beside the matrices must be left as it was.
  for (size_t o = 0; o < got.size(); ++o) {
    const size_t in_batch = o % size_t(sc), r = in_batch / size_t(ldc), c = in_batch % size_t(ldc);
    if (r >= size_t(M) || c >= size_t(N)) {
      ref[o] = C0.f[o];
      abs_sum[o] = 0;
    }
  }
  check_close("batched C", got, ref, abs_sum, K, unit_roundoff<Out>(), subnormal_half_step<Out>());
}

template <typename T>
void batched_sweep() {
  std::vector<unsigned char> host_ws(256);
  Buffer<unsigned char> workspace(host_ws, 0);
  LtGemm lt(workspace.get(), 0, /*allow_tf32=*/false);
  uint32_t seed = 101;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool acc : {false, true}) {
        batched_case<T, T>(lt, ta, tb, acc, seed += 10);
        batched_case<T, float>(lt, ta, tb, acc, seed += 10);
      }
}

}  // namespace

TEST_CASE("lt_gemm_cuda_emu: strided-batched products with transposes and padding") {
  batched_sweep<float>();
  batched_sweep<ft::bf16>();
  batched_sweep<ft::f16>();
}

TEST_CASE("lt_gemm_cuda_emu: the cuBLASLt workspace follows NVIDIA's recommendation") {
  CHECK(ft::cuda::lt_workspace_bytes(8) == size_t{4} << 20);   // Ampere
  CHECK(ft::cuda::lt_workspace_bytes(9) == size_t{32} << 20);  // Hopper
}

TEST_CASE("lt_gemm_cuda_emu: fp32 linear layers equal the CPU reference") { sweep<float>(); }
TEST_CASE("lt_gemm_cuda_emu: bf16 linear layers equal the CPU reference") { sweep<ft::bf16>(); }
TEST_CASE("lt_gemm_cuda_emu: f16 linear layers equal the CPU reference") { sweep<ft::f16>(); }
TEST_CASE("lt_gemm_cuda_emu: measured algorithms give the CPU reference too") {
  sweep<float>(/*measure=*/true);
  sweep<ft::bf16>(/*measure=*/true);
}

#ifndef FT_LT_GEMM_GPU  // the rest reads the emulator's counters or runs host buffers

TEST_CASE("lt_gemm_cuda_emu: the heuristic runs once per problem; null outputs are skipped") {
  std::vector<unsigned char> workspace(ft::cuda_emu::kCublasLtEmuWorkspaceBytes);
  LtGemm lt(workspace.data(), workspace.size(), false);
  const int N = 19, in = 111, out = 19;
  // One spare element each, for the misaligned views below.
  alignas(256) static ft::bf16 x[N * in + 1], W[out * in], y[N * out + 1], dy[N * out], dx[N * in];
  alignas(256) static float dW[out * in];
  const auto before = ft::cuda_emu::cublaslt_emu_stats();
  for (int step = 0; step < 3; ++step) {
    lt.linear_forward(y, x, W, DType::kBF16, N, in, out, false, nullptr);
    lt.linear_forward(y, x, W, DType::kBF16, N, in, out, true, nullptr);  // beta differs
    lt.linear_backward(dx, dW, dy, x, W, DType::kBF16, N, in, out, false, nullptr);
  }
  const auto after = ft::cuda_emu::cublaslt_emu_stats();
  CHECK(lt.cached_problems() == 4);
  CHECK(after.heuristic_queries - before.heuristic_queries == 4);
  CHECK(after.matmuls - before.matmuls == 12);

  // Only dW: one more matmul, no new problem.
  lt.linear_backward(nullptr, dW, dy, x, W, DType::kBF16, N, in, out, false, nullptr);
  CHECK(ft::cuda_emu::cublaslt_emu_stats().matmuls - after.matmuls == 1);
  CHECK(lt.cached_problems() == 4);

  // The same shape on 2-byte aligned views is a new problem (an algorithm chosen for 256-byte
  // alignment may not run on it: the emulator refuses that, see below), and it runs.
  lt.linear_forward(y + 1, x + 1, W, DType::kBF16, N, in, out, false, nullptr);
  CHECK(lt.cached_problems() == 5);
  lt.linear_forward(y + 1, x + 1, W, DType::kBF16, N, in, out, false, nullptr);
  CHECK(lt.cached_problems() == 5);
}

TEST_CASE("lt_gemm_cuda_emu: a residual read apart from y is the in-place product's problem") {
  std::vector<unsigned char> workspace(ft::cuda_emu::kCublasLtEmuWorkspaceBytes);
  LtGemm lt(workspace.data(), workspace.size(), false);
  const int N = 19, in = 111, out = 37;
  alignas(256) static ft::bf16 x[N * in], W[out * in], r[N * out], y[N * out], y_acc[N * out];
  std::mt19937 g(7);
  std::uniform_real_distribution<float> d(-1, 1);
  auto fill = [&](ft::bf16* a, size_t n) {
    for (size_t i = 0; i < n; ++i) a[i] = ft::to_bf16(d(g));
  };
  fill(x, size_t(N) * in);
  fill(W, size_t(out) * in);
  fill(r, size_t(N) * out);
  // r copied into y_acc then accumulated, as the model did; then y = r + x·Wᵀ out of place.
  std::memcpy(y_acc, r, sizeof r);
  lt.linear_forward(y_acc, x, W, DType::kBF16, N, in, out, true, nullptr);
  CHECK(lt.cached_problems() == 1);
  lt.linear_forward_residual(y, r, x, W, DType::kBF16, N, in, out, nullptr);
  CHECK(lt.cached_problems() == 1);  // r aligned as y_acc: the same algorithm
  CHECK(std::memcmp(y, y_acc, sizeof y) == 0);
  // In place (r is y) is linear_forward's +=.
  std::memcpy(y, r, sizeof r);
  lt.linear_forward_residual(y, y, x, W, DType::kBF16, N, in, out, nullptr);
  CHECK(std::memcmp(y, y_acc, sizeof y) == 0);
  CHECK(lt.cached_problems() == 1);
  // An empty sum would be a copy of r into y, which the GEMM does not do.
  CHECK_THROWS_WITH_AS(lt.linear_forward_residual(y, r, x, W, DType::kBF16, N, 0, out, nullptr),
                       doctest::Contains("residual apart from the output"), ft::Error);
}

// The record of measured choices (lt_gemm.h LtChoice), in a fresh folder per case.
struct RecordDir {
  std::filesystem::path dir;
  RecordDir() {
    dir = std::filesystem::temp_directory_path() /
          ("ft_lt_record_" + std::to_string(::getpid()) + "_" + std::to_string(next++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);  // the run's folder; gemm_algos/ is lt_gemm's
  }
  ~RecordDir() { std::filesystem::remove_all(dir); }
  std::string file() const { return (dir / "gemm_algos" / "rank_00000.txt").string(); }
  static inline int next = 0;
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines,
                 bool torn = false) {
  std::ofstream out(path, std::ios::trunc);
  for (size_t i = 0; i < lines.size(); ++i)
    out << lines[i] << (torn && i + 1 == lines.size() ? "" : "\n");
}

// Word `w` of a record line's algorithm set to `v` (hex words after the ':').
std::string with_algo_word(const std::string& line, int w, const char* v) {
  std::istringstream in(line.substr(line.find(':') + 1));
  std::vector<std::string> words;
  for (std::string x; in >> x;) words.push_back(x);
  words[size_t(w)] = v;
  std::string out = line.substr(0, line.find(':') + 1);
  for (const std::string& x : words) out += " " + x;
  return out;
}

// Three problems of one layer (forward, dx, dW) and their outputs' bytes.
struct Layer {
  static constexpr int N = 19, in = 111, out = 37;
  alignas(256) ft::bf16 x[N * in], W[out * in], dy[N * out];
  Layer() {
    std::mt19937 g(11);
    std::uniform_real_distribution<float> d(-1, 1);
    auto fill = [&](ft::bf16* a, size_t n) {
      for (size_t i = 0; i < n; ++i) a[i] = ft::to_bf16(d(g));
    };
    fill(x, size_t(N) * in);
    fill(W, size_t(out) * in);
    fill(dy, size_t(N) * out);
  }
  std::vector<unsigned char> run(LtGemm& lt) {
    alignas(256) static ft::bf16 y[N * out], dx[N * in];
    alignas(256) static float dW[out * in];
    std::fill(std::begin(dW), std::end(dW), 0.5f);  // += onto something
    lt.linear_forward(y, x, W, DType::kBF16, N, in, out, false, nullptr);
    lt.linear_backward(dx, dW, dy, x, W, DType::kBF16, N, in, out, false, nullptr);
    std::vector<unsigned char> bytes(sizeof y + sizeof dx + sizeof dW);
    std::memcpy(bytes.data(), y, sizeof y);
    std::memcpy(bytes.data() + sizeof y, dx, sizeof dx);
    std::memcpy(bytes.data() + sizeof y + sizeof dx, dW, sizeof dW);
    return bytes;
  }
};

TEST_CASE("lt_gemm_cuda_emu: the emulator's algorithms round differently; AlgoCheck knows them") {
  cublasLtHandle_t h;
  REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  // A (1 x 64) · B (64 x 1): one sum, 1 then 2^-24 at every odd index. In k order each 2^-24
  // is a tie that rounds back to 1; a part of k summed from zero keeps them.
  const int K = 64;
  cublasLtMatrixLayout_t a, b, d, other;
  REQUIRE(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 1, K, 1) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, K, 1, K) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, 1, 1, 1) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&other, CUDA_R_32F, 2, 1, 2) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r[8];
  int found = 0;
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref, 8, r, &found) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == ft::cuda_emu::kCublasLtEmuAlgos);
  alignas(256) static float A[K], B[K], y[1];  // 256 bytes: the heuristic's default alignment
  for (int i = 0; i < K; ++i) {
    A[i] = i == 0 ? 1.0f : std::ldexp(1.0f, -24) * float(i % 2);
    B[i] = 1.0f;
  }
  std::vector<float> sums;
  for (int v = 0; v < found; ++v) {
    const float one = 1, zero = 0;
    REQUIRE(cublasLtMatmul(h, desc, &one, A, a, B, b, &zero, y, d, y, d, &r[v].algo, nullptr, 0,
                           nullptr) == CUBLAS_STATUS_SUCCESS);
    const float sum = y[0];
    sums.push_back(sum);
    cublasLtMatmulHeuristicResult_t checked;
    CHECK(cublasLtMatmulAlgoCheck(h, desc, a, b, d, d, &r[v].algo, &checked) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulAlgoCheck(h, desc, a, b, other, other, &r[v].algo, &checked) ==
          CUBLAS_STATUS_INVALID_VALUE);
  }
  CHECK(sums[0] == 1.0f);
  CHECK(sums[1] > 1.0f);
  CHECK(sums[2] > 1.0f);
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {a, b, d, other}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

TEST_CASE("lt_gemm_cuda_emu: measured choices are recorded, and a second run takes them") {
  std::vector<unsigned char> workspace(ft::cuda_emu::kCublasLtEmuWorkspaceBytes);
  RecordDir rd;
  Layer layer;
  std::vector<unsigned char> first;
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    first = layer.run(lt);
    CHECK(lt.measured_problems() == 3);
    CHECK(lt.recorded_problems() == 0);
  }
  std::vector<std::string> lines = lines_of(rd.file());
  REQUIRE(lines.size() == 5);  // two header lines, three choices
  CHECK(lines[0] == "ft-gemm-algos 1");
  CHECK(lines[1].find("device the test's GPU, cuBLASLt 999999") == 0);
  {
    const auto before = ft::cuda_emu::cublaslt_emu_stats();
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    CHECK(layer.run(lt) == first);
    CHECK(lt.recorded_problems() == 3);
    CHECK(lt.measured_problems() == 0);
    CHECK(ft::cuda_emu::cublaslt_emu_stats().heuristic_queries == before.heuristic_queries);
  }
  CHECK(lines_of(rd.file()) == lines);  // nothing new to append

  // The record is what decides: every choice set to algorithm 2 (k in four parts) gives other
  // bits than the heuristic's first, and the same as a second reading of that record.
  std::vector<unsigned char> heuristic;
  {
    LtGemm lt(workspace.data(), workspace.size(), false);
    heuristic = layer.run(lt);
  }
  for (size_t i = 2; i < lines.size(); ++i) lines[i] = with_algo_word(lines[i], 7, "2");
  write_lines(rd.file(), lines);
  std::vector<unsigned char> forced;
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    forced = layer.run(lt);
    CHECK(lt.recorded_problems() == 3);
  }
  CHECK(forced != heuristic);
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    CHECK(layer.run(lt) == forced);
  }
}

TEST_CASE("lt_gemm_cuda_emu: a damaged, torn or foreign record is measured again") {
  std::vector<unsigned char> workspace(ft::cuda_emu::kCublasLtEmuWorkspaceBytes);
  RecordDir rd;
  Layer layer;
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    layer.run(lt);
  }
  const std::vector<std::string> lines = lines_of(rd.file());
  REQUIRE(lines.size() == 5);

  // The last line cut short (a crash while appending): that choice is measured and appended on
  // a line of its own; the two others are taken.
  std::vector<std::string> torn = lines;
  torn[4] = torn[4].substr(0, torn[4].size() / 2);
  write_lines(rd.file(), torn, /*torn=*/true);
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    layer.run(lt);
    CHECK(lt.recorded_problems() == 2);
    CHECK(lt.measured_problems() == 1);
  }
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    layer.run(lt);
    CHECK(lt.recorded_problems() == 3);  // the appended line parses
    CHECK(lt.measured_problems() == 0);
  }

  // An algorithm cuBLASLt refuses for its problem (another problem's fingerprint): measured.
  std::vector<std::string> wrong = lines;
  wrong[2] = with_algo_word(wrong[2], 1, "1234");
  write_lines(rd.file(), wrong);
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    layer.run(lt);
    CHECK(lt.recorded_problems() == 2);
    CHECK(lt.measured_problems() == 1);
  }

  // Another GPU's record is replaced by this one's.
  std::vector<std::string> foreign = lines;
  foreign[1] = "device another GPU, cuBLASLt 1, workspace 4096";
  write_lines(rd.file(), foreign);
  {
    LtGemm lt(workspace.data(), workspace.size(), false, measuring(rd.file()));
    layer.run(lt);
    CHECK(lt.recorded_problems() == 0);
    CHECK(lt.measured_problems() == 3);
  }
  const std::vector<std::string> now = lines_of(rd.file());
  REQUIRE(now.size() == 5);
  CHECK(now[1] == lines[1]);

  // A record's folder that cannot be one is refused when the LtGemm is made, before any GEMM.
  std::filesystem::remove_all(rd.dir / "gemm_algos");
  std::ofstream(rd.dir / "gemm_algos") << "a file";
  CHECK_THROWS_WITH_AS(LtGemm(workspace.data(), workspace.size(), false, measuring(rd.file())),
                       doctest::Contains("gemm_algos is not a folder"), ft::Error);
  // So is a record that is not a file (it would otherwise fail at the first measured GEMM).
  std::filesystem::remove(rd.dir / "gemm_algos");
  std::filesystem::create_directories(rd.file());
  CHECK_THROWS_WITH_AS(LtGemm(workspace.data(), workspace.size(), false, measuring(rd.file())),
                       doctest::Contains("is not a regular file"), ft::Error);
}

TEST_CASE("lt_gemm_cuda_emu: the emulator refuses what the library leaves undefined") {
  // Why the alignment is part of lt_gemm's cache key: the library's default assumes 256 bytes.
  cublasLtHandle_t h;
  REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t l;
  REQUIRE(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 2, 2, 2) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  // Tell the heuristic the buffers are 16-byte aligned; then hand it a 4-byte aligned one.
  const uint32_t sixteen = 16;
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, attr, &sixteen, sizeof sixteen) ==
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, desc, l, l, l, l, pref, 1, &r, &found) ==
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == 1);
  alignas(256) float buf[16] = {1, 2, 3, 4, 1, 0, 0, 1};
  const float one = 1, zero = 0;
  CHECK(cublasLtMatmul(h, desc, &one, buf, l, buf + 4, l, &zero, buf + 8, l, buf + 8, l, &r.algo,
                       nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(buf[8] == 1);  // A (column-major [[1, 3], [2, 4]]) · I
  CHECK(buf[9] == 2);
  CHECK(buf[10] == 3);
  CHECK(buf[11] == 4);
  CHECK(cublasLtMatmul(h, desc, &one, buf + 1, l, buf + 4, l, &zero, buf + 8, l, buf + 8, l,
                       &r.algo, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(ft::cuda_emu::cublaslt_emu_last_error().find("4-byte aligned") != std::string::npos);
  // An output overlapping an input is refused (undefined in the library).
  CHECK(cublasLtMatmul(h, desc, &one, buf, l, buf + 4, l, &zero, buf + 4, l, buf + 4, l, &r.algo,
                       nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(ft::cuda_emu::cublaslt_emu_last_error().find("D overlaps B") != std::string::npos);
  // An attribute of the wrong size is refused, as by the library.
  const int64_t wide = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide) ==
        CUBLAS_STATUS_INVALID_VALUE);
  // An algorithm used with other descriptors is refused.
  const int32_t trans = CUBLAS_OP_T;
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans) ==
          CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmul(h, desc, &one, buf, l, buf + 4, l, &zero, buf + 8, l, buf + 8, l, &r.algo,
                       nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

TEST_CASE("lt_gemm_cuda_emu: fp32 rounds inputs to TF32 only when allowed") {
  // x = 1 + 2^-20 has bits below TF32's 10-bit mantissa: TF32 rounds it to 1.
  const float x[1] = {1.0f + std::ldexp(1.0f, -20)}, W[1] = {1.0f};
  float y[1] = {0};
  LtGemm exact(nullptr, 0, false);
  exact.linear_forward(y, x, W, DType::kF32, 1, 1, 1, false, nullptr);
  CHECK(y[0] == x[0]);
  LtGemm tf32(nullptr, 0, true);
  tf32.linear_forward(y, x, W, DType::kF32, 1, 1, 1, false, nullptr);
  CHECK(y[0] == 1.0f);
}

TEST_CASE("lt_gemm_cuda_emu: a failing cuBLASLt call is an ft::Error naming the shape") {
  LtGemm lt(nullptr, 0, false);
  float y[19 * 7];
  // A null input passes the heuristic (which never sees pointers) and fails in the matmul.
  CHECK_THROWS_WITH_AS(
      lt.linear_forward(y, nullptr, nullptr, DType::kF32, 19, 3, 7, false, nullptr),
      doctest::Contains(
          "cublasLtMatmul failed for the linear forward F32 -> F32 M=19 N=7 K=3 (A ld 3, Bᵀ ld 3"),
      ft::Error);
  CHECK_THROWS_WITH_AS(
      lt.linear_forward(y, nullptr, nullptr, DType::kF32, 19, 3, 7, false, nullptr),
      doctest::Contains("CUBLAS_STATUS_INVALID_VALUE"), ft::Error);
  // Nothing to multiply: an empty output is a no-op, an empty sum into += too.
  lt.linear_forward(y, nullptr, nullptr, DType::kF32, 0, 3, 7, false, nullptr);
  float dW[3] = {1, 2, 3};
  lt.linear_backward(nullptr, dW, nullptr, nullptr, nullptr, DType::kF32, 0, 3, 1, false, nullptr);
  CHECK(dW[2] == 3);
}

#endif  // FT_LT_GEMM_GPU
