// Which GPU a rank uses: the node-local rank modulo the GPUs it sees, so the ranks of one node
// spread over its GPUs in order. Pure logic over the environment (and MPI when it is up), built
// in every configuration so the CPU-only unit tests cover it.
#pragma once

#include <functional>
#include <string>

namespace ft::cuda {

struct LocalRank {
  int rank = 0;
  std::string source;  // where it came from, for the device's description and errors
};

// The node-local rank, from the first that is set: OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's
// mpirun), MPI_LOCALRANKID (MPICH's hydra), SLURM_LOCALID (srun); else, when MPI is
// initialized, this rank's place in an MPI_COMM_TYPE_SHARED split of MPI_COMM_WORLD (a
// collective: every rank calls it at the same point); else 0. `getenv` is injectable for tests.
LocalRank node_local_rank(const std::function<const char*(const char*)>& getenv);
LocalRank node_local_rank();

// The global rank for deciding who prints one-time notes: OMPI_COMM_WORLD_RANK, PMI_RANK,
// SLURM_PROCID, MPI when up, else 0.
int world_rank_hint();

// local_rank modulo device_count; device_count must be positive.
int pick_gpu(int local_rank, int device_count);

}  // namespace ft::cuda
