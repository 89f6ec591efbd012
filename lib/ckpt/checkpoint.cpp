#include "ckpt/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
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

// step_00000100 → 100; -1 for other names.
int64_t parse_step_folder(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = parse_step_folder(e.path().filename().string());
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

Manifest read_manifest(const std::string& step_dir, bool allow_incomplete) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  if (!fs::exists(path))
    throw Error(step_dir + ": no manifest.json; not a checkpoint step folder (or a save that " +
                "never finished)");
  if (!allow_incomplete && !fs::exists(fs::path(step_dir) / "COMPLETE"))
    throw Error(step_dir + ": no COMPLETE marker: the save never finished; resume from an " +
                "earlier checkpoint");
  Manifest m;
  m.dir = step_dir;
  try {
    m.json = json::parse(read_text(path));
    const json& j = m.json;
    if (j.value("format", "") != "ft-checkpoint")
      throw Error(path + ": not an ft checkpoint manifest (format is not \"ft-checkpoint\")");
    if (j.value("version", 0) != 1)
      throw Error(path + ": checkpoint format version " + j.value("version", json()).dump() +
                  " is not supported by this ft (1)");
    m.step = j.at("step").get<int64_t>();
    const json& l = j.at("layout");
    m.world = l.at("world");
    m.data = l.at("data");
    m.tensor = l.at("tensor");
    m.pipeline = l.at("pipeline");
    m.zero_stage = l.at("zero_stage");
    const json& mc = j.at("model");
    m.model.arch = mc.at("arch");
    m.model.dim = mc.at("dim");
    m.model.n_layers = mc.at("n_layers");
    m.model.n_heads = mc.at("n_heads");
    m.model.n_kv_heads = mc.at("n_kv_heads");
    m.model.ffn_dim = mc.at("ffn_dim");
    m.model.vocab_size = mc.at("vocab_size");
    m.model.max_seq_len = mc.at("max_seq_len");
    m.model.rope_theta = mc.at("rope_theta");
    m.model.norm_eps = mc.at("norm_eps");
    m.model.tie_embeddings = mc.at("tie_embeddings");
    // Absent from manifests of default-RoPE runs and of builds before RoPE scaling.
    if (mc.contains("rope_scaling")) {
      const json& rs = mc.at("rope_scaling");
      m.model.rope_type = rs.at("rope_type");
      m.model.rope_factor = rs.at("factor");
      m.model.rope_low_freq_factor = rs.at("low_freq_factor");
      m.model.rope_high_freq_factor = rs.at("high_freq_factor");
      m.model.rope_original_max_seq_len = rs.at("original_max_seq_len");
      if (!is_rope_type(m.model.rope_type))
        throw Error(path + ": model.rope_scaling.rope_type \"" + m.model.rope_type +
                    "\" is not implemented by this ft; use the ft that wrote the checkpoint");
    }
    m.optimizer_step = j.at("optimizer").at("step");
    for (const json& s : j.at("shards"))
      m.shards.push_back({s.at("file"), s.at("rank"), s.at("bytes"), s.at("crc32")});
    for (const json& p : j.at("pieces")) {
      PieceRecord r;
      r.file = p.at("file");
      r.state = parse_state(p.at("state"), path);
      r.group = p.at("group");
      r.tensor_rank = p.at("tensor_rank");
      r.begin = p.at("begin");
      r.end = p.at("end");
      r.offset = p.at("offset");
      r.crc32 = p.at("crc32");
      if (r.end < r.begin || r.group < 0 || r.group > m.model.n_layers + 1 || r.tensor_rank < 0 ||
          r.tensor_rank >= m.tensor || r.file.find('/') != std::string::npos)
        throw Error(path + ": a piece of " + r.file + " has an impossible range, group or rank");
      m.pieces.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    throw Error(path + ": malformed manifest (" + e.what() + "); the checkpoint is damaged");
  }
  if (m.tensor < 1 || m.data < 1 || m.pipeline < 1 || m.world != m.data * m.tensor * m.pipeline)
    throw Error(path + ": inconsistent layout in the manifest");
  return m;
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

std::vector<float> read_global_group(const Manifest& m, State state, int group) {
  const ParamLayout whole_layout(m.model, 1);
  FT_CHECK(group >= 0 && size_t(group) < whole_layout.groups().size(), "no group ", group);
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

struct CheckpointWriter::Job {
  int64_t step = 0;
  std::vector<PieceSource> pieces;  // into live memory (sync) or staging_ (async)
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
  staging_.reset(new char[bytes]);
  // Touch every page now (in parallel, as the copies will be), not during the first save.
  const int64_t pages = int64_t((bytes + 4095) / 4096);
  char* p = staging_.get();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; ++i) p[uint64_t(i) * 4096] = 0;
  staging_bytes_ = bytes;
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
  uint64_t off = 0;
  for (const auto& p : pieces) {
    const uint64_t n = p.end - p.begin;
    float* dst = reinterpret_cast<float*>(staging_.get() + off);
    // Large pieces are copied by every thread at once.
    const int64_t chunks = int64_t((n + (1u << 20) - 1) >> 20);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const uint64_t a = uint64_t(c) << 20, b = std::min<uint64_t>(n, a + (1u << 20));
      std::memcpy(dst + a, p.data + a, (b - a) * sizeof(float));
    }
    PieceSource q = p;
    q.data = dst;
    job->pieces.push_back(q);
    off += n * sizeof(float);
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
      for (const PieceSource& p : job.pieces) {
        const uint64_t bytes = (p.end - p.begin) * sizeof(float);
        const uint32_t crc = crc_of(p.data, bytes);
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
                                 "; the previous complete checkpoint is untouched)"));
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
                               "; the previous complete checkpoint is untouched)"));
  }
  if (o_.rank != 0) return;

  // Rank 0 commits once every rank's shard is durable: its rank_*.json of this attempt exists
  // (written atomically, so a file that exists is whole).
  std::vector<json> rank_jsons(size_t(o_.world));
  rank_jsons[0] = rank_json;
  for (int r = 1; r < o_.world; ++r) {
    const std::string path = (folder / rank_file(r, "json")).string();
    for (;;) {
      if (fs::exists(path)) {
        try {
          json rj = json::parse(read_text(path));
          if (rj.value("attempt", uint64_t(0)) == o_.attempt) {
            rank_jsons[size_t(r)] = std::move(rj);
            break;
          }
        } catch (const std::exception&) {
          // replaced while being read: look again
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
    const json& rj = rank_jsons[size_t(r)];
    shards.push_back({{"file", rj.at("file")}, {"rank", r}, {"bytes", rj.at("bytes")},
                      {"crc32", rj.at("crc32")}});
    total += rj.at("bytes").get<uint64_t>();
    for (auto& p : rj.at("pieces")) all_pieces.push_back(p);
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
    write_file_atomic((folder / "manifest.json").string(), m.dump(1));
    write_file_atomic((folder / "COMPLETE").string(),
                      detail::concat(step_folder_name(job.step), " complete ", utc_now(), "\n"));
    write_file_atomic((fs::path(o_.dir) / "latest").string(), step_folder_name(job.step) + "\n");
  } catch (const Error& e) {
    throw Error(detail::concat(e.what(), " (committing ", folder.filename().string(),
                               "; the previous complete checkpoint is untouched)"));
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
