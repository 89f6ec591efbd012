// ft validate RECIPE [KEY=VALUE...]: the resolved recipe on stdout (so it can be saved and
// reused as a recipe), or every problem on stderr. Nothing is trained or written.
#include <cstdio>

#include "apps/ft/commands.h"
#include "recipe/recipe.h"
#include "train/run_lock.h"

namespace ft::app {

int cmd_validate(const ValidateArgs& a) {
  // World size 0: no launcher tells us how many ranks the run will have, so the layout is
  // checked for the smallest world that fits it (tensor × pipeline ranks, one data rank).
  const RecipeResult res = load_recipe(a.recipe, a.overrides, /*world_size=*/0);
  for (const std::string& w : res.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (!res.ok()) {
    for (const RecipeIssue& i : res.issues) std::fprintf(stderr, "%s\n", i.format().c_str());
    std::fprintf(stderr, "ft validate: %zu %s in %s\n", res.issues.size(),
                 res.issues.size() == 1 ? "problem" : "problems", a.recipe.c_str());
    return 2;
  }
  // What `ft train` would refuse before any work beyond the recipe itself.
  if (const std::string busy = run_folders_in_use(res.recipe); !busy.empty()) {
    std::fprintf(stderr, "ft: error: %s\n", busy.c_str());
    return 2;
  }
  std::fputs(recipe_to_yaml(res.recipe).c_str(), stdout);
  std::fprintf(stderr, "recipe OK\n");
  return 0;
}

}  // namespace ft::app
