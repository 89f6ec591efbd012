#include "parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/kernels.h"

namespace ft {

ZeroSharding::ZeroSharding(int stage, LlamaModel& model, Communicator& comm, Device* dev,
                           Communicator* tensor_comm, Communicator* pipeline_comm)
    : stage_(stage),
      model_(model),
      comm_(comm),
      dev_(dev),
      tensor_comm_(tensor_comm),
      pipeline_comm_(pipeline_comm),
      D_(comm.size()),
      rank_(comm.rank()) {
  FT_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0..3");
  size_t max_shard = 0;
  for (size_t gi = 0; gi < model.layout().groups().size(); ++gi) {
    // Groups of other pipeline stages are empty here.
    const size_t n = model.owns_group(int(gi)) ? model.layout().groups()[gi].numel : 0;
    const size_t s = zero_shard_size(n, D_);
    numel_.push_back(n);
    shard_.push_back(s);
    max_shard = std::max(max_shard, s);
    ranges_.push_back(stage_ == 0 ? ShardRange{0, n} : zero_shard(n, D_, rank_));
  }
  const size_t G = numel_.size();
  if (stage_ >= 2) {
    for (size_t g = 0; g < G; ++g) grad_shards_.emplace_back(dev_, shard_[g]);
    working_grads_.resize(G);
    model_.set_hooks(this);
  } else {
    model_.grads();  // full gradient buffers
  }
  if (stage_ == 3) {
    for (size_t g = 0; g < G; ++g) {
      param_shards_.emplace_back(dev_, shard_[g]);
      param_shards_[g].zero();  // the padding of the last shard
      const float* full = model_.params()[g].data();
      std::copy(full + ranges_[g].begin, full + ranges_[g].end, param_shards_[g].data());
    }
    model_.drop_params();
    gathered_.resize(G);
    refs_.assign(G, 0);
  }
  if ((stage_ == 1 || stage_ == 2) && D_ > 1) scratch_ = Buffer<float>(dev_, max_shard * size_t(D_));
}

ZeroSharding::~ZeroSharding() {
  if (stage_ >= 2) model_.set_hooks(nullptr);
}

void ZeroSharding::begin_step() {
  if (stage_ >= 2)
    for (auto& b : grad_shards_) b.zero();
  else
    model_.zero_grads();
}

void ZeroSharding::finish_backward() {
  if (stage_ >= 2 || D_ == 1) return;  // stage ≥ 2 reduced each group as its backward finished
  for (auto& g : model_.grads()) comm_.all_reduce_sum(g.data(), g.size());
}

double ZeroSharding::weighted_sum_squares(int g, const float* x, size_t base, size_t begin,
                                          size_t end) const {
  const int T = tensor_comm_ ? tensor_comm_->size() : 1;
  double s = 0;
  for (const auto& e : model_.layout().groups()[size_t(g)].entries) {
    const size_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    const double sq = kernels::sum_squares(x + (lo - base), hi - lo);
    s += e.split == TensorSplit::kReplicated ? sq / T : sq;
  }
  for (const auto& [shared, holders] : shared_)
    if (shared == g) s /= holders->size();
  return s;
}

double ZeroSharding::grad_sum_squares() {
  double s = 0;
  const int G = int(numel_.size());
  if (stage_ >= 2) {
    for (int g = 0; g < G; ++g)
      s += weighted_sum_squares(g, grad_shards_[size_t(g)].data(), ranges_[size_t(g)].begin,
                                ranges_[size_t(g)].begin, ranges_[size_t(g)].end);
    comm_.all_reduce_sum(&s, 1);
  } else {
    for (int g = 0; g < G; ++g)
      s += weighted_sum_squares(g, model_.grads()[size_t(g)].data(), 0, 0, numel_[size_t(g)]);
  }
  if (tensor_comm_) tensor_comm_->all_reduce_sum(&s, 1);
  if (pipeline_comm_) pipeline_comm_->all_reduce_sum(&s, 1);
  return s;
}

void ZeroSharding::share_group(int group, Communicator* holders) {
  shared_.emplace_back(group, holders);
}

void ZeroSharding::reduce_shared_groups() {
  for (const auto& [g, holders] : shared_) {
    if (stage_ >= 2)
      holders->all_reduce_sum(grad_shards_[size_t(g)].data(), grad_shards_[size_t(g)].size());
    else
      holders->all_reduce_sum(model_.grads()[size_t(g)].data(), model_.grads()[size_t(g)].size());
  }
}

void ZeroSharding::scale_grads(float f) {
  if (stage_ >= 2)
    for (auto& b : grad_shards_) kernels::scale_inplace(b.data(), f, b.size());
  else
    for (auto& b : model_.grads()) kernels::scale_inplace(b.data(), f, b.size());
}

int64_t ZeroSharding::first_nonfinite_grad() const {
  // Only called once a step has gone wrong, so a plain scan is fast enough.
  int64_t index = 0;
  const auto& groups = model_.layout().groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t begin = ranges_[g].begin, end = ranges_[g].end;
    // x holds elements [base, end) of the group's flat gradient.
    const float* x = numel_[g] == 0 ? nullptr
                     : stage_ >= 2  ? grad_shards_[g].data()
                                    : model_.grads()[g].data();
    const size_t base = stage_ >= 2 ? begin : 0;
    for (const auto& e : groups[g].entries) {
      const size_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
      for (size_t i = lo; x && i < hi; ++i)
        if (!std::isfinite(x[i - base])) return index;
      ++index;
    }
  }
  return -1;
}

void ZeroSharding::inject_nan_grad_for_test() {
  for (size_t g = 0; g < numel_.size(); ++g) {
    if (ranges_[g].begin >= ranges_[g].end) continue;
    float* x = stage_ >= 2 ? grad_shards_[g].data() : model_.grads()[g].data() + ranges_[g].begin;
    x[0] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
}

std::vector<float*> ZeroSharding::param_bases() {
  std::vector<float*> p;
  for (size_t g = 0; g < numel_.size(); ++g)
    p.push_back(stage_ == 3 ? param_shards_[g].data() : model_.params()[g].data() + ranges_[g].begin);
  return p;
}

std::vector<const float*> ZeroSharding::grad_bases() {
  std::vector<const float*> p;
  for (size_t g = 0; g < numel_.size(); ++g)
    p.push_back(stage_ >= 2 ? grad_shards_[g].data() : model_.grads()[g].data() + ranges_[g].begin);
  return p;
}

void ZeroSharding::finish_update() {
  if (!(stage_ == 1 || stage_ == 2) || D_ == 1) return;
  for (size_t g = 0; g < numel_.size(); ++g) {
    const size_t s = shard_[g];
    float* own = scratch_.data() + size_t(rank_) * s;
    float* full = model_.params()[g].data();
    std::copy(full + ranges_[g].begin, full + ranges_[g].end, own);
    comm_.all_gather(own, scratch_.data(), s);
    std::copy(scratch_.data(), scratch_.data() + numel_[g], full);
  }
}

size_t ZeroSharding::params_bytes() const {
  size_t b = 0;
  if (stage_ == 3)
    for (const auto& x : param_shards_) b += x.bytes();
  else
    for (const auto& x : model_.params()) b += x.bytes();
  return b;
}

size_t ZeroSharding::grads_bytes() const {
  size_t b = 0;
  if (stage_ >= 2)
    for (const auto& x : grad_shards_) b += x.bytes();
  else
    for (size_t g = 0; g < numel_.size(); ++g) b += numel_[g] * sizeof(float);
  return b;
}

const float* ZeroSharding::acquire_params(int group) {
  const size_t g = size_t(group);
  if (stage_ < 3) return model_.params()[g].data();
  if (refs_[g]++ == 0) {
    const size_t s = shard_[g];
    gathered_[g] = Buffer<float>(dev_, s * size_t(D_));
    float* own = gathered_[g].data() + size_t(rank_) * s;
    std::copy(param_shards_[g].data(), param_shards_[g].data() + s, own);
    comm_.all_gather(own, gathered_[g].data(), s);
  }
  return gathered_[g].data();
}

void ZeroSharding::release_params(int group) {
  const size_t g = size_t(group);
  if (stage_ < 3) return;
  FT_CHECK(refs_[g] > 0, "ZeRO-3: group ", group, " released more often than acquired");
  if (--refs_[g] == 0) gathered_[g] = Buffer<float>();
}

float* ZeroSharding::grads(int group) {
  const size_t g = size_t(group);
  if (!working_grads_[g].data()) {
    working_grads_[g] = Buffer<float>(dev_, shard_[g] * size_t(D_));
    working_grads_[g].zero();
  }
  return working_grads_[g].data();
}

void ZeroSharding::grads_ready(int group) {
  const size_t g = size_t(group), s = shard_[g];
  Buffer<float> mine(dev_, s);
  comm_.reduce_scatter_sum(working_grads_[g].data(), mine.data(), s);
  kernels::add_inplace(grad_shards_[g].data(), mine.data(), s);
  working_grads_[g] = Buffer<float>();  // freed: at most the groups in flight are full size
}

}  // namespace ft
