#include "optim/schedule.h"

#include <cmath>

namespace ft {

double lr_at_step(const SchedulerConfig& sched, double lr, int64_t s, int64_t S) {
  const int64_t W = sched.warmup_steps;
  if (s < W) return lr * double(s + 1) / double(W);
  if (sched.name == "constant" || S <= W) return lr;
  const double p = double(s - W) / double(S - W);
  if (sched.name == "linear") return lr - (lr - sched.min_lr) * p;
  // cosine
  return sched.min_lr + 0.5 * (lr - sched.min_lr) * (1.0 + std::cos(M_PI * p));
}

}  // namespace ft
