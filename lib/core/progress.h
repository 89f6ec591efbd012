// Progress of long work outside the training steps, for people (DESIGN.md §7 "Progress on long
// work"): loading a model's weights, reading a checkpoint, `ft export`, `ft tokenize`, DPO's
// reference pass. On stderr, as the other messages.
//
// On a terminal, one line rewritten in place as the work reports (at most twice a second):
//   ft: loading weights: 42% 6.8/16.1 GiB, 392 MiB/s, ETA 0:24, layer 13 of 32
// and left standing, complete, when the stage ends. Elsewhere (a log file, SLURM's output, a
// pipe) there is no line to rewrite, so each stage prints one plain line when it ends:
//   ft: loading weights: 16.1 GiB in 42.0 s (392 MiB/s)
// and one a minute while it runs past a minute, so a log shows the work is alive. A rank that is
// not rank 0 shows nothing (WorkProgress with enabled = false).
//
// The work must call update() at least every few seconds for the line to stay live: after each
// tensor, group, file or batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ft {

// "1.5 KiB", "16.1 GiB"; "0:42", "1:02:03" (an ETA); "0.015 s", "2.19 s", "1 min 05 s" (a
// measured time, rounded for people); "950", "12.3k", "4.56M", "1.23G" (a count).
std::string human_bytes(double bytes);
std::string human_duration(double seconds);
std::string human_seconds(double seconds);
std::string human_count(double count);

// Whether progress on `fd` is a live line: FT_PROGRESS=bar|plain when set (`ft train --nproc`
// sets it for its ranks from its own terminal); else a terminal, unless an MPI launcher started
// this process (its pseudo-terminal may be a log file's front).
bool progress_is_live(int fd);

class WorkProgress {
 public:
  enum class Unit { kBytes, kItems };
  // stage: what is being done ("loading weights"); total: the units the stage has (0: unknown,
  // then no percentage or ETA); items: the name of an item for Unit::kItems ("batches").
  WorkProgress(std::string stage, double total, Unit unit, std::string items = "",
               bool enabled = true);
  // A stage that ends before finish() (an error, a stop) leaves the live line's last state on a
  // line of its own, so whatever is printed next starts a fresh line.
  ~WorkProgress();
  WorkProgress(const WorkProgress&) = delete;
  WorkProgress& operator=(const WorkProgress&) = delete;

  // `done` units so far (rising); detail: what is being worked on ("layer 13 of 32").
  void update(double done, const std::string& detail = "");
  // The stage is complete: its last line (on a terminal, the live line made final). `summary`
  // replaces the line's figures after the amount and time ("12 tensors").
  void finish(const std::string& summary = "");
  // The stage is complete and the caller prints its own summary: the live line is removed.
  void close();

  double seconds() const;
  bool live() const { return live_; }

  // How often the live line is redrawn and the plain heartbeat printed, in seconds (tests set
  // the live one to 0 through FT_PROGRESS_EVERY_S to see every update).
  static double live_every_seconds();
  static constexpr double kPlainEverySeconds = 60.0;

 private:
  std::string amount(double done) const;
  std::string line(double done, const std::string& detail) const;
  void draw(const std::string& text, bool final);

  std::string stage_, items_;
  double total_;
  Unit unit_;
  bool enabled_, live_;
  bool ended_ = false, drawn_ = false;
  double done_ = 0;
  std::string detail_;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

}  // namespace ft
