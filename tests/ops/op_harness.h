// The backend conformance harness, after ggml's test-backend-ops: every op of the op list
// (runtime/op_list.h), called through Device::ops() on a device under test and on the CPU
// device (the reference), from the same inputs (uploaded with copy_from_host), its outputs
// downloaded and compared element by element with the op's tolerance. A case is one op at one
// dtype and shape; op_cases.cpp holds them, one function per op (all_cases() calls them from
// the list, so an op without a function does not compile, and check_coverage() fails an op
// whose function adds no case).
//
// Drivers: tests/ops/test_ops.cpp (the guard device and the profiled CPU device, which run the
// CPU kernels behind a decorator: every output must have the reference's bits, and a
// deliberately broken op must fail), tests/ops/test_ops_cuda.cpp (the CUDA device: on the
// emulation, ft_ops_cuda_emu_tests, and on a GPU, ft_ops_gpu_tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace ft::op_test {

// Element types of a case's tensors: the three float types of Ref/CRef, and the doubles, ids
// and masks some ops take.
enum class Elem : uint8_t { kF32, kBF16, kF16, kF64, kI32, kU8 };
size_t elem_size(Elem e);
const char* elem_name(Elem e);  // "f32", "bf16", ...
DType dtype_of(Elem e);         // for a Ref; only the float types

// How far the device's output may be from the reference's, element i:
//   |got − want| ≤ rel·|want| + abs·s_i + ulps·ulp(want)
// s_i: the tensor's `scale[i]` where the case gives one (the size of the terms that made the
// value, for results that cancel), else the largest |want| of the output when abs_of_max,
// else 1. ulp(want): the spacing of the output's type at want (one rounding to a 16-bit type
// can land one value apart). All zero: the same bits. NaN matches NaN, inf the same inf.
struct Tolerance {
  double rel = 0, abs = 0, ulps = 0;
  bool abs_of_max = false;
  bool exact() const { return rel == 0 && abs == 0 && ulps == 0; }
};

enum class Role : uint8_t { kIn, kOut, kInOut };

// One tensor of a case, as the host holds it. An output starts as all-ones bytes (NaN in
// every float type), so an element the op does not write shows.
struct Tensor {
  std::string name;
  Elem elem = Elem::kF32;
  Role role = Role::kIn;
  std::vector<uint8_t> host;  // the initial contents, elem_size(elem) bytes an element
  Tolerance tol;              // outputs only
  std::vector<double> scale;  // optional, one per element (Tolerance's s_i)
  size_t offset = 0;          // elements of slack before it on the device: a misaligned view
  int alias = -1;             // >= 0: the same device memory as that tensor (an in-place op)
  bool null = false;          // passed as a null pointer (an optional output left out)
  size_t count() const { return host.size() / elem_size(elem); }
};

// What a case's call sees: tensor i's device pointer (null where the tensor is), typed.
class Args {
 public:
  Args(const std::vector<Tensor>& t, std::vector<void*> p) : t_(t), p_(std::move(p)) {}
  Ref ref(size_t i) const { return Ref(p_[i], dtype_of(t_[i].elem)); }
  CRef cref(size_t i) const { return ref(i); }
  float* f32(size_t i) const { return static_cast<float*>(p_[i]); }
  double* f64(size_t i) const { return static_cast<double*>(p_[i]); }
  const int32_t* i32(size_t i) const { return static_cast<const int32_t*>(p_[i]); }
  const uint8_t* u8(size_t i) const { return static_cast<const uint8_t*>(p_[i]); }

 private:
  const std::vector<Tensor>& t_;
  std::vector<void*> p_;
};

struct Case {
  std::string op;     // its name in op_list.h
  std::string dtype;  // "bf16", "f32 -> f16", ...
  std::string shape;  // "N=19 in=111 out=19 accumulate"
  std::vector<Tensor> tensors;
  // Calls the op once on dev (dev.ops(), dev.stream()); scratch it needs comes from dev.
  std::function<void(Device& dev, const Args& a)> run;
  // Optional: what the outputs of one run must satisfy among themselves (outs: the output
  // tensors' bytes, in order), checked on the reference's run and on the device's: empty when
  // they do, else what fails. A case whose op must agree with another op uses it.
  std::function<std::string(const std::vector<std::vector<uint8_t>>& outs)> relation = nullptr;
  // Optional: the same outputs by other calls, for an op that stands in for them (a fused op:
  // the sequence it replaces), `twin_what` saying which. Run on each device after `run`, from the
  // same inputs, its outputs must have run's bits on that device. Its calls are not the op under
  // test: a profiled device does not count them.
  std::function<void(Device& dev, const Args& a)> twin = nullptr;
  std::string twin_what = {};
};

// Every case of every op of the list (op_cases.cpp).
std::vector<Case> all_cases();
// The op list's names, in its order.
const std::vector<std::string>& op_names();
// One line per op of the list that has no case, and per case whose op is not in the list.
std::vector<std::string> check_coverage(const std::vector<Case>& cases);

struct Report {
  size_t cases = 0;
  std::map<std::string, size_t> cases_per_op;
  // One line per failed case: device, op, dtype, shape, the output and its worst element
  // (index, got, want, error and bound), or what the op threw.
  std::vector<std::string> failures;
};

struct Options {
  // dev runs the reference's own kernels (behind a decorator), so every output must have the
  // reference's bits whatever the case's tolerance.
  bool same_kernels = false;
  // Each case runs twice on dev, and the two must give the same bits (determinism: no float
  // atomics, sums in a fixed order). before_run(i), when given, is called before run i: the
  // emulation changes its thread schedule there.
  bool twice = false;
  std::function<void(int run)> before_run;
  // Sees each case's report line as it finishes.
  std::function<void(const std::string&)> on_case;
};

// Runs each case on `ref` and on `dev` and compares.
Report run_cases(const std::vector<Case>& cases, Device& dev, Device& ref, const Options& o);

}  // namespace ft::op_test
