// Tokenizer benchmarks (Google Benchmark), single thread, DeepSeek-V3 tokenizer:
//   BM_Encode/{english,code,chinese}: encode throughput (bytes_per_second) on bench/data/*.txt
//   BM_LoadDeepSeekV3: load time of tokenizer.json + tokenizer_config.json (target < 300 ms)
// bench/tokenizer_hf.py measures HF tokenizers on the same files.
//
//   cmake --build build --target tokenizer_bench && build/bench/tokenizer_bench
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FATHOM_CHECK(in.good(), "cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Tokenizer& DeepSeekV3() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromDirectory(FATHOM_BENCH_TOKENIZER_DIR);
    FATHOM_CHECK(t.ok(), "{}", t.status().ToString());
    return std::move(t).value();
  }();
  return *tok;
}

void BM_Encode(benchmark::State& state, const char* file) {
  const Tokenizer& tok = DeepSeekV3();
  const std::string text = ReadFile(std::string(FATHOM_BENCH_DATA_DIR) + "/" + file);
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.Encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes"] = static_cast<double>(text.size());
}
BENCHMARK_CAPTURE(BM_Encode, english, "english.txt")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Encode, code, "code.txt")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Encode, chinese, "chinese.txt")->Unit(benchmark::kMicrosecond);

void BM_LoadDeepSeekV3(benchmark::State& state) {
  for (auto _ : state) {
    auto t = Tokenizer::FromDirectory(FATHOM_BENCH_TOKENIZER_DIR);
    FATHOM_CHECK(t.ok(), "{}", t.status().ToString());
    benchmark::DoNotOptimize(t->get());
  }
}
BENCHMARK(BM_LoadDeepSeekV3)->Unit(benchmark::kMillisecond)->Iterations(5);

}  // namespace
}  // namespace fathom

BENCHMARK_MAIN();
