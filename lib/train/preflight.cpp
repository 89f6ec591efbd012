// ft train's start-up checks, shared with ft validate (preflight.h).
#include "train/preflight.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint.h"
#include "comm/device_comm.h"
#include "core/log.h"
#include "core/system.h"
#include "data/sha256.h"
#include "data/tokenizer.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/run_lock.h"
#include "train/setup.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace ft {
namespace fs = std::filesystem;

void refuse_together(Communicator& comm, const Refusal& mine) {
  Refusal first = mine;
  int first_rank = mine.refused() ? comm.rank() : -1;
  if (comm.size() > 1) {
    // The lowest refusing rank: the largest (size - rank) among those that refuse.
    float key = mine.refused() ? float(comm.size() - comm.rank()) : 0.0f;
    comm.all_reduce_max(&key, 1);
    if (key == 0.0f) return;
    first_rank = comm.size() - int(key);
    int64_t head[2] = {int64_t(first.message.size()), int64_t(first.code)};
    comm.broadcast_bytes(head, sizeof head, first_rank);
    first.message.resize(size_t(head[0]));
    first.code = ExitCode(head[1]);
    if (head[0] > 0) comm.broadcast_bytes(first.message.data(), size_t(head[0]), first_rank);
  }
  if (first_rank < 0) return;
  throw AgreedError(
      first_rank == 0 ? first.message : detail::concat("rank ", first_rank, ": ", first.message),
      first.code);
}

// data.pack needs attention that masks each document (runtime/op_list.h); on CUDA only the
// fused kernel does, for bf16/fp16 at head dim 64 or 128. The device each rank made says whether
// its attention can (its path, FT_CUDA_ATTENTION included): refused here, before any data or
// weights are read, not by the first step's attention op. The recipe check refuses the shapes it
// can tell from the recipe alone.
void check_packing_device(const Recipe& r, Device& dev) {
  if (!r.data.pack) return;
  const int D = head_dim_of(r.model);
  const std::string why = dev.ops().attention_segments_refusal(compute_dtype_of(r), D);
  if (why.empty()) return;
  throw UsageError(detail::concat(
      r.source_path, ": data.pack: true on ", dev.name(), " (runtime.device: ", r.runtime.device,
      "): ", why, "; the recipe has training.precision ", r.training.precision, " and ",
      head_dim_keys(r.model),
      " (hint: training.precision: bf16 or fp16 with a head dim of 64 or 128, and "
      "FT_CUDA_ATTENTION unset or fused; or runtime.device: cpu; or data.pack: false)"));
}

namespace {

// What lowers this rank's host memory, from its largest counted uses (pinned and pageable).
std::string host_hints(const RankPlan& p) {
  std::vector<std::pair<int64_t, std::string>> uses;
  for (int c = 0; c < int(MemoryCategory::kCount); ++c) {
    const auto cat = MemoryCategory(c);
    if (p.host_pinned_by[size_t(c)] > 0)
      uses.push_back({p.host_pinned_by[size_t(c)], host_memory_hint(cat, HostMemory::kPinned)});
    if (p.host_pageable_by[size_t(c)] > 0)
      uses.push_back({p.host_pageable_by[size_t(c)], host_memory_hint(cat, HostMemory::kPageable)});
  }
  std::sort(uses.begin(), uses.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string h;
  for (const auto& [bytes, hint] : uses)
    if (h.find(hint) == std::string::npos) h += (h.empty() ? "" : "; ") + hint;
  return h;
}

// The host memory of a GPU run's rank (pinned and pageable, ft plan's host figures): the ranks
// of the node share the host, so this rank's need × local_ranks against the memory available.
// Page-locked memory cannot be paged out: the pinned part must fit whole. Refused only on what
// is certain (MemAvailable, the cgroup's limit); the locked-memory limit, which the CUDA driver
// may or may not apply to cudaMallocHost, is a warning.
void check_host_memory_fits(const Recipe& r, int rank, int local_ranks, const RankPlan& p) {
  const double avail = double(available_memory_bytes());
  const double need = double(p.host_peak_bytes) * local_ranks;
  if (avail > 0 && need > avail) {
    // Each kind the rank uses, and what holds it.
    std::string held;
    if (p.host_pinned.bytes > 0)
      held = "page-locked " + Progress::human_bytes(double(p.host_pinned.bytes)) + ": " +
             describe_host_memory(p.host_pinned_by, HostMemory::kPinned);
    if (p.host_pageable.bytes > 0)
      held += (held.empty() ? "" : "; ") + std::string("pageable ") +
              Progress::human_bytes(double(p.host_pageable.bytes)) + ": " +
              describe_host_memory(p.host_pageable_by, HostMemory::kPageable);
    throw Error(detail::concat(
        "this run needs about ", Progress::human_bytes(double(p.host_peak_bytes)),
        " of host memory on rank ", rank, " (", held, ")",
        local_ranks > 1 ? detail::concat(" x ", local_ranks,
                                         " ranks on this node = ", Progress::human_bytes(need))
                        : std::string(),
        " by `ft plan`, but only ", Progress::human_bytes(avail),
        " of memory is available here; nothing was allocated. Lower it: ", host_hints(p),
        " (`ft plan ", r.source_path,
        " runtime.device=cuda` shows host_bytes per rank; FT_SKIP_MEMORY_CHECK=1 starts anyway)"));
  }
  static bool warned = false;  // once per process (ft validate checks every rank's)
  rlimit lock{};
  if (!warned && p.host_pinned.bytes > 0 && ::getrlimit(RLIMIT_MEMLOCK, &lock) == 0 &&
      lock.rlim_cur != RLIM_INFINITY &&
      double(p.host_pinned.bytes) * local_ranks > double(lock.rlim_cur)) {
    warned = true;
    log_warn("this run page-locks about ", Progress::human_bytes(double(p.host_pinned.bytes)),
             " of host memory on rank ", rank,
             local_ranks > 1 ? detail::concat(" (x ", local_ranks, " ranks on this node)")
                             : std::string(),
             " (", describe_host_memory(p.host_pinned_by, HostMemory::kPinned),
             "), above this process's locked-memory limit (ulimit -l: ",
             Progress::human_bytes(double(lock.rlim_cur)),
             "); if pinning fails, raise it (ulimit -l unlimited, or memlock in "
             "/etc/security/limits.conf or the container's settings) or lower it: ",
             host_hints(p));
  }
}

}  // namespace

// Refuses a run whose `ft plan` peak does not fit the memory this rank has, before anything is
// allocated: growing into the OS's out-of-memory killer (or a GPU's out-of-memory error) loses the
// run without a word, and a run with n_layers: 1e5 would try. On the CPU the ranks on one node
// share its memory, and the plan's host memory (a checkpoint's staging, model.from's read
// buffer) comes out of it too: the most of both live at once is compared. On a GPU (one per
// rank, gpu_choice.h) the comparison is with what the driver says is free on it now, plus what
// the device's allocator already holds (the cuBLASLt workspace, which the plan counts too);
// ranks sharing one GPU are not summed; then the host memory the plan counts, against the
// host's (check_host_memory_fits). A bound that needs no counting comes first (plan.h
// state_lower_bound_bytes), so that a model far too large is refused at once.
void check_memory_fits(const Recipe& r, int world, int rank, int local_ranks, Device& dev) {
  if (const char* skip = std::getenv("FT_SKIP_MEMORY_CHECK"); skip && std::string(skip) == "1")
    return;
  const bool gpu = dev.kind() == DeviceKind::kCuda;
  double avail = 0, total = 0;
  int local = 1;
  if (gpu) {
    const Device::MemoryInfo info = dev.memory_info();
    avail = double(info.free_bytes) + double(dev.stats().reserved_bytes);
    total = double(info.total_bytes);
  } else {
    avail = double(available_memory_bytes());
    local = local_ranks;
  }
  if (avail == 0) return;  // nothing to compare with
  int64_t need = state_lower_bound_bytes(r, world, rank);
  const bool bound = double(need) * local > avail;
  // The plan counts for an sm_90 GPU (the larger cuBLASLt workspace): at most 28 MiB above what
  // an older GPU needs.
  std::optional<RankPlan> plan;
  if (!bound) {
    plan = plan_rank(
        r, world, rank,
        gpu ? PlanDevice{.cuda = true, .sm = 90, .why = "the GPU memory check"} : PlanDevice{});
    need = gpu ? plan->peak_bytes : plan->host_need_bytes;
  }
  if (double(need) * local <= avail) {
    if (gpu) check_host_memory_fits(r, rank, local_ranks, *plan);
    return;
  }
  const std::string where =
      gpu ? detail::concat(Progress::human_bytes(avail), " of ", Progress::human_bytes(total),
                           " is free on ", dev.name())
          : Progress::human_bytes(avail) + " of memory is available here";
  throw Error(detail::concat(
      "this run needs ", bound ? "at least " : "about ", Progress::human_bytes(double(need)),
      " on rank ", rank,
      local > 1 ? detail::concat(" (x ", local, " ranks on this node = ",
                                 Progress::human_bytes(double(need) * local), ")")
                : std::string(),
      " by `ft plan`", bound ? " (its parameters, gradients and AdamW moments alone)" : "",
      " for a model of ", model_param_count(r.model), " parameters, but only ", where,
      "; nothing was allocated. Run `ft plan ", r.source_path, gpu ? " runtime.device=cuda" : "",
      "` to see where it goes, then use more ", gpu ? "GPUs" : "ranks",
      " with parallel.zero_stage 3 or parallel.tensor/pipeline, "
      "training.activation_checkpointing, a smaller training.micro_batch_size or data.seq_len",
      !gpu && plan && plan->host_peak_bytes > 0
          ? detail::concat("; of it, host buffers beside the device's memory: ",
                           Progress::human_bytes(double(plan->host_peak_bytes)), " (",
                           host_hints(*plan), ")")
          : std::string(),
      " (FT_SKIP_MEMORY_CHECK=1 starts anyway)"));
}

void check_same_device_settings(Communicator& comm, Device& dev) {
  if (comm.size() == 1 || dev.kind() != DeviceKind::kCuda) return;  // graphs: CUDA only
  const int mine = (dev.graphs_enabled() ? 1 : 0) | (dev.profile() ? 2 : 0);
  float hi = float(mine), lo = -float(mine);  // the largest and the smallest, by one max each
  comm.all_reduce_max(&hi, 1);
  comm.all_reduce_max(&lo, 1);
  if (hi == -lo) return;
  const int differ = int(hi) ^ int(-lo);
  throw AgreedError(
      detail::concat((differ & 1) ? "FT_CUDA_GRAPHS" : "", (differ & 3) == 3 ? " and " : "",
                     (differ & 2) ? "FT_PROFILE" : "", (differ & 3) == 3 ? " are" : " is",
                     " set differently on the ranks (rank ", comm.rank(), ": graphs ",
                     dev.graphs_enabled() ? "on" : "off", ", profile ",
                     dev.profile() ? "on" : "off",
                     "); start every rank with the same environment (mpirun -x VAR; srun passes "
                     "the caller's), since the ranks agree on their graph recordings together"),
      ExitCode::kUsage);
}

void check_device_world(const Recipe& r, Device& dev, int world) {
  if (const std::string why = device_world_refusal(r.runtime.communicator, dev); !why.empty())
    throw UsageError(why);
  const int data = data_parallel_size(r, world);
  if (r.parallel.reduce_dtype != "fp32" && data > 1 &&
      !device_world_uses_nccl(r.runtime.communicator, world, dev))
    throw UsageError(
        "parallel.reduce_dtype: " + r.parallel.reduce_dtype +
        " sums gradients through NCCL between GPUs, and this run exchanges them over MPI (" +
        dev.name() + ", runtime.communicator: " + r.runtime.communicator +
        "), which sums fp32 only (hint: parallel.reduce_dtype: fp32)");
}

namespace {

[[noreturn]] void cannot_create(const std::string& key, const std::string& dir, int rank,
                                const std::string& why) {
  throw Error(detail::concat(key, " ", dir, " cannot be created", rank > 0 ? " on rank " : "",
                             rank > 0 ? std::to_string(rank) : "", ": ", why, "; choose another ",
                             key, " or fix its permissions"));
}

[[noreturn]] void not_writable(const std::string& key, const std::string& dir, int rank,
                               const std::string& why) {
  throw Error(detail::concat(key, " ", dir, " is not writable", rank > 0 ? " on rank " : "",
                             rank > 0 ? std::to_string(rank) : "", ": ", why, "; choose another ",
                             key, " or fix its permissions"));
}

// Creates `dir` and writes a probe file into it (every rank writes its own shard files into
// checkpoint.dir: find a folder that cannot be created or written now, not at the first save
// after hours of training).
void make_writable_folder(const std::string& key, const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    cannot_create(key, dir, rank, ec ? ec.message() : std::strerror(EEXIST));
  const fs::path probe = fs::path(dir) / detail::concat(".ft_write_test.", rank, ".", getpid());
  FILE* f = std::fopen(probe.c_str(), "wb");
  const bool ok = f && std::fputc('x', f) != EOF;
  const int err = errno;
  if (f) std::fclose(f);
  fs::remove(probe, ec);
  if (!ok) not_writable(key, dir, rank, std::strerror(err));
}

// What make_writable_folder would find, from what exists: the folder, or the nearest existing
// folder above it, must be a writable folder.
void predict_writable_folder(const std::string& key, const std::string& dir, int rank) {
  fs::path p = fs::absolute(dir);
  std::error_code ec;
  const bool exists = fs::exists(p, ec);
  if (exists && !fs::is_directory(p, ec)) cannot_create(key, dir, rank, std::strerror(EEXIST));
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  if (!fs::is_directory(p, ec)) cannot_create(key, dir, rank, std::strerror(ENOTDIR));
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    const std::string why = std::strerror(errno);
    if (exists) not_writable(key, dir, rank, why);
    cannot_create(key, dir, rank, why);
  }
}

}  // namespace

void check_run_folders_writable(const Recipe& r, int rank, bool create) {
  const bool saves = r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0;
  auto check = [&](const std::string& key, const std::string& dir) {
    if (create)
      make_writable_folder(key, dir, rank);
    else
      predict_writable_folder(key, dir, rank);
  };
  if (rank == 0) check("run.output_dir", r.run.output_dir);
  if (saves) check("checkpoint.dir", r.checkpoint.dir);
  if (rank == 0 && !r.logging.tensorboard.empty())
    check("logging.tensorboard", r.logging.tensorboard);
}

std::vector<std::string> checked_resume_candidates(const Recipe& r, const std::string& resume,
                                                   bool is_root) {
  std::vector<std::string> c = resume_candidates(r, resume, is_root);
  if (c.empty()) return c;
  // A usage error on every rank alike, and no reason to fall back: the newest checkpoint
  // describes another model than the recipe. (A damaged one is ft train's to fall back from.)
  std::optional<ckpt::Manifest> m;
  try {
    m = ckpt::read_manifest(c.front());
  } catch (const Error&) {
  }
  if (m) check_same_model(*m, r);
  return c;
}

std::string tokenizer_sha_of(const Recipe& r) {
  if (r.tokenizer.path.empty()) return "";
  return sha256_file_hex(resolve_tokenizer_file(r.tokenizer.path));
}

// This rank's slice of every global batch (its data rank's accum micro-batches; tensor and
// pipeline ranks of one data rank read the same samples).
LoaderOptions train_loader_options(const Recipe& r, int data_rank, int accum,
                                   const std::string& tokenizer_sha) {
  LoaderOptions lo;
  lo.dir = r.data.train;
  lo.seq_len = r.data.seq_len;
  lo.shuffle = r.data.shuffle;
  lo.seed = r.run.seed;
  lo.global_batch = r.training.global_batch_size;
  lo.rank_count = int64_t(r.training.micro_batch_size) * accum;
  lo.rank_offset = int64_t(data_rank) * lo.rank_count;
  lo.prefetch = r.data.prefetch;
  lo.pack = r.data.pack;
  lo.pack_split = r.data.pack_overflow == "split";
  lo.preference = r.training.objective == "dpo";
  lo.expected_vocab = r.model.vocab_size;
  lo.expected_tokenizer_sha256 = tokenizer_sha;
  return lo;
}

// The validation loader: the first training.eval_batches global batches of data.valid, no
// shuffle. Opened before training starts, so a broken validation set is reported up front.
LoaderOptions eval_loader_options(const Recipe& r, const std::string& tokenizer_sha) {
  LoaderOptions o;
  o.dir = r.data.valid;
  o.seq_len = r.data.seq_len;
  o.shuffle = false;
  o.seed = r.run.seed;
  o.global_batch = r.training.global_batch_size;
  o.rank_count = o.global_batch;
  o.prefetch = 0;  // evaluation is rare: read on demand, no background thread
  o.pack = r.data.pack;
  o.pack_split = r.data.pack_overflow == "split";
  o.preference = r.training.objective == "dpo";
  o.expected_vocab = r.model.vocab_size;
  o.expected_tokenizer_sha256 = tokenizer_sha;
  return o;
}

std::vector<Refusal> preflight_refusals(const Recipe& r, const PreflightOptions& o) {
  std::vector<Refusal> out;
  auto note = [&](const Refusal& x) {
    if (x.refused()) out.push_back(x);
  };
  // In ft train's order (trainer.cpp train()).
  if (const std::string busy = run_folders_in_use(r); !busy.empty())
    out.push_back({busy, ExitCode::kUsage});
  std::unique_ptr<Device> dev;
  note(refusal_of([&] {
    dev = make_device(r.runtime.device, DeviceOptions{.allow_tf32 = r.runtime.tf32, .quiet = true});
  }));
  if (dev) {
    note(refusal_of([&] {
      check_packing_device(r, *dev);
      check_device_world(r, *dev, o.world);
    }));
    // Every rank's plan (ranks of one role plan alike; a large world takes a moment).
    Refusal memory;
    for (int rank = 0; rank < o.world && !memory.refused(); ++rank)
      memory = refusal_of([&] { check_memory_fits(r, o.world, rank, o.local_ranks, *dev); });
    note(memory);
  }
  note(refusal_of([&] { checked_resume_candidates(r, o.resume, /*is_root=*/false); }));
  note(refusal_of([&] {
    const std::string sha = tokenizer_sha_of(r);
    DataLoader train_loader(train_loader_options(r, 0, grad_accum_steps(r, o.world), sha));
    if (!r.data.valid.empty() && r.training.eval_every_steps > 0)
      DataLoader eval_loader(eval_loader_options(r, sha));
  }));
  note(refusal_of([&] { check_run_folders_writable(r, 0, /*create=*/false); }));
  return out;
}

}  // namespace ft
