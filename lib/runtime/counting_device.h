// The device `ft plan` runs a rank's setup and one training step on (train/plan.h): it allocates
// nothing and runs no kernel, it counts. Every alloc() returns a distinct address that is never
// backed by memory (the host must not touch it: host_accessible() is false, and every op, copy
// and memset does nothing), and is tallied by its MemoryCategory (runtime/device.h), so the
// figures are what the code that allocates asked for, in the order it asked. copy_to_host writes
// zeros, so what the host reads back (a loss, a gradient norm) is a finite 0.
//
// Host memory from alloc_host (pinned) and alloc_pageable is counted the same way, apart from the
// device's, and is not memory either: its addresses come from the same counter (distinct from
// every device address), host_memory_backed() is false, and a copy into them writes nothing.
//
// It counts for the CPU backend, whose ops allocate nothing of their own, or for the CUDA
// backend, whose ops hold the cuBLASLt workspace and a scratch buffer they grow on demand
// (runtime/cuda/ops_memory.h): its ops then make the same requests, with no GPU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "runtime/device.h"

namespace ft {

struct MemoryTally {
  using ByCategory = std::array<int64_t, size_t(MemoryCategory::kCount)>;
  ByCategory current{};  // live bytes now, by category
  ByCategory at_peak{};  // live bytes by category when the total last reached `peak`
  ByCategory high{};     // the most live bytes of each category at once since reset_peak()
  int64_t total = 0;     // live bytes now
  int64_t peak = 0;      // the highest total since the last reset_peak()
  int64_t allocs = 0;    // alloc() calls
  int64_t get(MemoryCategory c) const { return at_peak[size_t(c)]; }
  void add(MemoryCategory c, int64_t bytes);
  void remove(MemoryCategory c, int64_t bytes);
};

// What the counted device stands for.
struct CountingTarget {
  DeviceKind kind = DeviceKind::kCpu;
  int cuda_sm = 90;  // CUDA: compute capability × 10 (sets the cuBLASLt workspace)
};

class CountingDevice final : public Device {
 public:
  explicit CountingDevice(CountingTarget target = {});
  ~CountingDevice() override;

  DeviceKind kind() const override { return target_.kind; }
  bool plans_graphs() const override { return graphs_; }
  std::string name() const override;
  void* alloc(size_t bytes) override;
  void free(void* ptr, size_t bytes) override;
  void memset_zero(void*, size_t) override {}
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_from_host(void*, const void*, size_t) override {}
  void copy(Stream, void*, const void*, size_t) override {}
  void copy_to_host_async(Stream s, void* dst, const void* src, size_t bytes) override;
  void copy_from_host_async(Stream, void*, const void*, size_t) override {}
  void zero_host(void*, size_t) override {}
  void synchronize() override {}
  bool host_accessible() const override { return false; }
  AllocatorStats stats() const override;
  Ops& ops() override { return *ops_; }
  Ops& host_ops() override { return *ops_; }
  void* alloc_host(size_t bytes) override;
  void free_host(void* ptr, size_t bytes) override;
  void* alloc_pageable(size_t bytes) override;
  void free_pageable(void* ptr, size_t bytes) override;
  bool host_memory_backed() const override { return false; }

  const MemoryTally& tally() const { return tally_; }
  // Starts a new peak from what is live now (ft plan: the step's peak apart from start-up's).
  // The host tallies keep theirs: a plan's host figures span the setup, the step, evaluation
  // and a checkpoint save.
  void reset_peak();
  // Host memory by kind, and both kinds together (`total` and `peak` of pinned + pageable).
  const MemoryTally& host_tally(HostMemory kind) const {
    return kind == HostMemory::kPinned ? pinned_ : pageable_;
  }
  const MemoryTally& host_tally() const { return host_; }
  // The most device and host memory live at once since the device was made: what a CPU run,
  // whose device memory is host memory too, holds of the host at most.
  int64_t combined_peak() const { return combined_peak_; }

 private:
  // Where an address handed out lives.
  enum class Place : uint8_t { kDevice, kPinned, kPageable };
  struct Live {
    size_t bytes;
    MemoryCategory category;
    Place place;
  };
  void* hand_out(size_t bytes, Place place);
  void take_back(void* ptr, size_t bytes, Place place);
  // Whether p lies in host memory handed out here (and so is not memory).
  bool counted_host(const void* p) const;

  CountingTarget target_;
  bool graphs_ = false;  // a CUDA target under FT_CUDA_GRAPHS=1 (plans_graphs)
  MemoryTally tally_, pinned_, pageable_, host_;
  int64_t combined_peak_ = 0;
  uintptr_t next_ = 0;  // the next address handed out
  std::map<uintptr_t, Live> live_;
  std::unique_ptr<Ops> ops_;
};

}  // namespace ft
