// dpo.reference: initial — the reference's log-probabilities, computed once and kept with the run
// (DESIGN.md §8 "The DPO reference"). Two files in run.output_dir:
//   dpo_reference.bin   the training set's table, then the validation set's: little-endian
//                       doubles, pair i's chosen at 2i and rejected at 2i + 1 (train/dpo.h)
//   dpo_reference.json  {"format": "ft-dpo-reference", "version": 1, "train_pairs",
//                        "valid_pairs", "bin_sha256", "inputs": {...}}
// "inputs" says what the tables were computed from: the model's recipe sections (model:, adapter:,
// without their `from` paths) with run.seed and training.precision, model.from's weights by
// content (hf_weights_fingerprint) and adapter.from's files' SHA-256, and data.seq_len with the
// SHA-256 of every training and validation shard. A fresh run reuses tables
// whose inputs equal its own (a run that crashed before its first checkpoint does not compute
// them again) and computes them otherwise; a resumed run must find them, with equal inputs: its
// model at step 0 no longer exists, so a change of model or data is an error, not a recompute.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <yaml-cpp/yaml.h>

#include "ckpt/hf.h"
#include "ckpt/io.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/sha256.h"
#include "data/shard.h"
#include "train/dpo.h"

namespace ft {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "ft-dpo-reference";
constexpr int kVersion = 1;

// model.from by content, not by path (ckpt/hf.h hf_weights_fingerprint, as a resume names its
// base): the same weights moved still match, another fine-tune exported to the same folder does
// not. adapter.from (a PEFT folder of a few MiB) by the SHA-256 of its two files.
std::string model_fingerprint(const std::string& dir) {
  return dir.empty() ? "" : hf_weights_fingerprint(dir);
}
std::string adapter_fingerprint(const std::string& dir) {
  if (dir.empty()) return "";
  return sha256_file_hex((fs::path(dir) / "adapter_config.json").string()) + " " +
         sha256_file_hex((fs::path(dir) / "adapter_model.safetensors").string());
}

// Rank 0 only (dpo_initial_reference): a pass over every byte of the data, so with progress.
nlohmann::json shard_hashes(const std::string& key, const std::string& dir) {
  nlohmann::json out = nlohmann::json::array();
  if (dir.empty()) return out;
  const std::vector<std::string> files = list_shard_files(dir);
  double total = 0, done = 0;
  for (const std::string& f : files) total += double(fs::file_size(f));
  WorkProgress progress("dpo: hashing " + key + "'s shards", total, WorkProgress::Unit::kBytes);
  for (const std::string& f : files) {
    out.push_back({fs::path(f).filename().string(), sha256_file_hex(f)});
    done += double(fs::file_size(f));
    progress.update(done, fs::path(f).filename().string());
  }
  progress.finish();
  return out;
}

// What the tables depend on (the header's comment).
nlohmann::json reference_inputs(const Recipe& r, bool valid) {
  // The sections without their paths: the folders are compared by content below.
  YAML::Node all = YAML::Load(recipe_to_yaml(r));
  all["model"].remove("from");
  YAML::Emitter model;
  model << all["model"];
  YAML::Emitter adapter;
  if (all["adapter"]) {
    all["adapter"].remove("from");
    adapter << all["adapter"];
  }
  return {{"model", model.c_str()},
          {"adapter", adapter.c_str()},
          {"seed", r.run.seed},
          {"precision", r.training.precision},
          {"model_weights", model_fingerprint(r.model.from)},
          {"adapter_weights", adapter_fingerprint(r.adapter.from)},
          {"seq_len", r.data.seq_len},
          {"train", shard_hashes("data.train", r.data.train)},
          {"valid", valid ? shard_hashes("data.valid", r.data.valid) : nlohmann::json::array()}};
}

// The differences between two inputs objects, for an error message: "model, train".
std::string differing_keys(const nlohmann::json& a, const nlohmann::json& b) {
  std::string out;
  for (const auto& [k, v] : a.items())
    if (!b.contains(k) || b[k] != v) out += (out.empty() ? "" : ", ") + k;
  return out.empty() ? "their layout" : out;
}

struct Kept {
  bool found = false;    // both files there, readable and consistent
  std::string mismatch;  // found, but computed from other inputs: which
  std::string problem;   // there but unreadable or inconsistent
  std::vector<double> train, valid;
};

Kept read_kept(const fs::path& json_path, const fs::path& bin_path, const nlohmann::json& inputs) {
  Kept k;
  if (!fs::exists(json_path)) {
    k.problem = "missing";
    return k;
  }
  try {
    std::ifstream jf(json_path);
    const nlohmann::json head = nlohmann::json::parse(jf);
    if (head.value("format", "") != kFormat || head.value("version", 0) != kVersion)
      throw Error("not an ft-dpo-reference file of version 1");
    std::ifstream bf(bin_path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(bf)), std::istreambuf_iterator<char>());
    const uint64_t nt = head.at("train_pairs"), nv = head.at("valid_pairs");
    if (bytes.size() != (nt + nv) * 2 * sizeof(double) ||
        sha256_hex(bytes.data(), bytes.size()) != head.at("bin_sha256").get<std::string>())
      throw Error(bin_path.string() + " does not match the SHA-256 and size " + json_path.string() +
                  " records");
    k.found = true;
    if (head.at("inputs") != inputs) {
      k.mismatch = differing_keys(inputs, head.at("inputs"));
      return k;
    }
    k.train.resize(2 * nt);
    k.valid.resize(2 * nv);
    std::memcpy(k.train.data(), bytes.data(), k.train.size() * sizeof(double));
    std::memcpy(k.valid.data(), bytes.data() + k.train.size() * sizeof(double),
                k.valid.size() * sizeof(double));
  } catch (const std::exception& e) {
    k.found = false;
    k.problem = e.what();
  }
  return k;
}

void write_kept(const fs::path& json_path, const fs::path& bin_path, const nlohmann::json& inputs,
                const std::vector<double>& train, const std::vector<double>& valid) {
  std::string bytes((train.size() + valid.size()) * sizeof(double), '\0');
  std::memcpy(bytes.data(), train.data(), train.size() * sizeof(double));
  std::memcpy(bytes.data() + train.size() * sizeof(double), valid.data(),
              valid.size() * sizeof(double));
  const nlohmann::json head = {{"format", kFormat},
                               {"version", kVersion},
                               {"train_pairs", train.size() / 2},
                               {"valid_pairs", valid.size() / 2},
                               {"bin_sha256", sha256_hex(bytes.data(), bytes.size())},
                               {"inputs", inputs}};
  // Each file whole or not at all under its name, and durable before step 1 (a resume cannot
  // do without them: the model they came from is gone); the JSON last, so a crash between the
  // two leaves a pair that does not match (the SHA-256) and is computed again.
  ckpt::write_file_atomic(bin_path.string(), bytes);
  ckpt::write_file_atomic(json_path.string(), head.dump(1) + "\n");
}

}  // namespace

void dpo_initial_reference(DpoRun& dpo, const Recipe& r, Communicator& world, bool resumed,
                           const LoaderOptions& train_opt, const LoaderOptions* valid_opt) {
  const bool is_root = world.rank() == 0;
  const fs::path json_path = fs::path(r.run.output_dir) / "dpo_reference.json";
  const fs::path bin_path = fs::path(r.run.output_dir) / "dpo_reference.bin";
  // Rank 0 reads and decides; every rank learns the decision (and the tables) from it, so they
  // all compute, all load or all stop.
  enum : int32_t { kCompute = 0, kLoaded = 1, kRefuse = 2 };
  int32_t decision = kCompute;
  std::string message;
  nlohmann::json inputs;
  Kept kept;
  // Rank 0's reading may fail (an unreadable shard or model file): the others are waiting for
  // its decision, so a failure is that decision, not an exception of its own.
  std::string failure;
  if (is_root) {
    try {
      inputs = reference_inputs(r, valid_opt != nullptr);
      kept = read_kept(json_path, bin_path, inputs);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    decision = kRefuse;
    message = failure;
  } else if (is_root) {
    if (kept.found && kept.mismatch.empty()) {
      decision = kLoaded;
    } else if (resumed) {
      decision = kRefuse;
      message =
          !kept.mismatch.empty()
              ? detail::concat(json_path.string(), ": the DPO reference was computed from other ",
                               "inputs than this run's (", kept.mismatch,
                               " differ); the reference is the model at step 0, which a resumed "
                               "run no longer has, so it cannot be computed again. Resume with "
                               "the recipe and data the run started with, or start a new run "
                               "(another run.output_dir)")
              : detail::concat(json_path.string(), ": ", kept.problem,
                               "; a resumed DPO run (dpo.reference: initial) needs the "
                               "reference log-probabilities computed when it started, from the "
                               "model at step 0. Start a new run (another run.output_dir), or "
                               "restore the file");
    } else if (!kept.mismatch.empty()) {
      log_info("ft: dpo: ", json_path.string(), " was computed from other inputs (", kept.mismatch,
               " differ): computing the reference again");
    }
  }
  world.broadcast_bytes(&decision, sizeof decision, 0);
  if (decision == kRefuse) {
    uint64_t n = message.size();
    world.broadcast_bytes(&n, sizeof n, 0);
    message.resize(n);
    world.broadcast_bytes(message.data(), n, 0);
    throw UsageError(message);
  }
  if (decision == kLoaded) {
    uint64_t sizes[2] = {kept.train.size(), kept.valid.size()};
    world.broadcast_bytes(sizes, sizeof sizes, 0);
    kept.train.resize(sizes[0]);
    kept.valid.resize(sizes[1]);
    world.broadcast_bytes(kept.train.data(), sizes[0] * sizeof(double), 0);
    world.broadcast_bytes(kept.valid.data(), sizes[1] * sizeof(double), 0);
    dpo.train_table = std::move(kept.train);
    dpo.valid_table = std::move(kept.valid);
    if (is_root)
      std::printf("ft: dpo: the reference's log-probabilities from %s (%zu + %zu pairs)\n",
                  json_path.string().c_str(), dpo.train_table.size() / 2,
                  dpo.valid_table.size() / 2);
    return;
  }
  dpo.train_table = dpo.reference_table(train_opt, world, is_root, "data.train");
  if (dpo.stopped()) return;  // the trainer stops before step 1 (exit 75); nothing is written
  if (valid_opt) {
    // The validation set sliced over the data ranks as the training set is.
    LoaderOptions v = *valid_opt;
    v.global_batch = train_opt.global_batch;
    v.rank_offset = train_opt.rank_offset;
    v.rank_count = train_opt.rank_count;
    dpo.valid_table = dpo.reference_table(v, world, is_root, "data.valid");
    if (dpo.stopped()) return;
  }
  if (is_root) {
    try {
      write_kept(json_path, bin_path, inputs, dpo.train_table, dpo.valid_table);
    } catch (const std::exception& e) {  // a file system error too: refused with the others
      throw Error(detail::concat("writing the DPO reference: ", e.what()));
    }
  }
}

}  // namespace ft
