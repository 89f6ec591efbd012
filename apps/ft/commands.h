// One function per subcommand; cli.cpp parses the command line (CLI11) and calls these.
// Each returns the process exit code (DESIGN.md §4).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ft::app {

// Before anything else in main: sets the thread pools' environment (OpenBLAS, OpenMP) where the
// user has not, and re-executes ft once so that the libraries read it (cli.cpp says why).
void prepare_thread_environment(char** argv);
// Parses the command line, runs the command and returns the process exit code; an error is
// printed as "ft: error: ..." (DESIGN.md §4).
int run_command_line(int argc, char** argv);

struct TrainArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  std::string resume = "auto";  // auto | never | PATH
  int nproc = 0;                // 0: not a supervised local launch
};
int cmd_train(const TrainArgs& a);

struct ValidateArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int world = 0;  // --world N: the job's ranks (0: the smallest world the layout needs)
  int nproc = 0;  // --nproc N: N ranks on this machine
  std::string resume = "auto";
};
int cmd_validate(const ValidateArgs& a);

struct TokenizeArgs {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string output;
  std::string format = "auto";  // auto | text | jsonl | chat | alpaca | preference (auto: by
                                // extension)
  std::string field;            // empty: not given (text); only for JSONL documents
  bool train_on_prompt = false;
  bool allow_no_trainable = false;  // chat/alpaca: a file with no token to train on: a warning
  int64_t shard_tokens = 16 * 1024 * 1024;
  int threads = 0;  // 0: all cores
};
int cmd_tokenize(const TokenizeArgs& a);

// --seq-len of ft inspect: a window of 1 to 2^30 tokens.
constexpr int kMaxInspectSeqLen = 1 << 30;

struct InspectArgs {
  std::string path;
  int seq_len = 0;                      // shard folders: the packing at this window length
  std::string pack_overflow = "split";  // split | drop, as data.pack_overflow
};
int cmd_inspect(const InspectArgs& a);

struct PlanArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int world = 1;      // ranks of the run: data × pipeline × tensor
  bool json = false;  // print the plan as JSON instead of tables
  int cuda_sm = 90;   // the GPU's compute capability × 10 when planning for CUDA
  // The time estimate's links and throughput (train/plan.h PlanLinks; DESIGN.md §4).
  int gpus_per_node = 8;
  std::string intra_node = "nvlink";  // nvlink | pcie
  double nvlink_gbps = 450, pcie_gbps = 50, ib_gbps = 40, latency_us = 20, tflops = 400;
  // The host memory of a node, GiB: a role whose node needs more is flagged (0: not checked).
  double host_mem_gb = 0;
};
int cmd_plan(const PlanArgs& a);

struct ExportArgs {
  std::string checkpoint;  // a step folder, or a checkpoint dir with `latest`
  std::string output;
  std::string dtype = "f32";           // f32 | bf16 | f16
  std::string max_shard_size = "5GB";  // as transformers' save_pretrained(max_shard_size=...)
  bool overwrite = false;
  // An adapter checkpoint: the model with the adapter merged in, not the PEFT folder.
  bool merge = false;
};
int cmd_export(const ExportArgs& a);

// The ranges of ft generate's numeric flags (main.cpp checks them; DESIGN.md §4). 2^24 new
// tokens is far past any model's max_seq_len, which bounds them anyway; a temperature of 100
// already samples almost uniformly (logits differ by far less than 100 after the model's norm).
constexpr int kMaxNewTokens = 1 << 24;
constexpr double kMaxTemperature = 100;

struct GenerateArgs {
  std::string source;  // an HF folder, a checkpoint step folder or checkpoint.dir
  std::string prompt;
  std::string system;     // --chat: a system message before the prompt
  std::string tokenizer;  // default: the source's own
  std::string adapter;    // a PEFT adapter folder applied to an HF source
  bool chat = false;      // render the prompt with the tokenizer's chat template
  int max_new_tokens = 128;
  double temperature = 0;  // 0: greedy
  double top_p = 1;
  uint64_t seed = 0;
  std::string device = "auto";  // auto | cpu | cuda
  std::string dtype = "f32";    // f32 | bf16 | f16: the compute dtype
  bool json = false;            // one JSON object: prompt_ids, ids, text, stop
  bool ignore_eos = false;      // run to --max-new-tokens
  bool no_bos = false;          // no BOS before a plain prompt
};
int cmd_generate(const GenerateArgs& a);

// ft plot RUN_DIR... --output FILE: the runs' metrics as a picture (train/plot.h; DESIGN.md §4).
// Bounds of the picture's size, pixels: enough for one panel, and short of an image (40000² ×
// 4 bytes) that would need gigabytes.
constexpr int kMinPlotPixels = 200, kMaxPlotPixels = 20000;

struct PlotArgs {
  std::vector<std::string> runs;    // run.output_dir folders or metrics .jsonl files
  std::string output;               // .svg or .png
  std::vector<std::string> labels;  // the legend's names (default: each run's folder)
  double smooth = 0.6;              // TensorBoard's smoothing weight, [0, 1)
  int width = 1200;
  int height = 0;  // 0: room for the panels (train/plot.h default_height)
};
int cmd_plot(const PlotArgs& a);

}  // namespace ft::app
