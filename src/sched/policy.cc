#include "sched/policy.h"

#include <fmt/format.h>

namespace fathom::sched {

Request* SchedulingPolicy::PickVictim(std::span<Request* const> running) const {
  FATHOM_CHECK(!running.empty());
  Request* victim = running.front();
  for (Request* r : running) {
    if (Before(*victim, *r)) victim = r;
  }
  return victim;
}

StatusOr<std::unique_ptr<SchedulingPolicy>> MakePolicy(std::string_view name) {
  if (name == "fcfs") return std::unique_ptr<SchedulingPolicy>(std::make_unique<FcfsPolicy>());
  if (name == "priority") return std::unique_ptr<SchedulingPolicy>(std::make_unique<PriorityPolicy>());
  return InvalidArgumentError(fmt::format("unknown scheduling policy '{}' (expected fcfs or priority)", name));
}

}  // namespace fathom::sched
