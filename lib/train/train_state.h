// The training state as checkpoints see it (lib/ckpt/checkpoint.h): which pieces of the
// parameters and AdamW moments this rank saves, loading them back under any layout, choosing
// the checkpoint to resume from, and the stop signals of preemption.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/zero.h"
#include "recipe/recipe.h"

namespace ft {

// This rank's pieces: for every group it holds (the tied embedding only on the first stage),
// the ZeRO shard range of its data rank, of the parameters and both AdamW moments. Pointers
// stay valid for the life of the model, ZeRO and optimizer objects.
std::vector<ckpt::PieceSource> state_pieces(LlamaModel& model, ZeroSharding& zero, AdamW& optim,
                                            const Mesh& mesh);

// Loads parameters, AdamW moments and step count from a checkpoint of any layout into what
// this rank holds. Throws Error (naming the file) on a damaged checkpoint. show_progress: rank 0
// (core/progress.h), its bytes read.
void load_state(const ckpt::Manifest& m, LlamaModel& model, ZeroSharding& zero, AdamW& optim,
                const Mesh& mesh, int zero_stage, bool show_progress = false);

// Everything of the manifest that does not change between saves (rank 0 adds the rest).
nlohmann::json manifest_base(const Recipe& r, const Mesh& mesh, const std::string& tokenizer_sha);

// Throws Error (exit 2) when the checkpoint holds another model than the recipe describes.
void check_same_model(const ckpt::Manifest& m, const Recipe& r);

// The checkpoints to try, in order, for `--resume` (auto | never | PATH); empty: start afresh.
// auto: every complete checkpoint in checkpoint.dir, newest first (a damaged one falls back to
// the next). never: none; refuses a checkpoint.dir that holds checkpoints unless
// checkpoint.overwrite (then rank 0 deletes them). PATH: that one only.
std::vector<std::string> resume_candidates(const Recipe& r, const std::string& resume,
                                           bool is_root);

// Stop requests (DESIGN.md §4 "Signals"): the first SIGINT, SIGTERM or SIGUSR1 (what SLURM
// sends before preemption or the time limit, and `ft train --nproc` passes on) sets a flag that
// the step loop reads; the run then saves after the step and exits with code 75. A second
// SIGINT or SIGTERM ends the process at once with 128 + the signal (130, 143), without a
// checkpoint. Each says so on stderr, naming the rank (`rank` > 0), except under
// `ft train --nproc`, whose launcher has said it for every rank.
void install_stop_handlers(int rank);
// A rank started by a launcher (mpirun, orted, srun's slurmstepd) ends, saying why, as soon as
// that launcher ends, whatever ended it (PR_SET_PDEATHSIG): no rank trains on as an orphan.
void die_with_launcher();
int stop_signal();  // 0, or the signal received

}  // namespace ft
