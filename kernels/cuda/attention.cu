// Causal grouped-query attention on the GPU: a SIMT FlashAttention-2 (Dao 2023) with the
// logsumexp contract of kernels/kernels.h; nothing of size (B, H, T, T) is ever stored.
//
// This is the correct, portable first version: fp32 FMAs on the CUDA cores, the same source
// compiled by nvcc and run by the CPU emulator (tests/cuda_emu/). It does not reach the MFU goal
// of issue 9: attention's FLOPs must move to tensor cores, through cuBLASLt batched GEMMs over
// chunks of heads with a fused masked-softmax kernel that writes the logsumexp, or through an
// mma.sync/wgmma kernel of the same tiling. Whichever replaces it keeps this file as its plain
// twin, the one the emulator runs and the GPU test compares against.
//
// Layouts: q, out, dq (B, T, H, D); k, v, dk, dv (B, T, K, D); lse, Δ (B, H, T) fp32. Query head
// h uses kv head h / (H / K). D ≤ kMaxD. All math fp32; each output element rounded once.
//
// Forward (attention_forward_kernel), one block per (query tile of kFwdRows rows, head, batch):
// the query rows are staged in shared memory; for each key tile of kKeys keys on or below the
// diagonal, K and V are staged in shared memory, each warp takes its query rows, lane j scores
// key j, and the row's running max m and sum l are updated online:
//   m' = max(m, max_j s_j), p_j = exp(s_j − m'), l = l·exp(m − m') + Σ p_j,
//   O = O·exp(m − m') + Σ_j p_j V_j   (lane owns output dims lane, lane + 32, ...);
// then O /= l and lse = m + log l.
//
// Backward, deterministic without float atomics (each gradient element is summed by one thread
// in a fixed order), in three kernels:
//   1. attention_delta_kernel: Δ = rowsum(dO ∘ O) per query row, into the caller's scratch.
//   2. attention_backward_dkdv_kernel, one block per (key tile, kv head, batch): loops over the
//      query heads of the group in order, and over the query rows at or below the tile, four
//      at a time (one per warp): recompute P = exp(S − lse), dP = dO Vᵀ, dS = P ∘ (dP − Δ);
//      then thread d accumulates dV[:, d] += Pᵀ dO[:, d] and dK[:, d] += dSᵀ Q[:, d] in
//      registers over all kKeys keys of the tile (threads d ≥ D idle in that step: a cost of
//      small heads this version accepts).
//   3. attention_backward_dq_kernel, one block per (query tile, head, batch): the forward's
//      loop with dS in place of P and K in place of V: dQ = dS K / sqrt(D).
// Position 0 sees one key: its softmax is the constant 1 and its gradient exactly 0, as in the
// CPU kernel (dP − Δ would otherwise leave a rounding difference as the whole gradient).
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace ft::kernels::cuda {
namespace {

// Loops over the accumulator arrays (acc, dk_acc, dv_acc) carry `#pragma unroll`: an array
// indexed by a loop ptxas did not unroll lives in local memory, which the build rejects.
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxD = 128;                // head dims: four per lane, one per backward thread
constexpr int kDimsPerLane = kMaxD / 32;  // output dims a lane owns (lane + 32·c)
constexpr int kKeys = 32;                 // keys per tile: one per lane
constexpr int kFwdRowsPerWarp = 4;        // forward: 16 query rows per block
constexpr int kFwdRows = kWarps * kFwdRowsPerWarp;
constexpr int kDqRowsPerWarp = 2;  // dQ: 8 rows, so Q, dO, K and V fit in 48 KiB
constexpr int kDqRows = kWarps * kDqRowsPerWarp;
static_assert(kThreads == kMaxD, "the dK/dV kernel gives each thread one head dim");

// Σ_d a[d]·b[d] over shared-memory rows (b is a K or V row padded to kMaxD + 1, so the 32 lanes
// reading 32 different rows hit 32 different banks).
__device__ __forceinline__ float dot(const float* a, const float* b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// rows × D elements of a (.., ld) tensor starting at src into dst (row stride dst_ld), as fp32;
// rows at or past `valid` are zero. Called by every thread of the block.
template <typename T>
__device__ __forceinline__ void stage_rows(float* dst, int dst_ld, const T* src, size_t ld,
                                           int rows, int valid, int D) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D, d = e % D;
    dst[r * dst_ld + d] = r < valid ? to_float(src[size_t(r) * ld + d]) : 0.0f;
  }
}

template <typename T>
__global__ void attention_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                                         int T_, int H, int K, int D, float scale) {
  __shared__ float q_s[kFwdRows][kMaxD];
  __shared__ float k_s[kKeys][kMaxD + 1];
  __shared__ float v_s[kKeys][kMaxD];
  __shared__ float s_s[kWarps][kKeys];  // each warp's current row of S
  __shared__ float p_s[kWarps][kKeys];  // and of P
  // The last query tiles see the most keys: they go first so that the grid ends evenly.
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kFwdRows;
  const int h = blockIdx.y, b = blockIdx.z, kh = h / (H / K);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t ldq = size_t(H) * D, ldk = size_t(K) * D;
  stage_rows(&q_s[0][0], kMaxD, q + (size_t(b) * T_ + i0) * ldq + size_t(h) * D, ldq, kFwdRows,
             T_ - i0, D);

  float acc[kFwdRowsPerWarp][kDimsPerLane];
  float m[kFwdRowsPerWarp], l[kFwdRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) acc[rr][c] = 0.0f;
  }
  const int last = min(i0 + kFwdRows, T_) - 1;  // the tile's last query row
  for (int j0 = 0; j0 <= last; j0 += kKeys) {
    __syncthreads();  // Q is staged; no warp still reads the previous K, V tile
    const size_t koff = (size_t(b) * T_ + j0) * ldk + size_t(kh) * D;
    stage_rows(&k_s[0][0], kMaxD + 1, k + koff, ldk, kKeys, T_ - j0, D);
    stage_rows(&v_s[0][0], kMaxD, v + koff, ldk, kKeys, T_ - j0, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
      const int r = rr * kWarps + warp;  // interleaved: the diagonal's short rows are shared
      const int i = i0 + r;
      if (i >= T_ || i < j0) continue;       // the same for the whole warp
      const int n = min(kKeys, i - j0 + 1);  // visible keys of the tile (j0 + lane ≤ i)
      // The row's scores, then its probabilities, go through shared memory and every lane reads
      // all of them back (broadcasts) in the same order: the max and the sum are the same bits
      // in every lane, for two warp barriers per row and no shuffles.
      s_s[warp][lane] = lane < n ? dot(q_s[r], k_s[lane], D) * scale : -INFINITY;
      __syncwarp();
      float mx = m[rr];
      for (int j = 0; j < n; ++j) mx = fmaxf(mx, s_s[warp][j]);  // finite: key j0 is visible
      const float alpha = expf(m[rr] - mx);  // exp(−inf) = 0 on the first tile
      p_s[warp][lane] = lane < n ? expf(s_s[warp][lane] - mx) : 0.0f;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kDimsPerLane; ++c) acc[rr][c] *= alpha;
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float pj = p_s[warp][j];
        sum += pj;
#pragma unroll
        for (int c = 0; c < kDimsPerLane; ++c)
          if (lane + 32 * c < D) acc[rr][c] += pj * v_s[j][lane + 32 * c];
      }
      l[rr] = l[rr] * alpha + sum;
      m[rr] = mx;
      // No barrier needed before the next row: its s_s writes come after this row's second
      // barrier (all s_s reads done), its p_s writes after its own first one (all p_s reads done).
    }
  }
#pragma unroll
  for (int rr = 0; rr < kFwdRowsPerWarp; ++rr) {
    const int i = i0 + rr * kWarps + warp;
    if (i >= T_) continue;
    const float inv = 1.0f / l[rr];
    T* o = out + (size_t(b) * T_ + i) * ldq + size_t(h) * D;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c)
      if (lane + 32 * c < D) o[lane + 32 * c] = from_float<T>(acc[rr][c] * inv);
    if (lane == 0) lse[(size_t(b) * H + h) * T_ + i] = m[rr] + logf(l[rr]);
  }
}

// Δ (B, H, T) = rowsum(dO ∘ O): one warp per (b, t, h) row, rows numbered as in (B, T, H).
template <typename T>
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, int B, int T_,
                                       int H, int D) {
  __shared__ float part_s[kWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t row = size_t(blockIdx.x) * kWarps + warp;
  if (row >= size_t(B) * T_ * H) return;  // whole warps only; no block barrier follows
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) s += to_float(dout[row * D + d]) * to_float(out[row * D + d]);
  // Lane 0 adds the 32 partials in lane order: one warp barrier rather than five shuffles.
  part_s[warp][lane] = s;
  __syncwarp();
  if (lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < 32; ++j) sum += part_s[warp][j];
    const int h = int(row % H), t = int(row / H % T_), b = int(row / H / T_);
    delta[(size_t(b) * H + h) * T_ + t] = sum;
  }
}

template <typename T>
__global__ void attention_backward_dkdv_kernel(T* dk, T* dv, const T* dout, const float* lse,
                                               const float* delta, const T* q, const T* k,
                                               const T* v, int T_, int H, int K, int D,
                                               float scale) {
  __shared__ float k_s[kKeys][kMaxD + 1];
  __shared__ float v_s[kKeys][kMaxD + 1];
  __shared__ float q_s[kWarps][kMaxD];
  __shared__ float do_s[kWarps][kMaxD];
  __shared__ float p_s[kWarps][kKeys];
  __shared__ float ds_s[kWarps][kKeys];
  // The first key tiles are reached by the most query rows: they go first.
  const int j0 = (gridDim.x - 1 - blockIdx.x) * kKeys;
  const int kh = blockIdx.y, b = blockIdx.z, group = H / K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = threadIdx.x;
  const size_t ldq = size_t(H) * D, ldk = size_t(K) * D;
  const size_t koff = (size_t(b) * T_ + j0) * ldk + size_t(kh) * D;
  stage_rows(&k_s[0][0], kMaxD + 1, k + koff, ldk, kKeys, T_ - j0, D);
  stage_rows(&v_s[0][0], kMaxD + 1, v + koff, ldk, kKeys, T_ - j0, D);

  // Column d of dK and dV for the tile's kKeys keys.
  float dk_acc[kKeys], dv_acc[kKeys];
#pragma unroll
  for (int j = 0; j < kKeys; ++j) dk_acc[j] = dv_acc[j] = 0.0f;
  for (int g = 0; g < group; ++g) {
    const int h = kh * group + g;
    const float* lse_h = lse + (size_t(b) * H + h) * T_;
    const float* delta_h = delta + (size_t(b) * H + h) * T_;
    // Query rows before j0 see no key of this tile.
    for (int c0 = j0; c0 < T_; c0 += kWarps) {
      __syncthreads();  // K, V staged; the previous rows' P, dS, Q, dO all read
      const size_t qoff = (size_t(b) * T_ + c0) * ldq + size_t(h) * D;
      stage_rows(&q_s[0][0], kMaxD, q + qoff, ldq, kWarps, T_ - c0, D);
      stage_rows(&do_s[0][0], kMaxD, dout + qoff, ldq, kWarps, T_ - c0, D);
      __syncthreads();
      const int i = c0 + warp, j = j0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < T_ && j <= i) {
        p = expf(dot(q_s[warp], k_s[lane], D) * scale - lse_h[i]);
        const float dp = dot(do_s[warp], v_s[lane], D);
        ds = i == 0 ? 0.0f : p * (dp - delta_h[i]);
      }
      p_s[warp][lane] = p;
      ds_s[warp][lane] = ds;
      __syncthreads();
      if (d < D) {
#pragma unroll
        for (int r = 0; r < kWarps; ++r) {
          const float qd = q_s[r][d], dod = do_s[r][d];
#pragma unroll
          for (int jj = 0; jj < kKeys; ++jj) {
            dv_acc[jj] += p_s[r][jj] * dod;
            dk_acc[jj] += ds_s[r][jj] * qd;
          }
        }
      }
    }
  }
  if (d < D) {
#pragma unroll
    for (int jj = 0; jj < kKeys; ++jj) {
      if (j0 + jj >= T_) break;
      dk[koff + jj * ldk + d] = from_float<T>(dk_acc[jj] * scale);
      dv[koff + jj * ldk + d] = from_float<T>(dv_acc[jj]);
    }
  }
}

template <typename T>
__global__ void attention_backward_dq_kernel(T* dq, const T* dout, const float* lse,
                                             const float* delta, const T* q, const T* k, const T* v,
                                             int T_, int H, int K, int D, float scale) {
  __shared__ float q_s[kDqRows][kMaxD];
  __shared__ float do_s[kDqRows][kMaxD];
  __shared__ float k_s[kKeys][kMaxD + 1];
  __shared__ float v_s[kKeys][kMaxD + 1];
  __shared__ float ds_s[kWarps][kKeys];  // each warp's current row of dS
  const int i0 = (gridDim.x - 1 - blockIdx.x) * kDqRows;
  const int h = blockIdx.y, b = blockIdx.z, kh = h / (H / K);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t ldq = size_t(H) * D, ldk = size_t(K) * D;
  const size_t qoff = (size_t(b) * T_ + i0) * ldq + size_t(h) * D;
  stage_rows(&q_s[0][0], kMaxD, q + qoff, ldq, kDqRows, T_ - i0, D);
  stage_rows(&do_s[0][0], kMaxD, dout + qoff, ldq, kDqRows, T_ - i0, D);
  const float* lse_h = lse + (size_t(b) * H + h) * T_;
  const float* delta_h = delta + (size_t(b) * H + h) * T_;

  float acc[kDqRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kDqRowsPerWarp; ++rr)
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c) acc[rr][c] = 0.0f;
  const int last = min(i0 + kDqRows, T_) - 1;
  for (int j0 = 0; j0 <= last; j0 += kKeys) {
    __syncthreads();  // Q, dO staged; no warp still reads the previous K, V tile
    const size_t koff = (size_t(b) * T_ + j0) * ldk + size_t(kh) * D;
    stage_rows(&k_s[0][0], kMaxD + 1, k + koff, ldk, kKeys, T_ - j0, D);
    stage_rows(&v_s[0][0], kMaxD + 1, v + koff, ldk, kKeys, T_ - j0, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kDqRowsPerWarp; ++rr) {
      const int r = rr * kWarps + warp;
      const int i = i0 + r;
      if (i >= T_ || i < j0) continue;  // the same for the whole warp
      float ds = 0.0f;
      if (j0 + lane <= i && i > 0) {
        const float p = expf(dot(q_s[r], k_s[lane], D) * scale - lse_h[i]);
        ds = p * (dot(do_s[r], v_s[lane], D) - delta_h[i]);
      }
      const int n = min(kKeys, i - j0 + 1);
      ds_s[warp][lane] = ds;  // as P in the forward
      __syncwarp();
      for (int j = 0; j < n; ++j) {
        const float dsj = ds_s[warp][j];
#pragma unroll
        for (int c = 0; c < kDimsPerLane; ++c)
          if (lane + 32 * c < D) acc[rr][c] += dsj * k_s[j][lane + 32 * c];
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int rr = 0; rr < kDqRowsPerWarp; ++rr) {
    const int i = i0 + rr * kWarps + warp;
    if (i >= T_) continue;
    T* o = dq + (size_t(b) * T_ + i) * ldq + size_t(h) * D;
#pragma unroll
    for (int c = 0; c < kDimsPerLane; ++c)
      if (lane + 32 * c < D) o[lane + 32 * c] = from_float<T>(acc[rr][c] * scale);
  }
}

void check_shape(const char* what, int B, int T_, int H, int K, int D) {
  if (B < 0 || T_ < 0 || H <= 0 || K <= 0 || H % K != 0 || D <= 0 || D > kMaxD)
    throw ::ft::Error(std::string(what) + ": unsupported shape B=" + std::to_string(B) +
                      " T=" + std::to_string(T_) + " H=" + std::to_string(H) +
                      " K=" + std::to_string(K) + " D=" + std::to_string(D) +
                      " (the CUDA kernel needs H a multiple of K and a head dim" + " of at most " +
                      std::to_string(kMaxD) + "; larger heads need a kernel with D tiled)");
  if (H > 65535 || B > 65535)  // gridDim.y and .z limits
    throw ::ft::Error(std::string(what) + ": B=" + std::to_string(B) +
                      " or H=" + std::to_string(H) + " exceeds the grid's 65535 (split the batch)");
}

float softmax_scale(int D) { return 1.0f / std::sqrt(float(D)); }

}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, int B, int T_, int H,
                       int K, int D, void* stream) {
  check_shape("attention_forward", B, T_, H, K, D);
  if (B == 0 || T_ == 0) return;
  const dim3 grid((T_ + kFwdRows - 1) / kFwdRows, H, B);
  FT_LAUNCH((attention_forward_kernel<device_t<T>>), grid, kThreads, 0, stream)
  (dev(out), lse, dev(q), dev(k), dev(v), T_, H, K, D, softmax_scale(D));
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_delta(float* delta, const T* dout, const T* out, int B, int T_, int H, int D,
                     void* stream) {
  const size_t rows = size_t(B) * T_ * H;
  if (rows == 0) return;
  FT_LAUNCH((attention_delta_kernel<device_t<T>>), unsigned((rows + kWarps - 1) / kWarps), kThreads,
            0, stream)
  (delta, dev(dout), dev(out), B, T_, H, D);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                        const T* q, const T* k, const T* v, void* scratch, int B, int T_, int H,
                        int K, int D, void* stream) {
  check_shape("attention_backward", B, T_, H, K, D);
  if (B == 0 || T_ == 0) return;
  using E = device_t<T>;
  auto* delta = static_cast<float*>(scratch);  // (B, H, T)
  const float scale = softmax_scale(D);
  attention_delta(delta, dout, out, B, T_, H, D, stream);
  FT_LAUNCH((attention_backward_dkdv_kernel<E>), dim3((T_ + kKeys - 1) / kKeys, K, B), kThreads, 0,
            stream)
  (dev(dk), dev(dv), dev(dout), lse, delta, dev(q), dev(k), dev(v), T_, H, K, D, scale);
  FT_CUDA_CHECK_LAUNCH();
  FT_LAUNCH((attention_backward_dq_kernel<E>), dim3((T_ + kDqRows - 1) / kDqRows, H, B), kThreads,
            0, stream)
  (dev(dq), dev(dout), lse, delta, dev(q), dev(k), dev(v), T_, H, K, D, scale);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_ATTENTION_INSTANTIATE(T)                                                                \
  template void attention_forward<T>(T*, float*, const T*, const T*, const T*, int, int, int, int, \
                                     int, void*);                                                  \
  template void attention_delta<T>(float*, const T*, const T*, int, int, int, int, void*);         \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const float*, const T*,      \
                                      const T*, const T*, void*, int, int, int, int, int, void*);
FT_ATTENTION_INSTANTIATE(float)
FT_ATTENTION_INSTANTIATE(bf16)
FT_ATTENTION_INSTANTIATE(f16)
#undef FT_ATTENTION_INSTANTIATE

}  // namespace ft::kernels::cuda
