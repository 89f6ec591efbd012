// LlamaModel's training micro-batch and its graphs (FT_CUDA_GRAPHS=1; DESIGN.md §2 "Graphs"):
// when a micro-batch may be recorded, the warm-up, the recording and its agreement between
// ranks, and the launches. The forward and backward they run are in llama.cpp.
#include <string>
#include <utility>
#include <vector>

#include "comm/device_comm.h"
#include "core/error.h"
#include "core/log.h"
#include "model/llama.h"

namespace ft {

std::string LlamaModel::graphs_refusal() const {
  if (dev_->profile()) return "FT_PROFILE times each op, so nothing is recorded";
  if (tp_.size() > 1 && !tp_.comm()->records_in_graphs())
    return "the tensor ranks' all-reduces over MPI are not recorded (over NCCL they are)";
  return "";
}

bool LlamaModel::may_record_graphs() const {
  return dev_->plans_graphs() && graphs_refusal().empty() && !pipelined();
}

bool LlamaModel::graph_eligible() {
  // (What graphs_refusal finds was told at start-up.)
  if (!dev_->graphs_enabled() || graph_failed_ || !graphs_refusal().empty()) return false;
  GroupHooks::NoReplay why;
  if (objective_) {
    why.reason = "training.objective dpo's micro-batches are not recorded yet";
  } else if (pipelined()) {
    if (!flat_.hooks()) return true;
    why.reason =
        "a pipeline stage's halves are not recorded with ZeRO's hooks yet (several data ranks, "
        "ZeRO stage 2-3, offload or overlap_update)";
  } else if (flat_.micro_batch_replay(&why) != GroupHooks::Replay::kNone) {
    return true;
  }
  if (why.lasting && !refusal_told_) {
    refusal_told_ = true;
    log_warn("FT_CUDA_GRAPHS=1: not every micro-batch of this run is recorded: ", why.reason);
  }
  return false;
}

void LlamaModel::drop_graph(MicroBatchGraph& g) {
  dev_->graph_destroy(g.exec);
  g.exec = nullptr;
}

// The first micro-batch of a shape runs op by op: it makes every buffer the work uses (the
// activation slot, the ops' scratch, the adapters' buffers) and measures the GEMM algorithms. The
// second is recorded and launched; later ones only launch, after the host's checks and uploads,
// until the shape changes or the device's graph epoch moves (a buffer the graph may use was
// freed), when the next micro-batch records again. Host-side state that decides what work is
// queued must be at the recording's values around each launch: QLoRA's dequantized group is.
// Hooks (ZeRO's stages 0-1 with data ranks) return the same buffers every micro-batch; their
// grads_ready calls are logged while recording, and are either bookkeeping only (kHostOnly:
// made after each launch) or also issue the step's all-reduces (kCollectives, a step's last
// micro-batch under overlap_comm: made while recording, the communicator recording the
// collectives into the graph; the host's part made again after each later launch). Each kind
// has a graph of its own. Replaying the recorded work in the same order gives the same bits as
// launching it op by op.
void LlamaModel::train_micro_batch(const int32_t* inputs, const int32_t* targets,
                                   const uint8_t* mask, int B, int T, float token_weight,
                                   const int32_t* seg, uint64_t first_sample) {
  stage_inputs(0, inputs, targets, mask, B, T, token_weight, /*backward=*/true, seg, first_sample);
  const auto work = [&] {
    forward_compute(CRef(), /*backward=*/true, token_weight, mask);
    backward_compute(0, CRef());
  };
  if (!graph_eligible()) return work();
  const bool collectives = flat_.micro_batch_replay() == GroupHooks::Replay::kCollectives;
  run_graphed(graphs_[collectives ? 1 : 0], {B, T, seg != nullptr}, collectives, work);
}

// A pipeline stage's halves of a training micro-batch (PipelineSchedule), each recorded as a
// graph of its own per activation slot, as train_micro_batch's whole micro-batch is: the
// transfers between stages stay outside (their buffers are the schedule's, the same each time),
// and so do the host's checks and uploads (stage_inputs). Without ZeRO's hooks (graph_eligible).
void LlamaModel::forward_part(int slot, const int32_t* inputs, CRef x_in, const int32_t* targets,
                              const uint8_t* mask, int B, int T, float token_weight, bool backward,
                              const int32_t* seg, uint64_t first_sample) {
  stage_inputs(slot, inputs, targets, mask, B, T, token_weight, backward, seg, first_sample);
  const auto work = [&] { forward_compute(x_in, backward, token_weight, mask); };
  if (!backward || !pipelined() || !graph_eligible()) return work();
  const MicroBatchGraph::Shape shape{B, T, seg != nullptr};
  if (part_shapes_.size() <= size_t(slot)) part_shapes_.resize(size_t(slot) + 1);
  part_shapes_[size_t(slot)] = shape;
  run_graphed(part_graph(slot, 0), shape, false, work, /*half=*/0, slot);
}

void LlamaModel::backward_part(int slot, CRef dy_in) {
  // The slot input_grad() reads after a launch too (backward_compute sets it when it runs).
  acts_ = slots_[size_t(slot)].get();
  const auto work = [&] { backward_compute(slot, dy_in); };
  if (!pipelined() || size_t(slot) >= part_shapes_.size() || !graph_eligible()) return work();
  run_graphed(part_graph(slot, 1), part_shapes_[size_t(slot)], false, work, /*half=*/1, slot);
}

LlamaModel::MicroBatchGraph& LlamaModel::part_graph(int slot, int half) {
  const size_t k = 2 * size_t(slot) + size_t(half);
  if (part_graphs_.size() <= k) part_graphs_.resize(k + 1);
  return part_graphs_[k];
}

// Runs `work` (device work only: the host's part is done) as g's graph where it is recorded,
// else op by op; see train_micro_batch above.
void LlamaModel::run_graphed(MicroBatchGraph& g, const MicroBatchGraph::Shape& shape,
                             bool collectives, const std::function<void()>& work, int half,
                             int slot) {
  GroupHooks* hooks = flat_.hooks();
  const auto launch = [&](bool recorded_now) {
    ++g.launches;
    // With tensor ranks the graph holds their all-reduces: the watchdog watches the launch
    // (through the data group where that does already: one watch a launch).
    const auto run = [&] {
      if (tp_.size() == 1 || collectives) return dev_->graph_launch(g.exec);
      tp_.comm()->watched_launch(dev_->stream(), "micro_batch_graph",
                                 [&] { dev_->graph_launch(g.exec); });
    };
    if (collectives) {
      hooks->launch_collectives(run, g.ready_calls, recorded_now);
    } else {
      run();
      flat_.make_ready_calls(g.ready_calls);
    }
    flat_.set_dequantized_group(g.dequantized_after);
  };
  // A recording after a warm-up comes at the same micro-batch on every rank (the same shapes and
  // counts); one because the epoch moved comes on this rank alone (its own allocator's frees).
  bool again = false;
  if (g.exec && (g.shape != shape || g.epoch != dev_->graph_epoch())) {
    again = g.shape == shape;
    drop_graph(g);
  }
  if (g.exec) return launch(/*recorded_now=*/false);
  if (g.warm != shape) {
    work();
    g.warm = shape;
    return;
  }
  flat_.set_dequantized_group(-1);  // the graph dequantizes whatever it uses (QLoRA)
  std::vector<int> ready_calls;
  std::string failure;
  try {
    struct Logged {  // the hooks' grads_ready calls logged while recording, however it ends
      FlatParams& flat;
      ~Logged() { flat.log_grads_ready(nullptr, false); }
    } logged{flat_};
    flat_.log_grads_ready(&ready_calls, /*make=*/collectives);
    if (collectives) hooks->begin_recording();
    g.exec = dev_->graph_record([&] {
      work();
      if (collectives) hooks->join_recorded();
    });
  } catch (const Error& e) {
    // The pass may have stopped between a quantized group's acquire and release. (Any other
    // exception ends the run; graph_record has cancelled the recording.)
    flat_.reset_quantized_holds();
    failure = e.what();
  }
  // Ranks whose collectives the graphs hold all launch them or none does (agree_recorded):
  // the data group's through the hooks, then the tensor group's, each called on every rank. A
  // recording made again on this rank alone cannot be agreed on (the others make no such call):
  // where it fails, this rank cannot go on op by op alone, and the run ends.
  const bool tp_records = tp_.size() > 1 && tp_.comm()->records_in_graphs();
  bool ok = failure.empty();
  if (again) {
    if (!ok && (tp_records || (hooks && hooks->peers_record()))) {
      if (collectives) hooks->recording_failed();
      throw Error(detail::concat(
          "FT_CUDA_GRAPHS: recording the micro-batch again (a buffer its graph used was freed) "
          "failed on this rank: ",
          failure,
          "; the other ranks launch the collectives it meets from their graphs, which this rank "
          "cannot join op by op, so the run ends (resume it with FT_CUDA_GRAPHS=0)"));
    }
  } else {
    if (hooks) ok = hooks->agree_recorded(ok);
    ok = tp_agree_.all_ok(ok);  // (none without tensor ranks that record)
  }
  if (!ok) {
    // Nothing recorded ran: the micro-batch runs op by op, and so does the rest of the run; the
    // hooks' calls made while recording are undone, and so is the host's belief about the
    // dequantized group (a recording that succeeded here left its end value; the buffer holds
    // what ran last).
    drop_graph(g);
    flat_.set_dequantized_group(-1);
    if (collectives) hooks->recording_failed();
    if (hooks) hooks->graphs_off();
    graph_failed_ = true;
    if (!failure.empty())
      log_warn(
          "FT_CUDA_GRAPHS: recording the micro-batch as a graph failed, so the run goes on "
          "without graphs: ",
          failure);
    else
      log_warn(
          "FT_CUDA_GRAPHS: recording the micro-batch as a graph failed on another rank, so the "
          "run goes on without graphs");
    return work();
  }
  g.shape = shape;
  g.epoch = dev_->graph_epoch();
  g.dequantized_after = flat_.dequantized_group();
  g.ready_calls = std::move(ready_calls);
  ++g.recorded;
  log_info("FT_CUDA_GRAPHS: micro-batch ", shape.B, "x", shape.T, shape.seg ? " (packed)" : "",
           half < 0 ? ""
                    : detail::concat(" (this stage's ", half ? "backward" : "forward", ", slot ",
                                     slot, ")"),
           collectives ? " with its all-reduces" : "", " recorded as a graph (recording ",
           g.recorded, "), replayed from here on");
  // The kHostOnly calls were only logged: made after this launch as after every other.
  launch(/*recorded_now=*/collectives);
}

}  // namespace ft
