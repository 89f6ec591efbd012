#include "parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "comm/device_comm.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/host_adder.h"

namespace ft {

ZeroSharding::ZeroSharding(int stage, FlatParams& flat, Communicator& comm, Device* dev,
                           Communicator* tensor_comm, Communicator* pipeline_comm,
                           ZeroOptions options)
    : stage_(stage),
      flat_(flat),
      comm_(comm),
      dev_(dev),
      cdt_(flat.compute_dtype()),
      tensor_comm_(tensor_comm),
      pipeline_comm_(pipeline_comm),
      opt_(options),
      D_(comm.size()),
      rank_(comm.rank()),
      offload_(options.offload_optimizer),
      offload_params_(options.host_shards != nullptr) {
  FT_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0..3");
  if (offload_ && dev_->kind() == DeviceKind::kCpu)
    throw Error(
        "parallel.offload_optimizer: cpu moves the optimizer state from the GPU to host memory, "
        "but this run's device is the CPU, where it is already: set parallel.offload_optimizer: "
        "none (or run on a GPU, runtime.device: cuda)");
  FT_CHECK(!offload_params_ || (stage_ == 3 && offload_),
           "parallel.offload_params needs ZeRO stage 3 and parallel.offload_optimizer: cpu");
  size_t max_shard = 0;
  for (size_t gi = 0; gi < flat.groups().size(); ++gi) {
    // Groups of other pipeline stages are empty here.
    const size_t n = flat.owns(int(gi)) ? flat.groups()[gi].numel : 0;
    const size_t s = zero_shard_size(n, D_);
    numel_.push_back(n);
    shard_.push_back(s);
    trains_.push_back(flat.groups()[gi].trains());
    FT_CHECK(stage_ < 3 || !flat.quantized(int(gi)), "ZeRO-3 cannot shard group ",
             flat.groups()[gi].name, ": it is held in NF4 (QLoRA), whole on every data rank");
    max_shard = std::max(max_shard, s);
    ranges_.push_back(stage_ == 0 ? ShardRange{0, n} : zero_shard(n, D_, rank_));
  }
  FT_CHECK(opt_.bucket_elems > 0, "ZeRO: a reduction bucket of 0 elements");
  const size_t G = numel_.size();
  ready_count_.assign(G, 0);
  reduced_.assign(G, false);
  landed_.assign(G, false);
  if (stage_ >= 2) {
    const MemoryScope tag(MemoryCategory::kGradients);
    // With offload the shards are on the host (below).
    for (size_t g = 0; g < G; ++g)
      grad_shards_.emplace_back(dev_, trains_[g] && !offload_ ? shard_[g] : 0);
    working_grads_.resize(G);
    flat_.set_hooks(this);
  } else {
    flat_.grads();  // full gradient buffers
    // Told when each group's gradient is final, to reduce it (or, offloaded, send it to the
    // host) while the backward goes on.
    if (D_ > 1 || offload_) flat_.set_hooks(this);
  }
  if (offload_) {
    // The host state: this rank's ranges of the fp32 masters (from the model's fp32 buffers,
    // before the compute copy replaces them, or streamed there already: HostShards) and of the
    // gradients; with offload_params the compute copy's shards too.
    std::vector<HostShards::Shard>* streamed =
        offload_params_ ? &options.host_shards->shards() : nullptr;
    for (size_t g = 0; g < G; ++g) {
      const size_t own = trains_[g] ? ranges_[g].size() : 0;
      max_range_ = std::max(max_range_, own);
      HostShards::Shard* taken =
          streamed && g < streamed->size() && (*streamed)[g].taken ? &(*streamed)[g] : nullptr;
      {
        const MemoryScope tag(MemoryCategory::kParameters);
        if (taken) {
          host_master_.push_back(std::move(taken->master));
          host_compute_.push_back(std::move(taken->compute));
        } else {
          host_master_.emplace_back(dev_, own);
          if (own)
            dev_->copy_to_host(host_master_[g].data(), flat_.params()[g].data() + ranges_[g].begin,
                               own * sizeof(float));
          if (offload_params_) {
            // A group the model's FlatParams kept (an adapter's: it trains): rounded from its
            // master by sync_compute_params below.
            FT_CHECK(numel_[g] == 0 || trains_[g], "ZeRO offload_params: frozen group ",
                     flat_.groups()[g].name, " never reached the host shards");
            host_compute_.emplace_back(dev_, shard_[g] * dtype_size(cdt_));
            host_compute_.back().zero();
          }
        }
        FT_CHECK(host_master_[g].size() == own, "ZeRO offload: group ", flat_.groups()[g].name,
                 "'s host master holds ", host_master_[g].size(), " elements, not ", own);
      }
      const MemoryScope tag(MemoryCategory::kGradients);
      host_grads_.emplace_back(dev_, own);
    }
    if (offload_params_) {
      h2d_done_.resize(G);
      for (auto& e : h2d_done_) e = dev_->make_event();
      compute_mark_ = dev_->make_event();
    }
    if (cdt_ != DType::kF32 && !offload_params_) {
      const MemoryScope tag(MemoryCategory::kCommunication);
      for (auto& b : up_staging_) b = HostBuffer<std::byte>(dev_, max_range_ * dtype_size(cdt_));
    }
    for (auto& e : up_done_) e = dev_->make_event();
    updated_mark_ = dev_->make_event();
    up_event_.resize(G);
    for (auto& e : up_event_) e = dev_->make_event();
    stale_.assign(G, false);
  }
  if (opt_.overlap_update) {
    // The recipe's validation refuses the rest: stages 1-2 would all-gather the updated shards
    // and stage 3 gather them for the forward, offload updates on the host.
    FT_CHECK(stage_ == 0 && !offload_,
             "parallel.overlap_update: ZeRO stage 0 without offload only (stage ", stage_, ")");
    update_mark_ = dev_->make_event();
    update_done_.resize(G);
    for (auto& e : update_done_) e = dev_->make_event();
    update_pending_.assign(G, false);
    flat_.set_hooks(this);  // the forward's first use of each group waits for its update
  }
  // fp32 master weights (DESIGN.md §5 precision policy): this rank's shard at stage 3 (padded to
  // s; the all-gathers send it whole), or with a 16-bit compute dtype the range AdamW updates.
  // Otherwise (fp32 at stages 0-2) the model's own fp32 buffers are the master. A frozen group
  // has none: in fp32 at stage 3 its fp32 shard is what the all-gathers send (kept as master_,
  // the same buffer a trained group's all-gathers read); with a 16-bit dtype only the compute
  // copy, rounded here once.
  // Offloaded, a trained group's master is on the host (above).
  if (stage_ == 3 || cdt_ != DType::kF32) {
    const MemoryScope tag(MemoryCategory::kParameters);
    for (size_t g = 0; g < G; ++g) {
      const bool held = (trains_[g] && !offload_) ||
                        (stage_ == 3 && cdt_ == DType::kF32 && !trains_[g] && !offload_params_);
      master_.emplace_back(dev_, !held ? 0 : stage_ == 3 ? shard_[g] : ranges_[g].size());
      if (!held) continue;
      master_[g].zero();  // the padding of the last shard
      const float* full = flat_.params()[g].data();
      dev_->copy(dev_->stream(), master_[g].data(), full + ranges_[g].begin,
                 ranges_[g].size() * sizeof(float));
    }
  }
  if (stage_ == 3) {
    const MemoryScope tag(MemoryCategory::kParameters);
    // The compute copy of the shards: with a 16-bit dtype; offloaded in fp32 too, for a trained
    // group (its master is on the host; a frozen fp32 group's all-gathers read master_).
    // With offload_params they are on the host (above).
    if ((cdt_ != DType::kF32 || offload_) && !offload_params_)
      for (size_t g = 0; g < G; ++g) {
        const bool fp32_frozen = cdt_ == DType::kF32 && !trains_[g];
        compute_shards_.emplace_back(dev_, cdt_, fp32_frozen ? 0 : shard_[g]);
        if (trains_[g]) {
          if (offload_) compute_shards_[g].zero();  // the padding past the group's end
          continue;  // rounded from its master by sync_compute_params below
        }
        if (fp32_frozen) continue;
        // A frozen group is held in the compute dtype only (FlatParams::compute_only): its
        // shard is a slice of that copy (zero padding past the group's end).
        compute_shards_[g].zero();
        dev_->copy(dev_->stream(), compute_shards_[g].data().ptr,
                   (flat_.compute_params(int(g)) + ranges_[g].begin).ptr,
                   ranges_[g].size() * dtype_size(cdt_));
      }
    flat_.drop_params();
    gathered_.resize(G);
    gathering_.resize(G);
    refs_.assign(G, 0);
  } else {
    flat_.make_compute_copy();  // no-op in fp32
  }
  if ((stage_ == 1 || stage_ == 2) && D_ > 1) {
    const MemoryScope tag(MemoryCategory::kCommunication);  // the all-gather buffer
    scratch_ = DBuffer(dev_, cdt_, max_shard * size_t(D_));
  }
  // fp32: the parameters are the masters, except an offloaded stage 3's shards.
  if (cdt_ != DType::kF32 || (offload_ && stage_ == 3)) sync_compute_params();
  const MemoryScope tag(MemoryCategory::kActivations);  // a scalar of the step, as the loss's
  sumsq_ = Buffer<double>(dev_, 1);
  // The data group's agreement on a recording (agree_recorded), made now so that ft plan counts
  // it where a run would record.
  if (opt_.graphs && peers_record()) agree_ = RankAgreement(*dev_, comm_);
}

ZeroSharding::~ZeroSharding() {
  if (stage_ >= 2 || D_ > 1 || offload_ || opt_.overlap_update) flat_.set_hooks(nullptr);
  // An update still queued: done before the events go (the memory it writes stays the device
  // allocator's until the device, which synchronises its streams first, is destroyed).
  for (Event& e : update_done_) e.synchronize();
  // Copies still in flight read or write buffers freed with this.
  if (!landings_.empty()) dev_->synchronize();
  for (Landing& l : landings_) l.done.synchronize();
  for (Event& e : h2d_done_) e.synchronize();
}

void ZeroSharding::begin_step(int micro_batches) {
  FT_CHECK(micro_batches >= 1, "ZeRO: a step of ", micro_batches, " micro-batches");
  micro_batches_ = micro_batches;
  drop_prefetches();
  in_step_ = true;
  order_ok_ = true;
  pos_ = 0;
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(reduced_.begin(), reduced_.end(), false);
  std::fill(landed_.begin(), landed_.end(), false);
  if (stage_ >= 2)
    for (auto& b : grad_shards_) b.zero();
  else if (!grads_zeroed_)  // the overlapped update zeroed each gradient after reading it
    flat_.zero_grads();
  grads_zeroed_ = false;
}

void ZeroSharding::reduce_group(int group) {
  const size_t g = size_t(group);
  if (reduced_[g] || numel_[g] == 0 || !trains_[g]) return;
  reduced_[g] = true;
  float* grad = flat_.grads()[g].data();
  maybe_inject_nan(group, grad);
  const Stream st = dev_->stream();
  for (size_t off = 0; off < numel_[g]; off += opt_.bucket_elems) {
    const size_t n = std::min(opt_.bucket_elems, numel_[g] - off);
    Reduction r;
    r.dst = grad + off;
    r.n = n;
    if (opt_.reduce_dtype == DType::kF32) {
      r.work = comm_.all_reduce(st, grad + off, n, ReduceOp::kSum);
    } else {
      r.low = hold_low(n);
      dev_->ops().convert(st, r.low.data(), grad + off, n);
      r.work = comm_.all_reduce(st, r.low.data(), n, ReduceOp::kSum);
    }
    if (offload_ && !shared(group)) {
      // The bucket's part of this rank's range goes to the host as soon as its reduction is
      // done, ordered on the copy stream after it (and, reduced in a 16-bit dtype, after its
      // conversion back, run there too); the compute stream waits for the copy instead of the
      // reduction (finish_backward).
      const size_t lo = std::max(off, ranges_[g].begin), hi = std::min(off + n, ranges_[g].end);
      const Stream cs = dev_->copy_stream();
      r.work.wait_on(cs);
      if (r.low) dev_->ops().convert(cs, r.dst, r.low.data(), n);
      if (lo < hi)
        land(host_grads_[g].data() + (lo - ranges_[g].begin), grad + lo, hi - lo, /*add=*/false);
      r.landed = dev_->make_event();
      r.landed.record(cs);
    }
    reducing_.push_back(std::move(r));
  }
  if (offload_ && !shared(group)) landed_[g] = true;
}

void ZeroSharding::retire_scatters(size_t keep) {
  const Stream st = dev_->stream();
  const bool by_count = keeps_working();
  while (!scatters_.empty() &&
         (scatters_.size() > keep || (!by_count && scatters_.front().work.complete()))) {
    Scatter& x = scatters_.front();
    x.work.wait_on(st);
    const size_t g = size_t(x.group), s = shard_[g];
    if (x.low_out) dev_->ops().convert(st, x.mine.data(), x.low_out.data(), s);
    if (offload_) {                       // (never kept buffers)
      const float* mine = x.mine.data();  // before x.mine is moved into the call
      land(host_grads_[g].data(), mine, ranges_[g].size(), landed_[g], x.mine.take_owned());
      landed_[g] = true;
    } else {
      dev_->ops().add(st, grad_shards_[g].data(), x.mine.data(), s);
    }
    // Frees its buffers (or gives them back), the compute stream past the call.
    scatters_.erase(scatters_.begin());
  }
}

void ZeroSharding::maybe_inject_nan(int group, float* grad, bool shard) {
  if (!nan_pending_) return;
  for (size_t g = 0; g < numel_.size(); ++g) {
    if (ranges_[g].begin >= ranges_[g].end || !trains_[g]) continue;
    if (int(g) != group) return;  // the first trained group held is not this one
    const float nan = std::numeric_limits<float>::quiet_NaN();
    dev_->copy_from_host(grad + (shard ? 0 : ranges_[g].begin), &nan, sizeof nan);
    nan_pending_ = false;
    return;
  }
}

void ZeroSharding::finish_backward() {
  // The overlapped update's zeroing of a gradient the backward did not ask for (grads() waits
  // for the others), before the reductions read it.
  for (size_t g = 0; g < update_pending_.size(); ++g) wait_update(int(g));
  const Stream st = dev_->stream();
  drop_prefetches();
  if (in_step_ && !order_.empty() && !order_recorded_) {
    order_recorded_ = true;
    // With graphs (keeps_working) each micro-batch follows one micro-batch's order from its
    // start (prefetch_after), where the step's micro-batches acquired alike.
    const size_t m = order_.size() / size_t(micro_batches_);
    bool alike =
        keeps_working() && micro_batches_ > 1 && m * size_t(micro_batches_) == order_.size();
    for (size_t i = m; alike && i < order_.size(); ++i) alike = order_[i] == order_[i % m];
    if (alike) order_.resize(m);
    order_per_micro_batch_ = keeps_working();
  }
  in_step_ = false;
  if (stage_ >= 2) {
    retire_scatters(0);
    // A working gradient still here was computed but never reported complete: it would never
    // reach the shard, and the step would go on without it.
    for (size_t g = 0; g < working_grads_.size(); ++g)
      FT_CHECK(!working_grads_[g], "ZeRO stage ", stage_, ": group ", g,
               "'s gradient was computed but never reported complete (grads_ready), so it would "
               "be lost");
  } else if (D_ == 1) {
    for (size_t g = 0; g < numel_.size() && nan_pending_; ++g)
      if (trains_[g]) maybe_inject_nan(int(g), flat_.grads()[g].data());
  } else {
    // With overlap_comm each group's gradient is reduced by the grads_ready call that made it
    // final. One the backward reported fewer times than the step's micro-batches is reduced
    // here instead: the same sums, its overlap lost (a defect in the model's reporting, or a
    // replayed micro-batch whose calls were not made: LlamaModel::train_micro_batch).
    for (size_t g = 0; g < numel_.size() && opt_.overlap && !warned_unreported_; ++g)
      if (trains_[g] && numel_[g] && ready_count_[g] < micro_batches_) {
        log_warn("ZeRO: group ", g, "'s gradient was reported complete ", ready_count_[g],
                 " times in a step of ", micro_batches_,
                 " micro-batches, so it is reduced after the backward instead of during it "
                 "(parallel.overlap_comm): an internal error, please report it");
        warned_unreported_ = true;
      }
    for (size_t g = 0; g < numel_.size(); ++g) reduce_group(int(g));
    for (Reduction& r : reducing_) {
      if (r.landed.valid()) {  // offload: reduced, converted and copied on the copy stream
        dev_->wait(st, r.landed);
        continue;
      }
      r.work.wait_on(st);
      if (r.low) dev_->ops().convert(st, r.dst, r.low.data(), r.n);
    }
    reducing_.clear();
  }
  // Offloaded stages 0-1 of one data rank: the groups not sent yet (none: each went at its last
  // grads_ready). A group held by two pipeline stages goes once summed between them, in
  // reduce_shared_groups.
  if (offload_ && stage_ < 2)
    for (size_t g = 0; g < numel_.size(); ++g)
      if (trains_[g] && !landed_[g] && !shared(int(g))) land_group(int(g));
}

bool ZeroSharding::shared(int g) const {
  for (const auto& sh : shared_)
    if (sh.first == g) return true;
  return false;
}

void ZeroSharding::weighted_sum_squares(Ops& ops, Stream st, double* acc, int g, const float* x,
                                        size_t base, size_t begin, size_t end) const {
  const int T = tensor_comm_ ? tensor_comm_->size() : 1;
  double holders_count = 1;
  for (const auto& [shared, holders] : shared_)
    if (shared == g) holders_count = holders->size();
  // One call per run of adjacent tensors with the same divisor (a group's tensors are
  // contiguous): a few calls per group instead of one per tensor.
  const auto& entries = flat_.groups()[size_t(g)].entries;
  size_t run_lo = 0, run_hi = 0;
  double run_divisor = 0;
  auto flush = [&] {
    if (run_lo < run_hi)
      ops.sum_squares(st, acc, x + (run_lo - base), run_hi - run_lo, run_divisor);
    run_lo = run_hi = 0;
  };
  for (const auto& e : entries) {
    const size_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    const double divisor = (e.split == TensorSplit::kReplicated ? T : 1) * holders_count;
    if (run_lo < run_hi && (lo != run_hi || divisor != run_divisor)) flush();
    if (run_lo == run_hi) run_lo = lo, run_divisor = divisor;
    run_hi = hi;
  }
  flush();
}

double ZeroSharding::grad_sum_squares() {
  flush_update();  // (every group was used, so updated, in this step's forward)
  // Accumulated on the device, all-reduced there, read back once.
  sumsq_.zero();
  double* acc = sumsq_.data();
  const Stream st = dev_->stream();
  const int G = int(numel_.size());
  Ops& ops = dev_->ops();
  if (stage_ >= 2 && offload_) {
    // The shards are on the host: summed there, then on the device as the others' sums.
    retire_landings();
    double host = 0;
    for (int g = 0; g < G; ++g) {
      const size_t gi = size_t(g);
      if (!trains_[gi] || ranges_[gi].size() == 0) continue;
      FT_CHECK(landed_[gi], "ZeRO offload: no gradient of group ", flat_.groups()[gi].name,
               " reached the host this step");
      weighted_sum_squares(dev_->host_ops(), Stream{}, &host, g, host_grads_[gi].data(),
                           ranges_[gi].begin, ranges_[gi].begin, ranges_[gi].end);
    }
    dev_->copy_from_host(acc, &host, sizeof host);
    comm_.all_reduce(st, acc, 1, ReduceOp::kSum).wait_on(st);
  } else if (stage_ >= 2) {
    for (int g = 0; g < G; ++g)
      if (trains_[size_t(g)])
        weighted_sum_squares(ops, st, acc, g, grad_shards_[size_t(g)].data(),
                             ranges_[size_t(g)].begin, ranges_[size_t(g)].begin,
                             ranges_[size_t(g)].end);
    comm_.all_reduce(st, acc, 1, ReduceOp::kSum).wait_on(st);
  } else {
    for (int g = 0; g < G; ++g)
      if (trains_[size_t(g)])
        weighted_sum_squares(ops, st, acc, g, flat_.grads()[size_t(g)].data(), 0, 0,
                             numel_[size_t(g)]);
  }
  if (tensor_comm_) tensor_comm_->all_reduce(st, acc, 1, ReduceOp::kSum).wait_on(st);
  if (pipeline_comm_) pipeline_comm_->all_reduce(st, acc, 1, ReduceOp::kSum).wait_on(st);
  double s = 0;
  sumsq_.download(&s, 1);
  return s;
}

void ZeroSharding::share_group(int group, Communicator* holders) {
  shared_.emplace_back(group, holders);
}

void ZeroSharding::reduce_shared_groups() {
  const Stream st = dev_->stream();
  for (const auto& [g, holders] : shared_) {
    const size_t gi = size_t(g);
    if (!trains_[gi]) continue;
    if (offload_ && stage_ >= 2) {
      // The shard is on the host: summed on the device, through a buffer of its own.
      retire_landings();
      const size_t own = ranges_[gi].size();
      const MemoryScope tag(MemoryCategory::kCommunication);
      Buffer<float> sum(dev_, own);
      sum.upload(host_grads_[gi].data(), own);
      holders->all_reduce(st, sum.data(), own, ReduceOp::kSum).wait_on(st);
      const float* p = sum.data();  // before sum is moved into the call
      land(host_grads_[gi].data(), p, own, /*add=*/false, std::move(sum));
      continue;
    }
    Buffer<float>& grad = stage_ >= 2 ? grad_shards_[gi] : flat_.grads()[gi];
    holders->all_reduce(st, grad.data(), grad.size(), ReduceOp::kSum).wait_on(st);
    if (offload_) land_group(g);  // stages 0-1: now summed, its range goes to the host
  }
}

int64_t ZeroSharding::first_nonfinite_grad() const {
  // Only called once a step has gone wrong, so a plain scan of a host copy is fast enough.
  int64_t index = 0;
  const auto& groups = flat_.groups();
  std::vector<float> host;
  for (size_t g = 0; g < groups.size(); ++g) {
    const size_t begin = ranges_[g].begin, end = ranges_[g].end;
    // x holds elements [base, end) of the group's flat gradient.
    const float* x = nullptr;
    if (numel_[g] != 0 && trains_[g] && offload_ && stage_ >= 2) {
      x = host_grads_[g].data();  // already on the host (retired by grad_sum_squares)
    } else if (numel_[g] != 0 && trains_[g]) {
      const Buffer<float>& b = stage_ >= 2 ? grad_shards_[g] : flat_.grads()[g];
      host.resize(b.size());
      b.download(host.data(), b.size());
      x = host.data();
    }
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

void ZeroSharding::inject_nan_grad_for_test() { nan_pending_ = true; }

std::vector<float*> ZeroSharding::param_bases() {
  std::vector<float*> p;
  for (size_t g = 0; g < numel_.size(); ++g)
    p.push_back(!trains_[g]        ? nullptr
                : offload_         ? host_master_[g].data()
                : !master_.empty() ? master_[g].data()
                                   : flat_.params()[g].data() + ranges_[g].begin);
  return p;
}

std::vector<const float*> ZeroSharding::grad_bases() {
  std::vector<const float*> p;
  for (size_t g = 0; g < numel_.size(); ++g)
    p.push_back(!trains_[g]   ? nullptr
                : offload_    ? host_grads_[g].data()
                : stage_ >= 2 ? grad_shards_[g].data()
                              : flat_.grads()[g].data() + ranges_[g].begin);
  return p;
}

std::vector<Ref> ZeroSharding::compute_bases() {
  std::vector<Ref> c(numel_.size());
  if (cdt_ == DType::kF32 || offload_) return c;
  for (size_t g = 0; g < numel_.size(); ++g) {
    if (!trains_[g]) continue;
    if (stage_ == 3)
      c[g] = compute_shards_[g].data();
    else if (stage_ == 0 || D_ == 1)
      c[g] = flat_.compute_params(int(g)) + ranges_[g].begin;
  }
  return c;
}

void ZeroSharding::finish_update() { refresh_compute_params(/*after_adamw=*/true); }

void ZeroSharding::sync_compute_params() {
  if (offload_)
    offload_update(nullptr);
  else
    refresh_compute_params(/*after_adamw=*/false);
}

void ZeroSharding::flush_update() {
  for (size_t g = 0; g < stale_.size(); ++g) ensure_updated(int(g));
  // The overlapped update: its groups' events are recorded in order on one stream, so the last
  // one covers every group.
  if (std::find(update_pending_.begin(), update_pending_.end(), true) != update_pending_.end()) {
    dev_->wait(dev_->stream(), update_done_.back());
    std::fill(update_pending_.begin(), update_pending_.end(), false);
  }
}

void ZeroSharding::overlapped_update(const std::function<void(int g, Stream s)>& update) {
  FT_CHECK(opt_.overlap_update, "ZeroSharding::overlapped_update without parallel.overlap_update");
  flush_update();  // a group the last step's update left unwaited (one no forward uses)
  const Stream us = dev_->update_stream();
  // After this step's work on the compute stream: the forward and backward that read the
  // parameters, the reductions and the norm that read the gradients.
  update_mark_.record(dev_->stream());
  dev_->wait(us, update_mark_);
  auto& grads = flat_.grads();
  for (size_t g = 0; g < numel_.size(); ++g) {
    if (trains_[g] && numel_[g] > 0) update(int(g), us);
    // Read; the next step's backward accumulates into zeros (begin_step leaves them).
    if (grads[g].data()) dev_->memset_zero_async(us, grads[g].data(), grads[g].bytes());
    update_done_[g].record(us);
    update_pending_[g] = true;
  }
  grads_zeroed_ = true;
}

void ZeroSharding::wait_update(int group) {
  const size_t g = size_t(group);
  if (g < update_pending_.size() && update_pending_[g]) {
    dev_->wait(dev_->stream(), update_done_[g]);
    update_pending_[g] = false;
  }
}

void ZeroSharding::refresh_compute_params(bool after_adamw) {
  const Stream st = dev_->stream();
  Ops& ops = dev_->ops();
  const bool fp32 = cdt_ == DType::kF32;
  for (size_t g = 0; g < numel_.size(); ++g) {
    if (!trains_[g]) continue;  // never updated: its compute copy was made once
    const size_t own = ranges_[g].size();
    if (stage_ == 3) {  // the compute copy of the shard is what the all-gathers send
      if (!fp32 && !after_adamw)
        ops.convert(st, compute_shards_[g].data(), master_[g].data(), shard_[g]);
      continue;
    }
    if (stage_ == 0 || D_ == 1) {  // the master covers the whole group
      if (!fp32 && !after_adamw)
        ops.convert(st, flat_.compute_params(int(g)) + ranges_[g].begin, master_[g].data(), own);
      continue;
    }
    // Stages 1 and 2: every rank rounds its updated shard, then all-gather the compute copy (at
    // the compute dtype's width: half of fp32's bytes in bf16/fp16).
    const size_t s = shard_[g];
    const Ref mine = scratch_.data() + size_t(rank_) * s;
    if (fp32)
      dev_->copy(st, mine.ptr, flat_.params()[g].data() + ranges_[g].begin, own * sizeof(float));
    else
      ops.convert(st, mine, master_[g].data(), own);
    comm_.all_gather(st, mine, scratch_.data(), s).wait_on(st);
    const Ref full = flat_.compute_params(int(g));
    dev_->copy(st, full.ptr, scratch_.data().ptr, numel_[g] * dtype_size(cdt_));
  }
}

size_t ZeroSharding::params_bytes() const {
  size_t b = flat_.param_bytes();
  for (const auto& x : master_) b += x.bytes();
  for (const auto& x : compute_shards_) b += x.bytes();
  return b;
}

size_t ZeroSharding::grads_bytes() const {
  size_t b = 0;
  if (stage_ >= 2)
    for (const auto& x : grad_shards_) b += x.bytes();
  else
    for (size_t g = 0; g < numel_.size(); ++g) b += trains_[g] ? numel_[g] * sizeof(float) : 0;
  return b;
}

// Stage 3: queues the all-gather of group g's parameters into gathered_[g] (its handle in
// gathering_[g]), from the shard this rank holds.
void ZeroSharding::start_gather(size_t g) {
  const size_t s = shard_[g];
  if (offload_) {  // the last update of the shard first (offload "update")
    ensure_updated(int(g));
    if (!offload_params_) dev_->wait(dev_->stream(), up_event_[g]);
  }
  const MemoryScope tag(MemoryCategory::kCommunication);  // gathered for the group's use
  gathered_[g] = hold_params(s * size_t(D_));
  const Ref all = gathered(g), own = all + size_t(rank_) * s;
  if (offload_params_) {
    // From the host shard, on the copy stream, so that it runs while the compute stream works
    // on the groups before (after the work queued so far: the memory's last use); the all-gather
    // follows the copy; acquire waits for both.
    const Stream cs = dev_->copy_stream();
    compute_mark_.record(dev_->stream());
    dev_->wait(cs, compute_mark_);
    dev_->copy_from_host_async(cs, own.ptr, host_compute_[g].data(), s * dtype_size(cdt_));
    gathering_[g] = comm_.all_gather(cs, own, all, s);
    h2d_done_[g].record(cs);
    return;
  }
  // The compute copy of the shard; a frozen fp32 group's (and without offload any fp32 group's)
  // master is that copy.
  const CRef src = compute_shards_.empty() || compute_shards_[g].size() == 0
                       ? CRef(master_[g].data())
                       : compute_shards_[g].data();
  const Stream st = dev_->stream();
  dev_->copy(st, own.ptr, src.ptr, s * dtype_size(cdt_));
  gathering_[g] = comm_.all_gather(st, own, all, s);
}

// Prefetch (parallel.prefetch_blocks), as FSDP does it: the order in which a training step
// acquires the groups (forward, then backward; activation checkpointing's recomputation
// included) is recorded in the first step, and in later steps each acquisition that follows
// that order gathers the next groups of it, so their all-gathers run while this one computes. A
// step that departs from the order stops prefetching until its end. Evaluation (outside
// begin_step..finish_backward) does not prefetch.
void ZeroSharding::prefetch_after(int group) {
  if (!in_step_ || opt_.prefetch_blocks == 0) return;
  if (!order_recorded_) {
    order_.push_back(group);
    return;
  }
  // An order cut to one micro-batch's (finish_backward, with graphs) is followed by each
  // micro-batch from its start.
  if (order_per_micro_batch_ && pos_ == order_.size()) pos_ = 0;
  if (!order_ok_ || pos_ >= order_.size() || order_[pos_] != group) {
    order_ok_ = false;
    return;
  }
  ++pos_;
  for (size_t k = pos_; k < std::min(order_.size(), pos_ + size_t(opt_.prefetch_blocks)); ++k) {
    const size_t g = size_t(order_[k]);
    if (refs_[g] == 0 && !gathered(g).ptr) start_gather(g);
  }
}

// Gathers not used by the groups they were made for (a step that left the recorded order):
// waited for and freed, before the update changes the shards they read.
void ZeroSharding::drop_prefetches() {
  if (stage_ < 3) return;
  const Stream st = dev_->stream();
  for (size_t g = 0; g < gathered_.size(); ++g) {
    if (refs_[g] != 0 || !gathered(g).ptr) continue;
    if (offload_params_) dev_->wait(st, h2d_done_[g]);
    gathering_[g].wait_on(st);
    gathered_[g].reset();
  }
}

CRef ZeroSharding::acquire_params(int group) {
  const size_t g = size_t(group);
  wait_update(group);
  if (offload_ && stage_ < 3) {
    // The last update, applied as the groups are first used (offload "update"); the next
    // group's too, so that its upload runs while this one computes.
    ensure_updated(group);
    for (size_t k = g + 1; k < stale_.size(); ++k)
      if (stale_[k]) {
        ensure_updated(int(k));
        break;
      }
    dev_->wait(dev_->stream(), up_event_[g]);
  }
  if (stage_ < 3) return flat_.compute_params(group);
  if (refs_[g]++ == 0) {
    if (!gathered(g).ptr) start_gather(g);  // not prefetched
    if (offload_params_) dev_->wait(dev_->stream(), h2d_done_[g]);
    gathering_[g].wait_on(dev_->stream());
    prefetch_after(group);
  }
  return gathered(g);
}

void ZeroSharding::release_params(int group) {
  const size_t g = size_t(group);
  if (stage_ < 3) return;
  FT_CHECK(refs_[g] > 0, "ZeRO-3: group ", group, " released more often than acquired");
  // A kept buffer is reused by a later gather, on the compute stream or by the all-gather, which
  // the communicator orders after the work queued there so far: after this group's last use.
  if (--refs_[g] == 0) gathered_[g].reset();
}

float* ZeroSharding::grads(int group) {
  const size_t g = size_t(group);
  wait_update(group);
  if (!trains_[g]) return nullptr;
  if (stage_ < 2) return flat_.grads()[g].data();
  if (!working_grads_[g]) {  // until reduce-scattered
    const size_t n = shard_[g] * size_t(D_);
    working_grads_[g] = hold_f32(n);
    if (n) dev_->memset_zero(working_grads_[g].data(), n * sizeof(float));
  }
  return working_grads_[g].data();
}

Held<Buffer<float>> ZeroSharding::hold_f32(size_t n) {
  const MemoryScope tag(MemoryCategory::kCommunication);
  if (!keeps_working()) return Held(Buffer<float>(dev_, n));
  return Held(kept_f32_, kept_f32_.take(n, [&](size_t m) { return Buffer<float>(dev_, m); }));
}

Held<DBuffer> ZeroSharding::hold_low(size_t n) {
  const MemoryScope tag(MemoryCategory::kCommunication);
  if (!keeps_working() && !keeps_low_grads()) return Held(DBuffer(dev_, opt_.reduce_dtype, n));
  return Held(kept_low_,
              kept_low_.take(n, [&](size_t m) { return DBuffer(dev_, opt_.reduce_dtype, m); }));
}

Held<DBuffer> ZeroSharding::hold_params(size_t n) {
  // (in start_gather's MemoryScope)
  if (!keeps_working()) return Held(DBuffer(dev_, cdt_, n));
  return Held(kept_params_, kept_params_.take(n, [&](size_t m) { return DBuffer(dev_, cdt_, m); }));
}

bool ZeroSharding::count_ready(std::vector<int>& count, int group) const {
  const size_t g = size_t(group);
  // One report more than the micro-batches would have made an earlier micro-batch's partial
  // gradient final (reduced, and the rest added after it): never go on with that.
  const int n = ++count[g];
  FT_CHECK(n <= micro_batches_, "ZeRO: group ", group, "'s gradient reported complete ", n,
           " times in a step of ", micro_batches_, " micro-batches");
  return n == micro_batches_;
}

void ZeroSharding::grads_ready(int group) {
  const size_t g = size_t(group), s = shard_[g];
  if (!trains_[g]) return;
  const bool last = count_ready(ready_count_, group);  // the group's gradient is final
  if (stage_ < 2) {
    if (last && D_ == 1 && offload_ && !shared(group)) land_group(group);
    if (last && D_ > 1 && opt_.overlap) reduce_group(group);
    return;
  }
  if (last) maybe_inject_nan(group, working(g));
  const Stream st = dev_->stream();
  Held<Buffer<float>>& w = working_grads_[g];
  if (D_ == 1) {     // the working gradient is the whole shard: no collective to go through
    if (offload_) {  // (never kept buffers)
      const float* src = w.data();  // before the buffer is moved into the call
      land(host_grads_[g].data(), src, s, landed_[g], w.take_owned());
      landed_[g] = true;
      return;
    }
    dev_->ops().add(st, grad_shards_[g].data(), w.data(), s);
    w.reset();
    return;
  }
  Scatter x{group, CommWork(), {}, hold_f32(s), {}, {}};
  if (opt_.reduce_dtype == DType::kF32) {
    x.work = comm_.reduce_scatter(st, w.data(), x.mine.data(), s);
    x.working = std::move(w);  // read by the call
  } else {
    x.low_in = hold_low(s * size_t(D_));
    x.low_out = hold_low(s);
    dev_->ops().convert(st, x.low_in.data(), w.data(), s * size_t(D_));
    w.reset();  // the call reads low_in
    x.work = comm_.reduce_scatter(st, x.low_in.data(), x.low_out.data(), s);
  }
  scatters_.push_back(std::move(x));
  // Without overlap each reduce-scatter is waited for at once; with it, at most two stay in
  // flight (their working gradients with them) while the backward goes on.
  retire_scatters(opt_.overlap ? 2 : 0);
}

}  // namespace ft
