// Every fuzz target over its corpus (tests/data/fuzz/<name>/) and deterministic mutations of it, so that each build,
// and the asan preset's ASan + UBSan in CI, runs the code the libFuzzer binaries explore. A crash, a sanitizer report
// or a target's __builtin_trap() fails the test; the input that did it is printed first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_targets.h"

namespace fathom::fuzz {
namespace {

std::vector<std::string> Corpus(const std::string& name) {
  std::vector<std::string> out;
  const std::filesystem::path dir = std::filesystem::path(FATHOM_TEST_DATA_DIR) / "fuzz" / name;
  if (!std::filesystem::is_directory(dir)) return out;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());  // the same order, hence the same mutations, everywhere
  for (const auto& path : files) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

// Pieces worth inserting: JSON, HTTP and Jinja syntax, and bytes that are not UTF-8.
const char* const kTokens[] = {"{",
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
                               "\\ud800",
                               "\xff",
                               "\xc3(",
                               "\r\n",
                               "\r\n\r\n",
                               "Content-Length: 5\r\n",
                               "Transfer-Encoding: chunked\r\n",
                               "Connection: close\r\n",
                               "Authorization: bearer fuzz-key\r\n",
                               "{{",
                               "}}",
                               "{%",
                               "%}",
                               "|",
                               "(",
                               ")",
                               "loop",
                               "range(99999)",
                               "\"messages\"",
                               "\"prompt\"",
                               "\"stream\"",
                               "\"n\"",
                               "9223372036854775807",
                               "#safetensors",
                               "\"merges\"",
                               "\"vocab\""};

std::string Mutate(std::string s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < edits; ++k) {
    if (s.empty()) s = "x";
    const size_t pos = rng() % s.size();
    switch (rng() % 6) {
      case 0:
        s[pos] = static_cast<char>(rng() & 0xff);
        break;
      case 1:
        s.erase(pos, 1 + rng() % 8);
        break;
      case 2:
      case 3:
        s.insert(pos, kTokens[rng() % std::size(kTokens)]);
        break;
      case 4: {  // splice in a piece of another input
        const std::string& other = corpus[rng() % corpus.size()];
        if (other.empty()) break;
        const size_t from = rng() % other.size();
        s.insert(pos, other.substr(from, 1 + rng() % 64));
        break;
      }
      default:
        s.resize(pos);
        break;
    }
  }
  return s;
}

struct Case {
  Target target;
  int mutations;
};

class FuzzReplayTest : public ::testing::TestWithParam<Case> {};

void Feed(const Target& t, const std::string& input) {
  // A failing input is printed (escaped) so that it can be added to the corpus and replayed.
  ::testing::ScopedTrace trace(__FILE__, __LINE__, ::testing::PrintToString(input.substr(0, 512)));
  t.fn(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST_P(FuzzReplayTest, CorpusAndMutations) {
  const Case& c = GetParam();
  const std::vector<std::string> corpus = Corpus(c.target.name);
  ASSERT_GE(corpus.size(), 3u) << "tests/data/fuzz/" << c.target.name << " needs seeds";
  for (const std::string& s : corpus) Feed(c.target, s);
  std::mt19937_64 rng(20261202);
  // FATHOM_FUZZ_REPLAY_MUTATIONS overrides the count (0: the corpus alone, e.g. with FATHOM_FUZZ_VERBOSE=1).
  const char* env = std::getenv("FATHOM_FUZZ_REPLAY_MUTATIONS");
  const int mutations = env != nullptr ? std::atoi(env) : c.mutations;
  for (int i = 0; i < mutations; ++i) Feed(c.target, Mutate(corpus[rng() % corpus.size()], corpus, rng));
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplayTest,
                         ::testing::Values(Case{kTargets[0], 1500}, Case{kTargets[1], 20000}, Case{kTargets[2], 3000},
                                           Case{kTargets[3], 1500}, Case{kTargets[4], 8000}, Case{kTargets[5], 3000},
                                           Case{kTargets[6], 20000}, Case{kTargets[7], 100000}),
                         [](const ::testing::TestParamInfo<Case>& p) { return std::string(p.param.target.name); });

}  // namespace
}  // namespace fathom::fuzz
