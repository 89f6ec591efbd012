// A GPU's utilisation and used memory through NVML (DESIGN.md §2 "The CUDA backend", §7), for
// the metrics lines. NVML (libnvidia-ml.so.1) comes with the NVIDIA driver, not the toolkit, and
// is opened at run time, as cuBLASLt is: a process that never reads it (a CPU run, `ft plan`)
// does not load it, and a host or container without it still trains, its lines without the
// figures. Plain C++ (no CUDA headers): the CUDA device passes its PCI bus id, and the unit
// tests cover the load's failures in every build.
//
// The GPU is found by PCI bus id, not by index: CUDA's ordinals follow CUDA_VISIBLE_DEVICES and
// CUDA's own order (fastest first by default), NVML's indices the PCI order of every GPU.
#pragma once

#include <string>

#include "runtime/cuda/nvml_decls.h"
#include "runtime/device.h"

namespace ft::cuda {

// The NVML functions read() calls (X-macro, as lt_gemm.cpp's table of cuBLASLt's).
#define FT_NVML_FUNCTIONS(X)          \
  X(nvmlInit_v2)                      \
  X(nvmlShutdown)                     \
  X(nvmlErrorString)                  \
  X(nvmlDeviceGetHandleByPciBusId_v2) \
  X(nvmlDeviceGetUtilizationRates)    \
  X(nvmlDeviceGetMemoryInfo)
struct NvmlApi {
#define FT_NVML_MEMBER(f) decltype(&::f) f = nullptr;
  FT_NVML_FUNCTIONS(FT_NVML_MEMBER)
#undef FT_NVML_MEMBER
  // Empty when every function above is set; else why NVML cannot be used.
  std::string error;
};

// NVML's file name: the driver installs it in the loader's path (in a container, the NVIDIA
// container toolkit mounts it when NVIDIA_DRIVER_CAPABILITIES includes `utility`).
inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// Opens `library` by the loader's search and finds the functions; never throws: a failure is
// `error` ("libnvidia-ml.so.1: cannot open shared object file: ...", "... has no nvmlInit_v2").
NvmlApi load_nvml(const std::string& library = kNvmlLibrary);

// One GPU's figures. Made when first asked (the device's first metrics line), it initialises
// NVML and finds the GPU; read() then costs two NVML calls. A failure at any point (no library,
// no driver, the GPU not found, a call failing later: a lost GPU, MIG, where the parent GPU's
// utilisation is not supported) ends the readings for the rest of the process: read() says why
// once, then returns no reading, so a metrics line never has one figure of the two.
class GpuUsageReader {
 public:
  // pci_bus_id: cudaDeviceGetPCIBusId's "0000:3b:00.0", or `why_not` where that failed.
  GpuUsageReader(NvmlApi api, const std::string& pci_bus_id, const std::string& why_not = "");
  ~GpuUsageReader();
  GpuUsageReader(const GpuUsageReader&) = delete;
  GpuUsageReader& operator=(const GpuUsageReader&) = delete;

  Device::Usage read();

 private:
  // Notes the first failure: `call` failed with `status`.
  void fail(const char* call, nvmlReturn_t status);

  NvmlApi api_;
  bool initialised_ = false;  // nvmlInit_v2 succeeded: nvmlShutdown at the end
  nvmlDevice_t device_ = nullptr;
  std::string failure_;  // why there are no readings (empty: readings go on)
  bool failure_said_ = false;
};

}  // namespace ft::cuda
