#include "parallel/tensor_parallel.h"

#include <algorithm>

#include "core/error.h"

namespace ft {

TensorGroup::TensorGroup(Communicator* comm, Device* dev)
    : comm_(comm), dev_(dev), size_(comm ? comm->size() : 1), rank_(comm ? comm->rank() : 0) {}

void TensorGroup::all_reduce(Ref x, size_t n, float* f32) const {
  if (size_ == 1) return;
  const Stream st = dev_->stream();
  if (x.dtype == DType::kF32) {
    comm_->all_reduce(st, x, n, ReduceOp::kSum).wait_on(st);
    return;
  }
  FT_CHECK(f32, "tensor all-reduce of a ", dtype_name(x.dtype), " tensor needs fp32 scratch");
  Ops& ops = dev_->ops();
  ops.convert(st, f32, x, n);
  comm_->all_reduce(st, f32, n, ReduceOp::kSum).wait_on(st);
  ops.convert(st, x, f32, n);
}

void ColumnParallelLinear::forward(Device& dev, Ref y, CRef x, CRef W, int N) const {
  dev.ops().linear_forward(dev.stream(), y, x, W, N, in, out, /*accumulate=*/false);
}

void ColumnParallelLinear::backward(Device& dev, Ref dx, float* dW, CRef dy, CRef x, CRef W, int N,
                                    bool accumulate_dx) const {
  dev.ops().linear_backward(dev.stream(), dx, dW, dy, x, W, N, in, out, accumulate_dx);
}

void reduce_input_grad(const TensorGroup& tp, Ref dx, size_t n, float* f32) {
  tp.all_reduce(dx, n, f32);
}

void RowParallelLinear::forward_add(Device& dev, const TensorGroup& tp, Ref y, CRef r, CRef x,
                                    CRef W, int N, Ref partial, float* f32) const {
  if (tp.size() == 1) {
    dev.ops().linear_forward_residual(dev.stream(), y, r, x, W, N, in, out);
    return;
  }
  dev.ops().linear_forward(dev.stream(), partial, x, W, N, in, out, /*accumulate=*/false);
  tp.all_reduce(partial, size_t(N) * out, f32);
  add_reduced(dev, y, r, partial, N);
}

void RowParallelLinear::add_reduced(Device& dev, Ref y, CRef r, CRef partial, int N) const {
  FT_CHECK(r.dtype == y.dtype, "row-parallel residual of ", dtype_name(r.dtype), " for a ",
           dtype_name(y.dtype), " output");
  const size_t n = size_t(N) * out;
  if (r.ptr != y.ptr) dev.copy(dev.stream(), y.ptr, r.ptr, n * dtype_size(y.dtype));
  dev.ops().add(dev.stream(), y, partial, n);
}

void RowParallelLinear::backward(Device& dev, Ref dx, float* dW, CRef dy, CRef x, CRef W,
                                 int N) const {
  dev.ops().linear_backward(dev.stream(), dx, dW, dy, x, W, N, in, out, /*accumulate_dx=*/false);
}

void VocabParallelEmbedding::forward(Device& dev, const TensorGroup& tp, Ref out,
                                     const int32_t* ids, CRef table, int N, float* f32) const {
  dev.ops().embedding_forward(dev.stream(), out, ids, table, N, dim, v_begin, v_count);
  tp.all_reduce(out, size_t(N) * dim, f32);
}

void VocabParallelEmbedding::backward(Device& dev, float* dtable, const int32_t* ids, CRef dout,
                                      int N) const {
  dev.ops().embedding_backward(dev.stream(), dtable, ids, dout, N, dim, v_begin, v_count);
}

void VocabParallelCrossEntropy::forward_backward(Device& dev, const TensorGroup& tp, Ref dlogits,
                                                 CRef logits, const int32_t* targets,
                                                 const uint8_t* mask, int N, const float* scale,
                                                 double* loss_acc, Scratch s) const {
  Ops& ops = dev.ops();
  const Stream st = dev.stream();
  if (tp.size() == 1) {
    ops.cross_entropy(st, dlogits, logits, targets, mask, N, v_count, scale, loss_acc);
    return;
  }
  ops.row_max(st, s.row_max, logits, N, v_count);
  tp.comm()->all_reduce(st, s.row_max, size_t(N), ReduceOp::kMax).wait_on(st);
  ops.ce_partial(st, s.sumexp, s.target_logit, logits, targets, mask, s.row_max, N, v_count,
                 v_begin);
  tp.comm()->all_reduce(st, s.sumexp, size_t(N), ReduceOp::kSum).wait_on(st);
  tp.comm()->all_reduce(st, s.target_logit, size_t(N), ReduceOp::kSum).wait_on(st);
  ops.ce_finish(st, dlogits, logits, targets, mask, s.row_max, s.sumexp, s.target_logit, N, v_count,
                v_begin, scale, loss_acc);
}

void slice_for_tensor_rank(const std::vector<ParamGroup>& gg,
                           const std::vector<const float*>& global_params,
                           const std::vector<ParamGroup>& lg,
                           const std::vector<float*>& local_params, int t) {
  FT_CHECK(gg.size() == lg.size(), "layouts of different models");
  for (size_t g = 0; g < gg.size(); ++g) {
    if (!local_params[g]) continue;  // a group of another pipeline stage
    for (size_t i = 0; i < lg[g].entries.size(); ++i) {
      const ParamEntry& le = lg[g].entries[i];
      const float* src = global_params[g] + gg[g].entries[i].offset;
      float* dst = local_params[g] + le.offset;
      for_each_slice_run(le, t, [&](size_t whole, size_t local, size_t n) {
        std::copy(src + whole, src + whole + n, dst + local);
      });
    }
  }
}

}  // namespace ft
