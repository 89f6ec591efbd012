#include "train/dpo.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/progress.h"
#include "train/train_state.h"

namespace ft {
namespace {

// log σ(x) without overflow: −log(1 + e^−x) for x ≥ 0, x − log(1 + e^x) below.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}
double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

}  // namespace

DpoPairLoss dpo_pair_loss(const DpoConfig& c, double chosen, double rejected, double ref_chosen,
                          double ref_rejected) {
  const double z = (chosen - ref_chosen) - (rejected - ref_rejected), beta = c.beta;
  DpoPairLoss out;
  double dz = 0;  // d loss / d z; dz/d chosen = 1, dz/d rejected = −1
  if (c.loss == "sigmoid") {
    const double eps = c.label_smoothing;
    out.loss = -(1 - eps) * log_sigmoid(beta * z) - eps * log_sigmoid(-beta * z);
    dz = -(1 - eps) * beta * sigmoid(-beta * z) + eps * beta * sigmoid(beta * z);
  } else if (c.loss == "hinge") {
    const double h = 1 - beta * z;
    out.loss = h > 0 ? h : 0;
    dz = h > 0 ? -beta : 0;
  } else {
    FT_CHECK(c.loss == "ipo", "unknown dpo.loss ", c.loss);
    const double d = z - 1 / (2 * beta);
    out.loss = d * d;
    dz = 2 * d;
  }
  out.dchosen = dz;
  out.drejected = -dz;
  return out;
}

void DpoObjective::set_reference(uint64_t first_row, std::vector<double> ref) {
  collecting_ = false;
  first_row_ = first_row;
  ref_ = std::move(ref);
}

void DpoObjective::collect(uint64_t first_row, size_t rows) {
  collecting_ = true;
  first_row_ = first_row;
  collected_.assign(rows, 0.0);
}

double DpoObjective::rows(const double* logp, const double* targets, int B, uint64_t first_row,
                          float weight, double* dlogp) {
  FT_CHECK(first_row >= first_row_ && first_row % 2 == 0 && B % 2 == 0, "DPO: rows ", first_row,
           " + ", B, " are not whole pairs of the batch set up at row ", first_row_);
  const size_t at = size_t(first_row - first_row_);
  if (collecting_) {
    FT_CHECK(at + size_t(B) <= collected_.size(), "DPO: row ", first_row + uint64_t(B),
             " is past the rows collected");
    for (int b = 0; b < B; ++b) collected_[at + size_t(b)] = logp[b];
    if (dlogp)
      for (int b = 0; b < B; ++b) dlogp[b] = 0;
    return 0;
  }
  FT_CHECK(at + size_t(B) <= ref_.size(), "DPO: row ", first_row + uint64_t(B),
           " has no reference log-probability");
  const bool mean = c_.loss == "ipo";  // IPO compares per-token means (dpo.h)
  double loss = 0;
  for (int b = 0; b < B; b += 2) {
    // A completion with no trained token (a hand-made shard) has log-probability 0.
    const double nc = mean ? std::max(targets[b], 1.0) : 1.0;
    const double nr = mean ? std::max(targets[b + 1], 1.0) : 1.0;
    const double pc = logp[b] / nc, pr = logp[b + 1] / nr;
    const double rc = ref_[at + size_t(b)] / nc, rr = ref_[at + size_t(b) + 1] / nr;
    const DpoPairLoss l = dpo_pair_loss(c_, pc, pr, rc, rr);
    loss += l.loss;
    if (dlogp) {
      dlogp[b] = double(weight) * l.dchosen / nc;
      dlogp[b + 1] = double(weight) * l.drejected / nr;
    }
    // The metrics of the sums, whatever the loss (TRL's): IPO's means are the loss's only.
    const double sc = logp[b], sr = logp[b + 1];
    const double reward_c = c_.beta * (sc - ref_[at + size_t(b)]),
                 reward_r = c_.beta * (sr - ref_[at + size_t(b) + 1]);
    stats_.pairs += 1;
    stats_.loss += l.loss;
    stats_.rewards_chosen += reward_c;
    stats_.rewards_rejected += reward_r;
    stats_.correct += reward_c > reward_r ? 1 : 0;
    stats_.logps_chosen += sc;
    stats_.logps_rejected += sr;
  }
  return loss;
}

DpoStats DpoObjective::take_stats() {
  const DpoStats s = stats_;
  stats_ = DpoStats{};
  return s;
}

void DpoStats::add_metrics(nlohmann::json& line, const std::string& prefix) const {
  const double n = pairs > 0 ? pairs : 1;
  line[prefix + "rewards_chosen"] = rewards_chosen / n;
  line[prefix + "rewards_rejected"] = rewards_rejected / n;
  line[prefix + "reward_margin"] = (rewards_chosen - rewards_rejected) / n;
  line[prefix + "reward_accuracy"] = correct / n;
  line[prefix + "logps_chosen"] = logps_chosen / n;
  line[prefix + "logps_rejected"] = logps_rejected / n;
}

DpoRun::DpoRun(const Recipe& r, LlamaModel& model, PipelineSchedule& pipeline)
    : r_(r), model_(model), pipeline_(pipeline), objective_(r.dpo) {
  model_.set_row_objective(&objective_);
}

DpoRun::~DpoRun() { model_.set_row_objective(nullptr); }

std::vector<double> DpoRun::reference_table(LoaderOptions opt, Communicator& world, bool is_root,
                                            const std::string& what) {
  opt.shuffle = false;
  opt.prefetch = 0;
  DataLoader loader(opt);
  const uint64_t n = loader.samples_per_epoch(), G = uint64_t(opt.global_batch);
  const int64_t steps = int64_t((n + G - 1) / G);
  // Only the head's ranks see log-probabilities, and tensor ranks see the same ones: the first
  // tensor rank of the last stage writes, every other rank adds zeros.
  const bool writes = model_.stage().head && model_.tensor_rank() == 0;
  std::vector<double> table(2 * n, 0.0);
  if (is_root)
    std::printf("ft: dpo: the reference's log-probabilities of %llu pairs (%s), %lld batches\n",
                (unsigned long long)n, what.c_str(), (long long)steps);
  std::fflush(stdout);
  WorkProgress progress("dpo reference", double(steps), WorkProgress::Unit::kItems, "batches",
                        is_root);
  for (int64_t s = 0; s < steps; ++s) {
    // A stop signal (Ctrl-C, SLURM's warning) ends the pass at once, every rank agreeing: the
    // pass can take long over a large set, and nothing of it is worth saving half done.
    float asked = stop_signal() != 0 ? 1.0f : 0.0f;
    world.all_reduce_max(&asked, 1);
    if (asked > 0) {
      stopped_ = true;
      progress.close();
      if (is_root)
        std::printf("ft: dpo: stopped by a signal after %lld of %lld reference batches\n",
                    (long long)s, (long long)steps);
      return {};
    }
    const StepSamples b = loader.next();
    objective_.collect(b.first_sample, size_t(b.count));
    pipeline_.eval_batch(b, micro_rows());
    // The last batch runs past the end into the next epoch's first pairs: each pair is written
    // once, by the batch position that is its first.
    const uint64_t first_pair = b.first_sample / 2;
    if (writes)
      for (size_t p = 0; p < b.pair_index.size(); ++p) {
        if (first_pair + p >= n) break;
        const uint64_t i = b.pair_index[p];
        table[2 * i] = objective_.collected()[2 * p];
        table[2 * i + 1] = objective_.collected()[2 * p + 1];
      }
    progress.update(double(s + 1));
  }
  progress.finish();
  world.all_reduce_sum(table.data(), table.size());
  return table;
}

void DpoRun::prepare(const StepSamples& b, bool valid) {
  if (r_.dpo.reference == "base") {
    objective_.collect(b.first_sample, size_t(b.count));
    model_.set_hooks_enabled(false);
    pipeline_.eval_batch(b, micro_rows());
    model_.set_hooks_enabled(true);
    objective_.set_reference(b.first_sample, objective_.collected());
    return;
  }
  const std::vector<double>& table = valid ? valid_table : train_table;
  std::vector<double> ref(size_t(b.count));
  for (size_t p = 0; p < b.pair_index.size(); ++p) {
    const uint64_t i = b.pair_index[p];
    FT_CHECK(2 * i + 1 < table.size(), "DPO: pair ", i, " has no reference log-probability");
    ref[2 * p] = table[2 * i];
    ref[2 * p + 1] = table[2 * i + 1];
  }
  objective_.set_reference(b.first_sample, std::move(ref));
}

DpoStats DpoRun::take_stats(Communicator* pipe, Communicator& data) {
  DpoStats s = objective_.take_stats();
  if (pipe) pipe->all_reduce_sum(s.data(), DpoStats::kFields);
  data.all_reduce_sum(s.data(), DpoStats::kFields);
  return s;
}

}  // namespace ft
