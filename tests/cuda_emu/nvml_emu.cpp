// Emulated NVML (a test tool): the NVML functions ft's GpuUsageReader calls
// (lib/runtime/cuda/gpu_usage.h), with NVML's signatures (lib/runtime/cuda/nvml_decls.h), over
// the emulated GPUs of cuda_emu.cpp, so that the figures' way from NVML to metrics.jsonl runs
// in CI. The emulated build links these (the real one opens libnvidia-ml.so.1). What they give:
//  - a GPU is found by the PCI bus id the emulated cudaDeviceGetPCIBusId gives it
//    ("0000:<ordinal + 1>:00.0", hex); another id is NVML_ERROR_NOT_FOUND;
//  - used memory: the emulated device memory cudaMalloc'd in this process (total − free of the
//    emulated cudaMemGetInfo), what a GPU running only this process would count, less the CUDA
//    context that a real GPU's figure includes;
//  - utilisation: FT_NVML_EMU_UTIL, a percent per emulated GPU in ordinal order ("90,40": GPU 0
//    at 90, GPU 1 at 40; a GPU past the list, or the variable unset: 0), so a test can make a
//    chosen rank the least busy (the emulation has no clock to measure a GPU's busy time by);
//  - FT_NVML_EMU_FAIL=init: nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED (a host whose
//    NVML library is there but its driver is not); =lost:N: the utilisation reads fail from
//    the N-th on (1-based, per process) with NVML_ERROR_GPU_IS_LOST (a GPU lost mid-run);
//  - calls before nvmlInit_v2, or after as many nvmlShutdown, are NVML_ERROR_UNINITIALIZED.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/cuda/nvml_decls.h"

namespace {

std::mutex g_mu;
int g_inits = 0;  // nvmlInit_v2 calls not yet matched by an nvmlShutdown (NVML counts them too)

bool fail_mode(const char* mode) {
  const char* v = std::getenv("FT_NVML_EMU_FAIL");
  return v && std::strcmp(v, mode) == 0;
}

// FT_NVML_EMU_FAIL=lost:N's N (0: not set).
unsigned long lost_from() {
  const char* v = std::getenv("FT_NVML_EMU_FAIL");
  if (!v || std::strncmp(v, "lost:", 5) != 0) return 0;
  char* stop = nullptr;
  const unsigned long n = std::strtoul(v + 5, &stop, 10);
  if (n == 0 || *stop != '\0') {
    std::fprintf(stderr, "nvml_emu: FT_NVML_EMU_FAIL='%s': expected lost:N, N from 1\n", v);
    std::abort();
  }
  return n;
}
unsigned long g_util_reads = 0;  // utilisation reads so far (under g_mu)

bool initialised() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_inits > 0;
}

// Emulated GPU `ordinal` from a handle (ordinal + 1, never null), or −1.
int ordinal_of(nvmlDevice_t device) {
  const auto v = reinterpret_cast<uintptr_t>(device);
  int count = 0;
  cudaGetDeviceCount(&count);
  return v >= 1 && v <= uintptr_t(count) ? int(v - 1) : -1;
}

// FT_NVML_EMU_UTIL's entry for GPU `ordinal`: a test's input, so a bad one stops the process.
unsigned util_of(int ordinal) {
  const char* v = std::getenv("FT_NVML_EMU_UTIL");
  if (!v || !*v) return 0;
  const std::string list = v;
  size_t start = 0;
  for (int i = 0; start <= list.size(); ++i) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    if (i == ordinal) {
      const std::string item = list.substr(start, end - start);
      char* stop = nullptr;
      const unsigned long u = std::strtoul(item.c_str(), &stop, 10);
      if (item.empty() || *stop != '\0' || u > 100) {
        std::fprintf(stderr, "nvml_emu: FT_NVML_EMU_UTIL='%s': '%s' is not a percent 0-100\n", v,
                     item.c_str());
        std::abort();
      }
      return unsigned(u);
    }
    start = end + 1;
  }
  return 0;
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2(void) {
  if (fail_mode("init")) return NVML_ERROR_DRIVER_NOT_LOADED;
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_inits;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_inits == 0) return NVML_ERROR_UNINITIALIZED;
  --g_inits;
  return NVML_SUCCESS;
}

// NVML's own wording for each status.
const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device) {
  if (!initialised()) return NVML_ERROR_UNINITIALIZED;
  if (!pciBusId || !device) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned domain = 0, bus = 0, dev = 0, function = 0;
  char end = 0;
  if (std::sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &dev, &function, &end) != 4)
    return NVML_ERROR_INVALID_ARGUMENT;
  int count = 0;
  cudaGetDeviceCount(&count);
  if (domain != 0 || dev != 0 || function != 0 || bus < 1 || int(bus) > count)
    return NVML_ERROR_NOT_FOUND;
  *device = reinterpret_cast<nvmlDevice_t>(uintptr_t(bus));  // ordinal + 1
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  if (!initialised()) return NVML_ERROR_UNINITIALIZED;
  const int ordinal = ordinal_of(device);
  if (ordinal < 0 || !utilization) return NVML_ERROR_INVALID_ARGUMENT;
  if (const unsigned long from = lost_from(); from > 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (++g_util_reads >= from) return NVML_ERROR_GPU_IS_LOST;
  }
  utilization->gpu = util_of(ordinal);
  utilization->memory = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (!initialised()) return NVML_ERROR_UNINITIALIZED;
  if (ordinal_of(device) < 0 || !memory) return NVML_ERROR_INVALID_ARGUMENT;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return NVML_ERROR_UNKNOWN;
  memory->total = total;
  memory->free = free;
  memory->used = total - free;
  return NVML_SUCCESS;
}

}  // extern "C"
