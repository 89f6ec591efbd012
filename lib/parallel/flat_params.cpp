#include "parallel/flat_params.h"

#include <algorithm>

#include "core/error.h"
#include "core/half.h"

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
    const bool only = compute_only(int(g));
    params_.emplace_back(dev_, owned_[g] && !only ? groups_[g].numel : 0);
    params_.back().zero();
    if (cdt_ == DType::kF32) continue;
    compute_params_.emplace_back(dev_, cdt_, only ? groups_[g].numel : 0);
    compute_params_.back().zero();
  }
}

bool FlatParams::compute_only(int g) const {
  return cdt_ != DType::kF32 && owned_[size_t(g)] && !groups_[size_t(g)].trains();
}

void FlatParams::write(int g, size_t offset, size_t n, size_t unit,
                       const std::function<void(float*, size_t, size_t)>& make) {
  FT_CHECK(owned_[size_t(g)] && offset + n <= groups_[size_t(g)].numel, "FlatParams::write: ", n,
           " elements at ", offset, " of group ", groups_[size_t(g)].name);
  if (n == 0) return;
  if (!compute_only(g)) {
    FT_CHECK(size_t(g) < params_.size() && params_[size_t(g)].size() > 0,
             "FlatParams::write: group ", groups_[size_t(g)].name, " has no fp32 buffer");
    make(params_[size_t(g)].data() + offset, 0, n);
    return;
  }
  FT_CHECK(unit > 0 && n % unit == 0, "FlatParams::write: ", n, " elements in units of ", unit);
  const size_t piece = std::max<size_t>(1, staging_elems_ / unit) * unit;
  const MemoryScope tag(MemoryCategory::kParameters);
  Buffer<float> staging(dev_, std::min(n, piece));
  const Ref dst = compute_params_[size_t(g)].data() + offset;
  for (size_t b = 0; b < n; b += piece) {
    const size_t k = std::min(piece, n - b);
    make(staging.data(), b, k);
    dev_->ops().convert(dev_->stream(), dst + b, staging.data(), k);
    dev_->synchronize();  // the staging buffer is written again by the next piece
  }
}

void FlatParams::upload_group(int g, const float* host) {
  write(g, 0, groups_[size_t(g)].numel, 1, [&](float* dst, size_t begin, size_t count) {
    dev_->copy_from_host(dst, host + begin, count * sizeof(float));
  });
}

void FlatParams::make_compute_copy() {
  if (cdt_ == DType::kF32 || made_) return;
  FT_CHECK(params_.size() == groups_.size(), "make_compute_copy: no fp32 parameters");
  const MemoryScope tag(MemoryCategory::kParameters);
  for (size_t g = 0; g < params_.size(); ++g) {
    if (compute_only(int(g))) continue;  // made when written
    compute_params_[g] = DBuffer(dev_, cdt_, params_[g].size());
    dev_->ops().convert(dev_->stream(), compute_params_[g].data(), params_[g].data(),
                        params_[g].size());
    params_[g] = Buffer<float>();  // freed group by group: the peak is one fp32 group more
  }
  params_.clear();
  made_ = true;
}

Ref FlatParams::compute_params(int g) {
  if (made_ || compute_only(g)) return compute_params_[size_t(g)].data();
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
  FT_CHECK(!made_ && params_.size() == groups_.size(), "FlatParams::to_host: no fp32 parameters");
  std::vector<std::vector<float>> host(params_.size());
  for (size_t g = 0; g < params_.size(); ++g) {
    if (!compute_only(int(g))) {
      host[g].resize(params_[g].size());
      params_[g].download(host[g].data(), params_[g].size());
      continue;
    }
    const size_t n = groups_[g].numel;
    std::vector<uint16_t> bits(n);
    dev_->copy_to_host(bits.data(), compute_params_[g].data().ptr, n * sizeof(uint16_t));
    host[g].resize(n);
    for (size_t i = 0; i < n; ++i)
      host[g][i] = cdt_ == DType::kBF16 ? to_f32(bf16{bits[i]}) : to_f32(f16{bits[i]});
  }
  return host;
}

void FlatParams::from_host(const std::vector<std::vector<float>>& host) {
  FT_CHECK(host.size() == groups_.size(), "parameters from the host: ", host.size(), " groups for ",
           groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t want = owned_[g] ? groups_[g].numel : 0;
    FT_CHECK(host[g].size() == want, "parameters from the host: group ", g, " has ", host[g].size(),
             " elements, expected ", want);
    if (want) upload_group(int(g), host[g].data());
  }
}

}  // namespace ft
