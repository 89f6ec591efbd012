// The report the shard check child sends its parent on a pipe (shard_check.cpp), both ways:
// the child writes it (report_*), the parent parses it (detail::parse_shard_report) and checks
// every offset against the size of the file it will pread.
//
// Text lines, one record each, fields separated by one space; strings travel hex-encoded:
//   begin I                     before the child touches file I (so a crash names the file)
//   error I HEX(message)        file I is bad; the child stops here
//   shard I TOKENS DOCS VOCAB BOS EOS HEX(sha256) TOKEN_BYTES HAS_MASK
//   data I tokens|loss_mask contiguous|chunked|library ELEM_BYTES BIG_ENDIAN OFFSET CHUNK_LEN
//        N_CHUNKS CHUNK_OFFSET...                        (one line)
//   end I
// The parent also reads "begin I" as the records arrive: it restarts file I's time limit.
#include <charconv>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "data/shard_internal.h"

namespace ft::detail {
namespace {

std::string hex_encode(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * s.size() + 1);
  for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15];
  return out.empty() ? "-" : out;  // never an empty field
}

const char* layout_name(DatasetLayout::Kind k) {
  switch (k) {
    case DatasetLayout::Kind::kContiguous:
      return "contiguous";
    case DatasetLayout::Kind::kChunked:
      return "chunked";
    case DatasetLayout::Kind::kLibrary:
      return "library";
  }
  return "?";
}

std::string data_record(size_t i, const char* name, const DatasetLayout& l) {
  std::string r =
      concat("data ", i, " ", name, " ", layout_name(l.kind), " ", l.elem_bytes, " ",
             int(l.big_endian), " ", l.offset, " ", l.chunk_len, " ", l.chunk_offsets.size());
  for (uint64_t at : l.chunk_offsets) {
    r += ' ';
    r += std::to_string(at);
  }
  r += '\n';
  return r;
}

}  // namespace

std::string report_begin(size_t i) { return concat("begin ", i, "\n"); }

std::string report_shard(size_t i, const ShardInfo& s) {
  std::string r =
      concat("shard ", i, " ", s.num_tokens, " ", s.num_documents, " ", s.attrs.vocab_size, " ",
             s.attrs.bos_id, " ", s.attrs.eos_id, " ", hex_encode(s.attrs.tokenizer_sha256), " ",
             s.token_bytes, " ", int(s.has_loss_mask), " ", int(s.attrs.preference), "\n");
  r += data_record(i, "tokens", s.tokens);
  if (s.has_loss_mask) r += data_record(i, "loss_mask", s.loss_mask);
  r += concat("end ", i, "\n");
  return r;
}

std::string report_error(size_t i, const std::string& message) {
  return concat("error ", i, " ", hex_encode(message), "\n");
}

std::vector<ShardInfo> parse_shard_report(const std::string& report,
                                          const std::vector<std::string>& paths,
                                          const std::vector<uint64_t>& file_bytes) {
  FT_CHECK(paths.size() == file_bytes.size(), "parse_shard_report: sizes differ");
  std::vector<ShardInfo> out;
  size_t pos = 0, line_no = 0;
  std::vector<std::string_view> f;  // fields of the current line
  auto bad = [&](const std::string& why) -> void {
    const std::string& who = out.size() < paths.size() ? paths[out.size()] : paths.back();
    FT_FAIL(who, ": the shard check sent a malformed report (line ", line_no, ": ", why,
            "); this is a bug in ft, please report it");
  };
  auto next_line = [&]() -> bool {
    if (pos >= report.size()) return false;
    size_t end = report.find('\n', pos);
    if (end == std::string::npos) bad("unterminated line");
    std::string_view line(report.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    f.clear();
    while (!line.empty()) {
      size_t sp = line.find(' ');
      f.push_back(line.substr(0, sp));
      if (sp == std::string_view::npos) break;
      line.remove_prefix(sp + 1);
    }
    return true;
  };
  auto u64 = [&](size_t k) -> uint64_t {
    uint64_t v = 0;
    if (k >= f.size()) bad("missing field");
    auto [p, ec] = std::from_chars(f[k].data(), f[k].data() + f[k].size(), v);
    if (ec != std::errc() || p != f[k].data() + f[k].size() || f[k].empty()) bad("not a number");
    return v;
  };
  auto i64 = [&](size_t k) -> int64_t {
    int64_t v = 0;
    if (k >= f.size()) bad("missing field");
    auto [p, ec] = std::from_chars(f[k].data(), f[k].data() + f[k].size(), v);
    if (ec != std::errc() || p != f[k].data() + f[k].size() || f[k].empty()) bad("not a number");
    return v;
  };
  auto hex = [&](size_t k) -> std::string {
    if (k >= f.size()) bad("missing field");
    std::string_view h = f[k];
    if (h == "-") return {};
    if (h.size() % 2) bad("odd hex string");
    std::string s;
    for (size_t j = 0; j < h.size(); j += 2) {
      auto nib = [&](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        bad("bad hex digit");
        return 0;
      };
      s += char(nib(h[j]) * 16 + nib(h[j + 1]));
    }
    return s;
  };
  auto expect = [&](const char* tag, size_t i, size_t n_fields) {
    if (!next_line()) bad(concat("ended before '", tag, "'"));
    if (f.empty() || f[0] != tag) bad(concat("expected '", tag, "'"));
    if (n_fields && f.size() != n_fields) bad(concat("'", tag, "' has ", f.size(), " fields"));
    if (u64(1) != i) bad("records out of order");
  };
  auto layout = [&](size_t i, const char* name, const ShardInfo& s, int elem_bytes) {
    expect("data", i, 0);
    if (f.size() < 9 || f[2] != name) bad(concat("expected the layout of ", name));
    DatasetLayout l;
    if (f[3] == "contiguous")
      l.kind = DatasetLayout::Kind::kContiguous;
    else if (f[3] == "chunked")
      l.kind = DatasetLayout::Kind::kChunked;
    else if (f[3] == "library")
      l.kind = DatasetLayout::Kind::kLibrary;
    else
      bad("unknown layout");
    l.elem_bytes = int(u64(4));
    if (l.elem_bytes != elem_bytes) bad("element size differs");
    const uint64_t be = u64(5);
    if (be > 1) bad("bad byte-order flag");
    l.big_endian = be == 1;
    l.offset = u64(6);
    l.chunk_len = u64(7);
    const uint64_t chunks = u64(8);
    if (f.size() != 9 + chunks) bad("chunk count differs from the offsets given");
    const uint64_t n = s.num_tokens, eb = uint64_t(elem_bytes), size = s.file_bytes;
    // The bounds the pread path relies on, checked here against the size this process saw.
    auto out_of_file = [&](uint64_t at, uint64_t bytes) {
      FT_FAIL(s.path, ": ", name, " (", bytes, " bytes at offset ", at,
              ") lies beyond the end of the file (", size,
              " bytes); truncated or corrupt shard: re-create it with `ft tokenize`");
    };
    if (l.kind == DatasetLayout::Kind::kContiguous) {
      if (chunks != 0 || l.chunk_len != 0) bad("contiguous data with chunks");
      if (n > 0 && (n > size / eb || l.offset > size || n * eb > size - l.offset))
        out_of_file(l.offset, n * eb);
    } else if (l.kind == DatasetLayout::Kind::kChunked) {
      if (l.chunk_len == 0 || l.chunk_len > (1ull << 32)) bad("bad chunk length");
      if (chunks != n / l.chunk_len + (n % l.chunk_len != 0)) bad("wrong number of chunks");
      const uint64_t chunk_bytes = l.chunk_len * eb;
      l.chunk_offsets.reserve(chunks);
      for (uint64_t k = 0; k < chunks; ++k) {
        const uint64_t at = u64(9 + k);
        if (at > size || chunk_bytes > size - at) out_of_file(at, chunk_bytes);
        l.chunk_offsets.push_back(at);
      }
    } else if (chunks != 0) {
      bad("library data with chunks");
    }
    return l;
  };

  for (size_t i = 0; i < paths.size(); ++i) {
    expect("begin", i, 2);
    if (!next_line()) bad("ended inside a record");
    if (!f.empty() && f[0] == "error") {
      if (f.size() != 3 || u64(1) != i) bad("malformed error");
      const std::string msg = hex(2);
      throw Error(msg.empty() ? paths[i] + ": rejected by the shard check" : msg);
    }
    if (f.size() != 11 || f[0] != "shard" || u64(1) != i) bad("expected 'shard'");
    ShardInfo s;
    s.path = paths[i];
    s.file_bytes = file_bytes[i];
    s.num_tokens = u64(2);
    s.num_documents = u64(3);
    s.attrs.vocab_size = i64(4);
    s.attrs.bos_id = i64(5);
    s.attrs.eos_id = i64(6);
    s.attrs.tokenizer_sha256 = hex(7);
    s.token_bytes = int(u64(8));
    const uint64_t mask = u64(9), preference = u64(10);
    if (preference > 1) bad("preference flag");
    s.attrs.preference = preference == 1;
    if (s.attrs.preference && (mask != 1 || s.num_documents % 2 != 0)) bad("preference shard");
    if (s.token_bytes != 2 && s.token_bytes != 4) bad("token size");
    if (mask > 1) bad("loss_mask flag");
    if (s.attrs.vocab_size < 1 || s.attrs.vocab_size > (int64_t(1) << 31)) bad("vocab_size");
    for (int64_t id : {s.attrs.bos_id, s.attrs.eos_id})
      if (id < -1 || id >= s.attrs.vocab_size) bad("bos/eos id");
    s.has_loss_mask = mask == 1;
    s.tokens = layout(i, "tokens", s, s.token_bytes);
    if (s.has_loss_mask) s.loss_mask = layout(i, "loss_mask", s, 1);
    expect("end", i, 2);
    out.push_back(std::move(s));
  }
  if (next_line()) bad("trailing records");
  return out;
}

}  // namespace ft::detail
