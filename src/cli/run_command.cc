#include "cli/run_command.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "cli/cli_util.h"
#include "cli/engine_setup.h"
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
  EngineOptions engine;
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
  bool show_stats = false;
};

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

Status RunEngine(RunOptions o) {
  const int inputs = (o.prompt.empty() ? 0 : 1) + (o.chat.empty() ? 0 : 1) + (o.tokens.empty() ? 0 : 1);
  if (inputs != 1) return InvalidArgumentError("give exactly one of --prompt, --chat or --tokens");
  FATHOM_RETURN_IF_ERROR(UseDemoWithoutModel(o.engine).status());
  FATHOM_ASSIGN_OR_RETURN(
      LoadedModel m, LoadModelAndTokenizer(o.engine, o.tokens.empty() || !o.stop.empty() ? TokenizerLoad::kRequired
                                                                                         : TokenizerLoad::kIfPresent));
  if (m.worker) return RunParallelWorker(*m.worker);
  Tokenizer* tokenizer = m.tokenizer.get();

  std::vector<int32_t> prompt;
  if (!o.tokens.empty()) {
    FATHOM_ASSIGN_OR_RETURN(prompt, ParseTokenList(o.tokens));
  } else if (!o.chat.empty()) {
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<ChatTemplate> chat,
                            ChatTemplate::ForModel(*tokenizer, m.config.model_type));
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

  Backend& backend = *m.backend;
  FATHOM_ASSIGN_OR_RETURN(EngineConfig ec, MakeEngineConfig(o.engine, m));

  TextStreamFactory text = tokenizer ? TokenizerTextStreams(*tokenizer) : nullptr;
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, EngineCore::Create(*m.model, backend, ec, text));
  Engine engine(std::move(core));
  backend.ResetProfile();  // the kernel-time table covers this request, not loading and warm-up
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
        "engine: {} steps | forward {:.1f} ms{} | cpu-side {:.2f} ms ({:.3f} ms/step) | kv {} blocks of {} | "
        "prefix-cache hit ratio {:.2f} | preemptions {}\n",
        st.num_steps, st.total_forward_s * 1e3,
        st.total_collective_s > 0 ? fmt::format(" (collectives {:.1f} ms)", st.total_collective_s * 1e3) : "",
        st.total_step_cpu_s * 1e3,
        st.num_steps > 0 ? st.total_step_cpu_s * 1e3 / static_cast<double>(st.num_steps) : 0.0, st.num_blocks,
        o.engine.block_size, st.prefix_cache_hit_ratio, st.num_preemptions);
  }
  const std::string profile = backend.ProfileReport();
  if (!profile.empty()) std::cerr << "kernel time (FATHOM_CUDA_PROFILE):\n" << profile;
  return OkStatus();
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate from a prompt through the engine and stream the text");
  AddEngineOptions(cmd, o->engine, /*model_required=*/false);

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

  cmd->add_flag("--show-stats", o->show_stats, "Print per-request timings and engine counters to stderr");
  cmd->callback([o] { ExitOnError(RunEngine(*o)); });
}

}  // namespace fathom
