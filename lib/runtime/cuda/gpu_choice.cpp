#include "runtime/cuda/gpu_choice.h"

#include <cstdlib>

#include "core/error.h"

#if FT_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only, as lib/comm/mpi_communicator.cpp
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace ft::cuda {
namespace {

// A non-negative integer, or -1 when `s` is not one (a malformed variable is ignored rather
// than trusted: the next source decides).
int parse_rank(const char* s) {
  if (!s || !*s) return -1;
  long v = 0;
  for (const char* c = s; *c; ++c) {
    if (*c < '0' || *c > '9') return -1;
    v = v * 10 + (*c - '0');
    if (v > 1 << 20) return -1;
  }
  return int(v);
}

#if FT_HAVE_MPI
bool mpi_up() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
#endif

}  // namespace

LocalRank node_local_rank(const std::function<const char*(const char*)>& getenv) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (int r = parse_rank(getenv(var)); r >= 0) return {r, var};
  }
#if FT_HAVE_MPI
  if (mpi_up()) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int r = 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return {r, "MPI shared-memory split"};
  }
#endif
  return {0, "single process"};
}

LocalRank node_local_rank() {
  return node_local_rank([](const char* v) { return std::getenv(v); });
}

int world_rank_hint() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (int r = parse_rank(std::getenv(var)); r >= 0) return r;
  }
#if FT_HAVE_MPI
  if (mpi_up()) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
#endif
  return 0;
}

int pick_gpu(int local_rank, int device_count) {
  FT_CHECK(device_count > 0, "pick_gpu: no CUDA device to choose from");
  FT_CHECK(local_rank >= 0, "pick_gpu: negative node-local rank ", local_rank);
  return local_rank % device_count;
}

}  // namespace ft::cuda
