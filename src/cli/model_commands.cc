#include "cli/model_commands.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#ifdef FATHOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "cli/cli_util.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "io/model_config.h"
#include "model/registry.h"

namespace fathom {

namespace {

struct ModelOptions {
  std::string model;
  std::string device = "cpu";
  std::string load_format = "auto";
  int block_size = 16;
  int threads = 0;
  uint64_t seed = 0;
};

void AddModelOptions(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--model", o.model, "Model folder (config.json + safetensors)")->required();
  cmd->add_option("--device", o.device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--load-format", o.load_format, "auto | safetensors | dummy (random weights, no checkpoint)")
      ->capture_default_str();
  cmd->add_option("--block-size", o.block_size, "Tokens per KV-cache block")->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (default: FATHOM_NUM_THREADS or all cores)");
  cmd->add_option("--seed", o.seed, "Seed of dummy weights")->capture_default_str();
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// "cpu", "cuda" or "cuda:N".
StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (device.size() > 5) {
      FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> parsed, ParseTokenList(device.substr(5)));
      index = parsed[0];
    }
#ifdef FATHOM_HAVE_CUDA
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> gpu, CudaBackend::Create(index));
    return std::unique_ptr<Backend>(std::move(gpu));
#else
    (void)index;
    return UnimplementedError("this fathom was built without CUDA (configure with the cuda-release preset)");
#endif
  }
  return InvalidArgumentError(fmt::format("unknown device '{}' (use cpu, cuda or cuda:N)", device));
}

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
  FATHOM_ASSIGN_OR_RETURN(l.model, LoadModel(o.model, cfg, lo, *l.backend));
  return l;
}

// Identity block table 0..n-1 over a pool just large enough for `tokens` tokens.
StatusOr<KvCache> AllocateFor(Loaded& l, int64_t tokens, int block_size, std::vector<int32_t>* table) {
  const int64_t blocks = std::max<int64_t>(1, (tokens + block_size - 1) / block_size);
  table->resize(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) (*table)[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return KvCache::Allocate(*l.backend, l.model->kv_cache_spec(), DType::kF32, blocks, block_size);
}

Status RunLogits(const ModelOptions& o, const std::string& tokens_arg, const std::string& output) {
  FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ParseTokenList(tokens_arg));
  FATHOM_ASSIGN_OR_RETURN(Loaded l, LoadForRun(o));
  std::vector<int32_t> table;
  FATHOM_ASSIGN_OR_RETURN(KvCache kv, AllocateFor(l, static_cast<int64_t>(tokens.size()), o.block_size, &table));
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
  const std::string text = j.dump();
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

int32_t Argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Status RunGreedy(const ModelOptions& o, const std::string& tokens_arg, int max_tokens, bool ignore_eos) {
  FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, ParseTokenList(tokens_arg));
  if (max_tokens < 0) return InvalidArgumentError("--max-tokens must be >= 0");
  FATHOM_ASSIGN_OR_RETURN(Loaded l, LoadForRun(o));
  const ModelConfig& cfg = l.model->config();
  std::vector<int32_t> table;
  FATHOM_ASSIGN_OR_RETURN(KvCache kv,
                          AllocateFor(l, static_cast<int64_t>(tokens.size()) + max_tokens, o.block_size, &table));
  std::vector<int32_t> out;
  std::vector<int32_t> step = tokens;
  int32_t cached = 0;
  std::vector<float> host(static_cast<size_t>(cfg.vocab_size));
  using Clock = std::chrono::steady_clock;
  double prefill_s = 0.0, decode_s = 0.0;
  for (int i = 0; i < max_tokens; ++i) {
    ForwardBatch batch(o.block_size);
    batch.AddSequence(step, cached, table, LogitsMode::kLast);
    Tensor logits;
    const auto t0 = Clock::now();
    FATHOM_RETURN_IF_ERROR(l.model->Forward(batch, kv, &logits));
    FATHOM_RETURN_IF_ERROR(l.backend->CopyToHost(logits, host.data()));
    (i == 0 ? prefill_s : decode_s) += std::chrono::duration<double>(Clock::now() - t0).count();
#ifdef FATHOM_HAVE_CUDA
    if (i == 0) {
      if (auto* gpu = dynamic_cast<CudaBackend*>(l.backend.get())) gpu->ResetProfile();  // time decode steps only
    }
#endif
    cached += static_cast<int32_t>(step.size());
    const int32_t next = Argmax(host.data(), cfg.vocab_size);
    out.push_back(next);
    const bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) != cfg.eos_token_ids.end();
    if (eos && !ignore_eos) break;
    step.assign(1, next);
  }
  std::cout << fmt::format("{}", fmt::join(out, " ")) << "\n";
  const size_t decoded = out.empty() ? 0 : out.size() - 1;
  FATHOM_LOG_INFO("prefill: {} tokens in {:.2f} ms; decode: {} tokens in {:.2f} ms ({:.1f} tok/s, batch 1, {})",
                  tokens.size(), prefill_s * 1e3, decoded, decode_s * 1e3,
                  decode_s > 0 ? static_cast<double>(decoded) / decode_s : 0.0, l.backend->name());
#ifdef FATHOM_HAVE_CUDA
  if (auto* gpu = dynamic_cast<CudaBackend*>(l.backend.get())) {
    const std::string report = gpu->ProfileReport();
    if (!report.empty()) std::cerr << "kernel time over the decode steps (FATHOM_CUDA_PROFILE):\n" << report;
  }
#endif
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

Status RunInspect(const ModelOptions& o, const std::string& kv_dtype_name) {
  FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(o.model));
  FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(cfg.architecture));
  FATHOM_ASSIGN_OR_RETURN(LoadFormat format, ParseLoadFormat(o.load_format));
  const std::vector<WeightSpec> specs = arch->weight_specs(cfg);
  std::unique_ptr<WeightStore> store;
  CpuBackend cpu;
  if (format != LoadFormat::kDummy) {
    // Opens the checkpoint (mmap, no copy) and checks every tensor against the config.
    LoadOptions lo;
    lo.format = format;
    lo.show_progress = false;
    FATHOM_ASSIGN_OR_RETURN(store, LoadWeights(o.model, specs, lo, cpu));
  }
  DType kv_dtype = cfg.dtype;
  if (kv_dtype_name != "auto") {
    FATHOM_ASSIGN_OR_RETURN(kv_dtype, DTypeFromString(kv_dtype_name));
  }
  const WeightStats st = ComputeWeightStats(specs, store.get());
  const KvCacheSpec kv = arch->kv_cache_spec(cfg);
  const int64_t kv_bytes = kv.values_per_token() * static_cast<int64_t>(DTypeSize(kv_dtype));

  std::cout << fmt::format("architecture:      {} (model_type {})\n", cfg.architecture, cfg.model_type);
  std::cout << fmt::format("weights:           {}\n", format == LoadFormat::kDummy ? "dummy (not allocated)" : o.model);
  std::cout << fmt::format("layers:            {}  hidden {}  intermediate {}  vocab {}\n", cfg.num_layers,
                           cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
  std::cout << fmt::format("attention:         {} heads, {} kv heads, head_dim {}, rope {} (theta {})\n", cfg.num_heads,
                           cfg.num_kv_heads, cfg.head_dim, RopeTypeName(cfg.rope.type), cfg.rope.theta);
  std::cout << fmt::format("parameters:        {} ({})\n", HumanCount(static_cast<double>(st.total_params)),
                           st.total_params);
  std::cout << fmt::format("active parameters: {} per token ({:.0f})\n", HumanCount(st.active_params),
                           st.active_params);
  for (const auto& [dt, bytes] : st.bytes_by_dtype) {
    std::cout << fmt::format("bytes {:<12} {} ({})\n", std::string(DTypeName(dt)) + ":",
                             HumanBytes(static_cast<double>(bytes)), bytes);
  }
  std::cout << fmt::format("kv cache:          {} bytes per token ({}, {} values per token)\n", kv_bytes,
                           DTypeName(kv_dtype), kv.values_per_token());
  std::cout << fmt::format("decode reads:      {} of weights per decoded token at batch 1 ({:.0f} bytes)\n",
                           HumanBytes(st.bytes_read_per_token), st.bytes_read_per_token);
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
    cmd->add_option("--tokens", *tokens, "Comma-separated token ids, e.g. 1,2,3")->required();
    cmd->add_option("--output", *output, "Write the JSON here instead of stdout");
    cmd->callback([=] { ExitOnError(RunLogits(*opts, *tokens, *output)); });
  }
  {
    auto opts = std::make_shared<ModelOptions>();
    auto tokens = std::make_shared<std::string>();
    auto max_tokens = std::make_shared<int>(16);
    auto ignore_eos = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand("run", "Greedy-decode from token ids and print the generated ids");
    AddModelOptions(cmd, *opts);
    cmd->add_option("--tokens", *tokens, "Comma-separated prompt token ids")->required();
    cmd->add_option("--max-tokens", *max_tokens, "Tokens to generate")->capture_default_str();
    cmd->add_flag("--ignore-eos", *ignore_eos, "Keep generating past the end-of-sequence token");
    cmd->callback([=] { ExitOnError(RunGreedy(*opts, *tokens, *max_tokens, *ignore_eos)); });
  }
  {
    auto opts = std::make_shared<ModelOptions>();
    auto kv_dtype = std::make_shared<std::string>("auto");
    CLI::App* cmd = app.add_subcommand("inspect", "Print a model's architecture, sizes and per-token costs");
    AddModelOptions(cmd, *opts);
    cmd->add_option("--kv-cache-dtype", *kv_dtype, "auto (the model dtype) | bfloat16 | float16 | float32")
        ->capture_default_str();
    cmd->callback([=] { ExitOnError(RunInspect(*opts, *kv_dtype)); });
  }
}

}  // namespace fathom
