// Llama-family decoder (HF LlamaForCausalLM math, and the variants model/arch.h's table names
// for ModelConfig::arch) with hand-written forward and backward on
// flat parameter buffers (see layout.h for the order). One micro-batch at a time; gradients
// accumulate across micro-batches until the FlatParams' zero_grads().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/device_comm.h"
#include "model/config.h"
#include "model/converter.h"
#include "model/layout.h"
#include "model/linear.h"
#include "parallel/flat_params.h"
#include "parallel/partition.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "runtime/device.h"

namespace ft {

// The layer math is written once here; tensor parallelism enters through parallel/
// tensor_parallel.h's layers (Megatron's column- and row-parallel linears, the vocabulary-parallel
// embedding and cross-entropy), which are the plain layers with one tensor rank. The parameters
// live in a FlatParams (parallel/flat_params.h), which ZeRO shards; the pipeline schedule drives
// the model as a PipelineStage.
// The key init_random draws tensor `name`'s elements under: a function of (seed, name) only, so
// adding a tensor never shifts the values of another. LoRA draws its A under it too.
uint64_t init_random_key(uint64_t seed, const std::string& name);

// Group g of `layout` as init_random(seed, std) draws it, whole tensors (tensor size 1), on the
// host by the CPU kernels: the same bits as any device and layout draws. ft export --merge gets a
// frozen base that was a seeded initialisation back this way (DESIGN.md §8).
// out: the group's numel floats.
void init_random_group(const ParamLayout& layout, int g, uint64_t seed, double std, float* out);

// A loss over whole rows instead of tokens (DPO: train/dpo.h). With one set, the head gives it
// the log-probability of each row's trained targets, log p(row) = Σ log softmax(logits)[target]
// over the row's masked positions, and takes back the gradient of its loss with respect to each;
// the loss is then its, not the tokens' cross-entropy. Rows stay whole in the head's chunks.
class RowObjective {
 public:
  virtual ~RowObjective() = default;
  // A micro-batch's B rows, row b the run-wide row first_row + b (StepSamples::first_sample),
  // with logp (B) and the count of trained targets of each (B). weight: forward_part's
  // token_weight. Fills dlogp (B) = weight · d loss / d logp(row), or leaves it alone when null
  // (a pass without backward). Returns the loss summed over its units (pairs), unweighted.
  virtual double rows(const double* logp, const double* targets, int B, uint64_t first_row,
                      float weight, double* dlogp) = 0;
};

class LlamaModel final : public PipelineStage {
 public:
  // tensor_comm: the tensor-parallel group (Megatron layers, DESIGN.md §3); null = no tensor
  // parallelism. Parameters are then this tensor rank's slices (layout().tensor() > 1).
  // stage: the layers (and ends) this rank holds; parameter groups it does not hold are empty.
  // compute_dtype: the precision policy's compute dtype (DESIGN.md §5 training.precision):
  // activations and the compute copy of the parameters; weight gradients stay fp32.
  // converters: their layout halves run on the layout before the parameters are allocated
  // (model/converter.h); their model halves are the caller's to run once the weights are in.
  // sink: FlatParams' (parallel.offload_params: the groups stream into ZeRO-3's host shards).
  LlamaModel(const ModelConfig& cfg, Device* dev, bool activation_checkpointing = false,
             Communicator* tensor_comm = nullptr, StageSpec stage = {},
             DType compute_dtype = DType::kF32, const ModelConverters* converters = nullptr,
             GroupSink* sink = nullptr);
  ~LlamaModel() override;

  const ModelConfig& config() const { return cfg_; }
  Device* device() const { return dev_; }
  const ParamLayout& layout() const { return layout_; }
  DType compute_dtype() const override { return flat_.compute_dtype(); }
  // The parameters, their gradients and compute copy, one flat buffer per layout group.
  FlatParams& flat_params() { return flat_; }
  const FlatParams& flat_params() const { return flat_; }
  size_t num_params() const { return layout_.total_numel(); }

  // The adapters' hooks on the linear layers (model/linear.h), set by a model converter's model
  // half; null: none. Kept by pointer: they outlive the model's use of them.
  void set_linear_hooks(const LinearHooks* hooks);
  const LinearHooks* linear_hooks() const { return hooks_; }

  // Seeded initialisation: matrices ~ N(0, std²), norm weights = 1 (as HF's _init_weights),
  // drawn on the device (the random_normal op); the bits depend on (seed, tensor name, element
  // index in the whole tensor) only, so every device, thread count and parallel layout gets the
  // same model; a tensor rank or pipeline stage draws only the slices and groups it holds.
  void init_random(uint64_t seed, double std);

  // Forward and backward on one micro-batch. inputs/targets/mask: (B, T) host arrays, copied to
  // the device. dlogits are scaled by token_weight (1 / trained tokens of the whole global batch
  // gives the token-weighted mean). The SUM of per-token losses over masked targets accumulates
  // on the device (take_loss_sum). Gradients accumulate. seg: (B, T) host segment ids of packed
  // samples (PipelineStage::forward_part), or null.
  void forward_backward(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                        int T, float token_weight, const int32_t* seg = nullptr);
  // Forward only (evaluation); the summed loss accumulates as above.
  void forward_loss(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                    int T, const int32_t* seg = nullptr);

  // PipelineStage (parallel/pipeline.h): one micro-batch in two halves, several in flight, each
  // in its own activation slot.
  int hidden_size() const override { return cfg_.dim; }
  void forward_part(int slot, const int32_t* inputs, CRef x_in, const int32_t* targets,
                    const uint8_t* mask, int B, int T, float token_weight, bool backward,
                    const int32_t* seg, uint64_t first_sample = 0) override;
  void backward_part(int slot, CRef dy_in) override;
  // forward_part and backward_part in slot 0; with FT_CUDA_GRAPHS=1 where graph_eligible, the
  // device part is recorded as a graph at the second micro-batch of a shape and replayed after
  // (and on a pipeline stage without ZeRO's hooks, each half of a training micro-batch: a graph
  // per activation slot and half).
  void train_micro_batch(const int32_t* inputs, const int32_t* targets, const uint8_t* mask, int B,
                         int T, float token_weight, const int32_t* seg,
                         uint64_t first_sample) override;
  CRef stage_output(int slot) const override;  // (B·T, C) in the compute dtype
  CRef input_grad() const override;
  double take_loss_sum() override;

  const StageSpec& stage() const { return stage_; }
  int tensor_rank() const { return tp_.rank(); }
  // Whether this model may record its whole training micro-batches, with ZeRO's hooks, as graphs
  // (FT_CUDA_GRAPHS=1, one pipeline stage, tensor ranks over NCCL, no FT_PROFILE): what does not
  // change during a run of graph_eligible (the hooks keep the buffers graphs need only then:
  // ZeroOptions::graphs).
  bool may_record_graphs() const;
  bool owns_group(int g) const;

  // The head (the final norm's output → lm_head → cross-entropy → dlogits → the head's backward)
  // runs over chunks of this many tokens of a micro-batch (training.loss_chunk_tokens, DESIGN.md
  // §3 "The head in chunks"); 0, or a micro-batch no larger: one chunk. Before the first forward
  // or after (the activation slots are made again). A model made here runs one chunk; the
  // trainer's setup sets the recipe's value.
  void set_loss_chunk_tokens(int tokens);

  // The loss over rows (RowObjective above), or null for the token cross-entropy. Kept by
  // pointer; set before the first forward or after (the activation slots are made again).
  void set_row_objective(RowObjective* objective);
  // Runs the adapters' hooks, or not (false: the frozen base alone, DPO's reference: base).
  void set_hooks_enabled(bool on) { hooks_enabled_ = on; }

 private:
  struct Acts;
  void ensure_acts(int slot, int B, int T, bool need_backward, bool segments);
  // Rows of logits held at once for a micro-batch of B samples of T tokens: a chunk of
  // loss_chunk_tokens_, or all N = B·T. An adapted head's chunks are whole samples (an adapter's
  // hooks see whole samples: LinearContext::first_sample, seq_len).
  int head_rows(int B, int T) const;
  // The head's weights, acquired from their groups (layout.h final_norm, output_weight: the head
  // group, the embedding's when tied, the norm's own when split off), and released.
  struct HeadWeights {
    CRef norm;  // (C)
    CRef out;   // (V / tensor, C)
  };
  HeadWeights acquire_head();
  void release_head();

  // The head with a RowObjective: each row's log-probability, the objective's gradient, then
  // the head's backward with each row's dlogits scaled by it (forward_part).
  void objective_head(CRef Wh, float* dWh, bool backward, float weight, const uint8_t* host_mask);
  // forward_part in two halves: the host's checks and the micro-batch's uploads, then the work
  // queued on the device alone (what train_micro_batch records as a graph).
  void stage_inputs(int slot, const int32_t* inputs, const int32_t* targets, const uint8_t* mask,
                    int B, int T, float token_weight, bool backward, const int32_t* seg,
                    uint64_t first_sample);
  void forward_compute(CRef x_in, bool backward, float token_weight, const uint8_t* host_mask);
  void backward_compute(int slot, CRef dy_in);  // backward_part's device work (and hooks' calls)
  bool pipelined() const { return !stage_.embed || !stage_.head; }  // one of several stages
  // Whether a training micro-batch (or a pipeline stage's half of one) may run as a recorded
  // graph: a device with graphs, one tensor rank or a tensor group whose communicator records its
  // all-reduces into graphs (NCCL), no row objective, no profile; on one stage hooks that allow
  // it (FlatParams::micro_batch_replay), on a pipeline stage no ZeRO hooks.
  // Otherwise, where the reason holds for the run, it says so once (a warning).
  bool graph_eligible();
  // Why this model's micro-batches may never be recorded, in words for the user (profile,
  // tensor ranks over MPI); empty when they may.
  std::string graphs_refusal() const;
  void layer_forward(int l, int B, int T);
  void layer_backward(int l, int B, int T);
  void copy(Ref dst, CRef src, size_t n);  // n elements of dst's dtype
  void norm_backward(Ref dx, float* dw, CRef dout, CRef x, CRef w, const float* rstd, int R, int D);
  Ops& ops() { return dev_->ops(); }
  std::vector<bool> owned_groups() const;

  ModelConfig cfg_;
  Device* dev_;
  bool ckpt_;
  TensorGroup tp_;
  int H_, K_, F_, V_;  // this tensor rank's query heads, kv heads, ffn columns, vocabulary rows
  ParamLayout layout_;
  StageSpec stage_;
  // The block's linear layers and the head, this tensor rank's parts (model/linear.h), and the
  // adapters' hooks on them (null: none).
  Linear q_proj_, k_proj_, v_proj_, o_proj_, gate_proj_, up_proj_, down_proj_, lm_head_;
  const LinearHooks* hooks_ = nullptr;
  LinearContext linear_context() const;
  VocabParallelEmbedding embed_;
  VocabParallelCrossEntropy loss_;
  // (D/2) RoPE inverse frequencies of cfg_'s rope type (model/rope.h), in device memory.
  Buffer<float> rope_inv_freq_;
  Buffer<double> loss_acc_;  // (1) the loss summed since take_loss_sum
  // (1) the token weight the cross-entropy ops read from device memory (so that a recorded graph
  // takes each micro-batch's), and the value last uploaded: uploaded again only when it changes.
  Buffer<float> token_weight_;
  float token_weight_host_ = 0.0f;
  Stream st_;
  FlatParams flat_;
  std::vector<std::unique_ptr<Acts>> slots_;
  Acts* acts_ = nullptr;  // the slot in use
  int loss_chunk_tokens_ = 0;
  RowObjective* objective_ = nullptr;
  double objective_loss_ = 0;  // the objective's loss since take_loss_sum
  bool hooks_enabled_ = true;
  // The micro-batch graphs (train_micro_batch), one for each kind of hooks' part
  // (GroupHooks::Replay kHostOnly, kCollectives: a step's last micro-batch under overlap_comm):
  // its shape, the device's graph epoch it was recorded in, and the shape last run eagerly (the
  // warm-up that makes every buffer first).
  struct MicroBatchGraph {
    struct Shape {
      int B = 0, T = 0;
      bool seg = false;  // packed documents
      bool operator==(const Shape&) const = default;
    };
    void* exec = nullptr;
    Shape shape, warm;
    uint64_t epoch = 0;
    int dequantized_after = -1;    // FlatParams::dequantized_group when the recording ended
    std::vector<int> ready_calls;  // the hooks' grads_ready calls it made (log_grads_ready)
    int recorded = 0;
    int64_t launches = 0;  // logged when the model goes
  };
  MicroBatchGraph graphs_[2];  // [0]: kHostOnly, [1]: kCollectives
  bool graph_failed_ = false;  // a recording failed: the run goes on without graphs
  bool refusal_told_ = false;  // graph_eligible's warning, once a run
  RankAgreement tp_agree_;     // a recording's, over the tensor group (where it records)
  void drop_graph(MicroBatchGraph& g);
  // A pipeline stage's halves (forward_part, backward_part): a graph per activation slot and
  // half (2·slot + half), and each slot's shape from its forward.
  std::vector<MicroBatchGraph> part_graphs_;
  std::vector<MicroBatchGraph::Shape> part_shapes_;
  MicroBatchGraph& part_graph(int slot, int half);
  // `work` (the device's part only) as g's graph: op by op the first time a shape comes, recorded
  // the second, launched after (train_micro_batch); collectives: the hooks' kCollectives kind.
  // half: a pipeline stage's forward (0) or backward (1) of `slot`, named in the recording's log
  // line; -1: a whole micro-batch.
  void run_graphed(MicroBatchGraph& g, const MicroBatchGraph::Shape& shape, bool collectives,
                   const std::function<void()>& work, int half = -1, int slot = 0);
};

}  // namespace ft
