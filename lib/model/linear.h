// The model's linear layers as its code calls them: one forward and one backward function for
// every projection (q, k, v, o, gate, up, down, the head), each call naming its site (layer,
// projection). Adapters attach through LinearHooks (lib/adapt/ implements them, a model converter
// installs them: model/converter.h); the model code knows only the site. Without hooks the calls
// are exactly the tensor-parallel layers' (parallel/tensor_parallel.h), so the bits are too.
#pragma once

#include <cstdint>

#include "parallel/tensor_parallel.h"
#include "runtime/device.h"

namespace ft {

// Hugging Face's module names: q_proj ... down_proj under model.layers.N.self_attn / .mlp, and
// lm_head.
enum class Proj : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown, kHead };
const char* proj_name(Proj p);

struct LinearSite {
  int layer = -1;  // -1: the head
  Proj proj = Proj::kQ;
};

// One linear layer: its projection, this tensor rank's sizes, and its tensor-parallel kind.
//   column-parallel (q, k, v, gate, up, the vocabulary-parallel head): the output rows are split;
//     y = x·Wᵀ is this rank's columns of the output.
//   row-parallel (o, down): the input columns are split; y = r + Σ over the tensor group of x·Wᵀ,
//     r the residual stream (y itself: y +=).
struct Linear {
  Proj proj = Proj::kQ;
  int in = 0, out = 0;
  bool row_parallel() const { return proj == Proj::kO || proj == Proj::kDown; }
};

class LinearHooks;

// Where the calls run: the device, the tensor group, the hooks (null: none) and a row layer's
// scratch for its partial sum (N·out of the compute dtype, and N·out fp32 for a 16-bit sum;
// unused with one tensor rank and no hook).
struct LinearContext {
  Device* dev = nullptr;
  const TensorGroup* tp = nullptr;
  const LinearHooks* hooks = nullptr;
  Ref tp_partial;
  float* tp_f32 = nullptr;
  // The adapters' tensors of the block being run (its attached group, ParamGroup::attached_to):
  // the compute parameters, and the fp32 gradient (null: no gradient is taken).
  CRef adapter;
  float* adapter_grad = nullptr;
  // A pass that will be differentiated (an adapter's dropout acts only then); the rows' samples
  // (N = B · seq_len rows, sample first_sample + b in rows [b · seq_len, (b + 1) · seq_len): the
  // run-wide index of StepSamples::first_sample, the same in every layout).
  bool training = false;
  uint64_t first_sample = 0;
  int seq_len = 1;
  // The micro-batch's dropout keys in device memory, laid out by the hooks (LinearHooks::
  // dropout_keys), for dropout_samples samples from first_sample; null: none staged.
  const uint64_t* dropout_keys = nullptr;
  int dropout_samples = 0;
};

// What an adapter adds to a linear layer y = x·Wᵀ: its own term of the output and of the input
// gradient, on this tensor rank's part (the layer's shape: Linear above), with its tensors from
// the context (LinearContext::adapter).
class LinearHooks {
 public:
  virtual ~LinearHooks() = default;
  // Whether the site is adapted (the others are called with no hook at all).
  virtual bool adapts(const LinearSite& site) const = 0;
  // The keys of a training micro-batch's dropout masks, which the hooks' ops read from device
  // memory (so a recorded graph takes each micro-batch's): for samples first_sample ..
  // first_sample + B − 1 of a model of n_layers blocks, in the hooks' own layout. The model
  // uploads them before the micro-batch's work and passes them as LinearContext::dropout_keys.
  // dropout_keys writes dropout_key_count(B, n_layers) of them (0: the hooks draw nothing).
  virtual size_t dropout_key_count(int /*B*/, int /*n_layers*/) const { return 0; }
  virtual void dropout_keys(uint64_t /*first_sample*/, int /*B*/, int /*n_layers*/,
                            uint64_t* /*keys*/) const {}
  // y (N, out) += the adapter's output for x (N, in). For a row-parallel layer y is this rank's
  // partial sum, before the tensor all-reduce.
  virtual void forward(const LinearContext& c, const Linear& l, int layer, Ref y, CRef x,
                       int N) const = 0;
  // dx (N, in) += the adapter's input gradient for dy (N, out), before any tensor reduction of
  // dx; the adapter's own weight gradients accumulate into c.adapter_grad.
  virtual void backward(const LinearContext& c, const Linear& l, int layer, Ref dx, CRef dy, CRef x,
                        int N) const = 0;
};

// Column: y = x·Wᵀ (+ the adapter's term). Row: y = r + Σ_tensor (x·Wᵀ (+ the adapter's term)),
// r (N, out) the `residual` (disjoint from y), or y itself when it is null (y +=); with one tensor
// rank the GEMM adds r (linear_forward_residual), so no copy of it precedes the call. A column
// layer takes no residual.
void linear_forward(const LinearContext& c, const Linear& l, int layer, Ref y, CRef x, CRef W,
                    int N, CRef residual = CRef());
// dx = dy·W (+= with accumulate_dx) plus the adapter's term; dW += dyᵀ·x in fp32 unless null (a
// frozen weight). dx is this rank's partial sum for a column layer (the caller reduces it over
// the tensor group: reduce_input_grad) and this rank's columns for a row layer.
void linear_backward(const LinearContext& c, const Linear& l, int layer, Ref dx, float* dW, CRef dy,
                     CRef x, CRef W, int N, bool accumulate_dx);

}  // namespace ft
