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
  // Sends still in flight (an error unwound past the pipeline's wait_sends) may still be read by
  // MPI, and waiting for them could hang on a peer that is gone: their blocks are left allocated.
  for (size_t i = sends_in_flight_; i < sends_.size(); ++i)
    if (sends_[i].ptr) dev_.free_host(sends_[i].ptr, sends_[i].bytes);
}

std::byte* HostStagedCommunicator::reserve(HostBlock& block, size_t bytes) {
  if (block.bytes < bytes) {
    if (block.ptr) dev_.free_host(block.ptr, block.bytes);
    block.ptr = nullptr;
    block.bytes = 0;
    block.ptr = static_cast<std::byte*>(dev_.alloc_host(bytes));
    block.bytes = bytes;
  }
  return block.ptr;
}

// A group of one needs no communication, and the one-process communicator would copy with the
// host's memmove: the identity, or a copy on the device, instead.
template <typename T>
void HostStagedCommunicator::all_reduce(T* data, size_t n, void (Communicator::*op)(T*, size_t)) {
  const size_t bytes = n * sizeof(T);
  if (size() == 1) return;
  if (!bytes) return (inner_.*op)(data, n);  // nothing to read: every rank still takes part
  T* host = reinterpret_cast<T*>(reserve(block_, bytes));
  dev_.copy_to_host(host, data, bytes);
  (inner_.*op)(host, n);
  dev_.copy_from_host(data, host, bytes);
  count(2 * bytes);
}

void HostStagedCommunicator::all_reduce_sum(float* data, size_t n) {
  all_reduce<float>(data, n, &Communicator::all_reduce_sum);
}
void HostStagedCommunicator::all_reduce_sum(double* data, size_t n) {
  all_reduce<double>(data, n, &Communicator::all_reduce_sum);
}
void HostStagedCommunicator::all_reduce_max(float* data, size_t n) {
  all_reduce<float>(data, n, &Communicator::all_reduce_max);
}

void HostStagedCommunicator::reduce_scatter_sum(const float* in, float* out, size_t shard) {
  // One block: the size() shards sent, then this rank's shard of the sum.
  const size_t S = size_t(size()), in_bytes = S * shard * sizeof(float);
  if (!shard) return inner_.reduce_scatter_sum(in, out, shard);
  if (S == 1) return dev_.copy(dev_.stream(), out, in, in_bytes);
  float* host = reinterpret_cast<float*>(reserve(block_, in_bytes + shard * sizeof(float)));
  dev_.copy_to_host(host, in, in_bytes);
  inner_.reduce_scatter_sum(host, host + S * shard, shard);
  dev_.copy_from_host(out, host + S * shard, shard * sizeof(float));
  count(in_bytes + shard * sizeof(float));
}

void HostStagedCommunicator::all_gather(CRef in, Ref out, size_t shard) {
  // In place on the host (this rank's shard at its place in the gathered block), whether or
  // not the caller's `in` lies inside `out`.
  const size_t elt = dtype_size(in.dtype), mine = shard * elt;
  const size_t total = size_t(size()) * mine;
  if (!shard) return inner_.all_gather(in, out, shard);
  if (size() == 1) return dev_.copy(dev_.stream(), out.ptr, in.ptr, mine);
  const Ref host(reserve(block_, total), out.dtype);
  const Ref own = host + size_t(rank()) * shard;
  dev_.copy_to_host(own.ptr, in.ptr, mine);
  inner_.all_gather(CRef(own.ptr, in.dtype), host, shard);
  dev_.copy_from_host(out.ptr, host.ptr, total);
  count(mine + total);
}

void HostStagedCommunicator::broadcast(void* data, size_t bytes, int root) {
  if (!bytes || size() == 1) return inner_.broadcast(data, bytes, root);
  std::byte* host = reserve(block_, bytes);
  if (rank() == root) dev_.copy_to_host(host, data, bytes);
  inner_.broadcast(host, bytes, root);
  dev_.copy_from_host(data, host, bytes);
  count(2 * bytes);
}

void HostStagedCommunicator::send(CRef data, size_t n, int peer, int tag) {
  // Its own block per send: MPI may read it until wait_sends(), while later calls stage more.
  const size_t bytes = n * dtype_size(data.dtype);
  if (!bytes) return inner_.send(data, n, peer, tag);
  if (sends_in_flight_ == sends_.size()) sends_.emplace_back();
  std::byte* host = reserve(sends_[sends_in_flight_++], bytes);
  dev_.copy_to_host(host, data.ptr, bytes);
  inner_.send(CRef(host, data.dtype), n, peer, tag);
  count(bytes);
}

void HostStagedCommunicator::recv(Ref data, size_t n, int peer, int tag) {
  const size_t bytes = n * dtype_size(data.dtype);
  if (!bytes) return inner_.recv(data, n, peer, tag);
  std::byte* host = reserve(block_, bytes);
  inner_.recv(Ref(host, data.dtype), n, peer, tag);
  dev_.copy_from_host(data.ptr, host, bytes);
  count(bytes);
}

void HostStagedCommunicator::wait_sends() {
  inner_.wait_sends();
  sends_in_flight_ = 0;  // the blocks are kept for the next step's sends
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
