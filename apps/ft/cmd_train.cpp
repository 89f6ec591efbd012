#include <cstdio>

#include "apps/ft/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "recipe/recipe.h"
#include "train/trainer.h"

namespace ft::app {

int cmd_train(const TrainArgs& a) {
  if (a.nproc > 1)
    throw UsageError("--nproc " + std::to_string(a.nproc) +
                     ": multi-process training is not implemented yet in this build; run one "
                     "process (omit --nproc)");
  if (a.resume != "auto" && a.resume != "never")
    throw UsageError("--resume " + a.resume +
                     ": resuming from a checkpoint is not implemented yet in this build; use "
                     "--resume auto or never");
  auto comm = make_single_process_communicator();
  // Every problem in the recipe is reported before any work starts (exit code 2).
  Recipe recipe = load_recipe_or_throw(a.recipe, a.overrides, comm->size());
  if (comm->rank() == 0) {
    std::printf("# resolved recipe (%s)\n%s\n", a.recipe.c_str(), recipe_to_yaml(recipe).c_str());
    std::fflush(stdout);
  }
  train(recipe, *comm);
  return 0;
}

}  // namespace ft::app
