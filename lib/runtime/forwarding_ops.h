// Ops that pass every op on to other Ops unchanged, generated from the op list (op_list.h), with
// a hook around each call: the decorators of the dispatch point. The guard device's hook opens
// its memory for the call (guard_device.cpp); FT_PROFILE's times the call into the op's family
// (profile.cpp). A decorator that treats one op apart overrides it (the profiler splits
// linear_backward into its two GEMMs); a new op in the list is forwarded with no edit here.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "runtime/ops.h"
#include "runtime/profile.h"

namespace ft {

// Hook: callable as hook(OpFamily, Stream), returning an object that lives for the call (its
// constructor runs before the op, its destructor after, also when the op throws). It may
// return a type that can be neither copied nor moved (guaranteed copy elision).
template <typename Hook>
class ForwardingOps : public Ops {
 public:
  ForwardingOps(Ops& inner, Hook hook) : inner_(inner), hook_(std::move(hook)) {}

#define FT_OP(name, family, params, args)                           \
  void name params override {                                       \
    [[maybe_unused]] const auto scope = hook_(OpFamily::family, s); \
    inner_.name args;                                               \
  }
#include "runtime/op_list.h"

  // A size, no work on the device: no hook.
  size_t attention_backward_scratch_elems(DType t, int B, int T, int H, int D) override {
    return inner_.attention_backward_scratch_elems(t, B, T, H, D);
  }
  std::string attention_segments_refusal(DType t, int D) override {
    return inner_.attention_segments_refusal(t, D);
  }

 protected:
  Ops& inner_;
  Hook hook_;
};

}  // namespace ft
