// Casts between fp32 and the 16-bit compute types on the GPU: the bits of core/half.h's
// scalar conversions (round to nearest even, subnormals kept, NaN payloads as half.h's), which
// kernels/cpu/convert.cpp gives too. Elementwise, memory-bound: one grid-stride loop.
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace ft::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kItemsPerThread = 4;

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
  for (size_t i = grid_thread_index(); i < n; i += grid_thread_count())
    dst[i] = from_float<D>(to_float(src[i]));
}

}  // namespace

template <typename Dst, typename Src>
void convert(Dst* dst, const Src* src, size_t n, void* stream) {
  if (n == 0) return;
  if constexpr (std::is_same_v<Dst, Src>) {  // a copy: the same bits, no kernel
    const cudaError_t err = cudaMemcpyAsync(dst, src, n * sizeof(Dst), cudaMemcpyDeviceToDevice,
                                            static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess)
      throw ::ft::Error(std::string("CUDA convert: device-to-device copy of ") +
                        std::to_string(n * sizeof(Dst)) +
                        " bytes failed: " + cudaGetErrorString(err));
  } else {
    const unsigned blocks = grid_blocks(n, kThreads, kItemsPerThread);
    FT_LAUNCH((convert_kernel<device_t<Dst>, device_t<Src>>), blocks, kThreads, 0, stream)
    (dev(dst), dev(src), n);
    FT_CUDA_CHECK_LAUNCH();
  }
}

// kernels.h's pairs (fp32 master <-> compute copy, and the fp32 copy code templated on T uses).
template void convert(float*, const float*, size_t, void*);
template void convert(bf16*, const float*, size_t, void*);
template void convert(f16*, const float*, size_t, void*);
template void convert(float*, const bf16*, size_t, void*);
template void convert(float*, const f16*, size_t, void*);

}  // namespace ft::kernels::cuda
