// Model converters (torchtitan's ModelConverter is the pattern): what changes a model after it is
// built and before parallelism's state and the optimizer see it. Adapters attach here (lib/adapt/
// implements them); the model code knows only this interface. Two halves, since ft applies tensor
// parallelism inside the model's constructor (the layout is sliced there):
//   convert_layout: on the layout, before any parameter buffer exists: marks tensors frozen
//     (ParamLayout::set_trainable) and, for adapters, adds their own groups;
//   convert_model: on the built model once its weights are initialised or loaded, before ZeRO
//     and AdamW take them over: initialises what the converter added and installs its hooks
//     (ft generate runs it before uploading an adapter's saved values, which replace that
//     initialisation).
// They run in the order given, in every rank's set-up (lib/train/setup.cpp) and in `ft plan`'s,
// so that the plan counts what the run allocates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ft {

class LlamaModel;
class ParamLayout;

class ModelConverter {
 public:
  virtual ~ModelConverter() = default;
  virtual std::string name() const = 0;  // for messages: "lora", "freeze"
  virtual void convert_layout(ParamLayout& layout) const = 0;
  virtual void convert_model(LlamaModel& /*model*/, uint64_t /*seed*/) const {}
};

using ModelConverters = std::vector<std::unique_ptr<ModelConverter>>;

}  // namespace ft
