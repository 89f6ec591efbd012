// doctest's main for every doctest binary (tests/CMakeLists.txt: ft_doctest_main). The data tests
// check shards in a child process, this program started again (data/shard.h): that comes first.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "data/shard.h"

int main(int argc, char** argv) {
  ft::run_shard_check_if_child(argc, argv);
  return doctest::Context(argc, argv).run();
}
