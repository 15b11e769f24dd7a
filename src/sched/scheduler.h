// The continuous-batching scheduler: every step picks which requests compute how many tokens, under a token budget
// and a sequence limit, over the paged KV cache; it preempts (frees and later recomputes) when blocks run out.
//
//   Scheduler s(config, kv_config, std::make_unique<PriorityPolicy>(), SteadyClock::now);
//   FATHOM_RETURN_IF_ERROR(s.AddRequest({.id = "a", .prompt = ids, .max_tokens = 16}));  // queue full -> 429
//   SchedulerOutput plan = s.Schedule();           // decodes first, then prefill chunks; timeouts reported
//   ForwardBatch batch = s.MakeForwardBatch(plan);  // copy plan.copies' blocks first (copy-on-write)
//   ... model.Forward(batch, kv, &logits) ...
//   s.OnStepDone(plan);                             // num_computed_tokens advance, full blocks get cached
//   s.AppendToken("a", next);                       // for each plan seq with samples
//   s.Finish("a");                                  // frees its blocks at once; Abort(id) does the same
//
// Not thread-safe: one thread (the engine thread) owns the scheduler and its KV bookkeeping.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/kv_cache_manager.h"
#include "model/forward_batch.h"
#include "sched/policy.h"
#include "sched/request.h"

namespace fathom::sched {

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;  // tokens per step, all sequences together
  int32_t max_num_seqs = 256;             // running sequences
  int32_t max_model_len = 4096;           // prompt + generated tokens of one request
  int32_t max_queue_len = 0;              // waiting requests; 0: unlimited
  int64_t max_queue_delay_ms = 0;         // how long a request may wait before it starts; 0: forever
};

struct ScheduledSeq {
  Request* request = nullptr;  // valid until the request is finished or aborted
  std::string id;
  int32_t num_computed = 0;  // tokens in the cache before this step
  int32_t num_new = 0;       // tokens computed this step: tokens[num_computed, num_computed + num_new)
  bool samples = false;      // this step reaches the end of the known tokens: its logits give the next token
};

struct TimedOut {
  std::string id;
  Status status;  // kDeadlineExceeded, "timed out in queue"
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;  // decodes first, then prefill chunks
  int32_t num_batched_tokens = 0;
  std::vector<kv::BlockCopy> copies;   // copy-on-write copies to do before the forward step
  std::vector<std::string> preempted;  // requests sent back to the queue this step
  std::vector<TimedOut> timed_out;     // requests removed from the queue this step
  bool empty() const { return seqs.empty(); }
};

struct SchedulerStats {
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  int64_t num_preemptions = 0;
  double kv_usage = 0.0;
  kv::PrefixCacheStats prefix_cache;
};

// The admission rejection of a full queue (kResourceExhausted), made in one place so that every layer above can tell
// it from other exhaustion (device memory): the server answers it 429 with Retry-After and counts it as queue_full.
Status QueueFullError(int64_t waiting, int64_t max_queue_len);
bool IsQueueFull(const Status& status);

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const kv::KvCacheConfig& kv_config, std::unique_ptr<SchedulingPolicy> policy,
            NowFn now);

  // Admission control: kInvalidArgument when the request can never fit (prompt + max_tokens > max_model_len, or
  // more blocks than the pool has), kResourceExhausted "queue full" when max_queue_len requests already wait,
  // kAlreadyExists for a duplicate id.
  Status AddRequest(NewRequest request);
  SchedulerOutput Schedule();
  ForwardBatch MakeForwardBatch(const SchedulerOutput& plan) const;
  // Advances num_computed_tokens of the planned sequences and caches their full blocks.
  void OnStepDone(const SchedulerOutput& plan);
  void AppendToken(const std::string& id, int32_t token);
  // `child_id` becomes a running copy of `parent_id` sharing its blocks (n > 1 sampling). The parent must have all
  // its tokens computed but the last; children get their own sampled token with AppendToken.
  Status Fork(const std::string& parent_id, const std::string& child_id);
  // Removes a request in any state and frees its blocks. kNotFound for an unknown id.
  Status Finish(const std::string& id);
  Status Abort(const std::string& id) { return Finish(id); }

  const Request* Find(const std::string& id) const;
  bool HasUnfinished() const { return !requests_.empty(); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  SchedulerStats Stats() const;
  const SchedulerConfig& config() const { return config_; }
  const kv::KvCacheManager& kv() const { return kv_; }
  const SchedulingPolicy& policy() const { return *policy_; }

 private:
  void InsertWaiting(Request* r);
  void Preempt(Request* r, SchedulerOutput& out);
  bool ScheduleRunning(Request* r, int32_t& budget, SchedulerOutput& out);
  void RemoveFrom(std::vector<Request*>& list, Request* r);

  SchedulerConfig config_;
  kv::KvCacheManager kv_;
  std::unique_ptr<SchedulingPolicy> policy_;
  NowFn now_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::vector<Request*> waiting_;  // kept in policy order
  std::vector<Request*> running_;  // admission order
  int64_t next_arrival_ = 0;
  kv::SeqId next_seq_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace fathom::sched
