// Where the run starts (trainer_internal.h), once every rank has the checkpoints `--resume`
// would try (preflight.h, checked_resume_candidates): checkpoint.dir cleared for `--resume never`
// with checkpoint.overwrite; the state loaded from the newest candidate that every rank can
// read, damaged ones set aside under --resume auto; then the step folders past that point
// removed, so that this run's saves never meet them.
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "train/metrics.h"
#include "train/train_state.h"
#include "train/trainer_internal.h"

namespace ft::train_detail {
namespace fs = std::filesystem;
using nlohmann::json;

void delete_for_overwrite(const Recipe& r, Communicator& comm, const std::string& resume) {
  if (resume != "never" || !r.checkpoint.overwrite || !ckpt::has_checkpoints(r.checkpoint.dir))
    return;
  comm.barrier();  // every rank has looked before rank 0 deletes
  if (comm.rank() != 0) return;
  log_warn("checkpoint.overwrite: deleting the checkpoints in ", r.checkpoint.dir);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(r.checkpoint.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "latest" || name.rfind("step_", 0) == 0) fs::remove_all(e.path(), ec);
  }
}

ResumePoint resume_state(const Recipe& r, Communicator& comm, const std::string& resume,
                         const std::vector<std::string>& candidates, LlamaModel& model,
                         ZeroSharding& zero, AdamW& optim, LossScaler* scaler, const Mesh& mesh) {
  const bool is_root = comm.rank() == 0;
  ResumePoint at;
  std::vector<std::pair<std::string, std::string>> damaged;  // folder, why
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string err;
    std::optional<ckpt::Manifest> m;
    try {
      m = ckpt::read_manifest(candidates[i]);
    } catch (const Error& e) {
      err = e.what();
    }
    if (m) {
      check_same_model(*m, r);  // a usage error on every rank alike, no fallback
      const auto t0 = Clock::now();
      try {
        load_state(*m, model, zero, optim, mesh, r.parallel.zero_stage, is_root);
      } catch (const Error& e) {
        err = e.what();
      }
      if (err.empty() && is_root)
        log_info("resumed from ", candidates[i], " (step ", m->step, ", saved by ", m->data,
                 " data x ", m->pipeline, " pipeline x ", m->tensor, " tensor ranks, ZeRO ",
                 m->zero_stage, ") in ", Progress::human_seconds(seconds_since(t0)));
    }
    float bad = err.empty() ? 0.0f : 1.0f;
    comm.all_reduce_max(&bad, 1);
    if (bad == 0.0f) {
      at.step = m->step;
      at.tokens = m->tokens;
      at.folder = candidates[i];
      if (scaler && m->loss_scaler) scaler->restore(*m->loss_scaler);
      const json d = m->json.value("data", json::object());  // typed by read_manifest
      if (is_root &&
          (d.value("global_batch_size", 0) != r.training.global_batch_size ||
           d.value("seq_len", 0) != r.data.seq_len || d.value("seed", uint64_t(0)) != r.run.seed ||
           d.value("shuffle", true) != r.data.shuffle || d.value("pack", false) != r.data.pack ||
           (r.data.pack && d.value("pack_overflow", std::string("split")) != r.data.pack_overflow)))
        log_warn(
            "the data settings differ from the checkpoint's (global_batch_size, seq_len, "
            "run.seed, data.shuffle, data.pack or data.pack_overflow): the run continues with "
            "step ",
            at.step + 1, " of the new order, not where the saved run would have gone");
      break;
    }
    if (!err.empty()) log_warn("cannot resume from ", candidates[i], ": ", err);
    damaged.emplace_back(candidates[i], err.empty() ? "another rank could not read it" : err);
    if (resume != "auto")
      throw Error("cannot resume from " + candidates[i] +
                  (err.empty() ? std::string(" (another rank could not read it)") : ": " + err));
    if (i + 1 < candidates.size()) {
      if (is_root)
        log_warn("falling back to the previous complete checkpoint, ", candidates[i + 1]);
    } else {
      throw Error("no usable checkpoint in " + r.checkpoint.dir +
                  " (every complete one is damaged, see above); restore the files, or start "
                  "afresh with --resume never checkpoint.overwrite=true");
    }
  }
  if (is_root && !at.folder.empty())
    for (const auto& [folder, why] : damaged) {
      const std::string aside = ckpt::set_aside_damaged(folder);
      log_warn("set the damaged checkpoint ", folder, " aside as ", aside, " (", why,
               "); nothing in it was deleted: inspect it with `ft inspect`, then remove it");
    }
  return at;
}

void remove_steps_past(const Recipe& r, const ResumePoint& at) {
  std::error_code ec;
  if (!fs::is_directory(r.checkpoint.dir, ec)) return;
  for (const auto& e : fs::directory_iterator(r.checkpoint.dir, ec)) {
    const int64_t step = ckpt::parse_step_folder_name(e.path().filename().string());
    if (step < 0) continue;  // not a step folder, or one set aside as damaged
    if (step <= at.step && !(step == at.step && at.folder.empty())) continue;
    const bool complete = fs::exists(e.path() / "COMPLETE");
    if (complete)
      log_warn("removing ", e.path().string(), ": it is past the step this run starts from (",
               at.step, ") and would be overwritten by this run's saves");
    fs::remove_all(e.path(), ec);
  }
}

}  // namespace ft::train_detail
