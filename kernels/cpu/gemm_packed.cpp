// The packed 16-bit GEMM: C (+)= op(A) · op(B) with A and B in bf16 or f16, widened to fp32 as
// they are packed, on fp32 FMAs (every level with FMAs: avx2, and avx512, whose copy the
// avx512_bf16 and amx levels run; baseline has none and returns false). gemm_onednn.cpp chooses
// it (DESIGN §2 says where).
//
// Why: the widened path (gemm_onednn.cpp's gemm_via_f32) widens tiles of both operands into fp32
// scratch that OpenBLAS then reads again to pack, and rounds C from another fp32 scratch; that
// traffic held bf16 GEMMs at ~85-90% of the fp32 GEMM's speed, on AVX-512 CPUs whose VDPBF16PS is
// slower than their FMAs (a Sapphire Rapids without AMX: half the FLOP rate) as on AVX2 ones that
// have no bf16 instruction at all. Here the widening is the packing every GEMM does anyway
// (reading 2 bytes an element where fp32 reads 4), and each C tile is rounded from L1. Measured
// on that CPU (ft_bench_gemm 1 3 1024, one thread, the bench model's shapes): packed 143-156
// GFLOP/s, OpenBLAS's fp32 sgemm 142-154, widened 134-143; capped to AVX2, packed 74-82 against
// OpenBLAS's Haswell sgemm 74-80 (the core's AVX2 FMA peak is ~83). The first version, with K
// blocks of 384, ran at ~80% of fp32: each C tile's load and store, paid once per K block, cost
// more than the FMAs it saved.
//
// Numerics (kernels.h's contract for 16-bit GEMMs): the products of the widened operands are
// exact in fp32 (8 + 8 or 11 + 11 significant bits) and each element of C is one chain of fp32
// FMAs in k order, c = fma(a_k, b_k, c) for k = 0, 1, ..., K - 1, starting from 0 (or from the
// old C, widened, when accumulating), rounded once to the output type at the end. So the result
// is the same bits whatever the blocking, the thread count or the split: the unit test compares
// it with that scalar chain bit for bit. (f16 signalling NaNs come out quieted, as any NaN
// through a GEMM does.)
//
// Blocking (BLIS's): op(B) is packed KC x NC at a time in panels of kNR columns, op(A) MC x KC
// in panels of kMR rows, and the micro-kernel keeps a kMR x kNR tile of C in registers (14 x 32
// in 28 zmm, or 6 x 16 in 12 ymm) over KC steps of k. The two levels differ only in the vector
// (the helpers below) and the sizes, never in the order of the sums: they give the same bits.
// Between K blocks a tile's chain continues from fp32: C itself when C is fp32, else a scratch of
// the block's rows (at most kBigRows) that is rounded into C after the last K block.
//
// Threads: the calling thread's OpenMP team; each takes a share of C's columns or rows (whichever
// packs less per thread) and packs what it reads itself, so threads never wait for each other.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "kernels/cpu/half_vec.h"
#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS {

#if FT_CPU_ISA_LEVEL >= 1
namespace {

// The vector of one level: kW fp32 lanes (a zmm at avx512, a ymm at avx2). The micro-kernel keeps
// a kMR x kNR tile of C in kMR x 2 vectors, with 2 more for B's row and 1 for A's broadcast: 31 of
// AVX-512's 32 registers, 15 of AVX2's 16. The other sizes were measured on one CPU (Sapphire
// Rapids: 48 KiB L1D, 2 MiB L2 a core) only, the avx2 ones with that CPU capped to AVX2.
#if FT_CPU_ISA_LEVEL >= 2
using vec = __m512;
constexpr int kW = 16;
constexpr int kMR = 14;  // rows of a C tile
// k per packed block, at most: long blocks amortise each C tile's load and store; the A and B
// panels (56 and 128 KiB at 1024) stream from L2 at ~13 bytes a cycle, which it sustains.
constexpr int kKC = 1024;
constexpr int kMC = 14 * 24;  // rows of A packed at a time: 1.3 MiB at kc 1024, in L2
#else
using vec = __m256;
constexpr int kW = 8;
constexpr int kMR = 6;
// Sizes for the smaller caches of AVX2 CPUs (256-512 KiB of L2 a core): the A block 288 KiB,
// the B panel 32 KiB (in L1).
constexpr int kKC = 512;
constexpr int kMC = 6 * 24;
#endif
constexpr int kNR = 2 * kW;     // columns of a C tile
constexpr int kNC = 2048;       // columns of B packed at a time: 8 (avx2: 4) MiB, in L3
constexpr int kBigRows = 1024;  // rows of the fp32 scratch of a 16-bit C between K blocks
// Below this many multiply-adds one thread does the whole product (a team costs more).
constexpr double kSerialMacs = 1 << 20;

template <typename T>
struct Operands {
  bool ta, tb;
  int M, N, K;
  const T* A;  // (M, K), or (K, M) stored when ta; row-major, contiguous
  const T* B;  // (K, N), or (N, K) stored when tb
};

#if FT_CPU_ISA_LEVEL >= 2
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset1(float x) { return _mm512_set1_ps(x); }
inline vec vload(const float* p) { return _mm512_load_ps(p); }  // 64-byte aligned
inline vec vloadu(const float* p) { return _mm512_loadu_ps(p); }
inline void vstoreu(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }

// kW consecutive elements of T from p (the first `n`, the rest 0), widened to fp32 exactly.
template <typename T>
inline vec load_widened(const T* p, int n) {
  const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (std::is_same_v<T, f16>)
      return _mm512_cvtph_ps(h);
    else
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// r[0..kW) transposed in place: r[j] lane i = old r[i] lane j.
inline void transpose(vec r[kW]) {
  __m512 a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a0 = _mm512_castps_pd(a[4 * i]), a1 = _mm512_castps_pd(a[4 * i + 1]);
    const __m512d a2 = _mm512_castps_pd(a[4 * i + 2]), a3 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  // b[4i + c], 128-bit lane l: rows 4i..4i+3 of column 4l + c.
  for (int c = 0; c < 4; ++c) {
    const __m512 s1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x88);
    const __m512 s2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x88);
    const __m512 s3 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xdd);
    const __m512 s4 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xdd);
    r[c] = _mm512_shuffle_f32x4(s1, s2, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(s1, s2, 0xdd);
    r[4 + c] = _mm512_shuffle_f32x4(s3, s4, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(s3, s4, 0xdd);
  }
}

// Stores the first `width` (<= kW) lanes of v at out.
inline void store_lanes(float* out, vec v, int width) {
  if (width >= 16)
    _mm512_storeu_ps(out, v);
  else
    _mm512_mask_storeu_ps(out, __mmask16((1u << width) - 1), v);
}
#else
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset1(float x) { return _mm256_set1_ps(x); }
inline vec vload(const float* p) { return _mm256_load_ps(p); }  // 32-byte aligned
inline vec vloadu(const float* p) { return _mm256_loadu_ps(p); }
inline void vstoreu(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }

// Lanes [0, n) set: a mask for vmaskmovps.
inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <typename T>
inline vec load_widened(const T* p, int n) {
  if constexpr (std::is_same_v<T, float>) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(n));
  } else {
    // AVX2 has no masked 16-bit load: a short line goes through a zeroed copy.
    alignas(16) uint16_t part[8] = {};
    const void* src = p;
    if (n < 8) {
      std::memcpy(part, p, sizeof(T) * size_t(std::max(n, 0)));
      src = part;
    }
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(src));
    if constexpr (std::is_same_v<T, f16>)
      return _mm256_cvtph_ps(h);
    else
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

inline void transpose(vec r[kW]) {
  __m256 a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // b[4h + c], 128-bit lane l: rows 4h..4h+3 of column 4l + c.
  for (int h = 0; h < 2; ++h) {
    const __m256d a0 = _mm256_castps_pd(a[4 * h]), a1 = _mm256_castps_pd(a[4 * h + 1]);
    const __m256d a2 = _mm256_castps_pd(a[4 * h + 2]), a3 = _mm256_castps_pd(a[4 * h + 3]);
    b[4 * h] = _mm256_castpd_ps(_mm256_unpacklo_pd(a0, a2));
    b[4 * h + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a0, a2));
    b[4 * h + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(a1, a3));
    b[4 * h + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(a1, a3));
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
  }
}

inline void store_lanes(float* out, vec v, int width) {
  if (width >= 8) {
    _mm256_storeu_ps(out, v);
  } else if (width == 6) {  // an A panel's row: 4 + 2 lanes (masked stores are slow on AMD)
    _mm_storeu_ps(out, _mm256_castps256_ps128(v));
    _mm_storel_pi(reinterpret_cast<__m64*>(out + 4), _mm256_extractf128_ps(v, 1));
  } else {
    _mm256_maskstore_ps(out, lane_mask(width), v);
  }
}
#endif

// Prefetches `rows` rows of `bytes` bytes each, `ld_bytes` apart, from p into L1.
inline void prefetch_rows(const void* p, size_t ld_bytes, int rows, size_t bytes) {
  const char* q = static_cast<const char*>(p);
  for (int r = 0; r < rows; ++r)
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(q + r * ld_bytes + o, _MM_HINT_T0);
}

// Packs `count` (<= width) lines whose k runs along memory (A's rows; B's columns stored as rows
// when tb), k in [0, kc): out[k * width + r] = src[r * ld + k], widened; lines r >= count are 0.
template <typename T>
void pack_along_k(float* out, int width, const T* src, size_t ld, int count, int kc) {
  for (int g = 0; g < width; g += kW) {
    const int lanes = std::min(kW, width - g);
    for (int k0 = 0; k0 < kc; k0 += kW) {
      const int n = std::min(kW, kc - k0);
      vec r[kW];
      for (int i = 0; i < kW; ++i)
        r[i] = g + i < count ? load_widened(src + size_t(g + i) * ld + k0, n) : vzero();
      transpose(r);
      for (int j = 0; j < n; ++j) store_lanes(out + size_t(k0 + j) * width + g, r[j], lanes);
    }
  }
}

// Packs `count` (<= width) lines whose k runs across rows (B's columns when not tb), k in
// [0, kc): out[k * width + c] = src[k * ld + c], widened; columns c >= count are 0.
template <typename T>
void pack_across_k(float* out, int width, const T* src, size_t ld, int count, int kc) {
  for (int k = 0; k < kc; ++k) {
    const T* row = src + size_t(k) * ld;
    for (int g = 0; g < width; g += kW)
      store_lanes(out + size_t(k) * width + g,
                  load_widened(row + g, std::max(0, std::min(kW, count - g))),
                  std::min(kW, width - g));
  }
}

// op(A)'s rows [row, row + count) x k [k0, k0 + kc) as panels of kMR rows, kMR * kc apart. When
// A is stored (K, M) each k's row of the block is read once, whole, into all the panels (panel by
// panel would read each cache line of it once per panel, a panel's width of it each time).
template <typename T>
void pack_a_block(float* out, const Operands<T>& op, int row, int count, int k0, int kc) {
  if (!op.ta) {
    for (int i = 0; i < count; i += kMR)
      pack_along_k(out + size_t(i) * kc, kMR, op.A + size_t(row + i) * op.K + k0, size_t(op.K),
                   std::min(kMR, count - i), kc);
    return;
  }
  // k in chunks, each panel's part of a chunk written at once: panel by panel for each k would
  // store to kMR * kc * 4 bytes apart, a multiple of 4 KiB, so to one L1 set (measured: the
  // packing took 11% of a GEMM so, against 3% for the other layout). The block's part of a row is
  // short (a few cache lines) and the rows far apart, which the hardware's prefetchers miss: the
  // next chunk's rows are asked for here.
  constexpr int kChunk = 16;
  for (int kb = 0; kb < kc; kb += kChunk) {
    const int ke = std::min(kc, kb + kChunk);
    for (int k = ke; k < std::min(kc, ke + kChunk); ++k)
      prefetch_rows(op.A + size_t(k0 + k) * op.M + row, 0, 1, size_t(count) * sizeof(T));
    for (int i = 0; i < count; i += kMR) {
      // A whole panel loads kW elements (past the panel, not past A: a full vector, where a short
      // one would take the slow masked or copied load) and stores its kMR; the last, short panel
      // loads its rows only, the other lanes 0.
      const int n = count - i >= kMR ? std::min(kW, op.M - row - i) : count - i;
      const T* src = op.A + size_t(k0) * op.M + row + i;
      float* dst = out + size_t(i) * kc;
      for (int k = kb; k < ke; ++k)
        store_lanes(dst + size_t(k) * kMR, load_widened(src + size_t(k) * op.M, n), kMR);
    }
  }
}

// op(B)'s k [k0, k0 + kc) x columns [col, col + count) as one kNR panel.
template <typename T>
void pack_b(float* out, const Operands<T>& op, int col, int count, int k0, int kc) {
  if (op.tb)
    pack_along_k(out, kNR, op.B + size_t(col) * op.K + k0, size_t(op.K), count, kc);
  else
    pack_across_k(out, kNR, op.B + size_t(k0) * op.N + col, size_t(op.N), count, kc);
}

// A packing buffer of 64-byte aligned floats, grown as needed and kept (one per thread).
struct PackBuffer {
  float* data = nullptr;
  size_t size = 0;
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data); }
  float* at_least(size_t n) {
    if (n > size) {
      std::free(data);
      size = (n + 15) / 16 * 16;
      data = static_cast<float*>(std::aligned_alloc(64, size * sizeof(float)));
      if (!data) throw std::bad_alloc();
    }
    return data;
  }
};

// out (kMR x kNR, rows ld_out apart) = init (rows ld_init apart; 0 when null) + the packed A
// panel times the packed B panel over kc steps of k, each a fused multiply-add per element in k
// order. out and init may be the same rows (a full tile of an fp32 C, read and written in place).
void micro_kernel(float* out, size_t ld_out, const float* init, size_t ld_init, const float* a,
                  const float* b, int kc) {
  vec c[kMR][2];
  if (init) {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      c[r][0] = vloadu(init + r * ld_init);
      c[r][1] = vloadu(init + r * ld_init + kW);
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) c[r][0] = c[r][1] = vzero();
  }
  for (int k = 0; k < kc; ++k) {
    const vec b0 = vload(b), b1 = vload(b + kW);
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const vec ar = vset1(a[r]);
      c[r][0] = vfma(ar, b0, c[r][0]);
      c[r][1] = vfma(ar, b1, c[r][1]);
    }
    a += kMR;
    b += kNR;
  }
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r) {
    vstoreu(out + r * ld_out, c[r][0]);
    vstoreu(out + r * ld_out + kW, c[r][1]);
  }
}

// Rows [0, rows) x columns [0, cols) of a tile from fp32 (src, ld), or from T widened; the rest
// of the tile is left as it is (its lanes never reach C).
template <typename S>
void load_tile(float* tile, const S* src, size_t ld, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<S, float>)
      std::memcpy(tile + r * kNR, src + size_t(r) * ld, sizeof(float) * cols);
    else
      cpu::load_f32(tile + r * kNR, src + size_t(r) * ld, size_t(cols));
  }
}

// Rows [0, rows) x columns [0, cols) of a tile to (dst, ld): as they are when D is float, else
// rounded once to D.
template <typename D>
void store_tile(D* dst, size_t ld, const float* tile, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<D, float>)
      std::memcpy(dst + size_t(r) * ld, tile + r * kNR, sizeof(float) * cols);
    else
      cpu::store_f32(dst + size_t(r) * ld, tile + r * kNR, size_t(cols));
  }
}

// One thread's part: C's rows [r0, r1) x columns [c0, c1).
template <typename T, typename Tc>
void gemm_part(const Operands<T>& op, Tc* C, bool accumulate, int r0, int r1, int c0, int c1) {
  if (r0 >= r1 || c0 >= c1) return;
  thread_local PackBuffer a_buf, b_buf, s_buf;
  // K in equal blocks of at most kKC (K 1100: two of 550, not 1024 and a short 76).
  const int k_blocks = (op.K + kKC - 1) / kKC, kc_max = (op.K + k_blocks - 1) / k_blocks;
  float* const a_packed = a_buf.at_least(size_t(kMC) * kc_max);
  const int nc_max = std::min(kNC, (c1 - c0 + kNR - 1) / kNR * kNR);
  float* const b_packed = b_buf.at_least(size_t(nc_max) * kc_max);
  // The chains between K blocks, for a 16-bit C only (an fp32 C holds them itself).
  const bool use_scratch = !std::is_same_v<Tc, float> && op.K > kKC;
  const int big_rows = use_scratch ? kBigRows : r1 - r0;
  float* const scratch =
      use_scratch ? s_buf.at_least(size_t(std::min(big_rows, r1 - r0)) * nc_max) : nullptr;
  alignas(64) float tile[kMR * kNR], init[kMR * kNR];
  for (int j0 = c0; j0 < c1; j0 += kNC) {
    const int nc = std::min(kNC, c1 - j0);
    for (int ib = r0; ib < r1; ib += big_rows) {
      const int ie = std::min(r1, ib + big_rows);
      for (int p0 = 0; p0 < op.K; p0 += kc_max) {
        const int kc = std::min(kc_max, op.K - p0);
        const bool first = p0 == 0, last = p0 + kc == op.K;
        for (int j = 0; j < nc; j += kNR)
          pack_b(b_packed + size_t(j) * kc, op, j0 + j, std::min(kNR, nc - j), p0, kc);
        for (int i0 = ib; i0 < ie; i0 += kMC) {
          const int mc = std::min(kMC, ie - i0);
          pack_a_block(a_packed, op, i0, mc, p0, kc);
          for (int j = 0; j < nc; j += kNR) {
            const int cols = std::min(kNR, nc - j);
            for (int i = 0; i < mc; i += kMR) {
              const int rows = std::min(kMR, mc - i);
              const int row = i0 + i, col = j0 + j;
              Tc* const c = C + size_t(row) * op.N + col;
              float* const s = scratch ? scratch + size_t(row - ib) * nc + j : nullptr;
              // The next tile's rows of C (or of the scratch) start on their way to the cache
              // now, while this tile computes: its chain starts from them and its sums go there.
              if (i + kMR < mc) {
                const int next_rows = std::min(kMR, mc - i - kMR);
                if (s && !last) {
                  prefetch_rows(s + size_t(kMR) * nc, size_t(nc) * sizeof(float), next_rows,
                                cols * sizeof(float));
                } else {
                  prefetch_rows(c + size_t(kMR) * op.N, size_t(op.N) * sizeof(Tc), next_rows,
                                cols * sizeof(Tc));
                  if (s)
                    prefetch_rows(s + size_t(kMR) * nc, size_t(nc) * sizeof(float), next_rows,
                                  cols * sizeof(float));
                }
              }
              const float* const ap = a_packed + size_t(i) * kc;
              const float* const bp = b_packed + size_t(j) * kc;
              // A whole tile whose chain starts and ends in fp32 memory (an fp32 C, or the
              // scratch between K blocks) is read and written there directly.
              if (rows == kMR && cols == kNR) {
                if constexpr (std::is_same_v<Tc, float>) {
                  micro_kernel(c, size_t(op.N), first && !accumulate ? nullptr : c, size_t(op.N),
                               ap, bp, kc);
                  continue;
                } else if (s && !first && !last) {
                  micro_kernel(s, size_t(nc), s, size_t(nc), ap, bp, kc);
                  continue;
                } else if (s && first && !accumulate) {
                  micro_kernel(s, size_t(nc), nullptr, 0, ap, bp, kc);
                  continue;
                }
              }
              // Where this tile's chain starts: 0, the old C, or the last K block's sums (read
              // in place for a whole tile of the scratch: its last block, rounded into C below).
              const float* from = nullptr;
              size_t ld_from = kNR;
              if (s && !first && rows == kMR && cols == kNR) {
                from = s;
                ld_from = size_t(nc);
              } else if (!first || accumulate) {
                // Lanes outside C stay 0 (never garbage: a subnormal there would slow the FMAs).
                if (rows < kMR || cols < kNR) std::memset(init, 0, sizeof init);
                if (s && !first)
                  load_tile(init, s, size_t(nc), rows, cols);
                else
                  load_tile(init, c, size_t(op.N), rows, cols);
                from = init;
              }
              micro_kernel(tile, kNR, from, ld_from, ap, bp, kc);
              if (last || !s)
                store_tile(c, size_t(op.N), tile, rows, cols);
              else
                store_tile(s, size_t(nc), tile, rows, cols);
            }
          }
        }
      }
    }
  }
}

// What one of `threads` threads packs with a share of C's columns (else rows), as gemm_part
// blocks: a column share packs all of op(A) once per kNC columns of its share and its columns of
// op(B) once per kBigRows rows (a 16-bit C over several K blocks); a row share the other way.
double packed_by_each(int M, int N, int K, bool c_blocks_rows, int threads, bool by_columns) {
  auto blocks = [](double n, int b) { return std::max(1.0, std::ceil(n / b)); };
  const double a = double(M) * K, b = double(K) * N;
  if (by_columns)
    return a * blocks(double(N) / threads, kNC) +
           b / threads * (c_blocks_rows ? blocks(M, kBigRows) : 1);
  return a / threads * blocks(N, kNC) +
         b * (c_blocks_rows ? blocks(double(M) / threads, kBigRows) : 1);
}

template <typename T, typename Tc>
void gemm(const Operands<T>& op, Tc* C, bool accumulate) {
  const double macs = double(op.M) * op.N * op.K;
  const int threads =
      macs < kSerialMacs ? 1 : std::min(omp_get_max_threads(), std::max(op.M, op.N) / 16);
  if (threads <= 1) return gemm_part(op, C, accumulate, 0, op.M, 0, op.N);
  const bool c_blocks_rows = !std::is_same_v<Tc, float> && op.K > kKC;
  const bool by_columns = packed_by_each(op.M, op.N, op.K, c_blocks_rows, threads, true) <=
                          packed_by_each(op.M, op.N, op.K, c_blocks_rows, threads, false);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    // Shares in whole tiles: kNR columns, or kMR rows.
    const int unit = by_columns ? kNR : kMR, extent = by_columns ? op.N : op.M;
    const int units = (extent + unit - 1) / unit;
    const int u0 = int(int64_t(units) * t / n) * unit;
    const int u1 = std::min(extent, int(int64_t(units) * (t + 1) / n) * unit);
    if (by_columns)
      gemm_part(op, C, accumulate, 0, op.M, u0, u1);
    else
      gemm_part(op, C, accumulate, u0, u1, 0, op.N);
  }
}

}  // namespace
#endif

template <typename T>
bool gemm16_packed(bool ta, bool tb, int M, int N, int K, const T* A, const T* B, T* C, float* C32,
                   bool accumulate) {
#if FT_CPU_ISA_LEVEL >= 1
  if (M <= 0 || N <= 0 || K <= 0) return false;  // the caller's empty cases
  const Operands<T> op{ta, tb, M, N, K, A, B};
  if (C32)
    gemm(op, C32, accumulate);
  else
    gemm(op, C, accumulate);
  return true;
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)B, (void)C, (void)C32,
      (void)accumulate;
  return false;
#endif
}

template bool gemm16_packed(bool, bool, int, int, int, const float*, const float*, float*, float*,
                            bool);
template bool gemm16_packed(bool, bool, int, int, int, const bf16*, const bf16*, bf16*, float*,
                            bool);
template bool gemm16_packed(bool, bool, int, int, int, const f16*, const f16*, f16*, float*, bool);

}  // namespace ft::kernels::FT_CPU_ISA_NS
FT_CPU_ISA_END
