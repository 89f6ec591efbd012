// Communicator: the collective operations training needs, behind one interface so that the
// single-process run, MPI (host memory; device memory through host_staging.h) and ft plan's
// counting communicator are interchangeable. The NCCL issue adds one that runs on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/ops.h"

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
  // in: this rank's shard; out: size() * shard elements, rank r's shard at r*shard. Elements of
  // any dtype (moved, not combined: bf16/fp16 shards move at 2 bytes per element); in and out
  // of the same dtype.
  virtual void all_gather(CRef in, Ref out, size_t shard) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Point to point (pipeline stages). send() does not block: the buffer must stay untouched
  // until wait_sends() returns. recv() blocks until the data is there. n elements of the dtype.
  virtual void send(CRef data, size_t n, int peer, int tag) = 0;
  virtual void recv(Ref data, size_t n, int peer, int tag) = 0;
  virtual void wait_sends() = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job (after a fatal error on this one), with this exit code.
  virtual void abort(int code) = 0;
  virtual std::string describe() const = 0;  // e.g. "single process", "mpi world 8"
  // The sub-group of ranks that pass the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The group's role ("data", "tensor", ...), for the collective watchdog's messages.
  virtual void set_name(const std::string&) {}
};

// The collective watchdog (DESIGN.md §4, exit code 3). A multi-rank communicator waits on each
// collective and receive with a deadline: when a wait makes no progress for `step_timeout_s`
// inside the step loop (or for the longer `other_timeout_s` elsewhere: start-up, checkpoint
// saves, where one rank may legitimately be busy for long), it asks every rank what it is doing,
// prints which step, which collective and which ranks did not answer, and ends the job with
// exit code 3 (a wait that completes during those few seconds was slow, not hung: a warning).
// 0 disables it. The one-process communicator never waits, so ignores this.
struct CollectiveWatch {
  double step_timeout_s = 600;
  double other_timeout_s = 3600;
};
void set_collective_watch(const CollectiveWatch& w);
const CollectiveWatch& collective_watch();
// What this rank is doing, named in the watchdog's messages: the step (1-based, as printed;
// 0: outside the step loop) and a phase ("forward/backward"; a string literal, it is kept).
// The step timeout applies when step > 0 and not `long_wait` (a checkpoint save, where one
// rank may write much longer than the others); the longer allowance otherwise.
struct WatchStep {
  int64_t step = 0;
  const char* phase = "start-up";
  bool long_wait = false;
};
void set_watch_step(int64_t step, const char* phase, bool long_wait = false);
WatchStep watch_step();

// The device mesh of DESIGN.md §3: world = data × pipeline × tensor, tensor innermost:
// rank = (d·P + p)·T + t. Each rank belongs to one data, one pipeline and one tensor group.
struct Mesh {
  int data = 1, pipeline = 1, tensor = 1;       // group sizes
  int d = 0, p = 0, t = 0;                      // this rank's coordinates
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
