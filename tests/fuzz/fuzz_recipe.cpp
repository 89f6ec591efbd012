// libFuzzer harness for the recipe loader (lib/recipe): YAML text → resolved, validated Recipe.
//
// Contract under test: any bytes, as a recipe file, come back as a RecipeResult — a recipe, or a
// list of issues that each format to one line — without a crash, a sanitizer report, a hang or an
// exception of any kind (load_recipe reports problems; it does not throw). A valid result must
// also print as YAML and load again from that text. The input goes into one memfd opened by path
// through /proc/self/fd, so nothing touches the disk.
//
// Run: scripts/fuzz.sh [SECONDS] recipe  (seeds: tests/fuzz/corpus/recipe/).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/shard.h"
#include "recipe/recipe.h"

namespace {

// Rewrites the memfd with `text` and returns the path that reads it.
const std::string& as_file(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("fuzz_recipe", 0);
  if (fd < 0) std::abort();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0 || (size > 0 && ::pwrite(fd, data, size, 0) != ssize_t(size)))
    std::abort();
  return path;
}

}  // namespace

// A recipe whose data folder exists has its first shard checked, in a child (data/shard.h).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  ft::run_shard_check_if_child(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // world 2: batch divisibility and layout rules run for a real data-parallel world too.
  ft::RecipeResult res = ft::load_recipe(as_file(data, size), {}, 2, true);
  for (const ft::RecipeIssue& i : res.issues) {
    if (i.format().empty()) std::abort();
  }
  if (res.ok()) {
    // A valid recipe round-trips through the YAML ft saves beside every run.
    const std::string yaml = ft::recipe_to_yaml(res.recipe);
    ft::RecipeResult again = ft::load_recipe(
        as_file(reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size()), {}, 2, true);
    if (!again.ok()) std::abort();
  }
  return 0;
}
