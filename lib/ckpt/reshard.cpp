// Reading the saved state back out of the shard files (rank_*.bin): one piece with its CRC-32
// checked, verify() over every shard, and read_range / read_global_group, which rebuild any
// range of a group under any tensor-parallel size from the pieces the manifest lists.
//
// Invariants: the manifest has passed parse_manifest, so its pieces tile every group and file;
// every piece read has its CRC-32 checked; a missing, short or corrupted file is an Error naming
// it, found before a whole group is allocated from what the manifest claims.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "ckpt/checkpoint.h"
#include "ckpt/io.h"
#include "core/error.h"
#include "model/layout.h"

namespace ft::ckpt {
namespace fs = std::filesystem;

namespace {

// Reads `n` bytes at `offset` of an open file; throws naming the file on a short read.
void pread_all(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* b = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r =
        ::pread(fd, b, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error("reading " + path + ": " + errno_text());
    }
    if (r == 0)
      throw Error(path +
                  ": file is shorter than the manifest says (truncated); the checkpoint "
                  "is damaged");
    b += r;
    n -= uint64_t(r);
    offset += uint64_t(r);
  }
}

struct OpenFile {
  int fd = -1;
  explicit OpenFile(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw Error("cannot open checkpoint shard " + path + ": " + errno_text());
  }
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads one piece into dst (end - begin floats) and checks its CRC-32.
void read_piece(const Manifest& m, const PieceRecord& p, float* dst) {
  const std::string path = (fs::path(m.dir) / p.file).string();
  OpenFile f(path);
  const uint64_t bytes = (p.end - p.begin) * sizeof(float);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw Error("cannot stat " + path + ": " + errno_text());
  if (uint64_t(st.st_size) < p.offset + bytes)
    throw Error(detail::concat(path, ": ", st.st_size, " bytes, but the manifest has a piece at ",
                               p.offset, "..", p.offset + bytes,
                               " (truncated); the checkpoint "
                               "is damaged"));
  pread_all(f.fd, dst, bytes, p.offset, path);
  const uint32_t crc = crc_of(dst, bytes);
  if (crc != p.crc32)
    throw Error(detail::concat(path, ": checksum mismatch in ", state_name(p.state), " of group ",
                               p.group, " (bytes ", p.offset, "..", p.offset + bytes,
                               "): the file is corrupted"));
}

}  // namespace

std::vector<std::string> verify(const Manifest& m,
                                void (*on_file)(size_t, size_t, const std::string&)) {
  std::vector<std::string> problems;
  std::vector<float> buf;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    const std::string path = (fs::path(m.dir) / s.file).string();
    if (on_file) on_file(i, m.shards.size(), s.file);
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) {
      problems.push_back(path + ": missing (" + ec.message() + ")");
      continue;
    }
    if (size != s.bytes) {
      problems.push_back(detail::concat(path, ": ", size, " bytes, the manifest says ", s.bytes,
                                        size < s.bytes ? " (truncated)" : ""));
      continue;
    }
    uint32_t file_crc = 0;
    bool ok = true;
    std::vector<const PieceRecord*> mine;
    for (const auto& p : m.pieces)
      if (p.file == s.file) mine.push_back(&p);
    std::sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (const PieceRecord* p : mine) {
      buf.resize(p->end - p->begin);
      try {
        read_piece(m, *p, buf.data());
      } catch (const Error& e) {
        problems.push_back(e.what());
        ok = false;
        break;
      }
      file_crc = uint32_t(crc32_combine(file_crc, p->crc32, z_off_t((p->end - p->begin) * 4)));
    }
    if (ok && file_crc != s.crc32)
      problems.push_back(path + ": whole-file checksum differs from the manifest");
  }
  return problems;
}

namespace {

// Copies one group between a whole-tensor (tensor size 1) layout and tensor rank t's slices.
// to_local: whole → slice; else slice → whole.
void convert_group(const ParamGroup& whole, const ParamGroup& part, int t, const float* src,
                   float* dst, bool to_local) {
  for (size_t i = 0; i < part.entries.size(); ++i) {
    const ParamEntry& le = part.entries[i];
    const ParamEntry& ge = whole.entries[i];
    float* w = to_local ? nullptr : dst + ge.offset;
    const float* wr = to_local ? src + ge.offset : nullptr;
    float* l = to_local ? dst + le.offset : nullptr;
    const float* lr = to_local ? nullptr : src + le.offset;
    auto copy = [&](size_t woff, size_t loff, size_t n) {
      if (to_local)
        std::copy(wr + woff, wr + woff + n, l + loff);
      else
        std::copy(lr + loff, lr + loff + n, w + woff);
    };
    if (le.split == TensorSplit::kReplicated) {
      copy(0, 0, ge.numel);
    } else if (le.split == TensorSplit::kRows) {
      copy(size_t(t) * le.numel, 0, le.numel);
    } else {
      const size_t rows = size_t(le.shape[0]), cols = size_t(le.shape[1]);
      const size_t gcols = size_t(ge.shape[1]);
      for (size_t r = 0; r < rows; ++r) copy(r * gcols + size_t(t) * cols, r * cols, cols);
    }
  }
}

}  // namespace

void read_range(const Manifest& m, State state, int group, int tensor, int tensor_rank,
                uint64_t begin, uint64_t end, float* out) {
  if (begin >= end) return;
  for (int g : m.frozen_groups)
    if (g == group)
      throw UsageError(detail::concat(
          m.dir, ": parameter group ", group,
          " was frozen in this run, and a checkpoint holds no frozen parameters (they are the "
          "run's starting weights: model.from or its seeded initialisation); reading them from "
          "that source is not implemented yet"));
  if (tensor == m.tensor) {
    uint64_t covered = 0;
    std::vector<float> tmp;
    for (const PieceRecord& p : m.pieces) {
      if (p.state != state || p.group != group || p.tensor_rank != tensor_rank) continue;
      const uint64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
      if (lo >= hi) continue;
      if (p.begin >= begin && p.end <= end) {
        read_piece(m, p, out + (p.begin - begin));  // straight into place
      } else {
        tmp.resize(p.end - p.begin);
        read_piece(m, p, tmp.data());
        std::copy(tmp.data() + (lo - p.begin), tmp.data() + (hi - p.begin), out + (lo - begin));
      }
      covered += hi - lo;
    }
    if (covered != end - begin)
      throw Error(detail::concat(m.dir, ": the checkpoint lacks part of ", state_name(state),
                                 " of group ", group, " (tensor rank ", tensor_rank, "): ", covered,
                                 " of ", end - begin, " elements; it is damaged"));
    return;
  }
  // Another tensor-parallel size: through the whole tensors.
  const ParamLayout local = manifest_layout(m, tensor);
  const ParamLayout whole_layout = manifest_layout(m, 1);
  const std::vector<float> whole = read_global_group(m, state, group);
  const ParamGroup& lg = local.groups()[size_t(group)];
  std::vector<float> part(lg.numel);
  convert_group(whole_layout.groups()[size_t(group)], lg, tensor_rank, whole.data(), part.data(),
                true);
  FT_CHECK(end <= part.size(), "read_range past the end of group ", group);
  std::copy(part.begin() + int64_t(begin), part.begin() + int64_t(end), out);
}

namespace {

// The shard files holding the pieces of (state, group) are as long as the manifest says, checked
// before a whole group is allocated: a missing or truncated file is an Error, never an
// allocation sized by what a damaged manifest claims (its sizes are only known consistent).
void check_files_hold(const Manifest& m, State state, int group) {
  std::map<std::string, uint64_t> need;
  for (const PieceRecord& p : m.pieces)
    if (p.state == state && p.group == group) {
      uint64_t& n = need[p.file];
      n = std::max(n, p.offset + (p.end - p.begin) * sizeof(float));
    }
  for (const auto& [file, n] : need) {
    const std::string path = (fs::path(m.dir) / file).string();
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) throw Error(path + ": missing (" + ec.message() + "); the checkpoint is damaged");
    if (size < n)
      throw Error(detail::concat(path, ": ", size, " bytes, the manifest needs ", n,
                                 " (truncated); the checkpoint is damaged"));
  }
}

}  // namespace

std::vector<float> read_global_group(const Manifest& m, State state, int group) {
  const ParamLayout whole_layout = manifest_layout(m, 1);
  FT_CHECK(group >= 0 && size_t(group) < whole_layout.groups().size(), "no group ", group);
  check_files_hold(m, state, group);
  const ParamGroup& wg = whole_layout.groups()[size_t(group)];
  std::vector<float> whole(wg.numel);
  if (m.tensor == 1) {
    read_range(m, state, group, 1, 0, 0, wg.numel, whole.data());
    return whole;
  }
  const ParamLayout saved = manifest_layout(m, m.tensor);
  const ParamGroup& sg = saved.groups()[size_t(group)];
  std::vector<float> part(sg.numel);
  for (int t = 0; t < m.tensor; ++t) {
    read_range(m, state, group, m.tensor, t, 0, sg.numel, part.data());
    convert_group(wg, sg, t, part.data(), whole.data(), false);
  }
  return whole;
}

}  // namespace ft::ckpt
