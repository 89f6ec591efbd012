// Host staging (comm/host_staging.h): every call reaches the wrapped communicator with host
// memory only and brings its result back into device memory. The device is the guard device,
// whose memory kills the process when touched outside the Device's copies and ops, so a call
// that handed device memory on would crash here; the wrapped communicator is a stand-in for
// rank 0 of two that computes on what it is given as MPI would, with a fixed peer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/host_staging.h"
#include "runtime/guard_device.h"

namespace {

// Rank `rank` of two; the peer holds `peer_value` in every element it contributes.
class FakePair final : public ft::Communicator {
 public:
  explicit FakePair(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  ft::CommWork all_reduce(ft::Stream, ft::Ref data, size_t n, ft::ReduceOp op) override {
    REQUIRE((data.dtype == ft::DType::kF32 || data.dtype == ft::DType::kF64));
    for (size_t i = 0; i < n; ++i) {
      if (data.dtype == ft::DType::kF32) {
        float& x = static_cast<float*>(data.ptr)[i];
        x = op == ft::ReduceOp::kSum ? x + kPeer : std::max(x, kPeer);
      } else {
        double& x = static_cast<double*>(data.ptr)[i];
        x = op == ft::ReduceOp::kSum ? x + kPeer : std::max(x, double(kPeer));
      }
    }
    return {};
  }
  ft::CommWork reduce_scatter(ft::Stream, ft::CRef in, ft::Ref out, size_t shard) override {
    const auto* i = static_cast<const float*>(in.ptr);
    for (size_t k = 0; k < shard; ++k)
      static_cast<float*>(out.ptr)[k] = i[size_t(rank_) * shard + k] + kPeer;
    return {};
  }
  ft::CommWork all_gather(ft::Stream, ft::CRef in, ft::Ref out, size_t shard) override {
    const size_t b = shard * ft::dtype_size(in.dtype);
    auto* o = static_cast<char*>(out.ptr);
    std::memmove(o + size_t(rank_) * b, in.ptr, b);
    std::memset(o + size_t(1 - rank_) * b, 0x11, b);  // the peer's shard
    return {};
  }
  ft::CommWork broadcast(ft::Stream, ft::Ref data, size_t n, int root) override {
    if (root != rank_) std::memset(data.ptr, 0x22, n * ft::dtype_size(data.dtype));
    return {};
  }
  // A send stays in flight until its handle is waited on: MPI reads the buffer until then, so
  // it must still hold what was sent.
  struct Sent final : ft::CommWork::Pending {
    Sent(FakePair* c, const float* p, size_t n) : comm(c), ptr(p), count(n) {}
    void wait() override { comm->sent_.emplace_back(ptr, ptr + count); }
    FakePair* comm;
    const float* ptr;
    size_t count;
  };
  ft::CommWork send(ft::Stream, ft::CRef data, size_t n, int, int) override {
    return ft::CommWork(std::make_unique<Sent>(this, static_cast<const float*>(data.ptr), n));
  }
  ft::CommWork recv(ft::Stream, ft::Ref data, size_t n, int, int) override {
    for (size_t i = 0; i < n; ++i) static_cast<float*>(data.ptr)[i] = kPeer + float(i);
    return {};
  }
  void barrier() override {}
  void abort(int) override {}
  std::string describe() const override { return "fake pair"; }
  std::unique_ptr<ft::Communicator> split(int, int) override {
    return std::make_unique<FakePair>(rank_);
  }
  static constexpr float kPeer = 100;
  std::vector<std::vector<float>> sent_;

 private:
  int rank_;
};

std::vector<float> iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + float(i);
  return v;
}

}  // namespace

TEST_CASE("host staging: collectives and point to point reach the peer through host memory") {
  auto dev = ft::make_guard_device();
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    FakePair inner(rank);
    ft::HostStagedCommunicator comm(inner, *dev);
    const auto before = ft::host_staging_stats();
    const size_t n = 19;
    ft::Buffer<float> a(dev.get(), 2 * n), b(dev.get(), n);
    std::vector<float> got(2 * n);

    const ft::Stream st = dev->stream();
    a.upload(iota(n, 1).data(), n);
    comm.all_reduce(st, a.data(), n, ft::ReduceOp::kSum).wait();
    a.download(got.data(), n);
    for (size_t i = 0; i < n; ++i) CHECK(got[i] == 101 + float(i));

    comm.all_reduce(st, a.data(), n, ft::ReduceOp::kMax).wait_on(st);  // max(101 + i, 100)
    a.download(got.data(), n);
    CHECK(got[0] == 101);

    ft::Buffer<double> d(dev.get(), 1);
    const double one = 1;
    d.upload(&one, 1);
    comm.all_reduce(st, d.data(), 1, ft::ReduceOp::kSum).wait();
    double dsum = 0;
    d.download(&dsum, 1);
    CHECK(dsum == 101);

    a.upload(iota(2 * n, 0).data(), 2 * n);
    comm.reduce_scatter(st, a.data(), b.data(), n).wait();
    b.download(got.data(), n);
    for (size_t i = 0; i < n; ++i) CHECK(got[i] == float(size_t(rank) * n + i) + 100);

    // In place, as ZeRO gathers: this rank's shard already at its place in `a`.
    const std::vector<float> mine = iota(n, 7);
    a.upload(mine.data(), n, size_t(rank) * n);
    comm.all_gather(st, a.data() + size_t(rank) * n, a.data(), n).wait();
    a.download(got.data(), 2 * n);
    float peer;
    std::memset(&peer, 0x11, sizeof peer);
    for (size_t i = 0; i < n; ++i) {
      CHECK(got[size_t(rank) * n + i] == mine[i]);
      CHECK(std::memcmp(&got[size_t(1 - rank) * n + i], &peer, sizeof peer) == 0);
    }

    // Two sends in flight and a receive between them and the waits: each keeps its own block,
    // and a block comes back for the next send once its send is waited on.
    a.upload(iota(n, 1).data(), n);
    ft::CommWork s1 = comm.send(st, a.data(), n, 1 - rank, 0);
    a.upload(iota(n, 50).data(), n);
    ft::CommWork s2 = comm.send(st, a.data(), n, 1 - rank, 2);
    CHECK(!s1.complete());
    comm.recv(st, b.data(), n, 1 - rank, 1).wait_on(st);
    s2.wait();
    s1.wait();
    CHECK(s1.complete());
    a.upload(iota(n, 20).data(), n);
    comm.send(st, a.data(), n, 1 - rank, 4).wait();
    REQUIRE(inner.sent_.size() == 3);
    CHECK(inner.sent_[0] == iota(n, 50));
    CHECK(inner.sent_[1] == iota(n, 1));
    CHECK(inner.sent_[2] == iota(n, 20));
    b.download(got.data(), n);
    CHECK(std::vector<float>(got.begin(), got.begin() + long(n)) == iota(n, 100));

    const int32_t word = 5;
    ft::Buffer<int32_t> w(dev.get(), 1);
    w.upload(&word, 1);
    comm.broadcast(st, ft::Ref(w.data(), ft::DType::kI32), 1, 0).wait();
    int32_t got_word = 0;
    w.download(&got_word, 1);
    CHECK(got_word == (rank == 0 ? 5 : 0x22222222));

    CHECK(ft::host_staging_stats().calls == before.calls + 10);
  }
}

TEST_CASE("host staging: a group of one stays on the device") {
  // The one-process communicator would copy with the host's memmove, which the guard stops.
  auto dev = ft::make_guard_device();
  auto one = ft::make_single_process_communicator();
  std::vector<std::unique_ptr<ft::Communicator>> keep;
  ft::Communicator* comm = ft::for_device_memory(one.get(), *dev, keep);
  REQUIRE(comm != one.get());
  const auto before = ft::host_staging_stats();
  const size_t n = 111;
  ft::Buffer<float> a(dev.get(), n), b(dev.get(), n);
  a.upload(iota(n, 3).data(), n);
  const ft::Stream st = dev->stream();
  comm->all_gather(st, a.data(), b.data(), n).wait();
  comm->all_reduce(st, b.data(), n, ft::ReduceOp::kSum).wait();
  comm->reduce_scatter(st, b.data(), a.data(), n).wait();
  std::vector<float> got(n);
  a.download(got.data(), n);
  CHECK(got == iota(n, 3));
  CHECK(ft::host_staging_stats().calls == before.calls);
}

TEST_CASE("host staging: not on a device the host may use") {
  auto dev = ft::make_cpu_device();
  auto one = ft::make_single_process_communicator();
  std::vector<std::unique_ptr<ft::Communicator>> keep;
  CHECK(ft::for_device_memory(one.get(), *dev, keep) == one.get());
  CHECK(ft::for_device_memory(nullptr, *ft::make_guard_device(), keep) == nullptr);
  CHECK(keep.empty());
}
