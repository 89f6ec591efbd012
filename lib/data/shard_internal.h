// What the shard files of lib/data share, and nothing outside lib/data includes:
//   shard_hdf5.cpp      the HDF5 lock, owning handles, opening a shard and its datasets
//   shard_metadata.cpp  reading and checking one shard's metadata with libhdf5 (check child only)
//   shard_report.cpp    the report the check child sends its parent: writing and parsing
// The jobs that use them: shard_write.cpp (ShardWriter), shard_check.cpp (the check child and
// its parent side), shard_read.cpp (ShardSet: windows by pread, or through libhdf5).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "data/shard.h"

namespace ft::detail {

// ---- HDF5 plumbing (shard_hdf5.cpp) --------------------------------------------------------

// Holds the one lock every HDF5 call in this process goes through (shard.h says why) and makes
// sure HDF5 does not print its error stack on this thread (the error-reporting setting is per
// thread in thread-safe builds of libhdf5). Recursive: public entry points call each other.
class Hdf5Lock {
 public:
  Hdf5Lock();

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// Owns one HDF5 identifier; closes it with the matching H5?close. Destroy only under Hdf5Lock.
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_, close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  ~H5Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Opens `path` read-only; throws naming the file when it is missing or not HDF5.
H5Handle open_shard_file(const std::string& path);

// Opens dataset `name` with the chunk cache off. A missing dataset throws when `required`, else
// gives an invalid handle.
H5Handle open_shard_dataset(hid_t file, const char* name, const std::string& path, bool required);

// ---- metadata (shard_metadata.cpp) ---------------------------------------------------------

// Reads and checks everything DESIGN.md §6 says of the shard at `path` (a file of `file_bytes`
// bytes) and where its token and loss_mask values lie; throws ft::Error naming the file. Runs
// libhdf5 on the file's bytes, so only the check child calls it; caller holds Hdf5Lock.
ShardInfo read_shard_metadata(const std::string& path, uint64_t file_bytes);

// ---- the report, child to parent (shard_report.cpp) ----------------------------------------

// The records the child writes for file I: report_begin before it touches the file (so that a
// crash names the file), then report_shard on success or report_error on a bad shard.
std::string report_begin(size_t i);
std::string report_shard(size_t i, const ShardInfo& s);
std::string report_error(size_t i, const std::string& message);

}  // namespace ft::detail
