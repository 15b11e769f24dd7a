// The offline benchmark: runs the engine in-process (no HTTP) on a batch of B random prompts of input_len tokens,
// prefilled together, then output_len tokens decoded with ignore_eos; reports prefill and decode throughput, TTFT,
// per-step decode latency, and the decode step's roofline (MBU, MFU, theoretical throughput).
//
//   ModelCosts costs = ComputeModelCosts(cfg, specs, dtypes, model.kv_cache_spec(), backend.activation_dtype());
//   FATHOM_ASSIGN_OR_RETURN(Peaks peaks, ResolvePeaks("cpu", std::nullopt, std::nullopt));
//   OfflineOptions o{.input_len = 32, .output_len = 8};
//   FATHOM_ASSIGN_OR_RETURN(OfflineLevel r, RunOfflineLevel(model, backend, engine_config, costs, peaks, 8, o));
//   r.decode_tokens_per_s, r.roofline.mbu, r.roofline.mfu
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "bench/roofline.h"
#include "bench/stats.h"
#include "core/status.h"
#include "engine/engine_core.h"
#include "model/model.h"

namespace fathom::bench {

struct OfflineOptions {
  int32_t input_len = 32;
  int32_t output_len = 8;  // >= 2: the first token comes from the prefill step
  int32_t warmup = 1;      // warm-up passes (prefill + 2 tokens) before the measured one
  uint64_t seed = 0;       // prompt tokens
  float temperature = 0;   // > 0: sampled (request i seeded with i), so that the step time includes the sampler's
  // Raise the engine's limits to fit the batch: max_num_seqs always; the token budget (one prefill step for the
  // whole batch) and the KV blocks unless the user set them.
  bool fit_token_budget = true;
  bool fit_kv_blocks = true;
  // Prefill every prompt first (a pass of one token each, which leaves the prompts in the prefix cache), then measure
  // on the same prompts: they hit the cache, so the measured pass prefills only each prompt's last partial block, in
  // one step, and every sequence decodes from the first decode step on, where a token budget that chunks the
  // prefills would leave the decode steps with fewer (long contexts at large batches). The level's prefill figures
  // are the first pass's. Needs prefix caching.
  bool prefill_first = false;
  // --synthetic-prefill (implies prefill_first): the prompts are never computed (EngineConfig::synthetic_prefill: the
  // cache holds random rows, prompt-only steps run no forward pass), so that decode can be measured at contexts and
  // batches whose prefill would take far longer (V3.2 at 128k x 32). Decode runs the real kernels over as many rows;
  // the level has no prefill figures and its tokens are garbage.
  bool synthetic_prefill = false;
};

// The token budget of an offline run that fits each level's prefill into one step: the largest batch's prompts, or
// `configured` if that is larger. The memory plan must be made for it (activations grow with the budget), so
// RunOffline plans it before any level runs: a budget whose activations do not fit is then lowered
// (LargestPlannedTokenBudget) or the plan's clear error, never a failed allocation mid-run.
int32_t FittedTokenBudget(int32_t configured, const std::vector<int32_t>& batch_sizes, int32_t input_len);

// A fitted budget's one-step prefill may not fit a smaller GPU's memory (256 x 1k prompts of Qwen-7B need about
// 87 GiB of step activations: the H200 holds them, an 80 GB H100 does not). `plan(budget)` (the memory plan) is tried
// from `fitted` down, halving, while it fails with RESOURCE_EXHAUSTED, down to `configured` (always tried last): the
// largest budget that planned, or the plan's last error. The levels then prefill in chunks of that budget.
StatusOr<int32_t> LargestPlannedTokenBudget(int32_t configured, int32_t fitted,
                                            const std::function<Status(int32_t)>& plan);

// The KV blocks a level of `batch_size` sequences gets where OfflineOptions::fit_kv_blocks: every sequence's prompt
// and output, a spare block each, and one more. RunOffline's memory plan must leave room for the largest level's.
int32_t OfflineKvBlocks(int32_t batch_size, int32_t input_len, int32_t output_len, int32_t block_size);

struct OfflineLevel {
  int32_t batch_size = 0;
  int32_t input_len = 0;
  int32_t output_len = 0;
  double prefill_s = 0;  // from adding the batch to the last first token
  int64_t prefill_steps = 0;
  double prefill_tokens_per_s = 0;
  Summary ttft_s;         // per request
  Summary decode_step_s;  // per decode step: every step after the last sequence's first token
  double decode_s = 0;
  double decode_tokens_per_s = 0;
  // Sequences a decode step held on average: batch_size, unless the prefills ended at different steps (chunked by
  // the token budget: long prompts at large batches), so that the first sequences decoded beside later prefills and
  // some finished before the last one's first token. The decode figures and the roofline are then of this batch.
  double decode_batch_mean = 0;
  bool synthetic_prefill = false;  // OfflineOptions::synthetic_prefill: no prefill figures
  double total_s = 0;
  double forward_s_per_step = 0;     // model execution share of a decode step
  double cpu_s_per_step = 0;         // scheduling, batch building, sampling
  double collective_s_per_step = 0;  // tensor parallelism: rank 0's collectives, inside forward_s_per_step
  int64_t preemptions = 0;
  double prefill_mfu = 0;
  Roofline roofline;  // of the mean decode step
};

StatusOr<OfflineLevel> RunOfflineLevel(Model& model, Backend& backend, const EngineConfig& config,
                                       const ModelCosts& costs, const Peaks& peaks, int32_t batch_size,
                                       const OfflineOptions& o);

}  // namespace fathom::bench
