// Shard writer and reader: round trips (uint16 and uint32 tokens, loss_mask, chunk-sized
// flushes), the .tmp-then-rename protocol, and every validation error naming the file.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/shard.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace ft;

namespace {

// doctest::Contains takes a doctest::String, which has no std::string constructor.
doctest::Contains has(const std::string& s) { return doctest::Contains(s.c_str()); }

ShardAttributes test_attrs(int64_t vocab = 1000) {
  ShardAttributes a;
  a.vocab_size = vocab;
  a.bos_id = 1;
  a.eos_id = 2;
  a.tokenizer_sha256 = std::string(64, 'a');
  return a;
}

std::vector<uint64_t> read_doc_offsets(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "doc_offsets", H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  std::vector<uint64_t> out(H5Sget_simple_extent_npoints(s));
  H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Sclose(s), H5Dclose(d), H5Fclose(f);
  return out;
}

// Edits a finished shard in place with the raw HDF5 API, to make it invalid in one way.
void h5_edit(const std::string& path, void (*edit)(hid_t file)) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  edit(f);
  H5Fclose(f);
}

void set_int_attr(hid_t f, const char* name, int64_t v) {
  H5Adelete(f, name);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a), H5Sclose(s);
}

// A fixed-length (numpy-bytes style) string attribute: the reader must accept it too.
void set_fixed_string_attr(hid_t f, const char* name, const std::string& v) {
  H5Adelete(f, name);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, v.size());
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, v.data());
  H5Aclose(a), H5Sclose(s), H5Tclose(t);
}

void write_simple_shard(const std::string& path, const ShardAttributes& attrs, int n_tokens) {
  ShardWriter w(path, attrs);
  std::vector<int32_t> doc(n_tokens);
  for (int i = 0; i < n_tokens; ++i) doc[i] = i % int(attrs.vocab_size);
  w.add_document(doc);
  w.close();
}

}  // namespace

TEST_CASE("data/shard: round trip with documents, loss_mask and small chunks") {
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  ShardWriter::Options opt;
  opt.loss_mask = true;
  opt.chunk_tokens = 7;  // odd and tiny: many flushes, windows straddle chunks
  std::vector<int32_t> all;
  std::vector<uint8_t> all_mask;
  std::vector<uint64_t> offsets;
  {
    ShardWriter w(path, test_attrs(), opt);
    CHECK(fs::exists(path + ".tmp"));
    CHECK_FALSE(fs::exists(path));
    for (int d = 0; d < 19; ++d) {
      std::vector<int32_t> doc;
      std::vector<uint8_t> mask;
      for (int i = 0; i < 1 + (d * 5) % 11; ++i) {
        doc.push_back((d * 31 + i * 7) % 1000);
        mask.push_back(uint8_t((d + i) % 3 != 0));
      }
      offsets.push_back(all.size());
      all.insert(all.end(), doc.begin(), doc.end());
      all_mask.insert(all_mask.end(), mask.begin(), mask.end());
      w.add_document(doc, &mask);
    }
    CHECK(w.num_tokens() == all.size());
    CHECK(w.num_documents() == 19);
    w.close();
  }
  CHECK(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));

  ShardInfo info = read_shard_info(path);
  CHECK(info.num_tokens == all.size());
  CHECK(info.num_documents == 19);
  CHECK(info.has_loss_mask);
  CHECK(info.token_bytes == 2);
  CHECK(info.attrs.vocab_size == 1000);
  CHECK(info.attrs.bos_id == 1);
  CHECK(info.attrs.eos_id == 2);
  CHECK(info.attrs.tokenizer_sha256 == std::string(64, 'a'));
  CHECK(read_doc_offsets(path) == offsets);

  ShardSet set(dir.path);
  REQUIRE(set.shards().size() == 1);
  for (uint64_t start : {uint64_t(0), uint64_t(5), uint64_t(13)}) {
    const uint64_t count = all.size() - start - 3;
    std::vector<int32_t> tokens(count);
    std::vector<uint8_t> mask(count);
    set.read(0, start, count, tokens.data(), mask.data());
    CHECK(tokens == std::vector<int32_t>(all.begin() + start, all.begin() + start + count));
    CHECK(mask == std::vector<uint8_t>(all_mask.begin() + start, all_mask.begin() + start + count));
  }
}

TEST_CASE("data/shard: uint32 tokens above 65535 and uint16 at the boundary") {
  TempDir dir;
  write_simple_shard(dir.file("a.h5"), test_attrs(65535), 10);
  CHECK(read_shard_info(dir.file("a.h5")).token_bytes == 2);
  TempDir dir32;
  const std::string path = dir32.file("b.h5");
  {
    ShardWriter w(path, test_attrs(70000));
    w.add_document(std::vector<int32_t>{69999, 0, 65536, 1});
    w.close();
  }
  CHECK(read_shard_info(path).token_bytes == 4);
  ShardSet set(dir32.path);
  std::vector<int32_t> t(4);
  std::vector<uint8_t> m(4, 0);
  set.read(0, 0, 4, t.data(), m.data());
  CHECK(t == std::vector<int32_t>{69999, 0, 65536, 1});
  CHECK(m == std::vector<uint8_t>{1, 1, 1, 1});  // no loss_mask: every target trains
}

TEST_CASE("data/shard: an unclosed writer leaves no shard behind") {
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  {
    ShardWriter w(path, test_attrs());
    w.add_document(std::vector<int32_t>{1, 2, 3});
  }
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::exists(path + ".tmp"));
  ShardWriter w(path, test_attrs(100));
  CHECK_THROWS_WITH_AS(w.add_document(std::vector<int32_t>{1, 70000}), has("70000"), Error);
  CHECK_THROWS_AS(w.add_document(std::vector<int32_t>{-1}), Error);
}

TEST_CASE("data/shard: folder errors") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(list_shard_files(dir.file("missing")), has("no such shard folder"), Error);
  CHECK_THROWS_WITH_AS(list_shard_files(dir.path), has("no *.h5"), Error);
  std::ofstream(dir.file("notes.txt")) << "hello";
  std::ofstream(dir.file("shard_00001.h5.tmp")) << "partial";
  CHECK_THROWS_WITH_AS(list_shard_files(dir.path), has("no *.h5"), Error);
  write_simple_shard(dir.file("shard_00001.h5"), test_attrs(), 10);
  write_simple_shard(dir.file("shard_00000.h5"), test_attrs(), 10);
  auto files = list_shard_files(dir.path);
  REQUIRE(files.size() == 2);
  CHECK(fs::path(files[0]).filename() == "shard_00000.h5");  // name order, not creation order
}

TEST_CASE("data/shard: corrupt, truncated and incomplete shards are errors naming the file") {
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  SUBCASE("not HDF5") {
    std::ofstream(path) << "this is not an HDF5 file";
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": cannot open as HDF5"), Error);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path), has(path), Error);
  }
  SUBCASE("truncated") {
    write_simple_shard(path, test_attrs(), 5000);
    fs::resize_file(path, fs::file_size(path) / 2);
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path), Error);
  }
  SUBCASE("missing tokens") {
    write_simple_shard(path, test_attrs(), 10);
    h5_edit(path, [](hid_t f) { H5Ldelete(f, "tokens", H5P_DEFAULT); });
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": dataset 'tokens' is missing"), Error);
  }
  SUBCASE("missing doc_offsets") {
    write_simple_shard(path, test_attrs(), 10);
    h5_edit(path, [](hid_t f) { H5Ldelete(f, "doc_offsets", H5P_DEFAULT); });
    CHECK_THROWS_WITH_AS(read_shard_info(path), has("'doc_offsets' is missing"), Error);
  }
  SUBCASE("missing attribute") {
    write_simple_shard(path, test_attrs(), 10);
    h5_edit(path, [](hid_t f) { H5Adelete(f, "vocab_size"); });
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": attribute 'vocab_size' is missing"),
                         Error);
  }
  SUBCASE("wrong format") {
    write_simple_shard(path, test_attrs(), 10);
    h5_edit(path, [](hid_t f) { set_fixed_string_attr(f, "format", "something-else"); });
    CHECK_THROWS_WITH_AS(read_shard_info(path), has("format is 'something-else'"), Error);
  }
  SUBCASE("fixed-length string attributes are accepted") {
    write_simple_shard(path, test_attrs(), 10);
    h5_edit(path, [](hid_t f) { set_fixed_string_attr(f, "format", "ft-tokens"); });
    CHECK(read_shard_info(path).num_tokens == 10);
  }
  SUBCASE("wrong version") {
    write_simple_shard(path, test_attrs(), 10);
    h5_edit(path, [](hid_t f) { set_int_attr(f, "version", 2); });
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": shard version 2"), Error);
  }
}

TEST_CASE("data/shard: shards of one folder must agree on vocab and tokenizer") {
  TempDir dir;
  write_simple_shard(dir.file("shard_00000.h5"), test_attrs(), 10);
  SUBCASE("vocab") {
    write_simple_shard(dir.file("shard_00001.h5"), test_attrs(2000), 10);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path),
                         has(dir.file("shard_00001.h5") + ": vocab_size 2000 differs"), Error);
  }
  SUBCASE("tokenizer hash") {
    ShardAttributes a = test_attrs();
    a.tokenizer_sha256 = std::string(64, 'b');
    write_simple_shard(dir.file("shard_00001.h5"), a, 10);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path), has(dir.file("shard_00001.h5") + ": tokenizer_sha256"),
                         Error);
  }
}

TEST_CASE("data/shard: a token id >= vocab_size is an error naming file and index") {
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  {
    ShardWriter w(path, test_attrs(100));
    std::vector<int32_t> doc(50, 3);
    doc[37] = 150;  // fits uint16, but not the vocabulary
    w.add_document(doc);
    w.close();
  }
  ShardSet set(dir.path);
  std::vector<int32_t> t(50);
  set.read(0, 0, 37, t.data(), nullptr);  // the window before the bad token is fine
  CHECK_THROWS_WITH_AS(set.read(0, 30, 10, t.data(), nullptr),
                       has(path + ": token id 150 at index 37 is >= vocab_size 100"), Error);
}

TEST_CASE("data/shard: reads across more shards than may be open at once") {
  TempDir dir;
  for (int s = 0; s < 3; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05d.h5", s);
    ShardWriter w(dir.file(name), test_attrs());
    w.add_document(std::vector<int32_t>{s, s + 10, s + 20});
    w.close();
  }
  ShardSet set(dir.path, /*max_open_files=*/1);  // every switch closes the previous one
  CHECK(set.total_tokens() == 9);
  CHECK(set.total_documents() == 3);
  for (int round = 0; round < 2; ++round)
    for (int s : {0, 2, 1, 2, 0}) {
      std::vector<int32_t> t(2);
      set.read(size_t(s), 1, 2, t.data(), nullptr);
      CHECK(t == std::vector<int32_t>{s + 10, s + 20});
    }
}

namespace {

// Replaces dataset `name` with a contiguous uint64 one holding `values`.
void set_u64_dataset(const std::string& path, const char* name, const std::vector<uint64_t>& v) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  H5Ldelete(f, name, H5P_DEFAULT);
  hsize_t n[1] = {v.size()};
  hid_t s = H5Screate_simple(1, n, nullptr);
  hid_t d = H5Dcreate2(f, name, H5T_STD_U64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (!v.empty()) H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Dclose(d), H5Sclose(s), H5Fclose(f);
}

// A shard written with the raw HDF5 API the way other writers (h5py) may store it: `file_type`
// for tokens (e.g. big-endian), and a dataset creation property list for the storage.
void write_raw_shard(const std::string& path, const std::vector<uint16_t>& tokens, hid_t file_type,
                     hid_t dcpl, bool with_mask) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hsize_t n[1] = {tokens.size()};
  hid_t s = H5Screate_simple(1, n, nullptr);
  hid_t d = H5Dcreate2(f, "tokens", file_type, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  REQUIRE(d >= 0);
  H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data());
  H5Dclose(d);
  if (with_mask) {
    std::vector<uint8_t> mask(tokens.size());
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = uint8_t(i % 3 == 1);
    d = H5Dcreate2(f, "loss_mask", H5T_STD_U8LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, mask.data());
    H5Dclose(d);
  }
  H5Sclose(s), H5Fclose(f);
  set_u64_dataset(path, "doc_offsets", {0, 5});
  h5_edit(path, [](hid_t f) {
    set_fixed_string_attr(f, "format", "ft-tokens");
    set_int_attr(f, "version", 1);
    set_int_attr(f, "vocab_size", 1000);
    set_int_attr(f, "bos_id", 1);
    set_int_attr(f, "eos_id", 2);
    set_fixed_string_attr(f, "tokenizer_sha256", std::string(64, 'a'));
  });
}

}  // namespace

TEST_CASE("data/shard: doc_offsets must start at 0, never decrease and stay <= num_tokens") {
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  write_simple_shard(path, test_attrs(), 10);
  SUBCASE("good, with an empty document and one ending the shard") {
    set_u64_dataset(path, "doc_offsets", {0, 4, 4, 10});
    CHECK(read_shard_info(path).num_documents == 4);
  }
  SUBCASE("not starting at 0") {
    set_u64_dataset(path, "doc_offsets", {3, 5});
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": doc_offsets[0] is 3, must be 0"),
                         Error);
  }
  SUBCASE("decreasing") {
    set_u64_dataset(path, "doc_offsets", {0, 6, 5});
    CHECK_THROWS_WITH_AS(read_shard_info(path),
                         has(path + ": doc_offsets[2] = 5 is below doc_offsets[1] = 6"), Error);
  }
  SUBCASE("past the end") {
    set_u64_dataset(path, "doc_offsets", {0, 11});
    CHECK_THROWS_WITH_AS(read_shard_info(path),
                         has(path + ": doc_offsets[1] = 11 is past the end of tokens (10"), Error);
  }
  SUBCASE("empty although there are tokens") {
    set_u64_dataset(path, "doc_offsets", {});
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": doc_offsets is empty"), Error);
  }
  SUBCASE("past the end in a later block of the streamed check") {
    std::vector<uint64_t> offsets(70000, 10);  // more than one 64Ki block
    offsets[0] = 0;
    offsets[69999] = 12;
    set_u64_dataset(path, "doc_offsets", offsets);
    CHECK_THROWS_WITH_AS(read_shard_info(path), has("doc_offsets[69999] = 12 is past the end"),
                         Error);
  }
}

TEST_CASE("data/shard: bos_id and eos_id must be -1 or ids of the vocabulary") {
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  write_simple_shard(path, test_attrs(100), 10);
  SUBCASE("-1 means none") {
    h5_edit(path, [](hid_t f) { set_int_attr(f, "bos_id", -1); });
    CHECK(read_shard_info(path).attrs.bos_id == -1);
  }
  SUBCASE("bos_id == vocab_size") {
    h5_edit(path, [](hid_t f) { set_int_attr(f, "bos_id", 100); });
    CHECK_THROWS_WITH_AS(read_shard_info(path),
                         has(path + ": bos_id 100 is not a token id of the vocabulary (vocab_size "
                                    "100"),
                         Error);
  }
  SUBCASE("eos_id below -1") {
    h5_edit(path, [](hid_t f) { set_int_attr(f, "eos_id", -7); });
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": eos_id -7 is not a token id"), Error);
  }
}

TEST_CASE("data/shard: contiguous, chunked, compressed, compact, big-endian storage read alike") {
  TempDir dir;
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t((i * 37) % 1000);
  hid_t contiguous = H5Pcreate(H5P_DATASET_CREATE);
  hid_t chunked = H5Pcreate(H5P_DATASET_CREATE);
  hsize_t chunk[1] = {64};  // 1000 = 15 * 64 + 40: the last chunk is partly used
  H5Pset_chunk(chunked, 1, chunk);
  hid_t deflate = H5Pcopy(chunked);
  H5Pset_shuffle(deflate);
  H5Pset_deflate(deflate, 4);
  hid_t compact = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_layout(compact, H5D_COMPACT);
  struct Case {
    const char* name;
    hid_t type, dcpl;
    DatasetLayout::Kind kind;
    bool big_endian;
  };
  const Case cases[] = {
      {"contiguous.h5", H5T_STD_U16LE, contiguous, DatasetLayout::Kind::kContiguous, false},
      {"big_endian.h5", H5T_STD_U16BE, contiguous, DatasetLayout::Kind::kContiguous, true},
      {"chunked.h5", H5T_STD_U16LE, chunked, DatasetLayout::Kind::kChunked, false},
      {"chunked_be.h5", H5T_STD_U16BE, chunked, DatasetLayout::Kind::kChunked, true},
      {"deflate.h5", H5T_STD_U16LE, deflate, DatasetLayout::Kind::kLibrary, false},
      {"compact.h5", H5T_STD_U16LE, compact, DatasetLayout::Kind::kLibrary, false},
  };
  for (const Case& c : cases) write_raw_shard(dir.file(c.name), tokens, c.type, c.dcpl, true);
  for (hid_t p : {contiguous, chunked, deflate, compact}) H5Pclose(p);

  ShardSet set(dir.path, /*max_open_files=*/2);
  REQUIRE(set.shards().size() == std::size(cases));
  for (size_t s = 0; s < set.shards().size(); ++s) {
    const ShardInfo& info = set.shards()[s];
    const Case& c = *std::find_if(std::begin(cases), std::end(cases), [&](const Case& k) {
      return fs::path(info.path).filename() == k.name;
    });
    CAPTURE(c.name);
    CHECK(info.tokens.kind == c.kind);
    CHECK(info.tokens.big_endian == c.big_endian);
    CHECK(info.loss_mask.kind == c.kind);
    if (c.kind == DatasetLayout::Kind::kChunked) {
      CHECK(info.tokens.chunk_len == 64);
      CHECK(info.tokens.chunk_offsets.size() == 16);
    }
    // Windows inside one chunk, across chunk borders, the partly used last chunk, everything.
    for (auto [start, count] :
         {std::pair<uint64_t, uint64_t>{0, 1}, {60, 10}, {5, 300}, {950, 50}, {0, 1000}}) {
      std::vector<int32_t> got(count);
      std::vector<uint8_t> mask(count);
      set.read(s, start, count, got.data(), mask.data());
      for (uint64_t i = 0; i < count; ++i) {
        REQUIRE(got[i] == tokens[start + i]);
        REQUIRE(mask[i] == uint8_t((start + i) % 3 == 1));
      }
    }
  }
}

TEST_CASE("data/shard: inputs that crash libhdf5 or make it spin are errors naming the file") {
  TempDir dir;
  const std::string data = std::string(FT_SOURCE_DIR) + "/tests/data/damaged_shards/";
  SUBCASE("SIGSEGV inside libhdf5") {
    const std::string path = dir.file("a.h5");
    fs::copy_file(data + "crash_vlen_attr.h5", path);
    // SIGSEGV in a plain build; under AddressSanitizer its handler reports the fault and aborts
    // (SIGABRT with abort_on_error=1), which is a crash all the same.
    CHECK_THROWS_WITH_AS(read_shard_info(path),
                         has(path + ": damaged: reading it crashed libhdf5 (SIG"), Error);
  }
  SUBCASE("libhdf5 never returns: the time limit") {
    const std::string path = dir.file("b.h5");
    fs::copy_file(data + "spin_global_heap.h5", path);
    setenv("FT_SHARD_CHECK_TIMEOUT_S", "1", 1);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(read_shard_info(path),
                         has(path + ": damaged: reading it with libhdf5 did not finish in 1 s"),
                         Error);
    unsetenv("FT_SHARD_CHECK_TIMEOUT_S");
    // 1 s limit plus 1 s per 50 MiB of file; a few seconds of slack for a loaded machine.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8));
  }
}

TEST_CASE("data/shard: the parent checks every reported offset against the file size") {
  const std::vector<std::string> paths = {"/x/a.h5"};
  auto report = [](const std::string& data_line) {
    return "begin 0\nshard 0 100 1 300 1 2 6162 2 0 0\n" + data_line + "\nend 0\n";
  };
  // 100 uint16 tokens = 200 bytes.
  auto ok =
      detail::parse_shard_report(report("data 0 tokens contiguous 2 0 800 0 0"), paths, {1000});
  REQUIRE(ok.size() == 1);
  CHECK(ok[0].tokens.offset == 800);
  CHECK(ok[0].attrs.tokenizer_sha256 == "ab");
  CHECK_THROWS_WITH_AS(
      detail::parse_shard_report(report("data 0 tokens contiguous 2 0 801 0 0"), paths, {1000}),
      has("/x/a.h5: tokens (200 bytes at offset 801) lies beyond the end of the file (1000"),
      Error);
  // Two chunks of 64 tokens (128 bytes each); the second one runs past the end.
  CHECK(detail::parse_shard_report(report("data 0 tokens chunked 2 0 0 64 2 0 128"), paths, {256})
            .front()
            .tokens.chunk_offsets == std::vector<uint64_t>{0, 128});
  CHECK_THROWS_WITH_AS(
      detail::parse_shard_report(report("data 0 tokens chunked 2 0 0 64 2 0 129"), paths, {256}),
      has("lies beyond the end of the file"), Error);
  CHECK_THROWS_WITH_AS(
      detail::parse_shard_report(report("data 0 tokens chunked 2 0 0 64 1 0"), paths, {256}),
      has("/x/a.h5: the shard check sent a malformed report"), Error);
  CHECK_THROWS_WITH_AS(detail::parse_shard_report("begin 0\nerror 0 6f6f7073\n", paths, {256}),
                       has("oops"), Error);
  CHECK_THROWS_WITH_AS(detail::parse_shard_report("begin 0\n", paths, {256}), has("malformed"),
                       Error);
}

TEST_CASE("data/shard: a loss_mask value other than 0 or 1 is refused where it is read") {
  // A mask of 2 would count that target twice in the loss: a broken writer, never a weight.
  TempDir dir;
  const std::string path = dir.file("shard_00000.h5");
  ShardWriter::Options opt;
  opt.loss_mask = true;
  {
    ShardWriter w(path, test_attrs(), opt);
    const std::vector<int32_t> doc = {5, 6, 7, 8, 9};
    const std::vector<uint8_t> mask = {1, 1, 0, 2, 1};
    w.add_document(doc, &mask);
    w.close();
  }
  ShardSet set(dir.path);
  std::vector<int32_t> tokens(5);
  std::vector<uint8_t> m(5);
  set.read(0, 0, 3, tokens.data(), m.data());  // before the bad value: read as written
  CHECK(m[2] == 0);
  try {
    set.read(0, 0, 5, tokens.data(), m.data());
    FAIL("a loss_mask value of 2 was read");
  } catch (const ft::UsageError& e) {
    CHECK(std::string(e.what()).find("shard_00000.h5: loss_mask value 2 at index 3") !=
          std::string::npos);
  }
}

TEST_CASE("data/shard: preference shards hold pairs with a loss_mask, and never mix with others") {
  TempDir dir;
  ShardAttributes a = test_attrs();
  a.preference = true;
  ShardWriter::Options opt;
  opt.loss_mask = true;
  const std::vector<int32_t> chosen = {1, 5, 6, 7, 2}, rejected = {1, 5, 8, 2};
  const std::vector<uint8_t> mc = {0, 0, 1, 1, 1}, mr = {0, 0, 1, 1};
  {
    ShardWriter w(dir.file("p_0.h5"), a, opt);
    w.add_document(chosen, &mc);
    w.add_document(rejected, &mr);
    w.close();
  }
  ShardSet set(dir.path);
  CHECK(set.attrs().preference);
  CHECK(set.total_documents() == 2);
  std::vector<int32_t> t(9);
  std::vector<uint8_t> m(9);
  set.read(0, 0, 9, t.data(), m.data());
  CHECK(m == std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 0, 1, 1});

  SUBCASE("an odd number of documents") {
    ShardWriter w(dir.file("p_1.h5"), a, opt);
    w.add_document(chosen, &mc);
    w.close();
    CHECK_THROWS_WITH_AS(ShardSet(dir.path), has("1 documents, an odd number"), Error);
  }
  SUBCASE("no loss_mask") {
    CHECK_THROWS_WITH_AS(ShardWriter(dir.file("p_1.h5"), a), has("needs a loss_mask"), Error);
    write_simple_shard(dir.file("p_1.h5"), test_attrs(), 10);
    h5_edit(dir.file("p_1.h5"),
            [](hid_t f) { set_fixed_string_attr(f, "format", "ft-preference"); });
    CHECK_THROWS_WITH_AS(ShardSet(dir.path), has("has no loss_mask dataset"), Error);
  }
  SUBCASE("a token shard beside it") {
    write_simple_shard(dir.file("p_1.h5"), test_attrs(), 10);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path), has("a folder holds one kind of shard"), Error);
  }
}
