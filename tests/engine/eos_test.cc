// EOS ids: generation_config.json wins over config.json when present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/engine_core.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

TEST(EosTokenIdsTest, GenerationConfigWinsOverConfig) {
  const fs::path dir = fs::temp_directory_path() / ("fathom_eos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ModelConfig cfg;
  cfg.eos_token_ids = {2};
  StatusOr<std::vector<int64_t>> none = LoadEosTokenIds(dir.string(), cfg);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, (std::vector<int64_t>{2}));

  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5, 7], "bos_token_id": 1})";
  StatusOr<std::vector<int64_t>> list = LoadEosTokenIds(dir.string(), cfg);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<int64_t>{5, 7}));
  // A config.json path finds the file next to it.
  StatusOr<std::vector<int64_t>> via_file = LoadEosTokenIds((dir / "config.json").string(), cfg);
  ASSERT_TRUE(via_file.ok());
  EXPECT_EQ(*via_file, (std::vector<int64_t>{5, 7}));

  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 9})";
  EXPECT_EQ(*LoadEosTokenIds(dir.string(), cfg), (std::vector<int64_t>{9}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "x"})";
  EXPECT_EQ(LoadEosTokenIds(dir.string(), cfg).status().code(), StatusCode::kDataLoss);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fathom
