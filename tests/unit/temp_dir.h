// A fresh folder under the system temp dir for one unit test, removed with everything in it at
// scope exit.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ft_unit_XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};
