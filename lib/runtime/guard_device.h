// Test tool, not a backend: a CPU device whose memory the host cannot touch. Every allocation
// is its own mapping, kept PROT_NONE except while one of the Device's ops or copies runs, so
// any code that reads or writes device memory from the host, outside the dispatch point
// (DESIGN.md §2), dies with SIGSEGV at that line. It stands in for a GPU's memory in CI, where
// no GPU is. Selected by FT_TEST_GUARD_DEVICE=1 (make_device). Not host-accessible, so under
// MPI its memory goes through host staging (comm/host_staging.h), as a GPU's does.
#pragma once

#include <memory>

#include "runtime/device.h"

namespace ft {
std::unique_ptr<Device> make_guard_device();
}  // namespace ft
