#include "engine/engine_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <span>

#include "core/check.h"
#include "kv/block_pool.h"

namespace fathom {

StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name) {
  if (name == "prefix") return PlacementPolicy::kPrefix;
  if (name == "least-loaded") return PlacementPolicy::kLeastLoaded;
  if (name == "round-robin") return PlacementPolicy::kRoundRobin;
  return InvalidArgumentError(
      fmt::format("--placement-policy '{}' is not known: use prefix, least-loaded or round-robin", name));
}

std::string_view PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kPrefix:
      return "prefix";
    case PlacementPolicy::kLeastLoaded:
      return "least-loaded";
    case PlacementPolicy::kRoundRobin:
      return "round-robin";
  }
  return "?";
}

int32_t EngineGroup::PrefixRecord::Match(const std::vector<uint64_t>& hashes) const {
  int32_t n = 0;
  // Chained hashes: block i can only be cached where blocks 0..i-1 are, so the first miss ends the prefix.
  for (uint64_t h : hashes) {
    if (index.count(h) == 0) break;
    ++n;
  }
  return n;
}

void EngineGroup::PrefixRecord::Touch(const std::vector<uint64_t>& hashes) {
  for (uint64_t h : hashes) {
    auto it = index.find(h);
    if (it != index.end()) {
      lru.splice(lru.end(), lru, it->second);
    } else {
      lru.push_back(h);
      index.emplace(h, std::prev(lru.end()));
    }
  }
  while (lru.size() > capacity) {
    index.erase(lru.front());
    lru.pop_front();
  }
}

EngineGroup::EngineGroup(std::vector<Engine*> replicas, EngineGroupOptions options)
    : replicas_(std::move(replicas)), options_(std::move(options)) {
  FATHOM_CHECK(!replicas_.empty());
  devices_ = options_.devices;
  devices_.resize(replicas_.size(), devices_.empty() ? std::string("cpu") : devices_.back());
  records_.resize(replicas_.size());
  placed_.assign(replicas_.size(), 0);
  for (size_t i = 0; i < replicas_.size(); ++i) {
    int64_t blocks = replicas_[i]->Stats().num_blocks;
    if (blocks <= 0) blocks = replicas_[i]->config().num_blocks;
    records_[i].capacity = static_cast<size_t>(blocks > 0 ? blocks : 65536);
  }
}

std::vector<uint64_t> EngineGroup::BlockHashes(const EngineRequest& request) const {
  std::vector<uint64_t> hashes;
  const int32_t bs = config().block_size;
  if (bs <= 0 || !config().enable_prefix_caching) return hashes;
  const size_t full = request.prompt.size() / static_cast<size_t>(bs);
  hashes.reserve(full);
  uint64_t parent = 0;
  const std::span<const int32_t> prompt(request.prompt);
  for (size_t b = 0; b < full; ++b) {
    parent = kv::ChainBlockHash(parent, prompt.subspan(b * static_cast<size_t>(bs), static_cast<size_t>(bs)),
                                request.cache_salt);
    hashes.push_back(parent);
  }
  return hashes;
}

StatusOr<EngineGroup::Placed> EngineGroup::Submit(EngineRequest request) {
  Placed placed;
  if (replicas_.size() == 1) {
    placed.reason = "single";
    FATHOM_ASSIGN_OR_RETURN(placed.stream, replicas_.front()->Submit(std::move(request)));
    std::lock_guard<std::mutex> lock(mu_);
    ++placed_[0];
    return placed;
  }
  const std::vector<uint64_t> hashes =
      options_.policy == PlacementPolicy::kPrefix ? BlockHashes(request) : std::vector<uint64_t>();
  const size_t n = replicas_.size();
  std::vector<int32_t> load(n);
  for (size_t i = 0; i < n; ++i) {
    // A failed replica is never the least loaded (its failure empties it) and is tried last.
    load[i] = replicas_[i]->failed().ok() ? replicas_[i]->num_live() : std::numeric_limits<int32_t>::max();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The least loaded replica, ties broken in turn from the cursor so that an idle group spreads its requests.
    size_t least = next_ % n;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (next_ + k) % n;
      if (load[i] < load[least]) least = i;
    }
    size_t chosen = least;
    placed.reason = "least_loaded";
    if (options_.policy == PlacementPolicy::kRoundRobin) {
      chosen = next_ % n;
      placed.reason = "round_robin";
    } else if (options_.policy == PlacementPolicy::kPrefix && !hashes.empty()) {
      int32_t best_match = 0;
      size_t best = least;
      for (size_t k = 0; k < n; ++k) {
        const size_t i = (next_ + k) % n;
        if (load[i] > static_cast<int64_t>(load[least]) + options_.balance_slack) continue;  // too busy, or failed
        const int32_t m = records_[i].Match(hashes);
        if (m > best_match || (m == best_match && m > 0 && load[i] < load[best])) {
          best_match = m;
          best = i;
        }
      }
      if (best_match > 0) {
        chosen = best;
        placed.reason = "prefix";
        placed.matched_blocks = best_match;
      }
    }
    next_ = (chosen + 1) % n;
    if (!hashes.empty()) records_[chosen].Touch(hashes);
    ++placed_[chosen];
    placed.replica = static_cast<int32_t>(chosen);
  }
  // A full queue on the chosen replica: the others, least loaded first, before the client hears "queue full".
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return load[a] < load[b]; });
  order.erase(std::find(order.begin(), order.end(), static_cast<size_t>(placed.replica)));
  order.insert(order.begin(), static_cast<size_t>(placed.replica));
  Status last;
  for (size_t i : order) {
    StatusOr<std::shared_ptr<RequestStream>> stream = replicas_[i]->Submit(request);
    if (stream.ok()) {
      if (static_cast<int32_t>(i) != placed.replica) {
        std::lock_guard<std::mutex> lock(mu_);
        --placed_[static_cast<size_t>(placed.replica)];
        ++placed_[i];
        placed.replica = static_cast<int32_t>(i);
        placed.reason = "overflow";
        placed.matched_blocks = 0;
      }
      placed.stream = std::move(stream).value();
      return placed;
    }
    last = stream.status();
    // Full, or failed (or shutting down: then every replica is): the next replica may take it.
    if (last.code() != StatusCode::kResourceExhausted && last.code() != StatusCode::kUnavailable) break;
  }
  return last;
}

Status EngineGroup::failed() const {
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const Status f = replicas_[i]->failed();
    if (!f.ok()) return replicas_.size() == 1 ? f : f.WithContext(fmt::format("replica {}", i));
  }
  return OkStatus();
}

Status EngineGroup::Abort(const std::string& id, const std::string& reason) {
  for (Engine* e : replicas_) {
    if (e->Abort(id, reason).ok()) return OkStatus();
  }
  return NotFoundError(fmt::format("no live request '{}'", id));
}

EngineStats EngineGroup::Stats() const {
  EngineStats sum = replicas_.front()->Stats();
  if (replicas_.size() == 1) return sum;
  int64_t used_blocks = sum.num_blocks - sum.num_free_blocks;
  for (size_t i = 1; i < replicas_.size(); ++i) {
    const EngineStats s = replicas_[i]->Stats();
    sum.num_waiting += s.num_waiting;
    sum.num_running += s.num_running;
    sum.num_blocks += s.num_blocks;
    sum.num_free_blocks += s.num_free_blocks;
    used_blocks += s.num_blocks - s.num_free_blocks;
    sum.prefix_cache_queried_tokens += s.prefix_cache_queried_tokens;
    sum.prefix_cache_hit_tokens += s.prefix_cache_hit_tokens;
    sum.num_preemptions += s.num_preemptions;
    sum.num_steps += s.num_steps;
    sum.num_generated_tokens += s.num_generated_tokens;
    sum.num_graph_steps += s.num_graph_steps;
    sum.total_step_cpu_s += s.total_step_cpu_s;
    sum.total_forward_s += s.total_forward_s;
    sum.total_grammar_mask_s += s.total_grammar_mask_s;
    sum.total_collective_s += s.total_collective_s;
    sum.total_grammar_wait_s += s.total_grammar_wait_s;
  }
  sum.kv_usage = sum.num_blocks > 0 ? static_cast<double>(used_blocks) / static_cast<double>(sum.num_blocks) : 0.0;
  sum.prefix_cache_hit_ratio =
      sum.prefix_cache_queried_tokens > 0
          ? static_cast<double>(sum.prefix_cache_hit_tokens) / static_cast<double>(sum.prefix_cache_queried_tokens)
          : 0.0;
  return sum;
}

std::vector<int64_t> EngineGroup::placements() const {
  std::lock_guard<std::mutex> lock(mu_);
  return placed_;
}

}  // namespace fathom
