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
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void reduce_scatter_sum(const float* in, float* out, size_t shard) override {
    if (in != out) std::memmove(out, in, shard * sizeof(float));
  }
  void all_gather(const float* in, float* out, size_t shard) override {
    if (in != out) std::memmove(out, in, shard * sizeof(float));
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  void abort(int code) override { std::_Exit(code); }
  std::string describe() const override { return "single process"; }
};
}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

bool launched_by_mpi() {
  // Open MPI's mpirun, PMIx (srun --mpi=pmix, mpirun), and PMI-1/2 (srun --mpi=pmi2).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

#ifndef FT_HAVE_MPI
std::unique_ptr<Communicator> init_world_communicator(int*, char***) {
  if (launched_by_mpi())
    throw Error("this ft was built without MPI (FT_MPI=OFF) but was started by an MPI launcher; "
                "rebuild with -DFT_MPI=ON");
  return make_single_process_communicator();
}
#endif

}  // namespace ft
