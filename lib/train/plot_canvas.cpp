#include "train/plot_canvas.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>

#include "core/error.h"
#include "core/utf8.h"

namespace ft::plot {

namespace {

// A coordinate with two decimals (a hundredth of a pixel: finer than any renderer draws, and
// what a reader of the SVG inverts back to a value), without trailing zeros.
std::string coord(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  std::string s = b;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

std::string hex(Color c) {
  char b[8];
  std::snprintf(b, sizeof b, "#%02x%02x%02x", c.r, c.g, c.b);
  return b;
}

std::string stroke_attributes(const Stroke& s) {
  std::string a = " fill=\"none\" stroke=\"" + hex(s.color) + "\" stroke-width=\"" +
                  coord(s.width) + "\" stroke-linejoin=\"round\" stroke-linecap=\"round\"";
  if (s.opacity < 1) a += " stroke-opacity=\"" + coord(s.opacity) + "\"";
  if (s.dashed) a += " stroke-dasharray=\"5 3\"";
  return a;
}

std::string attributes(const Attributes& attrs) {
  std::string a;
  for (const auto& [name, value] : attrs) a += " " + name + "=\"" + xml_escape(value) + "\"";
  return a;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  const std::string text = is_valid_utf8(s) ? s : replace_invalid_utf8(s);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (uint8_t(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
          out += "\xEF\xBF\xBD";  // U+FFFD: XML 1.0 has no way to write these
        else
          out += c;
    }
  }
  return out;
}

// ---- SVG ----------------------------------------------------------------------------------------

SvgCanvas::SvgCanvas(int width, int height) {
  const std::string w = std::to_string(width), h = std::to_string(height);
  out_ =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"" +
      w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " + h +
      "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
}

void SvgCanvas::begin_group(const Attributes& attrs) {
  out_ += "<g" + attributes(attrs) + ">\n";
  ++open_groups_;
}

void SvgCanvas::end_group() {
  if (open_groups_ == 0) return;
  out_ += "</g>\n";
  --open_groups_;
}

void SvgCanvas::fill_rect(double x, double y, double w, double h, Color fill) {
  out_ += "<rect x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" width=\"" + coord(w) +
          "\" height=\"" + coord(h) + "\" fill=\"" + hex(fill) + "\"/>\n";
}

void SvgCanvas::stroke_rect(double x, double y, double w, double h, const Stroke& s) {
  out_ += "<rect x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" width=\"" + coord(w) +
          "\" height=\"" + coord(h) + "\"" + stroke_attributes(s) + "/>\n";
}

void SvgCanvas::polyline(const std::vector<Pixel>& points, const Stroke& s,
                         const Attributes& attrs) {
  out_ += "<polyline" + attributes(attrs) + stroke_attributes(s) + " points=\"";
  for (size_t i = 0; i < points.size(); ++i) {
    if (i) out_ += ' ';
    out_ += coord(points[i].x) + "," + coord(points[i].y);
  }
  out_ += "\"/>\n";
}

void SvgCanvas::circle(Pixel c, double radius, Color fill) {
  out_ += "<circle cx=\"" + coord(c.x) + "\" cy=\"" + coord(c.y) + "\" r=\"" + coord(radius) +
          "\" fill=\"" + hex(fill) + "\"/>\n";
}

void SvgCanvas::text(double x, double y, const std::string& utf8, const TextStyle& st) {
  static const char* const kAnchor[] = {"start", "middle", "end"};
  out_ += "<text x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" font-size=\"" + coord(st.size) +
          "\" fill=\"" + hex(st.color) + "\"";
  if (st.anchor != Anchor::kStart)
    out_ += std::string(" text-anchor=\"") + kAnchor[int(st.anchor)] + "\"";
  if (st.bold) out_ += " font-weight=\"bold\"";
  if (st.vertical) out_ += " transform=\"rotate(-90 " + coord(x) + " " + coord(y) + ")\"";
  out_ += ">" + xml_escape(utf8) + "</text>\n";
}

std::string SvgCanvas::finish() {
  while (open_groups_ > 0) end_group();
  return out_ + "</svg>\n";
}

// ---- cairo --------------------------------------------------------------------------------------

// The few functions of cairo's C API that the PNG needs, declared here from cairo's reference
// manual instead of taken from cairo.h, so that building ft needs no cairo headers. Handles are
// opaque pointers; the enums' values are cairo's (CAIRO_FORMAT_ARGB32 0, CAIRO_FONT_SLANT_NORMAL
// 0, CAIRO_FONT_WEIGHT_NORMAL 0 / BOLD 1, CAIRO_LINE_JOIN_ROUND 1, CAIRO_LINE_CAP_ROUND 1,
// CAIRO_STATUS_SUCCESS 0), stable since cairo 1.0.
namespace {

struct CairoTextExtents {  // cairo_text_extents_t
  double x_bearing, y_bearing, width, height, x_advance, y_advance;
};

#define FT_CAIRO_FUNCTIONS(X)                                           \
  X(cairo_image_surface_create, void*, int, int, int)                   \
  X(cairo_surface_status, int, void*)                                   \
  X(cairo_surface_destroy, void, void*)                                 \
  X(cairo_surface_write_to_png, int, void*, const char*)                \
  X(cairo_create, void*, void*)                                         \
  X(cairo_destroy, void, void*)                                         \
  X(cairo_status, int, void*)                                           \
  X(cairo_status_to_string, const char*, int)                           \
  X(cairo_save, void, void*)                                            \
  X(cairo_restore, void, void*)                                         \
  X(cairo_translate, void, void*, double, double)                       \
  X(cairo_rotate, void, void*, double)                                  \
  X(cairo_set_source_rgba, void, void*, double, double, double, double) \
  X(cairo_set_line_width, void, void*, double)                          \
  X(cairo_set_line_join, void, void*, int)                              \
  X(cairo_set_line_cap, void, void*, int)                               \
  X(cairo_set_dash, void, void*, const double*, int, double)            \
  X(cairo_new_path, void, void*)                                        \
  X(cairo_move_to, void, void*, double, double)                         \
  X(cairo_line_to, void, void*, double, double)                         \
  X(cairo_rectangle, void, void*, double, double, double, double)       \
  X(cairo_arc, void, void*, double, double, double, double, double)     \
  X(cairo_fill, void, void*)                                            \
  X(cairo_stroke, void, void*)                                          \
  X(cairo_select_font_face, void, void*, const char*, int, int)         \
  X(cairo_set_font_size, void, void*, double)                           \
  X(cairo_text_extents, void, void*, const char*, CairoTextExtents*)    \
  X(cairo_show_text, void, void*, const char*)

struct CairoApi {
#define FT_CAIRO_MEMBER(name, ret, ...) ret (*name)(__VA_ARGS__) = nullptr;
  FT_CAIRO_FUNCTIONS(FT_CAIRO_MEMBER)
#undef FT_CAIRO_MEMBER
};

constexpr const char* kCairoLibrary = "libcairo.so.2";

// Opened once per process and never closed (a PNG is drawn at most once per run of ft). The
// library's name can be replaced for a test (FT_TEST_CAIRO_LIBRARY) to show the message of a host
// without cairo.
const CairoApi& cairo() {
  static const CairoApi api = [] {
    const char* test_name = std::getenv("FT_TEST_CAIRO_LIBRARY");
    const std::string name = test_name && *test_name ? test_name : kCairoLibrary;
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      throw UsageError(detail::concat(
          "a .png output needs cairo (", name, "), which cannot be loaded here (",
          why ? why : "not found",
          "); write an .svg instead (--output FILE.svg), or install cairo (Debian and Ubuntu: "
          "apt-get install libcairo2)"));
    }
    CairoApi a;
#define FT_CAIRO_SET(fn, ret, ...)                                                              \
  a.fn = reinterpret_cast<ret (*)(__VA_ARGS__)>(dlsym(lib, #fn));                               \
  if (!a.fn)                                                                                    \
    throw UsageError(detail::concat(name, " has no function " #fn                               \
                                          " (not cairo, or a cairo older than 1.2?); write an " \
                                          ".svg instead (--output FILE.svg)"));
    FT_CAIRO_FUNCTIONS(FT_CAIRO_SET)
#undef FT_CAIRO_SET
    return a;
  }();
  return api;
}

}  // namespace

struct CairoPngCanvas::State {
  const CairoApi* api = nullptr;
  void* surface = nullptr;
  void* cr = nullptr;
};

CairoPngCanvas::CairoPngCanvas(int width, int height) : state_(std::make_unique<State>()) {
  const CairoApi& c = cairo();
  state_->api = &c;
  state_->surface = c.cairo_image_surface_create(/*CAIRO_FORMAT_ARGB32*/ 0, width, height);
  if (int st = c.cairo_surface_status(state_->surface); st != 0)
    throw Error(detail::concat("cairo cannot make a ", width, "x", height,
                               " image: ", c.cairo_status_to_string(st)));
  state_->cr = c.cairo_create(state_->surface);
  c.cairo_set_line_join(state_->cr, /*CAIRO_LINE_JOIN_ROUND*/ 1);
  c.cairo_set_line_cap(state_->cr, /*CAIRO_LINE_CAP_ROUND*/ 1);
}

CairoPngCanvas::~CairoPngCanvas() {
  if (!state_->api) return;
  if (state_->cr) state_->api->cairo_destroy(state_->cr);
  if (state_->surface) state_->api->cairo_surface_destroy(state_->surface);
}

namespace {
void set_color(const CairoApi& c, void* cr, Color col, double alpha = 1) {
  c.cairo_set_source_rgba(cr, col.r / 255.0, col.g / 255.0, col.b / 255.0, alpha);
}
void set_stroke(const CairoApi& c, void* cr, const Stroke& s) {
  set_color(c, cr, s.color, s.opacity);
  c.cairo_set_line_width(cr, s.width);
  static const double kDash[] = {5, 3};  // as the SVG's stroke-dasharray
  c.cairo_set_dash(cr, kDash, s.dashed ? 2 : 0, 0);
}
}  // namespace

void CairoPngCanvas::fill_rect(double x, double y, double w, double h, Color fill) {
  const CairoApi& c = *state_->api;
  set_color(c, state_->cr, fill);
  c.cairo_rectangle(state_->cr, x, y, w, h);
  c.cairo_fill(state_->cr);
}

void CairoPngCanvas::stroke_rect(double x, double y, double w, double h, const Stroke& s) {
  const CairoApi& c = *state_->api;
  set_stroke(c, state_->cr, s);
  c.cairo_rectangle(state_->cr, x, y, w, h);
  c.cairo_stroke(state_->cr);
}

void CairoPngCanvas::polyline(const std::vector<Pixel>& points, const Stroke& s,
                              const Attributes&) {
  if (points.size() < 2) return;
  const CairoApi& c = *state_->api;
  set_stroke(c, state_->cr, s);
  c.cairo_new_path(state_->cr);
  c.cairo_move_to(state_->cr, points[0].x, points[0].y);
  for (size_t i = 1; i < points.size(); ++i) c.cairo_line_to(state_->cr, points[i].x, points[i].y);
  c.cairo_stroke(state_->cr);
}

void CairoPngCanvas::circle(Pixel centre, double radius, Color fill) {
  const CairoApi& c = *state_->api;
  set_color(c, state_->cr, fill);
  c.cairo_new_path(state_->cr);
  c.cairo_arc(state_->cr, centre.x, centre.y, radius, 0, 2 * std::numbers::pi);
  c.cairo_fill(state_->cr);
}

void CairoPngCanvas::text(double x, double y, const std::string& utf8, const TextStyle& st) {
  const CairoApi& c = *state_->api;
  void* cr = state_->cr;
  // cairo's toy text API takes UTF-8 and stops at a NUL; invalid UTF-8 would draw nothing.
  const std::string text = is_valid_utf8(utf8) ? utf8 : replace_invalid_utf8(utf8);
  c.cairo_save(cr);
  c.cairo_select_font_face(cr, "sans-serif", /*NORMAL*/ 0, st.bold ? 1 : 0);
  c.cairo_set_font_size(cr, st.size);
  set_color(c, cr, st.color);
  c.cairo_translate(cr, x, y);
  if (st.vertical) c.cairo_rotate(cr, -std::numbers::pi / 2);
  CairoTextExtents ext{};
  c.cairo_text_extents(cr, text.c_str(), &ext);
  const double shift = st.anchor == Anchor::kStart    ? 0
                       : st.anchor == Anchor::kMiddle ? -ext.x_advance / 2
                                                      : -ext.x_advance;
  c.cairo_move_to(cr, shift, 0);
  c.cairo_show_text(cr, text.c_str());
  c.cairo_restore(cr);
}

void CairoPngCanvas::write_png(const std::string& path) {
  const CairoApi& c = *state_->api;
  if (int st = c.cairo_status(state_->cr); st != 0)
    throw Error(detail::concat("cairo failed while drawing: ", c.cairo_status_to_string(st)));
  if (int st = c.cairo_surface_write_to_png(state_->surface, path.c_str()); st != 0)
    throw Error(detail::concat("cannot write ", path, ": ", c.cairo_status_to_string(st),
                               " (cairo); check that its folder exists and is writable"));
}

}  // namespace ft::plot
