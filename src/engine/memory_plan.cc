#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/bytes.h"
#include "format/linear_method.h"
#include "model/blocks.h"
#include "model/registry.h"

namespace fathom {

std::string MemoryPlan::Describe() const {
  return fmt::format(
      "memory plan{}: {} x {} = {} for fathom; weights and runtime {}; activations for {} batched tokens {}; KV cache "
      "{} = {} tokens at {} per token",
      ranks > 1 ? fmt::format(" per rank ({} tensor-parallel ranks; rank {} has the least room)", ranks, binding_rank)
                : std::string(),
      utilization, FormatBytes(total_bytes), FormatBytes(budget_bytes), FormatBytes(in_use_bytes), max_batched_tokens,
      FormatBytes(activation_bytes), FormatBytes(kv_bytes), kv_tokens, FormatBytes(kv_bytes_per_token));
}

namespace {

int64_t Budget(int64_t total_bytes, double utilization) {
  return static_cast<int64_t>(std::floor(utilization * static_cast<double>(total_bytes)));
}

// The utilization's range, then whether its budget was free at startup.
Status CheckUtilization(int64_t total_bytes, int64_t start_free_bytes, double utilization) {
  if (!(utilization > 0.0 && utilization <= 1.0)) {
    return InvalidArgumentError(fmt::format("--gpu-memory-utilization must be in (0, 1], got {}", utilization));
  }
  const int64_t budget = Budget(total_bytes, utilization);
  if (start_free_bytes >= 0 && start_free_bytes < budget) {
    return ResourceExhaustedError(fmt::format(
        "--gpu-memory-utilization {} asks for {} of the GPU's {}, but only {} was free at startup (other processes "
        "and this one's CUDA context hold {}): {} short. Lower --gpu-memory-utilization or free the GPU",
        utilization, FormatBytes(budget), FormatBytes(total_bytes), FormatBytes(start_free_bytes),
        FormatBytes(total_bytes - start_free_bytes), FormatBytes(budget - start_free_bytes)));
  }
  return OkStatus();
}

}  // namespace

Status CheckBudgetFits(int64_t total_bytes, int64_t free_bytes, int64_t start_free_bytes, double utilization,
                       int64_t weight_bytes) {
  FATHOM_RETURN_IF_ERROR(CheckUtilization(total_bytes, start_free_bytes, utilization));
  const int64_t in_use = start_free_bytes >= 0 ? start_free_bytes - free_bytes : total_bytes - free_bytes;
  const int64_t budget = Budget(total_bytes, utilization) - in_use;
  if (weight_bytes > budget) {
    return ResourceExhaustedError(fmt::format(
        "the weights need {} but {} of the GPU's {} leaves {} ({} already in use): {} short. Use a smaller model or "
        "raise --gpu-memory-utilization",
        FormatBytes(weight_bytes), utilization, FormatBytes(total_bytes), FormatBytes(std::max<int64_t>(budget, 0)),
        FormatBytes(in_use), FormatBytes(weight_bytes - std::max<int64_t>(budget, 0))));
  }
  return OkStatus();
}

StatusOr<MemoryPlan> PlanDeviceMemory(const MemoryPlanInput& in) {
  if (in.total_bytes <= 0 || in.free_bytes < 0 || in.free_bytes > in.total_bytes || in.kv_bytes_per_token <= 0 ||
      in.block_size <= 0 || in.start_free_bytes > in.total_bytes) {
    return InvalidArgumentError(fmt::format("cannot plan device memory: total {} B, free {} B, {} B per token",
                                            in.total_bytes, in.free_bytes, in.kv_bytes_per_token));
  }
  MemoryPlan p;
  p.total_bytes = in.total_bytes;
  p.utilization = in.utilization;
  FATHOM_RETURN_IF_ERROR(CheckUtilization(in.total_bytes, in.start_free_bytes, in.utilization));
  p.budget_bytes = Budget(in.total_bytes, in.utilization);
  // Only this process's use since startup counts against the budget; the budget was free then, so what it leaves
  // is free now too.
  p.in_use_bytes = in.start_free_bytes >= 0 ? std::max<int64_t>(in.start_free_bytes - in.free_bytes, 0)
                                            : in.total_bytes - in.free_bytes;
  p.activation_bytes = in.activation_bytes;
  p.kv_bytes_per_token = in.kv_bytes_per_token;
  p.max_batched_tokens = in.max_batched_tokens;
  const int64_t block_bytes = in.kv_bytes_per_token * in.block_size;
  const int64_t left = p.budget_bytes - p.in_use_bytes - p.activation_bytes;
  if (left < block_bytes) {
    return ResourceExhaustedError(fmt::format(
        "the GPU memory does not fit: {} of {} is {}, the weights and runtime already use {} and one step's "
        "activations for {} batched tokens need {}, which leaves {} for the KV cache, {} short of a single block of "
        "{} tokens ({}). Raise --gpu-memory-utilization, lower --max-num-batched-tokens, or use a smaller model",
        in.utilization, FormatBytes(in.total_bytes), FormatBytes(p.budget_bytes), FormatBytes(p.in_use_bytes),
        in.max_batched_tokens, FormatBytes(p.activation_bytes), FormatBytes(std::max<int64_t>(left, 0)),
        FormatBytes(block_bytes - left), in.block_size, FormatBytes(block_bytes)));
  }
  const int64_t blocks = left / block_bytes;
  p.kv_bytes = blocks * block_bytes;
  p.kv_tokens = blocks * in.block_size;
  if (in.max_model_len > 0 && p.kv_tokens < in.max_model_len) {
    const int64_t need_blocks = (in.max_model_len + in.block_size - 1) / in.block_size;
    return ResourceExhaustedError(fmt::format(
        "the KV cache holds {} tokens ({}), fewer than one request of --max-model-len {} needs: {} more. Raise "
        "--gpu-memory-utilization or lower --max-model-len",
        p.kv_tokens, FormatBytes(p.kv_bytes), in.max_model_len, FormatBytes((need_blocks - blocks) * block_bytes)));
  }
  return p;
}

int64_t ActivationReserveBytes(const ModelConfig& cfg, int64_t max_batched_tokens, int64_t max_seqs) {
  const int64_t h = cfg.hidden_size;
  int64_t inter = cfg.intermediate_size;
  if (cfg.is_moe()) {
    inter = std::max(inter, cfg.moe.moe_intermediate_size * (cfg.moe.num_experts_per_tok + cfg.moe.n_shared_experts));
  }
  // The attention block's share is its family's (an unknown architecture, which no load accepts, counts as GQA).
  const StatusOr<const Architecture*> arch = FindArchitecture(cfg.architecture);
  const AttentionFootprint attn = arch.ok() && (*arch)->attention_footprint != nullptr
                                      ? (*arch)->attention_footprint(cfg)
                                      : GqaAttention::Footprint(cfg);
  const int64_t per_token = 4 * (4 * h + attn.values_per_token + 2 * inter) + 2 * std::max(h, inter);
  const int64_t logits = std::min(max_seqs, max_batched_tokens) * cfg.vocab_size * 4;
  // What the weight format needs beyond the activations to run a prefill-sized linear (block-scaled f8 dequantizes its
  // weight into the workspace as bf16, next to its bf16 input): for the widest weight (a dense MLP's gate or up, or
  // the attention block's widest) and the widest input.
  int64_t scratch = 0;
  if (StatusOr<std::shared_ptr<const LinearMethod>> method = LinearMethodFor(cfg.quant, ""); method.ok()) {
    const int64_t widest_weight = std::max(
        {cfg.intermediate_size * h, attn.widest_weight, cfg.moe.moe_intermediate_size * cfg.moe.n_shared_experts * h});
    scratch =
        (*method)->PrefillScratchBytes(widest_weight, std::max({h, inter, attn.widest_input}), max_batched_tokens);
  }
  const int64_t reserve = max_batched_tokens * per_token + logits + scratch;
  return reserve + reserve / 4 + (288ll << 20);
}

StatusOr<MemoryPlan> PlanDeviceMemoryPerRank(const std::vector<MemoryPlanInput>& per_rank) {
  FATHOM_CHECK(!per_rank.empty());
  std::optional<MemoryPlan> best;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    StatusOr<MemoryPlan> plan = PlanDeviceMemory(per_rank[r]);
    if (!plan.ok()) {
      return per_rank.size() > 1 ? plan.status().WithContext(fmt::format("tensor-parallel rank {}", r)) : plan.status();
    }
    plan->binding_rank = static_cast<int64_t>(r);
    if (!best || plan->kv_bytes < best->kv_bytes) best = *plan;
  }
  best->ranks = static_cast<int64_t>(per_rank.size());
  return *best;
}

}  // namespace fathom
