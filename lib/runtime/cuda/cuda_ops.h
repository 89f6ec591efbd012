// The ops of the CUDA device: each method of runtime/ops.h launches its kernels/cuda/ kernel
// (kernels/cuda/kernels_cuda.h) on the op's stream, or cuBLASLt for the GEMMs. A null Stream
// means the device's own stream (`default_stream`, a cudaStream_t), never CUDA's legacy
// default stream, which the device's non-blocking stream does not wait for.
#pragma once

#include <memory>
#include <string>

#include "runtime/ops.h"

namespace ft {

class Device;
struct DeviceOptions;

// `dev` provides the ops' scratch and the cuBLASLt workspace (lt_gemm.h: sized for compute
// capability `sm_major`); `options`: runtime.tf32 (fp32 GEMMs may use TF32) and
// runtime.gemm_algos (lt_gemm.h LtChoice: measured choices recorded under `gpu`'s name).
std::unique_ptr<Ops> make_cuda_ops(Device& dev, void* default_stream, int sm_major,
                                   const DeviceOptions& options, const std::string& gpu);

}  // namespace ft
