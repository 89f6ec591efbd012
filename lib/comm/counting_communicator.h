// The communicator `ft plan` runs a rank's step with (train/plan.h): a group of `size` ranks in
// which this rank is `rank`, where no call moves anything and each call adds the bytes this rank
// would send to a tally, by the bandwidth-optimal algorithms' counts (Patarasuk and Yuan 2009 for
// the ring; what NCCL's and Open MPI's large-message collectives send):
//   all-reduce of b bytes: 2·(k−1)/k·b (a reduce-scatter, then an all-gather);
//   reduce-scatter and all-gather of a shard of b bytes: (k−1)·b;
//   broadcast of b bytes: b (each rank forwards it once along a ring; the last sends nothing);
//   send of b bytes: b; receives, barriers and waits: nothing.
// A group of one sends nothing. Receives leave their buffers as they are (device buffers of the
// counting device, which nothing reads).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace ft {

class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(int size, int rank, std::string name);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommWork all_reduce(Stream s, Ref data, size_t n, ReduceOp op) override;
  CommWork reduce_scatter(Stream s, CRef in, Ref out, size_t shard) override;
  CommWork all_gather(Stream s, CRef in, Ref out, size_t shard) override;
  CommWork broadcast(Stream s, Ref data, size_t n, int root) override;
  CommWork send(Stream s, CRef data, size_t n, int peer, int tag) override;
  CommWork recv(Stream s, Ref data, size_t n, int peer, int tag) override;
  void barrier() override {}
  [[noreturn]] void abort(int code) override;
  std::string describe() const override;
  // ft plan builds each group directly (it knows every rank's coordinates); a split would need
  // the other ranks' colors.
  std::unique_ptr<Communicator> split(int color, int key) override;

  // Bytes sent since the last reset, in all and by kind of call.
  enum Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kKinds };
  int64_t sent_bytes() const;
  int64_t sent_bytes(Kind k) const { return sent_[k]; }
  static const char* kind_name(Kind k);
  void reset() { sent_ = {}; }
  // Calls left in flight until waited on, as NCCL's are (the default: complete when made, as
  // MPI's), so that the callers hold their buffers as long as they would with NCCL.
  void set_in_flight(bool on) { in_flight_ = on; }
  // Calls in flight stand for NCCL's, which graphs record (ft plan: what a run keeps for them).
  bool records_in_graphs() const override { return in_flight_; }

 private:
  void all_reduce_bytes(size_t bytes);
  int size_, rank_;
  std::string name_;
  std::array<int64_t, kKinds> sent_{};
  bool in_flight_ = false;
  CommWork made() const;
};

}  // namespace ft
