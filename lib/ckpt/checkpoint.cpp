#include "ckpt/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <tuple>
#include <sstream>

#include "core/error.h"
#include "core/json_describe.h"
#include "core/log.h"
#include "model/layout.h"
#include "model/rope.h"

namespace ft::ckpt {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

const char* state_name(State s) {
  switch (s) {
    case State::kParam: return "param";
    case State::kExpAvg: return "exp_avg";
    case State::kExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

namespace {

State parse_state(const std::string& s, const std::string& file) {
  if (s == "param") return State::kParam;
  if (s == "exp_avg") return State::kExpAvg;
  if (s == "exp_avg_sq") return State::kExpAvgSq;
  throw Error(file + ": unknown state kind '" + s + "' in a piece; the checkpoint is damaged");
}

std::string errno_text() { return std::strerror(errno); }

uint32_t crc_of(const void* p, uint64_t n, uint32_t crc = 0) {
  auto* b = static_cast<const Bytef*>(p);
  uLong c = crc;
  while (n > 0) {
    const uInt chunk = uInt(std::min<uint64_t>(n, uint64_t(1) << 30));
    c = crc32(c, b, chunk);
    b += chunk;
    n -= chunk;
  }
  return uint32_t(c);
}

// The index of the first NaN or infinity among n floats, or n. An integer test of the exponent
// bits (all ones), so that it vectorises without -ffast-math (which would assume no NaN).
__attribute__((target_clones("avx2", "default"))) uint64_t first_non_finite(const float* p,
                                                                            uint64_t n) {
  uint32_t any = 0;
  for (uint64_t i = 0; i < n; ++i)
    any |= uint32_t((std::bit_cast<uint32_t>(p[i]) & 0x7f800000u) == 0x7f800000u);
  if (any == 0) return n;
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return n;
}

// CRC-32 of a piece, refusing non-finite values on the way: each chunk is scanned just after
// zlib has read it, from the cache lines the CRC pass loaded (one pass over memory, not two;
// scanning first would stall on memory that the CRC's streaming reads otherwise overlap with
// its arithmetic). Returns the CRC, or sets *bad to the first non-finite element.
uint32_t crc_of_finite(const float* p, uint64_t n, uint64_t* bad) {
  constexpr uint64_t kChunk = 65536;  // floats: 256 KiB, inside L2
  uint32_t crc = 0;
  *bad = n;
  for (uint64_t a = 0; a < n; a += kChunk) {
    const uint64_t m = std::min(kChunk, n - a);
    crc = crc_of(p + a, m * sizeof(float), crc);
    const uint64_t i = first_non_finite(p + a, m);
    if (i < m) {
      *bad = a + i;
      return 0;
    }
  }
  return crc;
}

// Names element `index` of group `group`'s flat buffer at this rank's tensor size, from the
// manifest's tensor table when this rank has one (rank 0): "model.layers.0.mlp.up_proj.weight
// (group 1, layers.0)"; else "group 1".
std::string describe_element(const json& manifest, int group, uint64_t index) {
  std::string where = detail::concat("group ", group);
  try {
    if (!manifest.contains("tensors") || !manifest["tensors"].is_array()) return where;
    const int64_t T = manifest.at("layout").at("tensor").get<int64_t>();
    uint64_t at = 0;
    for (const json& t : manifest["tensors"]) {
      if (t.at("group").get<int64_t>() != group) continue;
      uint64_t n = 1;
      for (const json& d : t.at("shape")) n *= d.get<uint64_t>();
      if (t.value("split", std::string("replicated")) != "replicated") n /= uint64_t(T);
      if (index < at + n)
        return detail::concat(t.at("name").get<std::string>(), " (", where, ", ",
                              t.value("group_name", std::string("?")), ")");
      at += n;
    }
  } catch (const std::exception&) {
    // Only a better name is lost.
  }
  return where;
}

void write_all(int fd, const void* p, uint64_t n, const std::string& path) {
  auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error("writing " + path + ": " + errno_text());
    }
    b += w;
    n -= uint64_t(w);
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error("opening " + path + " to sync it: " + errno_text());
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0 && !(directory && (e == EINVAL || e == EROFS)))
    throw Error("syncing " + path + " to disk: " + std::strerror(e));
}

// Writes a small file durably and atomically: temp file, fsync, rename, fsync of the folder.
void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("creating " + tmp + ": " + errno_text());
  try {
    write_all(fd, text.data(), text.size(), tmp);
    if (::fsync(fd) != 0) throw Error("syncing " + tmp + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = errno_text();
    ::unlink(tmp.c_str());
    throw Error("renaming " + tmp + " to " + path + ": " + e);
  }
  fsync_path(fs::path(path).parent_path().string(), true);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string rank_file(int rank, const char* ext) {
  char b[64];
  std::snprintf(b, sizeof b, "rank_%05d.%s", rank, ext);
  return b;
}

std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = parse_step_folder_name(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec)) out.emplace_back(s, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// Reads `n` bytes at `offset` of an open file; throws naming the file on a short read.
void pread_all(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* b = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, b, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error("reading " + path + ": " + errno_text());
    }
    if (r == 0)
      throw Error(path + ": file is shorter than the manifest says (truncated); the checkpoint "
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
                               p.offset, "..", p.offset + bytes, " (truncated); the checkpoint "
                               "is damaged"));
  pread_all(f.fd, dst, bytes, p.offset, path);
  const uint32_t crc = crc_of(dst, bytes);
  if (crc != p.crc32)
    throw Error(detail::concat(path, ": checksum mismatch in ", state_name(p.state), " of group ",
                               p.group, " (bytes ", p.offset, "..", p.offset + bytes,
                               "): the file is corrupted"));
}

}  // namespace

std::string step_folder_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%08lld", (long long)step);
  return b;
}

// ---------------------------------------------------------------- reading

namespace {

// Size limits of what a manifest may describe. They are far above any model ft trains on a CPU
// cluster and far below what would overflow 64-bit byte counts, so that a damaged number is
// refused before it sizes an allocation, a loop or a file offset.
constexpr int64_t kMaxStep = int64_t(1) << 40;
constexpr int64_t kMaxRanks = int64_t(1) << 20;
constexpr int64_t kMaxModelDim = int64_t(1) << 24;  // dim, ffn_dim, vocab_size, max_seq_len
constexpr int64_t kMaxLayers = 10000;
constexpr uint64_t kMaxElements = uint64_t(1) << 40;  // of the whole model (tensor size 1)
constexpr uint64_t kMaxBytes = kMaxElements * 4 * 3;  // parameters and both moments, f32

// Reads a checkpoint's JSON defensively: each value's JSON type and range are checked before it
// is converted, so that no damaged number reaches a float-to-int conversion (undefined
// behaviour), an allocation or a file offset. Errors name the file and the key path
// ("pieces[3].end"). Only scalars are ever dumped into messages: dump() recurses.
class JsonReader {
 public:
  explicit JsonReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error(file_ + ": " + path + ": " + what + "; the checkpoint is damaged");
  }
  static std::string path_of(const std::string& parent, const char* key) {
    return parent.empty() ? std::string(key) : parent + "." + key;
  }
  static std::string describe(const json& v) { return describe_json_value(v); }

  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "expected an object, found " + describe(v));
    return v;
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array, found " + describe(v));
    return v;
  }
  // obj.key of an object obj (reported as `parent`), which must be there.
  const json& at(const json& obj, const std::string& parent, const char* key) const {
    object(obj, parent.empty() ? "the document" : parent);
    const auto it = obj.find(key);
    if (it == obj.end()) fail(path_of(parent, key), "missing");
    return *it;
  }
  // A JSON integer (not a float such as 3.0 or 1e30, not a bool, not a string) in [lo, hi].
  int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (hi >= 0 && u <= uint64_t(hi) && int64_t(u) >= lo) return int64_t(u);
      } else {
        const int64_t i = v.get<int64_t>();
        if (i >= lo && i <= hi) return i;
      }
    }
    fail(path, detail::concat("expected an integer from ", lo, " to ", hi, ", found ",
                              describe(v)));
  }
  uint64_t uinteger(const json& v, const std::string& path, uint64_t lo, uint64_t hi) const {
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
      const uint64_t u = v.get<uint64_t>();
      if (u >= lo && u <= hi) return u;
    }
    fail(path, detail::concat("expected an integer from ", lo, " to ", hi, ", found ",
                              describe(v)));
  }
  double real(const json& v, const std::string& path, double lo, double hi) const {
    if (v.is_number()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d >= lo && d <= hi) return d;
    }
    fail(path, detail::concat("expected a number from ", lo, " to ", hi, ", found ",
                              describe(v)));
  }
  std::string text(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, found " + describe(v));
    return v.get<std::string>();
  }
  bool flag(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "expected true or false, found " + describe(v));
    return v.get<bool>();
  }
  // A file name inside the step folder: no folder part, so nothing outside it is ever read.
  std::string file_name(const json& v, const std::string& path) const {
    std::string s = text(v, path);
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\0') != std::string::npos)
      fail(path, "expected a file name inside the step folder, found " + describe(v));
    return s;
  }

  int64_t int_at(const json& o, const std::string& parent, const char* key, int64_t lo,
                 int64_t hi) const {
    return integer(at(o, parent, key), path_of(parent, key), lo, hi);
  }
  uint64_t uint_at(const json& o, const std::string& parent, const char* key, uint64_t lo,
                   uint64_t hi) const {
    return uinteger(at(o, parent, key), path_of(parent, key), lo, hi);
  }

 private:
  std::string file_;
};

// The step number a step folder's path names, or -1 (a folder named otherwise, as a copy the
// user made for --resume PATH).
int64_t step_of_dir(const std::string& step_dir) {
  fs::path p = fs::path(step_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return parse_step_folder_name(p.filename().string(), /*set_aside=*/true);
}

// The model config of a manifest, each field range-checked, then checked as a whole: what
// ParamLayout needs (divisibility) and a total size within kMaxElements, computed in 128 bits
// so that no product overflows before it is compared.
ModelConfig parse_model(const JsonReader& r, const json& mc) {
  ModelConfig c;
  const std::string p = "model";
  c.arch = r.text(r.at(mc, p, "arch"), "model.arch");
  if (c.arch != "llama")
    r.fail("model.arch", "unknown architecture " + JsonReader::describe(mc.at("arch")));
  c.dim = int(r.int_at(mc, p, "dim", 1, kMaxModelDim));
  c.n_layers = int(r.int_at(mc, p, "n_layers", 1, kMaxLayers));
  c.n_heads = int(r.int_at(mc, p, "n_heads", 1, c.dim));
  c.n_kv_heads = int(r.int_at(mc, p, "n_kv_heads", 1, c.n_heads));
  c.ffn_dim = int(r.int_at(mc, p, "ffn_dim", 1, kMaxModelDim));
  c.vocab_size = int(r.int_at(mc, p, "vocab_size", 1, kMaxModelDim));
  c.max_seq_len = int(r.int_at(mc, p, "max_seq_len", 1, kMaxModelDim));
  c.rope_theta = r.real(r.at(mc, p, "rope_theta"), "model.rope_theta", 1e-30, 1e30);
  c.norm_eps = r.real(r.at(mc, p, "norm_eps"), "model.norm_eps", 0, 1);
  c.tie_embeddings = r.flag(r.at(mc, p, "tie_embeddings"), "model.tie_embeddings");
  // Absent from manifests of default-RoPE runs and of builds before RoPE scaling.
  if (mc.contains("rope_scaling")) {
    const json& rs = mc.at("rope_scaling");
    const std::string q = "model.rope_scaling";
    if (!rs.is_object()) r.fail(q, "expected an object, found " + JsonReader::describe(rs));
    c.rope_type = r.text(r.at(rs, q, "rope_type"), q + ".rope_type");
    if (!is_rope_type(c.rope_type))
      r.fail(q + ".rope_type", "\"" + c.rope_type +
                                   "\" is not implemented by this ft; use the ft that wrote the "
                                   "checkpoint");
    c.rope_factor = r.real(r.at(rs, q, "factor"), q + ".factor", 1e-30, 1e30);
    c.rope_low_freq_factor =
        r.real(r.at(rs, q, "low_freq_factor"), q + ".low_freq_factor", 1e-30, 1e30);
    c.rope_high_freq_factor =
        r.real(r.at(rs, q, "high_freq_factor"), q + ".high_freq_factor", 1e-30, 1e30);
    c.rope_original_max_seq_len =
        int(r.int_at(rs, q, "original_max_seq_len", 1, kMaxModelDim));
  }
  if (c.dim % c.n_heads != 0)
    r.fail("model.n_heads", detail::concat(c.n_heads, " does not divide model.dim ", c.dim));
  if (c.n_heads % c.n_kv_heads != 0)
    r.fail("model.n_kv_heads",
           detail::concat(c.n_kv_heads, " does not divide model.n_heads ", c.n_heads));
  using u128 = unsigned __int128;
  const u128 C = u128(c.dim), V = u128(c.vocab_size), F = u128(c.ffn_dim);
  const u128 KVD = u128(c.n_kv_heads) * u128(c.dim / c.n_heads);
  const u128 block = 2 * C + C * C + 2 * KVD * C + C * C + 3 * F * C;
  const u128 total = V * C + u128(c.n_layers) * block + C + (c.tie_embeddings ? 0 : V * C);
  if (total > kMaxElements)
    r.fail("model", detail::concat("a model of more than ", kMaxElements,
                                   " parameters (dim ", c.dim, ", n_layers ", c.n_layers,
                                   ", ffn_dim ", c.ffn_dim, ", vocab_size ", c.vocab_size, ")"));
  return c;
}

}  // namespace

int64_t parse_step_folder_name(const std::string& name, bool set_aside) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  size_t i = 5;
  int64_t v = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    if (v > kMaxStep) return -1;  // no overflow on a long run of digits
    v = v * 10 + (name[i] - '0');
  }
  if (i == 5) return -1;
  if (i == name.size()) return v;
  if (!set_aside || name.compare(i, 8, ".damaged") != 0) return -1;
  i += 8;
  if (i == name.size()) return v;
  if (name[i] != '.' || i + 1 == name.size()) return -1;
  for (++i; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return v;
}

std::string set_aside_damaged(const std::string& step_dir) {
  fs::path from = fs::path(step_dir).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();
  for (int n = 0;; ++n) {
    fs::path to = from;
    to += n == 0 ? std::string(".damaged") : ".damaged." + std::to_string(n);
    std::error_code ec;
    if (fs::exists(to, ec) || fs::is_symlink(to, ec)) continue;
    // rename(2) never replaces a non-empty folder, and `to` does not exist: nothing is lost
    // even if another process races us to the name.
    if (::rename(from.c_str(), to.c_str()) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) continue;
      throw Error("cannot rename the damaged checkpoint " + from.string() + " to " + to.string() +
                  ": " + errno_text() + "; nothing was deleted");
    }
    return to.string();
  }
}

Manifest parse_manifest(const std::string& text, const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  const JsonReader r(path);
  Manifest m;
  m.dir = step_dir;
  try {
    m.json = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + "); the checkpoint is damaged");
  }
  const json& j = r.object(m.json, "the document");
  if (!j.contains("format") || j["format"] != "ft-checkpoint")
    throw Error(path + ": not an ft checkpoint manifest (format is not \"ft-checkpoint\")");
  if (r.int_at(j, "", "version", INT64_MIN, INT64_MAX) != 1)
    throw Error(path + ": checkpoint format version " + j["version"].dump() +
                " is not supported by this ft (1)");

  // The step: a count of optimizer steps, and the number in the folder's name.
  m.step = r.int_at(j, "", "step", 0, kMaxStep);
  const int64_t named = step_of_dir(step_dir);
  if (named >= 0 && named != m.step)
    r.fail("step", detail::concat(m.step, ", but the folder's name says step ", named,
                                  " (a manifest copied from another folder, or a damaged one)"));

  const json& l = r.at(j, "", "layout");
  m.world = int(r.int_at(l, "layout", "world", 1, kMaxRanks));
  m.data = int(r.int_at(l, "layout", "data", 1, kMaxRanks));
  m.tensor = int(r.int_at(l, "layout", "tensor", 1, kMaxRanks));
  m.pipeline = int(r.int_at(l, "layout", "pipeline", 1, kMaxRanks));
  m.zero_stage = int(r.int_at(l, "layout", "zero_stage", 0, 3));
  if (int64_t(m.data) * m.tensor * m.pipeline != m.world)
    r.fail("layout", detail::concat("world ", m.world, " is not data ", m.data, " x tensor ",
                                    m.tensor, " x pipeline ", m.pipeline));
  m.model = parse_model(r, r.at(j, "", "model"));
  const ModelConfig& c = m.model;
  if (c.n_heads % m.tensor || c.n_kv_heads % m.tensor || c.ffn_dim % m.tensor ||
      c.vocab_size % m.tensor)
    r.fail("layout.tensor", detail::concat(m.tensor, " does not divide the model's heads (",
                                           c.n_heads, "), kv heads (", c.n_kv_heads,
                                           "), ffn_dim (", c.ffn_dim, ") and vocab_size (",
                                           c.vocab_size, ")"));
  if (m.pipeline > c.n_layers)
    r.fail("layout.pipeline",
           detail::concat(m.pipeline, " stages for ", c.n_layers, " layers"));
  m.optimizer_step = r.int_at(r.at(j, "", "optimizer"), "optimizer", "step", 0, kMaxStep);

  // Optional sections that the trainer, export and inspect read: typed here, so that they never
  // meet a conversion that throws something other than Error (or is undefined).
  if (j.contains("data")) {
    const json& d = r.object(j["data"], "data");
    if (d.contains("tokens")) m.tokens = r.int_at(d, "data", "tokens", 0, INT64_MAX);
    if (d.contains("next_step") && r.int_at(d, "data", "next_step", 0, kMaxStep) != m.step)
      r.fail("data.next_step", detail::concat(d["next_step"].dump(), ", not the step ", m.step));
    if (d.contains("global_batch_size"))
      r.int_at(d, "data", "global_batch_size", 1, INT32_MAX);
    if (d.contains("seq_len")) r.int_at(d, "data", "seq_len", 1, INT32_MAX);
    if (d.contains("seed")) r.uint_at(d, "data", "seed", 0, UINT64_MAX);
    if (d.contains("shuffle")) r.flag(d["shuffle"], "data.shuffle");
    if (d.contains("train")) r.text(d["train"], "data.train");
  }
  if (j.contains("scheduler")) {
    // The schedule advances with applied steps only (as DeepSpeed's and Megatron's): an fp16
    // step skipped for overflow leaves it behind the step count, never ahead of it.
    const json& s = r.object(j["scheduler"], "scheduler");
    if (s.contains("step") && r.int_at(s, "scheduler", "step", 0, kMaxStep) > m.step)
      r.fail("scheduler.step", detail::concat(s["step"].dump(), ", past the step ", m.step));
  }
  if (j.contains("loss_scaler"))
    m.loss_scaler = LossScalerState::from_json(j["loss_scaler"], path);
  if (j.contains("tokenizer") && !j["tokenizer"].is_null()) {
    const json& t = r.object(j["tokenizer"], "tokenizer");
    if (t.contains("file")) r.file_name(t["file"], "tokenizer.file");
    if (t.contains("sha256")) r.text(t["sha256"], "tokenizer.sha256");
  }

  // The tensor table (written by the trainer; optional for other writers) must be the model's.
  const ParamLayout whole(c, 1);
  if (j.contains("tensors")) {
    const json& ts = r.array(j["tensors"], "tensors");
    size_t k = 0;
    for (size_t g = 0; g < whole.groups().size(); ++g)
      for (const ParamEntry& e : whole.groups()[g].entries) {
        const std::string tp = detail::concat("tensors[", k, "]");
        if (k >= ts.size())
          r.fail("tensors", detail::concat(ts.size(), " entries; the model has more"));
        const json& t = ts[k++];
        if (r.text(r.at(t, tp, "name"), tp + ".name") != e.name)
          r.fail(tp + ".name", "expected " + e.name + " here (the model's tensor order)");
        const json& shape = r.array(r.at(t, tp, "shape"), tp + ".shape");
        bool same = shape.size() == e.global_shape.size();
        for (size_t i = 0; i < shape.size(); ++i) {
          const int64_t d = r.integer(shape[i], detail::concat(tp, ".shape[", i, "]"), 1,
                                      int64_t(kMaxElements));
          same = same && i < e.global_shape.size() && d == e.global_shape[i];
        }
        if (!same) r.fail(tp + ".shape", "differs from " + e.name + "'s shape in the model");
        if (r.text(r.at(t, tp, "dtype"), tp + ".dtype") != "f32")
          r.fail(tp + ".dtype", "unknown dtype " + JsonReader::describe(t["dtype"]) +
                                    " (checkpoints hold f32)");
        if (r.int_at(t, tp, "group", 0, int64_t(whole.groups().size()) - 1) != int64_t(g))
          r.fail(tp + ".group", detail::concat("expected ", g, " for ", e.name));
        if (t.contains("split")) {
          const std::string s = r.text(t["split"], tp + ".split");
          const char* want = e.split == TensorSplit::kRows   ? "rows"
                             : e.split == TensorSplit::kCols ? "cols"
                                                             : "replicated";
          if (s != want) r.fail(tp + ".split", std::string("expected ") + want + " for " + e.name);
        }
      }
    if (k != ts.size())
      r.fail("tensors", detail::concat(ts.size(), " entries; the model has ", k, " tensors"));
  }

  // Shards: one per rank, in rank order, each a plain file name.
  const json& shards = r.array(r.at(j, "", "shards"), "shards");
  if (int64_t(shards.size()) != m.world)
    r.fail("shards", detail::concat(shards.size(), " shard files for a world of ", m.world));
  std::map<std::string, size_t> shard_of;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string sp = detail::concat("shards[", i, "]");
    ShardRecord s;
    s.file = r.file_name(r.at(shards[i], sp, "file"), sp + ".file");
    s.rank = int(r.int_at(shards[i], sp, "rank", int64_t(i), int64_t(i)));
    s.bytes = r.uint_at(shards[i], sp, "bytes", 0, kMaxBytes);
    s.crc32 = uint32_t(r.uint_at(shards[i], sp, "crc32", 0, UINT32_MAX));
    if (!shard_of.emplace(s.file, i).second)
      r.fail(sp + ".file", "names " + s.file + " again");
    m.shards.push_back(std::move(s));
  }

  // Pieces: each inside its group (at the saved tensor size) and inside its shard file, checked
  // before anything is allocated or read for it.
  const ParamLayout saved(c, m.tensor);
  const auto& groups = saved.groups();
  const json& pieces = r.array(r.at(j, "", "pieces"), "pieces");
  m.pieces.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string pp = detail::concat("pieces[", i, "]");
    const json& p = r.object(pieces[i], pp);
    PieceRecord q;
    q.file = r.file_name(r.at(p, pp, "file"), pp + ".file");
    const auto sh = shard_of.find(q.file);
    if (sh == shard_of.end()) r.fail(pp + ".file", q.file + " is not one of the shards");
    const std::string st = r.text(r.at(p, pp, "state"), pp + ".state");
    if (st != "param" && st != "exp_avg" && st != "exp_avg_sq")
      r.fail(pp + ".state", "unknown state kind " + JsonReader::describe(p["state"]) +
                                " (param, exp_avg or exp_avg_sq)");
    q.state = parse_state(st, path);
    q.group = int(r.int_at(p, pp, "group", 0, int64_t(groups.size()) - 1));
    q.tensor_rank = int(r.int_at(p, pp, "tensor_rank", 0, m.tensor - 1));
    const uint64_t numel = groups[size_t(q.group)].numel;
    q.begin = r.uint_at(p, pp, "begin", 0, numel);
    q.end = r.uint_at(p, pp, "end", 0, numel);
    if (q.end <= q.begin)
      r.fail(pp, detail::concat("an empty or reversed range [", q.begin, ", ", q.end, ")"));
    const uint64_t file_bytes = m.shards[sh->second].bytes;
    q.offset = r.uint_at(p, pp, "offset", 0, file_bytes);
    if ((q.end - q.begin) * sizeof(float) > file_bytes - q.offset)
      r.fail(pp, detail::concat("bytes ", q.offset, "..", q.offset + (q.end - q.begin) * 4,
                                " lie past the end of ", q.file, " (", file_bytes, " bytes)"));
    q.crc32 = uint32_t(r.uint_at(p, pp, "crc32", 0, UINT32_MAX));
    m.pieces.push_back(std::move(q));
  }

  // The pieces tile every (state, group, tensor rank) buffer and every shard file exactly: no
  // gap (a value never read), no overlap (two values for one element).
  std::vector<size_t> order(m.pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) {
    const PieceRecord& q = m.pieces[i];
    return std::make_tuple(int(q.state), q.group, q.tensor_rank, q.begin);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  {
    size_t k = 0;
    for (int s = 0; s < 3; ++s)
      for (int g = 0; g < int(groups.size()); ++g)
        for (int t = 0; t < m.tensor; ++t) {
          uint64_t at = 0;
          while (k < order.size()) {
            const PieceRecord& q = m.pieces[order[k]];
            if (int(q.state) != s || q.group != g || q.tensor_rank != t) break;
            if (q.begin != at)
              r.fail(detail::concat("pieces[", order[k], "]"),
                     detail::concat(q.begin < at ? "overlaps" : "leaves a gap before", " ",
                                    state_name(q.state), " of group ", g, " (tensor rank ", t,
                                    ") at element ", std::min(at, q.begin)));
            at = q.end;
            ++k;
          }
          if (at != groups[size_t(g)].numel)
            r.fail("pieces", detail::concat(state_name(State(s)), " of group ", g,
                                            " (tensor rank ", t, ") is covered up to element ",
                                            at, " of ", groups[size_t(g)].numel));
        }
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PieceRecord &x = m.pieces[a], &y = m.pieces[b];
    return std::tie(x.file, x.offset) < std::tie(y.file, y.offset);
  });
  std::vector<uint64_t> filled(m.shards.size(), 0);
  for (size_t k : order) {
    const PieceRecord& q = m.pieces[k];
    uint64_t& at = filled[shard_of[q.file]];
    if (q.offset != at)
      r.fail(detail::concat("pieces[", k, "].offset"),
             detail::concat(q.offset < at ? "overlaps another piece" : "leaves a gap", " in ",
                            q.file, " at byte ", std::min(at, q.offset)));
    at += (q.end - q.begin) * sizeof(float);
  }
  for (size_t i = 0; i < m.shards.size(); ++i)
    if (filled[i] != m.shards[i].bytes)
      r.fail(detail::concat("shards[", i, "].bytes"),
             detail::concat(m.shards[i].bytes, ", but its pieces fill ", filled[i]));
  return m;
}

Manifest read_manifest(const std::string& step_dir, bool allow_incomplete) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  if (!fs::exists(path))
    throw Error(step_dir + ": no manifest.json; not a checkpoint step folder (or a save that " +
                "never finished)");
  if (!allow_incomplete && !fs::exists(fs::path(step_dir) / "COMPLETE"))
    throw Error(step_dir + ": no COMPLETE marker: the save never finished; resume from an " +
                "earlier checkpoint");
  return parse_manifest(read_text(path), step_dir);
}

RankRecord parse_rank_json(const std::string& text, const std::string& path) {
  const JsonReader r(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + "); the checkpoint is damaged");
  }
  RankRecord rr;
  rr.rank = int(r.int_at(j, "", "rank", 0, kMaxRanks - 1));
  rr.attempt = r.uint_at(j, "", "attempt", 0, UINT64_MAX);
  rr.file = r.file_name(r.at(j, "", "file"), "file");
  rr.bytes = r.uint_at(j, "", "bytes", 0, kMaxBytes);
  rr.crc32 = uint32_t(r.uint_at(j, "", "crc32", 0, UINT32_MAX));
  const json& pieces = r.array(r.at(j, "", "pieces"), "pieces");
  // The group sizes are the manifest's business (parse_manifest checks them at commit); here,
  // each piece is typed and lies inside this rank's file, back to back as the writer puts them.
  uint64_t at = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string pp = detail::concat("pieces[", i, "]");
    const json& p = pieces[i];
    if (r.file_name(r.at(p, pp, "file"), pp + ".file") != rr.file)
      r.fail(pp + ".file", "is not this rank's file " + rr.file);
    const std::string st = r.text(r.at(p, pp, "state"), pp + ".state");
    if (st != "param" && st != "exp_avg" && st != "exp_avg_sq")
      r.fail(pp + ".state", "unknown state kind " + JsonReader::describe(p["state"]));
    r.int_at(p, pp, "group", 0, kMaxLayers + 1);
    r.int_at(p, pp, "tensor_rank", 0, kMaxRanks - 1);
    const uint64_t begin = r.uint_at(p, pp, "begin", 0, kMaxElements);
    const uint64_t end = r.uint_at(p, pp, "end", begin + 1, kMaxElements);
    if (r.uint_at(p, pp, "offset", 0, kMaxBytes) != at)
      r.fail(pp + ".offset", detail::concat("expected ", at, " (pieces lie back to back)"));
    r.uint_at(p, pp, "crc32", 0, UINT32_MAX);
    at += (end - begin) * sizeof(float);
    if (at > rr.bytes) r.fail(pp, detail::concat("ends past the file's ", rr.bytes, " bytes"));
  }
  if (at != rr.bytes)
    r.fail("bytes", detail::concat(rr.bytes, ", but the pieces fill ", at));
  rr.pieces = pieces;
  return rr;
}

std::vector<std::string> complete_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [step, path] : step_folders(dir))
    if (fs::exists(fs::path(path) / "COMPLETE")) out.push_back(path);
  return out;
}

std::string latest_checkpoint(const std::string& dir) {
  const fs::path p = fs::path(dir) / "latest";
  if (!fs::exists(p)) return "";
  std::string name = read_text(p.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r'))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(p.string() + ": does not name a step folder; delete it to resume from the newest "
                             "complete checkpoint");
  return (fs::path(dir) / name).string();
}

bool has_checkpoints(const std::string& dir) {
  return fs::exists(fs::path(dir) / "latest") || !step_folders(dir).empty();
}

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
                                 " of group ", group, " (tensor rank ", tensor_rank, "): ",
                                 covered, " of ", end - begin, " elements; it is damaged"));
    return;
  }
  // Another tensor-parallel size: through the whole tensors.
  const ParamLayout local(m.model, tensor);
  const ParamLayout whole_layout(m.model, 1);
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
    if (ec)
      throw Error(path + ": missing (" + ec.message() + "); the checkpoint is damaged");
    if (size < n)
      throw Error(detail::concat(path, ": ", size, " bytes, the manifest needs ", n,
                                 " (truncated); the checkpoint is damaged"));
  }
}

}  // namespace

std::vector<float> read_global_group(const Manifest& m, State state, int group) {
  const ParamLayout whole_layout(m.model, 1);
  FT_CHECK(group >= 0 && size_t(group) < whole_layout.groups().size(), "no group ", group);
  check_files_hold(m, state, group);
  const ParamGroup& wg = whole_layout.groups()[size_t(group)];
  std::vector<float> whole(wg.numel);
  if (m.tensor == 1) {
    read_range(m, state, group, 1, 0, 0, wg.numel, whole.data());
    return whole;
  }
  const ParamLayout saved(m.model, m.tensor);
  const ParamGroup& sg = saved.groups()[size_t(group)];
  std::vector<float> part(sg.numel);
  for (int t = 0; t < m.tensor; ++t) {
    read_range(m, state, group, m.tensor, t, 0, sg.numel, part.data());
    convert_group(wg, sg, t, part.data(), whole.data(), false);
  }
  return whole;
}

// ---------------------------------------------------------------- writing

namespace {

// The attempt number in a rank record's text, or 0 when it has none readable.
uint64_t attempt_of(const std::string& text) {
  try {
    const json j = json::parse(text);
    if (j.is_object() && j.contains("attempt") && j["attempt"].is_number_unsigned())
      return j["attempt"].get<uint64_t>();
  } catch (const json::exception&) {
  }
  return 0;
}

// Ends a failed save's error: which checkpoint is still the last good one.
std::string untouched_note(const std::string& dir) {
  std::string last;
  try {
    last = latest_checkpoint(dir);
  } catch (const Error&) {
  }
  if (last.empty()) {
    const std::vector<std::string> c = complete_checkpoints(dir);
    if (!c.empty()) last = c.front();
  }
  if (last.empty()) return "; no earlier complete checkpoint exists";
  return "; the previous complete checkpoint is untouched: " + last;
}

}  // namespace

struct CheckpointWriter::Job {
  int64_t step = 0;
  std::vector<PieceSource> pieces;  // into live memory (sync) or staging_ (async)
  Event* copies_done = nullptr;     // async with a copy stream: wait for it before reading
  json manifest;
  Clock::time_point started;
  double blocking_s = 0;
};

CheckpointWriter::CheckpointWriter(Options o) : o_(std::move(o)) {
  if (o_.async) thread_ = std::thread([this] { worker(); });
}

CheckpointWriter::~CheckpointWriter() {
  // A save in flight finishes writing this rank's shard; rank 0 stops waiting for the others
  // (they may be gone: this runs when training failed), so nothing is committed.
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  if (!error_.empty()) log_error("checkpoint: ", error_);
  release_staging();
}

void CheckpointWriter::release_staging() {
  if (!staging_) return;
  // Copies still queued into the buffer (a save that failed half-way) finish first.
  if (copies_done_.valid()) copies_done_.synchronize();
  if (o_.staging_device)
    o_.staging_device->free_host(staging_, staging_bytes_);
  else
    Device::free_host_plain(staging_, staging_bytes_);
  staging_ = nullptr;
  staging_bytes_ = 0;
}

bool CheckpointWriter::busy() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !done_;
}

void CheckpointWriter::worker() {
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return has_job_ || stop_; });
    if (stop_ && !has_job_) return;
    has_job_ = false;
    lk.unlock();
    std::string err;
    try {
      run_job(*job_);
    } catch (const std::exception& e) {
      err = e.what();
    }
    lk.lock();
    if (!err.empty()) error_ = err;
    done_ = true;
    lk.unlock();
    cv_.notify_all();
  }
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  if (!error_.empty()) throw Error("checkpoint: " + std::exchange(error_, ""));
}

std::optional<CheckpointWriter::Committed> CheckpointWriter::poll() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!error_.empty()) throw Error("checkpoint: " + std::exchange(error_, ""));
  return std::exchange(committed_, std::nullopt);
}

void CheckpointWriter::reserve(uint64_t bytes) {
  if (!o_.async || bytes <= staging_bytes_) return;
  wait();  // the staging buffer may be in use
  release_staging();
  staging_ = static_cast<char*>(o_.staging_device ? o_.staging_device->alloc_host(bytes)
                                                   : Device::alloc_host_plain(bytes));
  // Touch every page now (in parallel, as the copies will be), not during the first save.
  const int64_t pages = int64_t((bytes + 4095) / 4096);
  char* p = staging_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; ++i) p[uint64_t(i) * 4096] = 0;
  staging_bytes_ = bytes;
}

void CheckpointWriter::fence_staging_copies() {
  if (!fence_pending_) return;
  copy_device_->wait(copy_device_->stream(), copies_done_);
  fence_pending_ = false;
}

void CheckpointWriter::save(int64_t step, const std::vector<PieceSource>& pieces,
                            const json& manifest) {
  const auto t0 = Clock::now();
  wait();  // one save in flight
  auto job = std::make_unique<Job>();
  job->step = step;
  job->manifest = manifest;
  job->started = t0;
  if (!o_.async) {
    job->pieces = pieces;
    job_ = std::move(job);
    job_->blocking_s = -1;  // filled in at commit: the whole save blocks
    done_ = false;
    try {
      run_job(*job_);
    } catch (...) {
      done_ = true;
      throw;
    }
    done_ = true;
    return;
  }
  // Asynchronous: copy to host memory, then let the worker write.
  uint64_t total = 0;
  for (const auto& p : pieces) total += (p.end - p.begin) * sizeof(float);
  reserve(total);
  // A device with a stream of its own for copies (CUDA): the pieces are copied there, in order
  // after the work queued so far (the step that produced them), and the worker waits for the
  // copies before it reads the buffer. One device per rank, so one pair of events.
  Device* copy_dev = nullptr;
  for (const auto& p : pieces)
    if (p.device && p.device->copy_stream().handle != p.device->stream().handle)
      copy_dev = p.device;
  if (copy_dev) {
    FT_CHECK(!copy_device_ || copy_device_ == copy_dev, "checkpoint pieces on two devices");
    if (!copy_device_) {
      copy_device_ = copy_dev;
      compute_ready_ = copy_dev->make_event();
      copies_done_ = copy_dev->make_event();
    }
    compute_ready_.record(copy_dev->stream());
    copy_dev->wait(copy_dev->copy_stream(), compute_ready_);
  }
  uint64_t off = 0;
  for (const auto& p : pieces) {
    const uint64_t n = p.end - p.begin;
    float* dst = reinterpret_cast<float*>(staging_ + off);
    if (copy_dev && p.device == copy_dev) {
      copy_dev->copy_to_host_async(copy_dev->copy_stream(), dst, p.data, n * sizeof(float));
      PieceSource q = p;
      q.data = dst;
      q.device = nullptr;
      job->pieces.push_back(q);
      off += n * sizeof(float);
      continue;
    }
    // Large pieces are copied by every thread at once.
    const int64_t chunks = int64_t((n + (1u << 20) - 1) >> 20);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const uint64_t a = uint64_t(c) << 20, b = std::min<uint64_t>(n, a + (1u << 20));
      if (p.device)
        p.device->copy_to_host(dst + a, p.data + a, (b - a) * sizeof(float));
      else
        std::memcpy(dst + a, p.data + a, (b - a) * sizeof(float));
    }
    PieceSource q = p;
    q.data = dst;
    q.device = nullptr;
    job->pieces.push_back(q);
    off += n * sizeof(float);
  }
  if (copy_dev) {
    copies_done_.record(copy_dev->copy_stream());
    job->copies_done = &copies_done_;
    fence_pending_ = true;
  }
  job->blocking_s = std::chrono::duration<double>(Clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = std::move(job);
    has_job_ = true;
    done_ = false;
  }
  cv_.notify_all();
}

void CheckpointWriter::run_job(Job& job) {
  if (job.copies_done) job.copies_done->synchronize();  // the staging copies have landed
  const fs::path folder = fs::path(o_.dir) / step_folder_name(job.step);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (!fs::is_directory(folder))
    throw Error("cannot create checkpoint folder " + folder.string() + ": " +
                (ec ? ec.message() : "a file of that name exists") + "; check checkpoint.dir");
  const std::string bin_name = rank_file(o_.rank, "bin");
  const std::string bin = (folder / bin_name).string();
  int delay_ms = 0;
  if (const char* d = std::getenv("FT_TEST_CKPT_DELAY_MS")) delay_ms = std::atoi(d);

  // This rank's shard: pieces back to back, each with its CRC-32.
  json pieces = json::array();
  uint64_t offset = 0;
  uint32_t file_crc = 0;
  {
    const int fd = ::open(bin.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw Error("creating " + bin + ": " + errno_text());
    try {
      std::vector<float> host;  // a device piece, copied to the host to be written
      for (PieceSource p : job.pieces) {
        const uint64_t bytes = (p.end - p.begin) * sizeof(float);
        if (p.device) {
          host.resize(p.end - p.begin);
          p.device->copy_to_host(host.data(), p.data, bytes);
          p.data = host.data();
        }
        uint64_t bad = 0;
        const uint32_t crc = crc_of_finite(p.data, p.end - p.begin, &bad);
        if (bad < p.end - p.begin)
          throw Error(detail::concat(
              "rank ", o_.rank, ": refusing to save step ", job.step, ": ", state_name(p.state),
              " of ", describe_element(job.manifest, p.group, p.begin + bad), " holds ",
              p.data[bad], " at element ", p.begin + bad, " of the group; a checkpoint never "
              "holds a non-finite value, so nothing of this step is committed"));
        write_all(fd, p.data, bytes, bin);
        pieces.push_back({{"file", bin_name},
                          {"state", state_name(p.state)},
                          {"group", p.group},
                          {"tensor_rank", o_.tensor_rank},
                          {"begin", p.begin},
                          {"end", p.end},
                          {"offset", offset},
                          {"crc32", crc}});
        file_crc = uint32_t(crc32_combine(file_crc, crc, z_off_t(bytes)));
        offset += bytes;
        if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      }
      if (::fsync(fd) != 0) throw Error("syncing " + bin + " to disk: " + errno_text());
    } catch (const Error& e) {
      ::close(fd);
      ::unlink(bin.c_str());  // give the space back; this checkpoint will never complete
      throw Error(detail::concat(e.what(), " (saving ", folder.filename().string(),
                                 untouched_note(o_.dir), ")"));
    }
    if (::close(fd) != 0) throw Error("closing " + bin + ": " + errno_text());
  }
  const json rank_json = {{"rank", o_.rank},
                          {"attempt", o_.attempt},
                          {"file", bin_name},
                          {"bytes", offset},
                          {"crc32", file_crc},
                          {"pieces", pieces}};
  try {
    write_file_atomic((folder / rank_file(o_.rank, "json")).string(), rank_json.dump());
  } catch (const Error& e) {
    ::unlink(bin.c_str());
    throw Error(detail::concat(e.what(), " (saving ", folder.filename().string(),
                               untouched_note(o_.dir), ")"));
  }
  if (o_.rank != 0) return;

  // Rank 0 commits once every rank's shard is durable: its rank_*.json of this attempt exists
  // (written atomically, so a file that exists is whole).
  std::vector<RankRecord> ranks(size_t(o_.world));
  ranks[0] = parse_rank_json(rank_json.dump(), (folder / rank_file(0, "json")).string());
  for (int r = 1; r < o_.world; ++r) {
    const std::string path = (folder / rank_file(r, "json")).string();
    for (;;) {
      std::string text;
      if (fs::exists(path)) {
        try {
          text = read_text(path);
        } catch (const Error&) {
          // replaced while being opened: look again
        }
      }
      if (!text.empty()) {
        // Only this attempt's record counts; a leftover of a crashed earlier attempt is waited
        // past (its rank replaces it), whatever it holds. This attempt's record must be sound.
        try {
          RankRecord rr = parse_rank_json(text, path);
          if (rr.attempt == o_.attempt) {
            if (rr.rank != r || rr.file != rank_file(r, "bin"))
              throw Error(path + ": names rank " + std::to_string(rr.rank) + " and file " +
                          rr.file + "; the checkpoint is damaged");
            ranks[size_t(r)] = std::move(rr);
            break;
          }
        } catch (const Error& e) {
          if (attempt_of(text) == o_.attempt)
            throw Error(detail::concat(e.what(), " (committing ", folder.filename().string(),
                                       ": nothing committed", untouched_note(o_.dir), ")"));
        }
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // Leftovers of an earlier attempt with more ranks do not belong to this checkpoint.
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    int r = -1;
    if (std::sscanf(name.c_str(), "rank_%d.", &r) == 1 && r >= o_.world) fs::remove(e.path(), ec);
  }
  json m = job.manifest;
  json shards = json::array(), all_pieces = json::array();
  uint64_t total = 0;
  for (int r = 0; r < o_.world; ++r) {
    const RankRecord& rr = ranks[size_t(r)];
    shards.push_back({{"file", rr.file}, {"rank", r}, {"bytes", rr.bytes}, {"crc32", rr.crc32}});
    total += rr.bytes;
    for (const auto& p : rr.pieces) all_pieces.push_back(p);
  }
  m["format"] = "ft-checkpoint";
  m["version"] = 1;
  m["step"] = job.step;
  m["saved_at"] = utc_now();
  m["ft_version"] = FT_VERSION;
  m["shards"] = shards;
  m["pieces"] = all_pieces;
  try {
    if (!o_.tokenizer.empty()) {
      const fs::path dst = folder / "tokenizer.model";
      const std::string data = read_text(o_.tokenizer);
      write_file_atomic(dst.string(), data);
      m["tokenizer"]["file"] = "tokenizer.model";
    }
    // What is committed must pass every check a reader makes (parse_manifest): a writer bug or
    // a damaged rank record fails this save instead of leaving a checkpoint no run can load.
    const std::string text = m.dump(1);
    try {
      parse_manifest(text, folder.string());
    } catch (const Error& e) {
      throw Error(std::string("refusing to commit a manifest that does not read back: ") +
                  e.what());
    }
    write_file_atomic((folder / "manifest.json").string(), text);
    write_file_atomic((folder / "COMPLETE").string(),
                      detail::concat(step_folder_name(job.step), " complete ", utc_now(), "\n"));
    write_file_atomic((fs::path(o_.dir) / "latest").string(), step_folder_name(job.step) + "\n");
  } catch (const Error& e) {
    throw Error(detail::concat(e.what(), " (committing ", folder.filename().string(),
                               ": nothing committed", untouched_note(o_.dir), ")"));
  }

  // keep_last: only now that this one is complete. Incomplete folders older than it are
  // leftovers of crashed saves.
  int kept = 0;
  for (const auto& [step, path] : step_folders(o_.dir)) {
    const bool complete = fs::exists(fs::path(path) / "COMPLETE");
    if (step > job.step) continue;  // a newer save another rank has begun
    if (complete && ++kept <= o_.keep_last) continue;
    if (!complete && step == job.step) continue;
    // COMPLETE goes first: a crash part-way through the removal must not leave a folder that
    // claims to be complete with some of its shards gone.
    if (complete) fs::remove(fs::path(path) / "COMPLETE", ec);
    fs::remove_all(path, ec);
    if (ec) log_warn("keep_last: cannot remove ", path, ": ", ec.message());
  }

  Committed c;
  c.step = job.step;
  c.folder = folder.string();
  c.bytes = total;
  c.total_s = std::chrono::duration<double>(Clock::now() - job.started).count();
  c.blocking_s = job.blocking_s < 0 ? c.total_s : job.blocking_s;
  std::lock_guard<std::mutex> lk(mu_);
  committed_ = c;
}

}  // namespace ft::ckpt
