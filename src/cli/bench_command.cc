#include "cli/bench_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/client.h"
#include "bench/offline.h"
#include "bench/online.h"
#include "bench/openai.h"
#include "bench/report.h"
#include "bench/roofline.h"
#include "bench/stats.h"
#include "bench/workload.h"
#include "cli/cli_util.h"
#include "cli/engine_setup.h"
#include "core/bytes.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

namespace {

struct BenchOptions {
  EngineOptions engine;  // --model, --tokenizer, and the engine flags of offline mode
  bool offline = false;
  // Workload.
  int64_t num_requests = 1000;
  int32_t input_len = 1024;
  int32_t output_len = 128;
  double range_ratio = 0.0;
  int32_t shared_prefix_len = 0;
  std::string dataset;
  bool ignore_eos = false;
  std::string prompt_format = "text";
  double temperature = 0.0;
  std::string extra_body;
  uint64_t seed = 0;
  int32_t warmup = 1;
  // Online.
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string api_key;
  std::string concurrency;
  std::string request_rate;
  double burstiness = 1.0;
  int32_t max_concurrency = 0;
  double timeout_s = 600;
  std::string slo;
  // Offline.
  std::string batch_size = "1";
  bool prefill_first = false;
  bool synthetic_prefill = false;
  double peak_bandwidth = 0;
  double peak_flops = 0;
  // Output.
  std::string output;
  std::string plot;
  bool save_detailed = false;
};

StatusOr<std::vector<int32_t>> ParseIntList(const std::string& text, const std::string& flag) {
  std::vector<int32_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      const int v = std::stoi(item, &pos);
      if (pos != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (...) {
      return InvalidArgumentError(
          fmt::format("{} expects positive integers separated by commas, got '{}'", flag, text));
    }
  }
  if (out.empty()) return InvalidArgumentError(fmt::format("{} is empty", flag));
  return out;
}

StatusOr<std::vector<double>> ParseRateList(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "inf") {
      out.push_back(std::numeric_limits<double>::infinity());
      continue;
    }
    try {
      size_t pos = 0;
      const double v = std::stod(item, &pos);
      if (pos != item.size() || !(v > 0)) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (...) {
      return InvalidArgumentError(fmt::format("--request-rate expects positive numbers or inf, got '{}'", text));
    }
  }
  if (out.empty()) return InvalidArgumentError("--request-rate is empty");
  return out;
}

Status CheckFlags(const CLI::App& cmd, bool offline) {
  static const std::vector<std::string> kOnlineOnly = {
      "--base-url",        "--endpoint",   "--api-key",      "--concurrency",  "--request-rate",      "--burstiness",
      "--max-concurrency", "--timeout",    "--slo",          "--dataset",      "--shared-prefix-len", "--range-ratio",
      "--prompt-format",   "--extra-body", "--num-requests", "--save-detailed"};
  static const std::vector<std::string> kOfflineOnly = {"--batch-size",
                                                        "--peak-bandwidth",
                                                        "--peak-flops",
                                                        "--device",
                                                        "--load-format",
                                                        "--weights-seed",
                                                        "--threads",
                                                        "--block-size",
                                                        "--max-model-len",
                                                        "--max-num-seqs",
                                                        "--max-num-batched-tokens",
                                                        "--max-queue-len",
                                                        "--max-queue-delay-ms",
                                                        "--kv-cache-memory",
                                                        "--num-kv-blocks",
                                                        "--enable-prefix-caching",
                                                        "--scheduling-policy"};
  for (const std::string& f : offline ? kOnlineOnly : kOfflineOnly) {
    if (cmd.count(f) > 0) {
      return InvalidArgumentError(fmt::format("{} applies to {} mode only", f, offline ? "online" : "--offline"));
    }
  }
  return OkStatus();
}

Status WriteOutputs(const BenchOptions& o, const nlohmann::json& j, const std::string& svg) {
  if (!o.output.empty()) {
    FATHOM_RETURN_IF_ERROR(bench::WriteTextFile(o.output, bench::DumpJson(j, 2) + "\n"));
    FATHOM_LOG_INFO("wrote {}", o.output);
  }
  if (!o.plot.empty()) {
    FATHOM_RETURN_IF_ERROR(bench::WriteTextFile(o.plot, svg));
    FATHOM_LOG_INFO("wrote {}", o.plot);
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------------------------
// Online.

Status RunOnline(const BenchOptions& o) {
  FATHOM_ASSIGN_OR_RETURN(bench::HttpTarget target, bench::ParseBaseUrl(o.base_url));
  bench::OnlineOptions oo;
  oo.target = target;
  oo.endpoint = o.endpoint.empty() || o.endpoint[0] != '/' ? "/" + o.endpoint : o.endpoint;
  oo.timeout_s = o.timeout_s;
  oo.seed = o.seed;
  oo.show_progress = true;
  std::string api_key = o.api_key;
  if (api_key.empty()) {
    if (const char* env = std::getenv("OPENAI_API_KEY")) api_key = env;
  }
  if (!api_key.empty()) oo.headers.push_back({"Authorization", "Bearer " + api_key});
  if (o.num_requests <= 0) return InvalidArgumentError("--num-requests must be positive");
  if (o.warmup < 0) return InvalidArgumentError("--warmup must be >= 0");
  if (!(o.timeout_s > 0)) return InvalidArgumentError("--timeout must be positive");

  bench::Slo slo;
  if (!o.slo.empty()) {
    FATHOM_ASSIGN_OR_RETURN(slo, bench::ParseSlo(o.slo));
  }

  // Load levels.
  std::vector<bench::LoadShape> shapes;
  if (!o.concurrency.empty() && !o.request_rate.empty()) {
    return InvalidArgumentError("give --concurrency (closed loop) or --request-rate (open loop), not both");
  }
  if (!o.concurrency.empty()) {
    if (o.max_concurrency > 0) return InvalidArgumentError("--max-concurrency caps --request-rate; drop it");
    FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> cs, ParseIntList(o.concurrency, "--concurrency"));
    for (int32_t c : cs) shapes.push_back({.concurrency = c});
  } else {
    FATHOM_ASSIGN_OR_RETURN(std::vector<double> rates, ParseRateList(o.request_rate.empty() ? "inf" : o.request_rate));
    if (!(o.burstiness > 0)) return InvalidArgumentError("--burstiness must be positive");
    if (o.max_concurrency < 0) return InvalidArgumentError("--max-concurrency must be >= 0");
    for (double r : rates) {
      shapes.push_back({.request_rate = r, .burstiness = o.burstiness, .max_concurrency = o.max_concurrency});
    }
  }

  // Model name.
  std::string model = o.engine.model;
  if (model.empty()) {
    FATHOM_ASSIGN_OR_RETURN(model, bench::FetchFirstModel(target, oo.headers));
    FATHOM_LOG_INFO("benchmarking model '{}' (the first that {} lists)", model, target.Url("/v1/models"));
  }
  oo.body.model = model;
  FATHOM_ASSIGN_OR_RETURN(oo.body.prompt_format, bench::ParsePromptFormat(o.prompt_format));
  oo.body.ignore_eos = o.ignore_eos;
  oo.body.temperature = o.temperature;
  if (!o.extra_body.empty()) {
    oo.body.extra = nlohmann::json::parse(o.extra_body, nullptr, false);
    if (oo.body.extra.is_discarded() || !oo.body.extra.is_object()) {
      return InvalidArgumentError("--extra-body must be a JSON object");
    }
  }

  // Tokenizer: --tokenizer DIR, else a model folder with tokenizer.json, else the server's /tokenize.
  std::unique_ptr<Tokenizer> local;
  std::unique_ptr<bench::TokenCounter> counter;
  std::string tokenizer_desc;
  std::string tok_dir = o.engine.tokenizer;
  if (tok_dir.empty() && std::filesystem::exists(std::filesystem::path(o.engine.model) / "tokenizer.json")) {
    tok_dir = o.engine.model;
  }
  const bool need_tokens = o.dataset.empty() || oo.body.prompt_format == bench::PromptFormat::kIds;
  if (!tok_dir.empty()) {
    auto tok = Tokenizer::FromDirectory(tok_dir);
    if (!tok.ok()) return tok.status().WithContext("loading --tokenizer");
    local = std::move(tok).value();
    counter = bench::MakeLocalTokenCounter(*local);
    tokenizer_desc = "local: " + tok_dir;
  } else if (need_tokens) {
    counter = bench::MakeRemoteTokenCounter(target, model, oo.headers);
    tokenizer_desc = "server: " + target.Url("/tokenize");
  } else {
    tokenizer_desc = "none (prompt tokens from usage)";
  }

  bench::WorkloadOptions w;
  w.num_requests = o.num_requests;
  w.input_len = o.input_len;
  w.output_len = o.output_len;
  w.range_ratio = o.range_ratio;
  w.shared_prefix_len = o.shared_prefix_len;
  w.seed = o.seed;
  auto make_prompts = [&](int64_t n, uint64_t seed) -> StatusOr<std::vector<bench::BenchPrompt>> {
    bench::WorkloadOptions wk = w;
    wk.num_requests = n;
    wk.seed = seed;
    if (!o.dataset.empty()) return bench::LoadDatasetPrompts(o.dataset, wk, counter.get());
    FATHOM_LOG_INFO("preparing {} random prompts (tokenizer: {})", n, tokenizer_desc);
    return bench::MakeRandomPrompts(*counter, wk);
  };

  bench::OnlineRunInfo info;
  info.url = target.Url(oo.endpoint);
  info.model = model;
  info.endpoint = oo.endpoint;
  info.workload =
      o.dataset.empty()
          ? fmt::format("random tokens: input {}, output {}{}{}{}", o.input_len, o.output_len,
                        o.range_ratio > 0 ? fmt::format(", range ratio {:g}", o.range_ratio) : "",
                        o.shared_prefix_len > 0 ? fmt::format(", shared prefix {}", o.shared_prefix_len) : "",
                        o.ignore_eos ? ", ignore_eos" : "")
          : fmt::format("dataset {} (output {} unless a line says){}", o.dataset, o.output_len,
                        o.ignore_eos ? ", ignore_eos" : "");
  info.workload += fmt::format(", {} requests per level", o.num_requests);
  info.tokenizer = tokenizer_desc;
  info.num_requests = o.num_requests;
  info.input_len = o.input_len;
  info.output_len = o.output_len;
  info.range_ratio = o.range_ratio;
  info.shared_prefix_len = o.shared_prefix_len;
  info.ignore_eos = o.ignore_eos;
  info.prompt_format = o.prompt_format;
  info.warmup = o.warmup;
  info.seed = o.seed;
  info.timeout_s = o.timeout_s;
  info.slo = slo.empty() ? "" : slo.ToString();

  if (o.warmup > 0) {
    FATHOM_ASSIGN_OR_RETURN(std::vector<bench::BenchPrompt> warm, make_prompts(o.warmup, o.seed + 0x9e3779b9ULL));
    bench::OnlineOptions wo = oo;
    wo.show_progress = false;
    const bench::LoadShape& first = shapes.front();
    const int32_t c =
        first.closed() ? first.concurrency : (first.max_concurrency > 0 ? first.max_concurrency : o.warmup);
    FATHOM_LOG_INFO("warming up with {} request(s)", o.warmup);
    FATHOM_ASSIGN_OR_RETURN(bench::LevelResult wr,
                            bench::RunLevel(wo, {.concurrency = std::min(c, o.warmup)}, warm, bench::Slo{}));
    info.warmup_failed = wr.metrics.failed;
    if (wr.metrics.failed > 0) {
      FATHOM_LOG_WARN("{} of {} warm-up requests failed: {}", wr.metrics.failed, o.warmup,
                      wr.metrics.failures.begin()->first + ": " + wr.metrics.failures.begin()->second.example);
    }
  }

  std::vector<bench::LevelResult> levels;
  for (size_t k = 0; k < shapes.size(); ++k) {
    // Fresh prompts per level, so that a level does not hit the prefix cache that the previous one filled.
    FATHOM_ASSIGN_OR_RETURN(std::vector<bench::BenchPrompt> prompts, make_prompts(o.num_requests, o.seed + k));
    FATHOM_ASSIGN_OR_RETURN(bench::LevelResult r, bench::RunLevel(oo, shapes[k], prompts, slo));
    FATHOM_LOG_INFO("{}: {} ok, {} failed, {:.1f} output tok/s", shapes[k].Label(), r.metrics.completed,
                    r.metrics.failed, r.metrics.output_throughput);
    levels.push_back(std::move(r));
  }

  std::cout << bench::FormatOnlineTable(info, levels);
  std::cout.flush();
  FATHOM_RETURN_IF_ERROR(WriteOutputs(o, bench::OnlineJson(info, levels, o.save_detailed),
                                      o.plot.empty() ? "" : bench::OnlineSvg(info, levels)));
  for (const bench::LevelResult& l : levels) {
    if (l.metrics.completed == 0) {
      std::string why;
      for (const auto& [cls, f] : l.metrics.failures)
        why += fmt::format("{}{} x{}", why.empty() ? "" : ", ", cls, f.count);
      return UnavailableError(fmt::format("every request failed at {} ({})", l.shape.Label(), why));
    }
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------------------------
// Offline.

// The checkpoint's own dtypes, which may differ from the spec's (fp32 test checkpoints, fp8 layers).
StatusOr<std::map<std::string, DType>> CheckpointDtypes(const std::string& folder,
                                                        const std::vector<WeightSpec>& specs) {
  std::map<std::string, DType> out;
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(folder));
  for (const WeightSpec& s : specs) {
    std::string source = s.name;
    if (!s.fallback.empty() && (s.shares_storage || !ckpt->Has(source)) && ckpt->Has(s.fallback)) source = s.fallback;
    if (!ckpt->Has(source)) continue;
    FATHOM_ASSIGN_OR_RETURN(const SafetensorsEntry* e, ckpt->Entry(source));
    out[s.name] = e->dtype;
  }
  return out;
}

Status RunOffline(const BenchOptions& o, bool fit_token_budget, bool fit_kv_blocks) {
  if (o.engine.model.empty()) return InvalidArgumentError("--offline needs --model DIR (or a config.json)");
  if (!o.dataset.empty()) return InvalidArgumentError("--dataset applies to online mode only");
  FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> batches, ParseIntList(o.batch_size, "--batch-size"));
  if (o.warmup < 0) return InvalidArgumentError("--warmup must be >= 0");
  // The memory plan covers the token budget the levels will use (see bench::FittedTokenBudget).
  EngineOptions eo = o.engine;
  if (fit_token_budget)
    eo.max_num_batched_tokens = bench::FittedTokenBudget(eo.max_num_batched_tokens, batches, o.input_len);
  FATHOM_ASSIGN_OR_RETURN(LoadedModel m, LoadModelAndTokenizer(eo, TokenizerLoad::kIfPresent));
  if (m.worker) return RunParallelWorker(*m.worker);
  EngineConfig ec;
  bool chunked = false;  // the fitted budget did not fit this device's memory: the levels prefill in chunks
  if (fit_token_budget) {
    const int32_t fitted = eo.max_num_batched_tokens;
    const int32_t max_batch = batches.empty() ? 0 : *std::max_element(batches.begin(), batches.end());
    FATHOM_ASSIGN_OR_RETURN(
        eo.max_num_batched_tokens,
        bench::LargestPlannedTokenBudget(o.engine.max_num_batched_tokens, fitted, [&](int32_t budget) -> Status {
          EngineOptions tried = eo;
          tried.max_num_batched_tokens = budget;
          FATHOM_ASSIGN_OR_RETURN(ec, MakeEngineConfig(tried, m));
          // The levels size their KV caches themselves (fit_kv_blocks): the plan must leave room for the largest.
          if (fit_kv_blocks && m.backend->MemoryInfo().total_bytes > 0) {
            const int64_t blocks = bench::OfflineKvBlocks(max_batch, o.input_len, o.output_len, eo.block_size);
            const DType kv_dtype = ec.kv_cache_dtype.value_or(m.backend->kv_cache_dtype());
            const int64_t need = blocks * eo.block_size * m.model->kv_cache_spec().bytes_per_token(kv_dtype);
            if (ec.kv_cache_memory_bytes < need) {
              return ResourceExhaustedError(fmt::format(
                  "with {} batched tokens the memory plan leaves {} for the KV cache; {} sequences of {} tokens "
                  "need {}",
                  budget, FormatBytes(ec.kv_cache_memory_bytes), max_batch, o.input_len + o.output_len,
                  FormatBytes(need)));
            }
          }
          return OkStatus();
        }));
    if (eo.max_num_batched_tokens < fitted) {
      chunked = true;
      FATHOM_LOG_WARN(
          "one prefill step of {} tokens does not fit this device's memory: the levels prefill in chunks of {} "
          "tokens (pass --max-num-batched-tokens to choose)",
          fitted, eo.max_num_batched_tokens);
      ModelRunOptions run = m.run;  // MLA's context rows stay within what the plan reserved
      run.max_batched_tokens = eo.max_num_batched_tokens;
      m.model->set_run_options(run);
    }
  } else {
    FATHOM_ASSIGN_OR_RETURN(ec, MakeEngineConfig(eo, m));
  }
  FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(m.config.architecture));
  FATHOM_ASSIGN_OR_RETURN(const std::vector<WeightSpec> specs, arch->weight_specs(m.config));
  FATHOM_ASSIGN_OR_RETURN(LoadFormat format, ParseLoadFormat(o.engine.load_format));
  std::map<std::string, DType> dtypes;
  if (format != LoadFormat::kDummy) {
    FATHOM_ASSIGN_OR_RETURN(dtypes, CheckpointDtypes(m.folder, specs));
  }
  const bench::ModelCosts costs = bench::ComputeModelCosts(m.config, specs, dtypes, m.model->kv_cache_spec(),
                                                           ec.kv_cache_dtype.value_or(m.backend->kv_cache_dtype()));
  FATHOM_LOG_INFO("measuring peaks");
  FATHOM_ASSIGN_OR_RETURN(
      bench::Peaks peaks,
      bench::ResolvePeaks(
          o.engine.device, o.peak_bandwidth > 0 ? std::optional<double>(o.peak_bandwidth) : std::nullopt,
          o.peak_flops > 0 ? std::optional<double>(o.peak_flops) : std::nullopt, m.backend->device_model()));

  bench::OfflineOptions oo;
  oo.input_len = o.input_len;
  oo.output_len = o.output_len;
  oo.warmup = o.warmup;
  oo.seed = o.seed;
  oo.temperature = static_cast<float>(o.temperature);
  oo.fit_token_budget = fit_token_budget && !chunked;
  oo.fit_kv_blocks = fit_kv_blocks;
  oo.prefill_first = o.prefill_first;
  oo.synthetic_prefill = o.synthetic_prefill;
  std::vector<bench::OfflineLevel> levels;
  for (int32_t b : batches) {
    FATHOM_LOG_INFO("batch {}: prefill {} x {} tokens, then {} decode steps", b, b, o.input_len, o.output_len - 1);
    m.backend->ResetProfile();  // a level's kernel-time table (FATHOM_CUDA_PROFILE) covers that level alone
    FATHOM_ASSIGN_OR_RETURN(bench::OfflineLevel l,
                            bench::RunOfflineLevel(*m.model, *m.backend, ec, costs, peaks, b, oo));
    levels.push_back(std::move(l));
    const std::string profile = m.backend->ProfileReport();
    if (!profile.empty()) std::cerr << fmt::format("kernel time (FATHOM_CUDA_PROFILE), batch {}:\n{}", b, profile);
  }

  bench::OfflineRunInfo info;
  info.model = o.engine.model;
  info.architecture = m.config.architecture;
  info.device = o.engine.device;
  info.load_format = format == LoadFormat::kDummy ? "dummy" : "checkpoint";
  info.threads = DefaultThreadPool().num_threads();
  info.input_len = o.input_len;
  info.output_len = o.output_len;
  info.warmup = o.warmup;
  info.costs = costs;
  info.peaks = peaks;
  std::cout << bench::FormatOfflineTable(info, levels);
  std::cout.flush();
  return WriteOutputs(o, bench::OfflineJson(info, levels), o.plot.empty() ? "" : bench::OfflineSvg(info, levels));
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Benchmark a server (OpenAI-compatible, streamed) or, with --offline, the engine in-process");
  AddEngineOptions(cmd, o->engine, /*model_required=*/false);
  cmd->get_option("--model")->description(
      "Online: the served model name (default: the first of GET /v1/models). Offline: model folder, "
      "or a config.json with --load-format dummy");
  cmd->get_option("--tokenizer")
      ->description(
          "Folder with tokenizer.json for prompt generation (online default: --model if it is such a "
          "folder, else the server's /tokenize and /detokenize)");

  const std::string wl = "Workload";
  cmd->add_flag("--offline", o->offline, "Run the engine in-process (no HTTP): prefill/decode speed and roofline");
  cmd->add_option("--num-requests", o->num_requests, "Requests per level")->capture_default_str()->group(wl);
  cmd->add_option("--input-len", o->input_len, "Prompt tokens (random prompts; offline)")
      ->capture_default_str()
      ->group(wl);
  cmd->add_option("--output-len", o->output_len, "Tokens to generate per request (max_tokens)")
      ->capture_default_str()
      ->group(wl);
  cmd->add_option("--range-ratio", o->range_ratio,
                  "Random lengths uniform in [len * (1 - r), len * (1 + r)] for input and output")
      ->group(wl);
  cmd->add_option("--shared-prefix-len", o->shared_prefix_len,
                  "Tokens of one random prefix that every prompt starts with (exercises prefix caching)")
      ->group(wl);
  cmd->add_option("--dataset", o->dataset, "JSONL file of {\"prompt\": ..., \"output_len\": N (optional)} lines")
      ->group(wl);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Send ignore_eos: true, for a fixed output length (vLLM, fathom)")
      ->group(wl);
  cmd->add_option("--prompt-format", o->prompt_format, "text | ids (completions prompt as token ids)")
      ->capture_default_str()
      ->group(wl);
  cmd->add_option("--temperature", o->temperature,
                  "Sampling temperature (sent online; offline, seeded sampling in the engine)")
      ->capture_default_str()
      ->group(wl);
  cmd->add_option("--extra-body", o->extra_body, "JSON object merged into every request body")->group(wl);
  cmd->add_option("--seed", o->seed, "Seed of prompts, lengths and arrivals")->capture_default_str()->group(wl);
  cmd->add_option("--warmup", o->warmup,
                  "Warm-up requests (online) or passes (offline) before measuring; not in the statistics")
      ->capture_default_str()
      ->group(wl);

  const std::string on = "Online";
  cmd->add_option("--base-url", o->base_url, "Server URL (http only)")->capture_default_str()->group(on);
  cmd->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str()
      ->group(on);
  cmd->add_option("--api-key", o->api_key, "Bearer token (default: $OPENAI_API_KEY)")->group(on);
  cmd->add_option("--concurrency", o->concurrency, "Closed loop: requests kept in flight; a list (1,8,32) sweeps")
      ->group(on);
  cmd->add_option("--request-rate", o->request_rate,
                  "Open loop: requests/s (inf: all at once, the default); a list sweeps")
      ->group(on);
  cmd->add_option("--burstiness", o->burstiness, "Gamma shape of the arrivals (1: Poisson, < 1 burstier)")
      ->capture_default_str()
      ->group(on);
  cmd->add_option("--max-concurrency", o->max_concurrency, "Open loop: cap on requests in flight")->group(on);
  cmd->add_option("--timeout", o->timeout_s, "Per-request timeout, seconds")->capture_default_str()->group(on);
  cmd->add_option("--slo", o->slo, "Goodput objectives, e.g. ttft=200ms,tpot=50ms (keys ttft, tpot, e2e)")->group(on);

  const std::string off = "Offline";
  cmd->add_option("--batch-size", o->batch_size, "Sequences decoded together; a list (1,8,32) sweeps")
      ->capture_default_str()
      ->group(off);
  cmd->add_flag(
         "--prefill-first", o->prefill_first,
         "Prefill every prompt in a pass of its own (kept in the prefix cache), then measure decode on them: the "
         "whole batch decodes together where the token budget chunks the prefills (long contexts)")
      ->group(off);
  cmd->add_flag(
         "--synthetic-prefill", o->synthetic_prefill,
         "Measure decode without computing the prompts (implies --prefill-first): the KV cache starts with random "
         "rows and prompt-only steps run no forward pass, so that long contexts at large batches take seconds; "
         "no prefill figures, and the tokens are garbage")
      ->group(off);
  cmd->add_option("--peak-bandwidth", o->peak_bandwidth,
                  "Peak memory bandwidth, bytes/s, for MBU (default: 4.5e12 on CUDA, measured on the CPU)")
      ->group(off);
  cmd->add_option("--peak-flops", o->peak_flops,
                  "Peak FLOP/s for MFU (default: 989e12, H200 bf16 dense, on CUDA; measured on the CPU)")
      ->group(off);

  const std::string out = "Output";
  cmd->add_option("--output", o->output, "Write the results as JSON here")->group(out);
  cmd->add_option("--plot", o->plot, "Write an SVG chart here (latency CDFs and throughput over time)")->group(out);
  cmd->add_flag("--save-detailed", o->save_detailed, "Online: every request's record in the JSON too")->group(out);

  cmd->callback([o, cmd] {
    ExitOnError(CheckFlags(*cmd, o->offline));
    if (o->offline) {
      const bool fit_tokens = cmd->count("--max-num-batched-tokens") == 0;
      const bool fit_kv = cmd->count("--kv-cache-memory") == 0 && cmd->count("--num-kv-blocks") == 0;
      ExitOnError(RunOffline(*o, fit_tokens, fit_kv));
    } else {
      ExitOnError(RunOnline(*o));
    }
  });
}

}  // namespace fathom
