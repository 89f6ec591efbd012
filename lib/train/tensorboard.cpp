#include "train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace ft {

namespace fs = std::filesystem;

namespace tensorboard {

namespace {

// The byte-at-a-time table of CRC-32C, from its reflected polynomial: entry i is the CRC
// register after shifting the byte i through it.
constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table();

// Protobuf's wire format, the part these messages use.
enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += char(0x80 | (v & 0x7f));
  out += char(v);
}

void put_key(std::string& out, int field, WireType type) {
  put_varint(out, uint64_t(field) << 3 | type);
}

// Little-endian whatever the host's order: the format's, and TFRecord's length's.
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += char((v >> (8 * i)) & 0xff);
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// An Event's wall_time (field 1) and step (2), the fields every event here begins with.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_le(e, std::bit_cast<uint64_t>(wall_time), 8);
  if (step != 0) {
    put_key(e, 2, kVarint);
    put_varint(e, uint64_t(step));  // int64: a negative one as its two's complement, 10 bytes
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string record(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_le(r, data.size(), 8);
  put_le(r, masked_crc32c(r.data(), 8), 4);
  r += data;
  put_le(r, masked_crc32c(data.data(), data.size()), 4);
  return r;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");  // the version TensorBoard reads SessionLog START from
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_key(log, 1, kVarint);
  put_varint(log, 1);  // SessionLog.START
  std::string e = event_head(wall_time, step);
  put_bytes(e, 7, log);
  return e;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_le(v, std::bit_cast<uint32_t>(value), 4);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string series_of(std::string_view key) {
  if (key.starts_with("eval_")) return "eval/" + std::string(key.substr(5));
  if (key.starts_with("ckpt_")) return "checkpoint/" + std::string(key.substr(5));
  return "train/" + std::string(key);
}

}  // namespace tensorboard

namespace {

constexpr std::string_view kPrefix = "events.out.tfevents.";

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The host's name as a file name's part: anything but letters, digits, '-', '_' and '.' as '_'.
std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  std::string h = buf;
  for (char& c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return h;
}

// The largest Unix seconds among the event files' names in `dir` (-1: none).
int64_t newest_event_file_seconds(const fs::path& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    const std::string rest = name.substr(kPrefix.size());
    char* end = nullptr;
    const long long s = std::strtoll(rest.c_str(), &end, 10);
    if (end != rest.c_str() && *end == '.') newest = std::max<int64_t>(newest, s);
  }
  return newest;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);  // made and probed before step 1 already (preflight.h)
  // TensorBoard reads a folder's event files in the order of their names, and a resumed run's
  // values must come after those of the process before it (its START drops theirs from
  // first_step on). The seconds lead the name, so this file starts in a later second than any
  // file there: a run resumed within the second of its crash would otherwise sort by its pid.
  // At most a second's wait; a file from a clock ahead of this one is not waited for.
  int64_t now = std::time(nullptr);
  if (newest_event_file_seconds(dir) == now)
    while (std::time(nullptr) == now) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  now = std::time(nullptr);
  const std::string name =
      detail::concat(kPrefix, now, ".", host_name(), ".", static_cast<long>(getpid()), ".ft");
  path_ = (fs::path(dir) / name).string();
  f_ = std::fopen(path_.c_str(), "wbx");  // a new file: never another process's
  if (!f_)
    throw Error(detail::concat("logging.tensorboard ", dir, ": cannot create ", name, ": ",
                               std::strerror(errno),
                               "; choose another logging.tensorboard or fix its permissions"));
  const double t = unix_time();
  append(tensorboard::record(tensorboard::file_version_event(t)) +
         tensorboard::record(tensorboard::session_start_event(t, first_step)));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& o) noexcept {
  if (this != &o) {
    if (f_) std::fclose(f_);
    f_ = std::exchange(o.f_, nullptr);
    path_ = std::move(o.path_);
  }
  return *this;
}

void TensorBoardWriter::write(const nlohmann::json& line) {
  if (!f_ || !line.is_object()) return;
  const auto step = line.find("step");
  if (step == line.end() || !step->is_number_integer()) return;
  const double t = unix_time();
  std::string records;
  for (const auto& [key, value] : line.items()) {
    if (key == "step" || !value.is_number()) continue;
    const double v = value.get<double>();
    if (!std::isfinite(v)) continue;
    records += tensorboard::record(tensorboard::scalar_event(
        t, step->get<int64_t>(), tensorboard::series_of(key), static_cast<float>(v)));
  }
  append(records);
}

// Whole lines, flushed: a crash loses nothing written. A failed write (a full disk) does not
// stop training, as the metrics file's does not; it is said, and the file ends there: readers
// stop at a record cut short, so nothing after it could be read.
void TensorBoardWriter::append(const std::string& records) {
  if (std::fwrite(records.data(), 1, records.size(), f_) == records.size() && std::fflush(f_) == 0)
    return;
  log_warn("logging.tensorboard: writing ", path_, " failed (", std::strerror(errno),
           "); no more events are written to it, training goes on");
  std::fclose(f_);
  f_ = nullptr;
}

}  // namespace ft
