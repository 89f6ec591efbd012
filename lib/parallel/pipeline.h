// Pipeline parallelism: contiguous blocks of layers per stage, the embedding on the first stage
// and the final norm, head and loss on the last, and the one-forward-one-backward (1F1B)
// schedule over the micro-batches of a step (Narayanan et al., "Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM", 2021, §2.2). Stage p runs
//   1. warm-up: min(P − p − 1, M) forwards,
//   2. steady state: one forward, then one backward, until every forward is done,
//   3. cool-down: the remaining backwards,
// so at most P − p micro-batches are in flight on stage p, each in its own activation slot.
// Activations go forward and their gradients backward with point-to-point messages; a lone send
// does not block (each micro-batch has its own send buffer) and is completed at the end of the
// step; in the steady state a send and a receive go out as one call (Communicator::send_recv).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "data/loader.h"
#include "runtime/device.h"

namespace ft {

// One stage's part of a model, as the schedule drives it (LlamaModel implements it). A stage
// runs a micro-batch in two halves and keeps several micro-batches in flight, each in its own
// activation slot.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Elements per token of what crosses a stage boundary (the hidden size C), in compute_dtype().
  virtual int hidden_size() const = 0;
  virtual DType compute_dtype() const = 0;
  // The first stage embeds `inputs` (host ids, B·T); the others start from x_in (B·T, C, device
  // memory). The last stage adds its loss to the step's sum (take_loss_sum) and, with backward,
  // keeps what backward_part needs; the others leave their output at stage_output(slot).
  // token_weight scales each token's loss gradient. seg: (B, T) host segment ids of packed
  // samples (StepSamples::seg; every stage gets them: attention and RoPE need them in every
  // layer), or null for one sample per row. first_sample: the run-wide index of row 0
  // (StepSamples::first_sample), which keys per-sample randomness.
  virtual void forward_part(int slot, const int32_t* inputs, CRef x_in, const int32_t* targets,
                            const uint8_t* mask, int B, int T, float token_weight, bool backward,
                            const int32_t* seg, uint64_t first_sample = 0) = 0;
  // The last stage starts from its loss; the others from dy_in (B·T, C), the gradient of their
  // output. Leaves the gradient of the stage's input at input_grad() (not on the first stage).
  // Gradients accumulate.
  virtual void backward_part(int slot, CRef dy_in) = 0;
  // A whole training micro-batch on the only stage (no pipeline): forward_part then
  // backward_part in slot 0, which a stage may run another way with the same bits (LlamaModel:
  // recorded once as a graph and replayed, FT_CUDA_GRAPHS).
  virtual void train_micro_batch(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                                 int B, int T, float token_weight, const int32_t* seg,
                                 uint64_t first_sample) {
    forward_part(0, inputs, CRef(), targets, mask, B, T, token_weight, true, seg, first_sample);
    backward_part(0, CRef());
  }
  virtual CRef stage_output(int slot) const = 0;  // (B·T, C)
  virtual CRef input_grad() const = 0;            // (B·T, C)
  // The loss summed since the last call (over masked targets, on the last stage; 0 elsewhere),
  // read back from the device once, and reset.
  virtual double take_loss_sum() = 0;
};

class PipelineSchedule {
 public:
  // pipe: the pipeline group (rank = stage); null for a single stage.
  PipelineSchedule(PipelineStage& model, Communicator* pipe, Device* dev);
  // Forward and backward of every micro-batch of `b` (micro samples each); gradients accumulate.
  // token_weight scales each token's loss gradient (1 / the global batch's trained tokens, for
  // the token-weighted mean). Returns the summed loss of the step's micro-batches (0 except on
  // the last stage), read back from the device once.
  double train_step(const StepSamples& b, int micro, float token_weight);
  // Forward only; the summed loss on the last stage, 0 elsewhere.
  double eval_batch(const StepSamples& b, int micro);
  // Activation slots the last step used: the micro-batches it kept in flight.
  int slots() const { return slots_; }

 private:
  void run_forward(const StepSamples& b, int i, int micro, float token_weight, bool backward);
  // The transfers around them (n elements each; DESIGN §3: the 1F1B order of the calls).
  void recv(int tag, int peer, size_t n);  // into recv_buf_, ordered on the compute stream
  size_t fill_send_buffer(size_t k, CRef src, size_t n);
  void send_output(int i, size_t n);
  void send_input_grad(int j, size_t n);
  void send_output_recv_grad(int i, int j, size_t n);
  void send_grad_recv_input(int j, int i, int M, size_t n);
  int slot(int i) const { return i % slots_; }

  PipelineStage& model_;
  Communicator* pipe_;
  Device* dev_;
  int p_ = 0, P_ = 1, slots_ = 1;
  // In the model's compute dtype: activations travel at their real width.
  DBuffer recv_buf_;                // (micro·T, C)
  std::vector<DBuffer> send_bufs_;  // per micro-batch: output or input gradient
  std::vector<CommWork> sending_;   // per send buffer: its send in flight
  void ensure_buffers(size_t n, size_t count);
  void wait_sends();  // every send in flight, on the host
};

}  // namespace ft
