// A non-owning view of a tensor: pointer, dtype, shape (row-major, contiguous) and device.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/dtype.h"

namespace ft {

class Device;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  Device* device = nullptr;

  int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  template <typename T> T* as() const { return static_cast<T*>(data); }
};

}  // namespace ft
