// doctest's main for the native GPU test binaries (ft_cuda_kernel_tests, lt_gemm_gpu_tests):
// on a machine without a usable GPU they exit 77 (the automake/ctest "skipped" code) with one
// line "no GPU: <reason>", so whoever runs them sees a skip, not a page of CUDA errors from
// every test case. The same probe as the backend's (runtime/cuda/cuda_device.cpp), without
// linking the backend: these binaries hold the kernels or cuBLASLt alone.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

namespace {

// Empty when a GPU is usable, else why not.
std::string no_gpu_reason() {
  int driver = 0, runtime = 0, count = 0;
  cudaDriverGetVersion(&driver);  // 0 when no driver is loaded
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t e = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (driver == 0) return "no NVIDIA driver is loaded (libcuda.so.1 was not found)";
  if (e == cudaErrorInsufficientDriver || driver < runtime)
    return "the NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
           std::to_string(driver % 1000 / 10) + ", older than the runtime these tests use";
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (count == 0) return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES)";
  return "";
}

// doctest's --help and --list-* options need no GPU: they run the same everywhere.
bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "-?" || a == "--help" || a.find("-l") == 0 || a.find("--list") == 0)
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (const std::string why = no_gpu_reason(); !why.empty() && !only_lists(argc, argv)) {
    std::printf("no GPU: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
