// Which GPU a rank takes (lib/runtime/cuda/gpu_choice.h): the node-local rank from the
// launcher's environment, in a fixed order of precedence, modulo the visible GPUs.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "runtime/cuda/gpu_choice.h"

using ft::cuda::node_local_rank;
using ft::cuda::pick_gpu;

namespace {

// An environment of exactly these variables.
auto env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

TEST_CASE("gpu choice: the node-local rank comes from the launcher, Open MPI first") {
  auto r = node_local_rank(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_LOCALID", "1"}}));
  CHECK(r.rank == 3);
  CHECK(r.source == "OMPI_COMM_WORLD_LOCAL_RANK");
  r = node_local_rank(env({{"MPI_LOCALRANKID", "2"}, {"SLURM_LOCALID", "1"}}));
  CHECK(r.rank == 2);
  CHECK(r.source == "MPI_LOCALRANKID");
  r = node_local_rank(env({{"SLURM_LOCALID", "5"}}));
  CHECK(r.rank == 5);
  CHECK(r.source == "SLURM_LOCALID");
  // Malformed values are skipped, not read as 0 or as a prefix.
  r = node_local_rank(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "1x"}, {"SLURM_LOCALID", "4"}}));
  CHECK(r.rank == 4);
  r = node_local_rank(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}, {"SLURM_LOCALID", ""}}));
  // Nothing usable and MPI not initialized in the unit tests: a single process, rank 0.
  CHECK(r.rank == 0);
  CHECK(r.source == "single process");
}

TEST_CASE("gpu choice: ranks spread over the visible GPUs in order") {
  CHECK(pick_gpu(0, 1) == 0);
  CHECK(pick_gpu(7, 1) == 0);
  CHECK(pick_gpu(5, 8) == 5);
  CHECK(pick_gpu(9, 8) == 1);  // more ranks than GPUs: they share, round robin
  CHECK(pick_gpu(18, 19) == 18);
  CHECK_THROWS_AS(pick_gpu(0, 0), ft::Error);
  CHECK_THROWS_AS(pick_gpu(-1, 4), ft::Error);
}
