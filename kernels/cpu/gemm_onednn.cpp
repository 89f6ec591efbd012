// bf16 and f16 linear layers, through oneDNN's matmul, ft's packed kernel (gemm_packed.cpp) or
// widened to fp32 for OpenBLAS (path16 below chooses by CPU); the fp32 ones are OpenBLAS's
// (gemm.cpp), the reference these are tested against. Either way products of the 16-bit values are
// summed in fp32 and the output is rounded once; oneDNN's `+=` is its sum post-op, which adds the
// old output (read as T) to the fp32 accumulator before that one rounding.
//
// oneDNN picks its kernels at run time from the CPU (within the cap of cap_onednn): AMX tiles on
// Sapphire Rapids, AVX512-BF16 dot products on Zen 4 / Cooper Lake, bf16 emulated on plain
// AVX-512. Measured with Debian's oneDNN 2.6.3 on an AVX512-BF16 CPU without AVX512-FP16: f16
// matmul has no implementation at all (primitive creation fails with "unimplemented", for every
// layout and for f32 outputs too), and bf16 has none below AVX-512; those GEMMs are packed or
// widened.
// Widening is exact, so the result is the fp32 GEMM of the same rounded inputs followed by one
// rounding: the reference's numbers up to summation order. Narrowing f16 to bf16 instead would
// lose three mantissa bits of every operand, which f16 training does not expect.
//
// Creating a oneDNN primitive (JIT code generation) costs ~0.3 ms for a 7x7x7 GEMM here, a
// cached call ~1 µs (tests/tools/ft_bench_gemm); a training step runs the same few shapes
// thousands of times, so primitives are cached by shape, layout, types and accumulate flag.
// oneDNN's OpenMP threads are ft's (it reads omp_get_max_threads() at each call, which the trainer
// sets from runtime.threads).
#include <omp.h>
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

#include "core/error.h"
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
// oneDNN capped at the instruction set of ft's level (kernels.h), so that FT_CPU_ISA runs what a
// CPU of that class runs; ONEDNN_MAX_CPU_ISA, when set, is oneDNN's own and wins. Called before
// anything else asks oneDNN about its instruction set (it takes the cap only then).
void cap_onednn() {
  static const bool once = [] {
    if (std::getenv("ONEDNN_MAX_CPU_ISA")) return true;
    dnnl::cpu_isa cap = dnnl::cpu_isa::all;
    switch (cpu_isa()) {
      case CpuIsa::baseline:
        cap = dnnl::cpu_isa::sse41;
        break;
      case CpuIsa::avx2:
        cap = dnnl::cpu_isa::avx2;
        break;
      case CpuIsa::avx512:
        cap = dnnl::cpu_isa::avx512_core;
        break;
      case CpuIsa::avx512_bf16:
        cap = dnnl::cpu_isa::avx512_core_bf16;
        break;
      case CpuIsa::amx:
        break;
    }
    if (cap != dnnl::cpu_isa::all) dnnl::set_max_cpu_isa(cap);
    return true;
  }();
  (void)once;
}

dnnl::engine& cpu_engine() {
  cap_onednn();
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

// dst[i] = float(src[i]), exact, and dst[i] = T(src[i]), rounded to nearest even: kernels.h's
// convert, the copy of the chosen instruction set (kernels/cpu/half_vec.h's vector forms), serial
// at a tile row's length (its threads start above 64 Ki elements).
template <typename T>
void widen(float* dst, const T* src, size_t n) {
  convert(dst, src, n);
}

template <typename T>
void narrow(T* dst, const float* src, size_t n) {
  convert(dst, src, n);
}

// The fallback: C (+)= op(A) · op(B) as fp32 GEMMs of widened tiles, then one rounding of each
// C tile to the output type. Tiles of 1024 rows, 2048 columns and 1024 of K bound the scratch to
// 24 MB per thread whatever the shape (widening whole operands would hold ~200 MB of fp32 copies
// for the bench model's vocabulary projection); rows outermost, so that with K in one tile (a
// linear layer's input width up to 1024) A's tile is widened once for all its columns, not once
// per column tile. K is tiled too, so a C tile stays in fp32 across all of K and is rounded once.
// This is one thread's share: C's rows [r0, r1) x columns [c0, c1), with `blas_threads` threads
// in OpenBLAS.
template <typename T, typename Tc>
void gemm_via_f32_region(const GemmKey& k, const T* A, const T* B, Tc* C, int r0, int r1, int c0,
                         int c1) {
  if (r0 >= r1 || c0 >= c1) return;
  constexpr int kTileM = 1024, kTileN = 2048, kTileK = 1024;
  thread_local std::vector<float> a32_buf, b32_buf, c32_buf;
  a32_buf.resize(size_t(std::min(kTileM, r1 - r0)) * std::min(kTileK, k.K));
  b32_buf.resize(size_t(std::min(kTileK, k.K)) * std::min(kTileN, c1 - c0));
  c32_buf.resize(size_t(std::min(kTileM, r1 - r0)) * std::min(kTileN, c1 - c0));
  float* const a32 = a32_buf.data();
  float* const b32 = b32_buf.data();
  float* const c32 = c32_buf.data();
  for (int i0 = r0; i0 < r1; i0 += kTileM) {
    const int mb = std::min(kTileM, r1 - i0);
    for (int j0 = c0; j0 < c1; j0 += kTileN) {
      const int nb = std::min(kTileN, c1 - j0);
      // C tile (mb, nb): in place when C is fp32, else widened (accumulate) into c32.
      float* c = c32;
      int ldc = nb;
      if constexpr (std::is_same_v<Tc, float>) {
        c = C + size_t(i0) * k.N + j0;
        ldc = k.N;
      } else if (k.accumulate) {
        for (int i = 0; i < mb; ++i) widen(c + size_t(i) * nb, C + size_t(i0 + i) * k.N + j0, nb);
      }
      for (int p0 = 0; p0 < k.K; p0 += kTileK) {
        const int kb = std::min(kTileK, k.K - p0);
        // op(A) tile (mb, kb): rows of A (M, K), or columns of A stored (K, M) when ta. With K
        // in one tile it is the same for every j0: widened once.
        if (j0 == c0 || k.K > kTileK) {
          if (!k.ta)
            for (int i = 0; i < mb; ++i)
              widen(a32 + size_t(i) * kb, A + size_t(i0 + i) * k.K + p0, kb);
          else
            for (int p = 0; p < kb; ++p)
              widen(a32 + size_t(p) * mb, A + size_t(p0 + p) * k.M + i0, mb);
        }
        // op(B) tile (kb, nb): B (K, N), or B stored (N, K) when tb.
        if (!k.tb)
          for (int p = 0; p < kb; ++p)
            widen(b32 + size_t(p) * nb, B + size_t(p0 + p) * k.N + j0, nb);
        else
          for (int j = 0; j < nb; ++j)
            widen(b32 + size_t(j) * kb, B + size_t(j0 + j) * k.K + p0, kb);
        const float beta = (p0 > 0 || k.accumulate) ? 1.0f : 0.0f;
        gemm_f32(k.ta, k.tb, mb, nb, kb, 1.0f, a32, k.ta ? mb : kb, b32, k.tb ? kb : nb, beta, c,
                 ldc);
      }
      if constexpr (!std::is_same_v<Tc, float>)
        for (int i = 0; i < mb; ++i) narrow(C + size_t(i0 + i) * k.N + j0, c + size_t(i) * nb, nb);
    }
  }
}

// The whole product. With one thread converting while OpenBLAS's threads wait, the conversions
// cost ~15% of the fp32 GEMM's time; so with several threads each OpenMP thread takes a share of
// C (columns, or rows when C is narrow), widens its own operand tiles (the operand all shares
// read is widened by each: the copies stay in each core's cache) and runs its GEMMs in OpenBLAS
// on one thread. Measured (ft_bench_gemm, 2 threads, the bench shapes): bf16 and f16 at ~90% of
// the fp32 GEMM's GFLOP/s, from ~85% with the serial conversions. Tried and slower: an OpenMP
// team converting between multi-threaded OpenBLAS calls (2-3x: it competes with OpenBLAS's pool,
// still spinning from the last call), and the team widening shared tiles together with a
// barrier before each thread's slice of the product (~5%).
template <typename T, typename Tc>
void gemm_via_f32(const GemmKey& k, const T* A, const T* B, Tc* C) {
  const int threads = std::min(omp_get_max_threads(), std::max(k.M, k.N) / 64);
  if (threads <= 1 || double(k.M) * k.N * k.K < double(1 << 22))
    return gemm_via_f32_region(k, A, B, C, 0, k.M, 0, k.N);
  const int saved = blas_threads();
  set_blas_threads(1);
  const bool by_columns = k.N >= k.M || k.N >= 256 * threads;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    // Shares in multiples of 16 columns or rows (whole vectors for the conversions).
    const int units = by_columns ? (k.N + 15) / 16 : (k.M + 15) / 16;
    const int u0 = int(int64_t(units) * t / n) * 16, u1 = int(int64_t(units) * (t + 1) / n) * 16;
    if (by_columns)
      gemm_via_f32_region(k, A, B, C, 0, k.M, u0, std::min(u1, k.N));
    else
      gemm_via_f32_region(k, A, B, C, u0, std::min(u1, k.M), 0, k.N);
  }
  set_blas_threads(saved);
}

// Where a 16-bit GEMM runs (DESIGN §2 has the measurements behind the defaults). bf16: oneDNN at
// the amx level (its AMX kernels) and on AMD's AVX512-BF16 CPUs (Zen 4 and 5; measured on a Zen 4:
// VDPBF16PS at twice the FMAs' FLOP rate, oneDNN's bf16 ~2x OpenBLAS's fp32; Zen 5 not); elsewhere
// ft's packed kernel (gemm_packed.cpp) from the avx2 level up, and widened to fp32 for OpenBLAS at
// baseline (no FMA). oneDNN's bf16 kernels ran slower than both on the Intel CPUs measured: bf16
// emulated on plain AVX-512 at ~60 GFLOP/s, and VDPBF16PS on a Sapphire Rapids without AMX at ~165,
// that instruction's own peak there (half the FLOP rate of its FMAs), against ~250-280 widened (2
// cores, ft_bench_gemm). f16: oneDNN where it has a kernel (none in oneDNN 2.6 without
// AVX512-FP16), else packed or widened as bf16. FT_GEMM16=onednn, packed or widen forces one, to
// measure and test each on any CPU (onednn falls back where oneDNN has no kernel for the shape,
// packed where the level has no packed kernel).
enum class Path16 { automatic, onednn, packed, widen };

Path16 forced_path() {
  static const Path16 path = [] {
    const char* e = std::getenv("FT_GEMM16");
    if (!e || !*e) return Path16::automatic;
    if (std::strcmp(e, "onednn") == 0) return Path16::onednn;
    if (std::strcmp(e, "packed") == 0) return Path16::packed;
    if (std::strcmp(e, "widen") == 0) return Path16::widen;
    FT_FAIL("FT_GEMM16=", e,
            " is not a 16-bit GEMM path: choose onednn, packed or widen, or unset it for the "
            "default");
  }();
  return path;
}

// Whether this level has the packed kernel (gemm_packed.cpp: every level with FMAs).
bool packed_available() { return cpu_isa() >= CpuIsa::avx2; }

// The path of the GEMMs with bf16 (else f16) operands, before oneDNN is asked about the shape.
Path16 path16(bool bf16_operands) {
  Path16 path = forced_path();
  if (path == Path16::automatic) {
    static const bool onednn_bf16 =
        cpu_isa() == CpuIsa::amx || (cpu_isa() == CpuIsa::avx512_bf16 && __builtin_cpu_is("amd"));
    path = !bf16_operands || onednn_bf16 ? Path16::onednn : Path16::packed;
  }
  if (path == Path16::packed && !packed_available()) path = Path16::widen;
  return path;
}

// C (M, N) (+)= op(A) · op(B) with A, B in T (bf16 or f16) and C in Tc (T or float), on the
// packed kernel where the level has it, else widened.
template <typename T, typename Tc>
void gemm_without_onednn(const GemmKey& k, const T* A, const T* B, Tc* C) {
  if (packed_available()) {
    bool done;
    if constexpr (std::is_same_v<Tc, float>)
      done = gemm16_packed<T>(k.ta, k.tb, k.M, k.N, k.K, A, B, nullptr, C, k.accumulate);
    else
      done = gemm16_packed<T>(k.ta, k.tb, k.M, k.N, k.K, A, B, C, nullptr, k.accumulate);
    if (done) return;
  }
  gemm_via_f32(k, A, B, C);
}

// C (M, N) (+)= op(A) · op(B) with A, B in T (bf16 or f16) and C in Tc (T or float).
template <typename T, typename Tc>
void gemm16(bool ta, bool tb, int M, int N, int K, const T* A, const T* B, Tc* C, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: C = 0, or C unchanged when accumulating (as BLAS)
    if (!accumulate) std::memset(static_cast<void*>(C), 0, size_t(M) * N * sizeof(Tc));
    return;
  }
  const Path16 path = path16(std::is_same_v<T, bf16>);
  const GemmKey key{M, N, K, ta, tb, dtype_of<T>(), dtype_of<Tc>(), accumulate};
  if (path == Path16::widen) return gemm_via_f32(key, A, B, C);
  if (path == Path16::packed) return gemm_without_onednn(key, A, B, C);
  const GemmPrimitive& p = cached_primitive(key);
  if (!p.usable) return gemm_without_onednn(key, A, B, C);
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

const char* gemm16_path(bool bf16_operands) {
  constexpr const char* kPacked = "packed for fp32 FMAs";
  constexpr const char* kWidened = "widened to fp32 for OpenBLAS";
  const Path16 path = path16(bf16_operands);
  if (path == Path16::widen) return kWidened;
  if (path == Path16::packed) return kPacked;
  // oneDNN where it has a kernel for the type (asked on a small shape; gemm16 asks per shape).
  const dt type = bf16_operands ? dt::bf16 : dt::f16;
  if (!cached_primitive(GemmKey{64, 64, 64, false, true, type, type, false}).usable)
    return packed_available() ? kPacked : kWidened;
  return "oneDNN";
}

const char* gemm_isa() {
  cap_onednn();
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
