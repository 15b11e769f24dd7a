// A request as the scheduler sees it: its tokens, how many are in the KV cache, priority and arrival order.
//
//   NewRequest r{.id = "req-1", .prompt = ids, .max_tokens = 16, .priority = 0};
//   FATHOM_RETURN_IF_ERROR(scheduler.AddRequest(std::move(r)));
//
// There are no prefill and decode phases: a request has tokens (prompt + generated) of which
// num_computed_tokens are in the cache; each step computes some of the rest.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace fathom::sched {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
// The scheduler's time source; tests inject a fake clock.
using NowFn = std::function<TimePoint()>;

enum class RequestState { kWaiting, kRunning, kPreempted };

struct NewRequest {
  std::string id = {};
  std::vector<int32_t> prompt = {};
  int32_t max_tokens = 0;                           // 0: up to max_model_len
  int32_t priority = 0;                             // lower runs first
  uint64_t cache_salt = 0;                          // requests with different salts never share cached blocks
  std::optional<TimePoint> arrival = std::nullopt;  // default: now
};

struct Request {
  std::string id;
  kv::SeqId seq_id = -1;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int32_t prompt_len = 0;
  int32_t max_tokens = 0;  // resolved: prompt_len + max_tokens <= max_model_len
  int32_t priority = 0;
  uint64_t cache_salt = 0;
  TimePoint arrival;
  int64_t arrival_order = 0;  // ties in arrival time are broken by submission order
  RequestState state = RequestState::kWaiting;
  int32_t num_computed_tokens = 0;
  bool started = false;  // scheduled at least once; queue-delay limits apply only before
  TimePoint first_scheduled;
  int32_t num_preemptions = 0;
  int32_t prompt_cache_hit_tokens = 0;  // from the first admission
  int32_t parent_index = -1;            // for forks (n > 1): which sample of the parent this is

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - prompt_len; }
  int32_t prompt_cache_miss_tokens() const { return prompt_len - prompt_cache_hit_tokens; }
};

}  // namespace fathom::sched
