// Model + tokenizer + engine construction shared by `fathom run`, `fathom serve` and `fathom bench --offline`, and
// the command-line flags for every engine knob.
//
//   auto o = std::make_shared<EngineOptions>();
//   AddEngineOptions(cmd, *o);                       // --model, --device, --max-num-seqs, ... in option groups
//   FATHOM_ASSIGN_OR_RETURN(LoadedModel m, LoadModelAndTokenizer(*o, TokenizerLoad::kRequired));
//   FATHOM_ASSIGN_OR_RETURN(EngineConfig ec, MakeEngineConfig(*o, m));
//   FATHOM_ASSIGN_OR_RETURN(auto core, EngineCore::Create(*m.model, *m.backend, ec, TokenizerTextStreams(*m.tok)));
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/engine_core.h"
#include "io/model_config.h"
#include "model/backend.h"
#include "model/model.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

// The parallel layout's flags (vLLM's names), shared by serve, run, bench --offline and logits.
struct ParallelOptions {
  int tensor_parallel_size = 1;         // --tensor-parallel-size / -tp: ranks over one model (threads on the CPU)
  bool enable_expert_parallel = false;  // --enable-expert-parallel: routed experts divided among the ranks, whole
};
void AddParallelOptions(CLI::App* cmd, ParallelOptions& o);

struct EngineOptions {
  // Model.
  std::string model;  // folder, or a config.json with --load-format dummy
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
  std::string kv_cache_memory;  // empty: from --gpu-memory-utilization on a GPU, 1GiB on the CPU
  double gpu_memory_utilization = 0.9;
  int num_kv_blocks = 0;
  bool enable_prefix_caching = true;
  std::string scheduling_policy = "priority";
  bool enforce_eager = false;
  bool host_sampling = false;
  std::string kv_cache_dtype = "auto";
  ParallelOptions parallel;
};

// The model of `folder` over `o`'s ranks: tp = 1 loads it on `backend` as is; tp > 1 loads each rank's shard (rank 0
// on `backend`, the others on backends of their own made for `device`) behind one TensorParallelModel.
StatusOr<std::unique_ptr<Model>> LoadParallelModel(const ParallelOptions& o, const std::string& device,
                                                   const std::string& folder, const ModelConfig& cfg, LoadOptions lo,
                                                   Backend& backend);

// Registers the model and engine flags on `cmd` in two option groups ("Model" and "Engine"). `model_required`:
// whether --model must be given.
void AddEngineOptions(CLI::App* cmd, EngineOptions& o, bool model_required = true);

// The demo model's folder: $FATHOM_DEMO_DIR, or the one in the source tree this binary was built from.
std::string DemoDir();
// With no --model, points `o` at the built-in demo (random weights: --load-format dummy) and says so on stderr;
// returns true then. An error when the demo's files are missing.
StatusOr<bool> UseDemoWithoutModel(EngineOptions& o);

struct LoadedModel {
  ModelConfig config;
  std::string folder;  // where config.json (and usually the tokenizer) lives
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when not needed and absent
  int64_t start_free_bytes = -1;         // device memory free once the backend existed, before the weights
  ModelRunOptions run;                   // the run options the model was loaded with (model->set_run_options)
};

// "1073741824", "512MiB", "2G", "256k": bytes (K/M/G are powers of 1024). `flag` names the option in errors.
StatusOr<int64_t> ParseBytes(const std::string& text, const std::string& flag = "--kv-cache-memory");

// The folder of a model path (a folder, or a config.json inside one).
std::string ModelFolder(const std::string& model);

// Whether LoadModelAndTokenizer loads the tokenizer: always (an error without one), when the folder has one (or
// --tokenizer names one), or not at all (a data-parallel replica, which uses the front's).
enum class TokenizerLoad { kRequired, kIfPresent, kNone };

// Loads the config, backend, weights (with progress) and, as `tokenizer` says, the tokenizer.
StatusOr<LoadedModel> LoadModelAndTokenizer(const EngineOptions& o, TokenizerLoad tokenizer);

// The engine configuration of the flags; EOS ids from generation_config.json, config.json or the tokenizer.
StatusOr<EngineConfig> MakeEngineConfig(const EngineOptions& o, const LoadedModel& m);

}  // namespace fathom
