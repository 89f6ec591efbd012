#include "runtime/cuda/gpu_usage.h"

#include <dlfcn.h>

#include <utility>

#include "core/error.h"

namespace ft::cuda {

NvmlApi load_nvml(const std::string& library) {
  NvmlApi api;
  // RTLD_LOCAL: NVML's symbols stay out of the process's namespace. The library is never closed
  // (as lt_gemm.cpp's cuBLASLt): a reader may live until exit.
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    api.error = why ? why : library + ": cannot be opened";
    return api;
  }
#define FT_NVML_SET(f)                                                                           \
  api.f = reinterpret_cast<decltype(&::f)>(dlsym(lib, #f));                                      \
  if (!api.f) {                                                                                  \
    api.error = detail::concat(library, " has no ", #f, " (not NVIDIA's NVML, or an old one?)"); \
    return api;                                                                                  \
  }
  FT_NVML_FUNCTIONS(FT_NVML_SET)
#undef FT_NVML_SET
  return api;
}

GpuUsageReader::GpuUsageReader(NvmlApi api, const std::string& pci_bus_id,
                               const std::string& why_not)
    : api_(std::move(api)) {
  if (!api_.error.empty()) {
    // The library's own hint: where NVML comes from.
    failure_ = detail::concat(api_.error, "; NVML comes with the NVIDIA driver (in a container, ",
                              "NVIDIA_DRIVER_CAPABILITIES must include utility)");
    return;
  }
  if (!why_not.empty()) {
    failure_ = why_not;
    return;
  }
  if (const nvmlReturn_t s = api_.nvmlInit_v2(); s != NVML_SUCCESS) {
    fail("nvmlInit_v2", s);
    return;
  }
  initialised_ = true;
  if (const nvmlReturn_t s = api_.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.c_str(), &device_);
      s != NVML_SUCCESS)
    fail(detail::concat("nvmlDeviceGetHandleByPciBusId_v2(\"", pci_bus_id, "\")").c_str(), s);
}

GpuUsageReader::~GpuUsageReader() {
  // NVML counts its initialisations; this one's shutdown leaves the others' (NCCL's) working.
  if (initialised_) api_.nvmlShutdown();
}

void GpuUsageReader::fail(const char* call, nvmlReturn_t status) {
  if (!failure_.empty()) return;
  failure_ =
      detail::concat(call, ": ", api_.nvmlErrorString(status), " (NVML status ", int(status), ")");
}

Device::Usage GpuUsageReader::read() {
  Device::Usage u;
  if (failure_.empty()) {
    nvmlUtilization_t util{};
    nvmlMemory_t mem{};
    if (const nvmlReturn_t s = api_.nvmlDeviceGetUtilizationRates(device_, &util);
        s != NVML_SUCCESS)
      fail("nvmlDeviceGetUtilizationRates", s);
    else if (const nvmlReturn_t m = api_.nvmlDeviceGetMemoryInfo(device_, &mem); m != NVML_SUCCESS)
      fail("nvmlDeviceGetMemoryInfo", m);
    if (failure_.empty()) {
      u.known = true;
      u.util_percent = double(util.gpu);
      u.mem_used_bytes = mem.used;
      return u;
    }
  }
  if (!failure_said_) {
    u.why_not = "NVML unavailable (" + failure_ + ")";
    failure_said_ = true;
  }
  return u;
}

}  // namespace ft::cuda
