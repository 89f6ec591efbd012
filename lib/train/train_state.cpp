#include "train/train_state.h"

#include <sys/prctl.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "adapt/peft.h"
#include "ckpt/hf.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "model/layout.h"
#include "parallel/partition.h"
#include "train/setup.h"

namespace ft {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* split_name(TensorSplit s) {
  return s == TensorSplit::kRows ? "rows" : s == TensorSplit::kCols ? "cols" : "replicated";
}

volatile std::sig_atomic_t g_stop_signal = 0;   // the first stop request: SIGINT, SIGTERM, SIGUSR1
volatile std::sig_atomic_t g_hard_signal = 0;   // the first SIGINT or SIGTERM
volatile std::sig_atomic_t g_usr1_quiet = 0;    // under `ft train --nproc`, which says it itself
volatile std::sig_atomic_t g_launcher_pid = 0;  // the launcher a rank dies with (0: none)
volatile std::sig_atomic_t g_nproc_parent = 0;  // `ft train --nproc`'s process (0: none)
volatile std::sig_atomic_t g_open_mpi = 0;      // started by Open MPI's mpirun or orted

char g_prefix[32] = "ft: ";  // "ft: [rank 3] " on other ranks, set before the handlers

void say(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, s, n);
}

const char* name_of(int sig) {
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGUSR1 ? "SIGUSR1"
                          : "a signal";
}

// Async-signal-safe: flags, write(2) and _exit only.
void on_stop_signal(int sig, siginfo_t* info, void*) {
  const bool hard = sig == SIGINT || sig == SIGTERM;
  // Open MPI's mpirun (or orted) sends SIGTERM to end the job (a rank failed, or mpirun itself
  // was told to stop); it passes a save request on as SIGUSR1. So its SIGTERM is no request to
  // save, and nothing would be saved before it kills the rank anyway: end now, saying so. (Under
  // SLURM, slurmstepd's SIGTERM at preemption or the time limit is a save request: kept below.)
  if (sig == SIGTERM && g_open_mpi && g_launcher_pid != 0 && info &&
      info->si_pid == pid_t(g_launcher_pid)) {
    say(g_prefix);
    say("mpirun is ending the job: stopping now, without a checkpoint\n");
    ::_exit(128 + sig);
  }
  if (hard && g_hard_signal != 0) {
    // The second SIGINT or SIGTERM: stop now. A save in progress is left incomplete, which a
    // resume never takes (checkpoints are committed by `latest` last, DESIGN.md §8).
    say(g_prefix);
    say(name_of(sig));
    say(" again: stopping now, without a checkpoint\n");
    ::_exit(128 + sig);
  }
  if (hard) g_hard_signal = sig;
  if (g_stop_signal == 0) {
    g_stop_signal = sig;
    // "if every rank is still running": a rank that dies meanwhile ends the job without one.
    // Rank 0 reports the save once it is made.
    const bool relayed = sig == SIGUSR1 && g_usr1_quiet && info &&
                         ((g_launcher_pid != 0 && info->si_pid == pid_t(g_launcher_pid)) ||
                          (g_nproc_parent != 0 && info->si_pid == pid_t(g_nproc_parent)));
    if (!relayed) {
      say(g_prefix);
      say(name_of(sig));
      say(": stopping after this step, with a checkpoint if every rank is still running");
      say(hard ? " (send it again to stop at once, without one)\n" : "\n");
    }
  }
}

// The launcher of this rank (mpirun, Open MPI's orted, slurmstepd) has ended: the kernel sent
// SIGUSR2 (PR_SET_PDEATHSIG). Nothing supervises the job any more, and MPI's own shutdown needs
// the launcher, so the rank ends here, at once, saying why. What it was saving stays incomplete
// and is never resumed from.
void on_launcher_death(int) {
  if (g_launcher_pid == 0 || ::getppid() == pid_t(g_launcher_pid)) return;  // not our parent
  say(g_prefix);
  say("this rank's launcher (mpirun, orted or srun's slurmstepd) has ended: stopping now, "
      "without a checkpoint\n");
  ::_exit(int(ExitCode::kRuntime));
}

}  // namespace

std::vector<ckpt::PieceSource> state_pieces(LlamaModel& model, ZeroSharding& zero, AdamW& optim,
                                            const Mesh& mesh) {
  std::vector<ckpt::PieceSource> out;
  const auto& groups = model.layout().groups();
  const std::vector<float*> params = zero.param_bases();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int g = int(gi);
    if (!model.owns_group(g) || !groups[gi].trains()) continue;  // frozen: never saved
    if (g == 0 && mesh.p != 0) continue;  // the tied embedding held by the last stage too
    // The ZeRO cut at every stage, so even at stage 0 each data rank writes 1/D of the state.
    const ShardRange w = zero_shard(groups[gi].numel, mesh.data, mesh.d);
    if (w.size() == 0) continue;
    // param_bases()[g] and the moments start at ranges()[g].begin: the whole buffer at stage 0,
    // this data rank's shard (= w) from stage 1 on.
    const size_t pskip = w.begin - zero.ranges()[gi].begin;
    const size_t oskip = w.begin - optim.ranges()[gi].begin;
    // Offloaded, the state is host memory: no device to copy it from.
    Device* dev = zero.offloaded() ? nullptr : model.device();
    Device* odev = optim.on_host() ? nullptr : model.device();
    out.push_back({ckpt::State::kParam, g, w.begin, w.end, params[gi] + pskip, dev});
    out.push_back({ckpt::State::kExpAvg, g, w.begin, w.end, optim.exp_avg(g) + oskip, odev});
    out.push_back({ckpt::State::kExpAvgSq, g, w.begin, w.end, optim.exp_avg_sq(g) + oskip, odev});
  }
  return out;
}

void load_state(const ckpt::Manifest& m, LlamaModel& model, ZeroSharding& zero, AdamW& optim,
                const Mesh& mesh, int zero_stage, bool show_progress) {
  const auto& groups = model.layout().groups();
  const bool masters = zero_stage == 3 || model.compute_dtype() != DType::kF32;
  auto param_range = [&](size_t gi) {
    return masters || zero.offloaded() ? zero.ranges()[gi] : ShardRange{0, groups[gi].numel};
  };
  // Progress: the bytes this rank reads, its parameters' range and both moments' of each group.
  double total = 0, done = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    if (model.owns_group(int(gi)) && groups[gi].trains())
      total +=
          double(sizeof(float)) * double(param_range(gi).end - param_range(gi).begin +
                                         2 * (optim.ranges()[gi].end - optim.ranges()[gi].begin));
  WorkProgress progress("reading " + std::filesystem::path(m.dir).filename().string(), total,
                        WorkProgress::Unit::kBytes, "", show_progress);
  const std::vector<float*> params = zero.param_bases();
  // Each range is read on the host, then copied to the device.
  Device* dev = model.device();
  std::vector<float> host;
  // on_host: dst is host memory (the offloaded state), read into directly.
  auto read = [&](ckpt::State state, int g, size_t begin, size_t end, float* dst, bool on_host) {
    if (on_host) {
      ckpt::read_range(m, state, g, mesh.tensor, mesh.t, begin, end, dst);
      return;
    }
    host.resize(end - begin);
    ckpt::read_range(m, state, g, mesh.tensor, mesh.t, begin, end, host.data());
    if (end > begin) dev->copy_from_host(dst, host.data(), (end - begin) * sizeof(float));
  };
  std::vector<int> frozen;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    if (!groups[gi].trains()) frozen.push_back(int(gi));
  FT_CHECK(frozen == m.frozen_groups, m.dir, ": other frozen groups than the run's");
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int g = int(gi);
    if (!model.owns_group(g) || !groups[gi].trains()) continue;  // frozen: as the run started
    const ShardRange p = param_range(gi);
    if (masters || zero.offloaded())  // into the fp32 masters
      read(ckpt::State::kParam, g, p.begin, p.end, params[gi], zero.offloaded());
    else
      read(ckpt::State::kParam, g, 0, p.end, model.flat_params().params()[gi].data(), false);
    const ShardRange& o = optim.ranges()[gi];
    read(ckpt::State::kExpAvg, g, o.begin, o.end, optim.exp_avg(g), optim.on_host());
    read(ckpt::State::kExpAvgSq, g, o.begin, o.end, optim.exp_avg_sq(g), optim.on_host());
    done += double(sizeof(float)) * double(p.end - p.begin + 2 * (o.end - o.begin));
    progress.update(done, groups[gi].name);
  }
  progress.finish();
  // 16-bit compute dtype, or offloaded: the compute copy is made from the loaded masters.
  if (model.compute_dtype() != DType::kF32 || zero.offloaded()) zero.sync_compute_params();
  optim.set_step_count(m.optimizer_step);
}

json manifest_base(const Recipe& r, const Mesh& mesh, const std::string& tokenizer_sha) {
  const ModelConfig& c = r.model;
  json j;
  j["layout"] = {{"world", mesh.data * mesh.tensor * mesh.pipeline},
                 {"data", mesh.data},
                 {"tensor", mesh.tensor},
                 {"pipeline", mesh.pipeline},
                 {"zero_stage", r.parallel.zero_stage}};
  j["model"] = {{"arch", c.arch},
                {"dim", c.dim},
                {"n_layers", c.n_layers},
                {"n_heads", c.n_heads},
                {"n_kv_heads", c.n_kv_heads},
                {"ffn_dim", c.ffn_dim},
                {"vocab_size", c.vocab_size},
                {"max_seq_len", c.max_seq_len},
                {"rope_theta", c.rope_theta},
                {"norm_eps", c.norm_eps},
                {"tie_embeddings", c.tie_embeddings}};
  if (c.head_dim > 0) j["model"]["head_dim"] = c.head_dim;  // only where it is not dim / n_heads
  // RoPE scaling: written only when there is some, so a default-RoPE manifest is byte for byte
  // what older builds wrote, and a manifest without the key reads as default (ckpt/manifest.cpp).
  if (c.rope_type != "default")
    j["model"]["rope_scaling"] = {{"rope_type", c.rope_type},
                                  {"factor", c.rope_factor},
                                  {"low_freq_factor", c.rope_low_freq_factor},
                                  {"high_freq_factor", c.rope_high_freq_factor},
                                  {"original_max_seq_len", c.rope_original_max_seq_len}};
  json tensors = json::array();
  const ParamLayout whole = checkpoint_layout(r);
  for (size_t g = 0; g < whole.groups().size(); ++g)
    for (const auto& e : whole.groups()[g].entries)
      tensors.push_back({{"name", e.name},
                         {"shape", e.global_shape},
                         {"dtype", "f32"},
                         {"group", g},
                         {"group_name", whole.groups()[g].name},
                         {"split", split_name(e.split)}});
  j["tensors"] = tensors;
  // Frozen groups hold no state here; they are the run's starting weights, from model.from or
  // the seeded initialisation, which a resume must find unchanged (check_same_model). Written only
  // when there are some, so other manifests are as before.
  json frozen = json::array();
  for (size_t g = 0; g < whole.groups().size(); ++g)
    if (!whole.groups()[g].trains()) frozen.push_back(g);
  if (!frozen.empty()) {
    j["frozen"] = {
        {"groups", frozen}, {"from", c.from}, {"seed", r.run.seed}, {"init_std", c.init_std}};
    // The base by content, so that a resume can tell another model in the same folder (or this
    // one moved elsewhere).
    if (!c.from.empty()) j["frozen"]["from_fingerprint"] = hf_weights_fingerprint(c.from);
  }
  // The adapter (adapt/config.h): what rebuilds the checkpoint's layout (ckpt::manifest_layout)
  // and what a resume must train again. Written only by adapter runs.
  if (r.adapter.enabled())
    j["adapter"] = {{"type", r.adapter.type},
                    {"r", r.adapter.r},
                    {"alpha", r.adapter.alpha},
                    {"dropout", r.adapter.dropout},
                    {"target_modules", r.adapter.targets()},
                    {"use_rslora", r.adapter.use_rslora},
                    {"init", r.adapter.init},
                    {"from", r.adapter.from},
                    {"modules_to_save", r.adapter.modules_to_save}};
  j["optimizer"] = {{"name", r.optimizer.name},
                    {"lr", r.optimizer.lr},
                    {"betas", {r.optimizer.beta1, r.optimizer.beta2}},
                    {"eps", r.optimizer.eps},
                    {"weight_decay", r.optimizer.weight_decay}};
  j["scheduler"] = {{"name", r.scheduler.name},
                    {"warmup_steps", r.scheduler.warmup_steps},
                    {"min_lr", r.scheduler.min_lr},
                    {"total_steps", r.training.steps}};
  j["data"] = {{"train", r.data.train},
               {"seq_len", r.data.seq_len},
               {"shuffle", r.data.shuffle},
               {"pack", r.data.pack},
               {"pack_overflow", r.data.pack_overflow},
               {"seed", r.run.seed},
               {"global_batch_size", r.training.global_batch_size},
               {"objective", r.training.objective}};
  // ft draws no random numbers after initialisation (no dropout); the data order is a function
  // of (seed, position). So the seed and the positions above are the whole random state.
  j["rng"] = {{"seed", r.run.seed}, {"draws_after_init", 0}};
  j["tokenizer"] = r.tokenizer.path.empty() ? json(nullptr) : json{{"sha256", tokenizer_sha}};
  j["recipe"] = recipe_to_yaml(r);
  return j;
}

void check_same_model(const ckpt::Manifest& m, const Recipe& r) {
  const ModelConfig& a = m.model;
  const ModelConfig& b = r.model;
  std::string diff;
  auto cmp_key = [&](const std::string& key, double x, double y) {
    if (x != y)
      diff += detail::concat(diff.empty() ? "" : ", ", key, " ", x, " in the checkpoint, ", y,
                             " in the recipe");
  };
  auto cmp = [&](const char* key, double x, double y) {
    cmp_key(std::string("model.") + key, x, y);
  };
  auto format_modules = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& n : v) out += (out.empty() ? "" : ", ") + n;
    return "[" + out + "]";
  };
  if (a.arch != b.arch)
    diff += detail::concat("model.arch ", a.arch, " in the checkpoint, ", b.arch, " in the recipe");
  cmp("dim", a.dim, b.dim);
  cmp("n_layers", a.n_layers, b.n_layers);
  cmp("n_heads", a.n_heads, b.n_heads);
  cmp("n_kv_heads", a.n_kv_heads, b.n_kv_heads);
  cmp("head_dim", head_dim_of(a), head_dim_of(b));
  cmp("ffn_dim", a.ffn_dim, b.ffn_dim);
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("tie_embeddings", a.tie_embeddings, b.tie_embeddings);
  // RoPE changes what every layer computes: a run resumed with other frequencies would go on
  // training a different model from the saved weights.
  cmp("rope_theta", a.rope_theta, b.rope_theta);
  if (a.rope_type != b.rope_type)
    diff += detail::concat(diff.empty() ? "" : ", ", "model.rope_type ", a.rope_type,
                           " in the checkpoint, ", b.rope_type, " in the recipe");
  if (a.rope_type == b.rope_type && a.rope_type != "default") {
    cmp("rope_factor", a.rope_factor, b.rope_factor);
    if (a.rope_type == "llama3") {
      cmp("rope_low_freq_factor", a.rope_low_freq_factor, b.rope_low_freq_factor);
      cmp("rope_high_freq_factor", a.rope_high_freq_factor, b.rope_high_freq_factor);
      cmp("rope_original_max_seq_len", a.rope_original_max_seq_len, b.rope_original_max_seq_len);
    }
  }
  // The objective: an SFT checkpoint's moments and schedule are not a DPO run's start, nor the
  // other way round (a checkpoint from before the key is an SFT one). Start the other objective
  // from an export of the checkpoint (model.from) instead.
  const json data = m.json.is_object() ? m.json.value("data", json::object()) : json::object();
  const std::string objective =
      data.is_object() ? data.value("objective", std::string("sft")) : std::string("sft");
  if (objective != r.training.objective)
    diff += detail::concat(diff.empty() ? "" : ", ", "training.objective ", objective,
                           " in the checkpoint, ", r.training.objective,
                           " in the recipe (to change the objective, start a new run from an "
                           "export of the checkpoint: ft export, then model.from)");
  // The adapter: the same one trains on (its shape is the checkpoint's layout; its scaling and
  // dropout are what its weights were trained under). adapter.from is only where it started.
  const AdapterConfig &ca = m.adapter, &ra = r.adapter;
  if (ca.type != ra.type)
    diff += detail::concat(diff.empty() ? "" : ", ", "adapter.type ", ca.type,
                           " in the checkpoint, ", ra.type, " in the recipe");
  if (ca.enabled() && ca.type == ra.type) {
    cmp_key("adapter.r", ca.r, ra.r);
    cmp_key("adapter.alpha", ca.alpha, ra.alpha);
    cmp_key("adapter.dropout", ca.dropout, ra.dropout);
    cmp_key("adapter.use_rslora", ca.use_rslora, ra.use_rslora);
    if (ca.targets() != ra.targets())
      diff += detail::concat(diff.empty() ? "" : ", ", "adapter.target_modules differ (",
                             ca.targets().size(), " modules in the checkpoint, ",
                             ra.targets().size(), " in the recipe)");
    if (!same_modules_to_save(ca.modules_to_save, ra.modules_to_save, a.tie_embeddings))
      diff += detail::concat(diff.empty() ? "" : ", ", "adapter.modules_to_save ",
                             format_modules(ca.modules_to_save), " in the checkpoint, ",
                             format_modules(ra.modules_to_save), " in the recipe");
  }
  // Frozen parameters are not in the checkpoint: the same groups must be frozen, and come back
  // from the same source.
  const ParamLayout layout = checkpoint_layout(r);
  std::vector<int> frozen;
  for (size_t g = 0; g < layout.groups().size(); ++g)
    if (!layout.groups()[g].trains()) frozen.push_back(int(g));
  auto names = [&](const std::vector<int>& gs) {
    std::string s;
    for (int g : gs) s += (s.empty() ? "" : ",") + layout.groups()[size_t(g)].name;
    return s.empty() ? std::string("none") : s;
  };
  if (frozen != m.frozen_groups)
    diff +=
        detail::concat(diff.empty() ? "" : ", ", "frozen parameter groups ", names(m.frozen_groups),
                       " in the checkpoint, ", names(frozen), " in this run");
  if (!m.frozen_groups.empty()) {
    const json& f = m.json.at("frozen");
    const std::string from = f.value("from", std::string());
    const bool printed = f.contains("from_fingerprint") && f["from_fingerprint"].is_string();
    if (printed && !from.empty() && !b.from.empty()) {
      // By content: the base may have moved; it must not have changed.
      if (hf_weights_fingerprint(b.from) != f["from_fingerprint"].get<std::string>())
        diff += detail::concat(diff.empty() ? "" : ", ", "model.from '", b.from,
                               "' holds other weights than the base the checkpoint's frozen "
                               "parameters came from ('",
                               from, "', fingerprint ",
                               f["from_fingerprint"].get<std::string>().substr(0, 16), "...)");
    } else if (from != b.from) {
      diff += detail::concat(diff.empty() ? "" : ", ", "model.from '", from,
                             "' in the checkpoint (its frozen parameters), '", b.from,
                             "' in the recipe");
    }
    if (from.empty() &&
        (f.value("seed", uint64_t(0)) != r.run.seed || f.value("init_std", 0.0) != b.init_std))
      diff += detail::concat(diff.empty() ? "" : ", ",
                             "run.seed or model.init_std differ from the checkpoint's, whose "
                             "frozen parameters are that seeded initialisation");
  }
  if (!diff.empty())
    throw UsageError(m.dir + " holds another model: " + diff +
                     "; resume with the recipe that saved it, point checkpoint.dir elsewhere, or "
                     "start afresh with --resume never checkpoint.overwrite=true");
}

std::vector<std::string> resume_candidates(const Recipe& r, const std::string& resume,
                                           bool is_root) {
  const std::string& dir = r.checkpoint.dir;
  if (resume == "never") {
    if (!ckpt::has_checkpoints(dir)) return {};
    if (!r.checkpoint.overwrite)
      throw UsageError("--resume never: checkpoint.dir " + dir +
                       " already holds checkpoints of a run; continue it with --resume auto (the "
                       "default), choose another checkpoint.dir, or add checkpoint.overwrite=true "
                       "to delete them");
    return {};
  }
  if (resume == "auto") {
    std::vector<std::string> c = ckpt::complete_checkpoints(dir);
    std::string latest;
    try {
      latest = ckpt::latest_checkpoint(dir);
    } catch (const Error& e) {
      if (is_root) log_warn(e.what());
    }
    if (!latest.empty() && is_root && (c.empty() || fs::path(c.front()) != fs::path(latest)))
      log_warn(dir, "/latest names ", fs::path(latest).filename().string(),
               ", which is not the newest complete checkpoint; using ",
               c.empty() ? std::string("none") : fs::path(c.front()).filename().string());
    if (c.empty() && ckpt::has_checkpoints(dir) && is_root)
      log_warn(dir, " holds no complete checkpoint (only interrupted saves): starting afresh");
    return c;
  }
  // A PATH: a step folder, or a checkpoint dir with `latest`.
  if (fs::exists(fs::path(resume) / "manifest.json")) return {resume};
  if (fs::exists(fs::path(resume) / "latest")) {
    try {
      return {ckpt::latest_checkpoint(resume)};
    } catch (const Error& e) {
      throw UsageError("--resume " + resume + ": " + e.what());
    }
  }
  throw UsageError("--resume " + resume +
                   ": not a checkpoint (no manifest.json) nor a checkpoint folder (no `latest`); "
                   "give a step_* folder or the run's checkpoint.dir");
}

void install_stop_handlers(int rank) {
  // Under `ft train --nproc`, a SIGUSR1 that mpirun relays is that process's stop, which it has
  // announced once for every rank.
  // It also sends SIGUSR1 to the ranks itself (mpirun relays late), as quietly.
  const char* nproc_parent = std::getenv("FT_NPROC_PARENT");
  g_usr1_quiet = nproc_parent ? 1 : 0;
  g_nproc_parent = nproc_parent ? std::atoi(nproc_parent) : 0;
  g_open_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") ? 1 : 0;
  if (rank > 0) std::snprintf(g_prefix, sizeof g_prefix, "ft: [rank %d] ", rank);
  struct sigaction sa {};
  sa.sa_sigaction = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  // Past a file-size limit (ulimit -f, a quota-like cap) write() would otherwise kill the process
  // with SIGXFSZ mid-save; ignored, write() fails with EFBIG and the save reports the file and
  // that the previous checkpoint is untouched, like a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
}

void die_with_launcher() {
  const pid_t parent = ::getppid();
  if (parent <= 1) {
    say("ft: this rank's launcher has already ended: stopping\n");
    ::_exit(int(ExitCode::kRuntime));
  }
  g_launcher_pid = parent;
  struct sigaction sa {};
  sa.sa_handler = on_launcher_death;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGUSR2);
  // The launcher may have ended between getppid() and prctl(): then no signal comes.
  if (::getppid() != parent) on_launcher_death(SIGUSR2);
}

int stop_signal() { return g_stop_signal; }

}  // namespace ft
