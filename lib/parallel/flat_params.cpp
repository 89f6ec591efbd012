#include "parallel/flat_params.h"

#include <algorithm>

#include "core/error.h"
#include "core/half.h"
#include "kernels/nf4.h"

namespace ft {

// A quantized group's storage: for each NF4 entry its codes, its blocks' 8-bit absmaxes and
// their scales, at offsets into three buffers, and its tensor's mean absmax (host); the other
// entries, packed in order, in the compute dtype.
struct FlatParams::Nf4Group {
  struct Part {
    bool nf4 = false;
    size_t at = 0;     // NF4: byte offset into codes; else: element offset into rest
    size_t block = 0;  // NF4: the first block's index into qabsmax
    size_t scale = 0;  // NF4: the first scale's index into scales
    float mean = 0;    // NF4: the mean absmax the 8-bit ones are relative to
  };
  std::vector<Part> parts;  // an entry each
  Buffer<uint8_t> codes;
  Buffer<int8_t> qabsmax;
  Buffer<float> scales;
  DBuffer rest;
  size_t max_blocks = 0;  // of one entry

  Nf4Group(Device* dev, const ParamGroup& group, DType cdt) {
    size_t bytes = 0, blocks = 0, nscales = 0, rest_elems = 0;
    for (const ParamEntry& e : group.entries) {
      Part p;
      p.nf4 = e.nf4;
      if (e.nf4) {
        const size_t nb = kernels::nf4_blocks(e.numel);
        p.at = bytes;
        p.block = blocks;
        p.scale = nscales;
        bytes += kernels::nf4_code_bytes(e.numel);
        blocks += nb;
        nscales += kernels::nf4_groups(nb);
        max_blocks = std::max(max_blocks, nb);
      } else {
        p.at = rest_elems;
        rest_elems += e.numel;
      }
      parts.push_back(p);
    }
    codes = Buffer<uint8_t>(dev, bytes);
    qabsmax = Buffer<int8_t>(dev, blocks);
    scales = Buffer<float>(dev, nscales);
    rest = DBuffer(dev, cdt, rest_elems);
    codes.zero();
    qabsmax.zero();
    scales.zero();
    rest.zero();
  }
};

FlatParams::FlatParams(Device* dev, const std::vector<ParamGroup>& groups, std::vector<bool> owned,
                       DType compute_dtype, GroupSink* sink)
    : dev_(dev), groups_(groups), owned_(std::move(owned)), cdt_(compute_dtype), sink_(sink) {
  FT_CHECK(owned_.size() == groups_.size(), "FlatParams: ", owned_.size(), " ownership flags for ",
           groups_.size(), " groups");
  FT_CHECK(cdt_ == DType::kF32 || cdt_ == DType::kBF16 || cdt_ == DType::kF16,
           "compute dtype must be F32, BF16 or F16, not ", dtype_name(cdt_));
  for (const ParamGroup& g : groups_)
    for (const ParamEntry& e : g.entries)
      FT_CHECK(e.trainable == g.trains(), "group ", g.name, " mixes trainable and frozen tensors (",
               e.name, "); a group trains whole or not at all");
  const MemoryScope tag(MemoryCategory::kParameters);
  nf4_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const bool only = compute_only(int(g)), quant = quantized(int(g));
    FT_CHECK(!quant || !groups_[g].trains(), "group ", groups_[g].name,
             " has NF4 tensors but trains: only a frozen group is quantized");
    FT_CHECK(!quant || !sink_, "group ", groups_[g].name,
             " is held in NF4, which a FlatParams streaming its groups does not do");
    const bool held = owned_[g] && !only && !quant && !streamed(int(g));
    params_.emplace_back(dev_, held ? groups_[g].numel : 0);
    params_.back().zero();
    if (cdt_ != DType::kF32) {
      compute_params_.emplace_back(dev_, cdt_, only ? groups_[g].numel : 0);
      compute_params_.back().zero();
    }
    if (quant) nf4_[g] = std::make_unique<Nf4Group>(dev_, groups_[g], cdt_);
  }
}

FlatParams::~FlatParams() = default;

bool FlatParams::compute_only(int g) const {
  return cdt_ != DType::kF32 && owned_[size_t(g)] && !groups_[size_t(g)].trains() &&
         !quantized(g) && !streamed(g);
}

bool FlatParams::streamed(int g) const {
  return sink_ && owned_[size_t(g)] && groups_[size_t(g)].attached_to < 0;
}

bool FlatParams::quantized(int g) const {
  if (!owned_[size_t(g)]) return false;
  for (const ParamEntry& e : groups_[size_t(g)].entries)
    if (e.nf4) return true;
  return false;
}

void FlatParams::write(int g, size_t offset, size_t n, size_t unit,
                       const std::function<void(float*, size_t, size_t)>& make) {
  FT_CHECK(owned_[size_t(g)] && offset + n <= groups_[size_t(g)].numel, "FlatParams::write: ", n,
           " elements at ", offset, " of group ", groups_[size_t(g)].name);
  if (n == 0) return;
  const MemoryScope tag(MemoryCategory::kParameters);
  Ref dst;  // where the values go, when not into an fp32 buffer of params()
  if (streamed(g)) {
    FT_CHECK(building32_group_ < 0 || building32_group_ == g, "FlatParams::write: group ",
             groups_[size_t(g)].name, " while group ", groups_[size_t(building32_group_)].name,
             " is not yet written whole (group_written)");
    if (building32_group_ < 0) {
      building32_ = Buffer<float>(dev_, groups_[size_t(g)].numel);
      building32_.zero();
      building32_group_ = g;
    }
    make(building32_.data() + offset, 0, n);
    return;
  }
  if (quantized(g)) {
    FT_CHECK(building_group_ < 0 || building_group_ == g, "FlatParams::write: group ",
             groups_[size_t(g)].name, " while group ", groups_[size_t(building_group_)].name,
             " is not yet written whole (group_written)");
    if (building_group_ < 0) {
      building_ = DBuffer(dev_, cdt_, groups_[size_t(g)].numel);
      building_.zero();
      building_group_ = g;
    }
    dst = building_.data() + offset;
  } else if (compute_only(g)) {
    dst = compute_params_[size_t(g)].data() + offset;
  } else {
    FT_CHECK(size_t(g) < params_.size() && params_[size_t(g)].size() > 0,
             "FlatParams::write: group ", groups_[size_t(g)].name, " has no fp32 buffer");
    make(params_[size_t(g)].data() + offset, 0, n);
    return;
  }
  if (cdt_ == DType::kF32) {  // a quantized group's buffer, in fp32
    make(static_cast<float*>(dst.ptr), 0, n);
    return;
  }
  FT_CHECK(unit > 0 && n % unit == 0, "FlatParams::write: ", n, " elements in units of ", unit);
  const size_t piece = std::max<size_t>(1, staging_elems_ / unit) * unit;
  Buffer<float> staging(dev_, std::min(n, piece));
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
  group_written(g);
}

void FlatParams::group_written(int g) {
  if (streamed(g)) {
    FT_CHECK(building32_group_ == g, "FlatParams::group_written: group ", groups_[size_t(g)].name,
             " was not written");
    sink_->take(g, groups_[size_t(g)], building32_.data());
    building32_ = Buffer<float>();
    building32_group_ = -1;
    return;
  }
  if (!quantized(g)) return;
  FT_CHECK(building_group_ == g, "FlatParams::group_written: group ", groups_[size_t(g)].name,
           " was not written");
  Nf4Group& q = *nf4_[size_t(g)];
  const ParamGroup& group = groups_[size_t(g)];
  const Stream st = dev_->stream();
  const size_t es = dtype_size(cdt_);
  const MemoryScope tag(MemoryCategory::kParameters);
  Buffer<float> absmax(dev_, q.max_blocks);
  std::vector<float> host_absmax(q.max_blocks);
  std::vector<int8_t> host_q(q.max_blocks);
  std::vector<float> host_scales(kernels::nf4_groups(q.max_blocks));
  for (size_t i = 0; i < group.entries.size(); ++i) {
    const ParamEntry& e = group.entries[i];
    Nf4Group::Part& p = q.parts[i];
    const CRef src = building_.data() + e.offset;
    if (!p.nf4) {
      dev_->copy(st, (q.rest.data() + p.at).ptr, src.ptr, e.numel * es);
      continue;
    }
    // The codes and fp32 absmaxes on the device; the absmaxes' own quantization on the host
    // (a 64th of the elements).
    const size_t nb = kernels::nf4_blocks(e.numel);
    dev_->ops().quantize_nf4(st, q.codes.data() + p.at, absmax.data(), src, e.numel);
    absmax.download(host_absmax.data(), nb);
    kernels::nf4_double_quantize(host_absmax.data(), nb, host_q.data(), host_scales.data(),
                                 &p.mean);
    q.qabsmax.upload(host_q.data(), nb, p.block);
    q.scales.upload(host_scales.data(), kernels::nf4_groups(nb), p.scale);
  }
  dev_->synchronize();
  building_ = DBuffer();
  building_group_ = -1;
  if (dequantized_group_ == g) dequantized_group_ = -1;
}

void FlatParams::hold_quantized(int g) {
  FT_CHECK(held_group_ < 0 || held_group_ == g, "FlatParams: group ", groups_[size_t(g)].name,
           " acquired while group ", groups_[size_t(std::max(held_group_, 0))].name,
           " is held; quantized groups share one dequantized buffer, one group at a time");
  held_group_ = g;
  ++held_refs_;
}

Ref FlatParams::dequantize(int g) {
  FT_CHECK(held_group_ < 0 || held_group_ == g, "FlatParams: group ", groups_[size_t(g)].name,
           " dequantized while group ", groups_[size_t(std::max(held_group_, 0))].name, " is held");
  if (dequantized_group_ == g) return dequantized_.data();
  if (!dequantized_.data().ptr) {
    // One buffer for every quantized group: the largest one's size.
    size_t most = 0;
    for (size_t i = 0; i < groups_.size(); ++i)
      if (quantized(int(i))) most = std::max(most, groups_[i].numel);
    const MemoryScope tag(MemoryCategory::kParameters);
    dequantized_ = DBuffer(dev_, cdt_, most);
  }
  const Nf4Group& q = *nf4_[size_t(g)];
  const ParamGroup& group = groups_[size_t(g)];
  const Stream st = dev_->stream();
  for (size_t i = 0; i < group.entries.size(); ++i) {
    const ParamEntry& e = group.entries[i];
    const Nf4Group::Part& p = q.parts[i];
    const Ref dst = dequantized_.data() + e.offset;
    if (p.nf4)
      dev_->ops().dequantize_nf4(st, dst, q.codes.data() + p.at, q.qabsmax.data() + p.block,
                                 q.scales.data() + p.scale, p.mean, e.numel);
    else
      dev_->copy(st, dst.ptr, (q.rest.data() + p.at).ptr, e.numel * dtype_size(cdt_));
  }
  dequantized_group_ = g;
  return dequantized_.data();
}

void FlatParams::make_compute_copy() {
  if (cdt_ == DType::kF32 || made_) return;
  FT_CHECK(params_.size() == groups_.size(), "make_compute_copy: no fp32 parameters");
  const MemoryScope tag(MemoryCategory::kParameters);
  for (size_t g = 0; g < params_.size(); ++g) {
    if (compute_only(int(g)) || quantized(int(g))) continue;  // made when written
    compute_params_[g] = DBuffer(dev_, cdt_, params_[g].size());
    dev_->ops().convert(dev_->stream(), compute_params_[g].data(), params_[g].data(),
                        params_[g].size());
    params_[g] = Buffer<float>();  // freed group by group: the peak is one fp32 group more
  }
  params_.clear();
  made_ = true;
}

Ref FlatParams::compute_params(int g) {
  if (quantized(g)) return dequantize(g);
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
  size_t b = dequantized_.bytes();
  for (const auto& x : params_) b += x.bytes();
  for (const auto& x : compute_params_) b += x.bytes();
  for (const auto& q : nf4_)
    if (q) b += q->codes.bytes() + q->qabsmax.bytes() + q->scales.bytes() + q->rest.bytes();
  return b;
}

std::vector<std::vector<float>> FlatParams::to_host() {
  FT_CHECK(!made_ && !sink_ && params_.size() == groups_.size(),
           "FlatParams::to_host: no fp32 parameters");
  std::vector<std::vector<float>> host(params_.size());
  for (size_t g = 0; g < params_.size(); ++g) {
    const bool quant = quantized(int(g));
    if (!compute_only(int(g)) && !quant) {
      host[g].resize(params_[g].size());
      params_[g].download(host[g].data(), params_[g].size());
      continue;
    }
    const size_t n = groups_[g].numel;
    const CRef held = quant ? CRef(dequantize(int(g))) : CRef(compute_params_[g].data());
    host[g].resize(n);
    if (cdt_ == DType::kF32) {
      dev_->copy_to_host(host[g].data(), held.ptr, n * sizeof(float));
      continue;
    }
    std::vector<uint16_t> bits(n);
    dev_->copy_to_host(bits.data(), held.ptr, n * sizeof(uint16_t));
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
