#include "runtime/counting_device.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/kernels.h"
#include "runtime/cuda/ops_memory.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/profile.h"

namespace ft {
namespace {

// Every op of the list (runtime/op_list.h) doing nothing. The CPU backend's ops allocate
// nothing: counting them is this. Only the size query answers, as the CPU backend does (the
// model allocates what it says).
class NullOps : public Ops {
 public:
#define FT_OP(name, family, params, args) \
  void name params override {}
#include "runtime/op_list.h"
  size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) override {
    size_t n = 0;
    dispatch(
        t, [&](auto e) { n = kernels::attention_backward_scratch_elems<decltype(e)>(B, T, H, D); });
    return n;
  }
};

// The CUDA backend's ops, counted: no kernel runs, but the cuBLASLt workspace is allocated with
// the ops and every op that asks CudaOps' scratch asks OpsMemory for the same here (runtime/
// cuda/ops_memory.h), so the counting device sees the CUDA backend's own memory. An op that
// starts asking in cuda_ops.cpp must ask here too: cli_test_cuda_emu_plan compares the two.
class CountingCudaOps final : public NullOps {
 public:
  CountingCudaOps(Device& dev, int sm_major)
      : mem_(dev, sm_major),
        sm_major_(sm_major),
        attention_requested_(cuda::requested_attention_path()) {}
  void bias_grad(Stream, float*, CRef, int N, int C) override {
    mem_.scratch(Req::bias_grad(N, C));
  }
  void rmsnorm_backward(Stream, Ref, float*, CRef, CRef, CRef, const float*, int N, int C,
                        bool) override {
    mem_.scratch(Req::rmsnorm_backward(N, C));
  }
  void attention_forward(Stream, Ref out, float*, CRef, CRef, CRef, const int32_t*, int B, int T,
                         int H, int K, int D) override {
    mem_.scratch(Req::attention_forward(path(out.dtype, D), B, T, H, K, D, out.dtype));
  }
  size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) override {
    return Req::attention_backward_caller_elems(t, B, T, H, D);
  }
  void attention_backward(Stream, Ref dq, Ref, Ref, CRef, CRef, const float*, CRef, CRef, CRef,
                          const int32_t*, float*, int B, int T, int H, int K, int D) override {
    mem_.scratch(Req::attention_backward(path(dq.dtype, D), B, T, H, K, D, dq.dtype));
  }
  void cross_entropy(Stream, Ref, CRef, const int32_t*, const uint8_t*, int N, int V, const float*,
                     double*) override {
    mem_.scratch(Req::cross_entropy(N, V));
  }
  void ce_finish(Stream, Ref, CRef, const int32_t*, const uint8_t*, const float*, const double*,
                 const double*, int N, int V, int, const float*, double*) override {
    mem_.scratch(Req::cross_entropy(N, V));
  }
  void sum_squares(Stream, double*, const float*, size_t n, double) override {
    mem_.scratch(Req::sum_squares(n));
  }

 private:
  using Req = cuda::ScratchRequests;
  // The attention path CudaOps takes for this dtype and head dim (ops_memory.h).
  cuda::AttentionPath path(DType dt, int D) const {
    return cuda::attention_path(attention_requested_, dt, D, sm_major_);
  }
  cuda::OpsMemory mem_;
  int sm_major_;
  cuda::AttentionPath attention_requested_;
};

// Addresses handed out start here (never backed by memory) and are never reused.
constexpr uintptr_t kFirstAddress = uintptr_t{1} << 40;
constexpr uintptr_t kAlign = 512;

}  // namespace

CountingDevice::CountingDevice(CountingTarget target) : target_(target), next_(kFirstAddress) {
  // As a CUDA device makes its ops when it is created (with the cuBLASLt workspace).
  if (target_.kind == DeviceKind::kCuda) {
    ops_ = std::make_unique<CountingCudaOps>(*this, target_.cuda_sm / 10);
    graphs_ = cuda_graphs_requested() && !profile_requested();  // as LlamaModel records
  } else {
    ops_ = std::make_unique<NullOps>();
  }
}

// The ops first: the CUDA ones give their memory back to this device.
CountingDevice::~CountingDevice() { ops_.reset(); }

std::string CountingDevice::name() const {
  return target_.kind == DeviceKind::kCuda
             ? detail::concat("counting device (CUDA, sm_", target_.cuda_sm, ")")
             : "counting device (CPU)";
}

void MemoryTally::add(MemoryCategory c, int64_t bytes) {
  current[size_t(c)] += bytes;
  total += bytes;
  allocs++;
  high[size_t(c)] = std::max(high[size_t(c)], current[size_t(c)]);
  if (total > peak) {
    peak = total;
    at_peak = current;
  }
}

void MemoryTally::remove(MemoryCategory c, int64_t bytes) {
  current[size_t(c)] -= bytes;
  total -= bytes;
}

void* CountingDevice::hand_out(size_t bytes, Place place) {
  const uintptr_t at = next_;
  next_ += (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  const MemoryCategory c = current_memory_category();
  live_[at] = {bytes, c, place};
  if (place == Place::kDevice) {
    tally_.add(c, int64_t(bytes));
  } else {
    (place == Place::kPinned ? pinned_ : pageable_).add(c, int64_t(bytes));
    host_.add(c, int64_t(bytes));
    count_host(place == Place::kPinned ? HostMemory::kPinned : HostMemory::kPageable, bytes, true);
  }
  combined_peak_ = std::max(combined_peak_, tally_.total + host_.total);
  return reinterpret_cast<void*>(at);
}

void CountingDevice::take_back(void* ptr, size_t bytes, Place place) {
  const auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  FT_CHECK(it != live_.end() && it->second.bytes == bytes && it->second.place == place,
           "counting device: free of an address it did not hand out (or of another size or "
           "kind of memory)");
  const MemoryCategory c = it->second.category;
  if (place == Place::kDevice) {
    tally_.remove(c, int64_t(bytes));
  } else {
    (place == Place::kPinned ? pinned_ : pageable_).remove(c, int64_t(bytes));
    host_.remove(c, int64_t(bytes));
    count_host(place == Place::kPinned ? HostMemory::kPinned : HostMemory::kPageable, bytes, false);
  }
  live_.erase(it);
}

void* CountingDevice::alloc(size_t bytes) { return hand_out(bytes, Place::kDevice); }
void CountingDevice::free(void* ptr, size_t bytes) { take_back(ptr, bytes, Place::kDevice); }
void* CountingDevice::alloc_host(size_t bytes) { return hand_out(bytes, Place::kPinned); }
void CountingDevice::free_host(void* ptr, size_t bytes) { take_back(ptr, bytes, Place::kPinned); }
void* CountingDevice::alloc_pageable(size_t bytes) { return hand_out(bytes, Place::kPageable); }
void CountingDevice::free_pageable(void* ptr, size_t bytes) {
  take_back(ptr, bytes, Place::kPageable);
}

bool CountingDevice::counted_host(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = live_.upper_bound(a);
  if (it == live_.begin()) return false;
  --it;
  return it->second.place != Place::kDevice &&
         a < it->first + std::max<size_t>(it->second.bytes, 1);
}

// A copy into host memory of this device's own writes nothing (it is not memory); into real
// host memory (a loss, a norm the step reads back), zeros.
void CountingDevice::copy_to_host(void* dst, const void*, size_t bytes) {
  if (bytes && !counted_host(dst)) std::memset(dst, 0, bytes);
}

void CountingDevice::copy_to_host_async(Stream, void* dst, const void*, size_t bytes) {
  if (bytes && !counted_host(dst)) std::memset(dst, 0, bytes);
}

AllocatorStats CountingDevice::stats() const {
  return AllocatorStats{size_t(tally_.total), size_t(tally_.peak), size_t(tally_.allocs),
                        size_t(tally_.total)};
}

void CountingDevice::reset_peak() {
  tally_.peak = tally_.total;
  tally_.at_peak = tally_.current;
  tally_.high = tally_.current;
}

}  // namespace ft
