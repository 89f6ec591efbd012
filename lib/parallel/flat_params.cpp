#include "parallel/flat_params.h"

#include "core/error.h"

namespace ft {

FlatParams::FlatParams(Device* dev, const std::vector<ParamGroup>& groups, std::vector<bool> owned,
                       DType compute_dtype)
    : dev_(dev), groups_(groups), owned_(std::move(owned)), cdt_(compute_dtype) {
  FT_CHECK(owned_.size() == groups_.size(), "FlatParams: ", owned_.size(), " ownership flags for ",
           groups_.size(), " groups");
  FT_CHECK(cdt_ == DType::kF32 || cdt_ == DType::kBF16 || cdt_ == DType::kF16,
           "compute dtype must be F32, BF16 or F16, not ", dtype_name(cdt_));
  for (const ParamGroup& g : groups_)
    for (const ParamEntry& e : g.entries)
      FT_CHECK(e.trainable == g.trains(), "group ", g.name, " mixes trainable and frozen tensors (",
               e.name, "); a group trains whole or not at all");
  const MemoryScope tag(MemoryCategory::kParameters);
  for (size_t g = 0; g < groups_.size(); ++g) {
    params_.emplace_back(dev_, owned_[g] ? groups_[g].numel : 0);
    params_.back().zero();
  }
}

void FlatParams::make_compute_copy() {
  if (cdt_ == DType::kF32) return;
  FT_CHECK(params_.size() == groups_.size(), "make_compute_copy: no fp32 parameters");
  compute_params_.clear();
  const MemoryScope tag(MemoryCategory::kParameters);
  for (size_t g = 0; g < params_.size(); ++g) {
    compute_params_.emplace_back(dev_, cdt_, params_[g].size());
    dev_->ops().convert(dev_->stream(), compute_params_[g].data(), params_[g].data(),
                        params_[g].size());
    params_[g] = Buffer<float>();  // freed group by group: the peak is one fp32 group more
  }
  params_.clear();
}

Ref FlatParams::compute_params(int g) {
  if (!compute_params_.empty()) return compute_params_[size_t(g)].data();
  return params_[size_t(g)].data();
}

void FlatParams::drop_params() {
  params_.clear();
  compute_params_.clear();
}

std::vector<Buffer<float>>& FlatParams::grads() {
  const MemoryScope tag(MemoryCategory::kGradients);
  if (grads_.empty())
    for (size_t g = 0; g < groups_.size(); ++g) {
      grads_.emplace_back(dev_, owned_[g] && groups_[g].trains() ? groups_[g].numel : 0);
      grads_.back().zero();
    }
  return grads_;
}

void FlatParams::zero_grads() {
  for (auto& g : grads_) g.zero();
}

size_t FlatParams::param_bytes() const {
  size_t b = 0;
  for (const auto& x : params_) b += x.bytes();
  for (const auto& x : compute_params_) b += x.bytes();
  return b;
}

std::vector<std::vector<float>> FlatParams::to_host() const {
  std::vector<std::vector<float>> host(params_.size());
  for (size_t g = 0; g < params_.size(); ++g) {
    host[g].resize(params_[g].size());
    params_[g].download(host[g].data(), params_[g].size());
  }
  return host;
}

void FlatParams::from_host(const std::vector<std::vector<float>>& host) {
  FT_CHECK(host.size() == params_.size(), "parameters from the host: ", host.size(), " groups for ",
           params_.size());
  for (size_t g = 0; g < params_.size(); ++g) {
    FT_CHECK(host[g].size() == params_[g].size(), "parameters from the host: group ", g, " has ",
             host[g].size(), " elements, expected ", params_[g].size());
    params_[g].upload(host[g].data(), host[g].size());
  }
}

}  // namespace ft
