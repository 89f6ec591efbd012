// Metrics (DESIGN.md §7): a JSON Lines file written by rank 0, and progress for people — a live
// bar when stdout is a terminal, plain lines otherwise (logs, SLURM output files).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace ft {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Creates parent folders; truncates unless append (a resumed run continues its file).
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& o) noexcept { *this = std::move(o); }
  MetricsWriter& operator=(MetricsWriter&& o) noexcept;
  void write(const nlohmann::json& line);  // one object per line, flushed
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

struct StepReport {
  int64_t step = 0;  // from 1, as people read it (DESIGN.md §7): steps done after it
  int64_t total_steps = 0;
  int64_t first_step = 0;  // where this process started (resumed runs), for the ETA
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0;
  double elapsed_s = 0;  // since training started
  size_t mem_peak_bytes = 0;
  // Achieved model TFLOP/s of one device, and its share of the device's peak (mfu < 0: none).
  double tflops = 0, mfu = -1;
  // This rank's GPU utilisation, percent (gpu_util < 0: no reading).
  double gpu_util = -1;
  // training.objective dpo: the step's reward margin and accuracy (train/dpo.h).
  bool dpo = false;
  double reward_margin = 0, reward_accuracy = 0;
};

class Progress {
 public:
  explicit Progress(bool enabled);
  void step(const StepReport& r);             // called every logged step
  void eval(int64_t step, double eval_loss);  // step: from 1, the step evaluated after
  void note(const std::string& line);         // a line of its own (checkpoints, signals)
  void finish();                              // ends the live bar's line
  static std::string human_bytes(double bytes);
  // A clock for the ETA: "0:42", "1:02:03".
  static std::string human_duration(double seconds);
  // A measured time, rounded for people (the metrics file keeps full precision): "0.015 s"
  // below 1 s (ms resolution), "2.19 s", "42.5 s", "1 min 05 s", "2 h 03 min".
  static std::string human_seconds(double seconds);

 private:
  bool enabled_;
  bool tty_;
  bool bar_open_ = false;
};

}  // namespace ft
