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

// bf16 through AVX2's integer ops, as the f16 ones above (the baseline build's SSE2 loops were
// the widened GEMM's serial part): bf16 is fp32's upper half, so widening is a shift, and
// narrowing adds 0x7fff plus the kept part's lowest bit before dropping the lower half (round
// to nearest even), a NaN quieted as to_bf16 does.
__attribute__((target("avx2"))) size_t widen_bf16_avx2(float* dst, const bf16* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(w, 16));
  }
  return i;
}

__attribute__((target("avx2"))) size_t narrow_bf16_avx2(bf16* dst, const float* src, size_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    // 32 -> 16 bits: packus works within each 128-bit half; qwords 0 and 2 hold the 8 results.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  return i;
}

// dst[i] = float(src[i]), exact.
template <typename T>
void widen(float* dst, const T* src, size_t n) {
  size_t i = 0;
  if (cpu_isa() != CpuIsa::baseline) {
    if constexpr (std::is_same_v<T, f16>)
      i = widen_f16c(dst, src, n);
    else
      i = widen_bf16_avx2(dst, src, n);
  }
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

// dst[i] = T(src[i]), round to nearest even.
template <typename T>
void narrow(T* dst, const float* src, size_t n) {
  size_t i = 0;
  if (cpu_isa() != CpuIsa::baseline) {
    if constexpr (std::is_same_v<T, f16>)
      i = narrow_f16c(dst, src, n);
    else
      i = narrow_bf16_avx2(dst, src, n);
  }
  for (; i < n; ++i) dst[i] = from_f32<T>(src[i]);
}

// The fallback: C (+)= op(A) · op(B) as fp32 GEMMs of widened tiles, then one rounding of each
// C tile to the output type. Tiles of 1024 rows, 2048 columns and 1024 of K bound the scratch to
// 24 MB per thread whatever the shape (widening whole operands would hold ~200 MB of fp32 copies
// for the bench model's vocabulary projection); rows outermost, so that with K in one tile (a
// linear layer's input width up to 1024) A's tile is widened once for all its columns, not once
// per column tile. K is tiled too, so a C tile stays in fp32 across all of K and is rounded once.
// The widening runs on one thread: an OpenMP team here competes with OpenBLAS's pool, still
// spinning from the last tile (tried: 2-3x slower). Measured (ft_bench_gemm, 2 threads, against
// fp32 on the bench shapes, OpenBLAS's AVX-512 kernels): bf16 ~85% of the fp32 GEMM's speed with
// these tiles and AVX2 conversions, ~70% with 1024-column tiles, column tiles outermost and the
// baseline build's SSE2 bf16 conversions; the bench step's bf16/fp32 at FT_CPU_ISA=avx2 (oneDNN
// capped at AVX2, so this path) went from 0.81x to 0.92x.
template <typename T, typename Tc>
void gemm_via_f32(const GemmKey& k, const T* A, const T* B, Tc* C) {
  constexpr int kTileM = 1024, kTileN = 2048, kTileK = 1024;
  thread_local std::vector<float> a32_buf(size_t(kTileM) * kTileK),
      b32_buf(size_t(kTileK) * kTileN), c32_buf(size_t(kTileM) * kTileN);
  // The calling thread's buffers, by pointer: in the OpenMP workers below the thread_local names
  // would be the workers' own.
  float* const a32 = a32_buf.data();
  float* const b32 = b32_buf.data();
  float* const c32 = c32_buf.data();
  auto rows = [](int n, size_t, auto&& convert_row) {
    for (int r = 0; r < n; ++r) convert_row(r);
  };
  for (int i0 = 0; i0 < k.M; i0 += kTileM) {
    const int mb = std::min(kTileM, k.M - i0);
    for (int j0 = 0; j0 < k.N; j0 += kTileN) {
      const int nb = std::min(kTileN, k.N - j0);
      // C tile (mb, nb): in place when C is fp32, else widened (accumulate) into c32.
      float* c = c32;
      int ldc = nb;
      if constexpr (std::is_same_v<Tc, float>) {
        c = C + size_t(i0) * k.N + j0;
        ldc = k.N;
      } else if (k.accumulate) {
        rows(mb, size_t(nb),
             [&](int i) { widen(c + size_t(i) * nb, C + size_t(i0 + i) * k.N + j0, nb); });
      }
      for (int p0 = 0; p0 < k.K; p0 += kTileK) {
        const int kb = std::min(kTileK, k.K - p0);
        // op(A) tile (mb, kb): rows of A (M, K), or columns of A stored (K, M) when ta. With K
        // in one tile it is the same for every j0: widened once.
        if (j0 == 0 || k.K > kTileK) {
          if (!k.ta)
            rows(mb, size_t(kb),
                 [&](int i) { widen(a32 + size_t(i) * kb, A + size_t(i0 + i) * k.K + p0, kb); });
          else
            rows(kb, size_t(mb),
                 [&](int p) { widen(a32 + size_t(p) * mb, A + size_t(p0 + p) * k.M + i0, mb); });
        }
        // op(B) tile (kb, nb): B (K, N), or B stored (N, K) when tb.
        if (!k.tb)
          rows(kb, size_t(nb),
               [&](int p) { widen(b32 + size_t(p) * nb, B + size_t(p0 + p) * k.N + j0, nb); });
        else
          rows(nb, size_t(kb),
               [&](int j) { widen(b32 + size_t(j) * kb, B + size_t(j0 + j) * k.K + p0, kb); });
        const float beta = (p0 > 0 || k.accumulate) ? 1.0f : 0.0f;
        gemm_f32(k.ta, k.tb, mb, nb, kb, 1.0f, a32, k.ta ? mb : kb, b32, k.tb ? kb : nb, beta, c,
                 ldc);
      }
      if constexpr (!std::is_same_v<Tc, float>)
        rows(mb, size_t(nb),
             [&](int i) { narrow(C + size_t(i0 + i) * k.N + j0, c + size_t(i) * nb, nb); });
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
