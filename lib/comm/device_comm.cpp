#include "comm/device_comm.h"

#include "core/error.h"

namespace ft {

namespace {
const NcclBackend* g_nccl = nullptr;
}

void register_nccl_backend(const NcclBackend* backend) { g_nccl = backend; }
const NcclBackend* nccl_backend() { return g_nccl; }

bool RankAgreement::all_ok(bool ok) {
  if (!comm_) return ok;
  const float failed = ok ? 0.0f : 1.0f;
  flag_.upload(&failed, 1);
  comm_->all_reduce(flag_.device()->stream(), Ref(flag_.data()), 1, ReduceOp::kMax).wait();
  float any = 0.0f;
  flag_.download(&any, 1);
  return any == 0.0f;
}

namespace {

// Why NCCL cannot serve `dev` ("" when it can).
std::string nccl_unusable_reason(Device& dev) {
  if (dev.kind() != DeviceKind::kCuda) return "the device is " + dev.name() + ", not a GPU";
  if (!g_nccl)
    return "this build of ft has no NCCL (configure with FT_NCCL=ON where nccl.h is installed)";
  return g_nccl->unusable_reason(dev);
}

}  // namespace

std::string device_world_refusal(const std::string& choice, Device& dev) {
  if (choice == "mpi" || choice == "auto") return "";
  if (choice != "nccl")
    return "runtime.communicator: unknown value '" + choice + "' (auto, nccl or mpi)";
  const std::string why = nccl_unusable_reason(dev);
  if (why.empty()) return "";
  return "runtime.communicator: nccl: " + why +
         " (hint: runtime.communicator: auto falls back to MPI)";
}

bool device_world_uses_nccl(const std::string& choice, int world_size, Device& dev) {
  // "nccl" insists, even over one rank (what tests of NCCL itself run); "auto" takes NCCL only
  // between ranks.
  if (choice == "mpi" || (choice == "auto" && world_size == 1)) return false;
  return nccl_unusable_reason(dev).empty();
}

std::unique_ptr<Communicator> make_device_world(const std::string& choice, Communicator& world,
                                                Device& dev) {
  if (const std::string refusal = device_world_refusal(choice, dev); !refusal.empty())
    throw UsageError(refusal);
  if (!device_world_uses_nccl(choice, world.size(), dev)) return nullptr;
  return g_nccl->make_world(world, dev);
}

}  // namespace ft
