// CheckpointWriter (checkpoint.h): this rank's shard file and rank_*.json, synchronously or on a
// background thread from a host staging buffer; on rank 0 also the commit (manifest.json,
// tokenizer copy, COMPLETE, `latest`) and keep_last.
//
// Invariants (DESIGN.md §8): a rank's .json is written only after its .bin is durable, and rank 0
// commits only this attempt's rank records; COMPLETE and then `latest` are written last, each
// atomically, and only for a manifest that passes parse_manifest; a piece holding a NaN or an
// infinity fails the save with nothing committed; keep_last removes an older checkpoint only
// once a newer one is complete, COMPLETE first. No communicator is used off the main thread.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_internal.h"
#include "ckpt/io.h"
#include "core/error.h"
#include "core/log.h"

namespace ft::ckpt {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

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

std::string rank_file(int rank, const char* ext) {
  char b[64];
  std::snprintf(b, sizeof b, "rank_%05d.%s", rank, ext);
  return b;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

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
  {
    const MemoryScope tag(MemoryCategory::kCheckpoint);
    staging_ = static_cast<char*>(o_.staging_device ? o_.staging_device->alloc_host(bytes)
                                                    : Device::alloc_host_plain(bytes));
  }
  staging_bytes_ = bytes;
  // ft plan's counting device hands out addresses that are not memory.
  if (o_.staging_device && !o_.staging_device->host_memory_backed()) return;
  // Touch every page now (in parallel, as the copies will be), not during the first save.
  const int64_t pages = int64_t((bytes + 4095) / 4096);
  char* p = staging_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; ++i) p[uint64_t(i) * 4096] = 0;
}

void CheckpointWriter::reserve(const std::vector<PieceSource>& pieces) {
  uint64_t bytes = 0;
  for (const auto& p : pieces) bytes += (p.end - p.begin) * sizeof(float);
  reserve(bytes);
}

HostBuffer<float> CheckpointWriter::piece_copy(const std::vector<PieceSource>& pieces) {
  Device* dev = nullptr;
  uint64_t most = 0;
  for (const auto& p : pieces)
    if (p.device) {
      dev = p.device;
      most = std::max<uint64_t>(most, p.end - p.begin);
    }
  if (!dev) return {};
  const MemoryScope tag(MemoryCategory::kCheckpoint);
  return HostBuffer<float>(dev, most, HostMemory::kPageable);
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
      HostBuffer<float> host = piece_copy(job.pieces);  // a device piece, to be written
      for (PieceSource p : job.pieces) {
        const uint64_t bytes = (p.end - p.begin) * sizeof(float);
        if (p.device) {
          p.device->copy_to_host(host.data(), p.data, bytes);
          p.data = host.data();
        }
        uint64_t bad = 0;
        const uint32_t crc = crc_of_finite(p.data, p.end - p.begin, &bad);
        if (bad < p.end - p.begin)
          throw Error(detail::concat(
              "rank ", o_.rank, ": refusing to save step ", job.step, ": ", state_name(p.state),
              " of ", describe_element(job.manifest, p.group, p.begin + bad), " holds ",
              p.data[bad], " at element ", p.begin + bad,
              " of the group; a checkpoint never "
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
  const json rank_json = {{"rank", o_.rank}, {"attempt", o_.attempt}, {"file", bin_name},
                          {"bytes", offset}, {"crc32", file_crc},     {"pieces", pieces}};
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
      // A tokenizer.json keeps its name (export and load_tokenizer tell the kinds apart by it).
      const std::string name =
          fs::path(o_.tokenizer).extension() == ".json" ? "tokenizer.json" : "tokenizer.model";
      const std::string data = read_text(o_.tokenizer);
      write_file_atomic((folder / name).string(), data);
      m["tokenizer"]["file"] = name;
      // Beside a tokenizer.json, its folder's chat template and special tokens (and the special
      // token ids of its generation_config.json), so that `ft export` and `ft generate --chat`
      // find them here as in the model's folder (§8).
      if (name == "tokenizer.json") {
        const fs::path from = fs::path(o_.tokenizer).parent_path();
        for (const char* beside :
             {"tokenizer_config.json", "chat_template.jinja", "generation_config.json"}) {
          std::error_code ec;
          if (fs::is_regular_file(from / beside, ec))
            write_file_atomic((folder / beside).string(), read_text((from / beside).string()));
        }
      }
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
