#include "bench/offline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "core/logging.h"

namespace fathom::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Pass {
  double prefill_s = 0;
  int64_t prefill_steps = 0;
  std::vector<double> ttft_s;
  std::vector<double> decode_steps_s;
  double decode_tokens = 0;
  double context_sum = 0;  // over decode steps, of the mean context
  double total_s = 0;
  EngineStats start, before_decode, after;
};

StatusOr<Pass> RunPass(EngineCore& core, const std::vector<std::vector<int32_t>>& prompts, int32_t output_len,
                       float temperature, const std::string& tag) {
  const size_t b = prompts.size();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < b; ++i) {
    const std::string id = fmt::format("{}-{}", tag, i);
    auto stream = std::make_shared<RequestStream>(id, 1);
    SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = i;
    sp.max_tokens = output_len;
    sp.ignore_eos = true;
    FATHOM_RETURN_IF_ERROR(core.AddRequest({.id = id, .prompt = prompts[i], .sampling = sp}, stream));
    streams.push_back(std::move(stream));
  }
  Pass pass;
  pass.start = core.Stats();
  pass.ttft_s.assign(b, -1.0);
  std::vector<int64_t> generated(b, 0);
  size_t with_first = 0;
  const Clock::time_point t0 = Clock::now();
  while (core.HasUnfinished()) {
    const bool prefill_phase = with_first < b;
    double context = 0;
    if (!prefill_phase) {
      for (size_t i = 0; i < b; ++i)
        context += static_cast<double>(prompts[i].size()) + static_cast<double>(generated[i]);
      context /= static_cast<double>(b);
      if (pass.decode_steps_s.empty()) pass.before_decode = core.Stats();
    }
    const Clock::time_point ts = Clock::now();
    FATHOM_RETURN_IF_ERROR(core.Step());
    const Clock::time_point te = Clock::now();
    int64_t step_tokens = 0;
    for (size_t i = 0; i < b; ++i) {
      while (std::optional<RequestOutput> out = streams[i]->TryNext()) {
        if (!out->status.ok()) return out->status.WithContext("benchmark request failed");
        const auto n = static_cast<int64_t>(out->token_ids.size());
        if (n > 0 && pass.ttft_s[i] < 0) {
          pass.ttft_s[i] = Seconds(te - t0);
          ++with_first;
        }
        generated[i] += n;
        step_tokens += n;
      }
    }
    if (prefill_phase) {
      pass.prefill_s = Seconds(te - t0);
      ++pass.prefill_steps;
    } else {
      pass.decode_steps_s.push_back(Seconds(te - ts));
      pass.decode_tokens += static_cast<double>(step_tokens);
      pass.context_sum += context;
    }
  }
  pass.total_s = Seconds(Clock::now() - t0);
  pass.after = core.Stats();
  for (size_t i = 0; i < b; ++i) {
    if (generated[i] != output_len) {
      return InternalError(fmt::format("request {} generated {} tokens, expected {}", i, generated[i], output_len));
    }
  }
  return pass;
}

}  // namespace

int32_t FittedTokenBudget(int32_t configured, const std::vector<int32_t>& batch_sizes, int32_t input_len) {
  int64_t budget = configured;
  for (int32_t b : batch_sizes) budget = std::max<int64_t>(budget, static_cast<int64_t>(b) * input_len);
  return static_cast<int32_t>(std::min<int64_t>(budget, std::numeric_limits<int32_t>::max()));
}

StatusOr<int32_t> LargestPlannedTokenBudget(int32_t configured, int32_t fitted,
                                            const std::function<Status(int32_t)>& plan) {
  int32_t budget = std::max(fitted, configured);
  for (;;) {
    Status s = plan(budget);
    if (s.ok()) return budget;
    if (s.code() != StatusCode::kResourceExhausted || budget <= configured) return s;
    budget = std::max(budget / 2, configured);  // the configured budget itself is the last one tried
  }
}

int32_t OfflineKvBlocks(int32_t batch_size, int32_t input_len, int32_t output_len, int32_t block_size) {
  const int32_t per_seq = (input_len + output_len + block_size - 1) / block_size + 1;
  return batch_size * per_seq + 1;
}

StatusOr<OfflineLevel> RunOfflineLevel(Model& model, Backend& backend, const EngineConfig& base,
                                       const ModelCosts& costs, const Peaks& peaks, int32_t batch_size,
                                       const OfflineOptions& o) {
  if (batch_size <= 0) return InvalidArgumentError("--batch-size must be positive");
  if (o.input_len <= 0) return InvalidArgumentError("--input-len must be positive");
  if (o.output_len < 2)
    return InvalidArgumentError("--output-len must be at least 2 offline (one prefill token + decode)");
  EngineConfig config = base;
  config.scheduler.max_num_seqs = std::max(config.scheduler.max_num_seqs, batch_size);
  if (o.fit_token_budget) {
    config.scheduler.max_num_batched_tokens =
        std::max<int32_t>(config.scheduler.max_num_batched_tokens, batch_size * o.input_len);
  }
  config.synthetic_prefill = o.synthetic_prefill;
  const bool prefill_first = o.prefill_first || o.synthetic_prefill;
  if (o.fit_kv_blocks) config.num_blocks = OfflineKvBlocks(batch_size, o.input_len, o.output_len, config.block_size);
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, EngineCore::Create(model, backend, config));

  const int64_t vocab = model.config().vocab_size;
  std::mt19937_64 rng(o.seed + static_cast<uint64_t>(batch_size) * 7919);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  auto make_prompts = [&] {
    std::vector<std::vector<int32_t>> p(static_cast<size_t>(batch_size));
    for (auto& v : p) {
      v.resize(static_cast<size_t>(o.input_len));
      for (int32_t& t : v) t = tok(rng);
    }
    return p;
  };
  for (int32_t w = 0; w < o.warmup; ++w) {
    FATHOM_ASSIGN_OR_RETURN(Pass ignored, RunPass(*core, make_prompts(), 2, o.temperature, fmt::format("warmup{}", w)));
    (void)ignored;
  }
  const std::vector<std::vector<int32_t>> prompts = make_prompts();
  Pass first;
  if (prefill_first) {
    if (!config.enable_prefix_caching) {
      return InvalidArgumentError(fmt::format("{} needs prefix caching (drop --no-enable-prefix-caching)",
                                              o.prefill_first ? "--prefill-first" : "--synthetic-prefill"));
    }
    FATHOM_ASSIGN_OR_RETURN(first, RunPass(*core, prompts, 1, o.temperature, "prefill"));
  }
  FATHOM_ASSIGN_OR_RETURN(Pass pass, RunPass(*core, prompts, o.output_len, o.temperature, "bench"));
  if (prefill_first) {  // the prefill figures are the first pass's: the measured one found the prompts cached
    pass.prefill_s = first.prefill_s;
    pass.prefill_steps = first.prefill_steps;
    pass.ttft_s = first.ttft_s;
  }

  OfflineLevel r;
  r.batch_size = batch_size;
  r.input_len = o.input_len;
  r.output_len = o.output_len;
  r.synthetic_prefill = o.synthetic_prefill;
  if (!o.synthetic_prefill) {
    r.prefill_s = pass.prefill_s;
    r.prefill_steps = pass.prefill_steps;
    r.prefill_tokens_per_s = pass.prefill_s > 0 ? static_cast<double>(batch_size) * o.input_len / pass.prefill_s : 0;
    r.ttft_s = Summarize(pass.ttft_s);
  }
  const int64_t steps = static_cast<int64_t>(pass.decode_steps_s.size());
  for (double s : pass.decode_steps_s) r.decode_s += s;
  r.decode_step_s = Summarize(pass.decode_steps_s);
  r.decode_tokens_per_s = r.decode_s > 0 ? pass.decode_tokens / r.decode_s : 0;
  r.decode_batch_mean = steps > 0 ? pass.decode_tokens / static_cast<double>(steps) : 0;
  r.total_s = pass.total_s;
  if (steps > 0) {
    r.forward_s_per_step =
        (pass.after.total_forward_s - pass.before_decode.total_forward_s) / static_cast<double>(steps);
    r.cpu_s_per_step = (pass.after.total_step_cpu_s - pass.before_decode.total_step_cpu_s) / static_cast<double>(steps);
    r.collective_s_per_step =
        (pass.after.total_collective_s - pass.before_decode.total_collective_s) / static_cast<double>(steps);
  }
  r.preemptions = pass.after.num_preemptions - pass.start.num_preemptions;
  if (r.prefill_s > 0 && peaks.flops > 0) {
    r.prefill_mfu = costs.PrefillFlops(batch_size, o.input_len) / pass.prefill_s / peaks.flops;
  }
  const double context = steps > 0 ? pass.context_sum / static_cast<double>(steps) : o.input_len;
  // The roofline of the batch the decode steps held (a step reads the weights once for however many sequences).
  const int64_t held = steps > 0 ? std::max<int64_t>(1, std::llround(r.decode_batch_mean)) : batch_size;
  r.roofline = DecodeRoofline(costs, peaks, held, context, r.decode_step_s.mean);
  return r;
}

}  // namespace fathom::bench
