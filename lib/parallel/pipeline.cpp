#include "parallel/pipeline.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/partition.h"

namespace ft {
namespace {

// The segment ids of the micro-batch at element offset `off`, or null when not packed.
const int32_t* segments(const StepSamples& b, size_t off) {
  return b.seg.empty() ? nullptr : b.seg.data() + off;
}

}  // namespace

PipelineSchedule::PipelineSchedule(PipelineStage& model, Communicator* pipe, Device* dev)
    : model_(model), pipe_(pipe), dev_(dev) {
  if (pipe_) {
    p_ = pipe_->rank();
    P_ = pipe_->size();
  }
}

// Tags: 2i for micro-batch i's activations (forward), 2i + 1 for its gradient (backward). NCCL
// matches by order instead; the schedule below makes both ends' calls in the same order.

void PipelineSchedule::recv(int tag, int peer, size_t n) {
  const Stream st = dev_->stream();
  pipe_->recv(st, recv_buf_.data(), n, peer, tag).wait_on(st);
}

size_t PipelineSchedule::fill_send_buffer(size_t k, CRef src, size_t n) {
  const Stream st = dev_->stream();
  sending_[k].wait_on(st);  // the buffer's previous send
  const Ref out = send_bufs_[k].data();
  dev_->copy(st, out.ptr, src.ptr, n * dtype_size(out.dtype));
  return k;
}

void PipelineSchedule::run_forward(const StepSamples& b, int i, int micro, float token_weight,
                                   bool backward) {
  const size_t off = size_t(i) * micro * b.seq_len;
  model_.forward_part(slot(i), b.inputs.data() + off, recv_buf_.data(), b.targets.data() + off,
                      b.mask.data() + off, micro, b.seq_len, token_weight, backward,
                      segments(b, off), b.first_sample + uint64_t(i) * uint64_t(micro));
}

void PipelineSchedule::send_output(int i, size_t n) {
  const size_t k = fill_send_buffer(size_t(i) % send_bufs_.size(), model_.stage_output(slot(i)), n);
  sending_[k] = pipe_->send(dev_->stream(), send_bufs_[k].data(), n, p_ + 1, 2 * i);
}

void PipelineSchedule::send_input_grad(int j, size_t n) {
  const size_t k = fill_send_buffer(size_t(j), model_.input_grad(), n);
  sending_[k] = pipe_->send(dev_->stream(), send_bufs_[k].data(), n, p_ - 1, 2 * j + 1);
}

// After forward i: its output to the next stage, and micro-batch j's output gradient from it.
void PipelineSchedule::send_output_recv_grad(int i, int j, size_t n) {
  if (p_ == P_ - 1) return;
  const Stream st = dev_->stream();
  const size_t k = fill_send_buffer(size_t(i) % send_bufs_.size(), model_.stage_output(slot(i)), n);
  pipe_
      ->send_recv(st, send_bufs_[k].data(), n, p_ + 1, recv_buf_.data(), n, p_ + 1, 2 * i,
                  2 * j + 1)
      .wait_on(st);
}

// After backward j: its input gradient to the previous stage, and the input of forward i (if
// i < M) from it.
void PipelineSchedule::send_grad_recv_input(int j, int i, int M, size_t n) {
  if (p_ == 0) return;
  if (i >= M) return send_input_grad(j, n);
  const Stream st = dev_->stream();
  const size_t k = fill_send_buffer(size_t(j), model_.input_grad(), n);
  pipe_
      ->send_recv(st, send_bufs_[k].data(), n, p_ - 1, recv_buf_.data(), n, p_ - 1, 2 * j + 1,
                  2 * i)
      .wait_on(st);
}

void PipelineSchedule::wait_sends() {
  for (CommWork& w : sending_) w.wait();
}

void PipelineSchedule::ensure_buffers(size_t n, size_t count) {
  const DType t = model_.compute_dtype();
  const MemoryScope tag(MemoryCategory::kCommunication);
  if (recv_buf_.size() != n) recv_buf_ = DBuffer(dev_, t, n);
  if (send_bufs_.size() != count || send_bufs_[0].size() != n) {
    wait_sends();
    send_bufs_.clear();
    for (size_t i = 0; i < count; ++i) send_bufs_.emplace_back(dev_, t, n);
    sending_.clear();
    sending_.resize(count);
  }
}

double PipelineSchedule::train_step(const StepSamples& b, int micro, float token_weight) {
  const int M = b.count / micro, T = b.seq_len;
  if (P_ == 1) {
    slots_ = 1;
    for (int i = 0; i < M; ++i) {
      const size_t off = size_t(i) * micro * T;
      model_.train_micro_batch(b.inputs.data() + off, b.targets.data() + off, b.mask.data() + off,
                               micro, T, token_weight, segments(b, off),
                               b.first_sample + uint64_t(i) * uint64_t(micro));
    }
    return model_.take_loss_sum();
  }
  const size_t n = size_t(micro) * T * size_t(model_.hidden_size());
  ensure_buffers(n, size_t(M));
  const int warmup = std::min(P_ - p_ - 1, M);
  slots_ = std::min(warmup + 1, M);  // micro-batch i takes slot i mod slots_
  // Megatron-LM's 1F1B (schedules.py): in the steady state a stage's output goes out with the
  // receive of a gradient, and its input gradient with the receive of the next input, each pair
  // as one call, matched by the neighbour's pair of the same point: so transfers that wait for
  // their receiver (NCCL's) cannot wait on each other.
  for (int i = 0; i < warmup; ++i) {
    if (p_ > 0) recv(2 * i, p_ - 1, n);
    run_forward(b, i, micro, token_weight, true);
    send_output(i, n);
  }
  if (warmup < M && p_ > 0) recv(2 * warmup, p_ - 1, n);
  for (int j = 0; j < M - warmup; ++j) {
    const int i = warmup + j;
    run_forward(b, i, micro, token_weight, true);
    send_output_recv_grad(i, j, n);
    model_.backward_part(slot(j), recv_buf_.data());
    send_grad_recv_input(j, i + 1, M, n);
  }
  for (int j = M - warmup; j < M; ++j) {
    if (p_ < P_ - 1) recv(2 * j + 1, p_ + 1, n);
    model_.backward_part(slot(j), recv_buf_.data());
    if (p_ > 0) send_input_grad(j, n);
  }
  wait_sends();
  return model_.take_loss_sum();
}

double PipelineSchedule::eval_batch(const StepSamples& b, int micro) {
  const int M = b.count / micro, T = b.seq_len;
  if (P_ == 1) {
    for (int i = 0; i < M; ++i) {
      const size_t off = size_t(i) * micro * T;
      model_.forward_part(0, b.inputs.data() + off, CRef(), b.targets.data() + off,
                          b.mask.data() + off, micro, T, 0.0f, /*backward=*/false, segments(b, off),
                          b.first_sample + uint64_t(i) * uint64_t(micro));
    }
    return model_.take_loss_sum();
  }
  // Forward only needs one send buffer; keep the training step's if they are there.
  ensure_buffers(size_t(micro) * T * size_t(model_.hidden_size()),
                 std::max<size_t>(1, send_bufs_.size()));
  // Forward only: one micro-batch at a time, so the step's buffers serve (each send completes
  // before the buffer is reused; the next stage is already waiting for it).
  slots_ = 1;
  const size_t n = size_t(micro) * T * size_t(model_.hidden_size());
  for (int i = 0; i < M; ++i) {
    if (p_ > 0) recv(2 * i, p_ - 1, n);
    run_forward(b, i, micro, 0.0f, false);
    if (p_ < P_ - 1) send_output(i, n);
    wait_sends();
  }
  return model_.take_loss_sum();
}

}  // namespace ft
