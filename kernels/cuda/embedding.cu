// Token embedding and its gradient on the GPU (vocabulary-parallel shards): the contract of
// kernels/kernels.h, tested against kernels/cpu/embedding.cpp.
//
// Forward: a copy. One block per token row, 16-byte packs when rows are whole aligned packs;
// ids outside the shard give zero rows.
//
// Backward, deterministic without atomics: dtable[row] += dout[n] for every token n with that
// row, added in token order, exactly the CPU's additions (so the result is bit-identical to the
// CPU's, not just close). Block (n, column chunk) first asks whether n is the first token with
// its id (a scan of ids[0, n)); if not it exits, and if so it walks ids[n, N) and adds each
// matching token's gradient into its registers, then adds that to dtable once. Each warp
// scans 32 ids per step with one __ballot_sync, so no barrier or shared memory is needed (the
// warps of a block repeat the same cheap scan rather than synchronise).
// Cost: every token's block scans up to N ids, O(N² / 32) warp steps per column chunk: for
// N = 16k tokens about 8M steps per chunk, a few milliseconds on an H100 against a step of
// hundreds; the gradient traffic itself is the minimum (each dout row read once, each touched
// dtable row read and written once). A device sort of token indices by id would make the scan
// O(N log N) if a profile ever shows it.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/pack.cuh"

namespace ft::kernels::cuda {

namespace {

constexpr int kThreads = 256;
// Backward: threads per block (whole warps) and columns per thread.
constexpr int kBackwardThreads = 128;
constexpr int kBackwardCols = 4;

__device__ __forceinline__ bool in_shard(int row, int v_count) {
  return v_count < 0 || (row >= 0 && row < v_count);
}

template <typename D, int W>
__global__ void embedding_forward_kernel(D* out, const int32_t* ids, const D* table, int C,
                                         int v_begin, int v_count) {
  const size_t n = blockIdx.x;
  const int row = ids[n] - v_begin;
  D* o = out + n * size_t(C);
  if (in_shard(row, v_count)) {
    const D* src = table + size_t(row) * C;
    for (int c = int(threadIdx.x) * W; c < C; c += int(blockDim.x) * W)
      store_pack<W>(o + c, load_pack<W>(src + c));
  } else {
    Pack<D, W> zero;
    for (int j = 0; j < W; ++j) zero.v[j] = from_float<D>(0.0f);
    for (int c = int(threadIdx.x) * W; c < C; c += int(blockDim.x) * W) store_pack<W>(o + c, zero);
  }
}

// grid (N, column chunks of kBackwardThreads · kBackwardCols); W = kBackwardCols (packs) or 1
// (columns strided by blockDim, the scalar path for rows that are not whole aligned packs).
template <typename D, int W>
__global__ void embedding_backward_kernel(float* dtable, const int32_t* ids, const D* dout, int N,
                                          int C, int v_begin, int v_count) {
  const int n = int(blockIdx.x);
  const int id = ids[n];
  const int row = id - v_begin;
  if (!in_shard(row, v_count)) return;
  const int lane = int(threadIdx.x) % 32;
  // Only the first token with this id does the row's work (uniform per warp: one ballot).
  for (int m0 = 0; m0 < n; m0 += 32) {
    const int m = m0 + lane;
    if (__ballot_sync(kFullMask, m < n && ids[m] == id) != 0u) return;
  }
  // This thread's columns: c0 + j·stride, j < kBackwardCols.
  constexpr int kCols = kBackwardCols;
  const int chunk = int(blockIdx.y) * int(blockDim.x) * kCols;
  const int c0 = W > 1 ? chunk + int(threadIdx.x) * W : chunk + int(threadIdx.x);
  const int cstride = W > 1 ? 1 : int(blockDim.x);
  float* dst = dtable + size_t(row) * C;
  float acc[kCols];
  for (int j = 0; j < kCols; ++j) {
    const int c = c0 + j * cstride;
    acc[j] = c < C ? dst[c] : 0.f;
  }
  for (int m0 = n; m0 < N; m0 += 32) {
    const int m = m0 + lane;
    const unsigned hits = __ballot_sync(kFullMask, m < N && ids[m] == id);
    for (int b = 0; b < 32 && (hits >> b) != 0u; ++b) {  // matching tokens in order
      if (((hits >> b) & 1u) == 0u) continue;
      const D* src = dout + size_t(m0 + b) * C;
      if constexpr (W > 1) {
        if (c0 < C) {
          const Pack<D, W> dp = load_pack<W>(src + c0);
          for (int j = 0; j < W; ++j) acc[j] += to_float(dp.v[j]);
        }
      } else {
        for (int j = 0; j < kCols; ++j) {
          const int c = c0 + j * cstride;
          if (c < C) acc[j] += to_float(src[c]);
        }
      }
    }
  }
  for (int j = 0; j < kCols; ++j) {
    const int c = c0 + j * cstride;
    if (c < C) dst[c] = acc[j];
  }
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int N, int C, int v_begin,
                       int v_count, void* stream) {
  if (N <= 0 || C <= 0) return;
  using D = device_t<T>;
  constexpr int W = kPack16<T>;
  const bool packed = C % W == 0 && all_aligned({out, table}, 16);
  // Whole warps, one pack (or element) per thread up to kThreads.
  const int per_thread = packed ? W : 1;
  const int needed = ((C + per_thread - 1) / per_thread + 31) / 32 * 32;
  const int threads = needed < kThreads ? needed : kThreads;
  if (packed) FT_LAUNCH((embedding_forward_kernel<D, W>), unsigned(N), threads, 0, stream)
  (dev(out), ids, dev(table), C, v_begin, v_count);
  else FT_LAUNCH((embedding_forward_kernel<D, 1>), unsigned(N), threads, 0, stream)(
      dev(out), ids, dev(table), C, v_begin, v_count);
  FT_CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(float* dtable, const int32_t* ids, const T* dout, int N, int C, int v_begin,
                        int v_count, void* stream) {
  if (N <= 0 || C <= 0) return;
  using D = device_t<T>;
  constexpr int W = kBackwardCols;
  const int per_block = kBackwardThreads * kBackwardCols;
  const dim3 grid(unsigned(N), unsigned((C + per_block - 1) / per_block));
  if (C % W == 0 && aligned_to(dtable, 16) && aligned_to(dout, W * sizeof(T)))
    FT_LAUNCH((embedding_backward_kernel<D, W>), grid, kBackwardThreads, 0, stream)
  (dtable, ids, dev(dout), N, C, v_begin, v_count);
  else FT_LAUNCH((embedding_backward_kernel<D, 1>), grid, kBackwardThreads, 0, stream)(
      dtable, ids, dev(dout), N, C, v_begin, v_count);
  FT_CUDA_CHECK_LAUNCH();
}

#define FT_INSTANTIATE(T)                                                                   \
  template void embedding_forward(T*, const int32_t*, const T*, int, int, int, int, void*); \
  template void embedding_backward(float*, const int32_t*, const T*, int, int, int, int, void*);
FT_INSTANTIATE(float)
FT_INSTANTIATE(bf16)
FT_INSTANTIATE(f16)
#undef FT_INSTANTIATE

}  // namespace ft::kernels::cuda
