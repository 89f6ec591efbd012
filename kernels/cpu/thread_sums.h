// Deterministic sums over an OpenMP loop. reduction(+) adds the threads' partial sums in the
// order they finish, so from three threads on a double sum can differ from run to run (with one
// or two it cannot: 0 + a and a + b = b + a are exact). Here each thread's partial (its rows in
// order, under a static schedule) is kept in its slot and the slots are added in thread order:
// the same bits every run, and for one or two threads the same bits as reduction(+).
// Internal to kernels/cpu/.
#pragma once

#include "kernels/cpu/isa.h"

#include <omp.h>

#include <vector>

FT_CPU_ISA_BEGIN
namespace ft::kernels::FT_CPU_ISA_NS::cpu {

class ThreadSums {
 public:
  ThreadSums() : partial_(size_t(omp_get_max_threads()), 0.0) {}
  // Called once per thread, inside the parallel region, after its share of the loop.
  void set(double s) { partial_[size_t(omp_get_thread_num())] = s; }
  double total() const {
    double s = 0.0;
    for (double p : partial_) s += p;
    return s;
  }

 private:
  std::vector<double> partial_;  // (threads)
};

}  // namespace ft::kernels::FT_CPU_ISA_NS::cpu
FT_CPU_ISA_END
