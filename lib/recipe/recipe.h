// The resolved recipe: every key of DESIGN.md §5 with its default. The one place recipe keys are
// defined is the schema in schema.cpp; this struct is what the rest of ft reads. load_recipe's
// stages are listed in recipe.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "adapt/config.h"
#include "model/config.h"
#include "optim/config.h"
#include "optim/loss_scaler.h"

namespace ft {

struct RunConfig {
  std::string name = "run";
  std::string output_dir = "runs/run";
  uint64_t seed = 0;
};

struct TokenizerConfig {
  std::string path;  // SentencePiece .model file; optional, but shards' hash is checked against it
};

struct DataConfig {
  std::string train;
  std::string valid;  // optional
  int seq_len = 256;
  bool shuffle = true;
  int prefetch = 4;                     // batches the background loader keeps ready
  bool pack = false;                    // whole documents packed into each window (§6)
  std::string pack_overflow = "split";  // split | drop: a document longer than a window
};

struct TrainingConfig {
  // sft: next-token cross-entropy on the trained targets; dpo: Direct Preference Optimization on
  // preference pairs (the dpo: section, train/dpo.h).
  std::string objective = "sft";
  int64_t steps = 100;
  int micro_batch_size = 1;
  int global_batch_size = 1;
  std::string precision = "fp32";  // fp32 | bf16 | fp16
  double grad_clip = 1.0;          // 0 disables clipping
  bool activation_checkpointing = false;
  // The output projection and cross-entropy run over chunks of this many tokens of a micro-batch
  // (model/llama.h set_loss_chunk_tokens); 0: the micro-batch in one chunk. 1024: from about 1k
  // tokens a chunk's GEMMs hide the re-read of the head's fp32 weight gradient that each chunk
  // adds, and the chunk's logits stay small (297 MiB in bf16 at a 152,064-word vocabulary);
  // DESIGN.md §3 "The head in chunks" has the arithmetic.
  int loss_chunk_tokens = 1024;
  int64_t eval_every_steps = 0;  // 0: no evaluation (needs data.valid)
  int64_t eval_batches = 8;
  // fp16 loss scaling (optim/loss_scaler.h, DESIGN.md §5); read only with precision fp16.
  double loss_scale = 0;              // 0: dynamic; N > 0: static scale N
  int64_t loss_scale_window = 1000;   // dynamic: clean steps before the scale doubles
  double initial_loss_scale = 65536;  // dynamic: first scale, 2^16 (DeepSpeed's default)
  double min_loss_scale = 1;          // dynamic: floor; an overflow at it stops the run
  int loss_scale_hysteresis = 2;      // dynamic: overflows before the scale halves
  // Consecutive skipped steps that stop the run (exit 1). Above the 34 consecutive overflows in
  // which a dynamic scale falls from the largest allowed initial scale (2^32) to 1 and stops
  // there by itself (hysteresis 2), so it never cuts that descent short; it bounds the steps
  // wasted when no scale helps (a static scale, or a NaN that no scale removes).
  int64_t max_skipped_steps = 100;
};

// training.objective dpo (Rafailov et al. 2023; train/dpo.h has the losses).
struct DpoConfig {
  double beta = 0.1;  // the KL penalty's weight: rewards are beta · (log π − log π_ref)
  std::string loss = "sigmoid";  // sigmoid (DPO) | ipo (Azar et al. 2023) | hinge (SLiC)
  double label_smoothing = 0;    // sigmoid: the chance a pair's labels are flipped (cDPO)
  // initial: π_ref is the model at step 0, its log-probabilities computed once before step 1
  // and kept in the run folder; base: the frozen base with the adapter off (adapter runs only).
  std::string reference = "initial";
};

struct ParallelConfig {
  int tensor = 1;
  int pipeline = 1;
  int zero_stage = 0;
  // Gradient reductions overlap the backward (DeepSpeed's overlap_comm), in calls of at most
  // reduce_bucket_mb MiB of fp32 (parallel/zero.h ZeroOptions).
  bool overlap_comm = true;
  // AdamW on the device's update stream, under the next forward (parallel/zero.h "Overlapped
  // update"); ZeRO stage 0 without offload.
  bool overlap_update = false;
  double reduce_bucket_mb = 25;
  int prefetch_blocks = 1;            // ZeRO-3: groups gathered ahead of use
  std::string reduce_dtype = "fp32";  // fp32 | bf16: what gradient reductions sum in
  // none | cpu: this rank's fp32 masters, gradients and AdamW moments in host memory, the
  // update on the host (ZeRO-Offload; parallel/zero.h "Offload").
  std::string offload_optimizer = "none";
  // none | cpu (ZeRO-3 with offload_optimizer): this rank's parameter shards in host memory too,
  // each group's all-gather starting with a copy from there (parallel/zero.h HostShards).
  std::string offload_params = "none";
};

struct CheckpointConfig {
  std::string dir;  // default: <run.output_dir>/checkpoints
  int64_t every_steps = 0;
  double every_minutes = 0;
  int keep_last = 3;
  bool async = false;
  bool overwrite = false;  // --resume never may delete existing checkpoints
};

struct LoggingConfig {
  int64_t every_steps = 1;
  std::string metrics;      // default: <run.output_dir>/metrics.jsonl
  std::string tensorboard;  // TensorBoard event files' folder (DESIGN.md §7); empty: none
  // A device's dense peak TFLOP/s for the metrics' mfu (train/throughput.h); 0: NVIDIA GPUs'
  // from ft's table, none elsewhere.
  double peak_tflops = 0;
};

struct RuntimeConfig {
  std::string device = "auto";  // auto | cpu | cuda
  int threads = 0;              // 0: all cores
  // A step's collective that makes no progress this long ends the job (exit code 3); 0: never.
  double collective_timeout_s = 600;
  // fp32 GEMMs on CUDA may round their inputs to TF32 (10-bit mantissa) for tensor cores;
  // off: fp32 runs match the CPU. No effect on the CPU, bf16 or fp16.
  bool tf32 = false;
  // How ranks exchange device memory: auto | nccl | mpi (DESIGN §3, comm/device_comm.h).
  std::string communicator = "auto";
  // How CUDA picks each GEMM's cuBLASLt algorithm: heuristic (cuBLASLt's first) | measure (the
  // fastest of its candidates, timed once per shape, kept in run.output_dir/gemm_algos/ so a
  // resume reuses them; runtime/cuda/lt_gemm.h LtChoice). No effect on the CPU.
  std::string gemm_algos = "heuristic";
};

struct Recipe {
  std::string source_path;  // the YAML file it came from
  RunConfig run;
  ModelConfig model;
  AdapterConfig adapter;  // adapter: (none unless adapter.type is set)
  TokenizerConfig tokenizer;
  DataConfig data;
  TrainingConfig training;
  DpoConfig dpo;  // dpo: (read with training.objective dpo)
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  RuntimeConfig runtime;
};

// One problem found in a recipe, with enough context to fix it.
struct RecipeIssue {
  std::string file;      // recipe path, or "<command line>" for an override
  int line = 0;          // 1-based; 0 when unknown
  int column = 0;        // 1-based; 0 when unknown
  std::string key_path;  // e.g. "model.n_heads"
  std::string message;   // what is wrong
  std::string hint;      // what would fix it (may be empty)
  // About model.from's weight files only (none that ft reads): ft plan, which reads config.json
  // alone, ignores it; ft train and ft validate refuse it.
  bool weight_files = false;
  std::string format() const;  // "file:line:col: key: message (hint: ...)"
};

// Loads a recipe file, applies dotted KEY=VALUE overrides, fills defaults, and validates
// everything, including cross-field rules and a model.from config.json. Collects every issue
// instead of stopping at the first. world_size is used for batch divisibility (data ranks =
// world / (tensor * pipeline)); world_size <= 0 means "unknown" (ft validate): the layout is then
// checked for the smallest world, tensor × pipeline ranks with one data rank.
struct RecipeResult {
  Recipe recipe;
  std::vector<RecipeIssue> issues;
  // What the recipe runs but not exactly as written, one line each (model.from's
  // attention_dropout > 0: trained without dropout). Commands print them; not an error.
  std::vector<std::string> warnings;
  bool ok() const { return issues.empty(); }
};
// refuse_unbuilt: also refuse what the recipe format allows but this build cannot run yet
// (today: the CUDA device). Off only in tests of the format.
RecipeResult load_recipe(const std::string& path, const std::vector<std::string>& overrides,
                         int world_size = 1, bool refuse_unbuilt = true);

// Throws ft::UsageError listing every issue, one per line, if the recipe is not valid.
// warnings, when given, receives RecipeResult::warnings (also when it throws).
Recipe load_recipe_or_throw(const std::string& path, const std::vector<std::string>& overrides,
                            int world_size = 1, bool refuse_unbuilt = true,
                            std::vector<std::string>* warnings = nullptr);

// The resolved recipe as YAML (all keys, defaults filled), for printing and for saving
// into run.output_dir.
std::string recipe_to_yaml(const Recipe& r);

// The fp16 loss scaler's settings: the training.* keys of DESIGN.md §5.
LossScalerConfig loss_scaler_config(const TrainingConfig& t);

// Derived quantities.
int data_parallel_size(const Recipe& r, int world_size);
int grad_accum_steps(const Recipe& r, int world_size);  // global / (micro * data)

}  // namespace ft
