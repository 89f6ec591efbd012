#include "comm/counting_communicator.h"

#include "core/error.h"

namespace ft {

CountingCommunicator::CountingCommunicator(int size, int rank, std::string name)
    : size_(size), rank_(rank), name_(std::move(name)) {
  FT_CHECK(size >= 1 && rank >= 0 && rank < size, "counting communicator: rank ", rank,
           " of a group of ", size);
}

void CountingCommunicator::all_reduce_bytes(size_t bytes) {
  sent_[kAllReduce] += 2 * int64_t(size_ - 1) * int64_t(bytes) / size_;
}

int64_t CountingCommunicator::sent_bytes() const {
  int64_t b = 0;
  for (int64_t x : sent_) b += x;
  return b;
}

const char* CountingCommunicator::kind_name(Kind k) {
  switch (k) {
    case kAllReduce:
      return "all-reduce";
    case kReduceScatter:
      return "reduce-scatter";
    case kAllGather:
      return "all-gather";
    case kBroadcast:
      return "broadcast";
    default:
      return "send";
  }
}

void CountingCommunicator::all_reduce_sum(float*, size_t n) { all_reduce_bytes(n * 4); }
void CountingCommunicator::all_reduce_sum(double*, size_t n) { all_reduce_bytes(n * 8); }
void CountingCommunicator::all_reduce_max(float*, size_t n) { all_reduce_bytes(n * 4); }

void CountingCommunicator::reduce_scatter_sum(const float*, float*, size_t shard) {
  sent_[kReduceScatter] += int64_t(size_ - 1) * int64_t(shard) * 4;
}

void CountingCommunicator::all_gather(CRef in, Ref, size_t shard) {
  sent_[kAllGather] += int64_t(size_ - 1) * int64_t(shard * dtype_size(in.dtype));
}

void CountingCommunicator::broadcast(void*, size_t bytes, int) {
  if (size_ > 1) sent_[kBroadcast] += int64_t(bytes);
}

void CountingCommunicator::send(CRef data, size_t n, int, int) {
  sent_[kSend] += int64_t(n * dtype_size(data.dtype));
}

void CountingCommunicator::recv(Ref, size_t, int, int) {}

void CountingCommunicator::abort(int code) {
  throw Error(detail::concat("counting communicator (", name_, "): abort(", code, ")"));
}

std::string CountingCommunicator::describe() const {
  return detail::concat("counting ", name_, " group (rank ", rank_, " of ", size_, ")");
}

std::unique_ptr<Communicator> CountingCommunicator::split(int, int) {
  throw Error("counting communicator: split is not supported (ft plan builds each group)");
}

}  // namespace ft
