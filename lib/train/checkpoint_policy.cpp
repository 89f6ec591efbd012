// The run's checkpoints as the loop sees them (Checkpoints, trainer_internal.h): a save is due
// every checkpoint.every_steps, every checkpoint.every_minutes (rank 0's clock, agreed by the
// step) and after the last step, and the loop saves after a stop signal too; the writer
// (ckpt::CheckpointWriter) saves, async when checkpoint.async, and keeps checkpoint.keep_last;
// each commit is reported (metrics line and progress note) once seen.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "train/train_state.h"
#include "train/trainer_internal.h"

namespace ft::train_detail {

Checkpoints::Checkpoints(const Recipe& r, Communicator& comm, const Mesh& mesh, LlamaModel& model,
                         ZeroSharding& zero, AdamW& optim, const LossScaler* scaler,
                         const std::string& tokenizer_sha, const ResumePoint& at, RunLog& log)
    : r_(r),
      comm_(comm),
      zero_(zero),
      optim_(optim),
      scaler_(scaler),
      log_(log),
      on_(r.checkpoint.every_steps > 0 || r.checkpoint.every_minutes > 0),
      writer_(writer_options(r, comm, mesh, model.device())),
      pieces_(state_pieces(model, zero, optim, mesh)),
      last_saved_(at.folder.empty() ? -1 : at.step),
      t_last_save_(Clock::now()) {
  if (on_ && r.checkpoint.async) writer_.reserve(pieces_);  // ft plan reserves it the same way
  if (comm.rank() == 0) manifest_ = manifest_base(r, mesh, tokenizer_sha);
}

bool Checkpoints::clock_due() const {
  return r_.checkpoint.every_minutes > 0 &&
         seconds_since(t_last_save_) >= r_.checkpoint.every_minutes * 60.0;
}

bool Checkpoints::due(int64_t step, bool by_clock, bool last) const {
  return on_ && ((r_.checkpoint.every_steps > 0 && step % r_.checkpoint.every_steps == 0) ||
                 by_clock || last);
}

void Checkpoints::save(int64_t done, int64_t tokens) {
  zero_.flush_update();  // offload: the last step's update, where the next forward has not yet
  if (comm_.rank() == 0) {
    manifest_["step"] = done;
    manifest_["optimizer"]["step"] = optim_.step_count();
    // The schedule's position: applied steps (skipped fp16 steps do not advance it).
    manifest_["scheduler"]["step"] = optim_.step_count();
    if (scaler_) manifest_["loss_scaler"] = scaler_->to_json();
    manifest_["data"]["next_step"] = done;
    manifest_["data"]["tokens"] = tokens;
  }
  writer_.save(done, pieces_, manifest_);
  last_saved_ = done;
  t_last_save_ = Clock::now();
  poll(done);
}

void Checkpoints::save_after_step(int64_t step, int64_t tokens) {
  set_watch_step(step, "checkpoint save", /*long_wait=*/true);
  save(step, tokens);
  // Test support: FT_TEST_SLOW_SAVE=r:seconds makes world rank r's saves that much longer,
  // to test that a slow save does not trip the watchdog.
  if (const char* slow = std::getenv("FT_TEST_SLOW_SAVE"); slow && std::strchr(slow, ':'))
    if (std::atoi(slow) == comm_.rank()) {
      const double delay_s = std::atof(std::strchr(slow, ':') + 1);
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
    }
  comm_.barrier();
}

void Checkpoints::poll(int64_t step) {
  if (auto c = writer_.poll()) log_.commit(step, *c);
}

void Checkpoints::wait(int64_t step) {
  writer_.wait();
  poll(step);
}

ckpt::CheckpointWriter::Options Checkpoints::writer_options(const Recipe& r, Communicator& comm,
                                                            const Mesh& mesh, Device* dev) {
  ckpt::CheckpointWriter::Options wo;
  wo.dir = r.checkpoint.dir;
  wo.rank = comm.rank();
  wo.world = comm.size();
  wo.tensor_rank = mesh.t;
  wo.async = r.checkpoint.async;
  wo.keep_last = r.checkpoint.keep_last;
  wo.tokenizer = r.tokenizer.path.empty() ? "" : resolve_tokenizer_file(r.tokenizer.path);
  wo.staging_device = dev;
  uint64_t attempt = comm.rank() == 0
                         ? (uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) ^
                            (uint64_t(getpid()) << 48))
                         : 0;
  comm.broadcast_bytes(&attempt, sizeof attempt, 0);
  wo.attempt = attempt;
  return wo;
}

void print_checkpoint_plan(const Recipe& r) {
  std::printf("ft: checkpoints to %s: %s%s%s%s, keep %d\n", r.checkpoint.dir.c_str(),
              r.checkpoint.every_steps > 0
                  ? detail::concat("every ", r.checkpoint.every_steps, " steps").c_str()
                  : "",
              r.checkpoint.every_steps > 0 && r.checkpoint.every_minutes > 0 ? " and " : "",
              r.checkpoint.every_minutes > 0
                  ? detail::concat("every ", r.checkpoint.every_minutes, " minutes").c_str()
                  : "",
              r.checkpoint.async ? " (async)" : "", r.checkpoint.keep_last);
}

}  // namespace ft::train_detail
