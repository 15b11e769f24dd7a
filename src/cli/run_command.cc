#include "cli/run_command.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "cli/cli_util.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/tokenizer_text.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

namespace {

struct RunOptions {
  // Model.
  std::string model;
  std::string device = "cpu";
  std::string load_format = "auto";
  std::string tokenizer;
  int block_size = 16;
  int threads = 0;
  uint64_t weights_seed = 0;
  // Input: exactly one.
  std::string prompt;
  std::string chat;
  std::string tokens;
  // Sampling.
  int max_tokens = 16;
  int min_tokens = 0;
  int n = 1;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::string stop_token_ids;
  std::vector<std::string> logit_bias;
  bool ignore_eos = false;
  int logprobs = -1;
  // Engine.
  int max_model_len = 0;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_queue_len = 0;
  int64_t max_queue_delay_ms = 0;
  std::string kv_cache_memory = "1GiB";
  int num_kv_blocks = 0;
  bool enable_prefix_caching = true;
  std::string scheduling_policy = "priority";
  bool show_stats = false;
};

// "1073741824", "512MiB", "2G", "256k": bytes (K/M/G are powers of 1024).
StatusOr<int64_t> ParseBytes(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return InvalidArgumentError(fmt::format("--kv-cache-memory: '{}' is not a size", text));
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "" || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mult = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mult = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else {
    return InvalidArgumentError(fmt::format("--kv-cache-memory: unknown unit in '{}' (use K, M or G)", text));
  }
  if (!(value > 0)) return InvalidArgumentError("--kv-cache-memory must be positive");
  return static_cast<int64_t>(value * mult);
}

StatusOr<std::vector<std::pair<int32_t, float>>> ParseLogitBias(const std::vector<std::string>& items) {
  std::vector<std::pair<int32_t, float>> out;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    try {
      if (eq == std::string::npos) throw std::invalid_argument(item);
      out.emplace_back(std::stoi(item.substr(0, eq)), std::stof(item.substr(eq + 1)));
    } catch (...) {
      return InvalidArgumentError(fmt::format("--logit-bias expects ID=BIAS, got '{}'", item));
    }
  }
  return out;
}

std::string ModelFolder(const std::string& model) {
  namespace fs = std::filesystem;
  if (fs::is_directory(model)) return model;
  const fs::path parent = fs::path(model).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

Status RunEngine(const RunOptions& o) {
  const int inputs = (o.prompt.empty() ? 0 : 1) + (o.chat.empty() ? 0 : 1) + (o.tokens.empty() ? 0 : 1);
  if (inputs != 1) return InvalidArgumentError("give exactly one of --prompt, --chat or --tokens");
  if (o.threads > 0) SetDefaultThreadCount(o.threads);
  FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(o.model));
  FATHOM_ASSIGN_OR_RETURN(LoadFormat format, ParseLoadFormat(o.load_format));

  // Tokenizer: only needed for text.
  std::unique_ptr<Tokenizer> tokenizer;
  if (o.tokens.empty()) {
    const std::string dir = o.tokenizer.empty() ? ModelFolder(o.model) : o.tokenizer;
    auto tok = Tokenizer::FromDirectory(dir);
    if (!tok.ok()) return tok.status().WithContext("loading the tokenizer (pass --tokenizer DIR)");
    tokenizer = std::move(tok).value();
  } else if (!o.stop.empty()) {
    const std::string dir = o.tokenizer.empty() ? ModelFolder(o.model) : o.tokenizer;
    FATHOM_ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromDirectory(dir));
  }

  std::vector<int32_t> prompt;
  if (!o.tokens.empty()) {
    FATHOM_ASSIGN_OR_RETURN(prompt, ParseTokenList(o.tokens));
  } else if (!o.chat.empty()) {
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<ChatTemplate> chat, ChatTemplate::FromTokenizer(*tokenizer));
    ChatRequest req;
    req.messages.push_back({{"role", "user"}, {"content", o.chat}});
    req.add_generation_prompt = true;
    FATHOM_ASSIGN_OR_RETURN(std::string text, chat->Render(req));
    prompt = chat->EncodePrompt(text);
  } else {
    prompt = tokenizer->Encode(o.prompt, {.add_special_tokens = true});
  }
  if (prompt.empty()) return InvalidArgumentError("the prompt encodes to no tokens");

  SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.min_p = o.min_p;
  sp.repetition_penalty = o.repetition_penalty;
  sp.presence_penalty = o.presence_penalty;
  sp.frequency_penalty = o.frequency_penalty;
  FATHOM_ASSIGN_OR_RETURN(sp.logit_bias, ParseLogitBias(o.logit_bias));
  if (o.seed != 0) sp.seed = o.seed;
  if (o.max_tokens < 0) return InvalidArgumentError("--max-tokens must be >= 0");
  sp.max_tokens = o.max_tokens;
  sp.min_tokens = o.min_tokens;
  sp.stop = o.stop;
  if (!o.stop_token_ids.empty()) {
    FATHOM_ASSIGN_OR_RETURN(sp.stop_token_ids, ParseTokenList(o.stop_token_ids));
  }
  sp.ignore_eos = o.ignore_eos;
  if (o.logprobs >= 0) {
    sp.logprobs = true;
    sp.top_logprobs = o.logprobs;
  }
  sp.n = o.n;

  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend_owner, MakeBackend(o.device));
  Backend& backend = *backend_owner;
  LoadOptions lo;
  lo.format = format;
  lo.seed = o.weights_seed;
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(ModelFolder(o.model), cfg, lo, backend));

  EngineConfig ec;
  ec.block_size = o.block_size;
  ec.num_blocks = o.num_kv_blocks;
  FATHOM_ASSIGN_OR_RETURN(ec.kv_cache_memory_bytes, ParseBytes(o.kv_cache_memory));
  ec.enable_prefix_caching = o.enable_prefix_caching;
  ec.policy = o.scheduling_policy;
  ec.scheduler.max_model_len = o.max_model_len;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.max_queue_len = o.max_queue_len;
  ec.scheduler.max_queue_delay_ms = o.max_queue_delay_ms;
  if (o.max_num_seqs <= 0 || o.max_num_batched_tokens <= 0) {
    return InvalidArgumentError("--max-num-seqs and --max-num-batched-tokens must be positive");
  }
  FATHOM_ASSIGN_OR_RETURN(ec.eos_token_ids, LoadEosTokenIds(o.model, cfg));
  if (ec.eos_token_ids.empty() && tokenizer && tokenizer->eos_id()) ec.eos_token_ids.push_back(*tokenizer->eos_id());

  TextStreamFactory text = tokenizer ? TokenizerTextStreams(*tokenizer) : nullptr;
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, EngineCore::Create(*model, backend, ec, text));
  Engine engine(std::move(core));
  FATHOM_ASSIGN_OR_RETURN(std::shared_ptr<RequestStream> stream,
                          engine.Submit({.id = "run", .prompt = prompt, .sampling = sp}));

  const bool text_mode = o.tokens.empty();
  const bool stream_text = text_mode && o.n == 1;
  std::map<int32_t, std::vector<int32_t>> ids;
  std::map<int32_t, std::string> texts;
  std::map<int32_t, std::vector<SampleResult>> logprobs;
  std::map<int32_t, RequestOutput> finals;
  RequestOutput out;
  while (stream->Next(&out)) {
    ids[out.index].insert(ids[out.index].end(), out.token_ids.begin(), out.token_ids.end());
    logprobs[out.index].insert(logprobs[out.index].end(), out.logprobs.begin(), out.logprobs.end());
    if (stream_text && !out.text.empty()) {
      std::fwrite(out.text.data(), 1, out.text.size(), stdout);
      std::fflush(stdout);
    }
    texts[out.index] += out.text;
    if (out.finished) finals[out.index] = out;
  }
  engine.Shutdown(Engine::ShutdownMode::kDrain);
  for (const auto& [index, f] : finals) {
    if (!f.status.ok()) return f.status;
  }
  if (stream_text) {
    std::cout << "\n";
  } else {
    for (const auto& [index, toks] : ids) {
      if (o.n > 1 && text_mode) std::cout << fmt::format("--- sample {} ---\n", index);
      if (text_mode) {
        std::cout << texts[index] << "\n";
      } else {
        std::cout << fmt::format("{}", fmt::join(toks, " ")) << "\n";
      }
    }
  }
  std::cout.flush();
  if (o.logprobs >= 0) {
    for (const auto& [index, lps] : logprobs) {
      for (const SampleResult& r : lps) {
        std::string top;
        for (const TokenLogprob& t : r.top) top += fmt::format(" {}:{:.4f}", t.token, t.logprob);
        std::cerr << fmt::format("[{}] token {} logprob {:.4f}{}\n", index, r.token, r.logprob,
                                 top.empty() ? "" : " top" + top);
      }
    }
  }
  if (o.show_stats) {
    const EngineStats st = engine.Stats();
    for (const auto& [index, f] : finals) {
      std::cerr << fmt::format(
          "[{}] finish {} | prompt {} tokens ({} cached) | completion {} | queue {:.1f} ms, prefill {:.1f} ms, "
          "ttft {:.1f} ms, decode {:.1f} ms, detokenize {:.2f} ms\n",
          index, FinishReasonName(f.finish_reason), f.prompt_tokens, f.prompt_cache_hit_tokens, f.completion_tokens,
          f.timings.queue_wait * 1e3, f.timings.prefill * 1e3, f.timings.ttft * 1e3, f.timings.decode * 1e3,
          f.timings.detokenize * 1e3);
    }
    std::cerr << fmt::format(
        "engine: {} steps | forward {:.1f} ms | cpu-side {:.2f} ms ({:.3f} ms/step) | kv {} blocks of {} | "
        "prefix-cache hit ratio {:.2f} | preemptions {}\n",
        st.num_steps, st.total_forward_s * 1e3, st.total_step_cpu_s * 1e3,
        st.num_steps > 0 ? st.total_step_cpu_s * 1e3 / static_cast<double>(st.num_steps) : 0.0, st.num_blocks,
        o.block_size, st.prefix_cache_hit_ratio, st.num_preemptions);
  }
  const std::string profile = CudaProfileReport(backend);
  if (!profile.empty()) std::cerr << "kernel time (FATHOM_CUDA_PROFILE):\n" << profile;
  return OkStatus();
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate from a prompt through the engine and stream the text");
  cmd->add_option("--model", o->model, "Model folder, or a config.json with --load-format dummy")->required();
  cmd->add_option("--device", o->device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--load-format", o->load_format, "auto | safetensors | dummy (random weights, no checkpoint)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer, "Folder with tokenizer.json (default: the model folder)");
  cmd->add_option("--block-size", o->block_size, "Tokens per KV-cache block")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (default: FATHOM_NUM_THREADS or all cores)");
  cmd->add_option("--weights-seed", o->weights_seed, "Seed of dummy weights")->capture_default_str();

  cmd->add_option("--prompt", o->prompt, "Prompt text (tokenized with BOS as tokenizer_config.json says)");
  cmd->add_option("--chat", o->chat, "A user message, formatted with the model's chat template");
  cmd->add_option("--tokens", o->tokens, "Comma-separated prompt token ids; prints the generated ids");

  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate (0: up to --max-model-len)")
      ->capture_default_str();
  cmd->add_option("--min-tokens", o->min_tokens, "EOS and stop ids are ignored before this many tokens");
  cmd->add_option("-n,--n", o->n, "Independent samples (they share the prompt's KV blocks)")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)");
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass");
  cmd->add_option("--min-p", o->min_p, "Drop tokens below this share of the most likely one");
  cmd->add_option("--repetition-penalty", o->repetition_penalty, "Penalty on prompt and output tokens (1: off)");
  cmd->add_option("--presence-penalty", o->presence_penalty, "Penalty on tokens already generated");
  cmd->add_option("--frequency-penalty", o->frequency_penalty, "Penalty per occurrence in the output");
  cmd->add_option("--logit-bias", o->logit_bias, "ID=BIAS added to a token's logit (repeatable)");
  cmd->add_option("--seed", o->seed, "Sampling seed (0: random)");
  cmd->add_option("--stop", o->stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-ids", o->stop_token_ids, "Comma-separated ids that end generation");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past the end-of-sequence token");
  cmd->add_option("--logprobs", o->logprobs, "Print each token's logprob and this many alternatives to stderr");

  cmd->add_option("--max-model-len", o->max_model_len, "Context length (default: the model's)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Running sequences per step")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per step")->capture_default_str();
  cmd->add_option("--max-queue-len", o->max_queue_len, "Waiting requests before 'queue full' (0: unlimited)");
  cmd->add_option("--max-queue-delay-ms", o->max_queue_delay_ms, "Queue wait before 'timed out' (0: forever)");
  cmd->add_option("--kv-cache-memory", o->kv_cache_memory, "KV-cache budget, e.g. 512MiB")->capture_default_str();
  cmd->add_option("--num-kv-blocks", o->num_kv_blocks, "KV-cache blocks (overrides --kv-cache-memory)");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o->enable_prefix_caching,
                "Reuse cached KV blocks of shared prefixes (on by default)");
  cmd->add_option("--scheduling-policy", o->scheduling_policy, "fcfs | priority")->capture_default_str();
  cmd->add_flag("--show-stats", o->show_stats, "Print per-request timings and engine counters to stderr");
  cmd->callback([o] { ExitOnError(RunEngine(*o)); });
}

}  // namespace fathom
