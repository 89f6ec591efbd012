// Finding the first non-finite gradient (ZeroSharding::first_nonfinite_grad, which names the
// tensor in the error of a step with a NaN gradient norm), a ZeRO gradient reported complete too
// often or (stages 2-3) never, and the rounded times people read (Progress::human_seconds).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "comm/communicator.h"
#include "model/llama.h"
#include "parallel/zero.h"
#include "runtime/device.h"
#include "tiny_model.h"
#include "train/metrics.h"

namespace ft {
namespace {

// The layout-wide index (groups, then entries) of tensor `name`.
int64_t entry_index(const ParamLayout& layout, const std::string& name) {
  int64_t i = 0;
  for (const auto& g : layout.groups())
    for (const auto& e : g.entries) {
      if (e.name == name) return i;
      ++i;
    }
  return -1;
}

}  // namespace

TEST_CASE("first_nonfinite_grad names the first tensor in layout order, at every ZeRO stage") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    auto dev = make_device("cpu");
    auto comm = make_single_process_communicator();
    LlamaModel model(tiny_model_config(), dev.get());
    ZeroSharding zero(stage, model.flat_params(), *comm, dev.get());
    const ParamLayout& layout = model.layout();
    zero.begin_step(1);
    zero.finish_backward();
    CHECK(zero.first_nonfinite_grad() == -1);  // all zero

    // inf in the last element of layers.1's down projection, NaN in the middle of layers.0's
    // k projection: the earlier one in layout order wins whatever the element order.
    int g = 0;
    const ParamEntry* down = nullptr;
    const ParamEntry* wk = nullptr;
    REQUIRE(layout.find("model.layers.1.mlp.down_proj.weight", &g, &down));
    float* grads1 = stage >= 2 ? zero.grads(g) : model.flat_params().grads()[size_t(g)].data();
    grads1[down->offset + down->numel - 1] = inf;
    if (stage >= 2) zero.grads_ready(g);
    zero.finish_backward();
    CHECK(zero.first_nonfinite_grad() == entry_index(layout, down->name));

    REQUIRE(layout.find("model.layers.0.self_attn.k_proj.weight", &g, &wk));
    float* grads0 = stage >= 2 ? zero.grads(g) : model.flat_params().grads()[size_t(g)].data();
    grads0[wk->offset + wk->numel / 2] = nan;
    if (stage >= 2) zero.grads_ready(g);
    zero.finish_backward();
    CHECK(zero.first_nonfinite_grad() == entry_index(layout, wk->name));

    // A fresh step is clean again; the test hook poisons the first element of the first group.
    zero.begin_step(1);
    CHECK(zero.first_nonfinite_grad() == -1);
    zero.inject_nan_grad_for_test();  // before the backward, which ends with the embedding
    if (stage >= 2) {
      zero.grads(0);
      zero.grads_ready(0);
    }
    zero.finish_backward();
    CHECK(zero.first_nonfinite_grad() == 0);  // the embedding, the layout's first tensor
    CHECK(std::isnan(zero.grad_sum_squares()));
  }
}

// ZeRO 2/3 reduce-scatter a group's gradient when the backward reports it complete; one computed
// and never reported would be lost, so the step refuses to go on.
TEST_CASE("finish_backward refuses a ZeRO 2/3 gradient never reported complete") {
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    auto dev = make_device("cpu");
    auto comm = make_single_process_communicator();
    LlamaModel model(tiny_model_config(), dev.get());
    ZeroSharding zero(stage, model.flat_params(), *comm, dev.get());
    zero.begin_step(1);
    zero.grads(0);
    zero.grads_ready(0);
    zero.grads(1);  // computed, never reported
    CHECK_THROWS_WITH(zero.finish_backward(),
                      doctest::Contains("group 1's gradient was computed but never reported"));
  }
}

// A report more than the step's micro-batches would have reduced a partial gradient early (at
// stages 0-1 with data ranks and overlap_comm), at any stage: refused.
TEST_CASE("grads_ready refuses a gradient reported complete more often than the micro-batches") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    auto dev = make_device("cpu");
    auto comm = make_single_process_communicator();
    LlamaModel model(tiny_model_config(), dev.get());
    ZeroSharding zero(stage, model.flat_params(), *comm, dev.get());
    zero.begin_step(2);
    for (int mb = 0; mb < 2; ++mb) {
      zero.grads(0);
      zero.grads_ready(0);
    }
    zero.grads(0);
    CHECK_THROWS_WITH(zero.grads_ready(0),
                      doctest::Contains("reported complete 3 times in a step of 2 micro-batches"));
  }
}

TEST_CASE("human_seconds rounds times for people") {
  CHECK(Progress::human_seconds(0.0147033) == "0.015 s");
  CHECK(Progress::human_seconds(0.0) == "0.000 s");
  CHECK(Progress::human_seconds(0.9994) == "0.999 s");
  CHECK(Progress::human_seconds(0.9996) == "1.00 s");  // not "1.000 s"
  CHECK(Progress::human_seconds(2.1874) == "2.19 s");
  CHECK(Progress::human_seconds(9.996) == "10.0 s");
  CHECK(Progress::human_seconds(42.46) == "42.5 s");
  CHECK(Progress::human_seconds(59.96) == "1 min 00 s");
  CHECK(Progress::human_seconds(65.2) == "1 min 05 s");
  CHECK(Progress::human_seconds(3599.4) == "59 min 59 s");
  CHECK(Progress::human_seconds(3599.6) == "1 h 00 min");
  CHECK(Progress::human_seconds(7380) == "2 h 03 min");
  CHECK(Progress::human_seconds(-1) == "?");
  CHECK(Progress::human_seconds(std::numeric_limits<double>::quiet_NaN()) == "?");
}

}  // namespace ft
