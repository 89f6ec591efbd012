// The CPU implementation of Ops (kernels/cpu/), owned by the CPU Device.
#pragma once

#include <memory>

#include "runtime/ops.h"

namespace ft {
std::unique_ptr<Ops> make_cpu_ops();
}  // namespace ft
