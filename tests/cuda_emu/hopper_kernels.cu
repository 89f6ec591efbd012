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

}  // namespace

void mbarrier_ring(int* out, int* probe, int rounds) {
  FT_LAUNCH(mbarrier_ring_kernel, 1, 128, 16 + 96 * 4, nullptr)(out, probe, rounds);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::kernels::cuda::test

namespace ft::kernels::cuda::test {

void tma_box(unsigned char* out, const void* src, int type, int rank, const uint64_t* dims,
             const uint64_t* strides, const uint32_t* box, int swizzle, const int* coords,
             int mode) {
  const TensorMap map =
      encode_tensor_map(TmaType(type), rank, src, dims, strides, box, TmaSwizzle(swizzle));
  int bytes = type == 2 ? 4 : 2;
  for (int d = 0; d < rank; ++d) bytes *= int(box[d]);
  const int span = swizzle == 0 ? 0 : 16 << swizzle;
  FT_LAUNCH(tma_box_kernel, 1, 128, 1024 + bytes, nullptr)
  (out, map, rank, coords[0], coords[1], rank > 2 ? coords[2] : 0, bytes, span, mode);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::kernels::cuda::test
