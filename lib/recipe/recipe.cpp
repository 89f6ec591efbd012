// Recipe loading: YAML file + dotted overrides → a validated Recipe, or every problem at once.
// This file holds the public entry points and the order of the stages; the stages are member
// functions of Loader (loader.h), each defined in the file of its job:
//
// Stages, each of which only adds issues and never stops early:
//   1. read the file into per-key settings (YAML node + where it was written),      load.cpp
//   2. overlay the KEY=VALUE overrides,                                              load.cpp
//   3. convert every setting by its row's type and range into the Recipe,            load.cpp
//   4. fill derived defaults (load.cpp), take sizes from model.from's config.json
//      (validate_inputs.cpp),
//   5. check paths (validate_inputs.cpp), refuse unimplemented features, check rules across
//      keys (validate.cpp; the vocabulary against the shards and tokenizer: validate_inputs.cpp).
// A key that already has an issue is left out of later rules that read it, so one mistake
// is reported once rather than echoed by every rule that depends on it.
//
// Every stage is driven by the schema (schema.cpp), the one place recipe keys are defined.
#include "recipe/recipe.h"

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "recipe/loader.h"

namespace ft {
namespace recipe_internal {

RecipeResult Loader::run(const std::vector<std::string>& overrides) {
  r_.source_path = path_;
  const bool file_ok = read_file();
  apply_overrides(overrides);
  convert_settings();
  // An unreadable file has no keys to check further; reporting every required key as missing
  // would bury the one real problem.
  if (!file_ok) return {std::move(r_), std::move(issues_), {}};
  derive_defaults();
  take_model_from();
  check_paths();
  check_unimplemented();
  if (refuse_unbuilt_) check_unbuilt();
  check_cross_rules();
  sort_issues();
  return {std::move(r_), std::move(issues_), std::move(warnings_)};
}

}  // namespace recipe_internal

RecipeResult load_recipe(const std::string& path, const std::vector<std::string>& overrides,
                         int world_size, bool refuse_unbuilt) {
  return recipe_internal::Loader(path, world_size, refuse_unbuilt).run(overrides);
}

Recipe load_recipe_or_throw(const std::string& path, const std::vector<std::string>& overrides,
                            int world_size, bool refuse_unbuilt,
                            std::vector<std::string>* warnings) {
  RecipeResult res = load_recipe(path, overrides, world_size, refuse_unbuilt);
  if (warnings) *warnings = res.warnings;
  if (res.ok()) return std::move(res.recipe);
  std::string msg;
  for (const RecipeIssue& i : res.issues) msg += i.format() + "\n";
  msg += std::to_string(res.issues.size()) + (res.issues.size() == 1 ? " problem" : " problems") +
         " in recipe " + path;
  throw UsageError(msg);
}

int data_parallel_size(const Recipe& r, int world_size) {
  const int model_ranks = r.parallel.tensor * r.parallel.pipeline;
  FT_CHECK(model_ranks > 0 && world_size % model_ranks == 0, "world size ", world_size,
           " is not divisible by tensor × pipeline = ", model_ranks);
  return world_size / model_ranks;
}

int grad_accum_steps(const Recipe& r, int world_size) {
  const int per_step = r.training.micro_batch_size * data_parallel_size(r, world_size);
  FT_CHECK(per_step > 0 && r.training.global_batch_size % per_step == 0, "global_batch_size ",
           r.training.global_batch_size,
           " is not divisible by micro_batch_size × data ranks = ", per_step);
  return r.training.global_batch_size / per_step;
}

LossScalerConfig loss_scaler_config(const TrainingConfig& t) {
  LossScalerConfig c;
  c.loss_scale = t.loss_scale;
  c.initial_scale = t.initial_loss_scale;
  c.min_scale = t.min_loss_scale;
  c.window = t.loss_scale_window;
  c.hysteresis = t.loss_scale_hysteresis;
  c.max_skipped_steps = t.max_skipped_steps;
  return c;
}

}  // namespace ft
