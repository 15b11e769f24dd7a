#include "bench/roofline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "bench/peak_probe.h"
#include "core/thread_pool.h"

namespace fathom::bench {

namespace {

double Numel(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

double ModelCosts::WeightBytesPerStep(int64_t batch) const {
  double total = 0;
  for (const Tensor& t : tensors) {
    const double f = std::clamp(t.read_fraction, 0.0, 1.0);
    const double touched = f >= 1.0 ? 1.0 : 1.0 - std::pow(1.0 - f, static_cast<double>(batch));
    total += t.bytes * touched;
  }
  return total;
}

double ModelCosts::PrefillFlops(int64_t batch, int64_t len) const {
  const double l = static_cast<double>(len);
  const double per_seq = 2 * (matmul_params - lm_head_params) * l + 2 * lm_head_params +
                         attention_flops_per_context_token * l * (l + 1) / 2;
  return static_cast<double>(batch) * per_seq;
}

ModelCosts ComputeModelCosts(const ModelConfig& cfg, const std::vector<WeightSpec>& specs,
                             const std::map<std::string, DType>& dtypes, const KvCacheSpec& kv, DType kv_dtype) {
  ModelCosts c;
  std::vector<WeightSpec> resolved = specs;
  for (WeightSpec& s : resolved) {
    if (auto it = dtypes.find(s.name); it != dtypes.end()) s.dtype = it->second;
  }
  const WeightStats st = ComputeWeightStats(resolved, nullptr);
  c.weight_bytes = static_cast<double>(st.total_bytes);
  c.weight_bytes_b1 = st.bytes_read_per_token;
  c.active_params = st.active_params;
  for (const WeightSpec& s : resolved) {
    const double n = Numel(s.shape);
    c.tensors.push_back({n * static_cast<double>(DTypeSize(s.dtype)), s.read_fraction});
    const bool matrix = s.shape.size() >= 2;
    const bool lookup = EndsWith(s.name, "embed_tokens.weight");
    const bool scale = s.name.find("scale") != std::string::npos;
    // A packed 4-bit qweight holds params_per_element weights an element; zeros and group indices hold none.
    if (matrix && !lookup && !scale)
      c.matmul_params += n * static_cast<double>(s.params_per_element) * s.active_fraction;
    if (s.name == "lm_head.weight") c.lm_head_params = n;
  }
  c.kv_bytes_per_token = static_cast<double>(kv.bytes_per_token(kv_dtype));
  c.kv_dtype = std::string(DTypeName(kv_dtype));
  int64_t qk_dim = cfg.head_dim, v_dim = cfg.head_dim;
  if (cfg.is_mla) {
    qk_dim = cfg.mla.qk_nope_head_dim + cfg.mla.qk_rope_head_dim;
    v_dim = cfg.mla.v_head_dim;
  }
  c.attention_flops_per_context_token = 2.0 * static_cast<double>(cfg.num_layers) * static_cast<double>(cfg.num_heads) *
                                        static_cast<double>(qk_dim + v_dim);
  if (cfg.is_mla && cfg.mla.sparse()) {
    KvCacheSpec dense = kv;
    dense.side_dim = 0;
    c.attended_tokens = static_cast<double>(cfg.mla.index_topk);
    c.scan_bytes_per_token = c.kv_bytes_per_token - static_cast<double>(dense.bytes_per_token(kv_dtype));
    c.scan_flops_per_context_token =
        2.0 * static_cast<double>(cfg.num_layers) * static_cast<double>(cfg.mla.index_n_heads * cfg.mla.index_head_dim);
  }
  return c;
}

std::optional<Peaks> KnownGpuPeaks(std::string_view gpu_model) {
  // Most specific first: "GH200" before "H200", "H100 NVL" and "H100 PCIe" before the SXM part's "H100".
  struct Known {
    std::string_view part;  // a substring of the driver's name
    double bandwidth, flops;
    std::string_view bandwidth_what;
  };
  static constexpr Known kKnown[] = {
      {"GH200", 4.0e12, 989e12, "GH200 HBM3, spec sheet (4.9e12 for its HBM3e part)"},
      {"H200", 4.5e12, 989e12, "H200 HBM3e, achievable (measured here; 4.8e12 on the spec sheet)"},
      {"H100 NVL", 3.9e12, 835e12, "H100 NVL HBM3, spec sheet"},
      {"H100 PCIe", 2.0e12, 756e12, "H100 PCIe HBM2e, spec sheet"},
      {"H100", 3.35e12, 989e12, "H100 SXM HBM3, spec sheet"},
      {"H800", 3.35e12, 989e12, "H800 SXM HBM3, spec sheet"},
      {"A100-SXM4-80GB", 2.039e12, 312e12, "A100 SXM 80GB HBM2e, spec sheet"},
      {"A100 80GB PCIe", 1.935e12, 312e12, "A100 PCIe 80GB HBM2e, spec sheet"},
      {"A100", 1.555e12, 312e12, "A100 40GB HBM2, spec sheet"},
  };
  for (const Known& k : kKnown) {
    if (gpu_model.find(k.part) == std::string_view::npos) continue;
    Peaks p;
    p.bandwidth = k.bandwidth;
    p.bandwidth_source = fmt::format("{}: {} (pass --peak-bandwidth to override)", gpu_model, k.bandwidth_what);
    p.flops = k.flops;
    p.flops_source = fmt::format("{}: bf16 dense tensor cores, spec sheet (pass --peak-flops to override)", gpu_model);
    return p;
  }
  return std::nullopt;
}

StatusOr<Peaks> ResolvePeaks(const std::string& device, std::optional<double> bandwidth, std::optional<double> flops,
                             std::string_view gpu_model) {
  if (bandwidth && !(*bandwidth > 0)) return InvalidArgumentError("--peak-bandwidth must be positive");
  if (flops && !(*flops > 0)) return InvalidArgumentError("--peak-flops must be positive");
  Peaks p;
  const bool cuda = device.rfind("cuda", 0) == 0;
  const int threads = DefaultThreadPool().num_threads();
  const std::optional<Peaks> known = cuda ? KnownGpuPeaks(gpu_model) : std::nullopt;
  const std::string unknown =
      gpu_model.empty() ? std::string() : fmt::format(" ({} is not in the table: the H200's figure)", gpu_model);
  if (bandwidth) {
    p.bandwidth = *bandwidth;
    p.bandwidth_source = "--peak-bandwidth";
  } else if (known) {
    p.bandwidth = known->bandwidth;
    p.bandwidth_source = known->bandwidth_source;
  } else if (cuda) {
    p.bandwidth = 4.5e12;
    p.bandwidth_source = "default: H200 HBM3e, achievable (pass --peak-bandwidth for another GPU)" + unknown;
  } else {
    p.bandwidth = MeasureReadBandwidth(DefaultThreadPool(), int64_t{256} << 20);
    p.bandwidth_source = fmt::format("measured: multi-threaded read of 256 MiB, {} threads", threads);
  }
  if (flops) {
    p.flops = *flops;
    p.flops_source = "--peak-flops";
  } else if (known) {
    p.flops = known->flops;
    p.flops_source = known->flops_source;
  } else if (cuda) {
    p.flops = 989e12;
    p.flops_source = "default: H200 bf16 dense tensor cores (pass --peak-flops for another GPU or dtype)" + unknown;
  } else {
    const ProbeResult r = MeasureFmaFlops(DefaultThreadPool());
    p.flops = r.flops;
    p.flops_source = fmt::format("measured: f32 FMA loop ({}), {} threads", r.isa, threads);
  }
  return p;
}

Roofline DecodeRoofline(const ModelCosts& c, const Peaks& p, int64_t batch, double context, double measured_step_s) {
  Roofline r;
  r.batch = batch;
  r.context = context;
  r.weight_bytes = c.WeightBytesPerStep(batch);
  r.kv_bytes = c.KvBytesPerStep(batch, context);
  r.bytes = r.weight_bytes + r.kv_bytes;
  r.flops = static_cast<double>(batch) * c.DecodeFlopsPerToken(context);
  r.arithmetic_intensity = r.bytes > 0 ? r.flops / r.bytes : 0;
  r.step_s = measured_step_s;
  if (measured_step_s > 0) {
    r.achieved_bandwidth = r.bytes / measured_step_s;
    r.achieved_flops = r.flops / measured_step_s;
    r.measured_tokens_per_s = static_cast<double>(batch) / measured_step_s;
  }
  r.mbu = p.bandwidth > 0 ? r.achieved_bandwidth / p.bandwidth : 0;
  r.mfu = p.flops > 0 ? r.achieved_flops / p.flops : 0;
  r.bandwidth_bound_tokens_per_s = r.bytes > 0 ? static_cast<double>(batch) * p.bandwidth / r.bytes : 0;
  r.compute_bound_tokens_per_s = r.flops > 0 ? static_cast<double>(batch) * p.flops / r.flops : 0;
  r.theoretical_tokens_per_s = std::min(r.bandwidth_bound_tokens_per_s, r.compute_bound_tokens_per_s);
  r.bound = r.bandwidth_bound_tokens_per_s <= r.compute_bound_tokens_per_s ? "memory" : "compute";
  return r;
}

}  // namespace fathom::bench
