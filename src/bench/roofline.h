// Roofline arithmetic for `fathom bench --offline`: what one decode step of a batch must read (the weights its tokens
// touch, plus every sequence's KV cache at its context length) and compute (2 FLOPs per active matmul parameter per
// token, plus attention over the context), against peak memory bandwidth and peak FLOP/s.
//
//   ModelCosts c = ComputeModelCosts(cfg, *arch->weight_specs(cfg), /*dtypes=*/{}, kv_spec, DType::kF32);
//   Roofline r = DecodeRoofline(c, peaks, /*batch=*/8, /*context=*/1040, /*measured_step_s=*/0.021);
//   r.mbu, r.mfu, r.theoretical_tokens_per_s (= min(compute-bound, bandwidth-bound))
//
//   FATHOM_ASSIGN_OR_RETURN(Peaks p, ResolvePeaks("cpu", std::nullopt, std::nullopt));   // measured on the CPU
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/model_config.h"
#include "model/model.h"
#include "model/weights.h"

namespace fathom::bench {

struct ModelCosts {
  struct Tensor {
    double bytes = 0;
    double read_fraction = 1;  // of the tensor one token reads (WeightSpec::read_fraction)
  };
  std::vector<Tensor> tensors;    // tied tensors appear twice: a step reads them twice (embedding row, lm_head)
  double weight_bytes = 0;        // stored once
  double weight_bytes_b1 = 0;     // read by one token (ComputeWeightStats' bytes_read_per_token)
  double active_params = 0;       // per token (ComputeWeightStats)
  double matmul_params = 0;       // active parameters of the token's matmuls, lm_head included, embedding excluded
  double lm_head_params = 0;      // computed once per sequence in prefill (only the last row's logits)
  double kv_bytes_per_token = 0;  // all layers, in the KV-cache dtype
  std::string kv_dtype;
  // FLOPs one token spends per token of context: 2 * layers * heads * (qk_head_dim + v_head_dim).
  double attention_flops_per_context_token = 0;
  // Sparse attention (DeepSeek-V3.2): a query reads the side row (its indexer key) of every context token, and the
  // rest of the cache row, and spends the attention FLOPs, only for the attended_tokens it keeps; 0: every token.
  double attended_tokens = 0;
  double scan_bytes_per_token = 0;          // of kv_bytes_per_token: the part read for every context token
  double scan_flops_per_context_token = 0;  // the indexer's scoring: 2 * layers * index_heads * index_head_dim

  double Attended(double context) const { return attended_tokens > 0 ? std::min(context, attended_tokens) : context; }

  // Weight bytes a step of `batch` tokens reads: each tensor's share touched by at least one token,
  // 1 - (1 - read_fraction)^batch (all of a dense matrix; `batch` rows of an embedding; the experts hit).
  double WeightBytesPerStep(int64_t batch) const;
  double KvBytesPerStep(int64_t batch, double context) const {
    return static_cast<double>(batch) *
           (Attended(context) * (kv_bytes_per_token - scan_bytes_per_token) + context * scan_bytes_per_token);
  }
  double DecodeFlopsPerToken(double context) const {
    return 2 * matmul_params + attention_flops_per_context_token * Attended(context) +
           scan_flops_per_context_token * context;
  }
  // A batch of `batch` prompts of `len` tokens: causal attention, logits of the last row only.
  double PrefillFlops(int64_t batch, int64_t len) const;
};

// `dtypes` overrides the spec dtype by tensor name (a checkpoint's real dtypes); `kv_dtype` is the cache's.
ModelCosts ComputeModelCosts(const ModelConfig& cfg, const std::vector<WeightSpec>& specs,
                             const std::map<std::string, DType>& dtypes, const KvCacheSpec& kv, DType kv_dtype);

struct Peaks {
  double bandwidth = 0;  // bytes/s
  std::string bandwidth_source = {};
  double flops = 0;  // FLOP/s
  std::string flops_source = {};
};

// The peaks of a GPU known by its driver's model name (Backend::device_model, "NVIDIA H100 80GB HBM3"): the H200's
// measured HBM read (4.5e12 B/s) and, for the others, their spec sheets' HBM bandwidth and bf16 dense tensor-core
// FLOP/s; nullopt for a GPU not in the table.
std::optional<Peaks> KnownGpuPeaks(std::string_view gpu_model);

// Flags win. Otherwise on CUDA the peaks of `gpu_model` (KnownGpuPeaks), or the H200's (4.5e12 B/s achievable HBM
// bandwidth, 989e12 bf16 dense FLOP/s) for a GPU not in the table, which the sources then name; on the CPU both are
// measured (a multi-threaded read of 256 MiB and an FMA loop on every pool thread).
StatusOr<Peaks> ResolvePeaks(const std::string& device, std::optional<double> bandwidth, std::optional<double> flops,
                             std::string_view gpu_model = {});

struct Roofline {
  int64_t batch = 0;
  double context = 0;               // mean tokens each sequence attends over
  double weight_bytes = 0;          // per step
  double kv_bytes = 0;              // per step
  double bytes = 0;                 // weight + KV
  double flops = 0;                 // per step
  double arithmetic_intensity = 0;  // FLOPs / byte
  double step_s = 0;                // measured
  double achieved_bandwidth = 0;    // bytes / step_s
  double achieved_flops = 0;
  double mbu = 0;                           // achieved_bandwidth / peak
  double mfu = 0;                           // achieved_flops / peak
  double bandwidth_bound_tokens_per_s = 0;  // batch * peak_bw / bytes
  double compute_bound_tokens_per_s = 0;    // batch * peak_flops / flops
  double theoretical_tokens_per_s = 0;      // the smaller of the two
  double measured_tokens_per_s = 0;         // batch / step_s
  std::string bound;                        // "memory" or "compute"
};

Roofline DecodeRoofline(const ModelCosts& c, const Peaks& p, int64_t batch, double context, double measured_step_s);

}  // namespace fathom::bench
