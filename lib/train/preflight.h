// ft train's start-up checks beyond the recipe's own (lib/recipe): what this machine, the run's
// folders, its checkpoints and its data say about a valid recipe, before any weights are read or
// anything is allocated (DESIGN.md §4 "ft validate = ft train").
//
// ft train runs each check at its start-up on every rank and the ranks agree on the outcome
// before any of them stops (refuse_together), so the job ends with one message from rank 0 and
// the refusal's exit code, not with an MPI abort. ft validate runs the same functions for the
// world it is given (`--world N`, `--nproc N`: every rank's memory, the layout's communicator)
// and prints every refusal: both refuse alike, in the same words (ctest cli_test_validate_train
// runs each case through both). What only ft train reads, the weights of model.from and of the
// checkpoint it resumes from (their headers, sizes and checksums aside), is not read by ft
// validate.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "data/loader.h"
#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

// A check's outcome: empty, or the message and exit code ft train would stop with.
struct Refusal {
  std::string message;
  ExitCode code = ExitCode::kOk;
  bool refused() const { return !message.empty(); }
};

// Runs `f`, turning an ft::Error it throws into a Refusal.
template <typename F>
Refusal refusal_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.what(), e.code()};
  }
  return {};
}

// Collective over `comm`: when any rank refused, every rank throws AgreedError with the message
// and code of the lowest such rank (its number named when it is not rank 0). So a check that
// one rank fails (its GPU's memory) ends every rank alike.
void refuse_together(Communicator& comm, const Refusal& mine);

// The checks, each throwing ft::Error (UsageError for bad input: exit 2) with ft train's message.
// data.pack on a device whose attention cannot mask documents (CUDA: not bf16/fp16 at head dim
// 64 or 128, or FT_CUDA_ATTENTION not fused).
void check_packing_device(const Recipe& r, Device& dev);
// The run's `ft plan` peak against the memory this rank has (the CPU's shared by `local_ranks`
// ranks of the node, device and host memory at once; a GPU's free memory, then the plan's host
// memory against the host's, shared by the node's ranks). A page-locked figure above the
// locked-memory limit is a warning. FT_SKIP_MEMORY_CHECK=1 skips it.
void check_memory_fits(const Recipe& r, int world, int rank, int local_ranks, Device& dev);
// runtime.communicator and parallel.reduce_dtype against the device and the layout of `world`
// ranks: nccl where NCCL cannot serve the device; bf16 reductions over MPI.
void check_device_world(const Recipe& r, Device& dev, int world);
// Collective over `comm`: the settings each process reads from its environment that decide
// collectives ranks must make alike (FT_CUDA_GRAPHS: the micro-batch graphs' recordings are
// agreed on by all-reduces; FT_PROFILE turns graphs off) are the same on every rank of a CUDA
// world; else every rank throws AgreedError (exit 2) naming them.
void check_same_device_settings(Communicator& comm, Device& dev);
// run.output_dir and logging.tensorboard (rank 0's) and, when the run saves, checkpoint.dir:
// creatable and writable. create: make them and write a probe file (ft train); false: predict
// that from the folders that exist (ft validate, which creates nothing).
void check_run_folders_writable(const Recipe& r, int rank, bool create);
// The checkpoint `--resume` would start from (newest first, as ft train tries them), refusing
// `--resume never` on a folder with checkpoints (unless checkpoint.overwrite) and a PATH that
// is none; the newest candidate's manifest must describe the recipe's model.
std::vector<std::string> checked_resume_candidates(const Recipe& r, const std::string& resume,
                                                   bool is_root);

// The SHA-256 of the tokenizer file tokenizer.path names ("" without one).
std::string tokenizer_sha_of(const Recipe& r);
// This rank's slice of every global batch of data.train (`rank_offset`, `rank_count`), and the
// validation loader's (every rank reads the whole global batch).
LoaderOptions train_loader_options(const Recipe& r, int data_rank, int accum,
                                   const std::string& tokenizer_sha);
LoaderOptions eval_loader_options(const Recipe& r, const std::string& tokenizer_sha);

struct PreflightOptions {
  int world = 1;        // ranks of the job
  int local_ranks = 1;  // of them on this node (sharing its memory)
  std::string resume = "auto";
};

// ft validate: every refusal ft train's start-up would make for a job of `o.world` ranks on
// this machine, in ft train's order, creating and deleting nothing.
std::vector<Refusal> preflight_refusals(const Recipe& r, const PreflightOptions& o);

}  // namespace ft
