// ft validate RECIPE [KEY=VALUE...] [--world N | --nproc N] [--resume ...]: the resolved recipe
// on stdout (so it can be saved and reused as a recipe), or every problem on stderr: the
// recipe's own, then what ft train's start-up would refuse on this machine for that world
// (train/preflight.h: the same checks, the same words). Nothing is trained, created or written.
#include <algorithm>
#include <cstdio>

#include "apps/ft/commands.h"
#include "recipe/recipe.h"
#include "train/preflight.h"

namespace ft::app {

int cmd_validate(const ValidateArgs& a) {
  // World size 0: no launcher tells us how many ranks the run will have, so the layout is
  // checked for the smallest world that fits it (tensor × pipeline ranks, one data rank).
  const int world = a.nproc > 0 ? a.nproc : a.world;
  const RecipeResult res = load_recipe(a.recipe, a.overrides, world);
  for (const std::string& w : res.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (!res.ok()) {
    for (const RecipeIssue& i : res.issues) std::fprintf(stderr, "%s\n", i.format().c_str());
    std::fprintf(stderr, "ft validate: %zu %s in %s\n", res.issues.size(),
                 res.issues.size() == 1 ? "problem" : "problems", a.recipe.c_str());
    return 2;
  }
  PreflightOptions o;
  o.world =
      world > 0 ? world : std::max(1, res.recipe.parallel.tensor * res.recipe.parallel.pipeline);
  o.local_ranks = a.nproc > 0 ? a.nproc : 1;
  o.resume = a.resume;
  const std::vector<Refusal> refusals = preflight_refusals(res.recipe, o);
  if (!refusals.empty()) {
    for (const Refusal& x : refusals) std::fprintf(stderr, "ft: error: %s\n", x.message.c_str());
    std::fprintf(stderr, "ft validate: %zu %s that ft train would refuse (%d %s)\n",
                 refusals.size(), refusals.size() == 1 ? "problem" : "problems", o.world,
                 o.world == 1 ? "rank" : "ranks");
    return 2;
  }
  std::fputs(recipe_to_yaml(res.recipe).c_str(), stdout);
  std::fprintf(stderr, "recipe OK\n");
  return 0;
}

}  // namespace ft::app
