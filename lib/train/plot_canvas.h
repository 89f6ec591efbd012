// Where `ft plot` draws (train/plot.h): a small canvas interface in pixels, origin top left, with
// two backends. SvgCanvas writes SVG text by hand; CairoPngCanvas draws into an image with cairo,
// which is opened at run time (dlopen of libcairo.so.2), so ft links no graphics library and a
// host without cairo still runs everything but `ft plot --output X.png`.
//
// The drawing code (plot.cpp) calls the same functions for both, so the two pictures differ only
// in how each backend rasterizes. Attributes passed with a group or a polyline are for the SVG's
// reader (tests invert the drawn points back to values with them); cairo ignores them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ft::plot {

struct Color {
  uint8_t r = 0, g = 0, b = 0;
};

struct Pixel {
  double x = 0, y = 0;
};

// How a line is stroked. opacity in [0, 1]; dashed: short dashes (evaluation curves).
struct Stroke {
  Color color;
  double width = 1;
  double opacity = 1;
  bool dashed = false;
};

enum class Anchor { kStart, kMiddle, kEnd };

// Text drawn at (x, y): y is the baseline; `anchor` says which end of the text is at x;
// `vertical` turns it a quarter counter-clockwise about (x, y) (a y axis's label).
struct TextStyle {
  double size = 12;
  Anchor anchor = Anchor::kStart;
  bool bold = false;
  bool vertical = false;
  Color color{0x33, 0x33, 0x33};
};

// Attributes for the SVG's reader: name="value" pairs, written in order.
using Attributes = std::vector<std::pair<std::string, std::string>>;

class Canvas {
 public:
  virtual ~Canvas() = default;
  virtual void begin_group(const Attributes& attrs) = 0;
  virtual void end_group() = 0;
  virtual void fill_rect(double x, double y, double w, double h, Color fill) = 0;
  virtual void stroke_rect(double x, double y, double w, double h, const Stroke& s) = 0;
  // A polyline through `points`; one point draws nothing (plot.cpp adds a marker for it).
  virtual void polyline(const std::vector<Pixel>& points, const Stroke& s,
                        const Attributes& attrs) = 0;
  virtual void circle(Pixel centre, double radius, Color fill) = 0;
  virtual void text(double x, double y, const std::string& utf8, const TextStyle& style) = 0;
};

// Text for XML character data and attribute values: & < > " ' as entities, characters XML 1.0
// forbids (C0 controls but tab, newline, carriage return) and invalid UTF-8 as U+FFFD, so any
// folder name or label makes a well-formed document.
std::string xml_escape(const std::string& s);

class SvgCanvas : public Canvas {
 public:
  SvgCanvas(int width, int height);
  void begin_group(const Attributes& attrs) override;
  void end_group() override;
  void fill_rect(double x, double y, double w, double h, Color fill) override;
  void stroke_rect(double x, double y, double w, double h, const Stroke& s) override;
  void polyline(const std::vector<Pixel>& points, const Stroke& s,
                const Attributes& attrs) override;
  void circle(Pixel centre, double radius, Color fill) override;
  void text(double x, double y, const std::string& utf8, const TextStyle& style) override;
  // The document, closed (every group ended).
  std::string finish();

 private:
  std::string out_;
  int open_groups_ = 0;
};

// Draws into a width × height image with cairo and writes it as PNG. The constructor throws
// UsageError (exit 2) when libcairo.so.2 cannot be loaded, naming it and what to do instead.
class CairoPngCanvas : public Canvas {
 public:
  CairoPngCanvas(int width, int height);
  ~CairoPngCanvas() override;
  CairoPngCanvas(const CairoPngCanvas&) = delete;
  CairoPngCanvas& operator=(const CairoPngCanvas&) = delete;
  void begin_group(const Attributes&) override {}
  void end_group() override {}
  void fill_rect(double x, double y, double w, double h, Color fill) override;
  void stroke_rect(double x, double y, double w, double h, const Stroke& s) override;
  void polyline(const std::vector<Pixel>& points, const Stroke& s,
                const Attributes& attrs) override;
  void circle(Pixel centre, double radius, Color fill) override;
  void text(double x, double y, const std::string& utf8, const TextStyle& style) override;
  // Throws Error (exit 1) when cairo cannot write the file.
  void write_png(const std::string& path);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ft::plot
