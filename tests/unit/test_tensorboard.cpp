// TensorBoard event files (lib/train/tensorboard.h): CRC-32C against published vectors, Events
// byte for byte as protobuf serializes them, records decoded back, and the writer's file.
// TensorBoard's own reader reads ft's files in tests/cli/test_tensorboard.sh.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "temp_dir.h"
#include "train/tensorboard.h"

namespace fs = std::filesystem;
namespace tb = ft::tensorboard;

namespace {

uint32_t crc_of(const std::string& s) { return tb::crc32c(s.data(), s.size()); }

std::string from_hex(const char* hex) {
  std::string out;
  for (size_t i = 0; hex[i] && hex[i + 1]; i += 2)
    out += char(std::stoi(std::string(hex + i, 2), nullptr, 16));
  return out;
}

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(s[at + i])) << (8 * i);
  return v;
}

// The records of a TFRecord file, each checked as TensorFlow's reader checks it; nullopt at the
// first one whose length or CRC does not hold.
std::optional<std::vector<std::string>> read_records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) return std::nullopt;
    const uint64_t len = read_le(file, at, 8);
    if (read_le(file, at + 8, 4) != tb::masked_crc32c(file.data() + at, 8)) return std::nullopt;
    if (file.size() - at - 12 < len + 4) return std::nullopt;
    const std::string data = file.substr(at + 12, len);
    if (read_le(file, at + 12 + len, 4) != tb::masked_crc32c(data.data(), data.size()))
      return std::nullopt;
    out.push_back(data);
    at += 16 + len;
  }
  return out;
}

// A protobuf message's fields: number → raw values (varints and fixed ones as integers,
// length-delimited ones as bytes). Enough of the wire format for Event and Summary.
struct Fields {
  std::multimap<int, uint64_t> numbers;
  std::multimap<int, std::string> bytes;
};

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    const uint8_t b = uint8_t(s[at++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

Fields parse(const std::string& s) {
  Fields f;
  size_t at = 0;
  while (at < s.size()) {
    const uint64_t key = read_varint(s, at);
    const int field = int(key >> 3);
    switch (key & 7) {
      case 0:
        f.numbers.emplace(field, read_varint(s, at));
        break;
      case 1:
        f.numbers.emplace(field, read_le(s, at, 8));
        at += 8;
        break;
      case 5:
        f.numbers.emplace(field, read_le(s, at, 4));
        at += 4;
        break;
      case 2: {
        const uint64_t n = read_varint(s, at);
        REQUIRE(at + n <= s.size());
        f.bytes.emplace(field, s.substr(at, n));
        at += n;
        break;
      }
      default:
        FAIL("a wire type Event and Summary do not use");
    }
  }
  return f;
}

// A scalar Event's (step, tag, value).
struct Scalar {
  int64_t step;
  std::string tag;
  float value;
};

Scalar scalar_of(const std::string& event) {
  const Fields e = parse(event);
  REQUIRE(e.bytes.count(5) == 1);
  const Fields summary = parse(e.bytes.find(5)->second);
  REQUIRE(summary.bytes.count(1) == 1);
  const Fields value = parse(summary.bytes.find(1)->second);
  REQUIRE(value.bytes.count(1) == 1);
  REQUIRE(value.numbers.count(2) == 1);
  const int64_t step = e.numbers.count(2) ? int64_t(e.numbers.find(2)->second) : 0;
  return {step, value.bytes.find(1)->second,
          std::bit_cast<float>(uint32_t(value.numbers.find(2)->second))};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C of the published check values") {
  // The CRC catalogue's check value (CRC-32/ISCSI), and RFC 3720 §B.4's examples.
  CHECK(crc_of("123456789") == 0xE3069283u);
  CHECK(crc_of(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc_of(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += char(i);
  CHECK(crc_of(ascending) == 0x46DD794Eu);
  CHECK(crc_of("") == 0u);
  // Continued over pieces of odd sizes: the CRC of the whole.
  const std::string text = "The quick brown fox jumps over the lazy dog, 1 2 3 ...";
  for (size_t cut : {size_t(0), size_t(1), size_t(19), text.size()}) {
    const uint32_t first = tb::crc32c(text.data(), cut);
    CHECK(tb::crc32c(text.data() + cut, text.size() - cut, first) == crc_of(text));
  }
}

TEST_CASE("tensorboard: the masked CRC of a record's length") {
  // The 12 bytes every TensorFlow event file whose first record is 24 bytes starts with:
  // length 24, then its masked CRC a3 7f 4b 22 (TensorBoard's own masked_crc32c says 0x224b7fa3).
  const std::string len24("\x18\0\0\0\0\0\0\0", 8);
  CHECK(tb::masked_crc32c(len24.data(), 8) == 0x224B7FA3u);
  // The mask from its definition: rotate right by 15, add the constant (mod 2^32).
  const uint32_t c = crc_of("123456789");
  CHECK(tb::masked_crc32c("123456789", 9) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("tensorboard: Events are the bytes protobuf serializes") {
  // Event(...).SerializeToString() by protobuf 7.36.2 (Python) with tensorboard 2.21.0's
  // event_pb2 and summary_pb2; wall_time 1700000000.25 in each.
  const double t = 1700000000.25;
  CHECK(tb::file_version_event(t) == from_hex("0900001040fc54d9411a0d627261696e2e4576656e743a32"));
  CHECK(tb::session_start_event(t, 7) == from_hex("0900001040fc54d94110073a020801"));
  CHECK(tb::scalar_event(t, 42, "train/loss", 2.5f) ==
        from_hex("0900001040fc54d941102a2a130a110a0a747261696e2f6c6f73731500002040"));
  // A step of two varint bytes (300) and a negative value.
  CHECK(tb::scalar_event(t, 300, "eval/loss", -0.1f) ==
        from_hex("0900001040fc54d94110ac022a120a100a096576616c2f6c6f737315cdccccbd"));
}

TEST_CASE("tensorboard: a framed record decodes back, and a flipped byte is found") {
  const std::string event = tb::scalar_event(1.5, 123456789012LL, "train/grad_norm", 0.75f);
  const std::string file = tb::record(event) + tb::record(tb::file_version_event(2.5));
  REQUIRE(file.size() == 16 + event.size() + 16 + tb::file_version_event(2.5).size());
  const auto records = read_records(file);
  REQUIRE(records);
  REQUIRE(records->size() == 2);
  CHECK((*records)[0] == event);
  const Scalar s = scalar_of((*records)[0]);
  CHECK(s.step == 123456789012LL);
  CHECK(s.tag == "train/grad_norm");
  CHECK(s.value == 0.75f);
  CHECK(std::bit_cast<double>(parse(event).numbers.find(1)->second) == 1.5);
  // One bit of any byte flipped (length, either CRC, the data) fails its record's check.
  for (size_t at = 0; at < 16 + event.size(); ++at) {
    std::string damaged = file;
    damaged[at] ^= 0x10;
    CHECK_MESSAGE(!read_records(damaged), "byte " << at);
  }
  // An empty record (no data) frames too.
  CHECK(read_records(tb::record("")) == std::vector<std::string>{""});
}

TEST_CASE("tensorboard: series names of the metrics keys") {
  CHECK(tb::series_of("loss") == "train/loss");
  CHECK(tb::series_of("rewards_chosen") == "train/rewards_chosen");
  CHECK(tb::series_of("eval_loss") == "eval/loss");
  CHECK(tb::series_of("eval_reward_margin") == "eval/reward_margin");
  CHECK(tb::series_of("ckpt_write_s") == "checkpoint/write_s");
}

TEST_CASE("tensorboard: the writer's file, one scalar per number of each line") {
  TempDir d;
  const std::string dir = d.file("tb/sub");  // made by the writer
  std::string path;
  {
    ft::TensorBoardWriter w(dir, 5);
    path = w.path();
    nlohmann::json step = {{"step", 5},
                           {"loss", 2.25},
                           {"tokens", 4096},
                           {"skipped", false},
                           {"grad_norm", nullptr},
                           {"lr", 3e-4},
                           {"mem_peak_bytes", uint64_t(1) << 40}};
    step["nan"] = std::numeric_limits<double>::quiet_NaN();  // the metrics file's null
    w.write(step);
    w.write({{"step", 6}, {"eval_loss", 2.5}});
    w.write({{"step", 6}, {"ckpt_step", 6}, {"ckpt_bytes", 1000}, {"ckpt_async", true}});
    w.write({{"loss", 1.0}});  // no step: nothing
    // Flushed line by line: all of it is in the file before the writer closes.
    const auto records = read_records(slurp(path));
    REQUIRE(records);
    CHECK(records->size() == 2 + 4 + 1 + 2);
  }
  const std::string name = fs::path(path).filename().string();
  CHECK(name.starts_with("events.out.tfevents."));
  CHECK(name.ends_with(".ft"));
  std::string pid = ".";  // appended, not "." + ...: GCC 12 warns (-Wrestrict) on the sum
  pid += std::to_string(getpid());
  CHECK(name.find(pid + ".") != std::string::npos);

  const auto records = read_records(slurp(path));
  REQUIRE(records);
  REQUIRE(records->size() == 9);
  const Fields version = parse((*records)[0]);
  CHECK(version.bytes.find(3)->second == "brain.Event:2");
  const Fields start = parse((*records)[1]);
  CHECK(start.numbers.find(2)->second == 5u);
  CHECK(parse(start.bytes.find(7)->second).numbers.find(1)->second == 1u);  // START
  std::map<std::string, Scalar> by_tag;
  for (size_t i = 2; i < records->size(); ++i) {
    const Scalar s = scalar_of((*records)[i]);
    by_tag.emplace(s.tag, s);
  }
  REQUIRE(by_tag.size() == 7);
  CHECK(by_tag.at("train/loss").value == 2.25f);
  CHECK(by_tag.at("train/loss").step == 5);
  CHECK(by_tag.at("train/lr").value == float(3e-4));
  CHECK(by_tag.at("train/tokens").value == 4096.0f);
  CHECK(by_tag.at("train/mem_peak_bytes").value == std::ldexp(1.0f, 40));
  CHECK(by_tag.at("eval/loss").value == 2.5f);
  CHECK(by_tag.at("eval/loss").step == 6);
  CHECK(by_tag.at("checkpoint/step").value == 6.0f);
  CHECK(by_tag.at("checkpoint/bytes").value == 1000.0f);
  CHECK(by_tag.count("train/skipped") == 0);
  CHECK(by_tag.count("train/grad_norm") == 0);
  CHECK(by_tag.count("train/nan") == 0);

  // A second process's file sorts after the first (TensorBoard reads them in name order), even
  // when it starts within the same second.
  { ft::TensorBoardWriter again(dir, 7); }
  const std::vector<std::string> names = event_files(dir);
  REQUIRE(names.size() == 2);
  CHECK(names[0] == name);
}

TEST_CASE("tensorboard: a failed write ends the file, and training goes on") {
  TempDir d;
  // The file size limit stands in for a full disk: a write past it fails (EFBIG) instead of
  // raising SIGXFSZ while that is ignored.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  void (*handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 200;  // the header records and a few scalars
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string path;
  {
    ft::TensorBoardWriter w(d.file("tb"), 1);
    path = w.path();
    for (int step = 1; step <= 20; ++step) w.write({{"step", step}, {"loss", 1.0 / step}});
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, handler);
    // The disk has room again: nothing more is written after the record cut short (readers stop
    // there, so nothing after it would be read).
    w.write({{"step", 21}, {"loss", 0.5}});
  }
  const std::string file = slurp(path);
  CHECK(file.size() <= 200);
  // Whole records up to the one cut short.
  size_t at = 0, whole = 0;
  while (file.size() - at >= 12 && file.size() - at >= 16 + read_le(file, at, 8)) {
    at += 16 + read_le(file, at, 8);
    ++whole;
  }
  CHECK(whole >= 3);
  const auto records = read_records(file.substr(0, at));
  REQUIRE(records);
  CHECK(records->size() == whole);
}

TEST_CASE("tensorboard: a folder that cannot hold the file is an error naming the key") {
  TempDir d;
  { std::ofstream(d.file("a_file")) << "x"; }
  try {
    ft::TensorBoardWriter w(d.file("a_file"), 1);
    FAIL("no error");
  } catch (const ft::Error& e) {
    CHECK(std::string(e.what()).find("logging.tensorboard " + d.file("a_file")) == 0);
  }
}
