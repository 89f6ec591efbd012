// Checks of numeric command-line values (DESIGN.md §4: every number has a documented range, NaN
// and infinities refused everywhere), as CLI11 validators with short messages: CLI11's own
// PositiveNumber lets NaN through and its ranges print DBL_MAX's digits.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "core/files.h"

namespace ft::app {

// A finite number in [lo, hi] (or (lo, hi] with open_lo), named in messages by its flag.
inline CLI::Validator finite_in(double lo, double hi, bool open_lo = false) {
  auto fmt = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  const std::string range = (open_lo ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (...) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return excerpt(text, 40) + " is not a number";
        if (!std::isfinite(v)) return excerpt(text, 40) + " is not a finite number";
        if (v < lo || v > hi || (open_lo && v == lo))
          return excerpt(text, 40) + " is out of range: must be in " + range;
        return "";
      },
      "NUMBER in " + range);
}

}  // namespace ft::app
