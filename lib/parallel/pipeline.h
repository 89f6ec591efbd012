// Pipeline parallelism: contiguous blocks of layers per stage, the embedding on the first stage
// and the final norm, head and loss on the last, and the one-forward-one-backward (1F1B)
// schedule over the micro-batches of a step (Narayanan et al., "Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM", 2021, §2.2). Stage p runs
//   1. warm-up: min(P − p − 1, M) forwards,
//   2. steady state: one forward, then one backward, until every forward is done,
//   3. cool-down: the remaining backwards,
// so at most P − p micro-batches are in flight on stage p, each in its own activation slot.
// Activations go forward and their gradients backward with point-to-point messages; sends do not
// block (each micro-batch has its own send buffer) and are completed at the end of the step.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "data/loader.h"
#include "model/llama.h"
#include "runtime/device.h"

namespace ft {

// Stage p of P for L layers: the layers of stage_layers (lib/parallel/partition.h), the
// embedding on the first stage, the head on the last.
StageSpec pipeline_stage(int n_layers, int p, int P);

class PipelineSchedule {
 public:
  // pipe: the pipeline group (rank = stage); null for a single stage.
  PipelineSchedule(LlamaModel& model, Communicator* pipe, Device* dev);
  // Forward and backward of every micro-batch of `b` (micro samples each); gradients accumulate.
  // token_weight scales each token's loss gradient (1 / the global batch's trained tokens, for
  // the token-weighted mean). Returns the summed loss of the step's micro-batches (0 except on
  // the last stage), read back from the device once.
  double train_step(const StepSamples& b, int micro, float token_weight);
  // Forward only; the summed loss on the last stage, 0 elsewhere.
  double eval_batch(const StepSamples& b, int micro);

 private:
  void forward(const StepSamples& b, int i, int micro, float token_weight, bool backward);
  void backward(int i, int micro, int T);
  int slot(int i) const { return i % slots_; }

  LlamaModel& model_;
  Communicator* pipe_;
  Device* dev_;
  int p_ = 0, P_ = 1, slots_ = 1;
  // In the model's compute dtype: activations travel at their real width.
  DBuffer recv_buf_;                    // (micro·T, C)
  std::vector<DBuffer> send_bufs_;      // per micro-batch: output or input gradient
  void ensure_buffers(size_t n, size_t count);
};

}  // namespace ft
