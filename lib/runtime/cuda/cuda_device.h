// The CUDA device: ft::Device over one GPU, with the caching allocator
// (caching_allocator.h) over cudaMalloc, one non-blocking stream that every op and copy is
// queued on, a second one for the checkpoint's device → host staging copies, cudaEvents
// (device.h Event), page-locked host staging buffers, and the GPU chosen from the node-local
// rank (gpu_choice.h). Built with FT_CUDA into ft_cuda_backend (and against the emulation into
// ft_cuda_backend_emu, a test tool); an executable registers it (device.h) and make_device is
// then the way in.
#pragma once

#include <memory>
#include <string>

#include "runtime/device.h"

namespace ft {

// Empty when this process can use a GPU; else why not, in words fit for an error message
// ("no NVIDIA driver is loaded (libcuda.so.1 not found): ...", "the NVIDIA driver supports
// CUDA 12.2, older than the CUDA 13.0 runtime ft was built with; ...", "no CUDA device is
// visible (CUDA_VISIBLE_DEVICES=''); ...", "GPU 0 has compute capability 7.5; ...").
std::string cuda_unusable_reason();

// "runtime 13.0": the CUDA runtime ft was built with (for `ft --version`).
std::string cuda_runtime_description();

// The GPU of this rank (node-local rank modulo the visible GPUs). Throws ft::Error when it
// cannot be set up; call cuda_unusable_reason() first for the friendly answer.
std::unique_ptr<Device> make_cuda_device(const DeviceOptions& options = {});

// The three above, for register_cuda_backend (device.h).
const CudaBackend& this_cuda_backend();

}  // namespace ft
