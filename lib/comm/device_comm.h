// Communicators that run on the device: NCCL between GPUs (lib/comm/nccl_communicator.cpp, in a
// library of its own, ft_nccl, that an executable links and registers as it registers its CUDA
// backend: `ft` the real NCCL, loaded on first use; the test tool `ft_emu` the emulated NCCL of
// tests/cuda_emu/nccl_emu.cpp). ft_lib itself names no NCCL symbol.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "runtime/device.h"

namespace ft {

// The collective watchdog's CUDA events (DESIGN §4): one per call made, recorded after it,
// reused once its call has completed.
struct NcclWatchdogEvents {
  uint64_t created = 0;  // events created, this process
  size_t watched = 0;    // calls watched now (made, not yet seen complete)
};
struct NcclBackend {
  // Empty when NCCL can serve `dev`'s memory, else why not (not a CUDA device; the library
  // does not load; its version is outside the range DESIGN §3 names).
  std::string (*unusable_reason)(Device& dev);
  // The world's NCCL communicator on `dev`, bootstrapped over `world` (MPI: rank 0's
  // ncclUniqueId broadcast to the others); collective over the world. Its split() makes the
  // mesh's groups by ncclCommSplit. Throws ft::Error naming the NCCL call that failed.
  std::unique_ptr<Communicator> (*make_world)(Communicator& world, Device& dev);
  // "nccl 2.28.9" once loaded, else "nccl".
  std::string (*description)();
  NcclWatchdogEvents (*watchdog_events)();
};
void register_nccl_backend(const NcclBackend* backend);
// The ranks of a device communicator agreeing on a decision they must take alike
// (LlamaModel::train_micro_batch's graph recordings): all_ok(ok) says whether `ok` holds on every
// rank (a collective: every rank calls it at the same point), a max all-reduce of a failure flag,
// waited for by the host. The flag (one float of device memory) is made with the agreement, where
// the caller decides that its ranks will agree, so that ft plan counts it where a run makes it.
// Without a communicator (nothing to agree with) all_ok(ok) is ok.
class RankAgreement {
 public:
  RankAgreement() = default;
  RankAgreement(Device& dev, Communicator& comm) : comm_(&comm), flag_(&dev, 1) {}
  bool all_ok(bool ok);

 private:
  Communicator* comm_ = nullptr;
  Buffer<float> flag_;
};
const NcclBackend* nccl_backend();  // null when the executable links none
// Defined by ft_nccl (or ft_nccl_emu), for main to register.
const NcclBackend& this_nccl_backend();

// The collective watchdog's side for device communicators (DESIGN §4), defined with the MPI
// communicator (NCCL bootstraps over MPI, so a build with NCCL has it). Main thread only (MPI is
// initialised FUNNELED).
// While the host waits on device communication: what it waits in, for the other ranks' status
// requests (the label as Communicator::call_label makes it).
void device_wait_begin(const std::string& label);
void device_wait_end();
// Answers the other ranks' status requests; call every millisecond or so while waiting.
void answer_watchdog_requests();
// A device call made at `at` has made no progress for `waited_s` (past `timeout_s`) and the
// device's communicators are aborted: asks every rank where it is, prints the watchdog's message
// (comm/hang_report.h) and ends the job with exit code 3, as the MPI communicator's watchdog.
[[noreturn]] void report_device_hang(const std::string& label, const WatchStep& at, double waited_s,
                                     double timeout_s);

// runtime.communicator (DESIGN §5): "mpi" never uses NCCL; "nccl" must (a UsageError saying why
// it cannot: device_world_refusal); "auto" uses it when the world has more than one rank, the
// device is a GPU and NCCL is usable. Returns the NCCL world, or null for host staging over MPI.
// Why make_device_world would refuse `choice` on `dev` ("" when it would not), without making
// anything: ft validate's and ft train's start-up check (train/preflight.h).
std::string device_world_refusal(const std::string& choice, Device& dev);
// Whether make_device_world makes an NCCL world for `world_size` ranks (else host staging):
// "nccl" where usable (any world), "auto" where usable and world_size > 1.
bool device_world_uses_nccl(const std::string& choice, int world_size, Device& dev);
std::unique_ptr<Communicator> make_device_world(const std::string& choice, Communicator& world,
                                                Device& dev);

}  // namespace ft
