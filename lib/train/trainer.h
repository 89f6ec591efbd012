// The training loop: recipe → model + optimizer → loader → steps → metrics.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "recipe/recipe.h"

namespace ft {

struct TrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  double wall_s = 0;
  double tokens_per_s = 0;
  double final_loss = 0;
  size_t mem_peak_bytes = 0;   // device allocator peak
  size_t peak_rss_bytes = 0;   // process peak resident set
};

// Runs the whole training job described by the (validated) recipe. Rank 0 prints progress and
// writes metrics. Throws ft::Error on failure.
TrainSummary train(const Recipe& recipe, Communicator& comm);

// Sets OpenMP and BLAS threads (0 = all cores) and returns the count in use.
int configure_threads(int threads);

}  // namespace ft
