// ft plot RUN_DIR... --output FILE.svg|FILE.png: the runs' metrics as one picture (the drawing is
// train/plot.h's); here the arguments become runs with names, and the result a line.
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "apps/ft/commands.h"
#include "core/error.h"
#include "core/files.h"
#include "train/plot.h"

namespace ft::app {
namespace {

namespace fs = std::filesystem;

// A run's name in the legend: its folder's (run.output_dir's last part), or for a file given
// directly, the file's name without .jsonl unless that is the usual metrics.jsonl.
std::string default_label(const std::string& arg, const std::string& file) {
  fs::path p = fs::path(arg).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/" -> "out"
  if (file == arg) {
    const fs::path f(file);
    if (f.filename() != "metrics.jsonl") return f.stem().string();
    p = fs::absolute(f).lexically_normal().parent_path();
  } else if (p.filename() == "." || p.filename() == "..") {
    p = fs::absolute(p).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
  }
  return p.filename().string();
}

// Two runs of the same folder name (a/out, b/out) get the folder above as well, then a number.
void make_unique(std::vector<std::string>* labels, const std::vector<std::string>& args) {
  std::map<std::string, int> seen;
  for (const std::string& l : *labels) ++seen[l];
  for (size_t i = 0; i < labels->size(); ++i) {
    if (seen[(*labels)[i]] < 2) continue;
    const fs::path p = fs::absolute(args[i]).lexically_normal();
    const fs::path parent = p.parent_path().filename();
    if (!parent.empty()) (*labels)[i] = (parent / p.filename()).string();
  }
  std::map<std::string, int> count;
  for (std::string& l : *labels)
    if (++count[l] > 1) l += " (" + std::to_string(count[l]) + ")";
}

}  // namespace

int cmd_plot(const PlotArgs& a) {
  if (!a.labels.empty() && a.labels.size() != a.runs.size())
    throw UsageError(detail::concat("--labels names ", a.labels.size(), " run",
                                    a.labels.size() == 1 ? "" : "s", " but ", a.runs.size(),
                                    " are given; give one name per RUN_DIR, in order, separated "
                                    "by commas"));
  plot::format_of(a.output);  // an unknown extension is refused before any file is read
  std::vector<plot::RunMetrics> runs;
  std::vector<std::string> labels, warnings;
  for (const std::string& arg : a.runs) {
    const std::string file = plot::metrics_file_of(arg);
    runs.push_back(plot::read_metrics(file, &warnings));
    labels.push_back(default_label(arg, file));
  }
  if (a.labels.empty())
    make_unique(&labels, a.runs);
  else
    labels = a.labels;
  for (size_t i = 0; i < runs.size(); ++i) runs[i].label = labels[i];
  for (const std::string& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());

  plot::PlotOptions o;
  o.width = a.width;
  o.height = a.height;
  o.smooth = a.smooth;
  const plot::Size size = plot::write_plot(a.output, runs, o);
  std::string panels;
  for (const std::string& p : plot::panels_with_data(runs))
    panels += (panels.empty() ? "" : ", ") + p;
  std::printf("wrote %s (%dx%d pixels): %zu run%s; panels: %s\n", a.output.c_str(), size.width,
              size.height, runs.size(), runs.size() == 1 ? "" : "s", panels.c_str());
  return 0;
}

}  // namespace ft::app
