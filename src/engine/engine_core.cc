#include "engine/engine_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/job_thread.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "obs/trace.h"

namespace fathom {

namespace {

double Seconds(sched::TimePoint a, sched::TimePoint b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t MixSeed(uint64_t seed, uint64_t index) {
  uint64_t x = seed + 0x9e3779b97f4a7c15ULL * (index + 1);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string SampleId(const std::string& request_id, int32_t index) {
  return index == 0 ? request_id : fmt::format("{}#{}", request_id, index);
}

}  // namespace

struct EngineCore::ReqState {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::shared_ptr<RequestStream> stream;
  sched::TimePoint arrival;
  int32_t open_samples = 0;
  bool forked = false;
  uint64_t trace_flow_id = 0;
  bool traced_first_token = false;
};

struct EngineCore::SampleState {
  SampleState(ReqState* r, int32_t i, uint64_t seed) : req(r), index(i), rng(seed) {}
  ReqState* req;
  int32_t index;
  SamplerRng rng;
  std::unique_ptr<TextStream> detok;
  std::unique_ptr<grammar::GrammarMatcher> matcher;  // with a structured-output constraint
  bool matcher_waiting = false;                      // until sampling.grammar_after_token is written
  grammar::GrammarMatcher* active_matcher() const { return matcher_waiting ? nullptr : matcher.get(); }
  std::optional<sched::TimePoint> first_token;
  double detok_s = 0.0;
  double grammar_s = 0.0;  // mask and accept time
};

namespace {

// `matcher`'s mask over the model's `vocab` ids in `out` (ceil(vocab / 32) words): ids at or past the matcher's
// vocabulary (the tokenizer's, which may be narrower than the model's, or wider) are disallowed, as are the bits past
// `vocab` in the last word.
void FillRowMask(grammar::GrammarMatcher& matcher, std::span<uint32_t> out, int64_t vocab) {
  const size_t words = matcher.vocab().mask_words();
  if (words <= out.size()) {
    matcher.FillMask(out.first(words));
  } else {
    thread_local std::vector<uint32_t> wide;
    wide.resize(words);
    matcher.FillMask(wide);
    std::copy_n(wide.begin(), out.size(), out.begin());
  }
  const size_t known = std::min(matcher.vocab().size(), static_cast<size_t>(vocab));
  size_t full = known / 32;
  if (known % 32 != 0) out[full++] &= (1u << (known % 32)) - 1;
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(full), out.end(), 0u);
}

}  // namespace

StatusOr<std::vector<int64_t>> LoadEosTokenIds(const std::string& model_path, const ModelConfig& cfg) {
  namespace fs = std::filesystem;
  fs::path dir = fs::is_directory(model_path) ? fs::path(model_path) : fs::path(model_path).parent_path();
  const fs::path gen = dir / "generation_config.json";
  if (!fs::exists(gen)) return cfg.eos_token_ids;
  std::ifstream in(gen);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLossError(fmt::format("{} is not a JSON object", gen.string()));
  auto e = j.find("eos_token_id");
  if (e == j.end() || e->is_null()) return cfg.eos_token_ids;
  std::vector<int64_t> ids;
  if (e->is_number_integer()) {
    ids.push_back(e->get<int64_t>());
  } else if (e->is_array()) {
    for (const auto& v : *e) {
      if (!v.is_number_integer())
        return DataLossError(fmt::format("{}: eos_token_id holds a non-integer", gen.string()));
      ids.push_back(v.get<int64_t>());
    }
  } else {
    return DataLossError(fmt::format("{}: eos_token_id must be an integer or a list", gen.string()));
  }
  return ids;
}

namespace {

// On a GPU the first launch of each kernel (lazy module loading) and the first GEMM of each shape (cuBLASLt plans)
// cost milliseconds. A prefill and a decode pass at startup pay that before the first request rather than in its
// TTFT. The blocks they write are free and are overwritten before anything reads them.
Status WarmUp(Model& model, Backend& backend, KvCache& kv, const EngineConfig& config) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t bs = kv.block_size();
  const int64_t prefill = std::min<int64_t>(
      {config.scheduler.max_num_batched_tokens, config.scheduler.max_model_len, kv.num_blocks() * bs, 512});
  if (prefill < 2) return OkStatus();
  FATHOM_LOG_INFO("warming up the {} backend: a {}-token prefill and a decode step", backend.name(), prefill);
  std::vector<int32_t> table(static_cast<size_t>((prefill + bs - 1) / bs));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  const std::vector<int32_t> prompt(static_cast<size_t>(prefill - 1), 0), next = {0};
  Tensor logits;
  ForwardBatch p(static_cast<int32_t>(bs));
  p.AddSequence(prompt, 0, table, LogitsMode::kLast);
  FATHOM_RETURN_IF_ERROR(model.Forward(p, kv, &logits));
  ForwardBatch d(static_cast<int32_t>(bs));
  d.AddSequence(next, static_cast<int32_t>(prefill - 1), table, LogitsMode::kLast);
  FATHOM_RETURN_IF_ERROR(model.Forward(d, kv, &logits));
  Tensor ids = backend.Alloc(DType::kI32, {logits.dim(0)});
  backend.ArgMax(logits, ids);
  FATHOM_RETURN_IF_ERROR(backend.Synchronize());
  FATHOM_LOG_INFO("warm-up done in {:.0f} ms",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<EngineCore>> EngineCore::Create(Model& model, Backend& backend, EngineConfig config,
                                                         TextStreamFactory text, sched::NowFn now) {
  if (config.block_size <= 0) return InvalidArgumentError("block size must be positive");
  const KvCacheSpec spec = model.kv_cache_spec();
  const DType kv_dtype = config.kv_cache_dtype.value_or(backend.kv_cache_dtype());
  if (!IsKvCacheDtype(kv_dtype) || !backend.SupportsKvCacheDtype(kv_dtype)) {
    return InvalidArgumentError(
        fmt::format("a KV cache of dtype {} is not supported by the {} backend", DTypeName(kv_dtype), backend.name()));
  }
  // A window group's blocks (DeepSeek-V4's window rows) come first out of the budget: as many as the running
  // sequences and a step's tokens can hold at once (KvCacheSpec::WindowBlocksFor), so that they never run short.
  const int64_t window_blocks =
      spec.WindowBlocksFor(config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens, config.block_size);
  if (config.num_blocks <= 0) {
    const int64_t per_block = spec.bytes_per_block(kv_dtype, config.block_size);
    const int64_t window_bytes = window_blocks * spec.window_bytes_per_block(kv_dtype, config.block_size);
    const int64_t blocks = per_block > 0 ? (config.kv_cache_memory_bytes - window_bytes) / per_block : 0;
    if (blocks < 1) {
      return InvalidArgumentError(fmt::format(
          "the KV-cache budget of {} bytes holds no block of {} bytes{}", config.kv_cache_memory_bytes, per_block,
          window_bytes > 0 ? fmt::format(" beside the window rows' {} bytes for {} sequences (lower --max-num-seqs or "
                                         "raise --kv-cache-memory)",
                                         window_bytes, config.scheduler.max_num_seqs)
                           : ""));
    }
    config.num_blocks = static_cast<int32_t>(std::min<int64_t>(blocks, 1 << 24));
  }
  if (config.scheduler.max_model_len <= 0 || config.scheduler.max_model_len > model.config().max_position_embeddings) {
    config.scheduler.max_model_len = static_cast<int32_t>(model.config().max_position_embeddings);
  }
  if (config.eos_token_ids.empty()) config.eos_token_ids = model.config().eos_token_ids;
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<sched::SchedulingPolicy> policy, sched::MakePolicy(config.policy));
  FATHOM_ASSIGN_OR_RETURN(
      KvCache kv, KvCache::Allocate(backend, spec, kv_dtype, config.num_blocks, config.block_size, window_blocks));
  if (config.synthetic_prefill) FATHOM_RETURN_IF_ERROR(FillKvCacheRandom(backend, kv, config.seed.value_or(0)));
  (void)policy;  // validated here; the core builds its own
  if (backend.device() != Device::kCpu) FATHOM_RETURN_IF_ERROR(WarmUp(model, backend, kv, config));
  std::unique_ptr<EngineCore> core(
      new EngineCore(model, backend, std::move(config), std::move(kv), std::move(text), std::move(now)));
  FATHOM_RETURN_IF_ERROR(core->SetUpGraphs());
  return core;
}

Status EngineCore::SetUpGraphs() {
  if (config_.enforce_eager || !backend_.SupportsGraphs()) return OkStatus();
  DecodeGraphOptions o;
  o.max_batch = config_.scheduler.max_num_seqs;
  o.max_model_len = config_.scheduler.max_model_len;
  auto graphs = std::make_unique<DecodeGraphs>(model_, backend_, kv_, o);
  if (!graphs->enabled()) {
    FATHOM_LOG_INFO("decode graphs: off ({} has no device-only forward)", model_.config().architecture);
    return OkStatus();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int total = static_cast<int>(graphs->batch_buckets().size());
  Progress progress(
      fmt::format("capturing decode graphs (batch 1..{}, context {})", o.max_batch, graphs->context_buckets().front()),
      total);
  if (Status s = graphs->CaptureCommon([&](int, int) { progress.Advance(1); }); !s.ok()) {
    // A forward that cannot be recorded (one that reads results back on the host) still serves, op by op.
    progress.Finish();
    FATHOM_LOG_WARN("decode graphs: off (capture failed: {}); decode steps run eagerly", s.message());
    return OkStatus();
  }
  progress.Finish();
  FATHOM_LOG_INFO(
      "decode graphs: {} captured in {:.0f} ms for {} batch buckets; longer contexts (buckets up to {}) are captured "
      "when first needed; --enforce-eager turns graphs off",
      graphs->num_graphs(), std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      total, graphs->context_buckets().back());
  graphs_ = std::move(graphs);
  return OkStatus();
}

EngineCore::EngineCore(Model& model, Backend& backend, EngineConfig config, KvCache kv, TextStreamFactory text,
                       sched::NowFn now)
    : model_(model),
      backend_(backend),
      config_(std::move(config)),
      kv_(std::move(kv)),
      text_(std::move(text)),
      now_(std::move(now)),
      sched_(config_.scheduler,
             {.num_blocks = config_.num_blocks,
              .block_size = config_.block_size,
              .enable_prefix_caching = config_.enable_prefix_caching,
              .window_tokens = static_cast<int32_t>(kv_.spec().window_tokens),
              .window_blocks = static_cast<int32_t>(kv_.window_blocks())},
             std::move(sched::MakePolicy(config_.policy)).value(), now_),
      seed_source_(config_.seed ? *config_.seed : std::random_device{}()) {}

// The step's masks are one job on a JobThread of its own, which runs it on a small pool of its own (the thread counts
// as one of the pool's): StartMasks submits it before the forward pass is issued and FinishMasks waits for it. Not the
// default pool, which a CPU forward pass and the host sampler use.
class EngineCore::MaskWorker {
 public:
  explicit MaskWorker(int threads) : pool_(threads), thread_([] { obs::SetTraceThreadName("grammar masks"); }) {}
  ThreadPool& pool() { return pool_; }
  void Submit(std::function<void()> job) { thread_.Submit(std::move(job)); }
  void Wait() { thread_.Wait(); }

 private:
  ThreadPool pool_;
  JobThread thread_;
};

EngineCore::~EngineCore() {
  if (mask_worker_ != nullptr) mask_worker_->Wait();
}

Status EngineCore::Validate(const EngineRequest& r) const {
  const int64_t vocab = model_.config().vocab_size;
  if (r.prompt.empty()) return InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return InvalidArgumentError(
          fmt::format("prompt token {} at position {} is outside the vocabulary [0, {})", r.prompt[i], i, vocab));
    }
  }
  FATHOM_RETURN_IF_ERROR(r.sampling.Validate(vocab));
  if (!r.sampling.stop.empty() && !text_) {
    return InvalidArgumentError("stop strings need a tokenizer; this engine has none");
  }
  const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
  const int64_t wanted = prompt_len + std::max(r.sampling.max_tokens, 1);
  if (wanted > config_.scheduler.max_model_len) {
    return InvalidArgumentError(
        fmt::format("this request needs {} tokens ({} in the prompt + {} to generate) but the maximum context length "
                    "(--max-model-len) is {}; shorten the prompt or lower max_tokens",
                    wanted, prompt_len, std::max(r.sampling.max_tokens, 1), config_.scheduler.max_model_len));
  }
  return OkStatus();
}

Status EngineCore::AddRequest(EngineRequest r, std::shared_ptr<RequestStream> stream) {
  FATHOM_CHECK(stream != nullptr);
  FATHOM_RETURN_IF_ERROR(Validate(r));
  if (r.id.empty()) r.id = fmt::format("req-{}", next_auto_id_++);
  if (requests_.count(r.id) != 0) return AlreadyExistsError(fmt::format("request '{}' already exists", r.id));
  const int32_t n = r.sampling.n;
  for (int32_t i = 1; i < n; ++i) {
    if (sched_.Find(SampleId(r.id, i)) != nullptr) {
      return AlreadyExistsError(fmt::format("request '{}' already exists", SampleId(r.id, i)));
    }
  }
  const sched::TimePoint arrival = r.arrival ? *r.arrival : now_();
  FATHOM_RETURN_IF_ERROR(sched_.AddRequest({.id = r.id,
                                            .prompt = r.prompt,
                                            .max_tokens = r.sampling.max_tokens,
                                            .priority = r.priority,
                                            .cache_salt = r.cache_salt,
                                            .arrival = arrival}));
  auto rs = std::make_unique<ReqState>();
  rs->id = r.id;
  rs->prompt = std::move(r.prompt);
  rs->sampling = std::move(r.sampling);
  rs->stream = std::move(stream);
  rs->arrival = arrival;
  rs->trace_flow_id = r.trace_flow_id;
  rs->open_samples = n;
  const uint64_t seed = rs->sampling.seed ? *rs->sampling.seed : seed_source_();
  for (int32_t i = 0; i < n; ++i) {
    auto s = std::make_unique<SampleState>(rs.get(), i, i == 0 ? seed : MixSeed(seed, static_cast<uint64_t>(i)));
    if (text_) s->detok = text_(rs->prompt, rs->sampling.stop);
    if (rs->sampling.grammar) {
      s->matcher = std::make_unique<grammar::GrammarMatcher>(rs->sampling.grammar);
      s->matcher_waiting = rs->sampling.grammar_after_token >= 0;
    }
    samples_.emplace(SampleId(rs->id, i), std::move(s));
  }
  requests_.emplace(rs->id, std::move(rs));
  return OkStatus();
}

RequestOutput EngineCore::BaseOutput(const SampleState& s) const {
  RequestOutput out;
  out.request_id = s.req->id;
  out.index = s.index;
  return out;
}

void EngineCore::FinishSample(const std::string& sample_id, RequestOutput out, bool in_scheduler,
                              bool drop_last_token) {
  auto it = samples_.find(sample_id);
  FATHOM_CHECK(it != samples_.end());
  SampleState& s = *it->second;
  ReqState* rq = s.req;
  const sched::TimePoint now = now_();
  out.finished = true;
  out.prompt_tokens = static_cast<int32_t>(rq->prompt.size());
  out.prompt_cache_miss_tokens = out.prompt_tokens;
  out.timings.detokenize = s.detok_s;
  out.timings.grammar = s.grammar_s;
  if (const sched::Request* r = sched_.Find(sample_id); r != nullptr) {
    out.completion_tokens = r->num_output_tokens() - (drop_last_token ? 1 : 0);
    if (r->started) {
      out.prompt_cache_hit_tokens = r->prompt_cache_hit_tokens;
      out.prompt_cache_miss_tokens = r->prompt_cache_miss_tokens();
      out.timings.queue_wait = Seconds(rq->arrival, r->first_scheduled);
      if (s.first_token) {
        out.timings.prefill = Seconds(r->first_scheduled, *s.first_token);
        out.timings.ttft = Seconds(rq->arrival, *s.first_token);
        out.timings.decode = Seconds(*s.first_token, now);
      }
    } else {
      out.timings.queue_wait = Seconds(rq->arrival, now);
    }
  }
  if (in_scheduler) (void)sched_.Finish(sample_id);
  rq->stream->Push(std::move(out));
  samples_.erase(it);
  if (--rq->open_samples == 0) {
    const std::string id = rq->id;  // the key must outlive the erase
    finished_ids_.push_back(id);
    requests_.erase(id);
  }
}

void EngineCore::FailRequest(const std::string& request_id, FinishReason reason, const Status& status) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  ReqState* rq = it->second.get();
  const int32_t n = rq->sampling.n;
  for (int32_t i = 0; i < n; ++i) {
    const std::string sid = SampleId(request_id, i);
    auto s = samples_.find(sid);
    if (s == samples_.end()) continue;  // already finished
    RequestOutput out = BaseOutput(*s->second);
    out.finish_reason = reason;
    out.status = status;
    if (s->second->detok) out.text = s->second->detok->Flush();
    FinishSample(sid, std::move(out), sched_.Find(sid) != nullptr);
  }
}

bool EngineCore::Abort(const std::string& id, const Status& reason) {
  if (requests_.count(id) == 0) return false;
  FailRequest(id, FinishReason::kAbort, reason);
  return true;
}

void EngineCore::AbortAll(const Status& reason) {
  EndAll(FinishReason::kAbort, reason);
}

void EngineCore::FailAll(const Status& error) {
  EndAll(FinishReason::kError, error);
}

void EngineCore::EndAll(FinishReason reason, const Status& status) {
  std::vector<std::string> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (const std::string& id : ids) FailRequest(id, reason, status);
}

void EngineCore::EmitToken(const std::string& sample_id, const SampleResult& r) {
  SampleState& s = *samples_.at(sample_id);
  const SamplingParams& p = s.req->sampling;
  if (s.req->trace_flow_id != 0 && s.index == 0 && obs::TracingEnabled() && !s.req->traced_first_token) {
    s.req->traced_first_token = true;
    obs::TraceFlowStep("request", "flow", s.req->trace_flow_id);  // the request's arrow passes its first token
  }
  sched_.AppendToken(sample_id, r.token);
  const sched::Request* sr = sched_.Find(sample_id);
  const sched::TimePoint now = now_();
  if (!s.first_token) s.first_token = now;
  ++stats_.num_generated_tokens;

  RequestOutput out = BaseOutput(s);
  out.token_ids.push_back(r.token);
  if (p.logprobs || p.top_logprobs > 0) out.logprobs.push_back(r);
  const int32_t produced = sr->num_output_tokens();
  FinishReason reason = FinishReason::kNone;
  bool grammar_done = false;
  if (s.matcher && s.matcher_waiting) {
    s.matcher_waiting = r.token != p.grammar_after_token;
  } else if (s.matcher) {
    const auto t0 = sched::SteadyClock::now();
    const bool accepted = s.matcher->AcceptToken(r.token);
    s.grammar_s += Seconds(t0, sched::SteadyClock::now());
    if (!accepted && s.matcher->CanEnd()) {
      // The grammar is complete here and its end was all it allowed, but min_tokens (or a stop id or logit_bias)
      // kept EOS from being sampled, so the mask left nothing. The grammar wins: the output ends here, valid, and
      // the token sampled from nothing is dropped. (The server refuses a min_tokens that no choice could reach.)
      out.token_ids.clear();
      out.logprobs.clear();
      out.finish_reason = FinishReason::kStop;
      FinishSample(sample_id, std::move(out), /*in_scheduler=*/true, /*drop_last_token=*/true);
      return;
    }
    if (!accepted) {
      // Only when the mask left nothing to sample (logit_bias against every allowed token, say).
      out.finish_reason = FinishReason::kError;
      out.status = FailedPreconditionError(
          fmt::format("structured output: token {} is not allowed by the request's grammar here (no allowed token "
                      "had a finite logit)",
                      r.token));
      FinishSample(sample_id, std::move(out), /*in_scheduler=*/true);
      return;
    }
    grammar_done = s.matcher->terminated();
  }
  if (produced >= p.min_tokens) {
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), r.token) != p.stop_token_ids.end()) {
      reason = FinishReason::kStop;
      out.stop_reason = std::to_string(r.token);
    } else if (!p.ignore_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(),
                                          static_cast<int64_t>(r.token)) != config_.eos_token_ids.end()) {
      reason = FinishReason::kStop;
    }
  }
  if (s.detok && reason == FinishReason::kNone) {
    const auto t0 = sched::SteadyClock::now();
    DetokenizeStep d = s.detok->Add(r.token);
    s.detok_s += Seconds(t0, sched::SteadyClock::now());
    out.text = std::move(d.delta);
    if (d.stopped) {
      reason = FinishReason::kStop;
      out.stop_reason = d.stop;
    }
  }
  // The grammar took EOS: the output is complete, even under ignore_eos.
  if (reason == FinishReason::kNone && grammar_done) reason = FinishReason::kStop;
  if (reason == FinishReason::kNone &&
      (produced >= sr->max_tokens || sr->num_tokens() >= config_.scheduler.max_model_len)) {
    reason = FinishReason::kLength;
  }
  if (reason == FinishReason::kNone) {
    s.req->stream->Push(std::move(out));
    return;
  }
  if (s.detok) out.text += s.detok->Flush();
  out.finish_reason = reason;
  FinishSample(sample_id, std::move(out), /*in_scheduler=*/true);
}

SamplingContext EngineCore::StepRow::context(const std::vector<int64_t>& eos_ids) const {
  const std::span<const int32_t> all(request->tokens);
  const size_t prompt_len = static_cast<size_t>(request->prompt_len);
  return {all.first(prompt_len), all.subspan(prompt_len), eos_ids};
}

std::vector<EngineCore::StepRow> EngineCore::StepRows(const sched::SchedulerOutput& plan) {
  std::vector<StepRow> rows;
  int64_t r = 0;
  for (const sched::ScheduledSeq& seq : plan.seqs) {
    if (!seq.samples) continue;
    StepRow row;
    row.row = r++;
    row.seq = &seq;
    auto sit = samples_.find(seq.id);
    const sched::Request* request = sched_.Find(seq.id);
    if (sit != samples_.end() && request != nullptr) {
      row.sample = sit->second.get();
      row.request = request;
      row.forks = row.sample->req->sampling.n > 1 && !row.sample->req->forked;
    }
    rows.push_back(row);
  }
  return rows;
}

EngineCore::SamplePath EngineCore::ChooseSamplePath(const std::vector<StepRow>& rows) const {
  if (rows.empty()) return SamplePath::kHost;
  bool forks = false, plain_greedy = true;
  for (const StepRow& r : rows) {
    if (!r.live()) continue;
    forks = forks || r.forks;
    plain_greedy = plain_greedy && IsPlainGreedy(r.sample->req->sampling, r.context(config_.eos_token_ids));
  }
  // Constrained rows take any path: their logits were masked on the device already (StartMasks, FinishMasks).
  // A row that forks into its n samples draws them on the host from its logits row.
  if (forks) return SamplePath::kHost;
  // When every sampled row is plain greedy, only the argmax ids cross to the host (4 bytes a row, not 4 x vocab).
  if (plain_greedy) return SamplePath::kDeviceArgMax;
  // Otherwise the backend samples every row on the device where it can (the host sampler's rule, at each sample's
  // Philox draw).
  if (!config_.host_sampling && backend_.SupportsSampling()) return SamplePath::kDeviceSample;
  return SamplePath::kHost;
}

Status EngineCore::SampleOnBackend(SamplePath path, const TensorView& logits, const std::vector<StepRow>& rows,
                                   std::vector<SampleResult>* results) {
  const int64_t n = static_cast<int64_t>(rows.size());
  results->assign(rows.size(), SampleResult{});
  switch (path) {
    case SamplePath::kDeviceArgMax: {
      Tensor ids = backend_.Alloc(DType::kI32, {n});
      backend_.ArgMax(logits, ids);
      host_ids_.resize(static_cast<size_t>(n));
      FATHOM_RETURN_IF_ERROR(backend_.CopyToHost(ids, host_ids_.data()));
      for (size_t i = 0; i < rows.size(); ++i) (*results)[i].token = host_ids_[i];
      return OkStatus();
    }
    case SamplePath::kDeviceSample: {
      const int64_t vocab = model_.config().vocab_size;
      device_rows_.clear();
      device_adjust_.clear();
      for (const StepRow& r : rows) {
        if (!r.live()) {
          device_rows_.push_back({});  // a row nobody reads: greedy
          continue;
        }
        device_rows_.push_back(DeviceSampleRow(r.sample->req->sampling, r.context(config_.eos_token_ids), r.sample->rng,
                                               vocab, device_adjust_));
      }
      device_sampled_.assign(device_rows_.size(), SampledToken{});
      FATHOM_RETURN_IF_ERROR(backend_.SampleRows(logits, device_rows_, device_adjust_, device_sampled_));
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!rows[i].live()) continue;
        SampleState& st = *rows[i].sample;
        if (!st.req->sampling.greedy()) st.rng.Skip();  // the device took this sample's next draw
        (*results)[i] = FromDevice(device_sampled_[i], st.req->sampling);
      }
      return OkStatus();
    }
    case SamplePath::kHost:
      host_logits_.resize(static_cast<size_t>(n * model_.config().vocab_size));
      return backend_.CopyToHost(logits, host_logits_.data());
  }
  return OkStatus();
}

void EngineCore::SampleOnHost(const std::vector<StepRow>& rows, std::vector<SampleResult>* results) {
  // Each sample has its own RNG, and a sampled row of a 129k vocabulary costs about 1.4 ms: the rows run in parallel.
  // Forking rows are sampled when they are emitted (EmitRows).
  const int64_t vocab = model_.config().vocab_size;
  DefaultThreadPool().ParallelFor(static_cast<int64_t>(rows.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const StepRow& r = rows[static_cast<size_t>(i)];
      if (!r.live() || r.forks) continue;
      const std::span<const float> logits_row(host_logits_.data() + r.row * vocab, static_cast<size_t>(vocab));
      (*results)[static_cast<size_t>(i)] =
          Sample(logits_row, r.sample->req->sampling, r.context(config_.eos_token_ids), r.sample->rng);
    }
  });
}

void EngineCore::EmitRows(const std::vector<StepRow>& rows, const std::vector<SampleResult>& results) {
  const int64_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < rows.size(); ++i) {
    const StepRow& r = rows[i];
    if (!r.live()) continue;
    if (!r.forks) {
      EmitToken(r.seq->id, results[i]);
      continue;
    }
    // The first token of every sample comes from this row; the samples then share the prompt's blocks.
    ReqState* rq = r.sample->req;
    rq->forked = true;
    const SamplingContext ctx = r.context(config_.eos_token_ids);
    // Masked already when constrained: every sample's matcher is at its start, as sample 0's was.
    const std::span<const float> logits_row(host_logits_.data() + r.row * vocab, static_cast<size_t>(vocab));
    std::vector<std::string> ids = {r.seq->id};
    for (int32_t s = 1; s < rq->sampling.n; ++s) {
      const std::string child = SampleId(rq->id, s);
      Status fs = sched_.Fork(r.seq->id, child);
      FATHOM_CHECK(fs.ok(), "{}", fs.ToString());
      ids.push_back(child);
    }
    std::vector<SampleResult> forked;
    for (const std::string& id : ids) forked.push_back(Sample(logits_row, rq->sampling, ctx, samples_.at(id)->rng));
    for (size_t s = 0; s < ids.size(); ++s) EmitToken(ids[s], forked[s]);
  }
}

void EngineCore::StartMasks(const std::vector<StepRow>& rows) {
  FATHOM_CHECK(!masks_pending_, "StartMasks twice without FinishMasks");
  mask_rows_.clear();
  mask_samples_.clear();
  for (const StepRow& r : rows) {
    if (!r.live() || r.sample->active_matcher() == nullptr) continue;  // a waiting matcher does not mask yet
    mask_rows_.push_back(static_cast<int32_t>(r.row));
    mask_samples_.push_back(r.sample);
  }
  if (mask_rows_.empty()) return;
  masks_pending_ = true;
  const int64_t vocab = model_.config().vocab_size, words = (vocab + 31) / 32;
  mask_words_.resize(mask_rows_.size() * static_cast<size_t>(words));
  if (!OverlapMasks()) return;  // filled in FinishMasks, after the forward pass
  if (mask_worker_ == nullptr) {
    // A row's mask costs tens of microseconds (milliseconds at a state's first visit): a few threads hide 64 rows
    // behind a decode step; the rest of the cores stay with the HTTP threads and the host sampler.
    const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
    mask_worker_ = std::make_unique<MaskWorker>(threads);
  }
  mask_worker_->Submit([this] { FillMasks(mask_worker_->pool()); });
}

void EngineCore::FillMasks(ThreadPool& pool) {
  obs::TraceSpan span("grammar mask", "engine");
  span.Arg("rows", static_cast<int64_t>(mask_rows_.size()));
  const auto t0 = sched::SteadyClock::now();
  const int64_t vocab = model_.config().vocab_size, words = (vocab + 31) / 32;
  pool.ParallelFor(static_cast<int64_t>(mask_rows_.size()), 1, [&](int64_t lo, int64_t hi) {  // [rows]
    for (int64_t i = lo; i < hi; ++i) {
      SampleState& s = *mask_samples_[static_cast<size_t>(i)];
      const auto m0 = sched::SteadyClock::now();
      FillRowMask(*s.active_matcher(),
                  std::span<uint32_t>(mask_words_).subspan(static_cast<size_t>(i * words), static_cast<size_t>(words)),
                  vocab);
      s.grammar_s += Seconds(m0, sched::SteadyClock::now());
    }
  });
  mask_fill_s_ = Seconds(t0, sched::SteadyClock::now());  // read by FinishMasks once the job is done
}

Status EngineCore::FinishMasks(const TensorView* logits) {
  if (!masks_pending_) return OkStatus();
  masks_pending_ = false;
  const auto t0 = sched::SteadyClock::now();
  if (OverlapMasks()) {
    mask_worker_->Wait();
  } else {
    FillMasks(DefaultThreadPool());
  }
  stats_.total_grammar_mask_s += mask_fill_s_;
  stats_.total_grammar_wait_s += Seconds(t0, sched::SteadyClock::now());
  if (logits == nullptr) return OkStatus();
  return backend_.MaskLogits(*logits, mask_rows_, mask_words_, (model_.config().vocab_size + 31) / 32);
}

bool EngineCore::OverlapMasks() const {
  return config_.overlap_grammar_masks.value_or(backend_.device() != Device::kCpu);
}

Status EngineCore::Step() {
  const auto t0 = sched::SteadyClock::now();
  sched::SchedulerOutput plan = sched_.Schedule();
  for (const sched::TimedOut& t : plan.timed_out) {
    // The scheduler already dropped it; finish every sample of its request with the status.
    auto it = requests_.find(t.id);
    if (it == requests_.end()) continue;
    for (int32_t i = 0; i < it->second->sampling.n; ++i) {
      const std::string sid = SampleId(t.id, i);
      if (samples_.count(sid) == 0) continue;
      RequestOutput out = BaseOutput(*samples_.at(sid));
      out.finish_reason = FinishReason::kError;
      out.status = t.status;
      FinishSample(sid, std::move(out), /*in_scheduler=*/false);
      if (requests_.count(t.id) == 0) break;
    }
  }
  if (plan.empty()) return OkStatus();
  ++stats_.num_steps;
  bool skip_forward = false;  // a synthetic prefill's step (EngineConfig::synthetic_prefill)
  {
    bool any_prefill = false, any_decode = false;
    int32_t tokens = 0;
    for (const sched::ScheduledSeq& seq : plan.seqs) {
      tokens += seq.num_new;
      const bool decode = seq.request != nullptr && seq.num_computed >= seq.request->prompt_len && seq.num_new == 1;
      (decode ? any_decode : any_prefill) = true;
    }
    stats_.last_step_kind = any_prefill && any_decode ? "mixed" : (any_prefill ? "prefill" : "decode");
    skip_forward = config_.synthetic_prefill && !any_decode;
    stats_.last_step_tokens = tokens;
    stats_.last_step_seqs = static_cast<int32_t>(plan.seqs.size());
  }
  std::vector<KvBlockCopy> copies;
  copies.reserve(plan.copies.size());
  for (const kv::BlockCopy& c : plan.copies) copies.push_back({c.src, c.dst, c.group});
  Status status = model_.CopyKvBlocks(backend_, kv_, copies);
  ForwardBatch batch = sched_.MakeForwardBatch(plan);
  if (status.ok()) {
    status =
        batch.Validate(kv_.num_blocks(), model_.config().vocab_size, kv_.window_blocks(), kv_.spec().window_tokens);
  }
  const std::vector<StepRow> rows = StepRows(plan);
  // Structured output: the masks of this step's constrained rows depend only on the tokens sampled so far, so on a
  // GPU they are computed while the forward pass runs, then applied on the device before any path samples.
  if (status.ok()) StartMasks(rows);
  const auto t1 = sched::SteadyClock::now();
  Tensor eager_logits;
  TensorView logits;  // [n_logits, vocab]
  bool replayed = false;
  if (status.ok() && !skip_forward && graphs_ != nullptr && graphs_->Accepts(batch)) {
    status = graphs_->Run(batch, &logits);
    replayed = status.ok();
    if (!status.ok() && !graphs_->Accepts(batch)) {
      // The capture failed: this bucket runs eagerly from now on.
      FATHOM_LOG_WARN("{}; running such steps without a graph", status.message());
      status = OkStatus();
    }
  }
  if (status.ok() && !replayed && skip_forward) {
    eager_logits = backend_.Alloc(DType::kF32, {batch.num_logits(), model_.config().vocab_size});
    status = backend_.FillDummy(eager_logits, 0, 0.0f, 0.0f);
    if (status.code() == StatusCode::kUnimplemented) {
      const std::vector<float> zeros(static_cast<size_t>(eager_logits.numel()), 0.0f);
      status = backend_.CopyFromHost(zeros.data(), eager_logits);
      if (status.ok()) status = backend_.Synchronize();
    }
    logits = eager_logits.view();
  } else if (status.ok() && !replayed) {
    status = model_.Forward(batch, kv_, &eager_logits);
    logits = eager_logits.view();
  }
  if (replayed) ++stats_.num_graph_steps;
  const SamplePath path = ChooseSamplePath(rows);
  {
    const Status masked = FinishMasks(status.ok() ? &logits : nullptr);  // waits for the masks in any case
    if (status.ok()) status = masked;
  }
  std::vector<SampleResult> results;
  if (status.ok()) status = SampleOnBackend(path, logits, rows, &results);
  const auto t2 = sched::SteadyClock::now();
  stats_.total_forward_s += Seconds(t1, t2);
  {
    const double collectives = model_.collective_seconds();  // inside the forward time: tensor-parallel ranks meeting
    stats_.last_step_collective_s = collectives - stats_.total_collective_s;
    stats_.total_collective_s = collectives;
  }
  if (!status.ok()) {
    std::vector<std::string> ids;
    for (const sched::ScheduledSeq& s : plan.seqs) ids.push_back(samples_.at(s.id)->req->id);
    for (const std::string& id : ids) FailRequest(id, FinishReason::kError, status);
    return status;
  }
  sched_.OnStepDone(plan);
  if (path == SamplePath::kHost) SampleOnHost(rows, &results);
  EmitRows(rows, results);
  const auto t3 = sched::SteadyClock::now();
  if (obs::TracingEnabled()) {
    auto ns = [](sched::TimePoint t) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    };
    obs::TraceComplete("schedule", "engine", ns(t0), ns(t1) - ns(t0), {{"seqs", plan.seqs.size()}});
    obs::TraceComplete("forward", "engine", ns(t1), ns(t2) - ns(t1),
                       {{"tokens", stats_.last_step_tokens}, {"collective_ms", stats_.last_step_collective_s * 1e3}});
    obs::TraceComplete("sample+detokenize", "engine", ns(t2), ns(t3) - ns(t2));
  }
  stats_.last_step_cpu_s = Seconds(t0, t1) + Seconds(t2, t3);
  stats_.last_step_s = Seconds(t0, t3);
  stats_.total_step_cpu_s += stats_.last_step_cpu_s;
  return OkStatus();
}

EngineStats EngineCore::Stats() const {
  EngineStats s = stats_;
  const sched::SchedulerStats ss = sched_.Stats();
  s.num_waiting = ss.num_waiting;
  s.num_running = ss.num_running;
  s.num_blocks = sched_.kv().num_blocks();
  s.num_free_blocks = sched_.kv().num_free_blocks();
  s.kv_usage = ss.kv_usage;
  s.prefix_cache_hit_ratio = ss.prefix_cache.hit_ratio();
  s.prefix_cache_queried_tokens = ss.prefix_cache.queried_tokens;
  s.prefix_cache_hit_tokens = ss.prefix_cache.hit_tokens;
  s.num_preemptions = ss.num_preemptions;
  return s;
}

std::vector<std::string> EngineCore::TakeFinishedIds() {
  std::vector<std::string> out;
  out.swap(finished_ids_);
  return out;
}

}  // namespace fathom
