#include "comm/device_comm.h"

#include "core/error.h"

namespace ft {

namespace {
const NcclBackend* g_nccl = nullptr;
}

void register_nccl_backend(const NcclBackend* backend) { g_nccl = backend; }
const NcclBackend* nccl_backend() { return g_nccl; }

std::unique_ptr<Communicator> make_device_world(const std::string& choice, Communicator& world,
                                                Device& dev) {
  if (choice == "mpi") return nullptr;
  std::string why;
  if (dev.kind() != DeviceKind::kCuda)
    why = "the device is " + dev.name() + ", not a GPU";
  else if (!g_nccl)
    why = "this build of ft has no NCCL (configure with FT_NCCL=ON where nccl.h is installed)";
  else
    why = g_nccl->unusable_reason(dev);
  if (choice == "nccl") {
    if (!why.empty())
      throw Error("runtime.communicator: nccl: " + why +
                  " (hint: runtime.communicator: auto falls back to MPI)");
  } else if (choice != "auto") {
    throw Error("runtime.communicator: unknown value '" + choice + "' (auto, nccl or mpi)");
  } else if (!why.empty() || world.size() == 1) {
    return nullptr;
  }
  return g_nccl->make_world(world, dev);
}

}  // namespace ft
