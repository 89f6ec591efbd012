// FT_PROFILE=1: the time of every op and device copy, by op family, measured at the one
// dispatch point (runtime/ops.h). A device installs ProfilingOps in front of its ops only when
// the variable is set, so an unprofiled run pays nothing, not even a branch per op. On the CPU
// the host's wall clock around each call is the op's time (its work is done on return); on
// CUDA that would be the launch alone, so each op is bracketed by two timing events on its
// stream and the GPU's elapsed times are added up at the end of each step (resolve_events).
// ft train prints the table on rank 0 at the end of the run (format_profile).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/ops.h"

namespace ft {

// What the table adds up. The families of ops are declared with the ops (op_list.h); those
// that are no op's are declared here: linear_backward's two GEMMs (it names kGemmDx, and the
// profiler times its dW apart, below), the Device's copies and memsets.
enum class OpFamily : int {
#define FT_OP_FAMILY(id, label) id,
#include "runtime/op_list.h"
  kGemmDx,
  kGemmDw,
  kCopyDevice,
  kCopyHost,
  kMemset,
  kCount
};
// The family's label in the table ("GEMM backward dx").
const char* op_family_name(OpFamily f);

// Totals per family. Atomic because the checkpoint writer copies to the host from its own
// thread; only what runs while `recording` is set counts (the trainer sets it around each step,
// so initialisation, evaluation and saving stay out of the figures).
struct OpProfile {
  std::array<std::atomic<int64_t>, size_t(OpFamily::kCount)> ns{}, calls{};
  std::atomic<bool> recording{false};
  double step_seconds = 0;  // wall time of the recorded steps, summed (the trainer's)
  int64_t steps = 0;

  void add(OpFamily f, int64_t nanoseconds) {
    ns[size_t(f)].fetch_add(nanoseconds, std::memory_order_relaxed);
    calls[size_t(f)].fetch_add(1, std::memory_order_relaxed);
  }
  double seconds(OpFamily f) const { return double(ns[size_t(f)].load()) * 1e-9; }
  int64_t count(OpFamily f) const { return calls[size_t(f)].load(); }

  // Set by a device whose ops run asynchronously (CUDA): ops are timed by its events, which
  // stay pending until resolve_events() reads them (the trainer calls it after each step).
  Device* event_device = nullptr;
  struct Timed {
    OpFamily family;
    Event start, end;
  };
  // Takes a pair of timing events (reused across steps), records `start` on s.
  Timed begin_timed(OpFamily f, Stream s);
  void end_timed(Timed t, Stream s);
  // Waits for the pending events and adds their elapsed times; their events go back for reuse.
  void resolve_events();

 private:
  std::mutex mu_;
  std::vector<Timed> pending_;
  std::vector<std::pair<Event, Event>> free_;
};

// Times its own lifetime into `p` as one call of `f`; does nothing when p is null or not
// recording. With a stream and a profile with an event_device: the work queued on the stream
// meanwhile, between two events, instead of the host's time.
class ProfileScope {
 public:
  ProfileScope(OpProfile* p, OpFamily f)
      : p_(p && p->recording.load(std::memory_order_relaxed) ? p : nullptr), f_(f) {
    if (p_) t0_ = std::chrono::steady_clock::now();
  }
  ProfileScope(OpProfile* p, OpFamily f, Stream s) : ProfileScope(p, f) {
    if (p_ && p_->event_device) {
      s_ = s;
      timed_ = p_->begin_timed(f, s);
    }
  }
  ~ProfileScope() {
    if (!p_) return;
    if (p_->event_device)
      p_->end_timed(std::move(timed_), s_);
    else
      p_->add(f_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0_)
                      .count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  OpProfile* p_;
  OpFamily f_;
  std::chrono::steady_clock::time_point t0_;
  Stream s_;
  OpProfile::Timed timed_{};
};

// True when FT_PROFILE is set to anything but "" or "0".
bool profile_requested();

// Ops that time each call to `inner` into its op family of `profile` (while it records) and
// forward it unchanged (forwarding_ops.h). linear_backward with both outputs is forwarded as
// two calls, dx then dW (the contract allows either output null), so the two GEMMs are timed
// apart.
std::unique_ptr<Ops> make_profiling_ops(Ops& inner, OpProfile& profile);

// The table: family, seconds, share of the summed step time, calls; "other" is step time
// outside ops and copies (communication, the loader, host work).
std::string format_profile(const OpProfile& p);

}  // namespace ft
