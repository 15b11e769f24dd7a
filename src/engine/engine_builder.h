// Builds what an engine runs on from its options: the backend, the parallel layout (ranks, communicators, the
// processes of an mpirun launch), the weights, the tokenizer and the engine's configuration (the memory plan). Every
// front end (fathom run, serve, bench --offline, logits) builds through here; the CLI only maps flags to options.
//
//   EngineOptions o;  o.model = "/models/DeepSeek-R1-Distill-Qwen-7B";  o.device = "cuda";
//   FATHOM_ASSIGN_OR_RETURN(LoadedModel m, LoadModelAndTokenizer(o, TokenizerLoad::kRequired));
//   if (m.worker) return m.worker->Run();   // a process of an mpirun launch other than the first: it serves nothing
//   FATHOM_ASSIGN_OR_RETURN(EngineConfig ec, MakeEngineConfig(o, m));
//   FATHOM_ASSIGN_OR_RETURN(auto core, EngineCore::Create(*m.model, *m.backend, ec,
//   TokenizerTextStreams(*m.tokenizer)));
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/engine_core.h"
#include "io/model_config.h"
#include "model/backend.h"
#include "model/model.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

// The parallel layout (vLLM's flag names: --tensor-parallel-size, --enable-expert-parallel).
struct ParallelOptions {
  int tensor_parallel_size = 1;         // ranks over one model (threads on the CPU, a thread per GPU, or processes)
  bool enable_expert_parallel = false;  // routed experts divided among the ranks, whole, instead of each one split
};

// What an engine is built from; each field is the flag of the same name (cli/engine_setup.h registers them).
struct EngineOptions {
  // Model.
  std::string model;  // folder, or a config.json with load_format "dummy"
  std::string device = "cpu";
  std::string load_format = "auto";
  std::string tokenizer;  // default: the model folder
  int threads = 0;
  uint64_t weights_seed = 0;
  // Engine.
  int block_size = 16;
  int max_model_len = 0;  // 0: the model's
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_queue_len = 0;
  int64_t max_queue_delay_ms = 0;
  std::string kv_cache_memory;  // empty: from gpu_memory_utilization on a GPU, 1GiB on the CPU
  double gpu_memory_utilization = 0.9;
  int num_kv_blocks = 0;
  bool enable_prefix_caching = true;
  std::string scheduling_policy = "priority";
  bool enforce_eager = false;
  bool host_sampling = false;
  std::string kv_cache_dtype = "auto";
  ParallelOptions parallel;
};

// "cpu", "cuda" or "cuda:N" (CUDA only in builds with FATHOM_CUDA).
StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device);

// A process of an mpirun launch other than the first holds ranks but serves nothing: it runs the first process's
// steps until that process's model is destroyed.
class ParallelWorker {
 public:
  virtual ~ParallelWorker() = default;
  // Runs the steps; returns once the first process stopped, or with the error that ended the group (which the
  // group's abort has already passed to the other processes). The caller exits then.
  virtual Status Run() = 0;
};

// A model over its ranks, or this process's part as a worker: exactly one of the two is set.
struct ParallelModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<ParallelWorker> worker;
};

// The model of `folder` over `o`'s ranks: tp = 1 loads it on `backend` as is; tp > 1 loads each rank's shard (rank 0
// on `backend`, the others on backends of their own made for `device`) behind one TensorParallelModel. Under mpirun,
// a process other than the first gets a worker instead; `backend` must outlive either.
StatusOr<ParallelModel> LoadParallelModel(const ParallelOptions& o, const std::string& device,
                                          const std::string& folder, const ModelConfig& cfg, LoadOptions lo,
                                          Backend& backend);

// The folder of a model path (a folder, or a config.json inside one).
std::string ModelFolder(const std::string& model);

// Whether LoadModelAndTokenizer loads the tokenizer: always (an error without one), when the folder has one (or
// EngineOptions::tokenizer names one), or not at all (a data-parallel replica, which uses the front's).
enum class TokenizerLoad { kRequired, kIfPresent, kNone };

struct LoadedModel {
  ModelConfig config;
  std::string folder;  // where config.json (and usually the tokenizer) lives
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;            // null in a worker process
  std::unique_ptr<Tokenizer> tokenizer;    // null when not needed and absent
  int64_t start_free_bytes = -1;           // device memory free once the backend existed, before the weights
  ModelRunOptions run;                     // the run options the model was loaded with (model->set_run_options)
  std::unique_ptr<ParallelWorker> worker;  // set in a worker process (see ParallelWorker), which runs it and exits
};

// Loads the config, backend, weights (with progress) and, as `tokenizer` says, the tokenizer.
StatusOr<LoadedModel> LoadModelAndTokenizer(const EngineOptions& o, TokenizerLoad tokenizer);

// The engine configuration of the options: the KV cache from the memory plan (each rank's device planned, the one
// with the least room setting every rank's cache); EOS ids from generation_config.json, config.json or the tokenizer.
StatusOr<EngineConfig> MakeEngineConfig(const EngineOptions& o, const LoadedModel& m);

}  // namespace fathom
