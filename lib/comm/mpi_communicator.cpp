// MPI communicator (Open MPI from Debian). Collectives in place where MPI allows it. Errors
// abort the whole job: a collective that fails on one rank would otherwise hang the others.
// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdlib>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"

namespace ft {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(detail::concat("MPI ", what, " failed: ", std::string(msg, size_t(len))));
}

// MPI counts are int; split larger buffers into pieces below 2^30 elements.
constexpr size_t kMaxCount = size_t(1) << 30;

class MpiCommunicator final : public Communicator {
 public:
  // The world: initialises MPI, and finalizes it when destroyed.
  MpiCommunicator(int* argc, char*** argv) : comm_(MPI_COMM_WORLD), owns_mpi_(true) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "init");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  // A sub-group made by split().
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm), owns_mpi_(false) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (owns_mpi_) MPI_Finalize();
    else MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, size_t n) override {
    for (size_t i = 0; i < n; i += kMaxCount)
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, int(std::min(kMaxCount, n - i)), MPI_FLOAT,
                          MPI_SUM, comm_), "allreduce");
  }
  void all_reduce_max(float* data, size_t n) override {
    for (size_t i = 0; i < n; i += kMaxCount)
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, int(std::min(kMaxCount, n - i)), MPI_FLOAT,
                          MPI_MAX, comm_), "allreduce");
  }
  void all_reduce_sum(double* data, size_t n) override {
    for (size_t i = 0; i < n; i += kMaxCount)
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, int(std::min(kMaxCount, n - i)), MPI_DOUBLE,
                          MPI_SUM, comm_), "allreduce");
  }
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override {
    FT_CHECK(shard < kMaxCount, "reduce-scatter shard too large");
    check(MPI_Reduce_scatter_block(in, out, int(shard), MPI_FLOAT, MPI_SUM, comm_),
          "reduce_scatter");
  }
  void all_gather(const float* in, float* out, size_t shard) override {
    FT_CHECK(shard < kMaxCount, "all-gather shard too large");
    if (in == out + size_t(rank_) * shard)
      check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, out, int(shard), MPI_FLOAT, comm_),
            "allgather");
    else
      check(MPI_Allgather(in, int(shard), MPI_FLOAT, out, int(shard), MPI_FLOAT, comm_),
            "allgather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    FT_CHECK(bytes < kMaxCount, "broadcast too large");
    check(MPI_Bcast(data, int(bytes), MPI_BYTE, root, comm_), "broadcast");
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }
  void send(const float* data, size_t n, int peer, int tag) override {
    FT_CHECK(n < kMaxCount, "send too large");
    MPI_Request req;
    check(MPI_Isend(data, int(n), MPI_FLOAT, peer, tag, comm_, &req), "isend");
    pending_.push_back(req);
  }
  void recv(float* data, size_t n, int peer, int tag) override {
    FT_CHECK(n < kMaxCount, "recv too large");
    check(MPI_Recv(data, int(n), MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE), "recv");
  }
  void wait_sends() override {
    if (pending_.empty()) return;
    check(MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE), "waitall");
    pending_.clear();
  }
  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }
  std::string describe() const override { return "mpi world " + std::to_string(size_); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  MPI_Comm comm_;
  bool owns_mpi_;
  std::vector<MPI_Request> pending_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> init_world_communicator(int* argc, char*** argv) {
  if (!launched_by_mpi()) return make_single_process_communicator();
  return std::make_unique<MpiCommunicator>(argc, argv);
}

}  // namespace ft
