// Communication of device memory the host cannot use directly (a GPU's: Device::host_accessible
// is false), through host memory. Debian's Open MPI is not CUDA-aware: handed a device pointer
// it reads it as host memory and crashes (or, with unified addressing, reads what the stream has
// not written yet). So each call copies the device data into a host buffer (Device::alloc_host:
// page-locked on CUDA; the copy waits for the work queued before it), runs the wrapped
// communicator's call on that buffer, and copies the result back.
//
// Correct, not fast: every call synchronises the stream and crosses PCIe twice, and nothing
// overlaps with compute. A NCCL communicator (not built yet) would take device pointers and run
// on the stream.
//
// Host scalars (loss sums, flags, the step's agreement) keep going to the plain communicator:
// every pointer handed to a HostStagedCommunicator is memory of its Device.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "runtime/device.h"

namespace ft {

class HostStagedCommunicator final : public Communicator {
 public:
  // Every data pointer passed in is memory of `dev`, which must outlive this communicator.
  HostStagedCommunicator(Communicator& inner, Device& dev);
  HostStagedCommunicator(std::unique_ptr<Communicator> inner, Device& dev);
  ~HostStagedCommunicator() override;
  HostStagedCommunicator(const HostStagedCommunicator&) = delete;
  HostStagedCommunicator& operator=(const HostStagedCommunicator&) = delete;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce_sum(float* data, size_t n) override;
  void all_reduce_sum(double* data, size_t n) override;
  void all_reduce_max(float* data, size_t n) override;
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override;
  void all_gather(CRef in, Ref out, size_t shard) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(CRef data, size_t n, int peer, int tag) override;
  void recv(Ref data, size_t n, int peer, int tag) override;
  void wait_sends() override;
  void barrier() override { inner_.barrier(); }
  void abort(int code) override { inner_.abort(code); }
  std::string describe() const override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void set_name(const std::string& name) override { inner_.set_name(name); }

 private:
  struct HostBlock {
    std::byte* ptr = nullptr;
    size_t bytes = 0;
  };
  // `block` grown to at least `bytes` (its contents are not kept).
  std::byte* reserve(HostBlock& block, size_t bytes);
  template <typename T>
  void all_reduce(T* data, size_t n, void (Communicator::*op)(T*, size_t));

  std::unique_ptr<Communicator> owned_;  // set when this wraps a split of its own
  Communicator& inner_;
  Device& dev_;
  HostBlock block_;               // collectives and receives: one at a time
  std::vector<HostBlock> sends_;  // one per send until wait_sends(): MPI still reads them
  size_t sends_in_flight_ = 0;
};

// The communicator to hand memory of `dev` to: `comm` itself when the host may use that memory
// directly (or comm is null), else a HostStagedCommunicator over it, kept alive in `keep`.
Communicator* for_device_memory(Communicator* comm, Device& dev,
                                std::vector<std::unique_ptr<Communicator>>& keep);

// What went through host staging in this process so far (the run's closing line shows it, so a
// test can tell the staging path ran).
struct HostStagingStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;  // device → host plus host → device
};
HostStagingStats host_staging_stats();

}  // namespace ft
