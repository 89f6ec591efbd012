// Causal grouped-query attention on tensor cores: a fused FlashAttention-2 (Dao 2023,
// arXiv 2307.08691) for sm_80+, with mma.sync m16n8k16 (bf16/f16 in, fp32 accumulate), ldmatrix
// and cp.async through kernels/cuda/warp_matrix.cuh. Same contract as attention.cu (the SIMT
// twin) and kernels.h: q, out, dq (B, T, H, D); k, v, dk, dv (B, T, K, D), all read in place
// (no head-major copies, K/V never copied per query head); query head h uses kv head h / (H/K);
// lse (B, H, T) fp32 = the natural-log logsumexp of the scores scaled by 1/sqrt(D). Head dims
// 64 and 128 (a template argument), any T (tiles past T are zero-filled by cp.async and masked).
// Memory is linear in T: nothing of size T² exists, the backward's only scratch is Δ (B, H, T).
//
// This header holds the kernels as templates, their shared-memory sizes and their launches.
// kernels/cuda/attention_fused.cu launches the forms ft runs (ChosenForms below);
// dev/attention/fused_variants.cu, the tuning lab, instantiates the other forms the template
// parameters allow, to time them against these on a GPU. Every form gives each element the same
// arithmetic (the same bits): they differ in tiling, buffering and instruction order.
//
// Optional document masking: seg (B, T) int32 segment ids, nullptr = one document per sample.
// A query attends to the keys at or before it with its own id. The ids must not decrease along T
// within a sample (documents are contiguous runs, as in a packed sample): the kernels skip whole
// tiles by comparing ids, which is exact only then. The first token of each document sees one
// key, so its gradient is exactly 0 (dS forced to 0, as attention.cu and the CPU kernel do for
// position 0).
//
// Tiles: 4 warps, each warp owns 16 rows of the M dimension of every GEMM (PTX ISA fragment
// layouts of mma.m16n8k16: lane l holds rows l/4 and l/4 + 8 of its C tile, columns 2(l%4) and
// +1 of each 8-wide n-tile). Shared-memory tiles are row-major [token][dim] with a pitch of
// D + 8 elements, so the 8 rows one ldmatrix phase reads fall in 8 different 4-bank groups.
//
// Forward (one block per (64·MT query rows, head, batch); MT = 2 at head dim 64, 1 at 128: each
// warp then owns MT m16 tiles and every K/V fragment it reads feeds MT products): Q stays in
// shared memory; for each 64-key tile at or below the diagonal (tiles before the first query's
// document skipped; V_j loads during Q K_jᵀ, K_{j+1} during P V_j, as in FA2):
//   S = Q Kᵀ (fp32), masked to −inf; m' = max(m, rowmax S); P = exp(scale·(S − m'));
//   l = l·exp(scale·(m − m')) + rowsum P; O = O·exp(scale·(m − m')) + P V;
// P goes from the C fragments of S to the A fragments of P·V in registers (the C→A identity of
// FA2: the lane already holds the elements, rounded once to E). At the end O/l and
// lse = scale·m + log l. exp is exp2 of a fused multiply-add with the log2(e) factor folded in.
//
// Backward, deterministic without float atomics (each gradient element is accumulated by one
// lane in a fixed order):
//   1. Δ = rowsum(dO ∘ O), attention.cu's attention_delta, into the scratch.
//   2. dK/dV, one block per (64 keys, kv head, batch): the G query heads of the group in order,
//      each over its query tiles from the diagonal down. The GEMMs are computed transposed
//      (M = keys): Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, then Pᵀ = exp(scale·Sᵀ − lse) and
//      dSᵀ = Pᵀ ∘ (dPᵀ − Δ) are C fragments whose rows are keys, so the same C→A identity feeds
//      dV += Pᵀ dO and dK += dSᵀ Q with no shared-memory round trip. dK is scaled once at the end.
//      Q and dO (and their lse and Δ) are triple-buffered: tile n + 2 (of this head or the next)
//      loads into tile n − 1's buffer while tile n is computed, so one barrier a tile both
//      publishes tile n and releases that buffer.
//   3. dQ, one block per (64·MT query rows, head, batch): the forward's loop recomputing P from
//      lse, dP = dO Vᵀ, dS = P ∘ (dP − Δ), dQ += dS K (7 block-GEMMs in all instead of FA2's 5,
//      the price of no atomics); V_{j+1} loads during Q K_jᵀ and dS K_j, K_{j+1} during
//      dO V_{j+1}ᵀ (K and V single-buffered, four barriers a key tile). KvBuf = 2 (a lab form,
//      measured no faster on an H100) double-buffers K, V and the key ids: K_{j+1} and V_{j+1}
//      load into tile j − 1's buffers during all of tile j, and one barrier a tile both publishes
//      tile j and releases them (two more 64-key tiles of shared memory, still two blocks an SM
//      at both head dims). At head dim 64, MT = 2 (ft's form; MT = 1 is a lab form there, and
//      head dim 128's only one) feeds each K and V fragment to two m-tiles and takes S, dS and
//      dS K in two 32-key chunks a tile, so that dQ, dP and S fit in registers at two blocks an
//      SM; the chunks go in key order (the same bits as MT = 1).
// P and dS are rounded to E before they multiply V, dO, Q or K (as every tensor-core attention
// does); the rest is fp32 with one rounding of each output element.
//
// Everything here is in an unnamed namespace: each .cu that includes this header gets its own copy
// of the kernels it instantiates, registered with its own module (nvcc without -rdc), so ft's
// library and the lab's objects never share a kernel symbol.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/warp_matrix.cuh"

namespace ft::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;               // M rows per warp: one m16 tile
constexpr int kTileQ = kWarps * kRows;  // forward and dQ: query rows per block
constexpr int kTileK = kWarps * kRows;  // keys per tile (per block in dK/dV)
constexpr float kLog2e = 1.4426950408889634f;
// dK/dV's query tile (dkdv_launch): 64 at D = 64; 32 at D = 128, so that dK, dV (D/2 floats
// each per lane), Sᵀ and dPᵀ (tile/4 floats each) stay in registers.
template <int D>
constexpr int kPitch = D + 8;  // shared-memory row pitch in elements (16-byte multiple)

template <int D>
constexpr size_t tile_bytes(int rows) {
  return size_t(rows) * kPitch<D> * 2;
}
template <int D, int MT>
constexpr size_t fwd_smem_bytes() {
  return tile_bytes<D>(MT * kTileQ) + 2 * tile_bytes<D>(kTileK);  // Q, K, V
}
template <int D, int MT, int KvBuf>
constexpr size_t dq_smem_bytes() {
  return 2 * tile_bytes<D>(MT * kTileQ) + 2 * KvBuf * tile_bytes<D>(kTileK);  // Q, dO; K, V
}
template <int D, int TQ>
constexpr size_t dkdv_smem_bytes() {
  constexpr int NBuf = 3;
  // Q, dO NBuf times; K, V; lse and Δ NBuf times (cp.async's destinations must be dynamic
  // shared memory for the emulator, tests/cuda_emu)
  return 2 * NBuf * tile_bytes<D>(TQ) + 2 * tile_bytes<D>(kTileK) + 2 * NBuf * TQ * sizeof(float);
}

// The cp.asyncs of (R, D) tiles whose rows lie `ld` elements apart: row r of a tile from
// src + r·ld (16 bytes per copy, 8 elements); rows at or past `valid` are zero-filled (src-size 0,
// reading nothing). Every thread of the block calls load(); the caller commits and waits. A loop
// that loads many tiles builds one loader before it: each thread's source offset (32-bit: r < R
// <= 128 and ld, H·D or K·D with H, K <= 65535 by check_fused and D <= 128, is < 2^23) is
// computed once, and a copy then costs an address add, a compare and the cp.async.
// Copy i of thread t is chunk i·kThreads + t of the tile: a warp's copies cover whole rows, each
// 32-byte sector in one instruction, and the rows of a thread's copies lie kRowStep·ld apart.
// (Measured and dropped with dK/dV at three blocks an SM: each thread copying a run of one row.)
template <int R, int D>
struct TileLoader {
  static constexpr int kChunks = D / 8, kCopies = R * kChunks / kThreads;
  static constexpr int kRowStep = kThreads / kChunks;  // rows between a thread's copies
  static_assert((R * kChunks) % kThreads == 0 && kThreads % kChunks == 0, "whole copies");
  unsigned src0, step;  // the source offset of this thread's first copy; kRowStep·ld

  // This thread's first row and its element offset in the tile (recomputed at each load).
  __device__ __forceinline__ static int first_row() { return int(threadIdx.x) / kChunks; }
  __device__ __forceinline__ static int column() { return 8 * (int(threadIdx.x) % kChunks); }

  __device__ __forceinline__ explicit TileLoader(size_t ld)
      : src0(unsigned(first_row()) * unsigned(ld) + unsigned(column())),
        step(unsigned(kRowStep) * unsigned(ld)) {}
  template <typename Dev>
  __device__ __forceinline__ void load(Dev* tile, const Dev* src, int valid) const {
    const int r0 = first_row();
    Dev* dst = tile + r0 * kPitch<D> + column();
#pragma unroll
    for (int it = 0; it < kCopies; ++it) {
      const bool ok = r0 + it * kRowStep < valid;
      cp_async_cg16(dst + it * kRowStep * kPitch<D>, src + (ok ? src0 + unsigned(it) * step : 0u),
                    ok ? 16 : 0);
    }
  }
};

// One tile (a load outside a loop).
template <int R, int D, typename Dev>
__device__ __forceinline__ void load_tile(Dev* tile, const Dev* src, size_t ld, int valid) {
  TileLoader<R, D>(ld).load(tile, src, valid);
}

// ldmatrix row addresses (lane l; PTX ISA, ldmatrix): lanes 8i..8i+7 give the rows of matrix i.
// A operand, 16 x 16 at (r0, c0), no .trans: a0a1 | a2a3 | a4a5 | a6a7.
template <int D, typename Dev>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const Dev* tile, int r0, int c0,
                                       int lane) {
  ldmatrix_x4(a, tile + (r0 + (lane & 15)) * kPitch<D> + c0 + 8 * (lane >> 4));
}
// B operands of two n-tiles (n0, n0 + 8), k-slice k0..k0+15, from a tile stored [n][k]
// (K or V rows for Q·Kᵀ, dO·Vᵀ; Q or dO rows for K·Qᵀ, V·dOᵀ): b[0], b[1] of n-tile n0,
// b[2], b[3] of n0 + 8.
template <int D, typename Dev>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const Dev* tile, int n0, int k0,
                                          int lane) {
  ldmatrix_x4(b,
              tile + (n0 + (lane & 7) + 8 * (lane >> 4)) * kPitch<D> + k0 + 8 * ((lane >> 3) & 1));
}
// The same from a tile stored [k][n] (V for P·V, K for dS·K, dO for Pᵀ·dO, Q for dSᵀ·Q): .trans.
template <int D, typename Dev>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const Dev* tile, int k0, int n0,
                                          int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + (lane & 15)) * kPitch<D> + n0 + 8 * (lane >> 4));
}

template <typename E>
__device__ __forceinline__ void mma2(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                     const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16<E>(c0, a, b0, c0);
  mma_m16n8k16<E>(c1, a, b1, c1);
}

// The A fragment of k-slice s (columns 16s..16s+15) from C fragments c[2s], c[2s+1] of the same
// 16 rows: the register identity of FA2 (no shuffle, no shared memory); one cvt per pair
// (pack2_rn).
template <typename E>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack2_rn<E>(lo[0], lo[1]);
  a[1] = pack2_rn<E>(lo[2], lo[3]);
  a[2] = pack2_rn<E>(hi[0], hi[1]);
  a[3] = pack2_rn<E>(hi[2], hi[3]);
}

// The sum of a value over the 4 lanes of a quad (they hold one row of a C tile): the same bits
// in all four (each step adds the same two values).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}

// The first key tile a block of queries starting at i0 can see: with segments, the tiles whose
// last key lies in an earlier document are skipped (ids do not decrease along T).
__device__ __forceinline__ int first_key_tile(const int32_t* seg_b, int i0, int T_) {
  int j0 = 0;
  if (seg_b) {
    const int s0 = seg_b[i0];
    while (seg_b[min(j0 + kTileK, T_) - 1] < s0) j0 += kTileK;
  }
  return j0;
}

// A block's tile, head (kv head in dK/dV) and batch row. Blocks are dispatched in index order,
// x fastest, and a causal tile's work grows with its distance from the sequence start, so the
// order decides how evenly the grid ends. lpt: grid (heads, B, tiles), the tile slowest, so
// every head's longest tile is dispatched before any head's next one (longest processing time
// first across the whole grid); otherwise grid (tiles, heads, B), one head's tiles after
// another.
struct BlockTile {
  int tile, n_tiles, head, b;
};
__device__ __forceinline__ BlockTile block_tile(bool lpt) {
  if (lpt) return {int(blockIdx.z), int(gridDim.z), int(blockIdx.x), int(blockIdx.y)};
  return {int(blockIdx.x), int(gridDim.x), int(blockIdx.y), int(blockIdx.z)};
}
inline dim3 tile_grid(bool lpt, int tiles, int heads, int B) {
  return lpt ? dim3(heads, B, tiles) : dim3(tiles, heads, B);
}

// The row sees exactly one key (the first token of its document): its dS is 0.
__device__ __forceinline__ bool sees_one_key(const int32_t* seg_b, int r) {
  return r == 0 || (seg_b && seg_b[r - 1] != seg_b[r]);
}

// MT: m16 tiles per warp (16·MT query rows a warp, 64·MT a block): each K and V fragment read
// from shared memory feeds MT products (FA2's 128-row blocks at MT = 2). P of each 16-key slice
// is exponentiated just before that slice's P V products, after the barrier that makes V
// visible, in one basic block with them, so that nvcc can overlap the exponentials with the
// tensor-core work (all of P first, before the barriers, measured on an H100: forward 0.275 ->
// 0.262 ms at B4 H32 K8 T2048 D64, 0.255 -> 0.245 at D128, 0.944 -> 0.902 at T8192).
template <typename E, int D, int MT>
__global__ void __launch_bounds__(kThreads)
    attention_fused_forward_kernel(device_t<E>* out, float* lse, const device_t<E>* q,
                                   const device_t<E>* k, const device_t<E>* v, const int32_t* seg,
                                   int T_, int H, int K, float scale, bool lpt) {
  using Dev = device_t<E>;
  constexpr int kTq = MT * kTileQ, kWarpRows = MT * kRows;
  FT_DYNAMIC_SHARED(Dev, q_s);
  Dev* k_s = q_s + kTq * kPitch<D>;
  Dev* v_s = k_s + kTileK * kPitch<D>;
  __shared__ int32_t kseg_s[kTileK];
  // The last query tiles see the most keys: they go first, so that the grid ends evenly.
  const BlockTile bt = block_tile(lpt);
  const int i0 = (bt.n_tiles - 1 - bt.tile) * kTq;
  const int h = bt.head, b = bt.b, kh = h / (H / K);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qd = lane & 3;
  const size_t ldq = size_t(H) * D, ldk = size_t(K) * D;
  const int32_t* seg_b = seg ? seg + size_t(b) * T_ : nullptr;
  const float scale_log2 = scale * kLog2e;

  // K and V are single-buffered and staggered as in FA2: V_j loads while S = Q K_jᵀ and the
  // softmax run, K_{j+1} while P V_j runs. Every cp.async group is waited for by the thread
  // that issued it, and a __syncthreads then makes all threads' copies visible.
  const int j_first = first_key_tile(seg_b, i0, T_);
  const size_t kvoff = size_t(b) * T_ * ldk + size_t(kh) * D;  // key 0 of this kv head
  const TileLoader<kTileK, D> kv_load(ldk);
  load_tile<kTq, D>(q_s, q + (size_t(b) * T_ + i0) * ldq + size_t(h) * D, ldq, T_ - i0);
  kv_load.load(k_s, k + kvoff + size_t(j_first) * ldk, T_ - j_first);
  cp_async_commit();

  // This lane's rows: C fragment rows g and g + 8 of each of the warp's MT m-tiles.
  const int wr = i0 + warp * kWarpRows;
  int row[MT][2], rseg[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      row[mt][x] = wr + kRows * mt + lane / 4 + 8 * x;
      rseg[mt][x] = seg_b && row[mt][x] < T_ ? seg_b[row[mt][x]] : 0;
    }
  float o[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int t = 0; t < D / 8; ++t) o[mt][t][0] = o[mt][t][1] = o[mt][t][2] = o[mt][t][3] = 0.0f;
  float m[MT][2], l[MT][2];  // l: this lane's part of the row
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  const int last = min(i0 + kTq, T_) - 1;
  for (int j0 = j_first; j0 <= last; j0 += kTileK) {
    __syncthreads();  // no warp still reads the previous V (P V) or key ids
    kv_load.load(v_s, v + kvoff + size_t(j0) * ldk, T_ - j0);
    cp_async_commit();
    if (seg_b && threadIdx.x < kTileK)
      kseg_s[threadIdx.x] = j0 + int(threadIdx.x) < T_ ? seg_b[j0 + threadIdx.x] : 0;
    cp_async_wait<1>();  // Q and K_j here; V_j may still be in flight
    __syncthreads();

    float s[MT][kTileK / 8][4], sub[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int t = 0; t < kTileK / 8; ++t)
        s[mt][t][0] = s[mt][t][1] = s[mt][t][2] = s[mt][t][3] = 0.0f;
    // P = exp(scale·S − max) of n-tile t of m-tile mt, added into l (per m-tile, t in order).
    const auto p_slice = [&](int mt, int t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[mt][t][e] = exp2_approx(fmaf(s[mt][t][e], scale_log2, -sub[mt][e >> 1]));
        l[mt][e >> 1] += s[mt][t][e];
      }
    };
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        load_a<D>(a[mt], q_s, warp * kWarpRows + kRows * mt, 16 * kk, lane);
#pragma unroll
      for (int nt = 0; nt < kTileK / 16; ++nt) {
        uint32_t bb[4];
        load_b_nk<D>(bb, k_s, 16 * nt, 16 * kk, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma2<E>(s[mt][2 * nt], s[mt][2 * nt + 1], a[mt], bb);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // Mask where the tile crosses the m-tile's diagonal, the end of the sequence, or documents.
      const int mr = wr + kRows * mt;
      if (seg_b || j0 + kTileK - 1 > mr || j0 + kTileK > T_) {
#pragma unroll
        for (int t = 0; t < kTileK / 8; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = j0 + 8 * t + 2 * qd + (e & 1), x = e >> 1;
            if (c > row[mt][x] || c >= T_ || (seg_b && kseg_s[c - j0] != rseg[mt][x]))
              s[mt][t][e] = -INFINITY;
          }
      }
      float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
      for (int t = 0; t < kTileK / 8; ++t) {
        mx[0] = fmaxf(mx[0], fmaxf(s[mt][t][0], s[mt][t][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[mt][t][2], s[mt][t][3]));
      }
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        mx[x] = quad_max(mx[x]);
        // A row with nothing visible yet keeps m = −inf: subtract 0 instead (no −inf − −inf).
        sub[mt][x] = mx[x] == -INFINITY ? 0.0f : mx[x] * scale_log2;
        // 0 while m = −inf
        const float alpha = exp2_approx(fmaf(m[mt][x], scale_log2, -sub[mt][x]));
        m[mt][x] = mx[x];
        l[mt][x] *= alpha;
#pragma unroll
        for (int t = 0; t < D / 8; ++t) {
          o[mt][t][2 * x] *= alpha;
          o[mt][t][2 * x + 1] *= alpha;
        }
      }
    }
    __syncthreads();  // no warp still reads K_j: K_{j+1} may overwrite it
    if (j0 + kTileK <= last)
      kv_load.load(k_s, k + kvoff + size_t(j0 + kTileK) * ldk, T_ - j0 - kTileK);
    cp_async_commit();   // an empty group after the last tile
    cp_async_wait<1>();  // V_j here; K_{j+1} may still be in flight
    __syncthreads();
    // O += P V: P's A fragments from S's C fragments; V rows are the k dimension (.trans).
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        p_slice(mt, 2 * ks);
        p_slice(mt, 2 * ks + 1);
        c_to_a<E>(a[mt], s[mt][2 * ks], s[mt][2 * ks + 1]);
      }
#pragma unroll
      for (int dt = 0; dt < D / 16; ++dt) {
        uint32_t bb[4];
        load_b_kn<D>(bb, v_s, 16 * ks, 16 * dt, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma2<E>(o[mt][2 * dt], o[mt][2 * dt + 1], a[mt], bb);
      }
    }
  }
  cp_async_wait<0>();  // the last (empty) group: nothing pending at exit
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const float sum = quad_sum(l[mt][x]);
      if (row[mt][x] >= T_) continue;
      const float inv = 1.0f / sum;
      Dev* orow = out + (size_t(b) * T_ + row[mt][x]) * ldq + size_t(h) * D + 2 * qd;
#pragma unroll
      for (int t = 0; t < D / 8; ++t)
        *reinterpret_cast<uint32_t*>(orow + 8 * t) =
            pack2<E>(o[mt][t][2 * x] * inv, o[mt][t][2 * x + 1] * inv);
      if (qd == 0) lse[(size_t(b) * H + h) * T_ + row[mt][x]] = m[mt][x] * scale + logf(sum);
    }
}

// MT: m16 tiles per warp (16·MT query rows a warp, 64·MT a block), as in the forward: each K and
// V fragment read from shared memory feeds MT products. At MT = 2 the scores of a 64-key tile
// are taken in two 32-key chunks (S, dS and dQ += dS K of one chunk, then the other), so that
// dQ, dP and one chunk's S stay in registers; the chunks go in key order, so each dQ element
// sums the same k-slices in the same order as at MT = 1 (the same bits).
// KvBuf: K/V tiles in shared memory. 1: one K and one V, staggered (four barriers a key tile).
// 2: two of each (and two copies of the key ids): tile j + 1 loads into the buffers of tile
// j − 1 while tile j is computed, so one barrier a tile both publishes tile j and releases
// them. Only the load schedule differs: every element's arithmetic is the same (the same bits).
// Ilv (KvBuf 1 only): in a chunk that no m-tile of the warp needs masked (off the diagonal), dS of
// each 16-key slice is computed just before that slice's dQ += dS K products, in one basic block
// with them, so that nvcc can overlap the exponentials with the tensor-core work.
template <typename E, int D, int MT, int KvBuf, bool Ilv = false>
__global__ void __launch_bounds__(kThreads)
    attention_fused_dq_kernel(device_t<E>* dq, const device_t<E>* dout, const float* lse,
                              const float* delta, const device_t<E>* q, const device_t<E>* k,
                              const device_t<E>* v, const int32_t* seg, int T_, int H, int K,
                              float scale, bool lpt) {
  using Dev = device_t<E>;
  constexpr int kTq = MT * kTileQ, kWarpRows = MT * kRows;
  constexpr int kChunk = kTileK / MT;  // keys of a chunk of S and dS
  static_assert(KvBuf == 1 || KvBuf == 2, "one or two K/V buffers");
  FT_DYNAMIC_SHARED(Dev, q_s);
  Dev* do_s = q_s + kTq * kPitch<D>;
  Dev* kv_s = do_s + kTq * kPitch<D>;  // [KvBuf][K, V][kTileK][pitch]
  __shared__ int32_t kseg_all[KvBuf][kTileK];
  const BlockTile bt = block_tile(lpt);
  const int i0 = (bt.n_tiles - 1 - bt.tile) * kTq;
  const int h = bt.head, b = bt.b, kh = h / (H / K);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qd = lane & 3;
  const size_t ldq = size_t(H) * D, ldk = size_t(K) * D;
  const int32_t* seg_b = seg ? seg + size_t(b) * T_ : nullptr;
  const float scale_log2 = scale * kLog2e;

  // KvBuf 1: K and V single-buffered and staggered: dP = dO V_jᵀ first, then V_{j+1} loads
  // during S = Q K_jᵀ and dQ += dS K_j, and K_{j+1} during the next dP. KvBuf 2: K_{j+1},
  // V_{j+1} and their key ids load into the other buffers during all of tile j.
  const int j_first = first_key_tile(seg_b, i0, T_);
  const size_t kvoff = size_t(b) * T_ * ldk + size_t(kh) * D;  // key 0 of this kv head
  const size_t qoff = (size_t(b) * T_ + i0) * ldq + size_t(h) * D;
  load_tile<kTq, D>(q_s, q + qoff, ldq, T_ - i0);
  load_tile<kTq, D>(do_s, dout + qoff, ldq, T_ - i0);
  const TileLoader<kTileK, D> kv_load(ldk);
  // Key tile j1's K and V into buffer `buf`, and its key ids (with segments).
  const auto stage_k = [&](int j1, int buf) {
    kv_load.load(kv_s + 2 * buf * kTileK * kPitch<D>, k + kvoff + size_t(j1) * ldk, T_ - j1);
    if (seg_b && threadIdx.x < kTileK)
      kseg_all[buf][threadIdx.x] = j1 + int(threadIdx.x) < T_ ? seg_b[j1 + threadIdx.x] : 0;
  };
  const auto stage_v = [&](int j1, int buf) {
    kv_load.load(kv_s + (2 * buf + 1) * kTileK * kPitch<D>, v + kvoff + size_t(j1) * ldk, T_ - j1);
  };
  if constexpr (KvBuf == 1) {
    stage_v(j_first, 0);
    cp_async_commit();
    stage_k(j_first, 0);
    cp_async_commit();
  } else {
    stage_k(j_first, 0);
    stage_v(j_first, 0);
    cp_async_commit();  // Q, dO and key tile j_first
  }

  // This lane's rows: C fragment rows g and g + 8 of each of the warp's MT m-tiles.
  const int wr = i0 + warp * kWarpRows;
  int row[MT][2], rseg[MT][2];
  float lse2[MT][2], dlt[MT][2];
  bool one[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      row[mt][x] = wr + kRows * mt + lane / 4 + 8 * x;
      const bool in = row[mt][x] < T_;
      rseg[mt][x] = seg_b && in ? seg_b[row[mt][x]] : 0;
      const size_t st = (size_t(b) * H + h) * T_ + row[mt][x];
      lse2[mt][x] = in ? lse[st] * kLog2e : 0.0f;
      dlt[mt][x] = in ? delta[st] : 0.0f;
      one[mt][x] = in && sees_one_key(seg_b, row[mt][x]);
    }
  float acc[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      acc[mt][t][0] = acc[mt][t][1] = acc[mt][t][2] = acc[mt][t][3] = 0.0f;

  const int last = min(i0 + kTq, T_) - 1;
  for (int j0 = j_first, buf = 0; j0 <= last; j0 += kTileK, buf ^= KvBuf - 1) {
    const bool more = j0 + kTileK <= last;
    const Dev* k_s = kv_s + 2 * buf * kTileK * kPitch<D>;
    const Dev* v_s = k_s + kTileK * kPitch<D>;
    const int32_t* kseg_s = kseg_all[buf];
    if constexpr (KvBuf == 1) {
      cp_async_wait<1>();  // V_j here (Q and dO too); K_j may still be in flight
      __syncthreads();
    } else {
      cp_async_wait<0>();  // key tile j here (Q and dO too)
      __syncthreads();     // tile j visible; every warp is done with tile j − 1's buffers
      if (more) {
        stage_k(j0 + kTileK, buf ^ 1);
        stage_v(j0 + kTileK, buf ^ 1);
      }
      cp_async_commit();  // an empty group after the last tile
    }
    float dp[MT][kTileK / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int t = 0; t < kTileK / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[mt][t][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ado[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        load_a<D>(ado[mt], do_s, warp * kWarpRows + kRows * mt, 16 * kk, lane);
#pragma unroll
      for (int nt = 0; nt < kTileK / 16; ++nt) {
        uint32_t bb[4];
        load_b_nk<D>(bb, v_s, 16 * nt, 16 * kk, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma2<E>(dp[mt][2 * nt], dp[mt][2 * nt + 1], ado[mt], bb);
      }
    }
    if constexpr (KvBuf == 1) {
      __syncthreads();  // no warp still reads V_j
      if (more) stage_v(j0 + kTileK, 0);
      cp_async_commit();   // an empty group after the last tile
      cp_async_wait<1>();  // K_j here; V_{j+1} may still be in flight
      __syncthreads();
    }
#pragma unroll
    for (int ch = 0; ch < MT; ++ch) {
      const int jc = j0 + ch * kChunk;  // the chunk's first key
      // A chunk past the warp's last row adds nothing (warp-uniform: no barrier inside).
      if (MT > 1 && jc > wr + kWarpRows - 1) continue;
      float s[MT][kChunk / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int t = 0; t < kChunk / 8; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][t][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t aq[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          load_a<D>(aq[mt], q_s, warp * kWarpRows + kRows * mt, 16 * kk, lane);
#pragma unroll
        for (int nt = 0; nt < kChunk / 16; ++nt) {
          uint32_t bb[4];
          load_b_nk<D>(bb, k_s, ch * kChunk + 16 * nt, 16 * kk, lane);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma2<E>(s[mt][2 * nt], s[mt][2 * nt + 1], aq[mt], bb);
        }
      }
      // dS = P ∘ (dP − Δ). The masks and the one-key rows cost instructions per element: they
      // are applied only where the chunk needs them (warp-uniform conditions per m-tile: the
      // diagonal, the end of the sequence, documents; rows that see one key exist only in the
      // first query tile without segments).
      // Two copies of the loop, chosen once per m-tile (nvcc does not hoist the test itself).
      // dS of n-tile t of m-tile mt, in place of its S.
      const auto ds_el = [&](auto general, int mt, int t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = e >> 1;
          const float dpe = dp[mt][ch * (kChunk / 8) + t][e];
          float p = exp2_approx(fmaf(s[mt][t][e], scale_log2, -lse2[mt][x]));
          float ds;
          if constexpr (decltype(general)::value) {
            const int c = jc + 8 * t + 2 * qd + (e & 1);
            if (c > row[mt][x] || c >= T_ || (seg_b && kseg_s[c - j0] != rseg[mt][x])) p = 0.0f;
            ds = one[mt][x] ? 0.0f : p * (dpe - dlt[mt][x]);
          } else {
            ds = p * (dpe - dlt[mt][x]);
          }
          s[mt][t][e] = ds;
        }
      };
      // dQ += dS K for 16-key slice ks of the chunk: K rows are the k dimension (.trans).
      const auto dq_slice = [&](int ks) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) c_to_a<E>(a[mt], s[mt][2 * ks], s[mt][2 * ks + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 16; ++dt) {
          uint32_t bb[4];
          load_b_kn<D>(bb, k_s, ch * kChunk + 16 * ks, 16 * dt, lane);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma2<E>(acc[mt][2 * dt], acc[mt][2 * dt + 1], a[mt], bb);
        }
      };
      // A chunk with rows that see one key (i0 = 0 without segments) crosses the diagonal. The
      // first m-tile's test is the weakest: a chunk it needs unmasked, none needs masked.
      const auto needs_mask = [&](int mt) {
        return seg_b || jc + kChunk - 1 > wr + kRows * mt || jc + kChunk > T_;
      };
      if (Ilv && !needs_mask(0)) {
#pragma unroll
        for (int ks = 0; ks < kChunk / 16; ++ks) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            ds_el(std::false_type{}, mt, 2 * ks);
            ds_el(std::false_type{}, mt, 2 * ks + 1);
          }
          dq_slice(ks);
        }
        continue;
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (needs_mask(mt)) {
#pragma unroll
          for (int t = 0; t < kChunk / 8; ++t) ds_el(std::true_type{}, mt, t);
        } else {
#pragma unroll
          for (int t = 0; t < kChunk / 8; ++t) ds_el(std::false_type{}, mt, t);
        }
      }
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks) dq_slice(ks);
    }
    if constexpr (KvBuf == 1) {
      __syncthreads();  // no warp still reads K_j or the key ids
      if (more) stage_k(j0 + kTileK, 0);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();  // the last (empty) groups: nothing pending at exit
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      if (row[mt][x] >= T_) continue;
      Dev* grow = dq + (size_t(b) * T_ + row[mt][x]) * ldq + size_t(h) * D + 2 * qd;
#pragma unroll
      for (int t = 0; t < D / 8; ++t)
        *reinterpret_cast<uint32_t*>(grow + 8 * t) =
            pack2<E>(acc[mt][t][2 * x] * scale, acc[mt][t][2 * x + 1] * scale);
    }
}

// TQ: query rows of a tile. MinB: blocks an SM the registers must allow (__launch_bounds__).
// Interleave: Pᵀ and dSᵀ of each 16-query slice are computed just before that slice's dV and dK
// products, in one basic block with them, so that the compiler can overlap the exponentials with
// the tensor-core work (otherwise the whole tile's Pᵀ and dSᵀ come first, in the branch that
// chose the masked or unmasked loop, and the products after it).
template <typename E, int D, int TQ, int MinB, bool Interleave>
__global__ void __launch_bounds__(kThreads, MinB)
    attention_fused_dkdv_kernel(device_t<E>* dk, device_t<E>* dv, const device_t<E>* dout,
                                const float* lse, const float* delta, const device_t<E>* q,
                                const device_t<E>* k, const device_t<E>* v, const int32_t* seg,
                                int T_, int H, int K, float scale, bool lpt) {
  using Dev = device_t<E>;
  constexpr int kTq = TQ;
  FT_DYNAMIC_SHARED(Dev, k_s);
  Dev* v_s = k_s + kTileK * kPitch<D>;
  Dev* qdo_s = v_s + kTileK * kPitch<D>;  // [buffer][Q, dO][kTq][pitch]
  constexpr int NBuf = 3;                 // query tiles in shared memory (see the loop)
  // Per query of the tile, per buffer: lse, Δ, segment id, "sees one key".
  float(*lse_s)[kTq] = reinterpret_cast<float(*)[kTq]>(qdo_s + 2 * NBuf * kTq * kPitch<D>);
  float(*delta_s)[kTq] = lse_s + NBuf;
  __shared__ int32_t qseg_s[NBuf][kTq];
  __shared__ bool one_s[NBuf][kTq];
  __shared__ int32_t kseg_s[kTileK];  // the keys' segment ids (read where documents mask)
  // The first key tiles are seen by the most queries: with lpt they go first; otherwise (the
  // order this kernel had before lpt was measured) one head's last key tile goes first.
  const BlockTile bt = block_tile(lpt);
  const int j0 = (lpt ? bt.tile : bt.n_tiles - 1 - bt.tile) * kTileK;
  const int kh = bt.head, b = bt.b, group = H / K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, qd = lane & 3;
  const size_t ldq = size_t(H) * D, ldk = size_t(K) * D;
  const int32_t* seg_b = seg ? seg + size_t(b) * T_ : nullptr;
  const float scale_log2 = scale * kLog2e;

  const size_t koff = (size_t(b) * T_ + j0) * ldk + size_t(kh) * D;
  load_tile<kTileK, D>(k_s, k + koff, ldk, T_ - j0);
  load_tile<kTileK, D>(v_s, v + koff, ldk, T_ - j0);

  // This lane's two keys (C rows of the transposed products): key0 and key0 + 8.
  const int wk = j0 + warp * kRows, key0 = wk + lane / 4;
  if (seg_b && threadIdx.x < kTileK)
    kseg_s[threadIdx.x] = j0 + int(threadIdx.x) < T_ ? seg_b[j0 + threadIdx.x] : 0;
  // Queries of a later document than the tile's last key see none of it.
  const int last_seg = seg_b ? seg_b[min(j0 + kTileK, T_) - 1] : 0;
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[t][e] = dv_acc[t][e] = 0.0f;

  // The query tiles: for each query head of the group in order, from the tile holding j0 (the
  // queries before it see no key of this tile) to the end, or to the first tile of a later
  // document than the tile's last key. Flattened into one sequence n = gi·n_i + i, so that the
  // next tile's Q and dO load (double-buffered) while this one is computed.
  const int i_begin = j0 / kTq * kTq;
  int i_end = i_begin + kTq;
  while (i_end < T_ && !(seg_b && seg_b[i_end] > last_seg)) i_end += kTq;
  const int n_all = group * ((i_end - i_begin) / kTq);
  // A tile as (query head, first row), walked without divisions: the rows step by kTq to i_end,
  // then the next head of the group starts again at i_begin.
  struct QueryTile {
    int h, i0;
  };
  const auto next_tile = [&](QueryTile t) {
    t.i0 += kTq;
    if (t.i0 == i_end) {
      t.i0 = i_begin;
      ++t.h;
    }
    return t;
  };
  const TileLoader<kTq, D> q_load(ldq);
  // Issues tile t's copies into buffer `buf` and writes its per-query values.
  auto stage = [&](QueryTile t, int buf) {
    const int h = t.h, i0 = t.i0;
    const size_t qoff = (size_t(b) * T_ + i0) * ldq + size_t(h) * D;
    Dev* qb = qdo_s + 2 * buf * kTq * kPitch<D>;
    q_load.load(qb, q + qoff, T_ - i0);
    q_load.load(qb + kTq * kPitch<D>, dout + qoff, T_ - i0);
    // lse and Δ by cp.async, with the tile's Q and dO, from threads [0, kTq) and [kTq, 2 kTq)
    // (zero-filled past T); the last kTq threads write the segment ids and the one-key flags.
    // (The first kTq threads loading all four and waiting for the loads, measured on an H100:
    // backward 0.938 -> 0.893 ms at B4 H32 K8 T2048 D64, 0.925 -> 0.902 at D128, 3.167 -> 3.072
    // at T8192.)
    const int x = int(threadIdx.x) % kTq, r = i0 + x;
    const bool in = r < T_;
    const size_t st = (size_t(b) * H + h) * T_ + (in ? r : 0);
    if (threadIdx.x < kTq)
      cp_async_ca<4>(&lse_s[buf][x], lse + st, in ? 4 : 0);
    else if (threadIdx.x < 2 * kTq)
      cp_async_ca<4>(&delta_s[buf][x], delta + st, in ? 4 : 0);
    if (threadIdx.x >= kThreads - kTq) {
      qseg_s[buf][x] = seg_b && in ? seg_b[r] : 0;
      one_s[buf][x] = in && sees_one_key(seg_b, r);
    }
  };
  // One query tile's products into dK and dV, from buffer `buf`; i0 its first row.
  const auto tile = [&](int buf, int i0) {
    const Dev* q_s = qdo_s + 2 * buf * kTq * kPitch<D>;
    const Dev* do_s = q_s + kTq * kPitch<D>;

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys of this warp x kTq queries).
    float st[kTq / 8][4], dpt[kTq / 8][4];
#pragma unroll
    for (int t = 0; t < kTq / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[t][e] = dpt[t][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      load_a<D>(ak, k_s, warp * kRows, 16 * kk, lane);
      load_a<D>(av, v_s, warp * kRows, 16 * kk, lane);
#pragma unroll
      for (int nt = 0; nt < kTq / 16; ++nt) {
        uint32_t bb[4];
        load_b_nk<D>(bb, q_s, 16 * nt, 16 * kk, lane);
        mma2<E>(st[2 * nt], st[2 * nt + 1], ak, bb);
        load_b_nk<D>(bb, do_s, 16 * nt, 16 * kk, lane);
        mma2<E>(dpt[2 * nt], dpt[2 * nt + 1], av, bb);
      }
    }
    // Pᵀ and dSᵀ: lse and Δ belong to the column (the query); this lane's columns come in
    // pairs (2q, 2q + 1), read as one float2. Masks only where the tile needs them
    // (block-uniform: the block's keys reach past the tile's first query, the tile crosses the
    // end of the sequence, or documents); queries that see one key exist only in the first query
    // tile without segments.
    // Two copies of the loop, chosen once per tile (nvcc does not hoist the test itself).
    const auto pds = [&](auto general, int t) {
      const int c0 = 8 * t + 2 * qd;
      float2 ls = *reinterpret_cast<const float2*>(&lse_s[buf][c0]);
      ls = make_float2(ls.x * kLog2e, ls.y * kLog2e);
      const float2 dl = *reinterpret_cast<const float2*>(&delta_s[buf][c0]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ci = c0 + (e & 1), x = e >> 1;
        float p = exp2_approx(fmaf(st[t][e], scale_log2, -(e & 1 ? ls.y : ls.x)));
        float ds;
        if constexpr (decltype(general)::value) {
          const int r = i0 + ci, key = key0 + 8 * x;
          if (key > r || r >= T_ || key >= T_ || (seg_b && qseg_s[buf][ci] != kseg_s[key - j0]))
            p = 0.0f;
          ds = one_s[buf][ci] ? 0.0f : p * (dpt[t][e] - (e & 1 ? dl.y : dl.x));
        } else {
          ds = p * (dpt[t][e] - (e & 1 ? dl.y : dl.x));
        }
        st[t][e] = p;
        dpt[t][e] = ds;
      }
    };
    // dV += Pᵀ dO and dK += dSᵀ Q for query slice ks: dO and Q rows are the k dimension (.trans).
    const auto dvdk = [&](int ks) {
      uint32_t ap[4], ads[4];
      c_to_a<E>(ap, st[2 * ks], st[2 * ks + 1]);
      c_to_a<E>(ads, dpt[2 * ks], dpt[2 * ks + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 16; ++dt) {
        uint32_t bb[4];
        load_b_kn<D>(bb, do_s, 16 * ks, 16 * dt, lane);
        mma2<E>(dv_acc[2 * dt], dv_acc[2 * dt + 1], ap, bb);
        load_b_kn<D>(bb, q_s, 16 * ks, 16 * dt, lane);
        mma2<E>(dk_acc[2 * dt], dk_acc[2 * dt + 1], ads, bb);
      }
    };
    const auto pds_tile = [&](auto general) {
#pragma unroll
      for (int t = 0; t < kTq / 8; ++t) pds(general, t);
    };
    const auto pds_dvdk = [&](auto general) {
#pragma unroll
      for (int ks = 0; ks < kTq / 16; ++ks) {
        pds(general, 2 * ks);
        pds(general, 2 * ks + 1);
        dvdk(ks);
      }
    };
    // A tile with queries that see one key (i0 = 0 without segments) crosses the diagonal. The
    // test is the block's (its 64 keys), not the warp's: the same on the diagonal tile at
    // TQ = 64, and two registers fewer across the loop.
    const bool general = seg_b || j0 + kTileK - 1 > i0 || i0 + kTq > T_ || j0 + kTileK > T_;
    if constexpr (Interleave) {
      if (general)
        pds_dvdk(std::true_type{});
      else
        pds_dvdk(std::false_type{});
    } else {
      if (general)
        pds_tile(std::true_type{});
      else
        pds_tile(std::false_type{});
#pragma unroll
      for (int ks = 0; ks < kTq / 16; ++ks) dvdk(ks);
    }
  };
  QueryTile cur{kh * group, i_begin};
  stage(cur, 0);
  cp_async_commit();  // K, V (and the key ids) and the first query tile
  // Three buffers: tile n + 2 loads into the buffer of tile n − 1, which the barrier that
  // makes tile n visible has also released, so that barrier is the tile's only one.
  QueryTile ahead = next_tile(cur);  // tile n + 1
  if (n_all > 1) stage(ahead, 1);
  cp_async_commit();
  for (int n = 0, buf = 0; n < n_all; ++n, buf = buf == 2 ? 0 : buf + 1) {
    cp_async_wait<1>();  // tile n here; tile n + 1 may be in flight
    __syncthreads();     // tile n visible; every warp is done with tile n − 1
    const QueryTile ahead2 = next_tile(ahead);
    if (n + 2 < n_all) stage(ahead2, buf == 0 ? 2 : buf - 1);
    cp_async_commit();  // an empty group near the end
    tile(buf, cur.i0);
    cur = ahead;
    ahead = ahead2;
  }
  cp_async_wait<0>();  // the last (empty) groups: nothing pending at exit
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int key = key0 + 8 * x;
    if (key >= T_) continue;
    const size_t off = (size_t(b) * T_ + key) * ldk + size_t(kh) * D + 2 * qd;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      *reinterpret_cast<uint32_t*>(dk + off + 8 * t) =
          pack2<E>(dk_acc[t][2 * x] * scale, dk_acc[t][2 * x + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + 8 * t) =
          pack2<E>(dv_acc[t][2 * x], dv_acc[t][2 * x + 1]);
    }
  }
}

inline void check_fused(const char* what, int B, int T_, int H, int K, int D,
                        std::initializer_list<const void*> ptrs) {
  if (B < 0 || T_ < 0 || H <= 0 || K <= 0 || H % K != 0 || !attention_fused_supported(D))
    throw ::ft::Error(std::string(what) + ": unsupported shape B=" + std::to_string(B) +
                      " T=" + std::to_string(T_) + " H=" + std::to_string(H) +
                      " K=" + std::to_string(K) + " D=" + std::to_string(D) +
                      " (the fused kernel needs H a multiple of K and a head dim of 64 or 128)");
  if (H > 65535 || B > 65535 || (T_ + kTileK - 1) / kTileK > 65535)  // gridDim.y, .z limits
    throw ::ft::Error(std::string(what) + ": B=" + std::to_string(B) + ", H=" + std::to_string(H) +
                      " or T/64=" + std::to_string((T_ + kTileK - 1) / kTileK) +
                      " exceeds the grid's 65535 (split the batch or the sequence)");
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw ::ft::Error(std::string(what) +
                        ": a tensor is not 16-byte aligned (cp.async copies 16 bytes; "
                        "pass whole allocations or aligned views)");
}

// Opts a kernel into more than the default 48 KiB of dynamic shared memory where it needs it.
inline void allow_smem(const void* kernel, size_t bytes, const char* what) {
  if (bytes <= (48u << 10)) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) !=
      cudaSuccess)
    throw ::ft::Error(std::string(what) + ": the device cannot give a block " +
                      std::to_string(bytes) + " bytes of shared memory (sm_80+ needed)");
}

inline float softmax_scale(int D) { return 1.0f / std::sqrt(float(D)); }

// The forms ft launches (attention_fused.cu), per head dim. The tuning lab's defaults
// (dev/attention/fused_variants.cu) are these, so that its default tuning times what ft runs; a
// lab form that wins becomes ft's by a change here (the measurements: dev/attention/NOTES.md).
template <int D>
struct ChosenForms {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr bool kLpt = true;  // every grid longest tile first across heads (block_tile)
  // Forward: m16 tiles per warp (two at D 64: each K/V fragment feeds two products).
  static constexpr int kFwdMt = D == 64 ? 2 : 1;
  // dK/dV: 32-query tiles at one block an SM at head dim 128, 64 at two at head dim 64 (so that
  // dK, dV, Sᵀ and dPᵀ stay in registers); Pᵀ, dSᵀ interleaved with the dV, dK products.
  static constexpr int kDkdvTq = D == 128 ? 32 : 64, kDkdvMinB = D == 128 ? 1 : 2;
  static constexpr bool kDkdvIlv = true;
  // dQ: m16 tiles per warp, K/V buffers, dS interleaved with the dQ += dS K products.
  static constexpr int kDqMt = D == 64 ? 2 : 1, kDqKvBuf = 1;
  static constexpr bool kDqIlv = true;
};

// The launches, one per kernel, for any form: the grid (in lpt order or head order), the block,
// the dynamic shared memory.
template <typename T, int D, int MT>
void forward_launch(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* seg,
                    int B, int T_, int H, int K, bool lpt, void* stream) {
  auto kernel = attention_fused_forward_kernel<T, D, MT>;
  const size_t smem = fwd_smem_bytes<D, MT>();
  constexpr int kTq = MT * kTileQ;
  allow_smem(reinterpret_cast<const void*>(kernel), smem, "attention_fused_forward");
  FT_LAUNCH((attention_fused_forward_kernel<T, D, MT>), tile_grid(lpt, (T_ + kTq - 1) / kTq, H, B),
            kThreads, smem, stream)
  (dev(out), lse, dev(q), dev(k), dev(v), seg, T_, H, K, softmax_scale(D), lpt);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T, int D, int TQ, int MinB, bool Interleave>
void dkdv_launch(T* dk, T* dv, const T* dout, const float* lse, const float* delta, const T* q,
                 const T* k, const T* v, const int32_t* seg, int B, int T_, int H, int K,
                 float scale, bool lpt, void* stream) {
  auto dkdv = attention_fused_dkdv_kernel<T, D, TQ, MinB, Interleave>;
  constexpr size_t smem = dkdv_smem_bytes<D, TQ>();
  allow_smem(reinterpret_cast<const void*>(dkdv), smem, "attention_fused_backward");
  FT_LAUNCH((attention_fused_dkdv_kernel<T, D, TQ, MinB, Interleave>),
            tile_grid(lpt, (T_ + kTileK - 1) / kTileK, K, B), kThreads, smem, stream)
  (dev(dk), dev(dv), dev(dout), lse, delta, dev(q), dev(k), dev(v), seg, T_, H, K, scale, lpt);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T, int D, int MT, int KvBuf, bool Ilv>
void dq_launch(T* dq, const T* dout, const float* lse, const float* delta, const T* q, const T* k,
               const T* v, const int32_t* seg, int B, int T_, int H, int K, float scale, bool lpt,
               void* stream) {
  auto dqk = attention_fused_dq_kernel<T, D, MT, KvBuf, Ilv>;
  constexpr size_t smem = dq_smem_bytes<D, MT, KvBuf>();
  constexpr int kTq = MT * kTileQ;
  allow_smem(reinterpret_cast<const void*>(dqk), smem, "attention_fused_backward");
  FT_LAUNCH((attention_fused_dq_kernel<T, D, MT, KvBuf, Ilv>),
            tile_grid(lpt, (T_ + kTq - 1) / kTq, H, B), kThreads, smem, stream)
  (dev(dq), dev(dout), lse, delta, dev(q), dev(k), dev(v), seg, T_, H, K, scale, lpt);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace ft::kernels::cuda
