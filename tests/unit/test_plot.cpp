// ft plot's parts (lib/train/plot.h, plot_canvas.h): ticks, number labels, TensorBoard's
// smoothing, XML escaping, metrics.jsonl as DESIGN.md §7 writes it (the last line of a step
// counts, nulls are no points) and its errors with file:line. tests/cli/test_plot.sh reads the
// drawn SVG back against real runs' metrics and renders it with librsvg.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "temp_dir.h"
#include "train/plot.h"
#include "train/plot_canvas.h"

namespace plot = ft::plot;

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The message of the UsageError that `f` throws ("" when it throws none).
template <typename F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const ft::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("nice_ticks: steps of 1, 2 or 5 times a power of ten, whole multiples of the step") {
  CHECK(plot::nice_ticks(0, 10, 5) == std::vector<double>{0, 2, 4, 6, 8, 10});
  CHECK(plot::nice_ticks(1, 10, 5) == std::vector<double>{2, 4, 6, 8, 10});
  CHECK(plot::nice_step(0, 1, 5) == doctest::Approx(0.2));
  CHECK(plot::nice_step(0, 0.003, 5) == doctest::Approx(0.0005));
  CHECK(plot::nice_step(0, 7e6, 5) == doctest::Approx(1e6));
  CHECK(plot::nice_step(0, 13, 4) == doctest::Approx(5));
  // Negative ranges and 0 as an exact tick (k·step, not a running sum: no 5.55e-17).
  const std::vector<double> t = plot::nice_ticks(-0.3, 0.3, 6);
  REQUIRE(t.size() == 7);
  CHECK(t[3] == 0.0);
  CHECK(!std::signbit(t[3]));
  CHECK(t.front() == doctest::Approx(-0.3));
  // Steps of whole steps: a run of 3 steps gets ticks 1, 2, 3, never 1.5.
  CHECK(plot::nice_ticks(1, 3, 8, 1) == std::vector<double>{1, 2, 3});
  // A range of one value still gets a step (from the value's size).
  CHECK(plot::nice_step(5, 5, 5) > 0);
  CHECK(plot::nice_step(0, 0, 5) > 0);
}

TEST_CASE("log_ticks: powers of ten, thinned over many decades, 2 and 5 within one decade") {
  CHECK(plot::log_ticks(0.5, 2000) == std::vector<double>{1, 10, 100, 1000});
  const std::vector<double> wide = plot::log_ticks(1e-12, 1);
  CHECK(wide.size() <= 7);
  CHECK(wide.front() == doctest::Approx(1e-12));
  const std::vector<double> narrow = plot::log_ticks(1.5, 40);
  CHECK(narrow.size() == 4);  // 2, 5, 10, 20
  CHECK(narrow[0] == doctest::Approx(2));
  CHECK(narrow[3] == doctest::Approx(20));
}

TEST_CASE("format_number: compact labels for huge and tiny values") {
  CHECK(plot::format_number(0) == "0");
  CHECK(plot::format_number(0.25) == "0.25");
  CHECK(plot::format_number(12.5) == "12.5");
  CHECK(plot::format_number(2.34567) == "2.35");
  CHECK(plot::format_number(3e-4) == "3e-4");
  CHECK(plot::format_number(2.5e-5) == "2.5e-5");
  CHECK(plot::format_number(-1.2e-3) == "-1.2e-3");
  CHECK(plot::format_number(1200) == "1.2k");
  CHECK(plot::format_number(2.5e6) == "2.5M");
  CHECK(plot::format_number(7e9) == "7G");
  CHECK(plot::format_number(3.2e12) == "3.2T");
  CHECK(plot::format_number(1e15) == "1e15");
  CHECK(plot::format_number(999.96) == "1k");  // rounded first, then given its suffix
  CHECK(plot::format_number(999996) == "1M");
  CHECK(plot::format_number(9.9996e-4) == "1e-3");
  CHECK(plot::format_number(100, 1) == "100");  // never printf's 1e+02
  CHECK(plot::format_number(0.01) == "0.01");
  CHECK(plot::format_number(-42) == "-42");
}

TEST_CASE("format_tick: as many digits as the tick step needs") {
  CHECK(plot::format_tick(1250, 50) == "1.25k");
  CHECK(plot::format_tick(1200, 100) == "1.2k");
  CHECK(plot::format_tick(10.25, 0.05) == "10.25");
  CHECK(plot::format_tick(0.0015, 0.0005) == "1.5e-3");
  CHECK(plot::format_tick(1e-17, 0.1) == "0");  // a zero that rounding left behind
  CHECK(plot::format_tick(2e6, 1e6) == "2M");
  CHECK(plot::format_tick(-0.4, 0.2) == "-0.4");
}

TEST_CASE("smooth: TensorBoard's debiased exponential moving average") {
  const plot::Series s = {{1, 4}, {2, 2}, {5, 8}};
  const plot::Series out = plot::smooth(s, 0.6);
  REQUIRE(out.size() == 3);
  // By hand: m1 = 0.4·4 = 1.6, /(1-0.6) = 4; m2 = 0.6·1.6 + 0.4·2 = 1.76, /(1-0.36) = 2.75;
  // m3 = 0.6·1.76 + 0.4·8 = 4.256, /(1-0.216) = 5.428571...
  CHECK(out[0].value == doctest::Approx(4));
  CHECK(out[1].value == doctest::Approx(2.75));
  CHECK(out[2].value == doctest::Approx(4.256 / 0.784));
  CHECK(out[2].step == 5);
  // Weight 0: the series itself; a constant series stays constant (the debiasing's point).
  const plot::Series raw = plot::smooth(s, 0);
  for (size_t i = 0; i < s.size(); ++i) CHECK(raw[i].value == s[i].value);
  for (const plot::Point& p : plot::smooth({{1, 3}, {2, 3}, {3, 3}, {4, 3}}, 0.99))
    CHECK(p.value == doctest::Approx(3).epsilon(1e-12));
  CHECK(plot::smooth({}, 0.6).empty());
}

TEST_CASE("xml_escape: markup, controls and invalid UTF-8 make well-formed text") {
  CHECK(plot::xml_escape("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&apos;");
  CHECK(plot::xml_escape("run\x01x") == "run\xEF\xBF\xBDx");
  CHECK(plot::xml_escape("t\tn\n") == "t\tn\n");
  CHECK(plot::xml_escape("caf\xC3\xA9") == "caf\xC3\xA9");
  CHECK(plot::xml_escape("bad\xFF") == "bad\xEF\xBF\xBD");
}

TEST_CASE("SvgCanvas: groups closed, attributes escaped, two decimals") {
  plot::SvgCanvas c(300, 200);
  c.begin_group({{"data-panel", "a\"b"}});
  c.polyline({{1.234, 5}, {2, 3.005}}, plot::Stroke{}, {{"data-label", "x<y"}});
  c.text(10, 10, "R&D", {});
  const std::string svg = c.finish();
  CHECK(svg.find("data-panel=\"a&quot;b\"") != std::string::npos);
  CHECK(svg.find("data-label=\"x&lt;y\"") != std::string::npos);
  CHECK(svg.find("points=\"1.23,5 2,3\"") != std::string::npos);
  CHECK(svg.find(">R&amp;D</text>") != std::string::npos);
  CHECK(svg.find("</g>\n</svg>\n") != std::string::npos);
}

TEST_CASE("read_metrics: the last line of a step counts, per kind; nulls are no points") {
  TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  write_file(
      path,
      "{\"step\": 1, \"loss\": 5.0, \"lr\": 0.001, \"grad_norm\": 2.0}\n"
      "{\"step\": 2, \"loss\": 4.0, \"lr\": 0.002, \"grad_norm\": 1.5}\n"
      "{\"step\": 2, \"eval_loss\": 4.5}\n"
      "{\"step\": 2, \"ckpt_step\": 2, \"ckpt_bytes\": 10}\n"
      "{\"step\": 3, \"loss\": 3.5, \"lr\": 0.003, \"grad_norm\": 1.0}\n"
      "\n"
      // resumed from step 2: step 3 again, then a skipped fp16 step
      "{\"step\": 3, \"loss\": 3.25, \"lr\": 0.003, \"grad_norm\": null, \"skipped\": true}\n"
      "{\"step\": 4, \"loss\": 3.0, \"lr\": 0.004, \"grad_norm\": 0.5, \"reward_margin\": 1}\n"
      "{\"step\": 4, \"eval_loss\": 3.5}\n");
  std::vector<std::string> warnings;
  const plot::RunMetrics r = plot::read_metrics(path, &warnings);
  CHECK(warnings.empty());
  auto steps_values = [&](const std::string& key) {
    std::vector<std::pair<int64_t, double>> out;
    for (const plot::Point& p : r.series.at(key)) out.push_back({p.step, p.value});
    return out;
  };
  using V = std::vector<std::pair<int64_t, double>>;
  CHECK(steps_values("loss") == V{{1, 5.0}, {2, 4.0}, {3, 3.25}, {4, 3.0}});
  // Step 3's later line has a null grad_norm: no point, though the first line had one.
  CHECK(steps_values("grad_norm") == V{{1, 2.0}, {2, 1.5}, {4, 0.5}});
  CHECK(steps_values("eval_loss") == V{{2, 4.5}, {4, 3.5}});
  CHECK(r.series.count("tflops") == 0);
  CHECK(r.checkpoints == 1);
  CHECK(r.dpo);
}

TEST_CASE("read_metrics: errors name file:line; a cut-short last line is a warning") {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  auto error_of = [&](const std::string& text) {
    write_file(path, text);
    return usage_error([&] { plot::read_metrics(path, nullptr); });
  };
  const std::string good = "{\"step\": 1, \"loss\": 2}\n";
  CHECK(error_of(good + "{\"step\": 2, \"loss\": \n" + good).find(path + ":2: not valid JSON") !=
        std::string::npos);
  CHECK(error_of(good + good + "[1, 2]\n").find(path + ":3: an array, not a JSON object") !=
        std::string::npos);
  CHECK(error_of("{\"loss\": 2}\n").find(path + ":1: \"step\" is missing") != std::string::npos);
  CHECK(error_of("{\"step\": 1.5}\n").find(path + ":1: \"step\" is the non-integer 1.5") !=
        std::string::npos);
  CHECK(error_of("{\"step\": -1}\n").find(path + ":1: \"step\" is -1") != std::string::npos);
  CHECK(error_of(good + "{\"step\": 2, \"lr\": \"fast\"}\n")
            .find(path + ":2: \"lr\" is the string \"fast\", expected a number or null") !=
        std::string::npos);
  // Blank lines count in the line numbers.
  CHECK(error_of(good + "\n\nnope\n").find(path + ":4:") != std::string::npos);
  // The file's last line without its newline, not JSON: a killed run's; left out, with a warning.
  write_file(path, good + "{\"step\": 2, \"lo");
  std::vector<std::string> warnings;
  const plot::RunMetrics r = plot::read_metrics(path, &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(path + ":2: the last line is cut short") != std::string::npos);
  CHECK(r.series.at("loss").size() == 1);
  // ... but a whole last line without a newline is read.
  write_file(path, good + "{\"step\": 2, \"loss\": 1}");
  CHECK(plot::read_metrics(path, nullptr).series.at("loss").size() == 2);
}

TEST_CASE("metrics_file_of: a run folder's metrics.jsonl, or the file; else what to give") {
  TempDir dir;
  write_file(dir.file("metrics.jsonl"), "");
  CHECK(plot::metrics_file_of(dir.path) == dir.file("metrics.jsonl"));
  CHECK(plot::metrics_file_of(dir.file("metrics.jsonl")) == dir.file("metrics.jsonl"));
  CHECK(usage_error([&] { plot::metrics_file_of(dir.file("nope")); }).find("does not exist") !=
        std::string::npos);
  std::filesystem::create_directory(dir.file("empty"));
  CHECK(usage_error([&] {
          plot::metrics_file_of(dir.file("empty"));
        }).find("holds no metrics.jsonl") != std::string::npos);
  // A folder is refused as a metrics file, naming what it is.
  CHECK(!usage_error([&] { plot::read_metrics(dir.path, nullptr); }).empty());
}

TEST_CASE("draw: panels with data only; a single point and a constant series draw") {
  plot::RunMetrics r;
  r.label = "one";
  r.series["loss"] = {{7, 2.5}};
  r.series["lr"] = {{7, 1e-3}};
  plot::PlotOptions o;
  o.width = 800;
  o.height = 500;
  plot::SvgCanvas c(800, 500);
  plot::draw(c, {r}, o);
  const std::string svg = c.finish();
  CHECK(svg.find("data-panel=\"loss\"") != std::string::npos);
  CHECK(svg.find("data-panel=\"lr\"") != std::string::npos);
  CHECK(svg.find("data-panel=\"grad_norm\"") == std::string::npos);
  CHECK(svg.find("<circle") != std::string::npos);  // the lone point's marker
  CHECK(plot::panels_with_data({r}) == std::vector<std::string>{"loss", "lr"});
  // Nothing to draw, and a picture too small for its panels: said, not drawn.
  plot::SvgCanvas empty(800, 500);
  CHECK(usage_error([&] { plot::draw(empty, {plot::RunMetrics{}}, o); }).find("nothing to draw") !=
        std::string::npos);
  plot::PlotOptions tiny;
  tiny.width = 200;
  tiny.height = 200;
  r.series["grad_norm"] = {{1, 1}};
  r.series["tokens_per_s"] = {{1, 1}};
  plot::SvgCanvas small(200, 200);
  CHECK(usage_error([&] { plot::draw(small, {r}, tiny); }).find("is too small for") !=
        std::string::npos);
}

TEST_CASE("draw: a long series keeps a few points a pixel column, its spike among them") {
  plot::RunMetrics r;
  r.label = "long";
  plot::Series s;
  for (int i = 1; i <= 20000; ++i) s.push_back({i, i == 12345 ? 100.0 : double(i % 7)});
  r.series["grad_norm"] = s;
  plot::PlotOptions o;
  o.width = 400;
  o.height = 400;
  plot::SvgCanvas c(o.width, o.height);
  plot::draw(c, {r}, o);
  const std::string svg = c.finish();
  const size_t at = svg.find("data-metric=\"grad_norm\"");
  REQUIRE(at != std::string::npos);
  const size_t begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
  std::vector<double> ys;
  for (size_t p = begin; p < end;) {
    const size_t comma = svg.find(',', p), space = std::min(svg.find(' ', p), end);
    ys.push_back(std::stod(svg.substr(comma + 1, space - comma - 1)));
    p = space + 1;
  }
  // The box is 400 - 24 - 68 - 18 = 290 pixels wide: at most 4 points a column.
  CHECK(ys.size() <= 4 * 291);
  CHECK(ys.size() > 290);
  // The spike (100, the highest value: the smallest y) is drawn; the padded range puts it 5% of
  // the box below its top, never at the height of the other values (at most 6).
  const double top = std::stod(svg.substr(svg.find("data-py1=\"") + 10));
  const double bottom = std::stod(svg.substr(svg.find("data-py0=\"") + 10));
  CHECK(*std::min_element(ys.begin(), ys.end()) < top + 0.1 * (bottom - top));
}
