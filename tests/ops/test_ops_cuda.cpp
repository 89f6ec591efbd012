// The conformance harness (op_harness.h) on the CUDA device against the CPU device: every op of
// the list through Device::ops(), each case's outputs within its op's tolerance. Built twice:
// against the CUDA emulation (ft_ops_cuda_emu_tests: lib/runtime/cuda/ and kernels/cuda/
// compiled by g++ for the emulated runtime and cuBLASLt, a test tool; ctest
// ops_conformance_cuda_emu, label cuda-emu) and against the real backend (ft_ops_gpu_tests,
// for the GPU machine: scripts/gpu_check.py's `ops` check; exit 77 without a usable GPU).
// Attention has two CUDA implementations, chosen per device by FT_CUDA_ATTENTION: the default
// (tensor cores through cuBLASLt) runs every case, the SIMT kernels the attention cases.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_device.h"
#include "runtime/device.h"
#include "tests/ops/expect_conforms.h"
#include "tests/ops/op_harness.h"

namespace ft::op_test {
namespace {

// The CUDA device with attention `mode` ("gemm" or "simt"): FT_CUDA_ATTENTION is read when the
// device's ops are made, and restored after.
std::unique_ptr<Device> cuda_device(const char* mode) {
  std::optional<std::string> old;
  if (const char* v = std::getenv("FT_CUDA_ATTENTION")) old = v;
  setenv("FT_CUDA_ATTENTION", mode, 1);
  std::unique_ptr<Device> dev = make_cuda_device();
  if (old)
    setenv("FT_CUDA_ATTENTION", old->c_str(), 1);
  else
    unsetenv("FT_CUDA_ATTENTION");
  return dev;
}

TEST_CASE("ops: the CUDA device against the CPU device on every op") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device("gemm");
  const Report r = expect_conforms(*dev, *ref, all_cases(), /*same_kernels=*/false,
                                   "attention on tensor cores");
  CHECK(r.cases_per_op.size() == op_names().size());
}

TEST_CASE("ops: the CUDA device with SIMT attention against the CPU device on attention") {
  const std::unique_ptr<Device> ref = make_cpu_device(), dev = cuda_device("simt");
  std::vector<Case> cases;
  for (Case& c : all_cases())
    if (c.op == "attention_forward" || c.op == "attention_backward") cases.push_back(std::move(c));
  REQUIRE(!cases.empty());
  expect_conforms(*dev, *ref, cases, /*same_kernels=*/false, "SIMT attention");
}

}  // namespace
}  // namespace ft::op_test
