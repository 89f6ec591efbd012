// The optimizer's and the learning-rate schedule's settings: what lib/optim reads. The recipe's
// `optimizer:` and `scheduler:` sections resolve into them (lib/recipe), but they live here so
// that the optimizer depends on its own settings, not on the recipe that names them (as
// model/config.h does for the model).
#pragma once

#include <cstdint>
#include <string>

namespace ft {

struct OptimizerConfig {
  std::string name = "adamw";
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;  // recipe key: betas: [b1, b2]
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct SchedulerConfig {
  std::string name = "constant";  // constant | linear | cosine
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
};

}  // namespace ft
