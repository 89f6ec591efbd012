// bf16 and f16 linear layers through oneDNN's matmul; the fp32 ones stay OpenBLAS (gemm.cpp),
// the reference these are tested against.
//
// oneDNN picks its kernels at run time from the CPU: AMX tiles on Sapphire Rapids, AVX512-BF16
// dot products on Zen 4 / Cooper Lake, bf16 emulated on plain AVX-512. Products are summed in
// fp32 and the output is rounded once; `+=` is oneDNN's sum post-op, which adds the old output
// (read as T) to the fp32 accumulator before that one rounding.
//
// Where oneDNN has no usable kernel, the operands are widened to fp32 and OpenBLAS runs the
// GEMM (see gemm_via_f32). Measured with Debian's oneDNN 2.6.3 on an AVX512-BF16 CPU without
// AVX512-FP16: f16 matmul has no implementation at all (primitive creation fails with
// "unimplemented", for every layout and for f32 outputs too), so f16 always takes that path
// here; bf16 has none below AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2), so such CPUs take it for bf16.
// Widening is exact, so the result is the fp32 GEMM of the same rounded inputs followed by one
// rounding: the reference's numbers up to summation order. Narrowing f16 to bf16 instead would
// lose three mantissa bits of every operand, which f16 training does not expect.
//
// Creating a oneDNN primitive (JIT code generation) costs ~0.3 ms for a 7x7x7 GEMM here, a
// cached call ~1 µs (tests/tools/ft_bench_gemm); a training step runs the same few shapes
// thousands of times, so primitives are cached by shape, layout, types and accumulate flag.
// oneDNN's OpenMP threads are ft's (it reads omp_get_max_threads() at each call, which the trainer
// sets from runtime.threads).
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/kernels.h"

namespace ft::kernels {
namespace {

using dt = dnnl::memory::data_type;

template <typename T>
constexpr dt dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return dt::f32;
  else if constexpr (std::is_same_v<T, bf16>)
    return dt::bf16;
  else
    return dt::f16;
}

// The engine and the primitive cache below are never destroyed: cached primitives must not
// outlive their engine, and the order in which function statics die at exit is not ours to
// pick. Both stay reachable, so LeakSanitizer does not count them.
dnnl::engine& cpu_engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// CPU streams execute on the calling thread. ft issues GEMMs from one thread, so this is one
// stream per process; a stream per thread keeps concurrent callers (tests, tools) apart.
dnnl::stream& cpu_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// C (M, N) (+)= op(A) · op(B), all row-major and contiguous: A is (M, K), or (K, M) when ta;
// B is (K, N), or (N, K) when tb.
struct GemmKey {
  int M, N, K;
  bool ta, tb;
  dt ab, c;  // operand type (bf16 or f16); output type (the same, or f32 for dW)
  bool accumulate;
  bool operator<(const GemmKey& o) const {
    return std::tie(M, N, K, ta, tb, ab, c, accumulate) <
           std::tie(o.M, o.N, o.K, o.ta, o.tb, o.ab, o.c, o.accumulate);
  }
};

struct GemmPrimitive {
  bool usable = false;  // false: oneDNN has no kernel worth running; use gemm_via_f32
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c;
};

GemmPrimitive create_primitive(const GemmKey& k) {
  using dims = dnnl::memory::dims;
  GemmPrimitive p;
  // oneDNN's matmul is dst (M, N) = src (M, K) · weights (K, N); transposes are strides.
  p.a = dnnl::memory::desc({k.M, k.K}, k.ab, k.ta ? dims{1, k.M} : dims{k.K, 1});
  p.b = dnnl::memory::desc({k.K, k.N}, k.ab, k.tb ? dims{1, k.K} : dims{k.N, 1});
  p.c = dnnl::memory::desc({k.M, k.N}, k.c, dims{k.N, 1});
  dnnl::primitive_attr attr;
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, cpu_engine());
    // oneDNN's reference kernels ("ref:any") are plain scalar loops, far slower than OpenBLAS
    // on widened copies. (None was offered on this CPU: missing kernels fail creation.)
    if (std::strncmp(pd.impl_info_str(), "ref", 3) == 0) return p;
    p.matmul = dnnl::matmul(pd);
    p.usable = true;
  } catch (const dnnl::error& e) {
    // dnnl_unimplemented: no kernel for these types on this CPU (f16 without AVX512-FP16, bf16
    // below AVX-512). Anything else is a bug in how the descriptor was built.
    if (e.status != dnnl_unimplemented)
      throw std::runtime_error(std::string("oneDNN matmul ") + std::to_string(k.M) + "x" +
                               std::to_string(k.N) + "x" + std::to_string(k.K) +
                               ": primitive creation failed: " + e.what() +
                               " (hint: ONEDNN_VERBOSE=2 shows why)");
  }
  return p;
}

// Primitives by key. Entries are never removed (a model has a handful of shapes: its layers
// at the micro-batch's row count), so a reference stays valid after the lock is released.
const GemmPrimitive& cached_primitive(const GemmKey& k) {
  static std::mutex mu;
  static auto* cache = new std::map<GemmKey, GemmPrimitive>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k);
  if (it == cache->end()) it = cache->emplace(k, create_primitive(k)).first;
  return it->second;
}

// The f16 conversions below through F16C where the chosen instruction set has it (avx2 and up,
// kernels.h's cpu_isa()). This file is compiled for the baseline, so those two functions get the
// instructions from a target attribute and run only after that check. Each returns how many
// elements it converted (a multiple of 8); the caller converts the rest.
__attribute__((target("avx,f16c"))) size_t widen_f16c(float* dst, const f16* src, size_t n) {
  // vcvtph2ps gives the bits of to_f32 (it is exact), except that a signalling NaN comes back
  // quiet; NaN stays NaN either way.
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  return i;
}

__attribute__((target("avx,f16c"))) size_t narrow_f16c(f16* dst, const float* src, size_t n) {
  // vcvtps2ph with round-to-nearest-even: the same bits as to_f16, NaN and overflow included.
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

// dst[i] = float(src[i]), exact.
template <typename T>
void widen(float* dst, const T* src, size_t n) {
  size_t i = 0;
  if constexpr (std::is_same_v<T, f16>)
    if (cpu_isa() != CpuIsa::baseline) i = widen_f16c(dst, src, n);
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

// dst[i] = T(src[i]), round to nearest even.
template <typename T>
void narrow(T* dst, const float* src, size_t n) {
  size_t i = 0;
  if constexpr (std::is_same_v<T, f16>)
    if (cpu_isa() != CpuIsa::baseline) i = narrow_f16c(dst, src, n);
  for (; i < n; ++i) dst[i] = from_f32<T>(src[i]);
}

// The fallback: C (+)= op(A) · op(B) as fp32 GEMMs of widened tiles, then one rounding of each
// C tile to the output type. Tiles of kTile³ bound the scratch to 12 MB per thread whatever the
// shape (widening whole operands would hold ~200 MB of fp32 copies for the bench model's
// vocabulary projection); re-widening A and B once per tile costs ~2/kTile conversions per
// multiply-add. K is tiled too, so a C tile stays in fp32 across all of K and is rounded once.
// The widening runs on one thread: it is cheap, and an OpenMP team here would compete with
// OpenBLAS's pool, still spinning from the last tile. Measured (ft_bench_gemm, 2 threads, f16
// against fp32 on the bench shapes): 1024-tiles reach ~90% of the fp32 GEMM's speed with
// OpenBLAS's AVX-512 kernels, 512-tiles ~65% (per-call overhead of smaller sgemms).
template <typename T, typename Tc>
void gemm_via_f32(const GemmKey& k, const T* A, const T* B, Tc* C) {
  constexpr int kTile = 1024;
  thread_local std::vector<float> a32(size_t(kTile) * kTile), b32(size_t(kTile) * kTile),
      c32(size_t(kTile) * kTile);
  for (int j0 = 0; j0 < k.N; j0 += kTile) {
    const int nb = std::min(kTile, k.N - j0);
    for (int i0 = 0; i0 < k.M; i0 += kTile) {
      const int mb = std::min(kTile, k.M - i0);
      // C tile (mb, nb): in place when C is fp32, else widened (accumulate) into c32.
      float* c = c32.data();
      int ldc = nb;
      if constexpr (std::is_same_v<Tc, float>) {
        c = C + size_t(i0) * k.N + j0;
        ldc = k.N;
      } else if (k.accumulate) {
        for (int i = 0; i < mb; ++i) widen(c + size_t(i) * nb, C + size_t(i0 + i) * k.N + j0, nb);
      }
      for (int p0 = 0; p0 < k.K; p0 += kTile) {
        const int kb = std::min(kTile, k.K - p0);
        // op(A) tile (mb, kb): rows of A (M, K), or columns of A stored (K, M) when ta.
        if (!k.ta)
          for (int i = 0; i < mb; ++i)
            widen(a32.data() + size_t(i) * kb, A + size_t(i0 + i) * k.K + p0, kb);
        else
          for (int p = 0; p < kb; ++p)
            widen(a32.data() + size_t(p) * mb, A + size_t(p0 + p) * k.M + i0, mb);
        // op(B) tile (kb, nb): B (K, N), or B stored (N, K) when tb.
        if (!k.tb)
          for (int p = 0; p < kb; ++p)
            widen(b32.data() + size_t(p) * nb, B + size_t(p0 + p) * k.N + j0, nb);
        else
          for (int j = 0; j < nb; ++j)
            widen(b32.data() + size_t(j) * kb, B + size_t(j0 + j) * k.K + p0, kb);
        const float beta = (p0 > 0 || k.accumulate) ? 1.0f : 0.0f;
        gemm_f32(k.ta, k.tb, mb, nb, kb, 1.0f, a32.data(), k.ta ? mb : kb, b32.data(),
                 k.tb ? kb : nb, beta, c, ldc);
      }
      if constexpr (!std::is_same_v<Tc, float>)
        for (int i = 0; i < mb; ++i) narrow(C + size_t(i0 + i) * k.N + j0, c + size_t(i) * nb, nb);
    }
  }
}

// FT_GEMM16=widen: every 16-bit GEMM through gemm_via_f32, even where oneDNN has a kernel (to
// measure and test that path on any CPU; oneDNN's bf16 kernels on AVX512-BF16 without AMX were
// slower than OpenBLAS's fp32 ones on a Sapphire Rapids VM: ~150 against ~250 GFLOP/s, 2 cores).
bool widen_always() {
  static const bool on = [] {
    const char* e = std::getenv("FT_GEMM16");
    return e && std::strcmp(e, "widen") == 0;
  }();
  return on;
}

// C (M, N) (+)= op(A) · op(B) with A, B in T (bf16 or f16) and C in Tc (T or float).
template <typename T, typename Tc>
void gemm16(bool ta, bool tb, int M, int N, int K, const T* A, const T* B, Tc* C, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: C = 0, or C unchanged when accumulating (as BLAS)
    if (!accumulate) std::memset(static_cast<void*>(C), 0, size_t(M) * N * sizeof(Tc));
    return;
  }
  const GemmKey key{M, N, K, ta, tb, dtype_of<T>(), dtype_of<Tc>(), accumulate};
  if (widen_always()) return gemm_via_f32(key, A, B, C);
  const GemmPrimitive& p = cached_primitive(key);
  if (!p.usable) return gemm_via_f32(key, A, B, C);
  dnnl::engine& eng = cpu_engine();
  dnnl::memory a(p.a, eng, const_cast<T*>(A)), b(p.b, eng, const_cast<T*>(B)), c(p.c, eng, C);
  dnnl::stream& s = cpu_stream();
  p.matmul.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  s.wait();
}

}  // namespace

template <typename T>
void linear_forward(T* y, const T* x, const T* W, int N, int in, int out, bool accumulate) {
  // y (N, out) = x (N, in) · Wᵀ (in, out)
  gemm16(false, true, N, out, in, x, W, y, accumulate);
}

template <typename T>
void linear_backward(T* dx, float* dW, const T* dy, const T* x, const T* W, int N, int in, int out,
                     bool accumulate_dx) {
  // dx (N, in) = dy (N, out) · W (out, in)
  if (dx) gemm16(false, false, N, in, out, dy, W, dx, accumulate_dx);
  // dW (out, in) += dyᵀ (out, N) · x (N, in), accumulated in fp32
  if (dW) gemm16(true, false, out, in, N, dy, x, dW, /*accumulate=*/true);
}

template void linear_forward<bf16>(bf16*, const bf16*, const bf16*, int, int, int, bool);
template void linear_forward<f16>(f16*, const f16*, const f16*, int, int, int, bool);
template void linear_backward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, int, int,
                                    int, bool);
template void linear_backward<f16>(f16*, float*, const f16*, const f16*, const f16*, int, int, int,
                                   bool);

const char* gemm_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "unknown";
  }
}

}  // namespace ft::kernels
