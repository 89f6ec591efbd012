#include "train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/progress.h"

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
bool use_live_bar() { return progress_is_live(STDOUT_FILENO); }
}  // namespace

Progress::Progress(bool enabled) : enabled_(enabled), tty_(use_live_bar()) {}

std::string Progress::human_bytes(double b) { return ft::human_bytes(b); }
std::string Progress::human_duration(double s) { return ft::human_duration(s); }
std::string Progress::human_seconds(double s) { return ft::human_seconds(s); }

namespace {
// DPO's figures beside the loss: " margin 0.1234 acc 0.75", or nothing.
std::string dpo_part(const StepReport& r) {
  if (!r.dpo) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " margin %.4f acc %.2f", r.reward_margin, r.reward_accuracy);
  return buf;
}
// "TFLOP/s 123.4 (MFU 45.6%)", or without the MFU where the peak is unknown; then " GPU 87%"
// where the GPU's utilisation is known.
std::string flops_part(const StepReport& r) {
  char buf[96];
  int n = 0;
  if (r.mfu >= 0)
    n = std::snprintf(buf, sizeof buf, "TFLOP/s %.3g (MFU %.1f%%)", r.tflops, 100 * r.mfu);
  else
    n = std::snprintf(buf, sizeof buf, "TFLOP/s %.3g", r.tflops);
  if (r.gpu_util >= 0 && n > 0 && size_t(n) < sizeof buf)
    std::snprintf(buf + n, sizeof buf - size_t(n), " GPU %.0f%%", r.gpu_util);
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
