// Test kernels for kernels/cuda/hopper.cuh (see hopper_kernels.h): nvcc builds them for a GPU,
// g++ for the CUDA emulation (through hopper_kernels_emu.cpp). Their bodies exist for sm_90a and
// the emulation only (FT_HOPPER_DEVICE); on an older GPU the test skips before launching.
#include "tests/cuda_emu/hopper_kernels.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/hopper.cuh"

namespace ft::kernels::cuda::test {
namespace {

__global__ void mbarrier_ring_kernel(int* out, int* probe, int rounds) {
#if FT_HOPPER_DEVICE
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* full = reinterpret_cast<uint64_t*>(smem);
  auto* empty = reinterpret_cast<uint64_t*>(smem + 8);
  int* slot = reinterpret_cast<int*>(smem + 16);  // (96)
  const int t = threadIdx.x;
  if (t == 0) {
    mbarrier_init(full, 1);
    mbarrier_init(empty, 96);
  }
  __syncthreads();
  if (t == 0) {
    mbarrier_wait(empty, 1);  // phase -1: complete from the start
    probe[0] = 1;
    for (int r = 0; r < rounds; ++r) {
      mbarrier_wait(empty, (r & 1) ^ 1);
      for (int i = 0; i < 96; ++i) slot[i] = r * 1000 + i;
      mbarrier_arrive_expect_tx(full, 96 * 4);
      mbarrier_complete_tx(full, 96 * 4);
    }
  } else if (t >= 32) {
    int sum = 0;
    for (int r = 0; r < rounds; ++r) {
      mbarrier_wait(full, r & 1);
      sum += slot[t - 32];
      mbarrier_arrive(empty);
    }
    out[t - 32] = sum;
  }
#endif
}

__global__ void tma_box_kernel(unsigned char* out, const __grid_constant__ TensorMap map, int rank,
                               int c0, int c1, int c2, int bytes, int span, int mode) {
#if FT_HOPPER_DEVICE
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* box = smem + 1024;
  const int t = threadIdx.x;
  if (t == 0) mbarrier_init(bar, 1);
  __syncthreads();
  if (t == 0) {
    mbarrier_arrive_expect_tx(bar, unsigned(bytes));
    if (rank == 2)
      tma_load_2d(box, map, c0, c1, bar);
    else
      tma_load_3d(box, map, c0, c1, c2, bar);
  }
  mbarrier_wait(bar, 0);
  const uint32_t base = smem_offset(box);
  for (int i = t; i < bytes; i += blockDim.x) {
    const uint32_t a = base + uint32_t(i);
    out[i] = mode == 1 ? box[tma_swizzle(a, span) - base] : box[i];
  }
#endif
}

// The reverse of tma_box_kernel: every thread writes bytes of `in` (the box row-major) to
// shared memory at their swizzled addresses, fences for the async proxy, a barrier, then thread 0
// stores the box by TMA and waits for the writes.
__global__ void tma_store_box_kernel(const __grid_constant__ TensorMap map, const unsigned char* in,
                                     int rank, int c0, int c1, int c2, int bytes, int span) {
#if FT_HOPPER_DEVICE
  FT_DYNAMIC_SHARED(unsigned char, smem);
  unsigned char* box = smem + 1024;
  const uint32_t base = smem_offset(box);
  for (int i = threadIdx.x; i < bytes; i += blockDim.x)
    box[tma_swizzle(base + uint32_t(i), span) - base] = in[i];
  fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (rank == 2)
      tma_store_2d(map, c0, c1, box);
    else
      tma_store_3d(map, c0, c1, c2, box);
    bulk_commit_group();
    bulk_wait_group<0>();
  }
#endif
}

template <class E, int N>
__global__ void wgmma_onehot_kernel(float* out, int m, int k, int col) {
#if FT_HOPPER_DEVICE
  FT_DYNAMIC_SHARED(uint16_t, smem);
  uint16_t* a = smem;         // 64 x 16: 2048 bytes
  uint16_t* b = smem + 1024;  // N x 16
  const int t = threadIdx.x;
  for (int i = t; i < 1024 + N * 16; i += 128) smem[i] = 0;
  __syncthreads();
  // K-major, no swizzle: element (r, k) at byte (r % 8) 16 + (r / 8) 256 + (k % 8) 2 + (k / 8) 128.
  const auto at = [](int r, int kk) {
    return ((r % 8) * 16 + (r / 8) * 256 + (kk % 8) * 2 + (kk / 8) * 128) / 2;
  };
  const uint16_t one = MmaElement<E>::kBf16 ? 0x3f80 : 0x3c00;
  if (t == 0) {
    a[at(m, k)] = one;
    b[at(col, k)] = one;
  }
  fence_proxy_async_shared();
  __syncthreads();
  float d[N / 2];
  wgmma_fence();
  wgmma_m64k16<E, N>(d, wgmma_descriptor(a, 128, 256, WgmmaSwizzle::kNone),
                     wgmma_descriptor(b, 128, 256, WgmmaSwizzle::kNone), false);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  for (int i = 0; i < N / 2; ++i) out[t * (N / 2) + i] = d[i];
#endif
}

template <class E, int N>
__global__ void wgmma_gemm_kernel(float* c, const __grid_constant__ TensorMap map_a,
                                  const __grid_constant__ TensorMap map_b, const uint16_t* a_global,
                                  int k, int feed) {
#if FT_HOPPER_DEVICE
  FT_DYNAMIC_SHARED(unsigned char, smem);
  auto* bars = reinterpret_cast<uint64_t*>(smem);  // one per k block
  const int blocks = k / 64;
  unsigned char* tiles_a = smem + 1024;              // 64 rows x 128 bytes per k block
  unsigned char* tiles_b = tiles_a + blocks * 8192;  // N x 128 bytes per k block
  const int t = threadIdx.x, w = t / 32, l = t % 32, g = l >> 2, q = l & 3;
  if (t == 0)
    for (int kb = 0; kb < blocks; ++kb) mbarrier_init(&bars[kb], 1);
  __syncthreads();
  if (t == 0) {
    for (int kb = 0; kb < blocks; ++kb) {
      mbarrier_arrive_expect_tx(&bars[kb], 8192 + N * 128);
      tma_load_2d(tiles_a + kb * 8192, map_a, kb * 64, 0, &bars[kb]);
      unsigned char* tb = tiles_b + kb * N * 128;
      if (feed == 3) {  // B k x n: boxes of 64 n x 64 k, one per 64 columns
        for (int nb = 0; nb < N / 64; ++nb)
          tma_load_2d(tb + nb * 8192, map_b, nb * 64, kb * 64, &bars[kb]);
      } else {
        tma_load_2d(tb, map_b, kb * 64, 0, &bars[kb]);
      }
    }
  }
  float d[N / 2];
  const WgmmaSwizzle swizzle = feed == 1 ? WgmmaSwizzle::kNone : WgmmaSwizzle::k128B;
  wgmma_fence();
  for (int kb = 0; kb < blocks; ++kb) {
    mbarrier_wait(&bars[kb], 0);
    for (int ks = 0; ks < 4; ++ks) {
      const bool acc = kb > 0 || ks > 0;
      const unsigned char* ta = tiles_a + kb * 8192 + ks * 32;  // k step: 32 bytes along the row
      const unsigned char* tb = tiles_b + kb * N * 128;
      if (feed == 3) {  // N-major: 64 n per 128-byte row, 8 k rows per 1024 bytes
        wgmma_m64k16<E, N, false, true>(d, wgmma_descriptor(ta, 16, 1024, swizzle),
                                        wgmma_descriptor(tb + ks * 2048, 8192, 1024, swizzle), acc);
      } else if (feed == 2) {  // A's fragment from global memory
        uint32_t ra[4];
        for (int j = 0; j < 4; ++j) {
          const int row = 16 * w + g + 8 * (j & 1), kk = kb * 64 + ks * 16 + 2 * q + 8 * (j >> 1);
          ra[j] = uint32_t(a_global[row * k + kk]) | uint32_t(a_global[row * k + kk + 1]) << 16;
        }
        wgmma_m64k16_rs<E, N>(d, ra, wgmma_descriptor(tb + ks * 32, 16, 1024, swizzle), acc);
      } else {
        wgmma_m64k16<E, N>(d, wgmma_descriptor(ta, 16, 1024, swizzle),
                           wgmma_descriptor(tb + ks * 32, 16, 1024, swizzle), acc);
      }
    }
    wgmma_commit_group();
  }
  wgmma_wait_group<0>();
  for (int i = 0; i < N / 2; ++i)
    c[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * q + (i & 1)] = d[i];
#endif
}

template <class E, int N>
void launch_onehot(float* out, int m, int k, int col) {
  FT_LAUNCH((wgmma_onehot_kernel<E, N>), 1, 128, 2048 + N * 32, nullptr)(out, m, k, col);
  FT_CUDA_CHECK_LAUNCH();
}

template <class E, int N>
void launch_gemm(float* c, const uint16_t* a, const uint16_t* b, int k, WgmmaFeed feed) {
  const TmaType type = MmaElement<E>::kBf16 ? TmaType::kBf16 : TmaType::kF16;
  const uint64_t dims_a[2] = {uint64_t(k), 64}, strides_a[1] = {uint64_t(k) * 2};
  const uint32_t box_a[2] = {64, 64};
  const TensorMap map_a =
      encode_tensor_map(type, 2, a, dims_a, strides_a, box_a, TmaSwizzle::k128B);
  TensorMap map_b;
  if (feed == WgmmaFeed::kNMajorB) {
    const uint64_t dims[2] = {uint64_t(N), uint64_t(k)}, strides[1] = {uint64_t(N) * 2};
    const uint32_t box[2] = {64, 64};
    map_b = encode_tensor_map(type, 2, b, dims, strides, box, TmaSwizzle::k128B);
  } else {
    const uint64_t dims[2] = {uint64_t(k), uint64_t(N)}, strides[1] = {uint64_t(k) * 2};
    const uint32_t box[2] = {64, uint32_t(N)};
    map_b = encode_tensor_map(type, 2, b, dims, strides, box, TmaSwizzle::k128B);
  }
  const int shared = 1024 + (k / 64) * (8192 + N * 128);
  cudaFuncSetAttribute(reinterpret_cast<const void*>(wgmma_gemm_kernel<E, N>),
                       cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  FT_LAUNCH((wgmma_gemm_kernel<E, N>), 1, 128, shared, nullptr)(c, map_a, map_b, a, k, int(feed));
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void mbarrier_ring(int* out, int* probe, int rounds) {
  FT_LAUNCH(mbarrier_ring_kernel, 1, 128, 16 + 96 * 4, nullptr)(out, probe, rounds);
  FT_CUDA_CHECK_LAUNCH();
}

void wgmma_onehot(bool bf16, float* out, int n, int m, int k, int col) {
  if (bf16) {
    if (n == 64) launch_onehot<::ft::bf16, 64>(out, m, k, col);
    if (n == 128) launch_onehot<::ft::bf16, 128>(out, m, k, col);
    if (n == 256) launch_onehot<::ft::bf16, 256>(out, m, k, col);
  } else {
    if (n == 64) launch_onehot<::ft::f16, 64>(out, m, k, col);
    if (n == 128) launch_onehot<::ft::f16, 128>(out, m, k, col);
    if (n == 256) launch_onehot<::ft::f16, 256>(out, m, k, col);
  }
}

void wgmma_gemm(bool bf16, float* c, const uint16_t* a, const uint16_t* b, int n, int k,
                WgmmaFeed feed) {
  if (bf16) {
    if (n == 64) launch_gemm<::ft::bf16, 64>(c, a, b, k, feed);
    if (n == 128) launch_gemm<::ft::bf16, 128>(c, a, b, k, feed);
    if (n == 256) launch_gemm<::ft::bf16, 256>(c, a, b, k, feed);
  } else {
    if (n == 64) launch_gemm<::ft::f16, 64>(c, a, b, k, feed);
    if (n == 128) launch_gemm<::ft::f16, 128>(c, a, b, k, feed);
    if (n == 256) launch_gemm<::ft::f16, 256>(c, a, b, k, feed);
  }
}

}  // namespace ft::kernels::cuda::test

namespace ft::kernels::cuda::test {
namespace {

// A box's bytes (fp32 for type 2, else 16-bit elements) and its swizzle span (0: none).
struct BoxSize {
  int bytes, span;
};
BoxSize box_size(int type, int rank, const uint32_t* box, int swizzle) {
  int bytes = type == 2 ? 4 : 2;
  for (int d = 0; d < rank; ++d) bytes *= int(box[d]);
  return {bytes, swizzle == 0 ? 0 : 16 << swizzle};
}

}  // namespace

void tma_box(unsigned char* out, const void* src, int type, int rank, const uint64_t* dims,
             const uint64_t* strides, const uint32_t* box, int swizzle, const int* coords,
             int mode) {
  const TensorMap map =
      encode_tensor_map(TmaType(type), rank, src, dims, strides, box, TmaSwizzle(swizzle));
  const auto [bytes, span] = box_size(type, rank, box, swizzle);
  FT_LAUNCH(tma_box_kernel, 1, 128, 1024 + bytes, nullptr)
  (out, map, rank, coords[0], coords[1], rank > 2 ? coords[2] : 0, bytes, span, mode);
  FT_CUDA_CHECK_LAUNCH();
}

void tma_store_box(void* dst, const unsigned char* in, int type, int rank, const uint64_t* dims,
                   const uint64_t* strides, const uint32_t* box, int swizzle, const int* coords) {
  const TensorMap map =
      encode_tensor_map(TmaType(type), rank, dst, dims, strides, box, TmaSwizzle(swizzle));
  const auto [bytes, span] = box_size(type, rank, box, swizzle);
  FT_LAUNCH(tma_store_box_kernel, 1, 128, 1024 + bytes, nullptr)
  (map, in, rank, coords[0], coords[1], rank > 2 ? coords[2] : 0, bytes, span);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::kernels::cuda::test
