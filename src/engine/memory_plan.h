// The device memory plan: how a GPU's memory splits between the weights (already loaded), one step's activations
// and the KV cache, decided before serving; and a clear error, with the shortfall, when something does not fit.
//
//   MemoryPlanInput in;                        // device totals, --gpu-memory-utilization, model sizes
//   in.activation_bytes = ActivationReserveBytes(cfg, max_num_batched_tokens, max_num_seqs);
//   FATHOM_ASSIGN_OR_RETURN(MemoryPlan plan, PlanDeviceMemory(in));
//   FATHOM_LOG_INFO("{}", plan.Describe());   // ... KV cache 109.9 GiB = 1,027,584 tokens ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace fathom {

struct MemoryPlanInput {
  int64_t total_bytes = 0;  // the device's memory
  int64_t free_bytes = 0;   // free now, with the weights loaded
  // Free when fathom started (after creating its CUDA context), before the weights. Other processes' memory then
  // does not count against fathom's budget, as with vLLM's per-instance --gpu-memory-utilization, but the budget
  // must have been free. < 0: unknown, and all memory in use counts as fathom's.
  int64_t start_free_bytes = -1;
  double utilization = 0.9;        // the share of total_bytes this instance may use (--gpu-memory-utilization)
  int64_t activation_bytes = 0;    // one step's activations and kernel workspaces
  int64_t max_batched_tokens = 0;  // for the messages
  int64_t kv_bytes_per_token = 0;  // K and V of every layer
  int64_t block_size = 16;
  int64_t max_model_len = 0;  // one request of this many tokens must fit
};

struct MemoryPlan {
  int64_t total_bytes = 0;
  int64_t budget_bytes = 0;  // utilization x total
  int64_t in_use_bytes = 0;  // weights and library workspaces: start_free - free (or total - free) at planning time
  int64_t activation_bytes = 0;
  int64_t kv_bytes = 0;   // whole blocks only
  int64_t kv_tokens = 0;  // the most tokens the KV cache holds (all sequences together)
  int64_t kv_bytes_per_token = 0;
  int64_t max_batched_tokens = 0;
  double utilization = 0.9;
  // Tensor parallelism: the ranks planned (each on its own device, each holding the same blocks), and the one whose
  // memory sets the cache's size.
  int64_t ranks = 1;
  int64_t binding_rank = 0;

  std::string Describe() const;
};

// Fails with kResourceExhausted, naming what does not fit and by how many bytes, when the budget was not free at
// startup, when it is already spent by the weights and activations, or when the KV cache would hold fewer than
// max_model_len tokens.
StatusOr<MemoryPlan> PlanDeviceMemory(const MemoryPlanInput& in);

// One plan per tensor-parallel rank's device (rank r: per_rank[r]); every rank's cache has the same blocks, so the
// rank with the least room sets the KV bytes (a rank's error names it).
StatusOr<MemoryPlan> PlanDeviceMemoryPerRank(const std::vector<MemoryPlanInput>& per_rank);

// Before the weights load: kResourceExhausted when utilization x total was not free at startup (other processes
// hold it) or cannot hold `weight_bytes`. start_free_bytes < 0: only total - free_bytes counts as in use.
Status CheckBudgetFits(int64_t total_bytes, int64_t free_bytes, int64_t start_free_bytes, double utilization,
                       int64_t weight_bytes);

// A conservative reserve for one forward step of `max_batched_tokens` tokens and `max_seqs` logits rows with
// float32 activations: the per-token activations of a layer (residual, norms, q/k/v, attention output, MLP
// intermediates), the bf16 staging buffer of the GEMMs, the logits, the attention split-K workspace (256 MiB) and
// cuBLASLt's (32 MiB), plus a quarter for the allocator's size classes.
int64_t ActivationReserveBytes(const ModelConfig& cfg, int64_t max_batched_tokens, int64_t max_seqs);

}  // namespace fathom
