#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"

namespace ft {
namespace {
// A world of one: every collective is the identity.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommWork all_reduce(Stream, Ref, size_t, ReduceOp) override { return {}; }
  CommWork reduce_scatter(Stream, CRef in, Ref out, size_t shard) override {
    FT_CHECK(in.dtype == out.dtype, "reduce_scatter of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    if (in.ptr != out.ptr) std::memmove(out.ptr, in.ptr, shard * dtype_size(in.dtype));
    return {};
  }
  CommWork all_gather(Stream, CRef in, Ref out, size_t shard) override {
    FT_CHECK(in.dtype == out.dtype, "all_gather of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    if (in.ptr != out.ptr) std::memmove(out.ptr, in.ptr, shard * dtype_size(in.dtype));
    return {};
  }
  CommWork broadcast(Stream, Ref, size_t, int) override { return {}; }
  CommWork send(Stream, CRef, size_t, int, int) override { FT_FAIL("send in a one-process group"); }
  CommWork recv(Stream, Ref, size_t, int, int) override { FT_FAIL("recv in a one-process group"); }
  void barrier() override {}
  void abort(int code) override { std::_Exit(code); }
  std::string describe() const override { return "single process"; }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SingleProcessCommunicator>();
  }
};
}  // namespace

namespace {
class BothWork final : public CommWork::Pending {
 public:
  BothWork(CommWork a, CommWork b) : a_(std::move(a)), b_(std::move(b)) {}
  void wait() override {
    a_.wait();
    b_.wait();
  }
  void wait_on(Stream s) override {
    a_.wait_on(s);
    b_.wait_on(s);
  }

 private:
  CommWork a_, b_;
};
}  // namespace

CommWork both(CommWork a, CommWork b) {
  if (a.complete()) return b;
  if (b.complete()) return a;
  return CommWork(std::make_unique<BothWork>(std::move(a), std::move(b)));
}

CommWork Communicator::send_recv(Stream s, CRef send_data, size_t send_n, int send_peer,
                                 Ref recv_data, size_t recv_n, int recv_peer, int send_tag,
                                 int recv_tag) {
  CommWork sent = send_n ? send(s, send_data, send_n, send_peer, send_tag) : CommWork{};
  CommWork got = recv_n ? recv(s, recv_data, recv_n, recv_peer, recv_tag) : CommWork{};
  return both(std::move(sent), std::move(got));
}

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

namespace {
CollectiveWatch g_watch;
WatchStep g_watch_step;
}  // namespace

void set_collective_watch(const CollectiveWatch& w) { g_watch = w; }
const CollectiveWatch& collective_watch() { return g_watch; }
void set_watch_step(int64_t step, const char* phase, bool long_wait) {
  g_watch_step = {step, phase, long_wait};
}
WatchStep watch_step() { return g_watch_step; }

std::string Mesh::describe() const { return detail::concat("d", d, " p", p, " t", t); }

Mesh make_mesh(Communicator& world, int tensor, int pipeline) {
  FT_CHECK(tensor >= 1 && pipeline >= 1 && world.size() % (tensor * pipeline) == 0, "world size ",
           world.size(), " is not divisible by tensor × pipeline = ", tensor * pipeline);
  Mesh m;
  m.tensor = tensor;
  m.pipeline = pipeline;
  m.data = world.size() / (tensor * pipeline);
  const int r = world.rank();
  m.t = r % tensor;
  m.p = (r / tensor) % pipeline;
  m.d = r / (tensor * pipeline);
  // Colors name the group; every rank calls split three times in the same order.
  m.data_comm = world.split(m.p * tensor + m.t, m.d);
  m.tensor_comm = world.split(m.d * pipeline + m.p, m.t);
  m.pipeline_comm = world.split(m.d * tensor + m.t, m.p);
  m.data_comm->set_name("data");
  m.tensor_comm->set_name("tensor");
  m.pipeline_comm->set_name("pipeline");
  return m;
}

#ifndef FT_HAVE_MPI
std::unique_ptr<Communicator> init_world_communicator(int*, char***) {
  if (launched_by_mpi())
    throw Error(
        "this ft was built without MPI (FT_MPI=OFF) but was started by an MPI launcher; "
        "rebuild with -DFT_MPI=ON");
  return make_single_process_communicator();
}
#endif

}  // namespace ft
