// The NVML reader (runtime/cuda/gpu_usage.h) without a GPU: the real load's failures (no
// library, a library without NVML's functions), and each later failure through a table of
// stand-in functions: said once, then no readings, never one figure of the two. The emulated
// NVML's way to metrics.jsonl: tests/cli/test_cuda_emu_nvml.sh.
#include <doctest/doctest.h>

#include <string>

#include "runtime/cuda/gpu_usage.h"

using namespace ft;
using namespace ft::cuda;

namespace {

// Stand-ins with NVML's signatures; each test sets what they return.
nvmlReturn_t g_init = NVML_SUCCESS, g_handle = NVML_SUCCESS, g_util = NVML_SUCCESS,
             g_mem = NVML_SUCCESS;
int g_inits = 0;
std::string g_bus_id;
nvmlReturn_t init() {
  if (g_init == NVML_SUCCESS) ++g_inits;
  return g_init;
}
nvmlReturn_t shutdown() {
  --g_inits;
  return NVML_SUCCESS;
}
const char* error_string(nvmlReturn_t s) {
  return s == NVML_ERROR_GPU_IS_LOST ? "GPU is lost" : "?";
}
nvmlReturn_t handle(const char* bus_id, nvmlDevice_t* d) {
  g_bus_id = bus_id;
  *d = reinterpret_cast<nvmlDevice_t>(8);
  return g_handle;
}
nvmlReturn_t util(nvmlDevice_t, nvmlUtilization_t* u) {
  u->gpu = 87;
  return g_util;
}
nvmlReturn_t mem(nvmlDevice_t, nvmlMemory_t* m) {
  m->used = 123456789012ull;
  return g_mem;
}

NvmlApi stand_ins() {
  g_init = g_handle = g_util = g_mem = NVML_SUCCESS;
  NvmlApi api;
  api.nvmlInit_v2 = init;
  api.nvmlShutdown = shutdown;
  api.nvmlErrorString = error_string;
  api.nvmlDeviceGetHandleByPciBusId_v2 = handle;
  api.nvmlDeviceGetUtilizationRates = util;
  api.nvmlDeviceGetMemoryInfo = mem;
  return api;
}

}  // namespace

TEST_CASE("gpu usage: no NVML library: said once with the loader's reason, then nothing") {
  const NvmlApi api = load_nvml("libft-test-no-such-nvml.so.1");
  CHECK(api.error.find("libft-test-no-such-nvml.so.1: cannot open shared object file") !=
        std::string::npos);
  CHECK(!api.nvmlInit_v2);
  GpuUsageReader reader(api, "0000:01:00.0");
  const Device::Usage first = reader.read();
  CHECK_FALSE(first.known);
  CHECK(first.why_not.rfind("NVML unavailable (libft-test-no-such-nvml.so.1: cannot open", 0) == 0);
  CHECK(first.why_not.find("NVIDIA_DRIVER_CAPABILITIES must include utility") != std::string::npos);
  const Device::Usage second = reader.read();
  CHECK_FALSE(second.known);
  CHECK(second.why_not.empty());
}

TEST_CASE("gpu usage: a library without NVML's functions names the first one missing") {
  // libc is on every host this runs on, and has no NVML.
  const NvmlApi api = load_nvml("libc.so.6");
  CHECK(api.error == "libc.so.6 has no nvmlInit_v2 (not NVIDIA's NVML, or an old one?)");
}

TEST_CASE("gpu usage: readings, and a call failing later ends them, said once") {
  {
    GpuUsageReader reader(stand_ins(), "0000:3b:00.0");
    CHECK(g_bus_id == "0000:3b:00.0");  // the GPU is found by the CUDA device's bus id
    CHECK(g_inits == 1);
    for (int i = 0; i < 2; ++i) {
      const Device::Usage u = reader.read();
      CHECK(u.known);
      CHECK(u.util_percent == 87);
      CHECK(u.mem_used_bytes == 123456789012ull);
      CHECK(u.why_not.empty());
    }
    g_util = NVML_ERROR_GPU_IS_LOST;
    Device::Usage u = reader.read();
    CHECK_FALSE(u.known);
    CHECK(u.why_not ==
          "NVML unavailable (nvmlDeviceGetUtilizationRates: GPU is lost (NVML status 15))");
    g_util = NVML_SUCCESS;  // a failed reader stays failed: lines never come and go
    u = reader.read();
    CHECK_FALSE(u.known);
    CHECK(u.why_not.empty());
  }
  CHECK(g_inits == 0);  // its NVML initialisation ended with it

  // Memory failing after utilisation succeeded: neither figure.
  GpuUsageReader reader(stand_ins(), "0000:3b:00.0");
  g_mem = NVML_ERROR_GPU_IS_LOST;
  const Device::Usage u = reader.read();
  CHECK_FALSE(u.known);
  CHECK(u.why_not.find("nvmlDeviceGetMemoryInfo: GPU is lost") != std::string::npos);
}

TEST_CASE("gpu usage: NVML's start failing, or the GPU not found, or no bus id") {
  NvmlApi api = stand_ins();
  g_init = NVML_ERROR_DRIVER_NOT_LOADED;
  {
    GpuUsageReader reader(api, "0000:3b:00.0");
    CHECK(reader.read().why_not == "NVML unavailable (nvmlInit_v2: ? (NVML status 9))");
  }
  CHECK(g_inits == 0);
  api = stand_ins();
  g_handle = NVML_ERROR_NOT_FOUND;
  {
    GpuUsageReader reader(api, "0000:3b:00.0");
    CHECK(reader.read().why_not ==
          "NVML unavailable (nvmlDeviceGetHandleByPciBusId_v2(\"0000:3b:00.0\"): ? (NVML status "
          "6))");
  }
  CHECK(g_inits == 0);
  GpuUsageReader reader(stand_ins(), "", "cudaDeviceGetPCIBusId(0): invalid device ordinal");
  CHECK(reader.read().why_not ==
        "NVML unavailable (cudaDeviceGetPCIBusId(0): invalid device ordinal)");
}
