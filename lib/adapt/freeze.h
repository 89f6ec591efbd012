// The simplest model converter: freezes whole parameter groups by name ("embed", "layers.3",
// "head"), so that only the rest trains. Adapters freeze their base the same way
// (model/converter.h). Today it is reached only through FT_TEST_FREEZE (lib/train/setup.cpp),
// which the layout tests use to train with part of a model frozen.
#pragma once

#include <string>
#include <vector>

#include "model/converter.h"

namespace ft {

class FreezeGroups final : public ModelConverter {
 public:
  // group_names: names of ParamLayout groups; one that the layout lacks is refused when the
  // layout is converted (UsageError naming the groups there are).
  explicit FreezeGroups(std::vector<std::string> group_names);
  std::string name() const override { return "freeze"; }
  void convert_layout(ParamLayout& layout) const override;

 private:
  std::vector<std::string> names_;
};

}  // namespace ft
