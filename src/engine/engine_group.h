// Data-parallel replicas behind one front (`fathom serve --data-parallel-size N`): N engines, each with its own
// model copy, KV cache and engine thread, and the router that places each request on one of them.
//
//   EngineGroup group({&engine0, &engine1}, {.policy = PlacementPolicy::kPrefix, .devices = {"cuda:0", "cuda:1"}});
//   FATHOM_ASSIGN_OR_RETURN(EngineGroup::Placed placed, group.Submit(request));   // any thread
//   placed.stream->Next(&out);  placed.replica;  placed.reason;                     // "prefix", "least_loaded", ...
//   group.Abort("e-3");                                   // whichever replica holds it
//   EngineStats s = group.replica(1).Stats();             // one replica's; group.Stats() sums them
//
// A single engine is a group of one (no routing). Placement, on the submitting thread under the group's mutex:
// - prefix (the default): the replica most likely to hold the longest cached prefix of the prompt, counted in whole
//   KV blocks. The group keeps its own record of the chained block hashes (kv::ChainBlockHash, as the KV cache
//   computes them) of the prompts it sent to each replica, LRU-bounded by that replica's block count. It is an
//   estimate, as SGLang's router keeps one, because each replica's real cache belongs to its engine thread. A
//   replica more than `balance_slack` live requests busier than the least loaded one loses its affinity; prompts
//   with no recorded prefix go to the least loaded.
// - least-loaded: the fewest live requests (Engine::num_live(): queued, waiting or running), ties taken in turn.
// - round-robin: in turn.
// Engines outlive the group's use of them.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"

namespace fathom {

enum class PlacementPolicy { kPrefix, kLeastLoaded, kRoundRobin };
// "prefix" | "least-loaded" | "round-robin".
StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name);
std::string_view PlacementPolicyName(PlacementPolicy policy);

struct EngineGroupOptions {
  PlacementPolicy policy = PlacementPolicy::kPrefix;
  // Each replica's device ("cpu", "cuda:1"), for metrics and timings; empty: "cpu" for all.
  std::vector<std::string> devices = {};
  // prefix: a replica keeps its affinity unless it has more than this many live requests over the least loaded.
  int32_t balance_slack = 8;
};

class EngineGroup {
 public:
  EngineGroup(std::vector<Engine*> replicas, EngineGroupOptions options = {});
  EngineGroup(const EngineGroup&) = delete;
  EngineGroup& operator=(const EngineGroup&) = delete;

  struct Placed {
    std::shared_ptr<RequestStream> stream;
    int32_t replica = 0;
    // "single", "prefix", "least_loaded", "round_robin", or "overflow" (the chosen replica's queue was full, or it
    // has failed)
    const char* reason = "";
    int32_t matched_blocks = 0;  // prefix: the blocks of the prompt the router expects the replica to hold
  };
  // Places and submits. A failed replica (Engine::failed) is placed last; when the chosen replica's queue is full or
  // it has failed, the others are tried, least loaded first; the errors are Engine::Submit's.
  StatusOr<Placed> Submit(EngineRequest request);
  // Aborts a live request on whichever replica holds it; kNotFound when none does.
  Status Abort(const std::string& id, const std::string& reason = "aborted by the client");

  int32_t size() const { return static_cast<int32_t>(replicas_.size()); }
  Engine& replica(int32_t i) const { return *replicas_[static_cast<size_t>(i)]; }
  const std::string& device(int32_t i) const { return devices_[static_cast<size_t>(i)]; }
  PlacementPolicy policy() const { return options_.policy; }
  // Replica 0's configuration; every replica is built from the same flags.
  const EngineConfig& config() const { return replicas_.front()->config(); }
  // The replicas' stats summed (counts and totals; kv_usage and the hit ratio over all blocks and lookups; the
  // last step's fields from replica 0).
  EngineStats Stats() const;
  // The first failed replica's reason (Engine::failed), naming it; OK while every replica can take requests.
  Status failed() const;
  // Requests placed on each replica since the start.
  std::vector<int64_t> placements() const;

 private:
  // A replica's recorded block hashes, least recently used first.
  struct PrefixRecord {
    std::list<uint64_t> lru;
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index;
    size_t capacity = 0;
    int32_t Match(const std::vector<uint64_t>& hashes) const;
    void Touch(const std::vector<uint64_t>& hashes);
  };
  // The chained hashes of the prompt's whole blocks.
  std::vector<uint64_t> BlockHashes(const EngineRequest& request) const;

  std::vector<Engine*> replicas_;
  EngineGroupOptions options_;
  std::vector<std::string> devices_;
  mutable std::mutex mu_;
  std::vector<PrefixRecord> records_;
  std::vector<int64_t> placed_;
  size_t next_ = 0;  // round-robin cursor, and the tie-break of least-loaded
};

}  // namespace fathom
