// The trace recorder: valid Chrome JSON, span nesting and durations, flow arrows, nothing while off, the event cap.
#include "obs/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace fathom::obs {
namespace {

using nlohmann::json;

// Tracing is process-wide: every test starts from "off".
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TracingEnabled()) (void)StopTracing();
  }
  void TearDown() override {
    if (TracingEnabled()) (void)StopTracing();
  }
};

std::vector<json> EventsWithPhase(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

const json* FindByName(const std::vector<json>& events, const std::string& name) {
  for (const json& e : events) {
    if (e.at("name") == name) return &e;
  }
  return nullptr;
}

void SleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

TEST_F(TraceTest, EmptyTraceIsValidJson) {
  ASSERT_TRUE(StartTracing().ok());
  const json trace = json::parse(StopTracing());
  EXPECT_EQ(trace.at("displayTimeUnit"), "ms");
  EXPECT_TRUE(EventsWithPhase(trace, "X").empty());
  EXPECT_EQ(trace.at("otherData").at("dropped_events"), 0);
  ASSERT_EQ(EventsWithPhase(trace, "M").size() >= 1, true);
  EXPECT_EQ(EventsWithPhase(trace, "M")[0].at("name"), "process_name");
}

TEST_F(TraceTest, NestedSpansHaveNamesDurationsAndContainment) {
  ASSERT_TRUE(StartTracing().ok());
  EXPECT_TRUE(TracingEnabled());
  {
    TraceSpan outer("step", "engine");
    outer.Arg("batch", 3).Arg("kind", "decode");
    SleepMs(2);
    {
      TraceSpan inner("forward", "model");
      SleepMs(5);
    }
    SleepMs(2);
  }
  const json trace = json::parse(StopTracing());
  EXPECT_FALSE(TracingEnabled());
  const std::vector<json> spans = EventsWithPhase(trace, "X");
  ASSERT_EQ(spans.size(), 2u);
  // Sorted by start: the outer span first although it ended last.
  EXPECT_EQ(spans[0].at("name"), "step");
  EXPECT_EQ(spans[0].at("cat"), "engine");
  EXPECT_EQ(spans[1].at("name"), "forward");
  EXPECT_EQ(spans[1].at("cat"), "model");
  const double outer_ts = spans[0].at("ts"), outer_dur = spans[0].at("dur");
  const double inner_ts = spans[1].at("ts"), inner_dur = spans[1].at("dur");
  EXPECT_GE(inner_dur, 5000.0);              // microseconds
  EXPECT_GE(outer_dur, inner_dur + 4000.0);  // the two 2 ms sleeps around it
  EXPECT_LT(outer_dur, 2e6);
  EXPECT_GT(inner_ts, outer_ts);
  EXPECT_LE(inner_ts + inner_dur, outer_ts + outer_dur);
  EXPECT_EQ(spans[0].at("args"), (json{{"batch", 3}, {"kind", "decode"}}));
  EXPECT_FALSE(spans[1].contains("args"));
  EXPECT_EQ(spans[0].at("tid"), spans[1].at("tid"));
  EXPECT_EQ(spans[0].at("pid"), spans[1].at("pid"));
}

TEST_F(TraceTest, NothingIsRecordedWhileOff) {
  ASSERT_FALSE(TracingEnabled());
  {
    TraceSpan span("off", "test");
    EXPECT_FALSE(span.active());
    span.Arg("k", 1).FlowOut("request", 1);
    TraceInstant("off_instant", "test");
    TraceFlowStart("request", "flow", 5);
    TraceCounter("off_counter", "test", 1);
  }
  EXPECT_EQ(GetTraceStats().recorded, 0u);
  // A span begun while off stays off even if tracing starts before it ends.
  auto* early = new TraceSpan("early", "test");
  ASSERT_TRUE(StartTracing().ok());
  { TraceSpan late("late", "test"); }
  delete early;
  const json trace = json::parse(StopTracing());
  const std::vector<json> spans = EventsWithPhase(trace, "X");
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].at("name"), "late");
  // And nothing after the stop.
  { TraceSpan after("after", "test"); }
  TraceInstant("after_instant", "test");
  EXPECT_EQ(GetTraceStats().recorded, 0u);
  EXPECT_FALSE(GetTraceStats().on);
}

TEST_F(TraceTest, FlowArrowsLinkSpansOnDifferentThreads) {
  ASSERT_TRUE(StartTracing().ok());
  const uint64_t id = NewTraceFlowId();
  EXPECT_NE(id, 0u);
  EXPECT_NE(NewTraceFlowId(), id);
  std::thread http([&] {
    SetTraceThreadName("http");
    TraceSpan s("handle_request", "server");
    s.FlowOut("request", id);
  });
  http.join();
  std::thread engine([&] {
    SetTraceThreadName("engine");
    {
      TraceSpan s("prefill", "engine");
      TraceFlowStep("request", "flow", id);
    }
    TraceSpan s("decode", "engine");
    s.FlowIn("request", id);
  });
  engine.join();
  const json trace = json::parse(StopTracing());
  const std::vector<json> starts = EventsWithPhase(trace, "s");
  const std::vector<json> steps = EventsWithPhase(trace, "t");
  const std::vector<json> finishes = EventsWithPhase(trace, "f");
  ASSERT_EQ(starts.size(), 1u);
  ASSERT_EQ(steps.size(), 1u);
  ASSERT_EQ(finishes.size(), 1u);
  EXPECT_EQ(starts[0].at("id"), id);
  EXPECT_EQ(steps[0].at("id"), id);
  EXPECT_EQ(finishes[0].at("id"), id);
  EXPECT_EQ(starts[0].at("name"), finishes[0].at("name"));
  EXPECT_EQ(starts[0].at("cat"), finishes[0].at("cat"));
  EXPECT_EQ(finishes[0].at("bp"), "e");

  // Each arrow end lies inside the span it binds to, on that span's thread.
  const std::vector<json> spans = EventsWithPhase(trace, "X");
  const json* handle = FindByName(spans, "handle_request");
  const json* decode = FindByName(spans, "decode");
  ASSERT_NE(handle, nullptr);
  ASSERT_NE(decode, nullptr);
  EXPECT_NE(handle->at("tid"), decode->at("tid"));
  EXPECT_EQ(starts[0].at("tid"), handle->at("tid"));
  EXPECT_EQ(finishes[0].at("tid"), decode->at("tid"));
  const double s_ts = starts[0].at("ts"), f_ts = finishes[0].at("ts");
  EXPECT_GE(s_ts, handle->at("ts").get<double>());
  EXPECT_LE(s_ts, handle->at("ts").get<double>() + handle->at("dur").get<double>());
  EXPECT_GE(f_ts, decode->at("ts").get<double>());
  EXPECT_LE(f_ts, decode->at("ts").get<double>() + decode->at("dur").get<double>());
  EXPECT_LT(s_ts, f_ts);

  // Thread names as metadata, keyed by the same tids.
  int named = 0;
  for (const json& m : EventsWithPhase(trace, "M")) {
    if (m.at("name") != "thread_name") continue;
    if (m.at("args").at("name") == "http") {
      EXPECT_EQ(m.at("tid"), handle->at("tid"));
      ++named;
    }
    if (m.at("args").at("name") == "engine") {
      EXPECT_EQ(m.at("tid"), decode->at("tid"));
      ++named;
    }
  }
  EXPECT_EQ(named, 2);
}

TEST_F(TraceTest, InstantsCountersAndEscaping) {
  ASSERT_TRUE(StartTracing().ok());
  TraceInstant("pre\"empt\n\\", "sched", {{"seq", 7}, {"why", "kv \"full\""}});
  TraceCounter("queue_length", "sched", 4);
  TraceComplete(std::string("bad utf8 \xff"), "x", TraceNowNs(), 1500);
  const std::string text = StopTracing();
  const json trace = json::parse(text);  // throws on invalid JSON
  const std::vector<json> instants = EventsWithPhase(trace, "i");
  ASSERT_EQ(instants.size(), 1u);
  EXPECT_EQ(instants[0].at("name"), "pre\"empt\n\\");
  EXPECT_EQ(instants[0].at("s"), "t");
  EXPECT_EQ(instants[0].at("args").at("why"), "kv \"full\"");
  const std::vector<json> counters = EventsWithPhase(trace, "C");
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].at("args").at("value"), 4.0);
  const std::vector<json> spans = EventsWithPhase(trace, "X");
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].at("dur"), 1.5);  // ns precision kept: 1500 ns = 1.5 us
}

TEST_F(TraceTest, EventCapDropsAndCounts) {
  ASSERT_TRUE(StartTracing({.max_events = 10}).ok());
  for (int i = 0; i < 25; ++i) TraceSpan s("s", "cap");
  TraceStats stats = GetTraceStats();
  EXPECT_TRUE(stats.on);
  EXPECT_EQ(stats.recorded, 10u);
  EXPECT_EQ(stats.dropped, 15u);
  const json trace = json::parse(StopTracing());
  EXPECT_EQ(EventsWithPhase(trace, "X").size(), 10u);
  EXPECT_EQ(trace.at("otherData").at("dropped_events"), 15);
  // A new window starts empty with a fresh count.
  ASSERT_TRUE(StartTracing({.max_events = 10}).ok());
  stats = GetTraceStats();
  EXPECT_EQ(stats.recorded, 0u);
  EXPECT_EQ(stats.dropped, 0u);
}

TEST_F(TraceTest, CapHoldsUnderConcurrentWriters) {
  ASSERT_TRUE(StartTracing({.max_events = 1000}).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 500; ++i) TraceSpan s("w", "mt");
    });
  }
  for (auto& th : threads) th.join();
  const TraceStats stats = GetTraceStats();
  EXPECT_EQ(stats.recorded, 1000u);
  EXPECT_EQ(stats.dropped, 1000u);
  EXPECT_EQ(EventsWithPhase(json::parse(StopTracing()), "X").size(), 1000u);
}

TEST_F(TraceTest, SecondStartFailsWhileOn) {
  ASSERT_TRUE(StartTracing().ok());
  const Status again = StartTracing();
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
  (void)StopTracing();
  EXPECT_TRUE(StartTracing().ok());
}

TEST_F(TraceTest, StopToFileWritesTheJson) {
  const std::string path = ::testing::TempDir() + "/fathom_trace_test.json";
  ASSERT_TRUE(StartTracing().ok());
  { TraceSpan s("to_file", "test"); }
  ASSERT_TRUE(StopTracingToFile(path).ok());
  std::ifstream in(path);
  const json trace = json::parse(in);
  ASSERT_NE(FindByName(EventsWithPhase(trace, "X"), "to_file"), nullptr);
  std::remove(path.c_str());
  ASSERT_TRUE(StartTracing().ok());
  EXPECT_FALSE(StopTracingToFile("/nonexistent-dir/trace.json").ok());
}

}  // namespace
}  // namespace fathom::obs
