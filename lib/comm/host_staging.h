// Communication of device memory the host cannot use directly (a GPU's: Device::host_accessible
// is false), through host memory. Debian's Open MPI is not CUDA-aware: handed a device pointer
// it reads it as host memory and crashes (or, with unified addressing, reads what the stream has
// not written yet). So each call copies the device data into a host buffer (Device::alloc_host:
// page-locked on CUDA; the copy waits for the work queued before it), runs the wrapped
// communicator's call on that buffer, and copies the result back.
//
// Correct, not fast: every call synchronises the stream and crosses PCIe twice, and nothing
// overlaps with compute but the pipeline's sends. A NCCL communicator takes device pointers and
// runs on a stream.
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
  // Each call waits for the work queued on `s` before it, and is complete when it returns but
  // for sends, whose host copy MPI reads until their handle is waited on.
  CommWork all_reduce(Stream s, Ref data, size_t n, ReduceOp op) override;
  CommWork reduce_scatter(Stream s, CRef in, Ref out, size_t shard) override;
  CommWork all_gather(Stream s, CRef in, Ref out, size_t shard) override;
  CommWork broadcast(Stream s, Ref data, size_t n, int root) override;
  CommWork send(Stream s, CRef data, size_t n, int peer, int tag) override;
  CommWork recv(Stream s, Ref data, size_t n, int peer, int tag) override;
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
  struct PendingSend;
  // `block` grown to at least `bytes` (its contents are not kept).
  std::byte* reserve(HostBlock& block, size_t bytes);
  // Blocks the host until the work queued on `s` is done (the device's copies to the host wait
  // only for its own stream).
  void ready(Stream s);

  std::unique_ptr<Communicator> owned_;  // set when this wraps a split of its own
  Communicator& inner_;
  Device& dev_;
  HostBlock block_;                 // collectives and receives: one at a time
  std::vector<HostBlock> sends_;    // one per send in flight (MPI still reads them), and spares
  std::vector<size_t> free_sends_;  // indexes into sends_ of the spare blocks
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
