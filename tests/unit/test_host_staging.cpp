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
  void all_reduce_sum(float* d, size_t n) override {
    for (size_t i = 0; i < n; ++i) d[i] += kPeer;
  }
  void all_reduce_sum(double* d, size_t n) override {
    for (size_t i = 0; i < n; ++i) d[i] += kPeer;
  }
  void all_reduce_max(float* d, size_t n) override {
    for (size_t i = 0; i < n; ++i) d[i] = std::max(d[i], kPeer);
  }
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override {
    for (size_t i = 0; i < shard; ++i) out[i] = in[size_t(rank_) * shard + i] + kPeer;
  }
  void all_gather(ft::CRef in, ft::Ref out, size_t shard) override {
    const size_t b = shard * ft::dtype_size(in.dtype);
    auto* o = static_cast<char*>(out.ptr);
    std::memmove(o + size_t(rank_) * b, in.ptr, b);
    std::memset(o + size_t(1 - rank_) * b, 0x11, b);  // the peer's shard
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root != rank_) std::memset(data, 0x22, bytes);
  }
  void send(ft::CRef data, size_t n, int, int) override {
    sends_.push_back({static_cast<const float*>(data.ptr), n});
  }
  void recv(ft::Ref data, size_t n, int, int) override {
    for (size_t i = 0; i < n; ++i) static_cast<float*>(data.ptr)[i] = kPeer + float(i);
  }
  void wait_sends() override {
    // MPI reads a send's buffer until here: each must still hold what was sent.
    for (const auto& [p, n] : sends_) sent_.emplace_back(p, p + n);
    sends_.clear();
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
  std::vector<std::pair<const float*, size_t>> sends_;
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

    a.upload(iota(n, 1).data(), n);
    comm.all_reduce_sum(a.data(), n);
    a.download(got.data(), n);
    for (size_t i = 0; i < n; ++i) CHECK(got[i] == 101 + float(i));

    comm.all_reduce_max(a.data(), n);  // max(101 + i, 100): unchanged
    a.download(got.data(), n);
    CHECK(got[0] == 101);

    ft::Buffer<double> d(dev.get(), 1);
    const double one = 1;
    d.upload(&one, 1);
    comm.all_reduce_sum(d.data(), 1);
    double dsum = 0;
    d.download(&dsum, 1);
    CHECK(dsum == 101);

    a.upload(iota(2 * n, 0).data(), 2 * n);
    comm.reduce_scatter_sum(a.data(), b.data(), n);
    b.download(got.data(), n);
    for (size_t i = 0; i < n; ++i) CHECK(got[i] == float(size_t(rank) * n + i) + 100);

    // In place, as ZeRO gathers: this rank's shard already at its place in `a`.
    const std::vector<float> mine = iota(n, 7);
    a.upload(mine.data(), n, size_t(rank) * n);
    comm.all_gather(a.data() + size_t(rank) * n, a.data(), n);
    a.download(got.data(), 2 * n);
    float peer;
    std::memset(&peer, 0x11, sizeof peer);
    for (size_t i = 0; i < n; ++i) {
      CHECK(got[size_t(rank) * n + i] == mine[i]);
      CHECK(std::memcmp(&got[size_t(1 - rank) * n + i], &peer, sizeof peer) == 0);
    }

    // Two sends in flight and a receive between them and the wait: each keeps its own block.
    a.upload(iota(n, 1).data(), n);
    comm.send(a.data(), n, 1 - rank, 0);
    a.upload(iota(n, 50).data(), n);
    comm.send(a.data(), n, 1 - rank, 2);
    comm.recv(b.data(), n, 1 - rank, 1);
    comm.wait_sends();
    REQUIRE(inner.sent_.size() == 2);
    CHECK(inner.sent_[0] == iota(n, 1));
    CHECK(inner.sent_[1] == iota(n, 50));
    b.download(got.data(), n);
    CHECK(std::vector<float>(got.begin(), got.begin() + long(n)) == iota(n, 100));

    const int32_t word = 5;
    ft::Buffer<int32_t> w(dev.get(), 1);
    w.upload(&word, 1);
    comm.broadcast(w.data(), sizeof word, 0);
    int32_t got_word = 0;
    w.download(&got_word, 1);
    CHECK(got_word == (rank == 0 ? 5 : 0x22222222));

    CHECK(ft::host_staging_stats().calls == before.calls + 9);
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
  comm->all_gather(a.data(), b.data(), n);
  comm->all_reduce_sum(b.data(), n);
  comm->reduce_scatter_sum(b.data(), a.data(), n);
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
