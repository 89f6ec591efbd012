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

CommWork CountingCommunicator::all_reduce(Stream, Ref data, size_t n, ReduceOp) {
  all_reduce_bytes(n * dtype_size(data.dtype));
  return made();
}

CommWork CountingCommunicator::reduce_scatter(Stream, CRef in, Ref, size_t shard) {
  sent_[kReduceScatter] += int64_t(size_ - 1) * int64_t(shard * dtype_size(in.dtype));
  return made();
}

CommWork CountingCommunicator::all_gather(Stream, CRef in, Ref, size_t shard) {
  sent_[kAllGather] += int64_t(size_ - 1) * int64_t(shard * dtype_size(in.dtype));
  return made();
}

CommWork CountingCommunicator::broadcast(Stream, Ref data, size_t n, int) {
  if (size_ > 1) sent_[kBroadcast] += int64_t(n * dtype_size(data.dtype));
  return made();
}

CommWork CountingCommunicator::send(Stream, CRef data, size_t n, int, int) {
  sent_[kSend] += int64_t(n * dtype_size(data.dtype));
  return made();
}

CommWork CountingCommunicator::recv(Stream, Ref, size_t, int, int) { return made(); }

namespace {
struct NothingToWaitFor final : CommWork::Pending {
  void wait() override {}
};
}  // namespace

CommWork CountingCommunicator::made() const {
  if (!in_flight_) return {};
  return CommWork(std::make_unique<NothingToWaitFor>());
}

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
