#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/ft/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace ft::app {
namespace {

// `--nproc N` on a workstation: ft starts the N ranks itself through Open MPI's mpirun (which
// supervises them: if one fails, the others are stopped and mpirun exits non-zero), so the user
// types no mpirun. This process becomes mpirun; each rank runs the same command without --nproc.
[[noreturn]] void launch_local_ranks(const TrainArgs& a) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) throw Error("--nproc: cannot find this executable's path (/proc/self/exe)");
  self[len] = '\0';
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "-np", std::to_string(a.nproc)};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const char* s : {static_cast<const char*>(self), "train", a.recipe.c_str()}) args.push_back(s);
  for (const auto& o : a.overrides) args.push_back(o);
  args.push_back("--resume");
  args.push_back(a.resume);
  // The ranks' stdout goes through mpirun; tell them whether the person sees a terminal.
  setenv("FT_PROGRESS", isatty(STDOUT_FILENO) ? "bar" : "plain", 0);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  execvp("mpirun", argv.data());
  throw Error("--nproc " + std::to_string(a.nproc) +
              ": cannot start mpirun (Open MPI); install openmpi-bin (scripts/setup.sh does)");
}

}  // namespace

int cmd_train(const TrainArgs& a) {
  if (a.nproc > 1 && !launched_by_mpi()) launch_local_ranks(a);

  auto comm = init_world_communicator(nullptr, nullptr);
  const bool is_root = comm->rank() == 0;
  if (!is_root) set_log_prefix(detail::concat("[rank ", comm->rank(), "] "));
  // Every problem in the recipe is reported before any work starts (exit code 2). Every rank
  // finds the same problems; only rank 0 prints them.
  Recipe recipe;
  try {
    recipe = load_recipe_or_throw(a.recipe, a.overrides, comm->size());
  } catch (const UsageError&) {
    if (is_root) throw;
    return int(ExitCode::kUsage);
  }
  if (is_root) {
    std::printf("# resolved recipe (%s), %s\n%s\n", a.recipe.c_str(), comm->describe().c_str(),
                recipe_to_yaml(recipe).c_str());
    std::fflush(stdout);
  }
  try {
    const TrainSummary sum = train(recipe, *comm, a.resume);
    if (sum.preempted) return int(ExitCode::kPreempted);
  } catch (const Error& e) {
    // A failure on one rank must not leave the others waiting in a collective: report it here,
    // naming the rank, and end the whole job.
    if (comm->size() > 1) {
      log_error(e.what());
      comm->abort(int(e.code()));
    }
    throw;
  }
  return 0;
}

}  // namespace ft::app
