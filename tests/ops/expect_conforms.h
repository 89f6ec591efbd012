// doctest's side of the harness (op_harness.h): one failed check per failed case, with its line
// (device, op, dtype, shape, the worst element); FT_OPS_VERBOSE=1 prints every case as it ends.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/ops/op_harness.h"

namespace ft::op_test {

// `note` goes after the device's name in the summary line ("SIMT attention").
inline Report expect_conforms(Device& dev, Device& ref, const std::vector<Case>& cases,
                              Options options, const std::string& note = "") {
  const char* v = std::getenv("FT_OPS_VERBOSE");
  if (v && *v && std::strcmp(v, "0") != 0)
    options.on_case = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  const Report r = run_cases(cases, dev, ref, options);
  MESSAGE(r.cases << " cases of " << r.cases_per_op.size() << " ops on " << dev.name()
                  << (note.empty() ? note : ", " + note) << ": " << r.failures.size() << " failed");
  for (const std::string& f : r.failures) FAIL_CHECK(f);
  return r;
}

}  // namespace ft::op_test
