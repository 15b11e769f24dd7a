// Scheduling policies: the order in which waiting requests start and running requests keep their blocks.
//
//   auto policy = MakePolicy("priority");   // or "fcfs"
//   policy->Before(a, b)                    // true when a runs before b
//   policy->PickVictim(running)             // who is preempted when blocks run out: the one that runs last
//
// To add a policy, subclass SchedulingPolicy and add its name to MakePolicy.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "sched/request.h"

namespace fathom::sched {

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  virtual std::string_view name() const = 0;
  // A strict weak order: true when `a` is scheduled before `b`.
  virtual bool Before(const Request& a, const Request& b) const = 0;
  // The request that runs last in this order (the preemption victim). Requires a non-empty span.
  Request* PickVictim(std::span<Request* const> running) const;
};

// First come, first served: arrival order only.
class FcfsPolicy final : public SchedulingPolicy {
 public:
  std::string_view name() const override { return "fcfs"; }
  bool Before(const Request& a, const Request& b) const override { return a.arrival_order < b.arrival_order; }
};

// Lower priority value first, FCFS within a level. The victim is the lowest-priority, most recently arrived.
class PriorityPolicy final : public SchedulingPolicy {
 public:
  std::string_view name() const override { return "priority"; }
  bool Before(const Request& a, const Request& b) const override {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.arrival_order < b.arrival_order;
  }
};

StatusOr<std::unique_ptr<SchedulingPolicy>> MakePolicy(std::string_view name);

}  // namespace fathom::sched
