// Tensor parallelism as Megatron-LM defines it (Shoeybi et al., "Megatron-LM: Training
// Multi-Billion Parameter Language Models Using Model Parallelism", 2019, §3). A layer's weight is
// split over the T ranks of the tensor group, and two conjugate operators keep the result equal to
// the unsplit layer's:
//   f: identity in forward, all-reduce (sum) of the gradient in backward: in front of a
//      column-parallel layer, whose ranks each see the whole input but produce a slice of the
//      output, so each holds only a partial sum of the input's gradient;
//   g: all-reduce (sum) in forward, identity in backward: behind a row-parallel layer, whose ranks
//      each see a slice of the input and so produce a partial sum of the output.
// The Llama block is f → column(q, k, v) → attention on H/T heads → row(o) → g, then
// f → column(gate, up) → SwiGLU → row(down) → g; the embedding and the lm_head split the
// vocabulary (§3's "input embedding" and "parallel cross-entropy"), so no rank ever holds logits
// of the whole vocabulary.
//
// HF stores a linear layer's W as (out, in), y = x·Wᵀ: a column-parallel layer (Megatron's A split
// by columns) splits W's rows, a row-parallel one W's columns (TensorSplit, flat_params.h).
// Activations in the compute dtype; a 16-bit tensor is all-reduced in fp32 (converted, summed,
// rounded once), DESIGN.md §5. With one tensor rank every operator is the plain layer and
// communicates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "parallel/flat_params.h"
#include "runtime/device.h"

namespace ft {

// The tensor group, as the layers below use it.
class TensorGroup {
 public:
  // comm: the tensor group (the mesh's tensor_comm); null: one rank.
  TensorGroup(Communicator* comm, Device* dev);
  int size() const { return size_; }
  int rank() const { return rank_; }
  Communicator* comm() const { return comm_; }
  // Σ over the group, in place: n elements of x's dtype. A 16-bit x is summed in fp32 through
  // f32 (n floats of scratch) and rounded once. Nothing with one rank.
  void all_reduce(Ref x, size_t n, float* f32) const;

 private:
  Communicator* comm_;
  Device* dev_;
  int size_ = 1, rank_ = 0;
};

// Column-parallel linear: W (out/T, in), this rank's output rows. Forward (f is the identity):
// y = x·Wᵀ, this rank's columns of the output. Backward: dW += dyᵀ·x, and dx (+)= dy·W, this
// rank's partial sum of the input gradient; the layers reading the same input (q, k and v; gate
// and up; the lm_head alone) add their partials into one buffer, then reduce_input_grad, f's
// backward, sums it over the group once.
struct ColumnParallelLinear {
  int in = 0, out = 0;  // out: this rank's rows (the whole layer's out / T)
  void forward(Device& dev, Ref y, CRef x, CRef W, int N) const;
  void backward(Device& dev, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N,
                bool accumulate_dx) const;
};
// f's backward: dx (n elements) summed over the tensor group.
void reduce_input_grad(const TensorGroup& tp, Ref dx, size_t n, float* f32);

// Row-parallel linear: W (out, in/T), this rank's input columns. Forward: y = r + g(x·Wᵀ), r the
// residual (N, out), y itself or disjoint from it; the partial products summed over the group
// (through `partial`, (N, out), when T > 1, then added to r copied into y; with one rank the GEMM
// adds r itself: linear_forward_residual). Backward (g is the identity): dx = dy·W (this rank's
// input columns), dW += dyᵀ·x.
struct RowParallelLinear {
  int in = 0, out = 0;  // in: this rank's columns (the whole layer's in / T)
  void forward_add(Device& dev, const TensorGroup& tp, Ref y, CRef r, CRef x, CRef W, int N,
                   Ref partial, float* f32) const;
  // y = r + partial (N, out), the reduced partial sum: r copied into y unless it is y, then added.
  void add_reduced(Device& dev, Ref y, CRef r, CRef partial, int N) const;
  void backward(Device& dev, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N) const;
};

// Vocabulary-parallel embedding: this rank holds rows [v_begin, v_begin + v_count) of the table.
// Forward: each rank looks up the ids in its rows (zeros for the others), and g sums the rows over
// the group. Backward: each rank adds the gradient into its own rows.
struct VocabParallelEmbedding {
  int dim = 0, v_begin = 0, v_count = 0;
  void forward(Device& dev, const TensorGroup& tp, Ref out, const int32_t* ids, CRef table, int N,
               float* f32) const;
  void backward(Device& dev, float* dtable, const int32_t* ids, CRef dout, int N) const;
};

// Vocabulary-parallel cross-entropy (Megatron §3): the logits of this rank's vocabulary columns,
// (N, v_count). With T > 1 the softmax's statistics are reduced over the group instead of the
// logits: the row max (all-reduce max), then Σ exp(l − max) and the target's logit (all-reduce
// sums), so each rank forms its own columns of dlogits = scale·(softmax − onehot) and the loss.
struct VocabParallelCrossEntropy {
  int v_begin = 0, v_count = 0;
  // The statistics' buffers, (N) each: the row max (fp32), the sum of exponentials and the
  // target's logit (double). Unused with one rank.
  struct Scratch {
    float* row_max = nullptr;
    double* sumexp = nullptr;
    double* target_logit = nullptr;
  };
  // *loss_acc += Σ loss over masked rows; dlogits (may alias logits, may be null: no backward);
  // scale: one fp32 in device memory, null only without dlogits (runtime/op_list.h).
  void forward_backward(Device& dev, const TensorGroup& tp, Ref dlogits, CRef logits,
                        const int32_t* targets, const uint8_t* mask, int N, const float* scale,
                        double* loss_acc, Scratch scratch) const;
};

// Copies tensor rank t's slices of a whole model's groups (`global`, laid out for one tensor
// rank) into the groups of `local` (the same model laid out for T ranks), by each tensor's
// TensorSplit. Groups whose local pointer is null (another pipeline stage's) are skipped.
void slice_for_tensor_rank(const std::vector<ParamGroup>& global,
                           const std::vector<const float*>& global_params,
                           const std::vector<ParamGroup>& local,
                           const std::vector<float*>& local_params, int t);

}  // namespace ft
