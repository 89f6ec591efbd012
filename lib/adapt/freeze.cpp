#include "adapt/freeze.h"

#include "core/error.h"
#include "model/layout.h"

namespace ft {

FreezeGroups::FreezeGroups(std::vector<std::string> group_names) : names_(std::move(group_names)) {}

void FreezeGroups::convert_layout(ParamLayout& layout) const {
  const auto& groups = layout.groups();
  for (const std::string& n : names_) {
    bool found = false;
    for (size_t g = 0; g < groups.size(); ++g)
      if (groups[g].name == n) {
        layout.set_trainable(int(g), false);
        found = true;
      }
    if (!found)
      throw UsageError("cannot freeze parameter group '" + n + "': the model's groups are embed, " +
                       "layers.0 to layers." + std::to_string(groups.size() - 3) + " and head");
  }
}

}  // namespace ft
