// MaskBench-style figures for the grammar engine over the JSON schema corpus (tests/data/jsonschema): for each
// schema, the compile time (JSON Schema -> grammar -> automata), then random walks under its masks (the corpus
// test's walks: tests/grammar/schema_walk.h), timing every token mask. Prints one JSON object: acceptance, compile
// p50/p99, mask average/p50/p99/max, at the vocabulary of each tokenizer directory given.
//
//   grammar_bench TOKENIZER_DIR [TOKENIZER_DIR ...] [--seeds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/schema_walk.h"
#include "grammar/vocab_text.h"
#include "tokenizer/tokenizer.h"

using namespace fathom;
using namespace fathom::grammar;

namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  int seeds = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--seeds" && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
    } else {
      dirs.push_back(argv[i]);
    }
  }
  std::vector<nlohmann::ordered_json> schemas;
  {
    std::ifstream in(std::string(FATHOM_BENCH_SCHEMAS));
    std::string line;
    while (std::getline(in, line)) schemas.push_back(nlohmann::ordered_json::parse(line));
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const std::string& dir : dirs) {
    auto tok = Tokenizer::FromDirectory(dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), tok.status().ToString().c_str());
      return 1;
    }
    const auto t_vocab = std::chrono::steady_clock::now();
    auto vocab = VocabFromTokenizer(**tok);
    const double vocab_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_vocab).count();
    std::vector<double> compile_ms, mask_us, first_mask_us;
    int accepted = 0, walks = 0, finished = 0;
    for (size_t k = 0; k < schemas.size(); ++k) {
      std::fprintf(stderr, "\r%s: schema %zu/%zu", dir.c_str(), k + 1, schemas.size());
      const auto t0 = std::chrono::steady_clock::now();
      auto g = JsonSchemaToGrammar(schemas[k]["schema"], JsonSchemaOptions{});
      StatusOr<std::shared_ptr<const CompiledGrammar>> c =
          g.ok() ? Compile(*g, CompileOptions{}) : StatusOr<std::shared_ptr<const CompiledGrammar>>(g.status());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!c.ok()) continue;
      ++accepted;
      compile_ms.push_back(ms);
      auto cache = std::make_shared<GrammarCache>(*c, vocab);  // a fresh cache a schema: no warm start
      for (int seed = 0; seed < seeds; ++seed) {
        GrammarMatcher m(cache);
        WalkResult r = RandomWalk(m, static_cast<uint64_t>(seed), WalkOptions{});
        ++walks;
        finished += r.finished;
        if (!r.mask_us.empty() && seed == 0) first_mask_us.push_back(r.mask_us[0]);
        mask_us.insert(mask_us.end(), r.mask_us.begin(), r.mask_us.end());
      }
    }
    std::fprintf(stderr, "\n");
    double sum = 0;
    for (double v : mask_us) sum += v;
    out.push_back({{"tokenizer", dir},
                   {"vocab_tokens", vocab->size()},
                   {"vocab_build_ms", vocab_ms},
                   {"schemas", schemas.size()},
                   {"accepted", accepted},
                   {"accepted_fraction", static_cast<double>(accepted) / schemas.size()},
                   {"compile_ms_p50", Percentile(compile_ms, 0.5)},
                   {"compile_ms_p99", Percentile(compile_ms, 0.99)},
                   {"compile_ms_max", Percentile(compile_ms, 1.0)},
                   {"walks", walks},
                   {"walks_finished", finished},
                   {"masks", mask_us.size()},
                   {"mask_us_avg", mask_us.empty() ? 0 : sum / mask_us.size()},
                   {"mask_us_p50", Percentile(mask_us, 0.5)},
                   {"mask_us_p99", Percentile(mask_us, 0.99)},
                   {"mask_us_max", Percentile(mask_us, 1.0)},
                   {"first_mask_us_p50", Percentile(first_mask_us, 0.5)}});
  }
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
