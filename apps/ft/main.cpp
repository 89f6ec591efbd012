// ft's entry point. The one part that differs between ft and the test tool ft_emu
// (tests/cuda_emu/): the backends each registers. The command line is cli.cpp's, compiled once
// for both.
#include "apps/ft/commands.h"
#include "data/shard.h"
#if FT_CUDA_BACKEND
#include "runtime/cuda/cuda_device.h"
#include "runtime/device.h"
#endif
#if FT_NCCL_BACKEND
#include "comm/device_comm.h"
#endif

int main(int argc, char** argv) {
  ft::run_shard_check_if_child(argc, argv);  // a shard check child of ft (lib/data/shard.h)
  ft::app::prepare_thread_environment(argv);
#if FT_CUDA_BACKEND
  // ft_cuda_backend (the GPU) or, in the test tool ft_emu, ft_cuda_backend_emu: the same
  // sources built against the CUDA emulation (tests/cuda_emu/).
  ft::register_cuda_backend(&ft::this_cuda_backend());
#endif
#if FT_NCCL_BACKEND
  // ft_nccl (libnccl, opened on first use) or, in ft_emu, ft_nccl_emu (the emulated NCCL).
  ft::register_nccl_backend(&ft::this_nccl_backend());
#endif
  return ft::app::run_command_line(argc, argv);
}
