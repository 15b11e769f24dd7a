// A folder under the system's temporary directory, unique to this process and object, removed with everything in it
// when the object goes.
//
//   testing::TempDir dir("fathom_st");
//   WriteFile(dir.file("model.safetensors"), ...);   // <tmp>/fathom_st_<pid>_<n>/model.safetensors
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace fathom::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() /
              (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  static inline std::atomic<int> counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace fathom::testing
