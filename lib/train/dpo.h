// Direct Preference Optimization (Rafailov et al. 2023, "Direct Preference Optimization: Your
// Language Model is Secretly a Reward Model"), training.objective dpo (DESIGN.md §5 dpo:).
//
// A pair is a prompt x with a chosen completion y+ and a rejected one y-, two rows of a micro-batch
// (data/loader.h "Preference pairs"). log π(y|x) is the sum of the completion's token
// log-probabilities under the model trained, log π_ref the same under the frozen reference, and
// with z = (log π(y+) − log π_ref(y+)) − (log π(y-) − log π_ref(y-)) a pair's loss is
//   sigmoid   −(1 − ε)·log σ(β·z) − ε·log σ(−β·z)      (DPO; ε = label_smoothing, cDPO)
//   hinge     max(0, 1 − β·z)                             (SLiC, Zhao et al. 2023)
//   ipo       (z − 1/(2β))²                               (IPO, Azar et al. 2023), with each
//             log-probability the MEAN over the completion's tokens, not the sum, as TRL does
// and the step's loss is the mean over the global batch's pairs. The metrics (DESIGN.md §7), as
// TRL (1.x) defines them: rewards β·(log π − log π_ref) of each completion, their margin, the
// share of pairs whose chosen reward is the larger, and the log-probabilities themselves, all of
// the sums whatever the loss. (ε is the label smoothing of conservative DPO as TRL's sigmoid loss
// had it before 1.0; TRL 1.x keeps it for its "robust" loss only.)
//
// The reference's log-probabilities come from a pass without backward through the same model:
// `initial` runs it once over the data before step 1 (ReferenceTable, kept in the run folder);
// `base` runs it each step with the adapter's hooks off. Either way the rows' values reach the
// objective through set_reference before the step's forward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "data/loader.h"
#include "model/llama.h"
#include "parallel/pipeline.h"
#include "recipe/recipe.h"

namespace ft {

// One pair's loss and its gradient with respect to the two log-probabilities (as the loss uses
// them: sums, or means for ipo, the caller's to convert).
struct DpoPairLoss {
  double loss = 0;
  double dchosen = 0, drejected = 0;
};
DpoPairLoss dpo_pair_loss(const DpoConfig& c, double chosen, double rejected, double ref_chosen,
                          double ref_rejected);

// Sums over pairs, what a step's or an evaluation's metrics line reports divided by `pairs`.
struct DpoStats {
  double pairs = 0;
  double loss = 0;
  double rewards_chosen = 0, rewards_rejected = 0;
  double correct = 0;  // pairs whose chosen reward is above the rejected one
  double logps_chosen = 0, logps_rejected = 0;
  static constexpr int kFields = 7;
  double* data() { return &pairs; }
  // The metrics of DESIGN.md §7 (means over the pairs), their keys prefixed by `prefix`
  // ("eval_" on evaluation lines).
  void add_metrics(nlohmann::json& line, const std::string& prefix) const;
};

class DpoObjective final : public RowObjective {
 public:
  explicit DpoObjective(const DpoConfig& c) : c_(c) {}

  // The reference log-probabilities (sums over the completion) of the rows of the batch to
  // come, rows first_row, first_row + 1, ... (StepSamples::first_sample and count): the loss
  // mode.
  void set_reference(uint64_t first_row, std::vector<double> ref);
  // The collect mode: the next passes only record each row's log-probability (sum), for rows
  // first_row .. first_row + rows - 1, into collected(); no loss, no gradient.
  void collect(uint64_t first_row, size_t rows);
  const std::vector<double>& collected() const { return collected_; }

  double rows(const double* logp, const double* targets, int B, uint64_t first_row, float weight,
              double* dlogp) override;

  // The sums since the last call, and reset.
  DpoStats take_stats();

 private:
  DpoConfig c_;
  bool collecting_ = false;
  uint64_t first_row_ = 0;
  std::vector<double> ref_;        // loss mode: (rows) reference sums
  std::vector<double> collected_;  // collect mode: (rows) log-probabilities
  DpoStats stats_;
};

// The run's DPO state: the objective installed in the model's head, and where each batch's
// reference log-probabilities come from.
class DpoRun {
 public:
  // Installs the objective in `model` (removed again by the destructor).
  DpoRun(const Recipe& r, LlamaModel& model, PipelineSchedule& pipeline);
  ~DpoRun();
  DpoRun(const DpoRun&) = delete;
  DpoRun& operator=(const DpoRun&) = delete;

  DpoObjective& objective() { return objective_; }
  // Rows per micro-batch: two per pair.
  int micro_rows() const { return 2 * r_.training.micro_batch_size; }

  // reference: initial. The log-probabilities (sums) of every pair of a data set, pair i's chosen
  // at 2i and rejected at 2i + 1, as the model is now: a pass without backward over the pairs
  // in order, each data rank taking its slice of every global batch as in training (`opt`: the
  // training loader's slicing), then one all-reduce over the world. Rank 0 prints progress.
  std::vector<double> reference_table(LoaderOptions opt, Communicator& world, bool is_root,
                                      const std::string& what);
  std::vector<double> train_table, valid_table;  // initial: set before the first step
  // A stop signal ended reference_table early (its table is then empty).
  bool stopped() const { return stopped_; }

  // Before batch b's forward: its rows' reference in the objective (initial: looked up in the
  // table of its data set; base: a pass without backward with the adapter off).
  void prepare(const StepSamples& b, bool valid);

  // The sums of this rank's pairs since the last call, summed over the pipeline group (only the
  // last stage has them) and the data group (tensor ranks hold the same).
  DpoStats take_stats(Communicator* pipe, Communicator& data);

 private:
  const Recipe& r_;
  LlamaModel& model_;
  PipelineSchedule& pipeline_;
  DpoObjective objective_;
  bool stopped_ = false;
};

// dpo.reference: initial, before the first step of a process (dpo_reference.cpp): the tables
// from the run folder when they were computed from this run's inputs, else computed now and
// written there; `resumed`: the run continues from a checkpoint, where missing or mismatching
// tables are a UsageError on every rank. valid_opt: the validation loader's options, or null.
void dpo_initial_reference(DpoRun& dpo, const Recipe& r, Communicator& world, bool resumed,
                           const LoaderOptions& train_opt, const LoaderOptions* valid_opt);

}  // namespace ft
