#include "parallel/pipeline.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/partition.h"

namespace ft {

StageSpec pipeline_stage(int L, int p, int P) {
  const LayerRange layers = stage_layers(L, p, P);
  StageSpec s;
  s.first_layer = layers.first;
  s.last_layer = layers.last;
  s.embed = p == 0;
  s.head = p == P - 1;
  return s;
}

PipelineSchedule::PipelineSchedule(LlamaModel& model, Communicator* pipe, Device* dev)
    : model_(model), pipe_(pipe), dev_(dev) {
  if (pipe_) {
    p_ = pipe_->rank();
    P_ = pipe_->size();
  }
}

// Tags: 2i for micro-batch i's activations (forward), 2i + 1 for its gradient (backward).
void PipelineSchedule::forward(const StepSamples& b, int i, int micro, float token_weight,
                               bool backward, double* loss) {
  const int T = b.seq_len;
  const size_t n = size_t(micro) * T * size_t(model_.config().dim);
  const size_t off = size_t(i) * micro * T;
  if (p_ > 0) pipe_->recv(recv_buf_.data(), n, p_ - 1, 2 * i);
  *loss += model_.forward_part(slot(i), b.inputs.data() + off, recv_buf_.data(),
                               b.targets.data() + off, b.mask.data() + off, micro, T,
                               token_weight, backward);
  if (p_ < P_ - 1) {
    float* out = send_bufs_[size_t(i) % send_bufs_.size()].data();
    std::memcpy(out, model_.stage_output(slot(i)), n * sizeof(float));
    pipe_->send(out, n, p_ + 1, 2 * i);
  }
}

void PipelineSchedule::backward(int i, int micro, int T) {
  const size_t n = size_t(micro) * T * size_t(model_.config().dim);
  if (p_ < P_ - 1) pipe_->recv(recv_buf_.data(), n, p_ + 1, 2 * i + 1);
  model_.backward_part(slot(i), recv_buf_.data());
  if (p_ > 0) {
    float* out = send_bufs_[size_t(i)].data();
    std::memcpy(out, model_.input_grad(), n * sizeof(float));
    pipe_->send(out, n, p_ - 1, 2 * i + 1);
  }
}

double PipelineSchedule::train_step(const StepSamples& b, int micro, float token_weight) {
  const int M = b.count / micro, T = b.seq_len;
  double loss = 0;
  if (P_ == 1) {
    slots_ = 1;
    for (int i = 0; i < M; ++i) {
      const size_t off = size_t(i) * micro * T;
      loss += model_.forward_backward(b.inputs.data() + off, b.targets.data() + off,
                                      b.mask.data() + off, micro, T, token_weight);
    }
    return loss;
  }
  const size_t n = size_t(micro) * T * size_t(model_.config().dim);
  if (recv_buf_.size() != n) recv_buf_ = Buffer<float>(dev_, n);
  if (send_bufs_.size() != size_t(M) || send_bufs_[0].size() != n) {
    send_bufs_.clear();
    for (int i = 0; i < M; ++i) send_bufs_.emplace_back(dev_, n);
  }
  const int warmup = std::min(P_ - p_ - 1, M);
  slots_ = warmup + 1;
  for (int i = 0; i < warmup; ++i) forward(b, i, micro, token_weight, true, &loss);
  for (int j = 0; j < M - warmup; ++j) {
    forward(b, warmup + j, micro, token_weight, true, &loss);
    backward(j, micro, T);
  }
  for (int j = M - warmup; j < M; ++j) backward(j, micro, T);
  pipe_->wait_sends();
  return loss;
}

double PipelineSchedule::eval_batch(const StepSamples& b, int micro) {
  const int M = b.count / micro, T = b.seq_len;
  double loss = 0;
  if (P_ == 1) {
    for (int i = 0; i < M; ++i) {
      const size_t off = size_t(i) * micro * T;
      loss += model_.forward_loss(b.inputs.data() + off, b.targets.data() + off,
                                  b.mask.data() + off, micro, T);
    }
    return loss;
  }
  const size_t n = size_t(micro) * T * size_t(model_.config().dim);
  if (recv_buf_.size() != n) recv_buf_ = Buffer<float>(dev_, n);
  if (send_bufs_.empty() || send_bufs_[0].size() != n) {
    send_bufs_.clear();
    send_bufs_.emplace_back(dev_, n);
  }
  // Forward only: one micro-batch at a time, so the step's buffers serve (each send completes
  // before the buffer is reused; the next stage is already waiting for it).
  slots_ = 1;
  for (int i = 0; i < M; ++i) {
    forward(b, i, micro, 0.0f, false, &loss);
    pipe_->wait_sends();
  }
  return loss;
}

}  // namespace ft
