// The step loop. Each step s:
//   1. take this rank's samples of global batch s from the loader (prefetched);
//   2. count the trained target tokens of the whole global batch (all-reduced), so that every
//      micro-batch scales its loss gradient by 1/that count: the step's loss is the token-weighted
//      mean over the global batch, not a mean of micro-batch means (DESIGN.md §6);
//   3. forward/backward each micro-batch, gradients accumulating in the flat buffers;
//   4. global gradient norm, clipping, learning rate for step s, AdamW;
//   5. metrics and progress on rank 0;
//   6. one small all-reduce over the world that agrees on a stop signal (SIGTERM/SIGUSR1 on any
//      rank) and on a time-based save; then a checkpoint when one is due (lib/ckpt/checkpoint.h).
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
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
    const int local_ranks = local ? std::max(1, std::atoi(local)) : 1;
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
  // truncated file) falls back to the previous complete checkpoint under --resume auto; every
  // rank must load the same one, so they agree after each attempt.
  int64_t start_step = 0;
  int64_t tokens_seen = 0;
  std::string resumed_from;
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
                 ") in ", seconds_since(t0), " s");
    }
    float bad = err.empty() ? 0.0f : 1.0f;
    comm.all_reduce_max(&bad, 1);
    if (bad == 0.0f) {
      start_step = m->step;
      tokens_seen = m->json.at("data").value("tokens", int64_t(0));
      resumed_from = candidates[i];
      const json& d = m->json.at("data");
      if (is_root && (d.value("global_batch_size", 0) != r.training.global_batch_size ||
                      d.value("seq_len", 0) != r.data.seq_len ||
                      d.value("seed", uint64_t(0)) != r.run.seed ||
                      d.value("shuffle", true) != r.data.shuffle))
        log_warn("the data settings differ from the checkpoint's (global_batch_size, seq_len, "
                 "run.seed or data.shuffle): the run continues at step ", start_step,
                 " of the new order, not where the saved run would have gone");
      break;
    }
    if (!err.empty()) log_warn("cannot resume from ", candidates[i], ": ", err);
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
  // Checkpoint folders past the starting step belong to a timeline this run replaces (a damaged
  // one fallen back from, one newer than the PATH resumed from, or an interrupted save): this
  // run's saves must not meet them, half-overwritten, under the same names.
  if (is_root) {
    std::error_code ec;
    if (fs::is_directory(r.checkpoint.dir, ec))
      for (const auto& e : fs::directory_iterator(r.checkpoint.dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("step_", 0) != 0 || name.size() != 13) continue;
        const int64_t step = std::atoll(name.c_str() + 5);
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
                "(%d micro-batches of %d); %s, %d threads, BLAS kernels %s\n",
                r.data.train.c_str(), (unsigned long long)loader.samples_per_epoch(), T,
                (long long)r.training.steps, r.training.global_batch_size, accum, micro,
                dev->name().c_str(), threads, kernels::blas_kernel_name());
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
  // A save of step `done` (steps completed); rank 0 reports each commit in the metrics.
  auto report_commit = [&](int64_t s, const ckpt::CheckpointWriter::Committed& c) {
    if (!is_root) return;
    metrics.write({{"step", s},
                   {"ckpt_step", c.step},
                   {"ckpt_bytes", c.bytes},
                   {"ckpt_blocking_s", c.blocking_s},
                   {"ckpt_write_s", c.total_s},
                   {"ckpt_async", r.checkpoint.async}});
    progress.note(detail::concat("checkpoint ", fs::path(c.folder).filename().string(), ": ",
                                 Progress::human_bytes(double(c.bytes)), " in ",
                                 c.total_s, " s, training stalled ", c.blocking_s, " s"));
  };
  auto save = [&](int64_t done, int64_t s) {
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
    if (auto c = writer.poll()) report_commit(s, *c);
  };
  if (start_step >= r.training.steps && !resumed_from.empty()) {
    if (is_root)
      std::printf("ft: the checkpoint is at step %lld and training.steps is %lld: nothing to "
                  "train (raise training.steps to continue)\n",
                  (long long)start_step, (long long)r.training.steps);
  }
  for (int64_t s = start_step; s < r.training.steps; ++s) {
    const auto t_step = Clock::now();
    set_watch_step(s + 1, "reading the batch");
    StepSamples batch = loader.next();
    // Test support: FT_TEST_FAIL_RANK=r fails world rank r at step 2, to test that the other
    // ranks are stopped rather than left waiting in a collective.
    if (const char* fail_rank = std::getenv("FT_TEST_FAIL_RANK"))
      if (std::atoi(fail_rank) == comm.rank() && s == 2)
        throw Error("injected failure (FT_TEST_FAIL_RANK) at step 2");
    // Test support: FT_TEST_KILL_AT_STEP=s[:r] sends SIGKILL to world rank r (default: every
    // rank) when it begins step s, to test resuming after a crash.
    if (const char* kill_at = std::getenv("FT_TEST_KILL_AT_STEP")) {
      const char* colon = std::strchr(kill_at, ':');
      if (std::atoll(kill_at) == s && (!colon || std::atoi(colon + 1) == comm.rank())) {
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
    }
    FT_CHECK(batch.step == s, "data loader out of step: got ", batch.step, ", expected ", s);

    double count = 0;
    for (uint8_t m : batch.mask) count += m;
    set_watch_step(s + 1, "counting target tokens");
    data_comm.all_reduce_sum(&count, 1);  // tensor ranks hold the same samples
    const float scale = count > 0 ? float(1.0 / count) : 0.0f;
    if (count == 0 && is_root)
      log_warn("step ", s, ": every target of the global batch is masked out (loss_mask); the "
               "loss is reported as 0 and only weight decay changes the parameters");

    set_watch_step(s + 1, "forward/backward");
    zero.begin_step();
    double loss_sum = pipeline.train_step(batch, micro, scale);
    if (pipe_comm) pipe_comm->all_reduce_sum(&loss_sum, 1);  // the loss is on the last stage
    data_comm.all_reduce_sum(&loss_sum, 1);  // the same on every tensor rank
    set_watch_step(s + 1, "gradient reduction");
    zero.finish_backward();
    zero.reduce_shared_groups();
    set_watch_step(s + 1, "grad norm and optimizer");

    // clip_grad_norm_ semantics over every gradient of the model, whichever rank holds it.
    const double grad_norm = std::sqrt(zero.grad_sum_squares());
    const double clip = r.training.grad_clip > 0 ? r.training.grad_clip / (grad_norm + 1e-6) : 1.0;
    if (clip < 1.0) zero.scale_grads(float(clip));
    const double lr = lr_at_step(r.scheduler, r.optimizer.lr, s, r.training.steps);
    optim.step(zero.param_bases(), zero.grad_bases(), lr);
    zero.finish_update();
    const double loss = count > 0 ? loss_sum / count : 0.0;
    const double step_time = seconds_since(t_step);
    const int64_t step_tokens = int64_t(r.training.global_batch_size) * T;
    tokens_seen += step_tokens;
    sum.final_loss = loss;
    if (!std::isfinite(loss))
      throw Error(detail::concat("loss is ", loss, " at step ", s,
                                 "; try a lower optimizer.lr, more warmup, or grad_clip"));

    const bool last = s + 1 == r.training.steps;
    if (is_root && (s % r.logging.every_steps == 0 || last)) {
      const size_t mem_peak = dev->stats().peak_bytes;
      metrics.write({{"step", s},
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
      rep.step = s;
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
    if (do_eval && ((s + 1) % r.training.eval_every_steps == 0 || last)) {
      set_watch_step(s + 1, "evaluation");
      const double eval_loss = evaluate(pipeline, pipe_comm, *eval_loader, r);
      if (is_root) {
        metrics.write({{"step", s}, {"eval_loss", eval_loss}});
        progress.eval(s, eval_loss);
      }
    }

    // Checkpoints and stop signals. One all-reduce over the world: any rank's stop signal, and
    // rank 0's clock for checkpoint.every_minutes, so every rank decides alike.
    const int64_t done = s + 1;
    set_watch_step(s + 1, "stop and checkpoint flags");
    float flags[2] = {stop_signal() != 0 ? 1.0f : 0.0f, 0.0f};
    if (is_root && r.checkpoint.every_minutes > 0 &&
        seconds_since(t_last_save) >= r.checkpoint.every_minutes * 60.0)
      flags[1] = 1.0f;
    comm.all_reduce_max(flags, 2);
    const bool stop = flags[0] > 0 && !last;
    const bool due = ckpt_on && ((r.checkpoint.every_steps > 0 && done % r.checkpoint.every_steps == 0) ||
                                 flags[1] > 0 || last);
    if (due || stop) {
      // A save can take one rank much longer than the others (a slow disk, rank 0's manifest):
      // the ranks meet here, under the long allowance, rather than in the next step's first
      // collective under the step timeout.
      set_watch_step(s + 1, "checkpoint save", /*long_wait=*/true);
      save(done, s);
      // Test support: FT_TEST_SLOW_SAVE=r:seconds makes world rank r's saves that much longer,
      // to test that a slow save does not trip the watchdog.
      if (const char* slow = std::getenv("FT_TEST_SLOW_SAVE"); slow && std::strchr(slow, ':'))
        if (std::atoi(slow) == comm.rank()) {
          const double delay_s = std::atof(std::strchr(slow, ':') + 1);
          std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
        }
      comm.barrier();
    }
    if (auto c = writer.poll()) report_commit(s, *c);
    if (stop) {
      writer.wait();  // this rank's shard durable; on rank 0, the checkpoint committed
      if (auto c = writer.poll()) report_commit(s, *c);
      comm.barrier();  // no rank exits (and has its launcher stop the others) before the commit
      sum.preempted = true;
      sum.steps_done = done;
      if (is_root)
        progress.note(detail::concat("stopped by a signal after step ", done, " of ",
                                     r.training.steps, "; checkpoint ",
                                     ckpt::step_folder_name(done), " saved: exiting with code 75"));
      break;
    }
  }
  set_watch_step(0, "end of run");
  // A run that trained no steps (training.steps 0: a checkpoint of the initial or imported
  // weights) still leaves its checkpoint.
  if (ckpt_on && !sum.preempted && last_saved < 0 && start_step >= r.training.steps)
    save(start_step, std::max<int64_t>(0, start_step - 1));
  writer.wait();
  if (auto c = writer.poll()) report_commit(r.training.steps - 1, *c);
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
        "ft: %s: %lld steps, %lld tokens in %s (%.0f tokens/s); final loss %.4f\n"
        "ft: peak memory: %s device allocator, %s process RSS\n"
        "ft: outputs: %s (resolved recipe: %s/recipe.yaml, metrics: %s)\n",
        sum.preempted ? "stopped early" : "done", (long long)sum.steps, (long long)sum.tokens, Progress::human_duration(sum.wall_s).c_str(),
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
