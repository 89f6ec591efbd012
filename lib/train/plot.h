// `ft plot` (DESIGN.md §4): the curves of one or more runs' metrics.jsonl (§7) in a grid of
// panels, several runs overlaid, one colour per run, drawn once onto a Canvas (plot_canvas.h)
// that writes SVG (by hand) or PNG (cairo, opened at run time).
//
// Reading follows §7: step lines, evaluation lines (`eval_loss`) and checkpoint lines (their
// step only; not drawn); a resumed run appends, so a step can appear twice and the last line of a
// step counts (of its kind: a step's evaluation line does not replace its step line); a `null`
// (an fp16 step that overflowed) is no point. Every other key is ignored, so DPO's rewards and
// whatever §7 adds later do not stop a plot.
//
// The SVG is made to be read back: each panel is a <g data-panel=...> carrying its transform
// (data-x0/x1 and data-y0/y1, the value range, at the pixel box data-px0/px1 and data-py0/py1,
// data-log-y 1 when the y axis is logarithmic), and each curve a <polyline data-run=... data-label
// data-metric=... data-kind=raw|smoothed|eval> whose points, inverted through the transform, are
// the values drawn. tests/cli/test_plot.sh checks them against metrics.jsonl.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "train/plot_canvas.h"

namespace ft::plot {

struct Point {
  int64_t step = 0;
  double value = 0;
};
using Series = std::vector<Point>;  // rising steps, one point a step

// The keys drawn, by the kind of line that carries them (DESIGN.md §7).
inline const std::vector<std::string>& step_keys() {
  static const std::vector<std::string> keys = {"loss",         "lr",     "grad_norm",
                                                "tokens_per_s", "tflops", "mem_peak_bytes"};
  return keys;
}
inline const std::vector<std::string>& eval_keys() {
  static const std::vector<std::string> keys = {"eval_loss"};
  return keys;
}

struct RunMetrics {
  std::string path;                      // the metrics file read
  std::string label;                     // the legend's name for the run
  std::map<std::string, Series> series;  // key of step_keys() or eval_keys() -> its points
  bool dpo = false;         // a DPO run (step lines carry reward_margin): its loss is per pair
  int64_t checkpoints = 0;  // checkpoint lines read (not drawn)
};

// The metrics file of a command-line argument: DIR/metrics.jsonl for a folder (a run's
// run.output_dir), else the path itself. Throws UsageError when there is none, naming what to
// give instead.
std::string metrics_file_of(const std::string& arg);

// Reads a metrics file. Throws UsageError (exit 2) naming path:line for a line that is not a JSON
// object with an integer "step", or a drawn key that is neither a number nor null. A last line
// that is not valid JSON and has no newline (a run killed as it wrote it) is left out, with a
// warning appended to `warnings`.
RunMetrics read_metrics(const std::string& path, std::vector<std::string>* warnings);

// TensorBoard's smoothing: an exponential moving average with weight w in [0, 1), debiased as
// Adam's moments are (the first points are not pulled toward 0):
//   m_i = w·m_{i-1} + (1-w)·v_i,  m_0 = 0;   smoothed_i = m_i / (1 - w^i)
Series smooth(const Series& s, double weight);

// Ticks for [lo, hi] at a step of 1, 2 or 5 times a power of ten, about `target` of them, each
// a whole multiple of the step (so 0 is a tick whenever it is in range). `min_step` bounds the
// step from below (steps are whole numbers: 1).
std::vector<double> nice_ticks(double lo, double hi, int target, double min_step = 0);
// The step nice_ticks chose for the same arguments.
double nice_step(double lo, double hi, int target, double min_step = 0);
// Ticks of a logarithmic axis over [lo, hi] (both > 0): powers of ten, every k-th decade when
// there are many; with fewer than two decades in range, 2 and 5 times them too.
std::vector<double> log_ticks(double lo, double hi);

// A number in few characters for a label: "0", "0.25", "12.5", "3e-4", "1.2k", "2.5M", "7G".
// At most `significant` digits (trailing zeros dropped).
std::string format_number(double v, int significant = 3);
// A tick's label: as format_number, with as many digits as the tick `step` needs to tell
// neighbouring ticks apart (1.25k beside 1.2k and 1.3k... at a step of 50).
std::string format_tick(double v, double step);

struct PlotOptions {
  int width = 1200;
  int height = 0;  // 0: default_height(panels)
  double smooth = 0.6;
};

// The panels that have data in at least one run, in drawing order, by name: "loss", "lr",
// "tokens_per_s", "tflops", "grad_norm", "memory".
std::vector<std::string> panels_with_data(const std::vector<RunMetrics>& runs);
// The height that gives each row of panels room at this width: the legend plus 300 pixels a row.
int default_height(int width, const std::vector<RunMetrics>& runs);

// Draws every panel with data and the legend. Throws UsageError when no run has anything to draw.
void draw(Canvas& canvas, const std::vector<RunMetrics>& runs, const PlotOptions& options);

// The kind of picture `output` asks for by its extension: .svg or .png in any case; anything
// else is a UsageError naming the two.
enum class Format { kSvg, kPng };
Format format_of(const std::string& output);

// The whole command: draws `runs` into `output`, SVG or PNG by its extension (.svg, .png, any
// case; anything else is a UsageError). Returns the size drawn.
struct Size {
  int width = 0, height = 0;
};
Size write_plot(const std::string& output, const std::vector<RunMetrics>& runs,
                const PlotOptions& options);

}  // namespace ft::plot
