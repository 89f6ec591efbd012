#include "train/step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "optim/schedule.h"
#include "train/throughput.h"

namespace ft {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

bool test_hook_fires(const char* var, int64_t step, int rank) {
  const char* v = std::getenv(var);
  if (!v) return false;
  const char* colon = std::strchr(v, ':');
  return std::atoll(v) == step && (!colon || std::atoi(colon + 1) == rank);
}

TrainStep::TrainStep(const Recipe& r, Communicator& world, Communicator& data_comm,
                     Communicator* pipe_comm, LlamaModel& model, ZeroSharding& zero,
                     PipelineSchedule& pipeline, AdamW& optim, LossScaler* scaler)
    : r_(r),
      world_(world),
      data_comm_(data_comm),
      pipe_comm_(pipe_comm),
      model_(model),
      zero_(zero),
      pipeline_(pipeline),
      optim_(optim),
      scaler_(scaler) {}

StepResult TrainStep::run(int64_t s, DataLoader& loader,
                          const std::function<LoopRequests()>& requests) {
  const auto t_step = Clock::now();
  // 0. The batch.
  set_watch_step(s + 1, "reading the batch");
  const StepSamples batch = loader.next();
  FT_CHECK(batch.step == s, "data loader out of step: got ", batch.step, ", expected ", s);
  return run_batch(s, batch, requests, t_step);
}

StepResult TrainStep::run_batch(int64_t s, const StepSamples& batch,
                                const std::function<LoopRequests()>& requests,
                                std::chrono::steady_clock::time_point t_step) {
  StepResult res;
  res.step = s + 1;
  const int64_t step = res.step;
  const int rank = world_.rank();
  // Every position of every row: DPO's pairs are two rows each.
  res.tokens = int64_t(r_.training.global_batch_size) * r_.data.seq_len * (dpo ? 2 : 1);
  res.model_flops = step_model_flops(r_);

  // 1. Token weight: 1 / the trained targets of the whole global batch. DPO: 1 / its pairs, whose
  // losses the step averages (train/dpo.h), so no count need be agreed.
  double count = 0;
  if (dpo) {
    count = double(r_.training.global_batch_size);
  } else {
    for (uint8_t m : batch.mask) count += m;
    set_watch_step(step, "counting target tokens");
    data_comm_.all_reduce_sum(&count, 1);  // tensor ranks hold the same samples
  }
  // fp16: the loss, so every gradient, is multiplied by the loss scale S (a power of two, so
  // exactly); the gradients are divided by S again in phase 6, in the same pass as clipping.
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  if (scaler_) res.loss_scale = loss_scale;
  const float token_weight = count > 0 ? float(1.0 / count) * loss_scale : 0.0f;
  res.all_masked = count == 0;
  if (count == 0 && rank == 0)
    log_warn("step ", step,
             ": every target of the global batch is masked out (loss_mask): nothing to learn "
             "from, so the loss is reported as 0 and every gradient is 0, but AdamW still moves "
             "the parameters (its momentum from earlier steps, and weight decay); check the "
             "data's loss_mask (`ft inspect` on the shard folder)");

  // 2. Forward/backward of every micro-batch; gradients accumulate. DPO: each batch's reference
  // first (a pass without backward, with reference: base).
  const int micro = dpo ? dpo->micro_rows() : r_.training.micro_batch_size;
  if (dpo) {
    set_watch_step(step, "the reference's log-probabilities");
    dpo->prepare(batch, /*valid=*/false);
  }
  set_watch_step(step, "forward/backward");
  zero_.begin_step(batch.count / micro);
  // Test support: FT_TEST_NAN_LOSS_AT_STEP=N[:r] makes rank r's share of the loss of step N
  // NaN; FT_TEST_NAN_GRAD_AT_STEP=N[:r] writes NaN into the first gradient element rank r
  // holds, before the gradient reductions (during the backward, with overlap), as a NaN from
  // its backward would be.
  if (test_hook_fires("FT_TEST_NAN_GRAD_AT_STEP", step, rank)) zero_.inject_nan_grad_for_test();
  double loss_sum = pipeline_.train_step(batch, micro, token_weight);
  if (test_hook_fires("FT_TEST_NAN_LOSS_AT_STEP", step, rank))
    loss_sum = std::numeric_limits<double>::quiet_NaN();
  if (pipe_comm_) pipe_comm_->all_reduce_sum(&loss_sum, 1);  // the loss is on the last stage
  data_comm_.all_reduce_sum(&loss_sum, 1);                   // the same on every tensor rank
  res.loss = count > 0 ? loss_sum / count : 0.0;
  if (dpo) res.dpo = dpo->take_stats(pipe_comm_, data_comm_);

  // 3. Gradient sync.
  set_watch_step(step, "gradient reduction");
  zero_.finish_backward();
  zero_.reduce_shared_groups();

  // 4. Global gradient norm: clip_grad_norm_ semantics over every gradient of the model,
  // whichever rank holds it.
  set_watch_step(step, "grad norm and optimizer");
  // Of the unscaled gradients (dividing by the power of two S is exact). fp16: an overflow
  // makes the norm inf or NaN: that is the found-inf flag phase 5 all-reduces.
  res.grad_norm = std::sqrt(zero_.grad_sum_squares()) / loss_scale;

  // 5. One all-reduce over the world before anything is changed: a non-finite loss or gradient
  // norm on any rank (every rank computes both alike, but one agreement makes a stop certain
  // to be collective), any rank's stop signal, and rank 0's clock for checkpoint.every_minutes,
  // so every rank decides alike.
  const LoopRequests mine = requests();
  float flags[3] = {std::isfinite(res.loss) && std::isfinite(res.grad_norm) ? 0.0f : 1.0f,
                    mine.stop_signal ? 1.0f : 0.0f, mine.save_by_clock ? 1.0f : 0.0f};
  world_.all_reduce_max(flags, 3);
  res.stop_requested = flags[1] > 0;
  res.save_by_clock = flags[2] > 0;
  // The learning rate of step s: the schedule counts applied steps (AdamW's t), so s itself
  // unless fp16 skipped some. Set before the skip below: a skipped step's metrics line reports
  // the rate it would have used (DESIGN.md §7), which is the next applied step's.
  res.lr = lr_at_step(r_.scheduler, r_.optimizer.lr, optim_.step_count(), r_.training.steps);

  // fp16: an overflow skips the step, or stops the run when the scaler gives up; fp32 and bf16
  // stop at once. Every rank decides alike (the flag was all-reduced).
  if (scaler_) {
    const LossScaler::Decision d = scaler_->update(flags[0] > 0);
    if (d.stop) {
      res.nonfinite = true;
      res.scaler_stop = d.reason;
    } else if (d.skip) {
      res.skipped = true;
      if (rank == 0) log_warn("step ", step, ": ", d.reason);
    }
    if (d.skip || d.stop) {
      res.time_s = seconds_since(t_step);
      return res;
    }
  } else if (flags[0] > 0) {
    res.nonfinite = true;  // nothing updated: the loop stops the run
    res.time_s = seconds_since(t_step);
    return res;
  }

  // 6. Clipping (scale by grad_clip / (norm + 1e-6) when below 1), AdamW at the rate above on
  // the owned ranges, then the updated parameters back to every rank that uses them.
  // fp16: unscaling by 1/S folded into the same factor (for S = 1, exactly the clipping alone).
  // AdamW reads the gradients times the factor (bit for bit a scaling pass before it), so the
  // gradients are not rewritten: one pass over them fewer per step.
  const double clip =
      r_.training.grad_clip > 0 ? r_.training.grad_clip / (res.grad_norm + 1e-6) : 1.0;
  const float factor = float(std::min(clip, 1.0) / loss_scale);
  if (before_update) before_update();
  if (zero_.offloaded()) {
    // On the host, group by group as the next forward first uses each (ZeRO's offload
    // "update"): the lambda outlives this call, so it holds the step's figures by value.
    optim_.begin_step();
    AdamW* optim = &optim_;
    zero_.offload_update(
        [optim, lr = res.lr, factor](int g, float* master, const float* grad, Ref compute) {
          optim->update_group(g, master, grad, lr, factor, compute);
        });
  } else if (zero_.overlaps_update()) {
    // On the update stream, under the next forward (parallel.overlap_update): the same calls,
    // queued before overlapped_update returns (so the lambda may hold everything by reference).
    optim_.begin_step();
    const std::vector<float*> params = zero_.param_bases();
    const std::vector<const float*> grads = zero_.grad_bases();
    const std::vector<Ref> compute = zero_.compute_bases();
    zero_.overlapped_update([&](int g, Stream s) {
      const size_t i = size_t(g);
      optim_.update_group(g, params[i], grads[i], res.lr, factor,
                          i < compute.size() ? compute[i] : Ref(), s);
    });
  } else {
    optim_.step(zero_.param_bases(), zero_.grad_bases(), res.lr, factor, zero_.compute_bases());
    zero_.finish_update();  // (precision policy: refresh the compute copy from the master)
  }
  res.time_s = seconds_since(t_step);
  return res;
}

std::string TrainStep::describe_nonfinite(const StepResult& res) {
  // Each rank looks at the gradients it holds; the max of the negated indices (a min) names
  // the same tensor on every rank. Floats hold these small indices exactly.
  const int64_t mine = zero_.first_nonfinite_grad();
  float first = mine >= 0 ? -float(mine) : -1e30f;
  world_.all_reduce_max(&first, 1);
  // "nan", never the "-nan" that printing a NaN with its sign bit set gives.
  auto name = [](double x) { return std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf"; };
  std::string what;
  if (!std::isfinite(res.loss)) what = detail::concat("the loss is ", name(res.loss));
  if (!std::isfinite(res.grad_norm))
    what +=
        detail::concat(what.empty() ? "" : " and ", "the gradient norm is ", name(res.grad_norm));
  std::string where = "every gradient element is finite";
  if (first > -1e29f) {
    int64_t index = int64_t(-first);
    for (const auto& g : model_.layout().groups()) {
      if (index < int64_t(g.entries.size())) {
        where = "first non-finite gradient: " + g.entries[size_t(index)].name + " in " + g.name;
        break;
      }
      index -= int64_t(g.entries.size());
    }
  } else if (!std::isfinite(res.grad_norm)) {
    where += ", but the sum of their squares overflows";
  }
  return what + " (" + where + ")";
}

nlohmann::json step_metrics_line(const StepResult& res, const RunFigures& run) {
  nlohmann::json line = {{"step", res.step},
                         {"loss", res.loss},
                         {"lr", res.lr},
                         {"grad_norm", res.grad_norm},
                         {"tokens", run.tokens_seen},
                         {"tokens_per_s", double(res.tokens) / res.time_s},
                         {"step_time_s", res.time_s},
                         {"mem_peak_bytes", run.mem_peak_bytes},
                         {"mem_params_bytes", run.mem_params_bytes},
                         {"mem_grads_bytes", run.mem_grads_bytes},
                         {"mem_optim_bytes", run.mem_optim_bytes},
                         {"mem_host_pinned_bytes", run.mem_host_pinned_bytes},
                         {"mem_host_pageable_bytes", run.mem_host_pageable_bytes}};
  // Achieved model TFLOP/s of one device, and its share of the peak (DESIGN.md §7).
  const double tflops = res.model_flops / std::max(1, run.devices) / res.time_s / 1e12;
  line["tflops"] = tflops;
  if (run.peak_flops > 0) line["mfu"] = tflops * 1e12 / run.peak_flops;
  // The GPUs' load (DESIGN.md §7): rank 0's, and the slowest rank's where any has a reading.
  if (run.gpu.own_known) {
    line["gpu_util"] = run.gpu.util_percent;
    line["gpu_mem_used_bytes"] = run.gpu.mem_used_bytes;
  }
  if (run.gpu.slowest_rank >= 0) {
    line["gpu_util_slowest"] = run.gpu.slowest_util_percent;
    line["gpu_mem_used_bytes_slowest"] = run.gpu.slowest_mem_used_bytes;
    line["slowest_rank"] = run.gpu.slowest_rank;
  }
  if (res.dpo.pairs > 0) res.dpo.add_metrics(line, "");
  if (res.loss_scale > 0) {  // fp16 (DESIGN.md §7); a skipped step's non-finite norm is null
    line["loss_scale"] = res.loss_scale;
    line["skipped"] = res.skipped;
    if (!std::isfinite(res.grad_norm)) line["grad_norm"] = nullptr;
  }
  return line;
}

}  // namespace ft
