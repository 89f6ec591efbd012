#include "adapt/config.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace ft {

double AdapterConfig::scaling() const {
  return use_rslora ? alpha / std::sqrt(double(r)) : alpha / double(r);
}

namespace {
const char* const kAll[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                            "gate_proj", "up_proj", "down_proj"};
}  // namespace

bool is_lora_target(const std::string& name) {
  return name == "all-linear" ||
         std::find(std::begin(kAll), std::end(kAll), name) != std::end(kAll);
}

std::vector<std::string> AdapterConfig::targets() const {
  std::vector<std::string> out;
  const bool all =
      std::find(target_modules.begin(), target_modules.end(), "all-linear") != target_modules.end();
  for (const char* p : kAll)
    if (all || std::find(target_modules.begin(), target_modules.end(), p) != target_modules.end())
      out.push_back(p);
  return out;
}

bool AdapterConfig::saves(const std::string& module) const {
  return std::find(modules_to_save.begin(), modules_to_save.end(), module) != modules_to_save.end();
}

}  // namespace ft
