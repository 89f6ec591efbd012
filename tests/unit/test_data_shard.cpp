// Shard writer and reader: round trips (uint16 and uint32 tokens, loss_mask, chunk-sized
// flushes), the .tmp-then-rename protocol, and every validation error naming the file.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/shard.h"

namespace fs = std::filesystem;
using namespace ft;

namespace {

// doctest::Contains takes a doctest::String, which has no std::string constructor.
doctest::Contains has(const std::string& s) { return doctest::Contains(s.c_str()); }

struct ShardTestDir {
  fs::path path;
  ShardTestDir() {
    std::string tmpl = (fs::temp_directory_path() / "ft_test_shard_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~ShardTestDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

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
  ShardTestDir dir;
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

  ShardSet set(dir.path.string());
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
  ShardTestDir dir;
  write_simple_shard(dir.file("a.h5"), test_attrs(65535), 10);
  CHECK(read_shard_info(dir.file("a.h5")).token_bytes == 2);
  ShardTestDir dir32;
  const std::string path = dir32.file("b.h5");
  {
    ShardWriter w(path, test_attrs(70000));
    w.add_document(std::vector<int32_t>{69999, 0, 65536, 1});
    w.close();
  }
  CHECK(read_shard_info(path).token_bytes == 4);
  ShardSet set(dir32.path.string());
  std::vector<int32_t> t(4);
  std::vector<uint8_t> m(4, 0);
  set.read(0, 0, 4, t.data(), m.data());
  CHECK(t == std::vector<int32_t>{69999, 0, 65536, 1});
  CHECK(m == std::vector<uint8_t>{1, 1, 1, 1});  // no loss_mask: every target trains
}

TEST_CASE("data/shard: an unclosed writer leaves no shard behind") {
  ShardTestDir dir;
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
  ShardTestDir dir;
  CHECK_THROWS_WITH_AS(list_shard_files(dir.file("missing")), has("no such shard folder"), Error);
  CHECK_THROWS_WITH_AS(list_shard_files(dir.path.string()), has("no *.h5"), Error);
  std::ofstream(dir.file("notes.txt")) << "hello";
  std::ofstream(dir.file("shard_00001.h5.tmp")) << "partial";
  CHECK_THROWS_WITH_AS(list_shard_files(dir.path.string()), has("no *.h5"), Error);
  write_simple_shard(dir.file("shard_00001.h5"), test_attrs(), 10);
  write_simple_shard(dir.file("shard_00000.h5"), test_attrs(), 10);
  auto files = list_shard_files(dir.path.string());
  REQUIRE(files.size() == 2);
  CHECK(fs::path(files[0]).filename() == "shard_00000.h5");  // name order, not creation order
}

TEST_CASE("data/shard: corrupt, truncated and incomplete shards are errors naming the file") {
  ShardTestDir dir;
  const std::string path = dir.file("shard_00000.h5");
  SUBCASE("not HDF5") {
    std::ofstream(path) << "this is not an HDF5 file";
    CHECK_THROWS_WITH_AS(read_shard_info(path), has(path + ": cannot open as HDF5"), Error);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path.string()), has(path), Error);
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
  ShardTestDir dir;
  write_simple_shard(dir.file("shard_00000.h5"), test_attrs(), 10);
  SUBCASE("vocab") {
    write_simple_shard(dir.file("shard_00001.h5"), test_attrs(2000), 10);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path.string()),
                         has(dir.file("shard_00001.h5") + ": vocab_size 2000 differs"), Error);
  }
  SUBCASE("tokenizer hash") {
    ShardAttributes a = test_attrs();
    a.tokenizer_sha256 = std::string(64, 'b');
    write_simple_shard(dir.file("shard_00001.h5"), a, 10);
    CHECK_THROWS_WITH_AS(ShardSet(dir.path.string()),
                         has(dir.file("shard_00001.h5") + ": tokenizer_sha256"), Error);
  }
}

TEST_CASE("data/shard: a token id >= vocab_size is an error naming file and index") {
  ShardTestDir dir;
  const std::string path = dir.file("shard_00000.h5");
  {
    ShardWriter w(path, test_attrs(100));
    std::vector<int32_t> doc(50, 3);
    doc[37] = 150;  // fits uint16, but not the vocabulary
    w.add_document(doc);
    w.close();
  }
  ShardSet set(dir.path.string());
  std::vector<int32_t> t(50);
  set.read(0, 0, 37, t.data(), nullptr);  // the window before the bad token is fine
  CHECK_THROWS_WITH_AS(set.read(0, 30, 10, t.data(), nullptr),
                       has(path + ": token id 150 at index 37 is >= vocab_size 100"), Error);
}

TEST_CASE("data/shard: reads across more shards than may be open at once") {
  ShardTestDir dir;
  for (int s = 0; s < 3; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05d.h5", s);
    ShardWriter w(dir.file(name), test_attrs());
    w.add_document(std::vector<int32_t>{s, s + 10, s + 20});
    w.close();
  }
  ShardSet set(dir.path.string(), /*max_open_files=*/1);  // every switch closes the previous one
  CHECK(set.total_tokens() == 9);
  CHECK(set.total_documents() == 3);
  for (int round = 0; round < 2; ++round)
    for (int s : {0, 2, 1, 2, 0}) {
      std::vector<int32_t> t(2);
      set.read(size_t(s), 1, 2, t.data(), nullptr);
      CHECK(t == std::vector<int32_t>{s + 10, s + 20});
    }
}
