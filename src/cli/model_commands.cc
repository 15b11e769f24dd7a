#include "cli/model_commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "cli/cli_util.h"
#include "cli/engine_setup.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "model/v4_hybrid.h"

namespace fathom {

namespace {

struct ModelOptions {
  std::string model;
  std::string device = "cpu";
  std::string load_format = "auto";
  int block_size = 16;
  int threads = 0;
  uint64_t seed = 0;
  std::string kv_cache_dtype = "auto";
  ParallelOptions parallel;
};

void AddModelOptions(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--model", o.model, "Model folder (config.json + safetensors)")->required();
  cmd->add_option("--device", o.device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--load-format", o.load_format, "auto | safetensors | dummy (random weights, no checkpoint)")
      ->capture_default_str();
  cmd->add_option("--block-size", o.block_size, "Tokens per KV-cache block")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (default: FATHOM_NUM_THREADS or all cores)");
  cmd->add_option("--weights-seed", o.seed, "Seed of dummy weights")->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                  "auto (float32 on the CPU, bfloat16 on CUDA) | float32 | bfloat16 | float16 | fp8")
      ->capture_default_str();
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;            // null in a worker process
  std::unique_ptr<ParallelWorker> worker;  // an mpirun process other than the first (engine/engine_builder.h)
};

StatusOr<Loaded> LoadForRun(const ModelOptions& o) {
  if (o.threads > 0) SetDefaultThreadCount(o.threads);
  if (o.block_size <= 0) return InvalidArgumentError("--block-size must be positive");
  FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(o.model));
  FATHOM_ASSIGN_OR_RETURN(LoadFormat format, ParseLoadFormat(o.load_format));
  Loaded l;
  FATHOM_ASSIGN_OR_RETURN(l.backend, MakeBackend(o.device));
  LoadOptions lo;
  lo.format = format;
  lo.seed = o.seed;
  FATHOM_ASSIGN_OR_RETURN(ParallelModel p,
                          LoadParallelModel(o.parallel, o.device, ModelFolder(o.model), cfg, lo, *l.backend));
  l.model = std::move(p.model);
  l.worker = std::move(p.worker);
  return l;
}

// Identity block table 0..n-1 over a pool just large enough for `tokens` tokens.
StatusOr<KvCache> AllocateFor(Loaded& l, int64_t tokens, const ModelOptions& o, std::vector<int32_t>* table) {
  const int block_size = o.block_size;
  FATHOM_ASSIGN_OR_RETURN(const DType kv_dtype, ParseKvCacheDtype(o.kv_cache_dtype, l.backend->kv_cache_dtype()));
  const int64_t blocks = std::max<int64_t>(1, (tokens + block_size - 1) / block_size);
  table->resize(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) (*table)[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return KvCache::Allocate(*l.backend, l.model->kv_cache_spec(), kv_dtype, blocks, block_size);
}

Status RunLogits(const ModelOptions& o, const std::string& tokens_arg, const std::string& output) {
  FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ParseTokenList(tokens_arg));
  FATHOM_ASSIGN_OR_RETURN(Loaded l, LoadForRun(o));
  if (l.worker) return RunParallelWorker(*l.worker);
  std::vector<int32_t> table;
  FATHOM_ASSIGN_OR_RETURN(KvCache kv, AllocateFor(l, static_cast<int64_t>(tokens.size()), o, &table));
  ForwardBatch batch(o.block_size);
  batch.AddSequence(tokens, 0, table, LogitsMode::kAll);
  Tensor logits;
  FATHOM_RETURN_IF_ERROR(l.model->Forward(batch, kv, &logits));
  const int64_t vocab = l.model->config().vocab_size;
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  FATHOM_RETURN_IF_ERROR(l.backend->CopyToHost(logits, host.data()));
  nlohmann::json j;
  j["tokens"] = tokens;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t t = 0; t < tokens.size(); ++t) {
    rows.push_back(std::vector<float>(host.begin() + static_cast<int64_t>(t) * vocab,
                                      host.begin() + static_cast<int64_t>(t + 1) * vocab));
  }
  j["logits"] = std::move(rows);
  const std::string text = JsonText(j);
  if (output.empty() || output == "-") {
    std::cout << text << "\n";
  } else {
    std::ofstream out(output);
    if (!out) return InternalError(fmt::format("cannot write '{}'", output));
    out << text << "\n";
    if (!out) return InternalError(fmt::format("short write to '{}'", output));
  }
  return OkStatus();
}

std::string HumanCount(double v) {
  if (v >= 1e9) return fmt::format("{:.2f} B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} K", v / 1e3);
  return fmt::format("{:.0f}", v);
}

std::string HumanBytes(double v) {
  if (v >= 1e9) return fmt::format("{:.2f} GB", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} MB", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} KB", v / 1e3);
  return fmt::format("{:.0f} B", v);
}

// DeepSeek-V4: its layer kinds, the cache rows each takes in fathom's layout (model/v4_hybrid.h), and one sequence's
// cache at 8k, 128k and 1M tokens in blocks of 16 tokens: the entries, which grow with the context, and the window
// rows of the newest window_tokens tokens, which do not.
void PrintV4Attention(const ModelConfig& cfg, const KvCacheSpec& kv, DType kv_dtype) {
  const V4Config& v = cfg.v4;
  int64_t count[3] = {0, 0, 0};
  for (V4Attention k : v.attention) ++count[static_cast<int>(k)];
  std::cout << fmt::format(
      "v4 attention:      {} sliding, {} compressed sparse (an entry per {} tokens, the indexer's top {} of {} heads x "
      "{}), {} heavily compressed (an entry per {} tokens); window {}; mHC {} streams\n",
      count[0], count[1], v.csa_rate, v.index_topk, v.index_n_heads, v.index_head_dim, count[2], v.hca_rate,
      v.sliding_window, v.hc_mult);
  const int64_t hd = cfg.head_dim, ihd = v.index_head_dim, bs = 16;
  const V4RowLayout swa = V4RowLayout::For(V4Attention::kSliding, hd, ihd);
  const V4RowLayout csa = V4RowLayout::For(V4Attention::kCsa, hd, ihd);
  const V4RowLayout hca = V4RowLayout::For(V4Attention::kHca, hd, ihd);
  std::cout << fmt::format(
      "kv cache rows:     window rows of {} / {} / {} values a token (sliding / compressed sparse / heavily "
      "compressed: the key and the compressors' inputs), kept for the newest {} tokens; entry rows of {} values a {} "
      "tokens (compressed sparse: the entry and the indexer's key) and {} a {} tokens (heavily compressed)\n",
      swa.width, csa.width, hca.width, kv.window_tokens, csa.entry_width, v.csa_rate, hca.entry_width, v.hca_rate);
  const int64_t es = static_cast<int64_t>(DTypeSize(kv_dtype));
  const int64_t ring = ((kv.window_tokens + bs - 1) / bs + 1) * bs;  // window tokens kept: the window and a block
  for (const int64_t len : {int64_t{8192}, int64_t{131072}, int64_t{1} << 20}) {
    // Each kind's layers: their window rows (a ring of `ring` tokens at most) and their entries, in whole blocks.
    int64_t kind_bytes[3] = {0, 0, 0}, entries = 0, window = 0;
    for (int64_t l = 0; l < kv.num_layers; ++l) {
      const int64_t w = std::min(ring, (len + bs - 1) / bs * bs) * kv.layer_window_dim(l) * es;
      const int64_t e = (len + bs - 1) / bs * kv.layer_slots(l, bs) * kv.layer_k_dim(l) * es;
      kind_bytes[static_cast<int>(v.attention[static_cast<size_t>(l)])] += w + e;
      window += w;
      entries += e;
    }
    std::cout << fmt::format(
        "kv at {:>7} tokens: {} a sequence: {} sliding, {} compressed sparse, {} heavily compressed ({} of entries, "
        "{} of window rows)\n",
        len, HumanBytes(static_cast<double>(entries + window)), HumanBytes(static_cast<double>(kind_bytes[0])),
        HumanBytes(static_cast<double>(kind_bytes[1])), HumanBytes(static_cast<double>(kind_bytes[2])),
        HumanBytes(static_cast<double>(entries)), HumanBytes(static_cast<double>(window)));
  }
}

Status RunInspect(const ModelOptions& o, const std::string& kv_dtype_name) {
  FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(o.model));
  FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(cfg.architecture));
  FATHOM_ASSIGN_OR_RETURN(LoadFormat format, ParseLoadFormat(o.load_format));
  FATHOM_ASSIGN_OR_RETURN(const std::vector<WeightSpec> specs, arch->weight_specs(cfg));
  if (o.parallel.tensor_parallel_size > 1) {
    // The layout must split (the same errors a load gives).
    const ParallelConfig par{.tp_size = o.parallel.tensor_parallel_size,
                             .expert_parallel = o.parallel.enable_expert_parallel};
    FATHOM_RETURN_IF_ERROR(arch->weight_specs(cfg, par).status());
  }
  std::unique_ptr<WeightStore> store;
  CpuBackend cpu;
  if (format != LoadFormat::kDummy) {
    // Opens the checkpoint (mmap, no copy) and checks every tensor against the config.
    LoadOptions lo;
    lo.format = format;
    lo.show_progress = false;
    FATHOM_ASSIGN_OR_RETURN(store, LoadWeights(o.model, specs, lo, cpu));
  }
  FATHOM_ASSIGN_OR_RETURN(const DType kv_dtype, ParseKvCacheDtype(kv_dtype_name, cfg.dtype));
  const WeightStats st = ComputeWeightStats(specs, store.get());
  const KvCacheSpec kv = arch->kv_cache_spec(cfg);
  const int64_t kv_bytes = kv.bytes_per_token(kv_dtype);

  std::cout << fmt::format("architecture:      {} (model_type {})\n", cfg.architecture, cfg.model_type);
  std::cout << fmt::format("weights:           {}\n", format == LoadFormat::kDummy ? "dummy (not allocated)" : o.model);
  std::cout << fmt::format("layers:            {}  hidden {}  intermediate {}  vocab {}\n", cfg.num_layers,
                           cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
  std::cout << fmt::format("attention:         {} heads, {} kv heads, head_dim {}, rope {} (theta {})\n", cfg.num_heads,
                           cfg.num_kv_heads, cfg.head_dim, RopeTypeName(cfg.rope.type), cfg.rope.theta);
  if (cfg.mla.sparse()) {
    std::cout << fmt::format(
        "sparse attention:  a lightning indexer of {} heads x {} keeps the top {} cached tokens a query ({} indexer "
        "values a token and layer in the kv cache)\n",
        cfg.mla.index_n_heads, cfg.mla.index_head_dim, cfg.mla.index_topk, kv.side_dim);
  }
  if (cfg.is_v4) PrintV4Attention(cfg, kv, kv_dtype);
  if (cfg.quant.quantized()) {
    std::cout << fmt::format("quantization:      {} ({}){}\n", cfg.quant.Describe(), cfg.quant.source,
                             cfg.quant.method == "awq" || cfg.quant.method == "gptq"
                                 ? "; i32 below is the packed 4-bit weights and zeros, f16 holds the scales"
                                 : "");
  }
  std::cout << fmt::format("parameters:        {} ({})\n", HumanCount(static_cast<double>(st.total_params)),
                           st.total_params);
  std::cout << fmt::format("active parameters: {} per token ({:.0f})\n", HumanCount(st.active_params),
                           st.active_params);
  if (st.draft_params > 0) {
    std::cout << fmt::format(
        "mtp layers:        {} more parameters ({}), {} of weights: {} multi-token-prediction layer(s), loaded for "
        "speculative decoding, not counted above\n",
        HumanCount(static_cast<double>(st.draft_params)), st.draft_params,
        HumanBytes(static_cast<double>(st.draft_bytes)), cfg.num_nextn_predict_layers);
  }
  for (const auto& [dt, bytes] : st.bytes_by_dtype) {
    std::cout << fmt::format("bytes {:<12} {} ({})\n", std::string(DTypeName(dt)) + ":",
                             HumanBytes(static_cast<double>(bytes)), bytes);
  }
  std::cout << fmt::format("kv cache:          {} bytes per token ({}, {} values per token{})\n", kv_bytes,
                           DTypeName(kv_dtype), kv.values_per_token(),
                           kv_dtype == DType::kF8E4M3
                               ? fmt::format(" and a float32 scale per {} values", kv.k_scale_group())
                               : std::string());
  std::cout << fmt::format("decode reads:      {} of weights per decoded token at batch 1 ({:.0f} bytes)\n",
                           HumanBytes(st.bytes_read_per_token), st.bytes_read_per_token);
  const int64_t tp = o.parallel.tensor_parallel_size;
  if (tp > 1) {
    // Each rank's share, the largest over the ranks (rank 0 alone holds row-parallel biases).
    int64_t rank_bytes = 0;
    double rank_reads = 0;
    for (int64_t r = 0; r < tp; ++r) {
      const ParallelConfig par{.tp_size = tp, .tp_rank = r, .expert_parallel = o.parallel.enable_expert_parallel};
      FATHOM_ASSIGN_OR_RETURN(const std::vector<WeightSpec> rank_specs, arch->weight_specs(cfg, par));
      const WeightStats rs = ComputeWeightStats(rank_specs, nullptr);
      rank_bytes = std::max(rank_bytes, rs.total_bytes);
      rank_reads = std::max(rank_reads, rs.bytes_read_per_token);
    }
    const ParallelConfig par0{.tp_size = tp, .expert_parallel = o.parallel.enable_expert_parallel};
    const int64_t rank_kv = arch->kv_cache_spec(cfg, par0).bytes_per_token(kv_dtype);
    std::cout << fmt::format(
        "tensor parallel:   {} ranks{}; per rank: weights {} ({}), kv cache {} bytes per token, "
        "decode reads {} per token\n",
        tp, o.parallel.enable_expert_parallel ? ", expert parallel" : "", HumanBytes(static_cast<double>(rank_bytes)),
        rank_bytes, rank_kv, HumanBytes(rank_reads));
  }
  return OkStatus();
}

}  // namespace

void AddModelCommands(CLI::App& app) {
  {
    auto opts = std::make_shared<ModelOptions>();
    auto tokens = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand("logits", "Print the logits at every position of a token sequence as JSON");
    AddModelOptions(cmd, *opts);
    AddParallelOptions(cmd, opts->parallel);
    cmd->add_option("--tokens", *tokens, "Comma-separated token ids, e.g. 1,2,3")->required();
    cmd->add_option("--output", *output, "Write the JSON here instead of stdout");
    cmd->callback([=] { ExitOnError(RunLogits(*opts, *tokens, *output)); });
  }
  {
    auto opts = std::make_shared<ModelOptions>();
    CLI::App* cmd = app.add_subcommand("inspect", "Print a model's architecture, sizes and per-token costs");
    AddModelOptions(cmd, *opts);
    AddParallelOptions(cmd, opts->parallel);
    // For inspect, --kv-cache-dtype auto means the model's dtype (what a GPU deployment stores).
    cmd->callback([=] { ExitOnError(RunInspect(*opts, opts->kv_cache_dtype)); });
  }
}

}  // namespace fathom
