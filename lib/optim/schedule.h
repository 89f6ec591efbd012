// Learning-rate schedules exactly as DESIGN.md §5 (steps numbered from 0):
//   warmup (s < W): lr·(s+1)/W;  then with p = (s − W)/(S − W):
//   constant: lr;  linear: lr − (lr − min_lr)·p;  cosine: min_lr + ½(lr − min_lr)(1 + cos πp).
#pragma once

#include <cstdint>

#include "optim/config.h"

namespace ft {

double lr_at_step(const SchedulerConfig& sched, double lr, int64_t step, int64_t total_steps);

}  // namespace ft
