// The synchronous engine core: scheduler + paged KV cache + model + sampler + detokenizer, one Step() at a time.
// Engine (engine.h) runs it on its own thread; tests drive it directly for exact control of arrival steps.
//
//   FATHOM_ASSIGN_OR_RETURN(auto core, EngineCore::Create(*model, backend, config, TokenizerTextStreams(*tok)));
//   auto stream = std::make_shared<RequestStream>("a", /*num_samples=*/1);
//   FATHOM_RETURN_IF_ERROR(core->AddRequest({.id = "a", .prompt = ids, .sampling = {.max_tokens = 8}}, stream));
//   while (core->HasUnfinished()) FATHOM_RETURN_IF_ERROR(core->Step());   // outputs arrive on the streams
//
// Not thread-safe, except Validate(), which only reads immutable configuration.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/decode_graphs.h"
#include "engine/detokenizer.h"
#include "engine/request_stream.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "sched/scheduler.h"

namespace fathom {

struct EngineConfig {
  sched::SchedulerConfig scheduler;
  int32_t block_size = 16;
  int32_t num_blocks = 0;                            // 0: derived from kv_cache_memory_bytes
  int64_t kv_cache_memory_bytes = int64_t{1} << 30;  // --kv-cache-memory
  bool enable_prefix_caching = true;
  std::string policy = "priority";      // fcfs | priority
  std::vector<int64_t> eos_token_ids;   // empty: the model config's
  std::optional<uint64_t> seed;         // seeds requests that have none; unset: random
  bool enforce_eager = false;           // --enforce-eager: no decode graphs (CUDA graphs) on a GPU
  bool host_sampling = false;           // --host-sampling: copy logits rows to the host sampler even on a GPU
  std::optional<DType> kv_cache_dtype;  // --kv-cache-dtype; unset: the backend's kv_cache_dtype()
  // Structured output's masks computed by a worker while the forward pass runs (EngineCore::StartMasks); unset: on a
  // device backend only (a CPU forward pass takes every core). Tests turn it on for the CPU backend.
  std::optional<bool> overlap_grammar_masks;
  // fathom bench --synthetic-prefill: the cache starts filled with random rows (FillKvCacheRandom) and a step of
  // prompt tokens only runs no forward pass (its sampled tokens come from zero logits: token 0 when greedy), so that
  // decode can be measured at contexts whose prefill would take far longer. Never for serving: outputs are garbage.
  bool synthetic_prefill = false;
};

struct EngineRequest {
  std::string id = {};  // empty: the engine assigns one
  std::vector<int32_t> prompt = {};
  SamplingParams sampling = {};
  int32_t priority = 0;
  uint64_t cache_salt = 0;
  std::optional<sched::TimePoint> arrival = std::nullopt;  // default: when the core adds it
  uint64_t trace_flow_id = 0;  // links the request's spans across threads in traces (obs/trace.h); 0: none
};

struct EngineStats {
  int32_t num_waiting = 0;
  int32_t num_running = 0;
  int32_t num_blocks = 0;
  int32_t num_free_blocks = 0;
  double kv_usage = 0.0;
  double prefix_cache_hit_ratio = 0.0;
  int64_t prefix_cache_queried_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_graph_steps = 0;   // decode steps replayed from a captured graph
  double last_step_cpu_s = 0.0;  // scheduling, batch building, sampling and detokenization of the last step
  double total_step_cpu_s = 0.0;
  double total_forward_s = 0.0;  // model execution
  // Structured output's token masks: the CPU time of computing them (on a device backend by the mask worker while the
  // forward pass runs; on the CPU backend after it), and the part of it the engine thread waited for after the
  // forward pass was issued (inside total_forward_s: what the overlap did not hide).
  double total_grammar_mask_s = 0.0;
  double total_grammar_wait_s = 0.0;
  // Tensor parallelism: rank 0's host time in collectives (Model::collective_seconds; inside total_forward_s). On
  // the CPU it includes waiting for the other ranks; on GPUs it is the time to enqueue NCCL's kernels.
  double total_collective_s = 0.0;
  double last_step_collective_s = 0.0;
  // The latest step: "prefill" (only prompt tokens), "decode" (one token per sequence) or "mixed".
  const char* last_step_kind = "";
  double last_step_s = 0.0;  // wall time of the whole step
  int32_t last_step_tokens = 0;
  int32_t last_step_seqs = 0;
};

// EOS ids: generation_config.json's eos_token_id next to the config when present, else config.json's.
StatusOr<std::vector<int64_t>> LoadEosTokenIds(const std::string& model_path, const ModelConfig& cfg);

class EngineCore {
 public:
  // The backend's device made the calling thread's (Engine's thread calls it first: a GPU other than cuda:0).
  Status MakeBackendCurrent() { return backend_.MakeCurrent(); }

  static StatusOr<std::unique_ptr<EngineCore>> Create(Model& model, Backend& backend, EngineConfig config,
                                                      TextStreamFactory text = nullptr,
                                                      sched::NowFn now = sched::SteadyClock::now);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Checks a request against the model and the limits without touching engine state.
  Status Validate(const EngineRequest& request) const;
  // Adds a request; `stream` receives its outputs. Errors (validation, queue full) leave the stream untouched.
  Status AddRequest(EngineRequest request, std::shared_ptr<RequestStream> stream);
  // Finishes every sample of `id` with FinishReason::kAbort and `reason` as status; frees its blocks at once.
  // Returns false for an unknown id.
  bool Abort(const std::string& id, const Status& reason);
  void AbortAll(const Status& reason);
  // Finishes every live request with FinishReason::kError and `error` (the model broke for good).
  void FailAll(const Status& error);
  // One scheduling + forward + sampling step. A model error fails the requests of the step and is returned.
  Status Step();
  // Non-OK once the model can run no more steps (Model::broken: a tensor-parallel group aborted).
  Status model_broken() const { return model_.broken(); }

  bool HasUnfinished() const { return !requests_.empty(); }
  int32_t num_waiting() const { return sched_.num_waiting(); }
  EngineStats Stats() const;
  // Ids of requests whose streams ended since the last call.
  std::vector<std::string> TakeFinishedIds();
  const EngineConfig& config() const { return config_; }
  const sched::Scheduler& scheduler() const { return sched_; }
  KvCache& kv_cache() { return kv_; }

 private:
  struct ReqState;
  struct SampleState;
  EngineCore(Model& model, Backend& backend, EngineConfig config, KvCache kv, TextStreamFactory text, sched::NowFn now);
  // Captures the decode graphs at startup where the backend and model support them (not with --enforce-eager).
  Status SetUpGraphs();
  void EmitToken(const std::string& sample_id, const SampleResult& r);
  // `drop_last_token`: the token just appended is not part of the output (usage does not count it).
  void FinishSample(const std::string& sample_id, RequestOutput out, bool in_scheduler, bool drop_last_token = false);
  void FailRequest(const std::string& request_id, FinishReason reason, const Status& status);
  void EndAll(FinishReason reason, const Status& status);
  RequestOutput BaseOutput(const SampleState& s) const;

  // One logits row of a step and the sample that reads it.
  struct StepRow {
    int64_t row = 0;  // in the step's logits
    const sched::ScheduledSeq* seq = nullptr;
    SampleState* sample = nullptr;  // null (with request) when nobody reads the row any more
    const sched::Request* request = nullptr;
    bool forks = false;  // the first token of an n > 1 request: its n samples all draw from this row

    bool live() const { return sample != nullptr; }
    // The prompt and the output so far.
    SamplingContext context(const std::vector<int64_t>& eos_ids) const;
  };
  // Where a step's tokens are sampled: the argmax on the device (every row plain greedy), Backend::SampleRows, or
  // the host sampler on copied logits (forks, --host-sampling, backends without SampleRows). A constraint does not
  // choose the path: its rows are masked on the device first.
  enum class SamplePath { kDeviceArgMax, kDeviceSample, kHost };
  std::vector<StepRow> StepRows(const sched::SchedulerOutput& plan);
  SamplePath ChooseSamplePath(const std::vector<StepRow>& rows) const;
  // Structured output's token masks, in two halves around the forward pass. StartMasks picks the rows whose matcher
  // is active (not waiting for grammar_after_token) and, on a device backend, hands their masks to the mask worker
  // (a thread of its own with a small pool) before the forward pass is issued, so that they are computed while the
  // GPU runs; on the CPU backend, whose forward pass takes every core, they are computed in FinishMasks. Either way
  // they go into one host buffer [rows, ceil(vocab / 32)] (the model's vocab), each row's time into its grammar_s.
  // FinishMasks waits for them (always, also when the forward pass failed: the rows point at samples) and, given
  // logits, applies them with one Backend::MaskLogits. No row constrained: nothing allocated, no call.
  void StartMasks(const std::vector<StepRow>& rows);
  Status FinishMasks(const TensorView* logits);
  void FillMasks(ThreadPool& pool);
  bool OverlapMasks() const;  // EngineConfig::overlap_grammar_masks, by default on a device backend
  // The device paths' tokens into `results` (one per row); the host path copies the logits rows to the host.
  Status SampleOnBackend(SamplePath path, const TensorView& logits, const std::vector<StepRow>& rows,
                         std::vector<SampleResult>* results);
  // The host path's tokens for the rows that do not fork, in parallel.
  void SampleOnHost(const std::vector<StepRow>& rows, std::vector<SampleResult>* results);
  // Emits every live row's token in row order; a forking row forks its request and samples each child.
  void EmitRows(const std::vector<StepRow>& rows, const std::vector<SampleResult>& results);

  Model& model_;
  Backend& backend_;
  EngineConfig config_;
  KvCache kv_;
  TextStreamFactory text_;  // null: token ids only
  sched::NowFn now_;
  sched::Scheduler sched_;
  std::mt19937_64 seed_source_;
  int64_t next_auto_id_ = 0;
  std::unordered_map<std::string, std::unique_ptr<ReqState>> requests_;
  std::unordered_map<std::string, std::unique_ptr<SampleState>> samples_;  // by scheduler id
  std::vector<std::string> finished_ids_;
  std::vector<float> host_logits_;
  std::vector<int32_t> host_ids_;  // argmax ids of a step whose rows are all plain greedy
  // Backend::SampleRows's inputs and outputs, one per logits row.
  std::vector<SampleRowSpec> device_rows_;
  std::vector<LogitAdjust> device_adjust_;
  std::vector<SampledToken> device_sampled_;
  // StartMasks' rows, their samples and their masks, kept between steps; the worker that fills them on a device
  // backend (made at the first constrained step) and whether it holds this step's job.
  class MaskWorker;
  std::vector<int32_t> mask_rows_;
  std::vector<SampleState*> mask_samples_;
  std::vector<uint32_t> mask_words_;
  std::unique_ptr<MaskWorker> mask_worker_;
  bool masks_pending_ = false;
  double mask_fill_s_ = 0.0;  // FillMasks' wall time of the step
  EngineStats stats_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null: eager only (CPU, --enforce-eager, or a model without support)
};

}  // namespace fathom
