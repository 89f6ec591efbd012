// The training loop: recipe → model + optimizer → loader → steps → metrics.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"
#include "recipe/recipe.h"

namespace ft {

// A failure that every rank finds alike at the same point of the same step (a non-finite loss
// or gradient norm, which every rank computes): the ranks can end together, without aborting the
// job, with one message from rank 0 instead of one per rank.
class AgreedError : public Error {
 public:
  using Error::Error;
};

struct TrainSummary {
  int64_t steps = 0;         // steps trained by this process
  int64_t start_step = 0;    // > 0 when resumed
  std::string resumed_from;  // the checkpoint folder, when resumed
  bool preempted = false;    // stopped by SIGTERM/SIGUSR1 after saving (exit code 75)
  int64_t steps_done = 0;    // when preempted: steps completed (the last step's number)
  int64_t tokens = 0;
  double wall_s = 0;
  double tokens_per_s = 0;
  double final_loss = 0;         // of the last step with a trained target
  int64_t final_loss_step = -1;  // that step (-1: none had one)
  size_t mem_peak_bytes = 0;     // device allocator peak
  size_t peak_rss_bytes = 0;     // process peak resident set
  // From the process's start to the start of its first step (setup, parameter init or import,
  // the input checks, a resume's reads); negative when no step ran.
  double time_to_first_step_s = -1;
};

// Runs the whole training job described by the (validated) recipe. Rank 0 prints progress and
// writes metrics. resume: auto | never | PATH (see resume_candidates in train/train_state.h).
// Throws ft::Error on failure (AgreedError when every rank throws it alike); returns with
// preempted set after a stop signal and a save.
TrainSummary train(const Recipe& recipe, Communicator& comm, const std::string& resume = "auto");

// Sets OpenMP and BLAS threads (0 = all cores) and returns the count in use.
int configure_threads(int threads);

}  // namespace ft
