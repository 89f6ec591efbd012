// The HDF5 plumbing of the shard files (shard_internal.h): the process-wide lock, opening a
// shard and its datasets.
#include <filesystem>

#include "core/error.h"
#include "data/shard_internal.h"

namespace ft::detail {
namespace {

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

}  // namespace

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) {
  thread_local bool quiet = false;
  if (!quiet) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    quiet = true;
  }
}

H5Handle open_shard_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) FT_FAIL(path, ": no such shard file");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid())
    FT_FAIL(path,
            ": cannot open as HDF5 (truncated or corrupt shard? re-run `ft tokenize` "
            "for this folder)");
  return file;
}

H5Handle open_shard_dataset(hid_t file, const char* name, const std::string& path, bool required) {
  htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
  if (exists <= 0) {
    if (required)
      FT_FAIL(path, ": dataset '", name, "' is missing; not an ft-tokens shard (DESIGN.md §6)");
    return {};
  }
  // Chunk cache off: windows are small and random, so HDF5 reads exactly the requested bytes
  // of an uncompressed chunk and leaves locality to the OS page cache. Keeps memory per open
  // shard near zero.
  H5Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  H5Pset_chunk_cache(dapl.get(), 0, 0, 1.0);
  H5Handle ds(H5Dopen2(file, name, dapl.get()), H5Dclose);
  if (!ds.valid()) FT_FAIL(path, ": cannot open dataset '", name, "' (corrupt shard?)");
  return ds;
}

}  // namespace ft::detail
