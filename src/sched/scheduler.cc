#include "sched/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

namespace fathom::sched {

namespace {
constexpr std::string_view kQueueFull = "queue full: ";
}  // namespace

Status QueueFullError(int64_t waiting, int64_t max_queue_len) {
  return ResourceExhaustedError(
      fmt::format("{}{} requests are waiting (--max-queue-len {})", kQueueFull, waiting, max_queue_len));
}

bool IsQueueFull(const Status& status) {
  return status.code() == StatusCode::kResourceExhausted && status.message().starts_with(kQueueFull);
}

Scheduler::Scheduler(const SchedulerConfig& config, const kv::KvCacheConfig& kv_config,
                     std::unique_ptr<SchedulingPolicy> policy, NowFn now)
    : config_(config), kv_(kv_config), policy_(std::move(policy)), now_(std::move(now)) {
  FATHOM_CHECK(policy_ != nullptr);
  FATHOM_CHECK(now_ != nullptr);
  FATHOM_CHECK_GT(config_.max_num_batched_tokens, 0);
  FATHOM_CHECK_GT(config_.max_num_seqs, 0);
  FATHOM_CHECK_GT(config_.max_model_len, 0);
}

Status Scheduler::AddRequest(NewRequest nr) {
  if (nr.id.empty()) return InvalidArgumentError("request id is empty");
  if (requests_.count(nr.id) != 0) return AlreadyExistsError(fmt::format("request '{}' already exists", nr.id));
  const int32_t prompt_len = static_cast<int32_t>(nr.prompt.size());
  if (prompt_len == 0) return InvalidArgumentError("the prompt is empty");
  if (nr.max_tokens < 0) return InvalidArgumentError(fmt::format("max_tokens must be >= 0, got {}", nr.max_tokens));
  const int64_t wanted = static_cast<int64_t>(prompt_len) + std::max(nr.max_tokens, 1);
  if (wanted > config_.max_model_len) {
    return InvalidArgumentError(
        fmt::format("this request needs {} tokens ({} in the prompt + {} to generate) but the maximum context length "
                    "(--max-model-len) is {}; shorten the prompt or lower max_tokens",
                    wanted, prompt_len, std::max(nr.max_tokens, 1), config_.max_model_len));
  }
  const int32_t max_tokens = nr.max_tokens > 0 ? nr.max_tokens : config_.max_model_len - prompt_len;
  const int64_t blocks = (static_cast<int64_t>(prompt_len) + max_tokens + kv_.block_size() - 1) / kv_.block_size();
  if (blocks > kv_.num_blocks()) {
    return InvalidArgumentError(fmt::format(
        "this request may need {} KV-cache blocks ({} tokens) but the cache holds only {} blocks of {} tokens", blocks,
        prompt_len + max_tokens, kv_.num_blocks(), kv_.block_size()));
  }
  if (config_.max_queue_len > 0 && num_waiting() >= config_.max_queue_len) {
    return QueueFullError(num_waiting(), config_.max_queue_len);
  }
  auto r = std::make_unique<Request>();
  r->id = std::move(nr.id);
  r->seq_id = next_seq_++;
  r->tokens = std::move(nr.prompt);
  r->prompt_len = prompt_len;
  r->max_tokens = max_tokens;
  r->priority = nr.priority;
  r->cache_salt = nr.cache_salt;
  r->arrival = nr.arrival ? *nr.arrival : now_();
  r->arrival_order = next_arrival_++;
  Request* raw = r.get();
  requests_.emplace(raw->id, std::move(r));
  InsertWaiting(raw);
  return OkStatus();
}

void Scheduler::InsertWaiting(Request* r) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), r,
                             [this](const Request* a, const Request* b) { return policy_->Before(*a, *b); });
  waiting_.insert(it, r);
}

void Scheduler::RemoveFrom(std::vector<Request*>& list, Request* r) {
  auto it = std::find(list.begin(), list.end(), r);
  if (it != list.end()) list.erase(it);
}

void Scheduler::Preempt(Request* r, SchedulerOutput& out) {
  kv_.Free(r->seq_id);
  r->num_computed_tokens = 0;
  r->state = RequestState::kPreempted;
  ++r->num_preemptions;
  ++num_preemptions_;
  RemoveFrom(running_, r);
  InsertWaiting(r);
  out.preempted.push_back(r->id);
  // If it was planned earlier in this step, take it out and give its tokens back.
  auto it = std::find_if(out.seqs.begin(), out.seqs.end(), [r](const ScheduledSeq& s) { return s.request == r; });
  if (it != out.seqs.end()) {
    out.num_batched_tokens -= it->num_new;
    out.seqs.erase(it);
  }
}

// Plans `r` (running) for this step, preempting the policy's victims until its blocks fit. False when `r` itself
// was preempted.
bool Scheduler::ScheduleRunning(Request* r, int32_t& budget, SchedulerOutput& out) {
  const int32_t num_new = std::min(r->num_tokens() - r->num_computed_tokens, budget);
  FATHOM_CHECK_GT(num_new, 0);
  while (!kv_.Allocate(r->seq_id, r->num_computed_tokens + num_new)) {
    Request* victim = policy_->PickVictim(running_);
    const bool self = victim == r;
    const int32_t given_back = [&] {
      for (const ScheduledSeq& s : out.seqs) {
        if (s.request == victim) return s.num_new;
      }
      return 0;
    }();
    Preempt(victim, out);
    budget += given_back;
    if (self) return false;
  }
  out.seqs.push_back({r, r->id, r->num_computed_tokens, num_new, r->num_computed_tokens + num_new == r->num_tokens()});
  out.num_batched_tokens += num_new;
  budget -= num_new;
  return true;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  const TimePoint now = now_();
  // Queue delay: a request that has never started and waited too long fails.
  if (config_.max_queue_delay_ms > 0) {
    const auto limit = std::chrono::milliseconds(config_.max_queue_delay_ms);
    for (size_t i = 0; i < waiting_.size();) {
      Request* r = waiting_[i];
      if (!r->started && now - r->arrival > limit) {
        out.timed_out.push_back(
            {r->id, DeadlineExceededError(
                        fmt::format("request '{}' timed out in queue after {} ms (--max-queue-delay-ms {})", r->id,
                                    std::chrono::duration_cast<std::chrono::milliseconds>(now - r->arrival).count(),
                                    config_.max_queue_delay_ms))});
        waiting_.erase(waiting_.begin() + static_cast<int64_t>(i));
        const std::string id = r->id;  // the key must outlive the erase
        requests_.erase(id);
      } else {
        ++i;
      }
    }
  }

  int32_t budget = config_.max_num_batched_tokens;
  // Running requests: decodes first, then the chunks of prefills in progress, each in policy order.
  std::vector<Request*> order = running_;
  std::stable_sort(order.begin(), order.end(), [this](const Request* a, const Request* b) {
    const bool da = a->num_tokens() - a->num_computed_tokens == 1;
    const bool db = b->num_tokens() - b->num_computed_tokens == 1;
    if (da != db) return da;
    return policy_->Before(*a, *b);
  });
  for (Request* r : order) {
    if (budget <= 0) break;
    if (r->state != RequestState::kRunning) continue;  // preempted earlier in this step
    ScheduleRunning(r, budget, out);
  }

  // Waiting requests start only when nothing had to be preempted (memory is tight otherwise).
  if (out.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && num_running() < config_.max_num_seqs) {
      Request* r = waiting_.front();
      kv::CachedPrefix hit;
      if (kv_.prefix_caching_enabled()) hit = kv_.FindCachedPrefix(r->tokens, r->cache_salt);
      const int32_t computed = hit.num_tokens;
      const int32_t num_new = std::min(r->num_tokens() - computed, budget);
      if (!kv_.Allocate(r->seq_id, computed + num_new, &hit)) break;
      if (!r->started) {
        r->started = true;
        r->first_scheduled = now;
        r->prompt_cache_hit_tokens = computed;
        kv_.RecordLookup(r->prompt_len, computed);
      }
      waiting_.erase(waiting_.begin());
      r->state = RequestState::kRunning;
      r->num_computed_tokens = computed;
      running_.push_back(r);
      out.seqs.push_back({r, r->id, computed, num_new, computed + num_new == r->num_tokens()});
      out.num_batched_tokens += num_new;
      budget -= num_new;
    }
  }
  out.copies = kv_.TakePendingCopies();
  return out;
}

ForwardBatch Scheduler::MakeForwardBatch(const SchedulerOutput& plan) const {
  ForwardBatch batch(kv_.block_size());
  for (const ScheduledSeq& s : plan.seqs) {
    std::span<const int32_t> toks(s.request->tokens.data() + s.num_computed, static_cast<size_t>(s.num_new));
    batch.AddSequence(toks, s.num_computed, kv_.blocks(s.request->seq_id),
                      s.samples ? LogitsMode::kLast : LogitsMode::kNone, kv_.window_blocks(s.request->seq_id));
  }
  return batch;
}

void Scheduler::OnStepDone(const SchedulerOutput& plan) {
  for (const ScheduledSeq& s : plan.seqs) {
    Request* r = s.request;
    FATHOM_CHECK_EQ(r->num_computed_tokens, s.num_computed);
    r->num_computed_tokens += s.num_new;
    kv_.Commit(r->seq_id, r->tokens, r->num_computed_tokens, r->cache_salt);
  }
}

void Scheduler::AppendToken(const std::string& id, int32_t token) {
  auto it = requests_.find(id);
  FATHOM_CHECK(it != requests_.end(), "AppendToken to unknown request '{}'", id);
  it->second->tokens.push_back(token);
}

Status Scheduler::Fork(const std::string& parent_id, const std::string& child_id) {
  auto it = requests_.find(parent_id);
  if (it == requests_.end()) return NotFoundError(fmt::format("no request '{}'", parent_id));
  if (requests_.count(child_id) != 0) return AlreadyExistsError(fmt::format("request '{}' already exists", child_id));
  Request* p = it->second.get();
  if (p->state != RequestState::kRunning || p->num_computed_tokens != p->num_tokens()) {
    return FailedPreconditionError(fmt::format("request '{}' cannot be forked in its current state", parent_id));
  }
  auto c = std::make_unique<Request>(*p);
  c->id = child_id;
  c->seq_id = next_seq_++;
  c->arrival_order = next_arrival_++;
  c->num_preemptions = 0;
  kv_.Fork(p->seq_id, c->seq_id);
  Request* raw = c.get();
  requests_.emplace(child_id, std::move(c));
  running_.push_back(raw);
  return OkStatus();
}

Status Scheduler::Finish(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFoundError(fmt::format("no request '{}'", id));
  Request* r = it->second.get();
  kv_.Free(r->seq_id);
  RemoveFrom(running_, r);
  RemoveFrom(waiting_, r);
  requests_.erase(it);
  return OkStatus();
}

const Request* Scheduler::Find(const std::string& id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats s;
  s.num_waiting = num_waiting();
  s.num_running = num_running();
  s.num_preemptions = num_preemptions_;
  s.kv_usage = kv_.usage();
  s.prefix_cache = kv_.stats();
  return s;
}

}  // namespace fathom::sched
