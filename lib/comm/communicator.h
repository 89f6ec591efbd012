// Communicator: the collective operations training needs, behind one interface so that the
// single-process run, MPI (host memory; device memory through host_staging.h) and ft plan's
// counting communicator are interchangeable. Calls are ordered on streams and return a handle
// (CommWork), so that a communicator that runs on the device (NCCL) can work on a stream of its
// own while compute goes on; the host-memory ones complete their calls before returning.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/system.h"  // launched_by_mpi
#include "runtime/ops.h"

namespace ft {

enum class ReduceOp : uint8_t { kSum, kMax };

// The completion of a communication call (a collective, a send or a receive). Stream order:
// each call reads its input after the work queued on the stream it is given before the call
// (NCCL's contract; on the CPU that work is done already), and the handle says when its output
// is written and its input may be reused. A handle is waited on at most once, either way:
//   wait():     the host blocks until the call is complete;
//   wait_on(s): work queued on stream `s` after this waits for the call, the host does not
//               (a communicator whose calls complete on the host waits there instead).
// A default-made handle is complete. Communicators that finish a call before returning (MPI on
// host memory, host staging, one process, ft plan's counting) return complete handles, except
// MPI's sends (below). A handle must be waited on before its communicator is destroyed; one
// dropped unwaited (an error unwinding) leaves the call running and its buffers in use.
class CommWork {
 public:
  // What a communicator returns for a call still in flight.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
    virtual void wait_on(Stream s) {
      (void)s;
      wait();
    }
  };
  CommWork() = default;
  explicit CommWork(std::unique_ptr<Pending> p) : pending_(std::move(p)) {}
  bool complete() const { return pending_ == nullptr; }
  void wait() {
    if (auto p = std::move(pending_)) p->wait();
  }
  void wait_on(Stream s) {
    if (auto p = std::move(pending_)) p->wait_on(s);
  }

 private:
  std::unique_ptr<Pending> pending_;
};

// One handle for two calls: waits for both.
CommWork both(CommWork a, CommWork b);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Stream-ordered calls (CommWork above). Memory is the memory of the device the communicator
  // serves (host memory for MPI and the one-process communicator; see host_staging.h), and must
  // stay untouched until the handle completes.
  // In-place reduction over all ranks of the group: F32, F64 (kSum, kMax); BF16, F16 where the
  // communicator says so (NCCL).
  virtual CommWork all_reduce(Stream s, Ref data, size_t n, ReduceOp op) = 0;
  // in: size() * shard elements; out: this rank's shard (entries [rank*shard, (rank+1)*shard))
  // of the sum over ranks. F32.
  virtual CommWork reduce_scatter(Stream s, CRef in, Ref out, size_t shard) = 0;
  // in: this rank's shard; out: size() * shard elements, rank r's shard at r*shard. Elements of
  // any dtype (moved, not combined: bf16/fp16 shards move at 2 bytes per element); in and out
  // of the same dtype; `in` may be this rank's place in `out`.
  virtual CommWork all_gather(Stream s, CRef in, Ref out, size_t shard) = 0;
  // n elements of root's `data` into every rank's.
  virtual CommWork broadcast(Stream s, Ref data, size_t n, int root) = 0;
  // Point to point (pipeline stages), n elements of the dtype, matched by (peer, tag) in order.
  // A send's handle completes when its buffer may be reused, a receive's when the data is there.
  virtual CommWork send(Stream s, CRef data, size_t n, int peer, int tag) = 0;
  virtual CommWork recv(Stream s, Ref data, size_t n, int peer, int tag) = 0;
  // A send and a receive made together (Megatron's batched isend/irecv): NCCL runs them as one
  // group, so two ranks that each send to the other at the same point of a schedule cannot
  // wait on each other. The handle completes when both have. Either half is left out with
  // n = 0. The default makes them one after the other (right for MPI, whose sends never wait
  // for the receiver before they return).
  virtual CommWork send_recv(Stream s, CRef send_data, size_t send_n, int send_peer, Ref recv_data,
                             size_t recv_n, int recv_peer, int send_tag, int recv_tag);
  // CUDA graphs (issue 33 point 3). Whether a call on a stream that is capturing a graph is
  // recorded into it (NCCL 2.9+), made at each launch of the graph instead of now; its handle may
  // then be waited on only by wait_on of a stream in the same capture. Elsewhere such a call is
  // the caller's error. watched_launch: `launch` launches (on stream `s`) a graph that recorded
  // this communicator's calls; the collective watchdog watches them as one call named `what`
  // (an identifier, as "all_reduce_sum"), from before the launch until the work queued on `s`
  // by then is done.
  virtual bool records_in_graphs() const { return false; }
  virtual void watched_launch(Stream s, const char* what, const std::function<void()>& launch) {
    (void)s;
    (void)what;
    launch();
  }
  virtual void barrier() = 0;
  // Ends every rank of the job (after a fatal error on this one), with this exit code.
  virtual void abort(int code) = 0;
  virtual std::string describe() const = 0;  // e.g. "single process", "mpi world 8"
  // The sub-group of ranks that pass the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // The group's role ("data", "tensor", ...), for the collective watchdog's messages.
  virtual void set_name(const std::string&) {}
  // How the watchdog's messages name call number `seq` of kind `op` on this group (and the peer
  // of a receive, -1: none): "all_reduce_sum #41 on the data group (ranks 0,2)".
  virtual std::string call_label(const char* op, uint64_t seq, int peer) const {
    (void)peer;
    return std::string(op) + " #" + std::to_string(seq);
  }

  // Shorthands for host memory (scalars, flags, the step's agreement; never a device's memory
  // unless the host may use it): the call with no stream, waited on by the host.
  void all_reduce_sum(float* host, size_t n) {
    all_reduce(Stream{}, host, n, ReduceOp::kSum).wait();
  }
  void all_reduce_sum(double* host, size_t n) {
    all_reduce(Stream{}, host, n, ReduceOp::kSum).wait();
  }
  void all_reduce_max(float* host, size_t n) {
    all_reduce(Stream{}, host, n, ReduceOp::kMax).wait();
  }
  void broadcast_bytes(void* host, size_t bytes, int root) {
    broadcast(Stream{}, Ref(host, DType::kU8), bytes, root).wait();
  }
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

// The world: MPI when launched by an MPI launcher (and built with FT_MPI), else one process.
// Call once, early; the MPI communicator finalizes MPI when destroyed.
std::unique_ptr<Communicator> init_world_communicator(int* argc, char*** argv);

}  // namespace ft
