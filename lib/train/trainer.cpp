// The run around the steps (one step: lib/train/step.h). train() reads as its three parts:
//   setup: threads, device and mesh; the checkpoint to resume from; the inputs (tokenizer,
//     training and validation shards), all checked before anything is built or written; the
//     model (initialised or loaded the same way for every layout, then sliced), ZeRO, the
//     pipeline schedule and AdamW; then the resumed state, if any;
//   the loop: one TrainStep per step, then its bookkeeping: metrics and progress (rank 0), an
//     evaluation when due, a checkpoint when due (every_steps, every_minutes, the last step, a
//     stop signal), the stop after a signal's save (exit 75), the stop of a non-finite step;
//   the end: a checkpoint of a run that trained no steps, the last save committed, the summary.
// Inside, steps are counted from 0 (s, as in the schedule formulas of DESIGN.md §5); everything
// a person reads numbers them from 1 (DESIGN.md §7): step s + 1 is the (s+1)-th optimizer step,
// after which s + 1 steps are done and step_<s+1> is the checkpoint.
// A run resumes from a checkpoint of any layout: parameters, AdamW moments and step count, the
// schedule (a function of the step) and the loader position (the step) are all restored.
// When a checkpoint is due and how it is saved: checkpoint_policy.cpp; where the run starts (the
// checkpoint resumed from, the folders cleared): resume.cpp; what they share: trainer_internal.h.
#include "train/trainer.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "comm/device_comm.h"
#include "comm/host_staging.h"
#include "core/error.h"
#include "core/log.h"
#include "core/system.h"
#include "data/loader.h"
#include "data/sha256.h"
#include "kernels/kernels.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
#include "runtime/device.h"
#include "runtime/profile.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/preflight.h"
#include "train/run_lock.h"
#include "train/setup.h"
#include "train/step.h"
#include "train/throughput.h"
#include "train/train_state.h"
#include "train/trainer_internal.h"
#include "train/untrained_tokens.h"

namespace ft {
namespace fs = std::filesystem;
using train_detail::Checkpoints;
using train_detail::delete_for_overwrite;
using train_detail::print_checkpoint_plan;
using train_detail::remove_steps_past;
using train_detail::resume_state;
using train_detail::ResumePoint;
using train_detail::RunLog;

int configure_threads(int threads) {
  int n = threads > 0 ? threads : available_cores();
  // Ranks started on one node by a launcher that did not bind them to cores each see every
  // core: share the cores among them instead of oversubscribing.
  if (threads <= 0) {
    const int local_ranks = local_rank_count();
    if (local_ranks > 1 && n == int(sysconf(_SC_NPROCESSORS_ONLN)))
      n = std::max(1, n / local_ranks);
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

// Token-weighted mean loss over the validation batches; every evaluation sees the same tokens.
// DPO: the mean over the pairs, and the DPO figures in *stats.
double evaluate(PipelineSchedule& pipeline, Communicator* pipe_comm, DataLoader& loader,
                const Recipe& r, DpoRun* dpo, DpoStats* stats) {
  const int micro = dpo ? dpo->micro_rows() : r.training.micro_batch_size;
  const int64_t G = r.training.global_batch_size;
  // Never more than one epoch of the validation set, and at least one batch.
  int64_t batches =
      std::min<int64_t>(r.training.eval_batches, int64_t(loader.samples_per_epoch()) / G);
  batches = std::max<int64_t>(batches, 1);
  loader.seek(0);
  double loss_sum = 0, tokens = 0;
  for (int64_t i = 0; i < batches; ++i) {
    StepSamples b = loader.next();
    if (dpo) dpo->prepare(b, /*valid=*/true);
    loss_sum += pipeline.eval_batch(b, micro);
    for (uint8_t m : b.mask) tokens += m;
  }
  if (pipe_comm) pipe_comm->all_reduce_sum(&loss_sum, 1);  // the loss is on the last stage
  if (dpo) {
    // Every data rank evaluates the same batches (eval_loader_options): rank 0's figures are
    // everyone's, so only the pipeline's sum is taken.
    *stats = dpo->objective().take_stats();
    if (pipe_comm) pipe_comm->all_reduce_sum(stats->data(), DpoStats::kFields);
    return stats->pairs > 0 ? stats->loss / stats->pairs : 0.0;
  }
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
  // The parameters the model computes with (the compute dtype's copy), copied to the host.
  const DType t = model.compute_dtype();
  std::vector<std::vector<char>> host(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!model.flat_params().owns(int(g))) continue;
    const CRef p = zero.acquire_params(int(g));  // ZeRO-3 gathers: every data rank takes part
    held.push_back(int(g));
    host[g].resize(groups[g].numel * dtype_size(t));
    model.device()->copy_to_host(host[g].data(), p.ptr, host[g].size());
    for (const auto& e : groups[g].entries) {
      out.push_back({e.name, t, e.shape, host[g].data() + e.offset * dtype_size(t)});
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

// ---- Setup ----

// The collective watchdog (communicator.h): a step's collectives get
// runtime.collective_timeout_s; start-up and checkpoint saves, where one rank may be busy
// alone for long (loading a large model, writing its shard), get six times that, at least 1 h.
void start_collective_watch(const Recipe& r) {
  const double t = r.runtime.collective_timeout_s;
  set_collective_watch({t, t > 0 ? std::max(3600.0, 6 * t) : 0.0});
  set_watch_step(0, "start-up");
}

// run.output_dir with the resolved recipe in it (rank 0), and a checkpoint.dir that every rank
// can write when the run saves.
void prepare_outputs(const Recipe& r, int rank) {
  check_run_folders_writable(r, rank, /*create=*/true);
  if (rank != 0) return;
  const fs::path saved = fs::path(r.run.output_dir) / "recipe.yaml";
  std::ofstream(saved) << recipe_to_yaml(r);
  if (!fs::exists(saved))
    throw Error("run.output_dir " + r.run.output_dir + ": cannot write " + saved.string() +
                "; choose another run.output_dir or fix its permissions");
}

// Tied embeddings across stages: the first stage's embedding and the last stage's head are one
// matrix held twice; their gradients are summed between the two (DESIGN.md §3). Every rank takes
// part in the split and keeps what it returns for the run; on the two holders it is their group.
// comm: the world the group is split from (MPI's, or NCCL's on GPUs, whose groups take device
// memory as they are).
std::unique_ptr<Communicator> tied_holders_group(const Recipe& r, Communicator& comm,
                                                 const Mesh& mesh, Device& dev, bool nccl) {
  if (mesh.pipeline == 1 || !r.model.tie_embeddings) return nullptr;
  const bool holder = mesh.p == 0 || mesh.p == mesh.pipeline - 1;
  const int pairs = mesh.data * mesh.tensor;
  std::unique_ptr<Communicator> holders =
      comm.split(holder ? mesh.d * mesh.tensor + mesh.t : pairs + comm.rank(), mesh.p);
  // The holders sum gradients in device memory (comm/host_staging.h).
  if (holder && !nccl && !dev.host_accessible())
    holders = std::make_unique<HostStagedCommunicator>(std::move(holders), dev);
  return holders;
}

void print_run_header(const Recipe& r, const LlamaModel& model, const DataLoader& loader, int accum,
                      const Device& dev, int threads) {
  // Elements of the whole model: every rank's layout lists every tensor, with its whole shape.
  size_t base = 0, trained = 0;  // the model's elements; those that train (an adapter's too)
  for (const ParamGroup& g : model.layout().groups())
    for (const ParamEntry& e : g.entries) {
      size_t n = 1;
      for (int64_t d : e.global_shape) n *= size_t(d);
      if (g.attached_to < 0) base += n;
      if (g.trains()) trained += n;
    }
  std::printf("ft: model %.2fM parameters (%d layers, dim %d, %d heads / %d kv heads, vocab %d)\n",
              double(base) / 1e6, r.model.n_layers, r.model.dim, r.model.n_heads,
              r.model.n_kv_heads, r.model.vocab_size);
  if (r.adapter.enabled()) {
    std::string targets, whole;
    for (const std::string& t : r.adapter.targets()) targets += (targets.empty() ? "" : ", ") + t;
    for (const std::string& m : r.adapter.modules_to_save) whole += (whole.empty() ? "" : ", ") + m;
    if (!whole.empty())
      whole = ", and " + whole + " trained whole" +
              (r.model.tie_embeddings ? " (tied: the one shared table)" : "");
    std::printf(
        "ft: adapter %s r %d, alpha %g (scale %g%s) on %s%s: %.4gM trained parameters, the "
        "%sbase frozen%s%s\n",
        r.adapter.type.c_str(), r.adapter.r, r.adapter.alpha, r.adapter.scaling(),
        r.adapter.use_rslora ? ", rsLoRA" : "", targets.c_str(), whole.c_str(),
        double(trained) / 1e6, whole.empty() ? "" : "rest of the ",
        r.adapter.type == "qlora" ? " (its blocks' matrices in NF4)" : "",
        r.adapter.from.empty() ? "" : (", starting from " + r.adapter.from).c_str());
  }
  // Where the CPU's linear layers run in a 16-bit precision (kernels.h gemm16_path).
  std::string gemm16;
  if (dev.kind() == DeviceKind::kCpu && r.training.precision != "fp32")
    gemm16 = kernels::gemm16_path(r.training.precision == "bf16");
  // DPO: a sample is a preference pair, two rows of seq_len tokens.
  const char* sample = loader.preference() ? "pairs" : "samples";
  std::printf(
      "ft: data %s: %llu %s%s of %d tokens per epoch; %lld steps of %d %s "
      "(%d micro-batches of %d); %s, %d threads, CPU kernels %s, BLAS kernels %s, "
      "oneDNN ISA %s%s%s\n",
      r.data.train.c_str(), (unsigned long long)loader.samples_per_epoch(), sample,
      loader.preference() ? " (two rows each)" : "", r.data.seq_len, (long long)r.training.steps,
      r.training.global_batch_size, sample, accum, r.training.micro_batch_size, dev.name().c_str(),
      threads, kernels::cpu_isa_name(kernels::cpu_isa()), kernels::blas_kernel_name(),
      kernels::gemm_isa(), gemm16.empty() ? "" : ", 16-bit GEMMs ", gemm16.c_str());
  if (const PreferenceStats* p = loader.preference())
    std::printf(
        "ft: dpo: %llu preference pairs (a sample is a pair, two rows), %llu with a "
        "completion cut to data.seq_len, %llu left out (the prompt fills it)\n",
        (unsigned long long)p->kept(), (unsigned long long)p->cut, (unsigned long long)p->dropped);
  if (const PackingStats* p = loader.packing())
    std::printf(
        "ft: data.pack: %llu documents in %llu pieces, %.2f%% of the window positions filled\n",
        (unsigned long long)p->documents, (unsigned long long)p->pieces, 100.0 * p->efficiency());
  std::fflush(stdout);
}

}  // namespace

// ---- The loop's bookkeeping ----

namespace train_detail {

RunLog::RunLog(const Recipe& r, bool is_root, const ResumePoint& at)
    : r_(r), is_root_(is_root), progress_(is_root), start_(at), t_start_(Clock::now()) {
  if (is_root) metrics_ = MetricsWriter(r.logging.metrics, /*append=*/!at.folder.empty());
  if (is_root && !r.logging.tensorboard.empty())
    tensorboard_ = TensorBoardWriter(r.logging.tensorboard, at.step + 1);
}

void RunLog::write(const nlohmann::json& line) {
  metrics_.write(line);
  tensorboard_.write(line);
}

bool RunLog::step_due(int64_t step) const {
  return step % r_.logging.every_steps == 0 || step == start_.step + 1 || step == r_.training.steps;
}

void RunLog::step(const StepResult& res, const RunFigures& figures, double first_step_s) {
  if (!is_root_) return;
  nlohmann::json line = step_metrics_line(res, figures);
  if (first_step_s >= 0) line["time_to_first_step_s"] = first_step_s;
  write(line);
  StepReport rep;
  rep.step = res.step;
  rep.total_steps = r_.training.steps;
  rep.first_step = start_.step;
  rep.loss = res.loss;
  rep.lr = res.lr;
  rep.grad_norm = res.grad_norm;
  rep.tokens_per_s = double(figures.tokens_seen - start_.tokens) / elapsed_s();
  rep.elapsed_s = elapsed_s();
  rep.mem_peak_bytes = figures.mem_peak_bytes;
  rep.tflops = res.model_flops / std::max(1, figures.devices) / res.time_s / 1e12;
  if (figures.peak_flops > 0) rep.mfu = rep.tflops * 1e12 / figures.peak_flops;
  if (figures.gpu.own_known) rep.gpu_util = figures.gpu.util_percent;
  if (res.dpo.pairs > 0) {
    rep.dpo = true;
    rep.reward_margin = (res.dpo.rewards_chosen - res.dpo.rewards_rejected) / res.dpo.pairs;
    rep.reward_accuracy = res.dpo.correct / res.dpo.pairs;
  }
  progress_.step(rep);
}

void RunLog::eval(int64_t step, double eval_loss, const DpoStats* dpo) {
  if (!is_root_) return;
  nlohmann::json line = {{"step", step}, {"eval_loss", eval_loss}};
  if (dpo) dpo->add_metrics(line, "eval_");
  write(line);
  progress_.eval(step, eval_loss);
}

void RunLog::commit(int64_t step, const ckpt::CheckpointWriter::Committed& c) {
  if (!is_root_) return;
  write({{"step", step},
         {"ckpt_step", c.step},
         {"ckpt_bytes", c.bytes},
         {"ckpt_blocking_s", c.blocking_s},
         {"ckpt_write_s", c.total_s},
         {"ckpt_async", r_.checkpoint.async}});
  progress_.note(detail::concat("checkpoint ", fs::path(c.folder).filename().string(), ": ",
                                Progress::human_bytes(double(c.bytes)), " in ",
                                Progress::human_seconds(c.total_s), ", training stalled ",
                                Progress::human_seconds(c.blocking_s)));
}

void RunLog::note(const std::string& line) {
  if (is_root_) progress_.note(line);
}

}  // namespace train_detail

namespace {

// Test support: FT_TEST_FAIL_RANK=r fails world rank r at step 3, to test that the other ranks
// are stopped rather than left waiting in a collective; FT_TEST_KILL_AT_STEP=N[:r] sends
// SIGKILL to world rank r (default: every rank) when it begins step N, to test resuming after
// a crash, once its save in flight is durable (an asynchronous save of an earlier step may
// otherwise still be writing on a loaded host, and which checkpoint the resume finds would
// depend on the timing). FT_TEST_STEP_SLEEP_MS=M sleeps M ms before each step, so that a run the
// tests keep training in the background (a folder's lock holder, a signal's target) leaves the CPU
// to the processes they check on a 2-core host.
void crash_test_hooks(int64_t step, int rank, Checkpoints& ckpts) {
  if (const char* ms = std::getenv("FT_TEST_STEP_SLEEP_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  if (const char* fail_rank = std::getenv("FT_TEST_FAIL_RANK"))
    if (std::atoi(fail_rank) == rank && step == 3)
      throw Error("injected failure (FT_TEST_FAIL_RANK) at step 3");
  if (test_hook_fires("FT_TEST_KILL_AT_STEP", step, rank)) {
    ckpts.wait(step - 1);
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
}

// Step res.step found a non-finite loss or gradient norm before its update: the parameters, the
// optimizer state and every checkpoint still hold the state after the step before. Every rank
// calls this alike (the finding was agreed) and throws AgreedError.
[[noreturn]] void stop_nonfinite(const Recipe& r, TrainStep& train_step, const StepResult& res,
                                 Checkpoints& ckpts) {
  // fp16: the loss scaler gave up (its reason says why); otherwise name what is not finite.
  const std::string why =
      res.scaler_stop.empty() ? train_step.describe_nonfinite(res) : res.scaler_stop;
  // A save in flight holds the state of an earlier step (copied before this step's update
  // could have changed it): let it commit, so it is the last good checkpoint rather than a
  // half-written folder. A failure of that save only changes which checkpoint is the last.
  try {
    ckpts.wait(res.step - 1);
  } catch (const Error& e) {
    log_warn("the checkpoint save in flight failed: ", e.what());
  }
  std::string last;
  try {
    last = ckpt::latest_checkpoint(r.checkpoint.dir);
  } catch (const Error&) {
    // a damaged `latest`: say there is none known rather than fail while reporting
  }
  throw AgreedError(detail::concat(
      "step ", res.step, ": ", why, "; nothing was updated or saved at this step; ",
      last.empty() ? std::string("no checkpoint of this run to resume from")
                   : "the last good checkpoint is " + last + " (the same command resumes from it)",
      res.scaler_stop.empty()  // the scaler's reason has its own hint
          ? "; try a lower optimizer.lr, more scheduler.warmup_steps or training.grad_clip"
          : ""));
}

// "final loss L" of the last step; of an earlier one when the last steps had every target
// masked (their loss 0 says nothing), or none.
std::string final_loss_words(const TrainSummary& sum) {
  const int64_t last = sum.start_step + sum.steps;
  if (sum.steps == 0) return "no step trained";
  if (sum.final_loss_step < 0) return "no final loss (every step's targets were masked out)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "final loss %.4f", sum.final_loss);
  if (sum.final_loss_step == last) return buf;
  return detail::concat(buf, " (step ", sum.final_loss_step,
                        "; the steps after it had every target masked out or were skipped)");
}

void print_summary(const Recipe& r, const TrainSummary& sum, int64_t last_saved) {
  std::printf(
      "ft: %s: %lld step%s, %lld tokens in %s (%.0f tokens/s); %s\n"
      "ft: peak memory: %s device allocator, %s process RSS\n"
      "ft: outputs: %s (resolved recipe: %s/recipe.yaml, metrics: %s)\n",
      sum.preempted ? "stopped early" : "done", (long long)sum.steps, sum.steps == 1 ? "" : "s",
      (long long)sum.tokens, Progress::human_seconds(sum.wall_s).c_str(), sum.tokens_per_s,
      final_loss_words(sum).c_str(), Progress::human_bytes(double(sum.mem_peak_bytes)).c_str(),
      Progress::human_bytes(double(sum.peak_rss_bytes)).c_str(), r.run.output_dir.c_str(),
      r.run.output_dir.c_str(), r.logging.metrics.c_str());
  if (sum.time_to_first_step_s >= 0)
    std::printf(
        "ft: first step began %s after the process started (setup, parameter init, "
        "input checks)\n",
        Progress::human_seconds(sum.time_to_first_step_s).c_str());
  if (last_saved >= 0)
    std::printf("ft: last checkpoint: %s/%s%s\n", r.checkpoint.dir.c_str(),
                ckpt::step_folder_name(last_saved).c_str(),
                sum.preempted ? " (run the same command again to continue)" : "");
  std::fflush(stdout);
}

}  // namespace

TrainSummary train(const Recipe& r, Communicator& comm, const std::string& resume) {
  const bool is_root = comm.rank() == 0;
  install_stop_handlers(comm.rank());
  // One job per run, before any work (run_lock.h): a second job on these folders is refused here.
  RunLock run_lock = lock_run_folders(r, comm);
  // Test support: FT_TEST_SIGNAL_AT_STARTUP=INT|TERM raises that signal here, once the handlers
  // are in place, to test a stop asked for before the first step.
  if (const char* sig = std::getenv("FT_TEST_SIGNAL_AT_STARTUP"))
    std::raise(std::string(sig) == "TERM" ? SIGTERM : SIGINT);
  const int threads = configure_threads(r.runtime.threads);
  // The start-up checks (preflight.h, which ft validate runs too), each agreed by every rank
  // before any stops: one message, the refusal's exit code, no abort.
  std::unique_ptr<Device> dev;
  refuse_together(comm, refusal_of([&] {
                    DeviceOptions o{.allow_tf32 = r.runtime.tf32};
                    if (r.runtime.gemm_algos == "measure") {
                      // Each rank times its own GEMMs and keeps its choices (DESIGN §8).
                      char file[32];
                      std::snprintf(file, sizeof file, "/gemm_algos/rank_%05d.txt", comm.rank());
                      o.measure_gemm_algos = true;
                      o.gemm_algos_record = r.run.output_dir + file;
                    }
                    dev = make_device(r.runtime.device, o);
                  }));
  refuse_together(comm, refusal_of([&] {
                    check_packing_device(r, *dev);
                    check_device_world(r, *dev, comm.size());
                  }));
  check_same_device_settings(comm, *dev);

  // The mesh (DESIGN.md §3): data-parallel ranks split the batch, tensor-parallel ranks split
  // each layer and see the same samples.
  Mesh mesh = make_mesh(comm, r.parallel.tensor, r.parallel.pipeline);
  if (comm.size() > 1 && !is_root)
    set_log_prefix(detail::concat("[rank ", comm.rank(), " ", mesh.describe(), "] "));
  Communicator& data_comm = *mesh.data_comm;
  Communicator* tensor_comm = mesh.tensor > 1 ? mesh.tensor_comm.get() : nullptr;
  Communicator* pipe_comm = mesh.pipeline > 1 ? mesh.pipeline_comm.get() : nullptr;
  const int accum = grad_accum_steps(r, comm.size());
  start_collective_watch(r);
  refuse_together(comm, refusal_of([&] {
                    check_memory_fits(r, comm.size(), comm.rank(), local_rank_count(), *dev);
                  }));
  std::vector<std::string> candidates;
  refuse_together(comm,
                  refusal_of([&] { candidates = checked_resume_candidates(r, resume, is_root); }));
  delete_for_overwrite(r, comm, resume);

  // Everything that can be wrong with the inputs is checked before the model is built or any
  // output is written: the tokenizer, every training and validation shard.
  std::string tokenizer_sha;
  std::unique_ptr<DataLoader> train_loader, eval_loader;
  const bool do_eval = !r.data.valid.empty() && r.training.eval_every_steps > 0;
  refuse_together(
      comm, refusal_of([&] {
        tokenizer_sha = tokenizer_sha_of(r);
        train_loader =
            std::make_unique<DataLoader>(train_loader_options(r, mesh.d, accum, tokenizer_sha));
        if (do_eval)
          eval_loader = std::make_unique<DataLoader>(eval_loader_options(r, tokenizer_sha));
      }));
  DataLoader& loader = *train_loader;
  if (is_root && int64_t(loader.samples_per_epoch()) < r.training.global_batch_size)
    log_warn("data.train has ", loader.samples_per_epoch(), " samples of ", r.data.seq_len,
             " tokens, fewer than one global batch (", r.training.global_batch_size,
             "): every step repeats samples");
  refuse_together(comm, refusal_of([&] { prepare_outputs(r, comm.rank()); }));
  run_lock.keep();  // the run folder now holds this run's recipe.yaml

  // Model, ZeRO, the pipeline schedule, AdamW, the loss scaler (train/setup.h). They hand
  // device memory to their groups: on a device whose memory the host (MPI) cannot read, through
  // host staging (comm/host_staging.h). The step's host scalars go to the plain groups.
  // On GPUs with NCCL (runtime.communicator, comm/device_comm.h) every group of device memory
  // is an NCCL communicator split from an NCCL world as the mesh splits the MPI one.
  std::vector<std::unique_ptr<Communicator>> staged;
  const std::unique_ptr<Communicator> nccl_world =
      make_device_world(r.runtime.communicator, comm, *dev);
  Mesh nccl_mesh;
  if (nccl_world) nccl_mesh = make_mesh(*nccl_world, r.parallel.tensor, r.parallel.pipeline);
  const std::unique_ptr<Communicator> tied_holders =
      tied_holders_group(r, nccl_world ? *nccl_world : comm, mesh, *dev, nccl_world != nullptr);
  DeviceGroups groups;
  groups.data =
      nccl_world ? nccl_mesh.data_comm.get() : for_device_memory(&data_comm, *dev, staged);
  groups.tensor = nccl_world && tensor_comm ? nccl_mesh.tensor_comm.get()
                                            : for_device_memory(tensor_comm, *dev, staged);
  groups.pipeline = nccl_world && pipe_comm ? nccl_mesh.pipeline_comm.get()
                                            : for_device_memory(pipe_comm, *dev, staged);
  const bool holds_tied = mesh.p == 0 || mesh.p == mesh.pipeline - 1;
  groups.tied_holders = tied_holders && holds_tied ? tied_holders.get() : nullptr;
  const WeightSource weights = !r.model.from.empty() && candidates.empty()
                                   ? WeightSource::kHuggingFace
                                   : WeightSource::kRandom;
  RankSetup setup = build_rank_setup(r, dev.get(), mesh, groups, weights, is_root);
  LlamaModel& model = *setup.model;
  ZeroSharding& zero = *setup.zero;
  PipelineSchedule& pipeline = *setup.pipeline;
  AdamW& optim = *setup.optim;
  LossScaler* scaler_ptr = setup.scaler_ptr();

  const ResumePoint at =
      resume_state(r, comm, resume, candidates, model, zero, optim, scaler_ptr, mesh);
  if (at.step > 0) loader.seek(at.step);
  if (is_root) remove_steps_past(r, at);
  comm.barrier();

  if (is_root) print_run_header(r, model, loader, accum, *dev, threads);
  // An adapter whose base never trained the end-of-turn token's rows (untrained_tokens.h). Only
  // advice: a folder it cannot read (the run has read what it needs) is said at debug level.
  if (is_root) {
    try {
      for (const std::string& w : untrained_token_warnings(r)) log_warn(w);
    } catch (const Error& e) {
      log_debug("the end-of-turn token's rows were not checked: ", e.what());
    }
  }
  if (is_root && comm.size() > 1) {
    std::string how = nccl_world ? nccl_world->describe() : comm.describe();
    if (!nccl_world && !dev->host_accessible()) how += ", staged through host memory";
    std::printf("ft: device memory between ranks: %s\n", how.c_str());
  }
  // Rank 0's header names its device; on GPUs each other rank says which one it took (its
  // node-local rank's, runtime/cuda/gpu_choice.h), so a wrong choice shows in the log.
  if (!is_root && dev->kind() == DeviceKind::kCuda) log_info("ft: device ", dev->name());
  RunLog log(r, is_root, at);
  Checkpoints ckpts(r, comm, mesh, model, zero, optim, scaler_ptr, tokenizer_sha, at, log);
  // Close the live bar's line on any exit, so an error message (or the checkpoint writer's,
  // as it finishes) starts on a line of its own.
  struct FinishLog {
    RunLog& log;
    ~FinishLog() { log.finish(); }
  } finish_log{log};
  if (is_root && ckpts.on()) print_checkpoint_plan(r);

  TrainSummary sum;
  sum.resumed_from = at.folder;
  sum.start_step = at.step;
  int64_t tokens_seen = at.tokens;
  if (is_root && at.step >= r.training.steps && !at.folder.empty())
    std::printf(
        "ft: the checkpoint is at step %lld and training.steps is %lld: nothing to "
        "train (raise training.steps to continue)\n",
        (long long)at.step, (long long)r.training.steps);

  // DPO (train/dpo.h): the objective in the head; with reference: initial, the reference's
  // log-probabilities of every pair, from the run folder or computed now by the model at step 0.
  std::unique_ptr<DpoRun> dpo;
  if (r.training.objective == "dpo") {
    dpo = std::make_unique<DpoRun>(r, model, pipeline);
    if (r.dpo.reference == "initial" && at.step < r.training.steps) {
      const LoaderOptions train_opt = train_loader_options(r, mesh.d, accum, tokenizer_sha);
      const LoaderOptions valid_opt = eval_loader_options(r, tokenizer_sha);
      // Long: rank 0 hashes every shard, then a forward pass over the data (a stop signal ends
      // it at once, dpo.h).
      set_watch_step(at.step + 1, "the DPO reference's log-probabilities", /*long_wait=*/true);
      refuse_together(comm, refusal_of([&] {
                        dpo_initial_reference(*dpo, r, comm, at.step > 0, train_opt,
                                              do_eval ? &valid_opt : nullptr);
                      }));
    }
  }

  TrainStep train_step(r, comm, data_comm, pipe_comm, model, zero, pipeline, optim, scaler_ptr);
  train_step.dpo = dpo.get();
  train_step.before_update = [&ckpts] { ckpts.fence_staging_copies(); };
  RunFigures resident{0, 0, zero.params_bytes(), zero.grads_bytes(), optim.state_bytes()};
  resident.devices = comm.size();
  resident.peak_flops = device_peak_flops(r, dev->name(), dev->kind() == DeviceKind::kCuda);
  OpProfile* const profile = dev->profile();
  // A stop asked for during the start-up (loading the model, checking the shards: minutes for a
  // large model) ends the run before its first step, every rank agreeing, with nothing new to
  // save: the checkpoint it resumed from, if any, holds everything trained.
  if (at.step < r.training.steps) {
    float asked = stop_signal() != 0 ? 1.0f : 0.0f;
    comm.all_reduce_max(&asked, 1);
    if (asked > 0) {
      sum.preempted = true;
      sum.steps_done = at.step;
      log.note(detail::concat(
          "stopped by a signal before step ", at.step + 1, " of ", r.training.steps,
          ": nothing trained since ",
          at.folder.empty() ? std::string("the start") : ckpt::step_folder_name(at.step),
          ", nothing to save; exiting with code 75 (the same command "
          "continues)"));
    }
  }
  for (int64_t s = at.step; !sum.preempted && s < r.training.steps; ++s) {
    const int64_t step = s + 1;  // as people read it: progress, metrics, messages, checkpoints
    const bool last = step == r.training.steps;
    crash_test_hooks(step, comm.rank(), ckpts);
    if (s == at.step) sum.time_to_first_step_s = seconds_since_process_start();
    // FT_PROFILE: only the steps' ops count (not evaluation, saving or initialisation), and
    // not the process's first step when more follow: its one-off costs (kernel modules loaded
    // on first launch, cuBLASLt's algorithm choice, the allocator's first blocks) would be
    // counted as the time of whichever op met them first.
    const bool profiled = profile && (s > at.step || r.training.steps - at.step == 1);
    if (profiled) profile->recording = true;
    const StepResult res = train_step.run(s, loader, [&] {
      return LoopRequests{stop_signal() != 0, is_root && ckpts.clock_due()};
    });
    if (profiled) {
      profile->recording = false;
      if (profile->event_device) profile->resolve_events();  // CUDA: the GPU's op times
      profile->step_seconds += res.time_s;
      profile->steps++;
    }
    if (res.nonfinite) stop_nonfinite(r, train_step, res, ckpts);
    tokens_seen += res.tokens;
    if (!res.all_masked && !res.skipped) {
      sum.final_loss = res.loss;
      sum.final_loss_step = step;
    }

    if (log.step_due(step) || res.skipped) {  // a skipped fp16 step is always logged
      RunFigures figures = resident;
      figures.tokens_seen = tokens_seen;
      figures.mem_peak_bytes = dev->stats().peak_bytes;
      figures.mem_host_pinned_bytes = dev->host_stats().pinned_peak_bytes;
      figures.mem_host_pageable_bytes = dev->host_stats().pageable_peak_bytes;
      // Every rank alike (one device kind per run): a collective, on GPUs only.
      if (dev->kind() == DeviceKind::kCuda) {
        set_watch_step(step, "the GPU load's gather");
        figures.gpu = gather_gpu_load(comm, *dev);
      }
      log.step(res, figures, s == at.step ? sum.time_to_first_step_s : -1);
    }
    if (do_eval && (step % r.training.eval_every_steps == 0 || last)) {
      set_watch_step(step, "evaluation");
      DpoStats eval_dpo;
      const double eval_loss = evaluate(pipeline, pipe_comm, *eval_loader, r, dpo.get(), &eval_dpo);
      log.eval(step, eval_loss, dpo ? &eval_dpo : nullptr);
    }
    // Checkpoints and stop signals, as the step's agreement decided.
    const bool stop = res.stop_requested && !last;
    if (ckpts.due(step, res.save_by_clock, last) || stop) ckpts.save_after_step(step, tokens_seen);
    ckpts.poll(step);
    if (stop) {
      ckpts.wait(step);  // this rank's shard durable; on rank 0, the checkpoint committed
      comm.barrier();    // no rank exits (and has its launcher stop the others) before the commit
      sum.preempted = true;
      sum.steps_done = step;
      log.note(detail::concat("stopped by a signal after step ", step, " of ", r.training.steps,
                              "; checkpoint ", ckpt::step_folder_name(step),
                              " saved: exiting with code 75"));
      break;
    }
  }

  set_watch_step(0, "end of run");
  // A run that trained no steps (training.steps 0: a checkpoint of the initial or imported
  // weights) still leaves its checkpoint.
  if (ckpts.on() && !sum.preempted && ckpts.last_saved() < 0 && at.step >= r.training.steps)
    ckpts.save(at.step, tokens_seen);
  ckpts.wait(sum.preempted ? sum.steps_done : r.training.steps);
  log.finish();
  if (const HostStagingStats st = host_staging_stats(); st.calls > 0)
    log_info("ft: ", st.calls, " communication calls staged through host memory (",
             (st.bytes + (1 << 20) - 1) >> 20, " MiB copied): ", dev->name(),
             " memory is not host-accessible and MPI is not CUDA-aware (NCCL will run on the "
             "device)");
  if (const char* dir = std::getenv("FT_TEST_DUMP_PARAMS"))
    dump_final_params(dir, model, zero, mesh, comm.rank());

  sum.steps = std::max<int64_t>(0, (sum.preempted ? sum.steps_done : r.training.steps) - at.step);
  sum.tokens = tokens_seen - at.tokens;
  sum.wall_s = log.elapsed_s();
  sum.tokens_per_s = sum.wall_s > 0 ? double(sum.tokens) / sum.wall_s : 0;
  sum.mem_peak_bytes = dev->stats().peak_bytes;
  sum.peak_rss_bytes = peak_rss_bytes();
  if (is_root) print_summary(r, sum, ckpts.last_saved());
  if (is_root && profile) {
    std::fputs(format_profile(*profile).c_str(), stdout);
    std::fflush(stdout);
  }
  return sum;
}

}  // namespace ft
