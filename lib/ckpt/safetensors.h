// safetensors files: an 8-byte little-endian header length, a JSON header mapping tensor names
// to {dtype, shape, data_offsets: [begin, end)} (offsets relative to the end of the header),
// and the raw data. Reading validates everything before touching data: a malformed header
// is an ft::Error naming the file, never a crash or an out-of-bounds read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ft {

struct SafetensorsEntry {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // reads and validates the header
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Converts the named tensor to f32 into dst (numel floats); F32, BF16 and F16 are accepted.
  void read_f32(const std::string& name, float* dst, size_t numel) const;
  // The same for elements [first, first + count) of the tensor in row-major order (a tensor
  // rank's block of rows, or a run of rows to take columns from).
  void read_f32_range(const std::string& name, float* dst, size_t first, size_t count) const;

 private:
  std::string path_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_start_ = 0;
  uint64_t file_size_ = 0;
  int fd_ = -1;
};

struct SafetensorsTensorOut {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // raw bytes in `dtype`
};
// Writes a safetensors file (tensors in the order given); written to a temp name then renamed.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ft
