// How a JSON value reads in an error message ("the string \"abc\"", "an object", "1.5"), for
// readers that check untrusted JSON (checkpoint manifests, the loss scaler's saved state).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ft {

inline std::string describe_json_value(const nlohmann::json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_null()) return "null";
  if (v.is_boolean()) return std::string("the bool ") + (v.get<bool>() ? "true" : "false");
  if (v.is_string()) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return "the string " + s;
  }
  if (v.is_number_float()) return "the non-integer " + v.dump();
  return v.dump();
}

}  // namespace ft
