#include "train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"

namespace ft {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_)
    throw Error("cannot open metrics file '" + path + "' for writing; check logging.metrics");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& o) noexcept {
  if (this != &o) {
    if (f_) std::fclose(f_);
    f_ = std::exchange(o.f_, nullptr);
    path_ = std::move(o.path_);
  }
  return *this;
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!f_) return;
  std::string s = line.dump();
  std::fprintf(f_, "%s\n", s.c_str());
  std::fflush(f_);
}

namespace {
// A live bar only on a real terminal. Under an MPI launcher stdout is often a pseudo-terminal of
// the launcher's even when the job's output goes to a file, so ranks started by a launcher print
// plain lines unless FT_PROGRESS says otherwise (`--nproc` sets it from its own stdout).
bool use_live_bar() {
  if (const char* p = std::getenv("FT_PROGRESS")) return std::string(p) == "bar";
  if (launched_by_mpi()) return false;
  return isatty(STDOUT_FILENO);
}
}  // namespace

Progress::Progress(bool enabled) : enabled_(enabled), tty_(use_live_bar()) {}

std::string Progress::human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string Progress::human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string Progress::human_seconds(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[48];
  // Each format's range ends where rounding would carry into the next one's (9.996 s is
  // "10.0 s", not "10.00 s"; 59.96 s is "1 min 00 s").
  if (s < 0.9995)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s < 9.995)
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s < 59.95)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else if (s < 3599.5) {
    const long t = long(s + 0.5);
    std::snprintf(buf, sizeof buf, "%ld min %02ld s", t / 60, t % 60);
  } else {
    const long m = long(s / 60 + 0.5);
    std::snprintf(buf, sizeof buf, "%ld h %02ld min", m / 60, m % 60);
  }
  return buf;
}

namespace {
// DPO's figures beside the loss: " margin 0.1234 acc 0.75", or nothing.
std::string dpo_part(const StepReport& r) {
  if (!r.dpo) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " margin %.4f acc %.2f", r.reward_margin, r.reward_accuracy);
  return buf;
}
// "TFLOP/s 123.4 (MFU 45.6%)", or without the MFU where the peak is unknown.
std::string flops_part(const StepReport& r) {
  char buf[64];
  if (r.mfu >= 0)
    std::snprintf(buf, sizeof buf, "TFLOP/s %.3g (MFU %.1f%%)", r.tflops, 100 * r.mfu);
  else
    std::snprintf(buf, sizeof buf, "TFLOP/s %.3g", r.tflops);
  return buf;
}
}  // namespace

void Progress::step(const StepReport& r) {
  if (!enabled_) return;
  const int64_t done = r.step;
  const double eta = r.elapsed_s / double(std::max<int64_t>(1, done - r.first_step)) *
                     double(r.total_steps - done);
  if (tty_) {
    const int width = 24;
    int filled = int(double(width) * double(done) / double(r.total_steps));
    std::string bar(size_t(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, ' ');
    std::printf("\r\033[Kstep %lld/%lld [%s] loss %.4f%s | %.0f tok/s | %s | ETA %s",
                (long long)done, (long long)r.total_steps, bar.c_str(), r.loss, dpo_part(r).c_str(),
                r.tokens_per_s, flops_part(r).c_str(), human_duration(eta).c_str());
    bar_open_ = true;
  } else {
    std::printf("step %lld/%lld loss %.4f%s lr %.3e grad_norm %.4f tok/s %.0f %s mem %s eta %s\n",
                (long long)done, (long long)r.total_steps, r.loss, dpo_part(r).c_str(), r.lr,
                r.grad_norm, r.tokens_per_s, flops_part(r).c_str(),
                human_bytes(double(r.mem_peak_bytes)).c_str(), human_duration(eta).c_str());
  }
  std::fflush(stdout);
}

void Progress::eval(int64_t step, double eval_loss) {
  if (!enabled_) return;
  if (bar_open_) {
    std::printf("\n");
    bar_open_ = false;
  }
  std::printf("eval at step %lld: loss %.4f\n", (long long)step, eval_loss);
  std::fflush(stdout);
}

void Progress::note(const std::string& line) {
  if (!enabled_) return;
  if (bar_open_) {
    std::printf("\n");
    bar_open_ = false;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void Progress::finish() {
  if (bar_open_) std::printf("\n");
  bar_open_ = false;
  std::fflush(stdout);
}

}  // namespace ft
