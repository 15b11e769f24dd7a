// Runs the libFuzzer target (request_fuzz.cc) over the seed corpus and deterministic mutations of it, so that the
// GCC + ASan/UBSan build exercises the same code the clang fuzzer does.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> Corpus() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(FATHOM_TEST_DATA_DIR "/fuzz/request")) {
    std::ifstream f(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

void Feed(const std::string& s) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(RequestFuzzTest, SeedCorpus) {
  const std::vector<std::string> corpus = Corpus();
  ASSERT_GE(corpus.size(), 5u);
  for (const std::string& s : corpus) Feed(s);
}

TEST(RequestFuzzTest, Mutations) {
  const std::vector<std::string> corpus = Corpus();
  const std::string tokens[] = {"{",
                                "}",
                                "[",
                                "]",
                                ",",
                                ":",
                                "\"",
                                "null",
                                "true",
                                "-1",
                                "1e309",
                                "\\u0000",
                                "\"messages\"",
                                "\"prompt\"",
                                "\"n\"",
                                "\"stop\"",
                                "\"logit_bias\"",
                                "\xff"};
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 20000; ++i) {
    std::string s = corpus[rng() % corpus.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      const size_t pos = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[pos] = static_cast<char>(rng() & 0xff);
          break;
        case 1:
          s.erase(pos, 1 + rng() % 8);
          break;
        case 2:
          s.insert(pos, tokens[rng() % std::size(tokens)]);
          break;
        default:
          s.resize(pos);
          break;
      }
    }
    Feed(s);
  }
}

}  // namespace
