// The step loop. Inside, steps are counted from 0 (s, as in the schedule formulas of DESIGN.md
// §5); everything a person reads numbers them from 1 (DESIGN.md §7): step s + 1 is the (s+1)-th
// optimizer step, after which s + 1 steps are done and step_<s+1> is the checkpoint. Each step s:
//   1. take this rank's samples of global batch s from the loader (prefetched);
//   2. count the trained target tokens of the whole global batch (all-reduced), so that every
//      micro-batch scales its loss gradient by 1/that count: the step's loss is the token-weighted
//      mean over the global batch, not a mean of micro-batch means (DESIGN.md §6);
//   3. forward/backward each micro-batch, gradients accumulating in the flat buffers;
//   4. global gradient norm; one small all-reduce over the world that agrees on a non-finite
//      loss or gradient norm (the run stops there, before anything is changed or saved), on a
//      stop signal (SIGTERM/SIGUSR1 on any rank) and on a time-based save;
//   5. clipping, learning rate for step s, AdamW;
//   6. metrics and progress on rank 0; then a checkpoint when one is due (lib/ckpt/checkpoint.h).
// A run resumes from a checkpoint of any layout: parameters, AdamW moments and step count, the
// schedule (a function of the step) and the loader position (the step) are all restored.
#include "train/trainer.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/log.h"
#include "core/system.h"
#include "data/loader.h"
#include "data/sha256.h"
#include "kernels/kernels.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "parallel/pipeline.h"
#include "parallel/plan.h"
#include "parallel/zero.h"
#include "runtime/device.h"
#include "train/metrics.h"
#include "train/train_state.h"

namespace ft {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

int configure_threads(int threads) {
  int n = threads > 0 ? threads : available_cores();
  // Ranks started on one node by a launcher that did not bind them to cores each see every
  // core: share the cores among them instead of oversubscribing.
  if (threads <= 0) {
    const int local_ranks = local_rank_count();
    if (local_ranks > 1 && n == int(sysconf(_SC_NPROCESSORS_ONLN))) n = std::max(1, n / local_ranks);
  }
  omp_set_num_threads(n);
  kernels::set_blas_threads(n);
  return n;
}

namespace {

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Test support, not a user feature: FT_TEST_<WHAT>_AT_STEP=N[:r] fires at step N (numbered as
// the progress line numbers it, from 1) on world rank r, or on every rank without ":r".
bool test_hook_fires(const char* var, int64_t step, int rank) {
  const char* v = std::getenv(var);
  if (!v) return false;
  const char* colon = std::strchr(v, ':');
  return std::atoll(v) == step && (!colon || std::atoi(colon + 1) == rank);
}

// Refuses a run whose `ft plan` peak does not fit the memory this node has left, before
// anything is allocated: growing into the OS's out-of-memory killer loses the run without a
// word (and a run with n_layers: 1e9 would try). The ranks on one node share its memory.
void check_memory_fits(const Recipe& r, int world, int rank) {
  if (const char* skip = std::getenv("FT_SKIP_MEMORY_CHECK"); skip && std::string(skip) == "1")
    return;
  const uint64_t avail = available_memory_bytes();
  if (avail == 0) return;  // nothing to compare with
  const MemoryPlan plan = plan_memory(r, world);
  const RankPlan& mine = plan.ranks.at(size_t(rank));
  const int local = local_rank_count();
  const double need = double(mine.peak_bytes) * local;
  if (need <= double(avail)) return;
  throw Error(detail::concat(
      "this run needs about ", Progress::human_bytes(double(mine.peak_bytes)), " on rank ", rank,
      local > 1 ? detail::concat(" (x ", local, " ranks on this node = ",
                                 Progress::human_bytes(need), ")")
                : std::string(),
      " by `ft plan` (model ", plan.model_params, " parameters), but only ",
      Progress::human_bytes(double(avail)),
      " of memory is available here; nothing was allocated. Run `ft plan ", r.source_path,
      "` to see where it goes, then use more ranks with parallel.zero_stage 3 or "
      "parallel.tensor/pipeline, training.activation_checkpointing, a smaller "
      "training.micro_batch_size or data.seq_len (FT_SKIP_MEMORY_CHECK=1 starts anyway)"));
}

// Every rank writes its own shard files into checkpoint.dir: find a folder that cannot be
// created or written now, not at the first save after hours of training.
void check_checkpoint_dir_writable(const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(detail::concat("checkpoint.dir '", dir, "' cannot be created on rank ", rank, ": ",
                               ec ? ec.message() : "a file of that name is in the way",
                               "; choose another checkpoint.dir or fix its permissions"));
  }
  const fs::path probe = fs::path(dir) / detail::concat(".ft_write_test.", rank, ".", getpid());
  FILE* f = std::fopen(probe.c_str(), "wb");
  const bool ok = f && std::fputc('x', f) != EOF;
  const int err = errno;
  if (f) std::fclose(f);
  fs::remove(probe, ec);
  if (!ok) {
    throw Error(detail::concat("checkpoint.dir '", dir, "' is not writable on rank ", rank, ": ",
                               std::strerror(err),
                               "; choose another checkpoint.dir or fix its permissions"));
  }
}

// The validation loader: the first training.eval_batches global batches of data.valid, no
// shuffle. Opened before training starts, so a broken validation set is reported up front.
std::unique_ptr<DataLoader> open_eval_loader(const Recipe& r, const std::string& tokenizer_sha) {
  LoaderOptions o;
  o.dir = r.data.valid;
  o.seq_len = r.data.seq_len;
  o.shuffle = false;
  o.seed = r.run.seed;
  o.global_batch = r.training.global_batch_size;
  o.rank_count = o.global_batch;
  o.prefetch = 0;  // evaluation is rare: read on demand, no background thread
  o.expected_vocab = r.model.vocab_size;
  o.expected_tokenizer_sha256 = tokenizer_sha;
  return std::make_unique<DataLoader>(o);
}

// Token-weighted mean loss over the validation batches; every evaluation sees the same tokens.
double evaluate(PipelineSchedule& pipeline, Communicator* pipe_comm, DataLoader& loader,
                const Recipe& r) {
  const int micro = r.training.micro_batch_size;
  const int64_t G = r.training.global_batch_size;
  // Never more than one epoch of the validation set, and at least one batch.
  int64_t batches = std::min<int64_t>(r.training.eval_batches, int64_t(loader.samples_per_epoch()) / G);
  batches = std::max<int64_t>(batches, 1);
  loader.seek(0);
  double loss_sum = 0, tokens = 0;
  for (int64_t i = 0; i < batches; ++i) {
    StepSamples b = loader.next();
    loss_sum += pipeline.eval_batch(b, micro);
    for (uint8_t m : b.mask) tokens += m;
  }
  if (pipe_comm) pipe_comm->all_reduce_sum(&loss_sum, 1);  // the loss is on the last stage
  return tokens > 0 ? loss_sum / tokens : 0.0;
}

// Test support, not a user feature (checkpoints and export come with their own issue): with
// FT_TEST_DUMP_PARAMS=DIR, the ranks of data rank 0 write the parameters they hold after the
// last step to DIR/rank_<world rank>.safetensors — their tensor slices, with metadata saying
// the split of each tensor and the rank's mesh coordinates — so that tests can reassemble the
// whole model of any layout and compare it with a one-process run.
void dump_final_params(const std::string& dir, LlamaModel& model, ZeroSharding& zero,
                       const Mesh& mesh, int world_rank) {
  std::vector<SafetensorsTensorOut> out;
  std::map<std::string, std::string> meta = {{"tensor_rank", std::to_string(mesh.t)},
                                             {"tensor_size", std::to_string(mesh.tensor)},
                                             {"stage", std::to_string(mesh.p)}};
  const auto& groups = model.layout().groups();
  std::vector<int> held;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!model.owns_group(int(g))) continue;
    const float* p = zero.acquire_params(int(g));  // ZeRO-3 gathers: every data rank takes part
    held.push_back(int(g));
    for (const auto& e : groups[g].entries) {
      out.push_back({e.name, DType::kF32, e.shape, p + e.offset});
      meta["split:" + e.name] = e.split == TensorSplit::kRows   ? "rows"
                                : e.split == TensorSplit::kCols ? "cols"
                                                                : "replicated";
    }
  }
  if (mesh.d == 0) {
    fs::create_directories(dir);
    write_safetensors(detail::concat(dir, "/rank_", world_rank, ".safetensors"), out, meta);
  }
  for (int g : held) zero.release_params(g);
}

}  // namespace

TrainSummary train(const Recipe& r, Communicator& comm, const std::string& resume) {
  const bool is_root = comm.rank() == 0;
  const int threads = configure_threads(r.runtime.threads);
  std::unique_ptr<Device> dev = make_device(r.runtime.device);

  const int world = comm.size();
  // The mesh (DESIGN.md §3): data-parallel ranks split the batch, tensor-parallel ranks split
  // each layer and see the same samples.
  Mesh mesh = make_mesh(comm, r.parallel.tensor, r.parallel.pipeline);
  if (comm.size() > 1 && !is_root)
    set_log_prefix(detail::concat("[rank ", comm.rank(), " ", mesh.describe(), "] "));
  Communicator& data_comm = *mesh.data_comm;
  Communicator* tensor_comm = mesh.tensor > 1 ? mesh.tensor_comm.get() : nullptr;
  const int accum = grad_accum_steps(r, world);
  const int micro = r.training.micro_batch_size;
  const int T = r.data.seq_len;
  install_stop_handlers();
  // The collective watchdog (communicator.h): a step's collectives get
  // runtime.collective_timeout_s; start-up and checkpoint saves, where one rank may be busy
  // alone for long (loading a large model, writing its shard), get six times that, at least 1 h.
  {
    const double t = r.runtime.collective_timeout_s;
    set_collective_watch({t, t > 0 ? std::max(3600.0, 6 * t) : 0.0});
    set_watch_step(0, "start-up");
  }
  check_memory_fits(r, world, comm.rank());

  // Which checkpoint to resume from, decided before any work (`--resume never` on a folder
  // that holds checkpoints is refused here).
  const std::vector<std::string> candidates = resume_candidates(r, resume, is_root);
  if (resume == "never" && r.checkpoint.overwrite && ckpt::has_checkpoints(r.checkpoint.dir)) {
    comm.barrier();  // every rank has looked before rank 0 deletes
    if (is_root) {
      log_warn("checkpoint.overwrite: deleting the checkpoints in ", r.checkpoint.dir);
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(r.checkpoint.dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name == "latest" || name.rfind("step_", 0) == 0) fs::remove_all(e.path(), ec);
      }
    }
  }

  // Everything that can be wrong with the inputs is checked before the model is built or any
  // output is written: the tokenizer, every training and validation shard.
  std::string tokenizer_sha;
  if (!r.tokenizer.path.empty()) tokenizer_sha = sha256_file_hex(r.tokenizer.path);
  // Data: this rank's slice of every global batch.
  LoaderOptions lo;
  lo.dir = r.data.train;
  lo.seq_len = T;
  lo.shuffle = r.data.shuffle;
  lo.seed = r.run.seed;
  lo.global_batch = r.training.global_batch_size;
  lo.rank_count = int64_t(micro) * accum;
  lo.rank_offset = int64_t(mesh.d) * lo.rank_count;
  lo.prefetch = r.data.prefetch;
  lo.expected_vocab = r.model.vocab_size;
  lo.expected_tokenizer_sha256 = tokenizer_sha;
  DataLoader loader(lo);
  if (is_root && int64_t(loader.samples_per_epoch()) < r.training.global_batch_size)
    log_warn("data.train has ", loader.samples_per_epoch(), " samples of ", T,
             " tokens, fewer than one global batch (", r.training.global_batch_size,
             "): every step repeats samples");
  const bool do_eval = !r.data.valid.empty() && r.training.eval_every_steps > 0;
  std::unique_ptr<DataLoader> eval_loader;
  if (do_eval) eval_loader = open_eval_loader(r, tokenizer_sha);

  if (is_root) {
    std::error_code ec;
    fs::create_directories(r.run.output_dir, ec);
    if (ec || !fs::is_directory(r.run.output_dir))
      throw Error("cannot create run.output_dir '" + r.run.output_dir + "': " +
                  (ec ? ec.message() : "a file of that name exists") +
                  "; choose another run.output_dir");
    const fs::path saved = fs::path(r.run.output_dir) / "recipe.yaml";
    std::ofstream(saved) << recipe_to_yaml(r);
    if (!fs::exists(saved)) throw Error("cannot write " + saved.string());
  }
  if (r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0)
    check_checkpoint_dir_writable(r.checkpoint.dir, comm.rank());

  // Model and optimizer.
  Communicator* pipe_comm = mesh.pipeline > 1 ? mesh.pipeline_comm.get() : nullptr;
  const StageSpec stage = pipeline_stage(r.model.n_layers, mesh.p, mesh.pipeline);
  LlamaModel model(r.model, dev.get(), r.training.activation_checkpointing, tensor_comm, stage);
  {
    // The whole model is initialised (or loaded) the same way for every layout, then each
    // tensor rank keeps its slices: so every layout starts from the same weights.
    std::unique_ptr<LlamaModel> whole;
    LlamaModel* init = &model;
    if (tensor_comm || pipe_comm) {
      whole = std::make_unique<LlamaModel>(r.model, dev.get());
      init = whole.get();
    }
    if (!r.model.from.empty() && candidates.empty()) {
      if (is_root) log_info("loading weights from ", r.model.from);
      load_hf_weights(r.model.from, init->layout(), init->param_ptrs());
    } else {
      init->init_random(r.run.seed, r.model.init_std);
    }
    if (whole) {
      const std::vector<float*> ptrs = whole->param_ptrs();
      const std::vector<const float*> src(ptrs.begin(), ptrs.end());
      slice_for_tensor_rank(whole->layout(), src, model.layout(), model.param_ptrs(), mesh.t);
    }
  }
  // ZeRO over the data group (lib/parallel/zero.h). Takes over the parameters (stage 3) and
  // gradients (stages 2, 3) from the model.
  ZeroSharding zero(r.parallel.zero_stage, model, data_comm, dev.get(), tensor_comm, pipe_comm);
  // Tied embeddings across stages: the first stage's embedding and the last stage's head are one
  // matrix held twice; their gradients are summed between the two (DESIGN.md §3).
  std::unique_ptr<Communicator> tied_holders;
  if (pipe_comm && r.model.tie_embeddings) {
    const bool holder = mesh.p == 0 || mesh.p == mesh.pipeline - 1;
    const int pairs = mesh.data * mesh.tensor;
    tied_holders = comm.split(holder ? mesh.d * mesh.tensor + mesh.t : pairs + comm.rank(), mesh.p);
    if (holder) zero.share_group(0, tied_holders.get());
  }
  PipelineSchedule pipeline(model, pipe_comm, dev.get());
  AdamW optim(model.layout(), r.optimizer, dev.get(), zero.ranges());
  const size_t params_bytes = zero.params_bytes(), grads_bytes = zero.grads_bytes();

  // Resume: the newest usable candidate. A damaged one (a shard that fails its checksum, a
  // truncated file, a manifest that fails its checks) falls back to the previous complete
  // checkpoint under --resume auto; every rank must load the same one, so they agree after each
  // attempt. Damaged folders fallen back from are set aside (renamed, never deleted: the damage
  // may be temporary, as on a slow file system) once a fallback has loaded; when none loads,
  // nothing is renamed, so that a later attempt finds the folders as they were.
  int64_t start_step = 0;
  int64_t tokens_seen = 0;
  std::string resumed_from;
  std::vector<std::pair<std::string, std::string>> damaged;  // folder, why
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string err;
    std::optional<ckpt::Manifest> m;
    try {
      m = ckpt::read_manifest(candidates[i]);
    } catch (const Error& e) {
      err = e.what();
    }
    if (m) {
      check_same_model(*m, r);  // a usage error on every rank alike, no fallback
      const auto t0 = Clock::now();
      try {
        load_state(*m, model, zero, optim, mesh, r.parallel.zero_stage);
      } catch (const Error& e) {
        err = e.what();
      }
      if (err.empty() && is_root)
        log_info("resumed from ", candidates[i], " (step ", m->step, ", saved by ", m->data, " data x ",
                 m->pipeline, " pipeline x ", m->tensor, " tensor ranks, ZeRO ", m->zero_stage,
                 ") in ", Progress::human_seconds(seconds_since(t0)));
    }
    float bad = err.empty() ? 0.0f : 1.0f;
    comm.all_reduce_max(&bad, 1);
    if (bad == 0.0f) {
      start_step = m->step;
      tokens_seen = m->tokens;
      resumed_from = candidates[i];
      const json d = m->json.value("data", json::object());  // typed by read_manifest
      if (is_root && (d.value("global_batch_size", 0) != r.training.global_batch_size ||
                      d.value("seq_len", 0) != r.data.seq_len ||
                      d.value("seed", uint64_t(0)) != r.run.seed ||
                      d.value("shuffle", true) != r.data.shuffle))
        log_warn("the data settings differ from the checkpoint's (global_batch_size, seq_len, "
                 "run.seed or data.shuffle): the run continues with step ", start_step + 1,
                 " of the new order, not where the saved run would have gone");
      break;
    }
    if (!err.empty()) log_warn("cannot resume from ", candidates[i], ": ", err);
    damaged.emplace_back(candidates[i], err.empty() ? "another rank could not read it" : err);
    if (resume != "auto")
      throw Error("cannot resume from " + candidates[i] +
                  (err.empty() ? std::string(" (another rank could not read it)") : ": " + err));
    if (i + 1 < candidates.size()) {
      if (is_root)
        log_warn("falling back to the previous complete checkpoint, ", candidates[i + 1]);
    } else {
      throw Error("no usable checkpoint in " + r.checkpoint.dir +
                  " (every complete one is damaged, see above); restore the files, or start "
                  "afresh with --resume never checkpoint.overwrite=true");
    }
  }
  if (start_step > 0) loader.seek(start_step);
  if (is_root && !resumed_from.empty())
    for (const auto& [folder, why] : damaged) {
      const std::string aside = ckpt::set_aside_damaged(folder);
      log_warn("set the damaged checkpoint ", folder, " aside as ", aside, " (", why,
               "); nothing in it was deleted: inspect it with `ft inspect`, then remove it");
    }
  // Checkpoint folders past the starting step belong to a timeline this run replaces (one newer
  // than the PATH resumed from, or an interrupted save): this run's saves must not meet them,
  // half-overwritten, under the same names. Only the folder's name decides (a damaged manifest
  // could say anything), and complete folders at or before the starting step always stay.
  if (is_root) {
    std::error_code ec;
    if (fs::is_directory(r.checkpoint.dir, ec))
      for (const auto& e : fs::directory_iterator(r.checkpoint.dir, ec)) {
        const int64_t step = ckpt::parse_step_folder_name(e.path().filename().string());
        if (step < 0) continue;  // not a step folder, or one set aside as damaged
        if (step <= start_step && !(step == start_step && resumed_from.empty())) continue;
        const bool complete = fs::exists(e.path() / "COMPLETE");
        if (complete)
          log_warn("removing ", e.path().string(), ": it is past the step this run starts from (",
                   start_step, ") and would be overwritten by this run's saves");
        fs::remove_all(e.path(), ec);
      }
  }
  comm.barrier();
  const int64_t tokens_at_start = tokens_seen;

  const bool ckpt_on = r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0;
  ckpt::CheckpointWriter::Options wo;
  wo.dir = r.checkpoint.dir;
  wo.rank = comm.rank();
  wo.world = world;
  wo.tensor_rank = mesh.t;
  wo.async = r.checkpoint.async;
  wo.keep_last = r.checkpoint.keep_last;
  wo.tokenizer = r.tokenizer.path;
  {
    uint64_t attempt = is_root ? (uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) ^
                                  (uint64_t(getpid()) << 48))
                               : 0;
    comm.broadcast(&attempt, sizeof attempt, 0);
    wo.attempt = attempt;
  }
  ckpt::CheckpointWriter writer(wo);
  const std::vector<ckpt::PieceSource> pieces = state_pieces(model, zero, optim, mesh);
  if (ckpt_on && r.checkpoint.async) {
    uint64_t bytes = 0;
    for (const auto& p : pieces) bytes += (p.end - p.begin) * sizeof(float);
    writer.reserve(bytes);
  }
  json manifest;
  if (is_root) manifest = manifest_base(r, mesh, tokenizer_sha);

  if (is_root) {
    std::printf("ft: model %.2fM parameters (%d layers, dim %d, %d heads / %d kv heads, vocab %d)\n",
                double(model.num_params()) / 1e6, r.model.n_layers, r.model.dim, r.model.n_heads,
                r.model.n_kv_heads, r.model.vocab_size);
    std::printf("ft: data %s: %llu samples of %d tokens per epoch; %lld steps of %d samples "
                "(%d micro-batches of %d); %s, %d threads, BLAS kernels %s, oneDNN ISA %s\n",
                r.data.train.c_str(), (unsigned long long)loader.samples_per_epoch(), T,
                (long long)r.training.steps, r.training.global_batch_size, accum, micro,
                dev->name().c_str(), threads, kernels::blas_kernel_name(), kernels::gemm_isa());
    std::fflush(stdout);
  }

  MetricsWriter metrics;
  if (is_root) metrics = MetricsWriter(r.logging.metrics, /*append=*/!resumed_from.empty());
  Progress progress(is_root);
  // Close the live bar's line on any exit, so an error message starts on a line of its own.
  struct FinishProgress {
    Progress& p;
    ~FinishProgress() { p.finish(); }
  } finish_progress{progress};

  if (is_root && ckpt_on)
    std::printf("ft: checkpoints to %s: %s%s%s%s, keep %d\n", r.checkpoint.dir.c_str(),
                r.checkpoint.every_steps > 0
                    ? detail::concat("every ", r.checkpoint.every_steps, " steps").c_str()
                    : "",
                r.checkpoint.every_steps > 0 && r.checkpoint.every_minutes > 0 ? " and " : "",
                r.checkpoint.every_minutes > 0
                    ? detail::concat("every ", r.checkpoint.every_minutes, " minutes").c_str()
                    : "",
                r.checkpoint.async ? " (async)" : "", r.checkpoint.keep_last);

  TrainSummary sum;
  sum.resumed_from = resumed_from;
  sum.start_step = start_step;
  const auto t_start = Clock::now();
  auto t_last_save = t_start;
  int64_t last_saved = resumed_from.empty() ? -1 : start_step;
  // Rank 0 reports each commit in the metrics, at `step`: the steps done when it was seen.
  auto report_commit = [&](int64_t step, const ckpt::CheckpointWriter::Committed& c) {
    if (!is_root) return;
    metrics.write({{"step", step},
                   {"ckpt_step", c.step},
                   {"ckpt_bytes", c.bytes},
                   {"ckpt_blocking_s", c.blocking_s},
                   {"ckpt_write_s", c.total_s},
                   {"ckpt_async", r.checkpoint.async}});
    progress.note(detail::concat("checkpoint ", fs::path(c.folder).filename().string(), ": ",
                                 Progress::human_bytes(double(c.bytes)), " in ",
                                 Progress::human_seconds(c.total_s), ", training stalled ",
                                 Progress::human_seconds(c.blocking_s)));
  };
  // A save after `done` steps.
  auto save = [&](int64_t done) {
    if (is_root) {
      manifest["step"] = done;
      manifest["optimizer"]["step"] = optim.step_count();
      manifest["scheduler"]["step"] = done;
      manifest["data"]["next_step"] = done;
      manifest["data"]["tokens"] = tokens_seen;
    }
    writer.save(done, pieces, manifest);
    last_saved = done;
    t_last_save = Clock::now();
    if (auto c = writer.poll()) report_commit(done, *c);
  };
  // Step `step` (numbered from 1) found a non-finite loss or gradient norm before its update: the
  // parameters, the optimizer state and every checkpoint still hold the state after step - 1.
  // Every rank calls this alike (the finding was all-reduced) and throws AgreedError.
  auto stop_nonfinite = [&](int64_t step, double loss, double grad_norm) {
    // Each rank looks at the gradients it holds; the max of the negated indices (a min) names
    // the same tensor on every rank. Floats hold these small indices exactly.
    const int64_t mine = zero.first_nonfinite_grad();
    float first = mine >= 0 ? -float(mine) : -1e30f;
    comm.all_reduce_max(&first, 1);
    // A save in flight holds the state of an earlier step (copied before this step's update
    // could have changed it): let it commit, so it is the last good checkpoint rather than a
    // half-written folder. A failure of that save only changes which checkpoint is the last.
    try {
      writer.wait();
      if (auto c = writer.poll()) report_commit(step - 1, *c);
    } catch (const Error& e) {
      log_warn("the checkpoint save in flight failed: ", e.what());
    }
    // "nan", never the "-nan" that printing a NaN with its sign bit set gives.
    auto name = [](double x) { return std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf"; };
    std::string what;
    if (!std::isfinite(loss)) what = detail::concat("the loss is ", name(loss));
    if (!std::isfinite(grad_norm))
      what += detail::concat(what.empty() ? "" : " and ", "the gradient norm is ", name(grad_norm));
    std::string where = "every gradient element is finite";
    if (first > -1e29f) {
      int64_t index = int64_t(-first);
      for (const auto& g : model.layout().groups()) {
        if (index < int64_t(g.entries.size())) {
          where = "first non-finite gradient: " + g.entries[size_t(index)].name + " in " + g.name;
          break;
        }
        index -= int64_t(g.entries.size());
      }
    } else if (!std::isfinite(grad_norm)) {
      where += ", but the sum of their squares overflows";
    }
    std::string last;
    try {
      last = ckpt::latest_checkpoint(r.checkpoint.dir);
    } catch (const Error&) {
      // a damaged `latest`: say there is none known rather than fail while reporting
    }
    throw AgreedError(detail::concat(
        "step ", step, ": ", what, " (", where, "); nothing was updated or saved at this step; ",
        last.empty()
            ? std::string("no checkpoint of this run to resume from")
            : "the last good checkpoint is " + last + " (the same command resumes from it)",
        "; try a lower optimizer.lr, more scheduler.warmup_steps or training.grad_clip"));
  };
  if (start_step >= r.training.steps && !resumed_from.empty()) {
    if (is_root)
      std::printf("ft: the checkpoint is at step %lld and training.steps is %lld: nothing to "
                  "train (raise training.steps to continue)\n",
                  (long long)start_step, (long long)r.training.steps);
  }
  for (int64_t s = start_step; s < r.training.steps; ++s) {
    const int64_t step = s + 1;  // as people read it: progress, metrics, messages, checkpoints
    const auto t_step = Clock::now();
    set_watch_step(step, "reading the batch");
    StepSamples batch = loader.next();
    // Test support: FT_TEST_FAIL_RANK=r fails world rank r at step 3, to test that the other
    // ranks are stopped rather than left waiting in a collective.
    if (const char* fail_rank = std::getenv("FT_TEST_FAIL_RANK"))
      if (std::atoi(fail_rank) == comm.rank() && step == 3)
        throw Error("injected failure (FT_TEST_FAIL_RANK) at step 3");
    // Test support: FT_TEST_KILL_AT_STEP=N[:r] sends SIGKILL to world rank r (default: every
    // rank) when it begins step N, to test resuming after a crash.
    if (test_hook_fires("FT_TEST_KILL_AT_STEP", step, comm.rank())) {
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    FT_CHECK(batch.step == s, "data loader out of step: got ", batch.step, ", expected ", s);

    double count = 0;
    for (uint8_t m : batch.mask) count += m;
    set_watch_step(step, "counting target tokens");
    data_comm.all_reduce_sum(&count, 1);  // tensor ranks hold the same samples
    const float scale = count > 0 ? float(1.0 / count) : 0.0f;
    if (count == 0 && is_root)
      log_warn("step ", step, ": every target of the global batch is masked out (loss_mask); "
               "the loss is reported as 0 and only weight decay changes the parameters");

    set_watch_step(step, "forward/backward");
    zero.begin_step();
    double loss_sum = pipeline.train_step(batch, micro, scale);
    // Test support: FT_TEST_NAN_LOSS_AT_STEP=N[:r] makes rank r's share of the loss of step N
    // NaN; FT_TEST_NAN_GRAD_AT_STEP=N[:r] writes NaN into the first gradient element rank r
    // holds, before the gradient reductions, as a NaN from its backward would be.
    if (test_hook_fires("FT_TEST_NAN_LOSS_AT_STEP", step, comm.rank()))
      loss_sum = std::numeric_limits<double>::quiet_NaN();
    if (test_hook_fires("FT_TEST_NAN_GRAD_AT_STEP", step, comm.rank()))
      zero.inject_nan_grad_for_test();
    if (pipe_comm) pipe_comm->all_reduce_sum(&loss_sum, 1);  // the loss is on the last stage
    data_comm.all_reduce_sum(&loss_sum, 1);  // the same on every tensor rank
    set_watch_step(step, "gradient reduction");
    zero.finish_backward();
    zero.reduce_shared_groups();
    set_watch_step(step, "grad norm and optimizer");

    // clip_grad_norm_ semantics over every gradient of the model, whichever rank holds it.
    const double grad_norm = std::sqrt(zero.grad_sum_squares());
    const double loss = count > 0 ? loss_sum / count : 0.0;
    const bool last = s + 1 == r.training.steps;
    // One all-reduce over the world before anything is changed: a non-finite loss or gradient
    // norm on any rank (every rank computes both alike, but one agreement makes a stop
    // certain to be collective), any rank's stop signal, and rank 0's clock for
    // checkpoint.every_minutes, so every rank decides alike.
    float flags[3] = {std::isfinite(loss) && std::isfinite(grad_norm) ? 0.0f : 1.0f,
                      stop_signal() != 0 ? 1.0f : 0.0f, 0.0f};
    if (is_root && r.checkpoint.every_minutes > 0 &&
        seconds_since(t_last_save) >= r.checkpoint.every_minutes * 60.0)
      flags[2] = 1.0f;
    comm.all_reduce_max(flags, 3);
    if (flags[0] > 0) stop_nonfinite(step, loss, grad_norm);

    const double clip = r.training.grad_clip > 0 ? r.training.grad_clip / (grad_norm + 1e-6) : 1.0;
    if (clip < 1.0) zero.scale_grads(float(clip));
    const double lr = lr_at_step(r.scheduler, r.optimizer.lr, s, r.training.steps);
    optim.step(zero.param_bases(), zero.grad_bases(), lr);
    zero.finish_update();
    const double step_time = seconds_since(t_step);
    const int64_t step_tokens = int64_t(r.training.global_batch_size) * T;
    tokens_seen += step_tokens;
    sum.final_loss = loss;

    // Steps k, 2k, … of logging.every_steps k, beside the eval lines and checkpoints of those
    // steps; also the first step of this process (quick sign of life) and the last.
    if (is_root && (step % r.logging.every_steps == 0 || s == start_step || last)) {
      const size_t mem_peak = dev->stats().peak_bytes;
      metrics.write({{"step", step},
                     {"loss", loss},
                     {"lr", lr},
                     {"grad_norm", grad_norm},
                     {"tokens", tokens_seen},
                     {"tokens_per_s", double(step_tokens) / step_time},
                     {"step_time_s", step_time},
                     {"mem_peak_bytes", mem_peak},
                     {"mem_params_bytes", params_bytes},
                     {"mem_grads_bytes", grads_bytes},
                     {"mem_optim_bytes", optim.state_bytes()}});
      StepReport rep;
      rep.step = step;
      rep.total_steps = r.training.steps;
      rep.first_step = start_step;
      rep.loss = loss;
      rep.lr = lr;
      rep.grad_norm = grad_norm;
      rep.tokens_per_s = double(tokens_seen - tokens_at_start) / seconds_since(t_start);
      rep.elapsed_s = seconds_since(t_start);
      rep.mem_peak_bytes = mem_peak;
      progress.step(rep);
    }
    if (do_eval && (step % r.training.eval_every_steps == 0 || last)) {
      set_watch_step(step, "evaluation");
      const double eval_loss = evaluate(pipeline, pipe_comm, *eval_loader, r);
      if (is_root) {
        metrics.write({{"step", step}, {"eval_loss", eval_loss}});
        progress.eval(step, eval_loss);
      }
    }

    // Checkpoints and stop signals, as agreed above.
    const bool stop = flags[1] > 0 && !last;
    const bool due =
        ckpt_on && ((r.checkpoint.every_steps > 0 && step % r.checkpoint.every_steps == 0) ||
                    flags[2] > 0 || last);
    if (due || stop) {
      // A save can take one rank much longer than the others (a slow disk, rank 0's manifest):
      // the ranks meet here, under the long allowance, rather than in the next step's first
      // collective under the step timeout.
      set_watch_step(step, "checkpoint save", /*long_wait=*/true);
      save(step);
      // Test support: FT_TEST_SLOW_SAVE=r:seconds makes world rank r's saves that much longer,
      // to test that a slow save does not trip the watchdog.
      if (const char* slow = std::getenv("FT_TEST_SLOW_SAVE"); slow && std::strchr(slow, ':'))
        if (std::atoi(slow) == comm.rank()) {
          const double delay_s = std::atof(std::strchr(slow, ':') + 1);
          std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
        }
      comm.barrier();
    }
    if (auto c = writer.poll()) report_commit(step, *c);
    if (stop) {
      writer.wait();  // this rank's shard durable; on rank 0, the checkpoint committed
      if (auto c = writer.poll()) report_commit(step, *c);
      comm.barrier();  // no rank exits (and has its launcher stop the others) before the commit
      sum.preempted = true;
      sum.steps_done = step;
      if (is_root)
        progress.note(detail::concat("stopped by a signal after step ", step, " of ",
                                     r.training.steps, "; checkpoint ",
                                     ckpt::step_folder_name(step), " saved: exiting with code 75"));
      break;
    }
  }
  set_watch_step(0, "end of run");
  // A run that trained no steps (training.steps 0: a checkpoint of the initial or imported
  // weights) still leaves its checkpoint.
  if (ckpt_on && !sum.preempted && last_saved < 0 && start_step >= r.training.steps)
    save(start_step);
  writer.wait();
  if (auto c = writer.poll()) report_commit(sum.preempted ? sum.steps_done : r.training.steps, *c);
  progress.finish();
  if (const char* dir = std::getenv("FT_TEST_DUMP_PARAMS"))
    dump_final_params(dir, model, zero, mesh, comm.rank());

  sum.steps = sum.preempted ? sum.steps_done - start_step : r.training.steps - start_step;
  if (sum.steps < 0) sum.steps = 0;
  sum.tokens = tokens_seen - tokens_at_start;
  sum.wall_s = seconds_since(t_start);
  sum.tokens_per_s = sum.wall_s > 0 ? double(sum.tokens) / sum.wall_s : 0;
  sum.mem_peak_bytes = dev->stats().peak_bytes;
  sum.peak_rss_bytes = peak_rss_bytes();
  if (is_root) {
    std::printf(
        "ft: %s: %lld step%s, %lld tokens in %s (%.0f tokens/s); final loss %.4f\n"
        "ft: peak memory: %s device allocator, %s process RSS\n"
        "ft: outputs: %s (resolved recipe: %s/recipe.yaml, metrics: %s)\n",
        sum.preempted ? "stopped early" : "done", (long long)sum.steps, sum.steps == 1 ? "" : "s",
        (long long)sum.tokens,
        Progress::human_seconds(sum.wall_s).c_str(),
        sum.tokens_per_s, sum.final_loss, Progress::human_bytes(double(sum.mem_peak_bytes)).c_str(),
        Progress::human_bytes(double(sum.peak_rss_bytes)).c_str(), r.run.output_dir.c_str(),
        r.run.output_dir.c_str(), r.logging.metrics.c_str());
    if (last_saved >= 0)
      std::printf("ft: last checkpoint: %s/%s%s\n", r.checkpoint.dir.c_str(),
                  ckpt::step_folder_name(last_saved).c_str(),
                  sum.preempted ? " (run the same command again to continue)" : "");
    std::fflush(stdout);
  }
  return sum;
}

}  // namespace ft
