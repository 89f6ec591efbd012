#include "parallel/pipeline.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/partition.h"

namespace ft {

PipelineSchedule::PipelineSchedule(PipelineStage& model, Communicator* pipe, Device* dev)
    : model_(model), pipe_(pipe), dev_(dev) {
  if (pipe_) {
    p_ = pipe_->rank();
    P_ = pipe_->size();
  }
}

// Tags: 2i for micro-batch i's activations (forward), 2i + 1 for its gradient (backward).
void PipelineSchedule::forward(const StepSamples& b, int i, int micro, float token_weight,
                               bool backward) {
  const int T = b.seq_len;
  const size_t n = size_t(micro) * T * size_t(model_.hidden_size());
  const size_t off = size_t(i) * micro * T;
  const Stream st = dev_->stream();
  if (p_ > 0) pipe_->recv(st, recv_buf_.data(), n, p_ - 1, 2 * i).wait_on(st);
  model_.forward_part(slot(i), b.inputs.data() + off, recv_buf_.data(), b.targets.data() + off,
                      b.mask.data() + off, micro, T, token_weight, backward);
  if (p_ < P_ - 1) {
    const size_t k = size_t(i) % send_bufs_.size();
    sending_[k].wait_on(st);  // its previous send
    const Ref out = send_bufs_[k].data();
    dev_->copy(st, out.ptr, model_.stage_output(slot(i)).ptr, n * dtype_size(out.dtype));
    send(k, n, p_ + 1, 2 * i);
  }
}

void PipelineSchedule::backward(int i, int micro, int T) {
  const size_t n = size_t(micro) * T * size_t(model_.hidden_size());
  const Stream st = dev_->stream();
  if (p_ < P_ - 1) pipe_->recv(st, recv_buf_.data(), n, p_ + 1, 2 * i + 1).wait_on(st);
  model_.backward_part(slot(i), recv_buf_.data());
  if (p_ > 0) {
    const size_t k = size_t(i);
    sending_[k].wait_on(st);  // micro-batch i's activations, sent forward
    const Ref out = send_bufs_[k].data();
    dev_->copy(st, out.ptr, model_.input_grad().ptr, n * dtype_size(out.dtype));
    send(k, n, p_ - 1, 2 * i + 1);
  }
}

void PipelineSchedule::send(size_t k, size_t n, int peer, int tag) {
  const Stream st = dev_->stream();
  sending_[k] = pipe_->send(st, send_bufs_[k].data(), n, peer, tag);
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
      model_.forward_part(0, b.inputs.data() + off, CRef(), b.targets.data() + off,
                          b.mask.data() + off, micro, T, token_weight, /*backward=*/true);
      model_.backward_part(0, CRef());
    }
    return model_.take_loss_sum();
  }
  ensure_buffers(size_t(micro) * T * size_t(model_.hidden_size()), size_t(M));
  const int warmup = std::min(P_ - p_ - 1, M);
  slots_ = std::min(warmup + 1, M);  // micro-batch i takes slot i mod slots_
  for (int i = 0; i < warmup; ++i) forward(b, i, micro, token_weight, true);
  for (int j = 0; j < M - warmup; ++j) {
    forward(b, warmup + j, micro, token_weight, true);
    backward(j, micro, T);
  }
  for (int j = M - warmup; j < M; ++j) backward(j, micro, T);
  wait_sends();
  return model_.take_loss_sum();
}

double PipelineSchedule::eval_batch(const StepSamples& b, int micro) {
  const int M = b.count / micro, T = b.seq_len;
  if (P_ == 1) {
    for (int i = 0; i < M; ++i) {
      const size_t off = size_t(i) * micro * T;
      model_.forward_part(0, b.inputs.data() + off, CRef(), b.targets.data() + off,
                          b.mask.data() + off, micro, T, 0.0f, /*backward=*/false);
    }
    return model_.take_loss_sum();
  }
  // Forward only needs one send buffer; keep the training step's if they are there.
  ensure_buffers(size_t(micro) * T * size_t(model_.hidden_size()),
                 std::max<size_t>(1, send_bufs_.size()));
  // Forward only: one micro-batch at a time, so the step's buffers serve (each send completes
  // before the buffer is reused; the next stage is already waiting for it).
  slots_ = 1;
  for (int i = 0; i < M; ++i) {
    forward(b, i, micro, 0.0f, false);
    wait_sends();
  }
  return model_.take_loss_sum();
}

}  // namespace ft
