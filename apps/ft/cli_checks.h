// Checks of command-line values (DESIGN.md §4: every number has a documented range, NaN and
// infinities refused everywhere), as CLI11 validators with short messages quoting at most an
// excerpt of the value: CLI11's own PositiveNumber lets NaN through, its ranges print DBL_MAX's
// digits and IsMember the whole value.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/hf_export.h"
#include "core/error.h"
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
        } catch (const std::out_of_range&) {  // 1e999: beyond a double
          return excerpt(text, 40) + " is out of range: must be in " + range;
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

// A whole number in [lo, hi], written as one ("1e3" and "1.0" are not counts; "-1" is not a
// seed: CLI11 would wrap it to 2^64 - 1).
inline CLI::Validator integer_in(long long lo, unsigned long long hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const bool negative = text.size() > 1 && text[0] == '-';
        const std::string digits = negative ? text.substr(1) : text;
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
          return excerpt(text, 40) + " is not a whole number";
        errno = 0;
        const bool in_range =
            negative ? (std::strtoll(text.c_str(), nullptr, 10) >= lo && errno != ERANGE)
                     : (std::strtoull(text.c_str(), nullptr, 10) <= hi && errno != ERANGE &&
                        (lo <= 0 || std::strtoull(text.c_str(), nullptr, 10) >=
                                        static_cast<unsigned long long>(lo)));
        if (!in_range) return excerpt(text, 40) + " is out of range: must be in " + range;
        return "";
      },
      "INTEGER in " + range);
}

// One of `choices`; CLI11's IsMember quotes the whole value, however long.
inline CLI::Validator one_of(const std::vector<std::string>& choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        for (const std::string& c : choices)
          if (text == c) return "";
        return excerpt(text, 40) + " is not one of " + list;
      },
      "one of " + list);
}

// A byte size as ft export's --max-shard-size takes it (ckpt/hf_export.h parse_byte_size).
inline CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          parse_byte_size(text, "");
        } catch (const Error& e) {
          return std::string(e.what()).substr(1);  // without the empty name's space
        }
        return "";
      },
      "SIZE");
}

}  // namespace ft::app
