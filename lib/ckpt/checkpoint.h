// Distributed checkpoints (DESIGN.md §8).
//
// A checkpoint is one folder per saved step under checkpoint.dir:
//   step_00000100/rank_00003.bin    this rank's pieces of the training state, raw f32 little-endian
//   step_00000100/rank_00003.json   what that file holds and its checksums; written after the
//                                   .bin is durable, so its presence says "rank 3 is done"
//   step_00000100/manifest.json     everything (model, layout, step, optimizer and scheduler state,
//                                   data position, recipe, every piece with its CRC-32), written by
//                                   rank 0 once every rank's .json is there
//   step_00000100/tokenizer.model   a copy of tokenizer.path (when the recipe names one), so
//                                   `ft export` needs nothing outside the checkpoint; a
//                                   tokenizer.json comes with its folder's tokenizer_config.json,
//                                   chat_template.jinja and generation_config.json, where it has
//                                   them (the chat template, the special tokens and their ids)
//   step_00000100/COMPLETE          written last, after all of the above is durable
//   latest                          names the newest complete step folder; replaced atomically
// The step in a folder's name is the number of optimizer steps completed: training resumes at
// step index `step` (0-based), with the data loader at that position.
//
// What is saved is layout-free: a "piece" is a contiguous range [begin, end) of one parameter
// group's flat buffer (lib/model/layout.h) at a given tensor-parallel size and tensor rank, for
// one kind of state: the parameters, AdamW's first moment (exp_avg) or second moment
// (exp_avg_sq). Each rank writes the ZeRO shard ranges of the groups it holds — the same
// ranges at every ZeRO stage, so the write is spread over the data ranks even at stage 0 — and
// for every (group, tensor rank) the pieces of all data ranks cover the whole buffer exactly
// once. A reader under another layout rebuilds any range it needs from those pieces: directly
// when the tensor-parallel size is unchanged, else through the whole (tensor size 1) tensors.
// ft draws no random numbers after initialisation (no dropout) and the data order is a function
// of (run.seed, position), so step, optimizer step and loader position are the whole RNG state.
//
// The implementation, one job per file: folders.cpp (step folder names, listing, `latest`,
// setting damaged folders aside), manifest.cpp (parse_manifest and parse_rank_json, which trust
// nothing), reshard.cpp (verify, read_range, read_global_group), writer.cpp (CheckpointWriter);
// io.h (CRC-32, atomic writes, fsync) and checkpoint_internal.h are theirs alone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "adapt/config.h"
#include "model/config.h"
#include "model/layout.h"
#include "optim/loss_scaler.h"
#include "runtime/device.h"

namespace ft {

class Communicator;

namespace ckpt {

enum class State { kParam = 0, kExpAvg = 1, kExpAvgSq = 2 };
const char* state_name(State s);  // "param", "exp_avg", "exp_avg_sq"

std::string step_folder_name(int64_t step);  // "step_00000100"
// The step of a step folder's name: "step_00000100" → 100; -1 for any other name. With
// set_aside, also the names of folders set aside as damaged ("step_00000100.damaged",
// "step_00000100.damaged.2").
int64_t parse_step_folder_name(const std::string& name, bool set_aside = false);
// Renames a damaged step folder aside to "<name>.damaged" (or ".damaged.1", ".damaged.2", ...
// when taken), never deleting anything: its damage may be temporary (a slow file system).
// Returns the new path. keep_last, --resume auto and `ft inspect` ignore such folders; the user
// removes them.
std::string set_aside_damaged(const std::string& step_dir);

// One piece this rank saves, pointing at live memory (valid until save() returns).
struct PieceSource {
  State state;
  int group;
  uint64_t begin, end;  // elements of the group's flat buffer at this rank's tensor size
  const float* data;    // end - begin floats
  // The Device whose memory `data` is in (read through its copies); null: host memory.
  Device* device = nullptr;
};

// A piece as recorded in a manifest.
struct PieceRecord {
  std::string file;
  State state;
  int group = 0;
  int tensor_rank = 0;
  uint64_t begin = 0, end = 0;  // elements
  uint64_t offset = 0;          // bytes into the file
  uint32_t crc32 = 0;           // of the piece's bytes
};

struct ShardRecord {
  std::string file;
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;  // of the whole file
};

// A parsed manifest.json.
struct Manifest {
  std::string dir;  // the step folder
  int64_t step = 0;
  int world = 1, data = 1, tensor = 1, pipeline = 1, zero_stage = 0;
  ModelConfig model;
  int64_t optimizer_step = 0;
  int64_t tokens = 0;  // data.tokens: tokens trained on up to this step (0 when absent)
  // The fp16 loss scaler's state (key loss_scaler, written by fp16 runs only); absent: a run
  // resumed in fp16 starts its scaler afresh, as from an fp32 or bf16 checkpoint.
  std::optional<LossScalerState> loss_scaler;
  std::vector<ShardRecord> shards;
  std::vector<PieceRecord> pieces;
  // Groups a model converter froze (key frozen.groups, written only when there are some): the
  // checkpoint holds no state of theirs; they are the run's starting weights (DESIGN.md §8).
  std::vector<int> frozen_groups;
  // Where the frozen groups' values come from (frozen.from, .seed, .init_std): the model.from
  // folder, or when that is empty the seeded initialisation (LlamaModel::init_random).
  std::string frozen_from;
  std::string frozen_from_fingerprint;  // hf_weights_fingerprint of frozen.from; empty: none
  uint64_t frozen_seed = 0;
  double frozen_init_std = 0;
  // The adapter trained (key adapter, written by adapter runs only; type "none" without):
  // its groups follow the model's in the checkpoint's layout (manifest_layout).
  AdapterConfig adapter;
  nlohmann::json json;  // the whole document
};

// The parameter layout a checkpoint's groups and pieces refer to, at `tensor` ranks: the model's,
// with the adapter's groups after it when the run trained one (adapt/lora.h).
ParamLayout manifest_layout(const Manifest& m, int tensor);

// Reads and checks step_dir/manifest.json (and that COMPLETE is there unless allow_incomplete).
// Errors name the file and say what is wrong.
Manifest read_manifest(const std::string& step_dir, bool allow_incomplete = false);
// The checks of read_manifest on a manifest's text, touching no file: every number is a JSON
// integer (never a float, bool or string) within its type's and its field's range; the model
// and layout are possible and within size limits; the tensor table matches the model; every
// piece lies inside its group and its shard file, and the pieces tile each group and each file
// exactly; the step equals the folder name's (when step_dir is named step_N). Throws Error
// naming the file and the key path; never another exception type.
Manifest parse_manifest(const std::string& text, const std::string& step_dir);

// A rank_*.json: what one rank wrote into its shard file.
struct RankRecord {
  int rank = 0;
  uint64_t attempt = 0;
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  nlohmann::json pieces;  // as written; each piece's numbers checked
};
// Parses and range-checks a rank_*.json's text (path names it in errors). Throws Error only.
RankRecord parse_rank_json(const std::string& text, const std::string& path);

// Complete checkpoints (folders with COMPLETE) under dir, newest first.
std::vector<std::string> complete_checkpoints(const std::string& dir);
// The folder `latest` names (empty if there is no `latest`).
std::string latest_checkpoint(const std::string& dir);
// True when dir holds a `latest` file or any step_* folder.
bool has_checkpoints(const std::string& dir);

// Checks every shard's size and every piece's CRC-32. Returns one line per problem (file name
// and what is wrong); empty when the checkpoint is sound. on_file(i, n, file) reports progress.
std::vector<std::string> verify(const Manifest& m,
                                void (*on_file)(size_t, size_t, const std::string&) = nullptr);

// Reads values of one state kind into out[0, end - begin): elements [begin, end) of group
// `group`'s flat buffer at tensor-parallel size `tensor`, tensor rank `tensor_rank` — under any
// layout the checkpoint was saved with. Each piece read has its CRC-32 checked; a mismatch or a
// short file throws Error naming the file.
void read_range(const Manifest& m, State state, int group, int tensor, int tensor_rank,
                uint64_t begin, uint64_t end, float* out);

// The whole tensors (tensor size 1) of one group, laid out as ParamLayout(m.model, 1) lays
// the group out. For export and inspection.
std::vector<float> read_global_group(const Manifest& m, State state, int group);

// Writes this rank's part of checkpoints; rank 0 also commits them (manifest, COMPLETE,
// `latest`, keep_last). Synchronous: save() returns when this rank's shard is durable and, on
// rank 0, the checkpoint is committed. Asynchronous: save() copies the pieces into a host
// staging buffer and returns; a background thread writes them (and, on rank 0, waits for the
// other ranks' shards and commits). Only one save is in flight per rank: save() first waits
// for the previous one. No communicator is used off the main thread: ranks tell rank 0 they
// are done through their rank_*.json files.
class CheckpointWriter {
 public:
  struct Options {
    std::string dir;  // checkpoint.dir
    int rank = 0, world = 1;
    int tensor_rank = 0;
    bool async = false;
    int keep_last = 3;
    std::string tokenizer;  // file copied into each checkpoint by rank 0 (may be empty)
    // The same on every rank of this run, different for every run (rank 0's clock and pid,
    // broadcast): rank 0 commits only rank_*.json files of this attempt, never the leftovers
    // of a crashed earlier attempt at the same step.
    uint64_t attempt = 0;
    // Async: the device whose alloc_host gives the staging buffer (page-locked on CUDA, so the
    // device → host copies run at full bandwidth); null: plain host memory.
    Device* staging_device = nullptr;
  };
  // What rank 0 reports once a checkpoint is committed.
  struct Committed {
    int64_t step = 0;
    std::string folder;
    uint64_t bytes = 0;     // all ranks' shard files
    double blocking_s = 0;  // how long save() held up training on rank 0
    double total_s = 0;     // from save() to the commit
  };

  explicit CheckpointWriter(Options o);
  // Finishes writing this rank's shard of a save in flight, but commits nothing that wait()
  // has not: call wait() first on the normal path. Errors are logged, not thrown.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves step `step`. Refuses (throws Error naming the state, group, tensor, step and rank;
  // nothing committed, `latest` unchanged) when a piece holds a NaN or an infinity: the check
  // rides along the CRC-32 pass. manifest: rank 0's description of the run (model, layout,
  // optimizer, scheduler, data, recipe; ignored on other ranks); shards and pieces are added at
  // commit, and rank 0 commits only a manifest that passes parse_manifest.
  // Throws Error on a write failure of this rank (synchronous, or a previous async save).
  void save(int64_t step, const std::vector<PieceSource>& pieces, const nlohmann::json& manifest);
  // Non-blocking: a checkpoint committed since the last call (rank 0), if any. Throws the error
  // of a failed background save.
  std::optional<Committed> poll();
  // Blocks until the save in flight is written (and committed, on rank 0); throws its error.
  void wait();
  bool busy() const;
  // Async: allocates and touches the staging buffer for pieces of this many bytes now (or for
  // these pieces), so that the first save's stall is the copy alone. Page-locked on a staging
  // device's alloc_host, counted as MemoryCategory::kCheckpoint (ft plan's pinned host memory).
  void reserve(uint64_t bytes);
  void reserve(const std::vector<PieceSource>& pieces);
  // Synchronous saves: the host copy a save of `pieces` writes each piece on a device through,
  // sized for the largest, in that device's pageable host memory (kCheckpoint), held while the
  // save writes; empty when no piece is on a device. ft plan holds one to count it.
  static HostBuffer<float> piece_copy(const std::vector<PieceSource>& pieces);
  // Async, pieces on a device with its own copy stream (CUDA): save() queues their device →
  // staging copies on that stream behind an event of the compute stream and returns before
  // they finish, so the copies overlap what the compute stream does next. The pieces must not
  // change before the copies are done: call this before anything is queued that writes them
  // (the optimizer step). It makes the compute stream wait for the copies (the host does not
  // wait); nothing when no copy is pending.
  void fence_staging_copies();

 private:
  struct Job;
  void run_job(Job& job);  // writes (and commits on rank 0); throws on failure
  void worker();
  Options o_;
  void release_staging();
  char* staging_ = nullptr;  // async: the pieces copied to host memory (staging_bytes_)
  uint64_t staging_bytes_ = 0;
  // Async on a device with a copy stream: the compute stream's point the copies start after,
  // the copy stream's point they are done at, and whether the compute stream has yet to be
  // told to wait for it (fence_staging_copies).
  Device* copy_device_ = nullptr;
  Event compute_ready_, copies_done_;
  bool fence_pending_ = false;
  std::unique_ptr<Job> job_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool has_job_ = false, stop_ = false, done_ = true;
  std::string error_;
  std::optional<Committed> committed_;
};

}  // namespace ckpt
}  // namespace ft
