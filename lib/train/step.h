// One optimizer step: from this rank's samples of a global batch to updated parameters. Every
// rank runs the same phases in the same order (their collectives must meet):
//   0. this rank's samples of global batch s, from the loader (prefetched);
//   1. token weight: the trained target tokens of the whole global batch, all-reduced over the
//      data ranks; each token's loss gradient is weighted 1/count, so the step's loss is the
//      token-weighted mean over the global batch, not a mean of micro-batch means (DESIGN.md §6);
//   2. forward/backward of every micro-batch (the pipeline schedule, lib/parallel/pipeline.h);
//      gradients accumulate in the flat buffers (ZeRO-2/3 reduce-scatter each group as soon as
//      its backward is done);
//   3. gradient sync: ZeRO-0/1's all-reduce, the tied embedding between its two stages;
//   4. the global gradient norm over every part of the model, whichever rank holds it;
//   5. one agreement over the world before anything is changed: a non-finite loss or gradient
//      norm on any rank, folded with the loop's own requests (a stop signal, a save due by the
//      clock, asked for at this point) so that the step costs one small all-reduce;
//   6. clipping, the learning rate of step s, AdamW on the owned shards, and ZeRO's all-gather
//      of the updated parameters.
// A step whose loss or norm is not finite changes nothing (DESIGN.md §5): run() returns before
// phase 6 with `nonfinite` set, and the loop stops the run (describe_nonfinite names why).
//
// Mixed precision (DESIGN.md §5) lives in the phases, not the loop: phase 2 runs on the bf16/fp16
// compute copy of the parameters, phase 6 updates the fp32 master shard and refreshes the
// compute copy from it (ZeRO's finish_update); fp16 loss scaling multiplies the scale into phase
// 1's token weight, divides it out in phase 4 with found-inf carried by the norm's all-reduce,
// and turns a phase-5 overflow into a skipped step (StepResult's `skipped` and `loss_scale`).
//
// Steps are counted from 0 here (s, as in DESIGN.md §5's formulas); people read s + 1 (§7).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "data/loader.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"
#include "recipe/recipe.h"
#include "train/dpo.h"
#include "train/throughput.h"

namespace ft {

// What the loop asks of the world at this step; folded into the step's agreement (phase 5).
struct LoopRequests {
  bool stop_signal = false;    // this rank got SIGTERM/SIGUSR1: save and stop after the step
  bool save_by_clock = false;  // rank 0: checkpoint.every_minutes has passed since the last save
};

struct StepResult {
  int64_t step = 0;         // as people read it: s + 1
  double loss = 0;          // token-weighted mean over the global batch; 0 when all are masked
  double grad_norm = 0;     // global L2 norm before clipping
  double lr = 0;            // the learning rate applied (0 when nothing was applied)
  int64_t tokens = 0;       // input tokens of the global batch, masked or not
  bool all_masked = false;  // every target of the global batch was masked out (loss_mask)
  double time_s = 0;        // wall time of the step on this rank
  bool nonfinite = false;   // the loss or the gradient norm is not finite: nothing was updated
  // fp16 (a loss scaler): the scale this step ran with (0 without one); an overflow skipped the
  // step (nothing updated, the schedule not advanced); or the scaler gave up, saying why here
  // (nonfinite is then set too: the run stops).
  double loss_scale = 0;
  bool skipped = false;
  std::string scaler_stop;
  // The loop's requests, agreed over the world: true when any rank asked.
  bool stop_requested = false, save_by_clock = false;
  // training.objective dpo: the global batch's sums over its pairs (train/dpo.h); pairs 0 else.
  DpoStats dpo;
  // The model FLOPs of the global batch (train/throughput.h).
  double model_flops = 0;
};

class TrainStep {
 public:
  // world: every rank. data_comm: the data group; pipe_comm: the pipeline group (null for one
  // stage). The objects are the run's; they must outlive this.
  TrainStep(const Recipe& r, Communicator& world, Communicator& data_comm, Communicator* pipe_comm,
            LlamaModel& model, ZeroSharding& zero, PipelineSchedule& pipeline, AdamW& optim,
            LossScaler* scaler = nullptr);

  // Step s, on this rank's samples of global batch s, the loader's next. `requests` is called
  // once, at the agreement (phase 5), for this rank's LoopRequests.
  StepResult run(int64_t s, DataLoader& loader, const std::function<LoopRequests()>& requests);
  // Phases 1-6 of step s on `batch` (what run() does after reading it; `ft plan` runs a step of
  // placeholder tokens on its counting device this way). t_step: when the step began.
  StepResult run_batch(int64_t s, const StepSamples& batch,
                       const std::function<LoopRequests()>& requests,
                       std::chrono::steady_clock::time_point t_step);

  // After a step that came back nonfinite, on every rank alike (a collective): what is not
  // finite and the first tensor, in layout order, whose gradient holds a NaN or an infinity
  // ("the loss is nan (first non-finite gradient: ... in layers.1)").
  std::string describe_nonfinite(const StepResult& res);

  // Called once a step has decided to update, right before the optimizer queues its writes to
  // the parameters and moments: the trainer makes the compute stream wait there for an async
  // checkpoint's staging copies of them (CheckpointWriter::fence_staging_copies).
  std::function<void()> before_update;

  // training.objective dpo: the run's DPO state, whose reference each batch gets before its
  // forward (train/dpo.h); null for sft.
  DpoRun* dpo = nullptr;

 private:
  const Recipe& r_;
  Communicator& world_;
  Communicator& data_comm_;
  Communicator* pipe_comm_;
  LlamaModel& model_;
  ZeroSharding& zero_;
  PipelineSchedule& pipeline_;
  AdamW& optim_;
  LossScaler* scaler_;  // fp16 only
};

// What the metrics line of a step carries besides the step's own figures.
struct RunFigures {
  int64_t tokens_seen = 0;    // trained so far, this step included
  size_t mem_peak_bytes = 0;  // this rank's device allocator peak
  size_t mem_params_bytes = 0, mem_grads_bytes = 0, mem_optim_bytes = 0;
  // The most host memory of each kind this rank's device handed out so far (Device::host_stats).
  size_t mem_host_pinned_bytes = 0, mem_host_pageable_bytes = 0;
  // Throughput: the devices sharing the step, and one device's dense peak FLOP/s (0: unknown,
  // no mfu).
  int devices = 1;
  double peak_flops = 0;
  // The GPUs' load at this step (train/throughput.h), gathered on logged steps.
  GpuLoad gpu = {};
};

// The step's line of the metrics file (DESIGN.md §7).
nlohmann::json step_metrics_line(const StepResult& res, const RunFigures& run);

// Test support, not a user feature: FT_TEST_<WHAT>_AT_STEP=N[:r] fires at step N (numbered as
// the progress line numbers it, from 1) on world rank r, or on every rank without ":r".
bool test_hook_fires(const char* var, int64_t step, int rank);

}  // namespace ft
