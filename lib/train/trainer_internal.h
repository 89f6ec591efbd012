// What the files of ft train's run share, and nothing outside lib/train includes:
//   trainer.cpp            train(): the setup, the loop and its bookkeeping (RunLog), the end
//   checkpoint_policy.cpp  Checkpoints: when a save is due, the save with its manifest fields,
//                          each commit reported once seen; the plan printed at the start
//   resume.cpp             where the run starts: checkpoint.dir cleared for `--resume never`
//                          with checkpoint.overwrite, the checkpoint resumed from (falling back
//                          past damaged ones), the step folders past it removed
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/zero.h"
#include "recipe/recipe.h"
#include "train/metrics.h"
#include "train/step.h"
#include "train/tensorboard.h"

namespace ft::train_detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Where the run starts: after `step` steps (0: afresh), from `folder`.
struct ResumePoint {
  int64_t step = 0;
  int64_t tokens = 0;  // trained by then
  std::string folder;  // empty: not resumed
};

// ---- Where the run starts (resume.cpp) ----

// `--resume never` with checkpoint.overwrite: rank 0 deletes the checkpoints of checkpoint.dir
// (its step folders and `latest`; ft.lock stays), once every rank has chosen where to start.
void delete_for_overwrite(const Recipe& r, Communicator& comm, const std::string& resume);

// Resume: the newest usable candidate. A damaged one (a shard that fails its checksum, a
// truncated file, a manifest that fails its checks) falls back to the previous complete
// checkpoint under --resume auto; every rank must load the same one, so they agree after each
// attempt. Damaged folders fallen back from are set aside (renamed, never deleted: the damage
// may be temporary, as on a slow file system) once a fallback has loaded; when none loads,
// nothing is renamed, so that a later attempt finds the folders as they were.
// scaler (fp16 only, else null) continues from the checkpoint's loss scaler state when it has
// one (older checkpoints, or one saved in another precision: the recipe's settings).
ResumePoint resume_state(const Recipe& r, Communicator& comm, const std::string& resume,
                         const std::vector<std::string>& candidates, LlamaModel& model,
                         ZeroSharding& zero, AdamW& optim, LossScaler* scaler, const Mesh& mesh);

// Checkpoint folders past the starting step belong to a timeline this run replaces (one newer
// than the PATH resumed from, or an interrupted save): this run's saves must not meet them,
// half-overwritten, under the same names. Only the folder's name decides (a damaged manifest
// could say anything), and complete folders at or before the starting step always stay.
void remove_steps_past(const Recipe& r, const ResumePoint& at);

// ---- The loop's bookkeeping (trainer.cpp) ----

// Rank 0's reports, for machines (the metrics file and logging.tensorboard's event file, DESIGN.md
// §7) and for people (the progress line); no-ops on the other ranks.
class RunLog {
 public:
  RunLog(const Recipe& r, bool is_root, const ResumePoint& at);
  double elapsed_s() const { return seconds_since(t_start_); }

  // Steps k, 2k, … of logging.every_steps k, beside the eval lines and checkpoints of those
  // steps; also the first step of this process (quick sign of life) and the last.
  bool step_due(int64_t step) const;
  // first_step_s >= 0 on the first step of the process: time_to_first_step_s on its line.
  void step(const StepResult& res, const RunFigures& figures, double first_step_s);
  // dpo: the evaluation's DPO figures (keys eval_rewards_chosen, ...), or null.
  void eval(int64_t step, double eval_loss, const DpoStats* dpo = nullptr);
  // A checkpoint's commit, at `step`: the steps done when it was seen.
  void commit(int64_t step, const ckpt::CheckpointWriter::Committed& c);
  void note(const std::string& line);
  void finish() { progress_.finish(); }

 private:
  void write(const nlohmann::json& line);  // to the metrics file and the event file

  const Recipe& r_;
  bool is_root_;
  MetricsWriter metrics_;
  TensorBoardWriter tensorboard_;
  Progress progress_;
  ResumePoint start_;
  Clock::time_point t_start_;
};

// ---- Checkpoints (checkpoint_policy.cpp) ----

// Checkpoints as the loop sees them: when one is due, the save (with the manifest's fields of
// that step), and each commit reported once seen.
class Checkpoints {
 public:
  Checkpoints(const Recipe& r, Communicator& comm, const Mesh& mesh, LlamaModel& model,
              ZeroSharding& zero, AdamW& optim, const LossScaler* scaler,
              const std::string& tokenizer_sha, const ResumePoint& at, RunLog& log);

  bool on() const { return on_; }
  int64_t last_saved() const { return last_saved_; }
  // Rank 0's clock: checkpoint.every_minutes have passed since the last save (or the start).
  bool clock_due() const;
  // After `step`: every_steps, the world's agreement on the clock, or the last step.
  bool due(int64_t step, bool by_clock, bool last) const;

  // A save after `done` steps, `tokens` trained.
  void save(int64_t done, int64_t tokens);
  // The save after step `step` of the loop. A save can take one rank much longer than the
  // others (a slow disk, rank 0's manifest): the ranks meet here, under the long allowance,
  // rather than in the next step's first collective under the step timeout.
  void save_after_step(int64_t step, int64_t tokens);
  // Reports a commit seen since the last look, at `step` (the steps done by now).
  void poll(int64_t step);
  // Before the optimizer writes the state an async save may still be copying (CUDA).
  void fence_staging_copies() { writer_.fence_staging_copies(); }
  // Waits for the save in flight: this rank's shard durable; on rank 0, the checkpoint committed.
  void wait(int64_t step);

 private:
  static ckpt::CheckpointWriter::Options writer_options(const Recipe& r, Communicator& comm,
                                                        const Mesh& mesh, Device* dev);

  const Recipe& r_;
  Communicator& comm_;
  ZeroSharding& zero_;  // offload: its pending update applied before a save reads the state
  const AdamW& optim_;
  const LossScaler* scaler_;  // fp16: saved with the manifest
  RunLog& log_;
  bool on_;
  ckpt::CheckpointWriter writer_;
  std::vector<ckpt::PieceSource> pieces_;
  nlohmann::json manifest_;
  int64_t last_saved_;
  Clock::time_point t_last_save_;
};

void print_checkpoint_plan(const Recipe& r);

}  // namespace ft::train_detail
