#include "comm/host_staging.h"

#include <atomic>

namespace ft {

namespace {
std::atomic<uint64_t> g_calls{0}, g_bytes{0};

void count(size_t bytes) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
}
}  // namespace

HostStagingStats host_staging_stats() {
  return HostStagingStats{g_calls.load(std::memory_order_relaxed),
                          g_bytes.load(std::memory_order_relaxed)};
}

HostStagedCommunicator::HostStagedCommunicator(Communicator& inner, Device& dev)
    : inner_(inner), dev_(dev) {}

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> inner, Device& dev)
    : owned_(std::move(inner)), inner_(*owned_), dev_(dev) {}

HostStagedCommunicator::~HostStagedCommunicator() {
  if (block_.ptr) dev_.free_host(block_.ptr, block_.bytes);
  // Sends still in flight (an error unwound past the pipeline's waits) may still be read by
  // MPI, and waiting for them could hang on a peer that is gone: their blocks are left allocated.
  for (size_t i : free_sends_)
    if (sends_[i].ptr) dev_.free_host(sends_[i].ptr, sends_[i].bytes);
}

std::byte* HostStagedCommunicator::reserve(HostBlock& block, size_t bytes) {
  if (block.bytes < bytes) {
    if (block.ptr) dev_.free_host(block.ptr, block.bytes);
    block.ptr = nullptr;
    block.bytes = 0;
    const MemoryScope tag(MemoryCategory::kCommunication);  // what a failed pin names
    block.ptr = static_cast<std::byte*>(dev_.alloc_host(bytes));
    block.bytes = bytes;
  }
  return block.ptr;
}

void HostStagedCommunicator::ready(Stream s) {
  if (s.handle == dev_.stream().handle) return;  // the copies wait for the device's stream
  Event e = dev_.make_event();
  e.record(s);
  e.synchronize();
}

// A group of one needs no communication, and the one-process communicator would copy with the
// host's memmove: the identity, or a copy on the device, instead.
CommWork HostStagedCommunicator::all_reduce(Stream s, Ref data, size_t n, ReduceOp op) {
  const size_t bytes = n * dtype_size(data.dtype);
  if (size() == 1) return {};
  if (!bytes) return inner_.all_reduce(Stream{}, data, n, op);  // every rank still takes part
  ready(s);
  const Ref host(reserve(block_, bytes), data.dtype);
  dev_.copy_to_host(host.ptr, data.ptr, bytes);
  inner_.all_reduce(Stream{}, host, n, op).wait();
  dev_.copy_from_host(data.ptr, host.ptr, bytes);
  count(2 * bytes);
  return {};
}

CommWork HostStagedCommunicator::reduce_scatter(Stream s, CRef in, Ref out, size_t shard) {
  // One block: the size() shards sent, then this rank's shard of the sum.
  const size_t S = size_t(size()), elt = dtype_size(in.dtype);
  const size_t in_bytes = S * shard * elt, out_bytes = shard * elt;
  if (!shard) return inner_.reduce_scatter(Stream{}, in, out, shard);
  if (S == 1) {
    dev_.copy(s, out.ptr, in.ptr, in_bytes);
    return {};
  }
  ready(s);
  std::byte* host = reserve(block_, in_bytes + out_bytes);
  dev_.copy_to_host(host, in.ptr, in_bytes);
  inner_.reduce_scatter(Stream{}, CRef(host, in.dtype), Ref(host + in_bytes, out.dtype), shard)
      .wait();
  dev_.copy_from_host(out.ptr, host + in_bytes, out_bytes);
  count(in_bytes + out_bytes);
  return {};
}

CommWork HostStagedCommunicator::all_gather(Stream s, CRef in, Ref out, size_t shard) {
  // In place on the host (this rank's shard at its place in the gathered block), whether or
  // not the caller's `in` lies inside `out`.
  const size_t elt = dtype_size(in.dtype), mine = shard * elt;
  const size_t total = size_t(size()) * mine;
  if (!shard) return inner_.all_gather(Stream{}, in, out, shard);
  if (size() == 1) {
    dev_.copy(s, out.ptr, in.ptr, mine);
    return {};
  }
  ready(s);
  const Ref host(reserve(block_, total), out.dtype);
  const Ref own = host + size_t(rank()) * shard;
  dev_.copy_to_host(own.ptr, in.ptr, mine);
  inner_.all_gather(Stream{}, CRef(own.ptr, in.dtype), host, shard).wait();
  dev_.copy_from_host(out.ptr, host.ptr, total);
  count(mine + total);
  return {};
}

CommWork HostStagedCommunicator::broadcast(Stream s, Ref data, size_t n, int root) {
  const size_t bytes = n * dtype_size(data.dtype);
  if (!bytes || size() == 1) return inner_.broadcast(Stream{}, data, n, root);
  ready(s);
  const Ref host(reserve(block_, bytes), data.dtype);
  if (rank() == root) dev_.copy_to_host(host.ptr, data.ptr, bytes);
  inner_.broadcast(Stream{}, host, n, root).wait();
  dev_.copy_from_host(data.ptr, host.ptr, bytes);
  count(2 * bytes);
  return {};
}

// A send in flight: the wrapped communicator's handle and the host block it reads, handed back
// to the spares once the send is complete.
struct HostStagedCommunicator::PendingSend final : CommWork::Pending {
  PendingSend(HostStagedCommunicator* c, size_t b, CommWork w)
      : comm(c), block(b), work(std::move(w)) {}
  void wait() override {
    work.wait();
    comm->free_sends_.push_back(block);
  }
  HostStagedCommunicator* comm;
  size_t block;
  CommWork work;
};

CommWork HostStagedCommunicator::send(Stream s, CRef data, size_t n, int peer, int tag) {
  // Its own block per send: MPI may read it until the send's handle is waited on, while later
  // calls stage more.
  const size_t bytes = n * dtype_size(data.dtype);
  if (!bytes) return inner_.send(Stream{}, data, n, peer, tag);
  ready(s);
  if (free_sends_.empty()) {
    free_sends_.push_back(sends_.size());
    sends_.emplace_back();
  }
  const size_t b = free_sends_.back();
  free_sends_.pop_back();
  std::byte* host = reserve(sends_[b], bytes);
  dev_.copy_to_host(host, data.ptr, bytes);
  CommWork w = inner_.send(Stream{}, CRef(host, data.dtype), n, peer, tag);
  count(bytes);
  return CommWork(std::make_unique<PendingSend>(this, b, std::move(w)));
}

CommWork HostStagedCommunicator::recv(Stream s, Ref data, size_t n, int peer, int tag) {
  const size_t bytes = n * dtype_size(data.dtype);
  if (!bytes) return inner_.recv(Stream{}, data, n, peer, tag);
  ready(s);  // the buffer may still be read by work queued before
  std::byte* host = reserve(block_, bytes);
  inner_.recv(Stream{}, Ref(host, data.dtype), n, peer, tag).wait();
  dev_.copy_from_host(data.ptr, host, bytes);
  count(bytes);
  return {};
}

std::string HostStagedCommunicator::describe() const {
  return inner_.describe() + " (device memory staged through host memory)";
}

std::unique_ptr<Communicator> HostStagedCommunicator::split(int color, int key) {
  return std::make_unique<HostStagedCommunicator>(inner_.split(color, key), dev_);
}

Communicator* for_device_memory(Communicator* comm, Device& dev,
                                std::vector<std::unique_ptr<Communicator>>& keep) {
  if (!comm || dev.host_accessible()) return comm;
  keep.push_back(std::make_unique<HostStagedCommunicator>(*comm, dev));
  return keep.back().get();
}

}  // namespace ft
