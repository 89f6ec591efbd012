// Communicator: the collective operations training needs, behind one interface so that the
// single-process run, MPI and (later) NCCL are interchangeable.
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
  virtual void all_reduce_max(float* data, size_t n) = 0;
  // in: size() * shard floats; out: this rank's shard (entries [rank*shard, (rank+1)*shard)) of
  // the sum over ranks.
  virtual void reduce_scatter_sum(const float* in, float* out, size_t shard) = 0;
  // in: this rank's shard; out: size() * shard floats, rank r's shard at r*shard.
  virtual void all_gather(const float* in, float* out, size_t shard) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Point to point (pipeline stages). send() does not block: the buffer must stay untouched
  // until wait_sends() returns. recv() blocks until the data is there.
  virtual void send(const float* data, size_t n, int peer, int tag) = 0;
  virtual void recv(float* data, size_t n, int peer, int tag) = 0;
  virtual void wait_sends() = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job (after a fatal error on this one), with this exit code.
  virtual void abort(int code) = 0;
  virtual std::string describe() const = 0;  // e.g. "single process", "mpi world 8"
  // The sub-group of ranks that pass the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// The device mesh of DESIGN.md §3: world = data × pipeline × tensor, tensor innermost:
// rank = (d·P + p)·T + t. Each rank belongs to one data, one pipeline and one tensor group.
struct Mesh {
  int data = 1, pipeline = 1, tensor = 1;  // group sizes
  int d = 0, p = 0, t = 0;                 // this rank's coordinates
  std::unique_ptr<Communicator> data_comm;      // ranks with the same (p, t)
  std::unique_ptr<Communicator> tensor_comm;    // ranks with the same (d, p)
  std::unique_ptr<Communicator> pipeline_comm;  // ranks with the same (d, t)
  std::string describe() const;                 // "d1 p0 t1"
};
Mesh make_mesh(Communicator& world, int tensor, int pipeline);

std::unique_ptr<Communicator> make_single_process_communicator();

// True when this process was started by an MPI launcher (mpirun, srun with PMIx/PMI).
bool launched_by_mpi();

// The world: MPI when launched by an MPI launcher (and built with FT_MPI), else one process.
// Call once, early; the MPI communicator finalizes MPI when destroyed.
std::unique_ptr<Communicator> init_world_communicator(int* argc, char*** argv);

}  // namespace ft
