// Llama-family decoder (HF LlamaForCausalLM math) with hand-written forward and backward on
// flat parameter buffers (see layout.h for the order). One micro-batch at a time; gradients
// accumulate across micro-batches until zero_grads().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layout.h"
#include "model/config.h"
#include "runtime/device.h"

namespace ft {

// Where a group's parameters and gradients live while the model runs. Without hooks, in the
// model's own full flat buffers. ZeRO stages 2 and 3 (lib/parallel/zero.h) supply hooks: the
// parameters of a group are gathered just before the group runs and released after; a group's
// gradient accumulates in a working buffer that is reduce-scattered as soon as the group's
// backward for the micro-batch is complete.
class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  virtual CRef acquire_params(int group) = 0;  // full parameters of the group (compute dtype)
  virtual void release_params(int group) = 0;
  virtual float* grads(int group) = 0;                 // full-size, accumulate into it
  virtual void grads_ready(int group) = 0;             // this micro-batch's gradient is complete
};

// The part of the model one pipeline stage runs: layers [first_layer, last_layer), plus the
// embedding on the first stage and the final norm, head and loss on the last (DESIGN.md §3).
struct StageSpec {
  int first_layer = 0, last_layer = -1;  // -1: up to the last layer
  bool embed = true, head = true;
};

class LlamaModel {
 public:
  // tensor_comm: the tensor-parallel group (Megatron layers, DESIGN.md §3); null = no tensor
  // parallelism. Parameters are then this tensor rank's slices (layout().tensor() > 1).
  // stage: the layers (and ends) this rank holds; parameter groups it does not hold are empty.
  // compute_dtype: the precision policy's compute dtype (DESIGN.md §5 training.precision):
  // activations and the compute copy of the parameters; weight gradients stay fp32.
  LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing = false,
             Communicator* tensor_comm = nullptr, StageSpec stage = {},
             DType compute_dtype = DType::kF32);
  ~LlamaModel();

  const ModelConfig& config() const { return cfg_; }
  Device* device() const { return dev_; }
  const ParamLayout& layout() const { return layout_; }
  DType compute_dtype() const { return cdt_; }
  // Flat fp32 parameter buffers, one per layout group (numel of group g): initialised here, and
  // the parameters the model computes with in fp32. With a 16-bit compute dtype they only exist
  // until make_compute_copy(); ZeRO then keeps the fp32 master weights.
  std::vector<Buffer<float>>& params() { return params_; }
  // 16-bit compute dtype: converts the fp32 parameters into compute-dtype group buffers and frees
  // the fp32 ones (or only frees them with drop_fp32: ZeRO-3 keeps its own shards).
  void make_compute_copy();
  // The parameters group g is computed with (compute dtype; the fp32 buffer in fp32).
  Ref compute_params(int g);
  // Full gradient buffers (allocated on first use: ZeRO-2/3 runs never need them).
  std::vector<Buffer<float>>& grads();
  void set_hooks(GroupHooks* hooks) { hooks_ = hooks; }
  // Frees the full parameter buffers once ZeRO-3 hooks own the parameters.
  void drop_params() {
    params_.clear();
    compute_params_.clear();
  }
  // Host copies of the parameter groups (empty for groups this stage does not hold), and back:
  // for loading and slicing weights at startup, which happens on the host.
  std::vector<std::vector<float>> params_to_host() const;
  void params_from_host(const std::vector<std::vector<float>>& host);
  size_t num_params() const { return layout_.total_numel(); }
  // Bytes of the parameter buffers the model holds (fp32 and compute copy).
  size_t param_bytes() const;

  // Seeded initialisation: matrices ~ N(0, std²), norm weights = 1 (as HF's _init_weights).
  void init_random(uint64_t seed, double std);
  void zero_grads();

  // Forward and backward on one micro-batch. inputs/targets/mask: (B, T) host arrays, copied to
  // the device. dlogits are scaled by token_weight (1 / trained tokens of the whole global batch
  // gives the token-weighted mean). The SUM of per-token losses over masked targets accumulates
  // on the device (take_loss_sum). Gradients accumulate.
  void forward_backward(const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                        int B, int T, float token_weight);
  // Forward only (evaluation); the summed loss accumulates as above.
  void forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                    int T);
  // The loss summed since the last call (over masked targets, on the last stage; 0 elsewhere),
  // read back from the device once, and reset.
  double take_loss_sum();

  // Pipeline stages run a micro-batch in two halves, and keep several micro-batches in flight,
  // each in its own activation slot.
  // forward_part: the first stage embeds `inputs` (host ids); others start from x_in (B·T, C,
  // device memory). The last stage adds its loss to the step's sum (take_loss_sum) and, with
  // backward, keeps dlogits for backward_part; others leave their output at stage_output(slot).
  void forward_part(int slot, const int32_t* inputs, CRef x_in, const int32_t* targets,
                      const uint8_t* mask, int B, int T, float token_weight, bool backward);
  // backward_part: the last stage starts from its loss; others from dy_in (B·T, C), the gradient
  // of their output. Leaves the gradient of the stage's input at input_grad() (not on the first).
  void backward_part(int slot, CRef dy_in);
  // (B·T, C) in the compute dtype.
  CRef stage_output(int slot) const;
  CRef input_grad() const;
  const StageSpec& stage() const { return stage_; }
  bool owns_group(int g) const;
 private:
  struct Acts;
  void ensure_acts(int slot, int B, int T, bool need_backward);
  void layer_forward(int l, int B, int T);
  void row_parallel_forward(Ref y, CRef x, CRef W, int N, int in, int out);
  void layer_backward(int l, int B, int T);

  // Megatron's f and g: identity one way, all-reduce over the tensor group the other. A 16-bit
  // tensor is summed in fp32 (converted, reduced, rounded once).
  void tensor_all_reduce(Ref x, size_t n);
  void copy(Ref dst, CRef src, size_t n);  // n elements of dst's dtype

  ModelConfig cfg_;
  Device* dev_;
  bool ckpt_;
  Communicator* tp_comm_;
  int tp_ = 1, tp_rank_ = 0;
  int H_, K_, F_, V_;  // this tensor rank's query heads, kv heads, ffn columns, vocabulary rows
  int v_begin_ = 0;    // first vocabulary row of this rank's shard
  ParamLayout layout_;
  // (D/2) RoPE inverse frequencies of cfg_'s rope type (model/rope.h), in device memory.
  Buffer<float> rope_inv_freq_;
  Buffer<double> loss_acc_;  // (1) the loss summed since take_loss_sum
  Stream st_;
  Ops& ops() { return dev_->ops(); }
  DType cdt_;
  std::vector<Buffer<float>> params_, grads_;
  std::vector<DBuffer> compute_params_;  // 16-bit compute dtype: the compute copy
  StageSpec stage_;
  std::vector<std::unique_ptr<Acts>> slots_;
  Acts* acts_ = nullptr;  // the slot in use
  GroupHooks* hooks_ = nullptr;
  CRef P(int g) { return hooks_ ? hooks_->acquire_params(g) : CRef(compute_params(g)); }
  void release(int g) { if (hooks_) hooks_->release_params(g); }
  float* G(int g) { return hooks_ ? hooks_->grads(g) : grads()[g].data(); }
  void grads_ready(int g) { if (hooks_) hooks_->grads_ready(g); }
};

}  // namespace ft
