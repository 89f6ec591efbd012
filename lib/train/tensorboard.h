// TensorBoard event files (DESIGN.md §7): the metrics lines of rank 0 as scalar series that
// `tensorboard --logdir DIR` draws, written by hand: no TensorFlow and no protobuf library for a
// few fields of two messages.
//
// A file is a sequence of TFRecords, each
//   length (uint64, little-endian) | masked CRC-32C of those 8 bytes | data | its masked CRC-32C
// where data is an Event message in protobuf's wire format (tensorboard/compat/proto/event.proto
// and summary.proto: Event {1 wall_time double, 2 step int64, 3 file_version string, 5 summary,
// 7 session_log}; Summary {1 repeated value}; Summary.Value {1 tag string, 2 simple_value
// float}; SessionLog {1 status enum, START = 1}). Fields at their proto3 default (a step of 0)
// are left out, as protobuf's own serializers do, so the bytes are protobuf's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace ft {

namespace tensorboard {

// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78, register preset to all ones and
// inverted at the end, as in RFC 3720 §B.4) of n bytes. `crc` continues a CRC: the CRC of a
// piece of data with the CRC of the bytes before it passed is the CRC of the whole.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked CRC-32C, ((crc >> 15) | (crc << 17)) + 0xa282ead8: the stored CRC of data
// that itself holds CRCs (a record inside a record) would otherwise be weak.
uint32_t masked_crc32c(const void* data, size_t n);
// `data` framed as one TFRecord.
std::string record(std::string_view data);

// Serialized Event messages, each with its wall time (Unix seconds).
std::string file_version_event(double wall_time);  // file_version "brain.Event:2", step 0
// session_log {status: START} at `step`: TensorBoard's sign that a job (re)started there. Its
// readers drop the values they have read at or after that step (from earlier files: a run
// resumed from a checkpoint replaces what it trains again).
std::string session_start_event(double wall_time, int64_t step);
// summary {value {tag, simple_value}} at `step`.
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

// The series a key of a metrics line is drawn as: eval_X → eval/X (evaluation lines),
// ckpt_X → checkpoint/X (checkpoint lines), any other → train/X (step lines).
std::string series_of(std::string_view key);

}  // namespace tensorboard

// Rank 0's event file for logging.tensorboard.
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;  // off: writes nothing
  // A new file in `dir` (created if need be), events.out.tfevents.<Unix seconds>.<host>.<pid>.ft
  // as TensorBoard's own writers name theirs, beginning with the file version and a session
  // START at `first_step` (the first step this process trains, from 1).
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  TensorBoardWriter(TensorBoardWriter&& o) noexcept { *this = std::move(o); }
  TensorBoardWriter& operator=(TensorBoardWriter&& o) noexcept;

  // One metrics line (metrics.h: the object the metrics file gets): each number but `step` as a
  // scalar of its series (series_of) at the line's step, then flushed. Booleans, nulls and
  // non-finite numbers (which the metrics file writes as null) have no point.
  void write(const nlohmann::json& line);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& records);

  std::string path_;
  std::FILE* f_ = nullptr;  // null: off, or closed after a failed write
};

}  // namespace ft
