#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/system.h"

namespace ft {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024.0 && u < 5) {
    b /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string human_seconds(double s) {
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

std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e4)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

bool progress_is_live(int fd) {
  if (const char* p = std::getenv("FT_PROGRESS")) return std::strcmp(p, "bar") == 0;
  if (launched_by_mpi()) return false;
  return isatty(fd) != 0;
}

double WorkProgress::live_every_seconds() {
  const char* e = std::getenv("FT_PROGRESS_EVERY_S");
  if (!e || !*e) return 0.5;
  char* end = nullptr;
  const double seconds = std::strtod(e, &end);
  if (end == e || *end != '\0' || !std::isfinite(seconds) || seconds < 0)
    FT_FAIL("FT_PROGRESS_EVERY_S=", e,
            " is not a number of seconds >= 0 (how often a progress line is redrawn; unset: 0.5)");
  return seconds;
}

WorkProgress::WorkProgress(std::string stage, double total, Unit unit, std::string items,
                           bool enabled)
    : stage_(std::move(stage)),
      items_(std::move(items)),
      total_(total),
      unit_(unit),
      enabled_(enabled),
      live_(enabled && progress_is_live(STDERR_FILENO)),
      t0_(std::chrono::steady_clock::now()),
      last_draw_(t0_) {}

WorkProgress::~WorkProgress() {
  // Cut short: the live line keeps its last state, and what follows starts a line of its own.
  if (enabled_ && !ended_ && live_ && drawn_) draw(line(done_, detail_), true);
}

double WorkProgress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

std::string WorkProgress::amount(double done) const {
  if (unit_ == Unit::kBytes)
    return total_ > 0 ? human_bytes(done) + " of " + human_bytes(total_) : human_bytes(done);
  std::string s = human_count(done);
  if (total_ > 0) s.append("/").append(human_count(total_));
  if (!items_.empty()) s.append(" ").append(items_);
  return s;
}

std::string WorkProgress::line(double done, const std::string& detail) const {
  const double secs = seconds();
  std::string s = "ft: " + stage_ + ": ";
  if (total_ > 0) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%d%% ", int(100.0 * std::min(done / total_, 1.0)));
    s += pct;
  }
  s += amount(done);
  if (secs > 0 && done > 0) {
    const double rate = done / secs;
    s += ", " + (unit_ == Unit::kBytes ? human_bytes(rate) : human_count(rate) + " " + items_) +
         "/s";
    if (total_ > done) s += ", ETA " + human_duration((total_ - done) / rate);
  }
  if (!detail.empty()) s += ", " + detail;
  return s;
}

void WorkProgress::draw(const std::string& text, bool final) {
  if (live_) {
    // Back to the line's start and clear it: the new text may be shorter.
    std::fprintf(stderr, "\r%s\033[K%s", text.c_str(), final ? "\n" : "");
    note_live_line(!final);
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = std::chrono::steady_clock::now();
}

void WorkProgress::update(double done, const std::string& detail) {
  if (!enabled_ || ended_) return;
  done_ = done;
  detail_ = detail;
  const double since =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - last_draw_).count();
  if (since >= (live_ ? live_every_seconds() : kPlainEverySeconds)) draw(line(done, detail), false);
}

void WorkProgress::finish(const std::string& summary) {
  if (!enabled_ || ended_) return;
  ended_ = true;
  const double secs = seconds();
  std::string s = "ft: " + stage_ + ": " + (summary.empty() ? amount(done_) : summary) + " in " +
                  human_seconds(secs);
  if (secs > 0 && done_ > 0) {
    const double rate = done_ / secs;
    s += " (" + (unit_ == Unit::kBytes ? human_bytes(rate) : human_count(rate) + " " + items_) +
         "/s)";
  }
  draw(s, true);
}

void WorkProgress::close() {
  if (!enabled_ || ended_) return;
  ended_ = true;
  if (live_ && drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    note_live_line(false);
  }
}

}  // namespace ft
