// MPI communicator (Open MPI from Debian). Collectives in place where MPI allows it. Errors
// abort the whole job: a collective that fails on one rank would otherwise hang the others.
// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
//
// The collective watchdog (communicator.h, DESIGN.md §4). Every collective and receive is
// started in its non-blocking form and waited on here, with a deadline, because a blocking MPI
// call never returns when a peer is stopped (kill -STOP, a debugger) or its node is gone
// without the connection breaking. While it waits a rank also answers status requests on a
// duplicate of the world (its own tags can never match training traffic). Past the deadline
// the rank asks every other rank where it is, waits a short grace period for the answers,
// prints which ranks stayed silent, and ends the job with MPI_Abort(code 3): mpirun then kills
// every rank, the stopped one included (SIGKILL reaches stopped processes).
//
// Device communicators (NCCL, comm/device_comm.h) use the same machinery: while their host
// waits on device work it answers status requests (answer_watchdog_requests), naming the call
// it waits in (device_wait_begin), and when their own watchdog thread finds a call past its
// deadline the main thread reports it here (report_device_hang): the same message, exit 3.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/device_comm.h"
#include "comm/hang_report.h"
#include "core/error.h"
#include "core/log.h"

namespace ft {
namespace {

using Clock = std::chrono::steady_clock;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(detail::concat("MPI ", what, " failed: ", std::string(msg, size_t(len))));
}

// MPI counts are int; split larger buffers into pieces below 2^30 elements.
constexpr size_t kMaxCount = size_t(1) << 30;

// The MPI type of a dtype's elements. 16-bit floats move as 16-bit integers (MPI has no bf16):
// all_reduce refuses them, everything else only moves them.
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16:
      return MPI_UINT16_T;
    case DType::kU8:
      return MPI_BYTE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kU32:
      return MPI_UINT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU64:
      return MPI_UINT64_T;
  }
  FT_FAIL("no MPI type for dtype ", dtype_name(t));
}

// How long the rank that timed out waits for the others' answers. Live ranks answer within
// milliseconds (they poll every millisecond while they wait); a few seconds cover a loaded node.
constexpr double kGraceS = 3.0;
// Waits shorter than this spin (yielding the core), as MPI's blocking calls do: a collective's
// latency stays what it was. Longer waits sleep between polls, backing off to kMaxSleepUs, so
// that a rank waiting for a slow peer leaves the cores to the ranks that compute.
constexpr double kSpinS = 0.05;
constexpr int kMaxSleepUs = 1000;
constexpr int kStatusRequestTag = 1, kStatusReplyTag = 2;

// A rank's answer to a status request: fixed size, sent as bytes.
struct StatusReply {
  int64_t step;
  double waited_s;
  char phase[48];
  char waiting_in[200];
};

class MpiCommunicator;

// Process-wide watchdog state: the status channel, every rank's pid and host (gathered at
// start-up, so that a rank that never answers can still be named), and the wait in progress.
struct Watchdog {
  MPI_Comm status = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::vector<int> pids;
  std::vector<std::string> hosts;
  uint64_t seq = 0;  // collectives and receives started by this rank
  // The wait in progress (op == nullptr: none).
  const char* op = nullptr;
  const MpiCommunicator* comm = nullptr;
  int peer = -1;
  uint64_t op_seq = 0;
  Clock::time_point since;
  // The device call the host waits on (device_wait_begin; empty: none), when no MPI wait is in
  // progress; and the lowest rank that asked for this rank's status meanwhile (size: none).
  std::string device_label;
  Clock::time_point device_since;
  int device_asked_by = 1 << 30;
};
Watchdog g_dog;

void copy_field(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

class MpiCommunicator final : public Communicator {
 public:
  // The world: initialises MPI, and finalizes it when destroyed.
  MpiCommunicator(int* argc, char*** argv) : comm_(MPI_COMM_WORLD), owns_mpi_(true) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "init");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    name_ = "world";
    describe_members();
    init_watchdog();
  }
  // A sub-group made by split().
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm), owns_mpi_(false) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    describe_members();
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (owns_mpi_) {
      if (g_dog.status != MPI_COMM_NULL) MPI_Comm_free(&g_dog.status);
      MPI_Finalize();
    } else {
      MPI_Comm_free(&comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommWork all_reduce(Stream, Ref data, size_t n, ReduceOp op) override {
    FT_CHECK(data.dtype == DType::kF32 || data.dtype == DType::kF64, "MPI cannot reduce ",
             dtype_name(data.dtype), " elements (fp32 and fp64 only)");
    const MPI_Datatype type = mpi_type(data.dtype);
    const MPI_Op mop = op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
    const char* name = op == ReduceOp::kSum ? "all_reduce_sum" : "all_reduce_max";
    for (size_t i = 0; i < n; i += kMaxCount) {
      MPI_Request req;
      check(MPI_Iallreduce(MPI_IN_PLACE, (data + i).ptr, int(std::min(kMaxCount, n - i)), type, mop,
                           comm_, &req),
            "allreduce");
      wait(&req, 1, name);
    }
    return {};
  }
  CommWork reduce_scatter(Stream, CRef in, Ref out, size_t shard) override {
    FT_CHECK(shard < kMaxCount, "reduce-scatter shard too large");
    FT_CHECK(in.dtype == out.dtype && (in.dtype == DType::kF32 || in.dtype == DType::kF64),
             "MPI reduce_scatter of ", dtype_name(in.dtype), " into ", dtype_name(out.dtype),
             " (fp32 and fp64 only)");
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(in.ptr, out.ptr, int(shard), mpi_type(in.dtype), MPI_SUM, comm_,
                                    &req),
          "reduce_scatter");
    wait(&req, 1, "reduce_scatter_sum");
    return {};
  }
  CommWork all_gather(Stream, CRef in, Ref out, size_t shard) override {
    FT_CHECK(shard < kMaxCount, "all-gather shard too large");
    FT_CHECK(in.dtype == out.dtype, "all_gather of ", dtype_name(in.dtype), " into ",
             dtype_name(out.dtype));
    const MPI_Datatype type = mpi_type(in.dtype);
    MPI_Request req;
    if (in.ptr == (out + size_t(rank_) * shard).ptr)
      check(MPI_Iallgather(MPI_IN_PLACE, 0, type, out.ptr, int(shard), type, comm_, &req),
            "allgather");
    else
      check(MPI_Iallgather(in.ptr, int(shard), type, out.ptr, int(shard), type, comm_, &req),
            "allgather");
    wait(&req, 1, "all_gather");
    return {};
  }
  CommWork broadcast(Stream, Ref data, size_t n, int root) override {
    FT_CHECK(n < kMaxCount, "broadcast too large");
    MPI_Request req;
    check(MPI_Ibcast(data.ptr, int(n), mpi_type(data.dtype), root, comm_, &req), "broadcast");
    wait(&req, 1, "broadcast");
    return {};
  }
  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier");
    wait(&req, 1, "barrier");
  }
  // A send is started and returned in flight: the pipeline's next computation overlaps it.
  CommWork send(Stream, CRef data, size_t n, int peer, int tag) override {
    FT_CHECK(n < kMaxCount, "send too large");
    auto p = std::make_unique<PendingSend>(this);
    check(MPI_Isend(data.ptr, int(n), mpi_type(data.dtype), peer, tag, comm_, &p->req), "isend");
    return CommWork(std::move(p));
  }
  CommWork recv(Stream, Ref data, size_t n, int peer, int tag) override {
    FT_CHECK(n < kMaxCount, "recv too large");
    MPI_Request req;
    check(MPI_Irecv(data.ptr, int(n), mpi_type(data.dtype), peer, tag, comm_, &req), "recv");
    wait(&req, 1, "recv", peer);
    return {};
  }
  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }
  std::string describe() const override { return "mpi world " + std::to_string(size_); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }
  void set_name(const std::string& name) override { name_ = name; }
  std::string call_label(const char* op, uint64_t seq, int peer) const override {
    return label(op, seq, peer);
  }

  // "all_reduce_sum #41 on the data group (ranks 0,2)"; for a receive also the peer.
  std::string label(const char* op, uint64_t seq, int peer) const {
    std::string s = detail::concat(op, " #", seq);
    if (peer >= 0) s += detail::concat(" from rank ", members_[size_t(peer)]);
    if (name_ == "world") return s + " on the world";
    return s + " on the " + (name_.empty() ? std::string("sub") : name_) + " group (ranks " +
           member_list_ + ")";
  }

 private:
  // The world ranks of this group, for messages.
  void describe_members() {
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> local(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) local[size_t(i)] = i;
    members_.assign(size_t(size_), 0);
    MPI_Group_translate_ranks(mine, size_, local.data(), world, members_.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    for (int r : members_) {
      if (!member_list_.empty()) member_list_ += ',';
      member_list_ += std::to_string(r);
    }
  }

  void init_watchdog() {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &g_dog.status), "comm_dup");
    MPI_Comm_set_errhandler(g_dog.status, MPI_ERRORS_RETURN);
    g_dog.rank = rank_;
    g_dog.size = size_;
    struct Id {
      int pid;
      char host[64];
    } me{};
    std::vector<Id> ids(static_cast<size_t>(size_));
    me.pid = int(getpid());
    if (gethostname(me.host, sizeof me.host - 1) != 0) copy_field(me.host, sizeof me.host, "?");
    check(MPI_Allgather(&me, sizeof me, MPI_BYTE, ids.data(), sizeof me, MPI_BYTE, MPI_COMM_WORLD),
          "allgather of pids");
    for (const Id& id : ids) {
      g_dog.pids.push_back(id.pid);
      g_dog.hosts.push_back(std::string(id.host, strnlen(id.host, sizeof id.host)));
    }
  }

  void wait(MPI_Request* reqs, int n, const char* op, int peer = -1);

  struct PendingSend final : CommWork::Pending {
    explicit PendingSend(MpiCommunicator* c) : comm(c) {}
    // Dropped unwaited (an error unwinding): MPI may still read the buffer; the request is let
    // go rather than waited for, which could hang on a peer that is gone.
    ~PendingSend() override {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (req != MPI_REQUEST_NULL && !finalized) MPI_Request_free(&req);
    }
    void wait() override { comm->wait(&req, 1, "wait for a send"); }
    MpiCommunicator* comm;
    MPI_Request req = MPI_REQUEST_NULL;
  };

  MPI_Comm comm_;
  bool owns_mpi_;
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<int> members_;  // world rank of each rank of this group
  std::string member_list_;   // "0,2"
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

StatusReply my_status() {
  StatusReply r{};
  const WatchStep ws = watch_step();
  r.step = ws.step;
  copy_field(r.phase, sizeof r.phase, ws.phase ? ws.phase : "");
  if (g_dog.op) {
    copy_field(r.waiting_in, sizeof r.waiting_in,
               g_dog.comm->label(g_dog.op, g_dog.op_seq, g_dog.peer));
    r.waited_s = seconds_since(g_dog.since);
  } else if (!g_dog.device_label.empty()) {
    copy_field(r.waiting_in, sizeof r.waiting_in, g_dog.device_label);
    r.waited_s = seconds_since(g_dog.device_since);
  }
  return r;
}

// Answers every pending status request. Returns the lowest rank that asked (g_dog.size: none):
// that rank is diagnosing a hang and will end the job, so this one need not report it again.
int answer_status_requests() {
  int lowest = g_dog.size;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kStatusRequestTag, g_dog.status, &flag, &st) != MPI_SUCCESS ||
        !flag)
      return lowest;
    int ignored = 0;
    MPI_Recv(&ignored, 1, MPI_INT, st.MPI_SOURCE, kStatusRequestTag, g_dog.status,
             MPI_STATUS_IGNORE);
    // Small enough to go eagerly: returns at once, whatever the requester does next.
    const StatusReply r = my_status();
    MPI_Send(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, kStatusReplyTag, g_dog.status);
    lowest = std::min(lowest, st.MPI_SOURCE);
  }
}

// While a hang is being reported the job is about to end: a stop signal (mpirun sends SIGTERM
// to every rank as it aborts the job) can no longer become a checkpoint, so the trainer's handler
// must not announce one; the default action just ends the process. Restored if the wait
// completes after all (a slow rank, not a hung one).
struct sigaction g_saved_term, g_saved_usr1;
bool g_stop_signals_off = false;
void stop_honouring_stop_signals() {
  if (g_stop_signals_off) return;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGTERM, &dfl, &g_saved_term);
  sigaction(SIGUSR1, &dfl, &g_saved_usr1);
  g_stop_signals_off = true;
}
void restore_stop_signals() {
  if (!g_stop_signals_off) return;
  sigaction(SIGTERM, &g_saved_term, nullptr);
  sigaction(SIGUSR1, &g_saved_usr1, nullptr);
  g_stop_signals_off = false;
}

// Withdraws the status requests of a report that was not needed: a late answer must not land
// in buffers that are gone.
void withdraw(std::vector<MPI_Request>& recvs, std::vector<MPI_Request>& sends) {
  for (MPI_Request& r : recvs) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  for (MPI_Request& r : sends)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

// Past the deadline of a wait: asks every rank where it is, then reports and ends the job.
// Returns only if the wait completed meanwhile (`completed` says so: the slow rank arrived during
// the grace period): then it was slow, not hung, and training goes on after a warning. `at`:
// where this rank was when the call was made (a device call: the host may have gone on since);
// null: where it is now. `lowest_asker`: the lowest rank known to be reporting already.
void report_hang_or_resume(const std::function<bool()>& completed, double timeout_s,
                           double waited_s, const WatchStep* at, int lowest_asker) {
  const int n = g_dog.size;
  std::vector<StatusReply> replies(static_cast<size_t>(n));
  std::vector<MPI_Request> recvs(size_t(n), MPI_REQUEST_NULL), sends(size_t(n), MPI_REQUEST_NULL);
  static int request = 0;  // the sends may outlive this call (withdraw frees their requests)
  for (int r = 0; r < n; ++r) {
    if (r == g_dog.rank) continue;
    MPI_Irecv(&replies[size_t(r)], sizeof(StatusReply), MPI_BYTE, r, kStatusReplyTag, g_dog.status,
              &recvs[size_t(r)]);
    MPI_Isend(&request, 1, MPI_INT, r, kStatusRequestTag, g_dog.status, &sends[size_t(r)]);
  }
  std::vector<bool> answered(size_t(n), false);
  const auto t0 = Clock::now();
  int missing = n - 1;
  int lowest_reporter = std::min(n, lowest_asker);
  auto resumed = [&] {
    if (!completed()) return false;
    withdraw(recvs, sends);
    char took[64];
    std::snprintf(took, sizeof took, "%.1f s, more than runtime.collective_timeout_s = %g s",
                  seconds_since(g_dog.since), timeout_s);
    log_warn(detail::concat(
        "step ", watch_step().step, " (", watch_step().phase,
        "): ", g_dog.comm->label(g_dog.op, g_dog.op_seq, g_dog.peer), " took ", took,
        ", but completed: going on (raise the timeout if steps are legitimately this slow)"));
    return true;
  };
  while (missing > 0 && seconds_since(t0) < kGraceS) {
    if (resumed()) return;
    for (int r = 0; r < n; ++r) {
      if (r == g_dog.rank || answered[size_t(r)]) continue;
      int flag = 0;
      if (MPI_Test(&recvs[size_t(r)], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        answered[size_t(r)] = true;
        --missing;
      }
    }
    // Another rank may be diagnosing the same hang at the same time.
    lowest_reporter = std::min(lowest_reporter, answer_status_requests());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Of the ranks that timed out together, the lowest reports: one message, not one per rank.
  // The others wait for it to end the job, and report themselves only if it does not.
  if (lowest_reporter < g_dog.rank) {
    const auto t1 = Clock::now();
    while (seconds_since(t1) < 2 * kGraceS + 5) {
      if (resumed()) return;
      answer_status_requests();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (resumed()) return;
  // From here the job ends: a stop signal can no longer become a checkpoint.
  stop_honouring_stop_signals();
  const StatusReply me = my_status();
  RankStatus self;
  self.rank = g_dog.rank;
  self.step = at ? at->step : me.step;
  self.phase = at ? at->phase : me.phase;
  self.waiting_in = me.waiting_in;
  self.waited_s = waited_s;  // when the deadline passed, not after the grace period
  std::vector<RankStatus> others;
  for (int r = 0; r < n; ++r) {
    if (r == g_dog.rank) continue;
    RankStatus s;
    s.rank = r;
    s.answered = answered[size_t(r)];
    s.pid = g_dog.pids[size_t(r)];
    s.host = g_dog.hosts[size_t(r)];
    if (s.answered) {
      const StatusReply& a = replies[size_t(r)];
      s.step = a.step;
      s.phase = std::string(a.phase, strnlen(a.phase, sizeof a.phase));
      s.waiting_in = std::string(a.waiting_in, strnlen(a.waiting_in, sizeof a.waiting_in));
      s.waited_s = a.waited_s;
    }
    others.push_back(std::move(s));
  }
  std::fflush(stdout);
  const std::string msg = hang_message(self, timeout_s, others);
  note_job_cause(msg);
  // Rank 0 prints as main() does; the others carry their rank prefix.
  if (g_dog.rank == 0)
    std::fprintf(stderr, "ft: error: %s\n", msg.c_str());
  else
    log_error(msg);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, int(ExitCode::kHung));
  std::_Exit(int(ExitCode::kHung));  // MPI_Abort does not return; this keeps [[noreturn]] true
}

void MpiCommunicator::wait(MPI_Request* reqs, int n, const char* op, int peer) {
  const uint64_t seq = ++g_dog.seq;
  const CollectiveWatch& w = collective_watch();
  const WatchStep ws = watch_step();
  const double timeout_s = ws.step > 0 && !ws.long_wait ? w.step_timeout_s : w.other_timeout_s;
  if (timeout_s <= 0) {
    check(MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE), op);
    return;
  }
  int done = 0;
  check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), op);
  if (done) return;
  const auto t0 = Clock::now();
  g_dog.op = op;
  g_dog.comm = this;
  g_dog.peer = peer;
  g_dog.op_seq = seq;
  g_dog.since = t0;
  double deadline_s = timeout_s;
  double next_poll_s = 0;
  int sleep_us = 0;
  for (;;) {
    check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), op);
    if (done) break;
    const double waited = seconds_since(t0);
    if (waited >= next_poll_s) {
      // Someone else asked: it reports and ends the job; give it time to, rather than racing
      // it with a second report of the same hang.
      if (answer_status_requests() < g_dog.size) {
        deadline_s = std::max(deadline_s, waited + 2 * kGraceS + 5);
        stop_honouring_stop_signals();
      }
      next_poll_s = waited + 0.001;
    }
    if (waited > deadline_s) {
      const auto completed = [&] {
        int d = 0;
        return MPI_Testall(n, reqs, &d, MPI_STATUSES_IGNORE) == MPI_SUCCESS && d;
      };
      report_hang_or_resume(completed, timeout_s, waited, nullptr, g_dog.size);
      break;  // it returns only once the wait has completed
    }
    if (waited < kSpinS) {
      sched_yield();
    } else {
      sleep_us = std::min(kMaxSleepUs, std::max(20, sleep_us * 2));
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }
  g_dog.op = nullptr;
  restore_stop_signals();
}

}  // namespace

void device_wait_begin(const std::string& label) {
  g_dog.device_label = label;
  g_dog.device_since = Clock::now();
}

void device_wait_end() {
  g_dog.device_label.clear();
  if (g_dog.device_asked_by < g_dog.size) restore_stop_signals();
  g_dog.device_asked_by = 1 << 30;
}

void answer_watchdog_requests() {
  if (g_dog.status == MPI_COMM_NULL) return;  // no MPI world (a group of one)
  const int asker = answer_status_requests();
  if (asker < g_dog.size) {
    // That rank reports the hang and ends the job: a stop signal can no longer save.
    g_dog.device_asked_by = std::min(g_dog.device_asked_by, asker);
    stop_honouring_stop_signals();
  }
}

void report_device_hang(const std::string& label, const WatchStep& at, double waited_s,
                        double timeout_s) {
  if (g_dog.status == MPI_COMM_NULL) {  // a group of one: nobody to ask
    const std::string msg =
        hang_message_unasked({0, false, 0, "", at.step, at.phase, label, waited_s}, timeout_s,
                             "one rank: no other rank to ask (an NCCL or device fault)");
    note_job_cause(msg);
    std::fprintf(stderr, "ft: error: %s\n", msg.c_str());
    std::fflush(stderr);
    std::_Exit(int(ExitCode::kHung));
  }
  device_wait_begin(label);
  g_dog.device_since = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(waited_s));
  // A rank that asked for this one's status meanwhile is reporting the same hang and ends the
  // job: give it time to, as MPI's waits do, rather than print a second report.
  if (g_dog.device_asked_by < g_dog.size) {
    stop_honouring_stop_signals();
    const auto t0 = Clock::now();
    while (seconds_since(t0) < 2 * kGraceS + 5) {
      answer_status_requests();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // The device's communicators are aborted: the call cannot complete any more.
  report_hang_or_resume([] { return false; }, timeout_s, waited_s, &at, g_dog.device_asked_by);
  std::_Exit(int(ExitCode::kHung));  // not reached: it returns only on completion
}

std::unique_ptr<Communicator> init_world_communicator(int* argc, char*** argv) {
  if (!launched_by_mpi()) return make_single_process_communicator();
  return std::make_unique<MpiCommunicator>(argc, argv);
}

}  // namespace ft
