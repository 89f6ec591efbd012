// Communicator: the collective operations training needs, behind one interface so that the
// single-process run, MPI and NCCL are interchangeable. Only the single-process implementation
// exists so far; the MPI one comes with the parallelism work and plugs in here.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace ft {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks of the group.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  virtual std::string describe() const = 0;  // e.g. "single process", "mpi world 8"
};

std::unique_ptr<Communicator> make_single_process_communicator();

}  // namespace ft
