// The host sampler's cost per row (Google Benchmark, single thread) at DeepSeek-V3's vocabulary (129,280 logits of
// spread like a model's): what the engine thread spends per sampled sequence per step.
//   BM_Sample/{greedy,temperature,top_k_50,top_p_0.9,min_p_0.05,top_k_top_p,logprobs_5}
//
//   cmake --build build --target sampler_bench && build/bench/sampler_bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace fathom {
namespace {

constexpr int64_t kVocab = 129280;

const std::vector<float>& Logits() {
  static const std::vector<float> logits = [] {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 2.5f);
    std::vector<float> v(kVocab);
    for (float& x : v) x = d(rng);
    return v;
  }();
  return logits;
}

void Run(benchmark::State& state, const SamplingParams& p) {
  SamplerRng rng(1);
  for (auto _ : state) benchmark::DoNotOptimize(Sample(Logits(), p, {}, rng));
  state.SetItemsProcessed(state.iterations());
}

void BM_Sample(benchmark::State& state, SamplingParams p) {
  Run(state, p);
}

BENCHMARK_CAPTURE(BM_Sample, greedy, SamplingParams{.temperature = 0.0f});
BENCHMARK_CAPTURE(BM_Sample, temperature, SamplingParams{.temperature = 0.8f});
BENCHMARK_CAPTURE(BM_Sample, top_k_50, SamplingParams{.temperature = 0.8f, .top_k = 50});
BENCHMARK_CAPTURE(BM_Sample, top_p_0 .9, SamplingParams{.temperature = 0.8f, .top_p = 0.9f});
BENCHMARK_CAPTURE(BM_Sample, min_p_0 .05, SamplingParams{.temperature = 0.8f, .min_p = 0.05f});
BENCHMARK_CAPTURE(BM_Sample, top_k_top_p, SamplingParams{.temperature = 0.8f, .top_k = 50, .top_p = 0.9f});
BENCHMARK_CAPTURE(BM_Sample, logprobs_5, SamplingParams{.temperature = 0.8f, .logprobs = true, .top_logprobs = 5});

}  // namespace
}  // namespace fathom

BENCHMARK_MAIN();
