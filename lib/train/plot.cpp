#include "train/plot.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/json_describe.h"

namespace ft::plot {

namespace fs = std::filesystem;

// ---- Reading metrics.jsonl ----------------------------------------------------------------------

namespace {

// A metrics file is a line of some 700 bytes a logged step: 16 GiB is twenty million lines, far
// past any run; the check is that it is a regular file (not a FIFO or a device).
constexpr uint64_t kMaxMetricsBytes = uint64_t(16) << 30;

const char* const kMetricsHint =
    "each line of a metrics file is one JSON object with an integer \"step\" (DESIGN.md §7)";

// Reads a file line by line with a bound on each line, saying whether the line ended with a
// newline (a line without one is the file's last, and may have been cut short by a crash).
class BoundedLines {
 public:
  explicit BoundedLines(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) throw UsageError("cannot open metrics file " + path + ": " + std::strerror(errno));
  }
  ~BoundedLines() { std::fclose(f_); }
  BoundedLines(const BoundedLines&) = delete;
  BoundedLines& operator=(const BoundedLines&) = delete;

  bool next(std::string* line, bool* ended) {
    line->clear();
    for (;;) {
      if (pos_ == len_) {
        len_ = std::fread(buf_, 1, sizeof buf_, f_);
        pos_ = 0;
        if (len_ == 0) {
          if (std::ferror(f_))
            throw UsageError("cannot read metrics file " + path_ + ": " + std::strerror(errno));
          if (line->empty()) return false;
          ++line_no_;
          *ended = false;
          return true;
        }
      }
      const char* start = buf_ + pos_;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', len_ - pos_));
      const size_t n = nl ? size_t(nl - start) : len_ - pos_;
      if (line->size() + n > kMaxJsonlLineBytes)
        throw UsageError(detail::concat(path_, ":", line_no_ + 1, ": a line longer than ",
                                        kMaxJsonlLineBytes >> 20, " MiB; ", kMetricsHint));
      line->append(start, n);
      pos_ += n;
      if (nl) {
        ++pos_;
        ++line_no_;
        *ended = true;
        return true;
      }
    }
  }
  uint64_t line_no() const { return line_no_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  char buf_[1 << 16];
  size_t pos_ = 0, len_ = 0;
  uint64_t line_no_ = 0;
};

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }

// The values of `keys` in one line: a number, or nothing (absent or null).
using LineValues = std::vector<std::optional<double>>;

LineValues values_of(const nlohmann::json& j, const std::vector<std::string>& keys,
                     const std::string& where) {
  LineValues out(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    const auto it = j.find(keys[k]);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number() || it->is_boolean())
      throw UsageError(where + ": \"" + keys[k] + "\" is " + describe_json_value(*it) +
                       ", expected a number or null; " + kMetricsHint);
    out[k] = it->get<double>();
  }
  return out;
}

// Per step, the last line's values, into one series per key (a key the line lacks: no point).
void add_series(const std::map<int64_t, LineValues>& lines, const std::vector<std::string>& keys,
                std::map<std::string, Series>* series) {
  for (size_t k = 0; k < keys.size(); ++k) {
    Series s;
    for (const auto& [step, values] : lines)
      if (values[k]) s.push_back({step, *values[k]});
    if (!s.empty()) (*series)[keys[k]] = std::move(s);
  }
}

}  // namespace

std::string metrics_file_of(const std::string& arg) {
  const char* const what =
      "; give a run's run.output_dir (the folder holding metrics.jsonl) or a metrics .jsonl file";
  std::error_code ec;
  const fs::file_status st = fs::status(arg, ec);
  if (!fs::exists(st)) throw UsageError(excerpt(arg, 200) + " does not exist" + what);
  if (!fs::is_directory(st)) return arg;
  const std::string file = (fs::path(arg) / "metrics.jsonl").string();
  if (!fs::exists(file, ec))
    throw UsageError("folder " + excerpt(arg, 200) +
                     " holds no metrics.jsonl; give the run's run.output_dir, or the file its "
                     "logging.metrics names");
  return file;
}

RunMetrics read_metrics(const std::string& path, std::vector<std::string>* warnings) {
  check_regular_file(path, kMaxMetricsBytes, "metrics file",
                     "give a run's metrics.jsonl (logging.metrics)");
  RunMetrics run;
  run.path = path;
  std::map<int64_t, LineValues> step_lines, eval_lines;
  BoundedLines in(path);
  std::string line;
  bool ended = true;
  while (in.next(&line, &ended)) {
    if (is_blank(line)) continue;
    const std::string where = detail::concat(path, ":", in.line_no());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      if (!ended) {  // the file's last line, without its newline: a run killed mid-write
        if (warnings)
          warnings->push_back(where +
                              ": the last line is cut short (not valid JSON, no newline: "
                              "the run ended while writing it?); it is left out");
        break;
      }
      throw UsageError(where + ": not valid JSON (" + json_error_words(e) + "); " + kMetricsHint);
    }
    if (!j.is_object())
      throw UsageError(where + ": " + a_json_type(j) + ", not a JSON object; " + kMetricsHint);
    const auto step = j.find("step");
    if (step == j.end() || !step->is_number_integer() ||
        (step->is_number_integer() && !step->is_number_unsigned() && step->get<int64_t>() < 0))
      throw UsageError(where + ": \"step\" is " +
                       (step == j.end() ? std::string("missing") : describe_json_value(*step)) +
                       ", expected a whole number of steps; " + kMetricsHint);
    const int64_t s = step->get<int64_t>();
    // DESIGN.md §7's three kinds of line; each kind's last line of a step replaces the earlier.
    if (j.contains("eval_loss")) {
      eval_lines[s] = values_of(j, eval_keys(), where);
    } else if (j.contains("ckpt_step")) {
      ++run.checkpoints;
    } else {
      step_lines[s] = values_of(j, step_keys(), where);
      if (j.contains("reward_margin")) run.dpo = true;
    }
  }
  add_series(step_lines, step_keys(), &run.series);
  add_series(eval_lines, eval_keys(), &run.series);
  return run;
}

// ---- Numbers ------------------------------------------------------------------------------------

Series smooth(const Series& s, double weight) {
  Series out;
  out.reserve(s.size());
  double m = 0, weight_power = 1;  // the EMA, and weight^i
  for (const Point& p : s) {
    m = weight * m + (1 - weight) * p.value;
    weight_power *= weight;
    out.push_back({p.step, m / (1 - weight_power)});
  }
  return out;
}

double nice_step(double lo, double hi, int target, double min_step) {
  double span = hi - lo;
  if (!(span > 0)) span = std::abs(lo) > 0 ? std::abs(lo) : 1;
  const double raw = span / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  // The nearest of 1, 2, 5, 10 (geometric midpoints, rounded).
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
  return std::max(step, min_step);
}

std::vector<double> nice_ticks(double lo, double hi, int target, double min_step) {
  const double step = nice_step(lo, hi, target, min_step);
  // A tick is k·step for a whole k (never a running sum, whose error grows).
  const double k0 = std::ceil(lo / step - 1e-9), k1 = std::floor(hi / step + 1e-9);
  std::vector<double> ticks;
  for (double k = k0; k <= k1 && ticks.size() < 100; ++k) ticks.push_back(k == 0 ? 0.0 : k * step);
  return ticks;
}

std::vector<double> log_ticks(double lo, double hi) {
  const int e0 = int(std::ceil(std::log10(lo) - 1e-9)), e1 = int(std::floor(std::log10(hi) + 1e-9));
  std::vector<double> ticks;
  if (e1 - e0 + 1 >= 2) {
    const int every = (e1 - e0 + 1 + 5) / 6;  // at most six labels
    for (int e = e0; e <= e1; e += every) ticks.push_back(std::pow(10.0, e));
    return ticks;
  }
  for (int e = int(std::floor(std::log10(lo))); e <= e1 + 1; ++e)
    for (double m : {1.0, 2.0, 5.0}) {
      const double t = m * std::pow(10.0, e);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push_back(t);
    }
  return ticks;
}

namespace {

// `v` (not 0) rounded to `sig` significant digits, in fixed notation without trailing zeros and
// never in exponent form (printf's %g would write 1e+02 for 100 at one digit).
std::string fixed_significant(double v, int sig) {
  const int e = int(std::floor(std::log10(std::abs(v))));
  const int decimals = std::max(0, sig - 1 - e);
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  std::string s = b;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

double round_significant(double v, int sig) {
  const double scale = std::pow(10.0, sig - 1 - std::floor(std::log10(std::abs(v))));
  return std::round(v * scale) / scale;
}

}  // namespace

std::string format_number(double v, int significant) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const int sig = std::clamp(significant, 1, 15);
  if (v == 0) return "0";
  const double r = round_significant(v, sig);  // 999.96 at 3 digits is 1000: "1k", not "1000"
  const double a = std::abs(r);
  if (a >= 1e-2 && a < 1e3) return fixed_significant(r, sig);
  if (a >= 1e3 && a < 1e15) {
    static const char* const kSuffix[] = {"k", "M", "G", "T"};
    const int group = std::min(int(std::floor(std::log10(a) / 3)), 4);
    return fixed_significant(r / std::pow(1000.0, group), sig) + kSuffix[group - 1];
  }
  // Exponent form, as Python and C write it but short: 3e-4, 2.5e-5, 1e15.
  int e = int(std::floor(std::log10(a)));
  double mantissa = round_significant(r / std::pow(10.0, e), sig);
  if (std::abs(mantissa) >= 10) {  // log10 and the division round too
    mantissa /= 10;
    ++e;
  } else if (std::abs(mantissa) < 1) {
    mantissa = round_significant(mantissa * 10, sig);
    --e;
  }
  return fixed_significant(mantissa, sig) + "e" + std::to_string(e);
}

std::string format_tick(double v, double step) {
  if (std::abs(v) < step * 1e-6) return "0";
  // A tick is a whole multiple of 10^k (step is 1, 2 or 5 times it): the digits from v's first
  // down to 10^k's tell it from its neighbours.
  const int k = int(std::floor(std::log10(step) + 1e-9));
  const int first = int(std::floor(std::log10(std::abs(v)) + 1e-9));
  return format_number(v, std::clamp(first - k + 1, 1, 15));
}

// ---- Layout and drawing -------------------------------------------------------------------------

namespace {

// Tableau's ten colours (matplotlib's default cycle): distinct for most colour vision, and
// what people comparing runs are used to. Past ten runs they repeat.
const Color kRunColors[] = {{0x1f, 0x77, 0xb4}, {0xff, 0x7f, 0x0e}, {0x2c, 0xa0, 0x2c},
                            {0xd6, 0x27, 0x28}, {0x94, 0x67, 0xbd}, {0x8c, 0x56, 0x4b},
                            {0xe3, 0x77, 0xc2}, {0x7f, 0x7f, 0x7f}, {0xbc, 0xbd, 0x22},
                            {0x17, 0xbe, 0xcf}};
Color run_color(size_t i) { return kRunColors[i % std::size(kRunColors)]; }

const Color kWhite{0xff, 0xff, 0xff};
const Color kGrid{0xe6, 0xe6, 0xe6};
const Color kFrame{0xb0, 0xb0, 0xb0};
const Color kText{0x33, 0x33, 0x33};
const Color kKey{0x55, 0x55, 0x55};

constexpr double kMargin = 12;     // around the picture
constexpr double kLegendRow = 22;  // one row of the legend
constexpr double kBoxLeft = 68;    // from a panel's cell to its plot box: tick labels, y label
constexpr double kBoxRight = 18;
constexpr double kBoxTop = 26;     // the panel's title
constexpr double kBoxBottom = 42;  // tick labels and "step"
constexpr double kMinBox = 40;     // the smallest plot box worth drawing
constexpr double kDefaultRowHeight = 300;

// Text width for layout, in pixels: about 0.6 em a character in a sans-serif font (both
// renderers measure their own; this only needs to keep labels apart).
double text_width(const std::string& s, double size) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  return 0.6 * size * double(chars);
}

struct PanelSpec {
  const char* name;
  const char* title;
  const char* y_label;
  std::vector<const char*> keys;  // the first is the panel's main series
  double scale = 1;               // value drawn = value read × scale
};

const std::vector<PanelSpec>& panel_specs() {
  static const std::vector<PanelSpec> specs = {
      {"loss", "loss", "loss (nats/token)", {"loss", "eval_loss"}},
      {"lr", "learning rate", "learning rate", {"lr"}},
      {"tokens_per_s", "throughput", "tokens/s", {"tokens_per_s"}},
      {"tflops", "model FLOP rate", "TFLOP/s per device", {"tflops"}},
      {"grad_norm", "gradient norm", "grad norm (before clipping)", {"grad_norm"}},
      {"memory", "device memory", "memory peak (GiB)", {"mem_peak_bytes"}, 1.0 / (1 << 30)},
  };
  return specs;
}

bool has_data(const PanelSpec& p, const std::vector<RunMetrics>& runs) {
  for (const RunMetrics& r : runs)
    for (const char* k : p.keys)
      if (r.series.count(k)) return true;
  return false;
}

// The legend: the runs by colour, then (with a loss panel) what the loss curves' styles mean.
struct LegendItem {
  std::string text;
  Stroke stroke;
  bool marker = false;
  double width = 0;  // swatch + text + gap
};

std::vector<LegendItem> legend_items(const std::vector<RunMetrics>& runs, bool loss_panel,
                                     bool any_eval, double smooth_weight) {
  std::vector<LegendItem> items;
  for (size_t i = 0; i < runs.size(); ++i)
    items.push_back({runs[i].label, Stroke{run_color(i), 3, 1, false}});
  if (loss_panel) {
    items.push_back({"loss, raw", Stroke{kKey, 1, 0.35, false}});
    items.push_back(
        {"loss, smoothed (EMA " + format_number(smooth_weight) + ")", Stroke{kKey, 2, 1, false}});
    if (any_eval) items.push_back({"eval loss", Stroke{kKey, 1.5, 1, true}, true});
  }
  for (LegendItem& it : items) it.width = 26 + text_width(it.text, 12) + 18;
  return items;
}

// Places the items in rows within `width`; returns the legend's height.
double layout_legend(std::vector<LegendItem>& items, double width, std::vector<Pixel>* at) {
  double x = kMargin, y = kMargin;
  for (const LegendItem& it : items) {
    if (x > kMargin && x + it.width > width - kMargin) {
      x = kMargin;
      y += kLegendRow;
    }
    if (at) at->push_back({x, y});
    x += it.width;
  }
  return y + kLegendRow - kMargin + 6;
}

bool any_series(const std::vector<RunMetrics>& runs, const char* key) {
  for (const RunMetrics& r : runs)
    if (r.series.count(key)) return true;
  return false;
}

int columns_for(int width, int panels) { return panels >= 2 && width >= 640 ? 2 : 1; }

// A panel's value range and its place on the picture.
struct Transform {
  double x0, x1, y0, y1;      // values at the box's edges (y0 bottom, y1 top)
  double px0, px1, py0, py1;  // pixels of x0, x1, y0, y1
  bool log_y = false;
  double to_px(double x) const { return px0 + (x - x0) / (x1 - x0) * (px1 - px0); }
  double to_py(double y) const {
    if (log_y)
      return py0 +
             (std::log10(y) - std::log10(y0)) / (std::log10(y1) - std::log10(y0)) * (py1 - py0);
    return py0 + (y - y0) / (y1 - y0) * (py1 - py0);
  }
};

std::string full(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// The y range of a panel's values: 5% of the span beyond each end (from 0 where the values are
// all positive and the pad would cross it); logarithmic when the values are all positive and span
// three decades or more (a loss falling from 10 to 0.01, a gradient norm's spikes).
void set_y_range(double lo, double hi, Transform* t) {
  t->log_y = lo > 0 && hi / lo >= 1000;
  if (t->log_y) {
    const double l0 = std::log10(lo), l1 = std::log10(hi), pad = 0.05 * (l1 - l0);
    t->y0 = std::pow(10.0, l0 - pad);
    t->y1 = std::pow(10.0, l1 + pad);
    return;
  }
  double pad = 0.05 * (hi - lo);
  if (!(pad > 0)) pad = lo != 0 ? 0.05 * std::abs(lo) : 1;  // one value, or a constant series
  t->y0 = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
  t->y1 = hi + pad;
}

// The points of a series to draw, at most a few per pixel column: a long run's series keeps, for
// each column, its first, lowest, highest and last point (so every spike and the line's ends
// stay, and each drawn point is one of the series' own).
Series thin_out(const Series& s, const Transform& t) {
  const double columns = std::abs(t.px1 - t.px0);
  if (double(s.size()) <= 4 * columns) return s;
  Series out;
  size_t begin = 0;
  while (begin < s.size()) {
    const long col = long(std::floor(t.to_px(double(s[begin].step))));
    size_t end = begin, lo = begin, hi = begin;
    while (end < s.size() && long(std::floor(t.to_px(double(s[end].step)))) == col) {
      if (s[end].value < s[lo].value) lo = end;
      if (s[end].value > s[hi].value) hi = end;
      ++end;
    }
    std::set<size_t> keep = {begin, lo, hi, end - 1};
    for (size_t i : keep) out.push_back(s[i]);
    begin = end;
  }
  return out;
}

Series scaled(const Series& s, double scale) {
  Series out = s;
  for (Point& p : out) p.value *= scale;
  return out;
}

void draw_panel(Canvas& c, const PanelSpec& spec, const std::vector<RunMetrics>& runs,
                const PlotOptions& o, double cell_x, double cell_y, double cell_w, double cell_h,
                double x_lo, double x_hi) {
  // The curves of this panel, per run: (key, kind, series).
  struct Curve {
    size_t run;
    std::string key, kind;
    Series points;
  };
  std::vector<Curve> curves;
  for (size_t r = 0; r < runs.size(); ++r)
    for (const char* key : spec.keys) {
      const auto it = runs[r].series.find(key);
      if (it == runs[r].series.end()) continue;
      const Series s = scaled(it->second, spec.scale);
      if (std::string(key) == "eval_loss") {
        curves.push_back({r, key, "eval", s});
      } else if (std::string(spec.name) == "loss") {
        curves.push_back({r, key, "raw", s});
        curves.push_back({r, key, "smoothed", smooth(s, o.smooth)});
      } else {
        curves.push_back({r, key, "raw", s});
      }
    }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const Curve& cv : curves)
    for (const Point& p : cv.points) {
      lo = std::min(lo, p.value);
      hi = std::max(hi, p.value);
    }

  Transform t{};
  t.x0 = x_lo;
  t.x1 = x_hi;
  t.px0 = cell_x + kBoxLeft;
  t.px1 = cell_x + cell_w - kBoxRight;
  t.py0 = cell_y + cell_h - kBoxBottom;
  t.py1 = cell_y + kBoxTop;
  set_y_range(lo, hi, &t);

  std::string y_label = spec.y_label;
  if (std::string(spec.name) == "loss") {
    bool dpo = false, sft = false;
    for (const RunMetrics& r : runs) (r.dpo ? dpo : sft) = true;
    if (dpo) y_label = sft ? "loss (nats)" : "DPO loss (nats/pair)";
  }
  if (t.log_y) y_label += ", log scale";

  c.begin_group({{"class", "panel"},
                 {"data-panel", spec.name},
                 {"data-x0", full(t.x0)},
                 {"data-x1", full(t.x1)},
                 {"data-y0", full(t.y0)},
                 {"data-y1", full(t.y1)},
                 {"data-px0", full(t.px0)},
                 {"data-px1", full(t.px1)},
                 {"data-py0", full(t.py0)},
                 {"data-py1", full(t.py1)},
                 {"data-log-y", t.log_y ? "1" : "0"}});
  const double bw = t.px1 - t.px0, bh = t.py0 - t.py1;
  c.fill_rect(t.px0, t.py1, bw, bh, kWhite);

  // Grid and tick labels.
  const Stroke grid{kGrid, 1, 1, false};
  const double x_step = nice_step(t.x0, t.x1, std::max(2, int(bw / 90)), 1);
  for (double x : nice_ticks(t.x0, t.x1, std::max(2, int(bw / 90)), 1)) {
    const double px = t.to_px(x);
    c.polyline({{px, t.py0}, {px, t.py1}}, grid, {});
    c.text(px, t.py0 + 15, format_tick(x, x_step), {11, Anchor::kMiddle, false, false, kText});
  }
  const int y_target = std::max(2, int(bh / 50));
  const double y_step = t.log_y ? 0 : nice_step(t.y0, t.y1, y_target);
  for (double y : t.log_y ? log_ticks(t.y0, t.y1) : nice_ticks(t.y0, t.y1, y_target)) {
    const double py = t.to_py(y);
    c.polyline({{t.px0, py}, {t.px1, py}}, grid, {});
    c.text(t.px0 - 5, py + 4, t.log_y ? format_number(y) : format_tick(y, y_step),
           {11, Anchor::kEnd, false, false, kText});
  }
  c.stroke_rect(t.px0, t.py1, bw, bh, Stroke{kFrame, 1, 1, false});

  // Curves: the faint raw loss first, so that every run's bold curve is above every faint one.
  for (int pass = 0; pass < 2; ++pass)
    for (const Curve& cv : curves) {
      if ((cv.kind == "raw" && std::string(spec.name) == "loss") != (pass == 0)) continue;
      const Color col = run_color(cv.run);
      const bool faint = cv.kind == "raw" && std::string(spec.name) == "loss";
      const Stroke st{col,
                      faint               ? 1.0
                      : cv.kind == "eval" ? 1.5
                                          : 2.0,
                      faint ? 0.35 : 1.0, cv.kind == "eval"};
      std::vector<Pixel> px;
      const Series drawn = thin_out(cv.points, t);
      for (const Point& p : drawn) px.push_back({t.to_px(double(p.step)), t.to_py(p.value)});
      c.polyline(px, st,
                 {{"data-run", std::to_string(cv.run)},
                  {"data-label", runs[cv.run].label},
                  {"data-metric", cv.key},
                  {"data-kind", cv.kind}});
      // Markers where a line alone would not show: each evaluation, and a lone point.
      if (cv.kind == "eval" || (px.size() == 1 && !faint))
        for (const Pixel& p : px) c.circle(p, cv.kind == "eval" ? 2.5 : 3, col);
    }

  // Title and axis labels.
  c.text(t.px0, cell_y + 17, spec.title, {13, Anchor::kStart, true, false, kText});
  c.text((t.px0 + t.px1) / 2, t.py0 + 32, "step", {12, Anchor::kMiddle, false, false, kText});
  c.text(cell_x + 16, (t.py0 + t.py1) / 2, y_label, {12, Anchor::kMiddle, false, true, kText});
  c.end_group();
}

}  // namespace

std::vector<std::string> panels_with_data(const std::vector<RunMetrics>& runs) {
  std::vector<std::string> out;
  for (const PanelSpec& p : panel_specs())
    if (has_data(p, runs)) out.push_back(p.name);
  return out;
}

int default_height(int width, const std::vector<RunMetrics>& runs) {
  const int panels = int(panels_with_data(runs).size());
  std::vector<LegendItem> items =
      legend_items(runs, has_data(panel_specs()[0], runs), any_series(runs, "eval_loss"), 0.6);
  const double legend = layout_legend(items, width, nullptr);
  const int cols = columns_for(width, panels);
  const int rows = std::max(1, (panels + cols - 1) / cols);
  return int(std::ceil(kMargin + legend + rows * kDefaultRowHeight + kMargin));
}

void draw(Canvas& c, const std::vector<RunMetrics>& runs, const PlotOptions& o) {
  std::vector<const PanelSpec*> panels;
  for (const PanelSpec& p : panel_specs())
    if (has_data(p, runs)) panels.push_back(&p);
  if (panels.empty())
    throw UsageError(
        "nothing to draw: no step or evaluation line with loss, lr, grad_norm, tokens_per_s, "
        "tflops, mem_peak_bytes or eval_loss in " +
        (runs.empty() ? std::string("the runs") : excerpt(runs[0].path, 200)) +
        (runs.size() > 1 ? " or the others" : ""));
  const double W = o.width, H = o.height > 0 ? o.height : default_height(o.width, runs);

  std::vector<LegendItem> items = legend_items(runs, panels[0]->name == std::string("loss"),
                                               any_series(runs, "eval_loss"), o.smooth);
  std::vector<Pixel> at;
  const double legend_h = layout_legend(items, W, &at);
  const int cols = columns_for(int(W), int(panels.size()));
  const int rows = int((panels.size() + cols - 1) / cols);
  const double top = kMargin + legend_h;
  const double cell_w = (W - 2 * kMargin) / cols, cell_h = (H - top - kMargin) / rows;
  if (cell_w - kBoxLeft - kBoxRight < kMinBox || cell_h - kBoxTop - kBoxBottom < kMinBox)
    throw UsageError(detail::concat("--width ", o.width, " --height ", o.height,
                                    " is too small for ", panels.size(), " panels in ", rows,
                                    " rows of ", cols, "; the default height for this width is ",
                                    default_height(o.width, runs)));

  // One step axis for every panel, so that the panels line up.
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  for (const RunMetrics& r : runs)
    for (const auto& [key, s] : r.series)
      for (const Point& p : s) {
        x_lo = std::min(x_lo, double(p.step));
        x_hi = std::max(x_hi, double(p.step));
      }
  if (x_lo == x_hi) {  // a single step: a range around it
    x_lo -= 1;
    x_hi += 1;
  }

  c.fill_rect(0, 0, W, H, kWhite);
  c.begin_group({{"class", "legend"}});
  for (size_t i = 0; i < items.size(); ++i) {
    const double y = at[i].y + 8;
    c.polyline({{at[i].x, y}, {at[i].x + 20, y}}, items[i].stroke, {});
    if (items[i].marker) c.circle({at[i].x + 10, y}, 2.5, items[i].stroke.color);
    c.text(at[i].x + 26, y + 4, items[i].text, {12, Anchor::kStart, false, false, kText});
  }
  c.end_group();
  for (size_t i = 0; i < panels.size(); ++i) {
    const double cx = kMargin + double(i % cols) * cell_w, cy = top + double(i / cols) * cell_h;
    draw_panel(c, *panels[i], runs, o, cx, cy, cell_w, cell_h, x_lo, x_hi);
  }
}

Format format_of(const std::string& output) {
  std::string ext = fs::path(output).extension().string();
  for (char& ch : ext) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (ext == ".svg") return Format::kSvg;
  if (ext == ".png") return Format::kPng;
  throw UsageError("--output " + excerpt(output, 200) +
                   ": the picture's kind comes from its extension, which must be .svg or .png");
}

Size write_plot(const std::string& output, const std::vector<RunMetrics>& runs,
                const PlotOptions& options) {
  const Format format = format_of(output);
  PlotOptions o = options;
  if (o.height == 0) o.height = default_height(o.width, runs);
  if (format == Format::kPng) {
    CairoPngCanvas canvas(o.width, o.height);  // first: a host without cairo stops here
    draw(canvas, runs, o);
    canvas.write_png(output);
  } else {
    SvgCanvas canvas(o.width, o.height);
    draw(canvas, runs, o);
    const std::string svg = canvas.finish();
    std::FILE* f = std::fopen(output.c_str(), "wb");
    const bool ok = f && std::fwrite(svg.data(), 1, svg.size(), f) == svg.size();
    const int err = errno;
    if (f && std::fclose(f) != 0 && ok)
      throw Error("cannot write " + output + ": " + std::strerror(errno));
    if (!ok)
      throw Error("cannot write " + output + ": " + std::strerror(err) +
                  "; check that its folder exists and is writable");
  }
  return {o.width, o.height};
}

}  // namespace ft::plot
