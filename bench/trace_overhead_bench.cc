// Cost of a TraceSpan (src/obs/trace.h), single thread:
//   BM_EmptyLoop: the loop body alone (a compiler barrier), the baseline
//   BM_SpanOff: a TraceSpan while tracing is off (one relaxed load and a branch)
//   BM_SpanOffWithArgs: the same with two Arg() calls (skipped while off)
//   BM_SpanOn: a TraceSpan while tracing is on, every event kept (two clock reads, a mutex, a copy)
//   BM_SpanOnFull: tracing on with the event buffer full: events dropped and counted
//   BM_SteadyClockNow: one clock read, for scale
// Results: bench/results/2026-11-30-trace-overhead.json.
//
//   cmake --build build-rel --target trace_overhead_bench && build-rel/bench/trace_overhead_bench
#include <benchmark/benchmark.h>

#include <chrono>

#include "core/check.h"
#include "obs/trace.h"

namespace fathom::obs {
namespace {

void BM_EmptyLoop(benchmark::State& state) {
  for (auto _ : state) benchmark::ClobberMemory();
}
BENCHMARK(BM_EmptyLoop);

void BM_SpanOff(benchmark::State& state) {
  FATHOM_CHECK(!TracingEnabled());
  for (auto _ : state) {
    TraceSpan span("step", "engine");
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SpanOff);

void BM_SpanOffWithArgs(benchmark::State& state) {
  FATHOM_CHECK(!TracingEnabled());
  int64_t i = 0;
  for (auto _ : state) {
    TraceSpan span("step", "engine");
    span.Arg("batch", i++).Arg("kind", "decode");
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SpanOffWithArgs);

void BM_SpanOn(benchmark::State& state) {
  // Room for every iteration, so that each span is really recorded; rendering happens outside the timed loop.
  FATHOM_CHECK(StartTracing({.max_events = static_cast<size_t>(state.max_iterations) + 16}).ok());
  for (auto _ : state) {
    TraceSpan span("step", "engine");
    benchmark::ClobberMemory();
  }
  const TraceStats stats = GetTraceStats();
  state.counters["recorded"] = static_cast<double>(stats.recorded);
  state.counters["dropped"] = static_cast<double>(stats.dropped);
  (void)StopTracing();
}
BENCHMARK(BM_SpanOn)->Iterations(2'000'000);

void BM_SpanOnFull(benchmark::State& state) {
  FATHOM_CHECK(StartTracing({.max_events = 1}).ok());
  { TraceSpan fill("fill", "bench"); }
  for (auto _ : state) {
    TraceSpan span("step", "engine");
    benchmark::ClobberMemory();
  }
  (void)StopTracing();
}
BENCHMARK(BM_SpanOnFull);

void BM_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_SteadyClockNow);

}  // namespace
}  // namespace fathom::obs

BENCHMARK_MAIN();
