#include "model/linear.h"

#include "core/error.h"

namespace ft {

const char* proj_name(Proj p) {
  switch (p) {
    case Proj::kQ:
      return "q_proj";
    case Proj::kK:
      return "k_proj";
    case Proj::kV:
      return "v_proj";
    case Proj::kO:
      return "o_proj";
    case Proj::kGate:
      return "gate_proj";
    case Proj::kUp:
      return "up_proj";
    case Proj::kDown:
      return "down_proj";
    case Proj::kHead:
      return "lm_head";
  }
  return "?";
}

void linear_forward(const LinearContext& c, const Linear& l, int layer, Ref y, CRef x, CRef W,
                    int N, CRef residual) {
  const LinearSite site{layer, l.proj};
  const LinearHooks* hook = c.hooks && c.hooks->adapts(site) ? c.hooks : nullptr;
  if (!l.row_parallel()) {
    FT_CHECK(!residual.ptr, proj_name(l.proj), ": a column-parallel layer takes no residual");
    ColumnParallelLinear{l.in, l.out}.forward(*c.dev, y, x, W, N);
    if (hook) hook->forward(c, l, layer, y, x, N);
    return;
  }
  const CRef r = residual.ptr ? residual : CRef(y);
  const RowParallelLinear row{l.in, l.out};
  if (!hook) {
    row.forward_add(*c.dev, *c.tp, y, r, x, W, N, c.tp_partial, c.tp_f32);
    return;
  }
  // The adapter's term joins this rank's partial sum before the all-reduce.
  Ops& ops = c.dev->ops();
  const Stream st = c.dev->stream();
  if (c.tp->size() == 1) {
    ops.linear_forward_residual(st, y, r, x, W, N, l.in, l.out);
    hook->forward(c, l, layer, y, x, N);
    return;
  }
  ops.linear_forward(st, c.tp_partial, x, W, N, l.in, l.out, /*accumulate=*/false);
  hook->forward(c, l, layer, c.tp_partial, x, N);
  c.tp->all_reduce(c.tp_partial, size_t(N) * l.out, c.tp_f32);
  row.add_reduced(*c.dev, y, r, c.tp_partial, N);
}

void linear_backward(const LinearContext& c, const Linear& l, int layer, Ref dx, float* dW, CRef dy,
                     CRef x, CRef W, int N, bool accumulate_dx) {
  FT_CHECK(!(l.row_parallel() && accumulate_dx), proj_name(l.proj),
           ": a row-parallel layer's input gradient is never accumulated");
  if (l.row_parallel())
    RowParallelLinear{l.in, l.out}.backward(*c.dev, dx, dW, dy, x, W, N);  // dx = dy·W
  else
    ColumnParallelLinear{l.in, l.out}.backward(*c.dev, dx, dW, dy, x, W, N, accumulate_dx);
  const LinearSite site{layer, l.proj};
  if (c.hooks && c.hooks->adapts(site)) c.hooks->backward(c, l, layer, dx, dy, x, N);
}

}  // namespace ft
