#include "cli/engine_setup.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "cli/cli_util.h"
#include "comm/local_group.h"
#include "core/bytes.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "engine/memory_plan.h"
#include "engine/tensor_parallel.h"
#ifdef FATHOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl.h"
#endif
#ifdef FATHOM_HAVE_MPI
#include "comm/mpi.h"
#endif
#include "model/registry.h"
#include "model/weights.h"

namespace fathom {

void AddParallelOptions(CLI::App* cmd, ParallelOptions& o) {
  cmd->add_option("--tensor-parallel-size", o.tensor_parallel_size,
                  "Tensor-parallel ranks over one model (also -tp): heads, MLP and experts split between them, KV "
                  "heads split or shared. On --device cpu the ranks are threads of this process; on GPUs a thread "
                  "per GPU over NCCL; across nodes, processes started by mpirun")
      ->capture_default_str()
      ->check(CLI::Range(1, 64))
      ->group("Parallel");
  cmd->add_flag("--enable-expert-parallel", o.enable_expert_parallel,
                "MoE models: divide the routed experts among the tensor-parallel ranks, each expert whole on one "
                "rank, instead of splitting every expert's FFN (attention and shared experts stay tensor-parallel)")
      ->group("Parallel");
}

void AddEngineOptions(CLI::App* cmd, EngineOptions& o, bool model_required) {
  const std::string model_group = "Model";
  CLI::Option* model = cmd->add_option("--model", o.model, "Model folder, or a config.json with --load-format dummy")
                           ->group(model_group);
  if (model_required) model->required();
  cmd->add_option("--device", o.device, "Backend: cpu, cuda or cuda:N")->capture_default_str()->group(model_group);
  cmd->add_option("--load-format", o.load_format, "auto | safetensors | dummy (random weights, no checkpoint)")
      ->capture_default_str()
      ->group(model_group);
  cmd->add_option("--tokenizer", o.tokenizer, "Folder with tokenizer.json (default: the model folder)")
      ->group(model_group);
  cmd->add_option("--threads", o.threads, "CPU threads (default: FATHOM_NUM_THREADS or all cores)")->group(model_group);
  cmd->add_option("--weights-seed", o.weights_seed, "Seed of dummy weights")->capture_default_str()->group(model_group);

  AddParallelOptions(cmd, o.parallel);

  const std::string engine_group = "Engine";
  cmd->add_option("--block-size", o.block_size, "Tokens per KV-cache block")
      ->capture_default_str()
      ->group(engine_group);
  cmd->add_option("--max-model-len", o.max_model_len, "Context length: prompt + output (default: the model's)")
      ->group(engine_group);
  cmd->add_option("--max-num-seqs", o.max_num_seqs, "Running sequences per step")
      ->capture_default_str()
      ->group(engine_group);
  cmd->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "Tokens per step (chunked prefill budget)")
      ->capture_default_str()
      ->group(engine_group);
  cmd->add_option("--max-queue-len", o.max_queue_len, "Waiting requests before 'queue full' (0: unlimited)")
      ->group(engine_group);
  cmd->add_option("--max-queue-delay-ms", o.max_queue_delay_ms, "Queue wait before 'timed out' (0: forever)")
      ->group(engine_group);
  cmd->add_option("--kv-cache-memory", o.kv_cache_memory,
                  "KV-cache budget, e.g. 512MiB (default: what --gpu-memory-utilization leaves on a GPU; 1GiB on "
                  "the CPU)")
      ->group(engine_group);
  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                  "Share of the GPU's memory for weights, activations and the KV cache")
      ->capture_default_str()
      ->group(engine_group);
  cmd->add_option("--num-kv-blocks", o.num_kv_blocks, "KV-cache blocks (overrides --kv-cache-memory)")
      ->group(engine_group);
  cmd->add_flag("--enable-prefix-caching", o.enable_prefix_caching,
                "Reuse cached KV blocks of shared prefixes (on by default)")
      ->group(engine_group);
  cmd->add_flag_callback(
         "--no-enable-prefix-caching", [p = &o.enable_prefix_caching] { *p = false; }, "Turn prefix caching off")
      ->group(engine_group);
  cmd->add_option("--scheduling-policy", o.scheduling_policy, "fcfs | priority")
      ->capture_default_str()
      ->group(engine_group);
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                  "auto (bfloat16 on a GPU, float32 on the CPU), float32, float16, bfloat16 or fp8 (e4m3 with a "
                  "float32 scale per token and head)")
      ->capture_default_str()
      ->group(engine_group);
  cmd->add_flag("--enforce-eager", o.enforce_eager,
                "Run every step op by op: no CUDA graphs for decode steps (for debugging and profiling)")
      ->group(engine_group);
  cmd->add_flag("--host-sampling", o.host_sampling,
                "Sample on the host even where the backend samples on the device (copies each logits row to the host)")
      ->group(engine_group);
}

StatusOr<int64_t> ParseBytes(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return InvalidArgumentError(fmt::format("{}: '{}' is not a size", flag, text));
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
    return InvalidArgumentError(fmt::format("{}: unknown unit in '{}' (use K, M or G)", flag, text));
  }
  if (!(value > 0)) return InvalidArgumentError(fmt::format("{} must be positive", flag));
  return static_cast<int64_t>(value * mult);
}

std::string ModelFolder(const std::string& model) {
  namespace fs = std::filesystem;
  if (fs::is_directory(model)) return model;
  const fs::path parent = fs::path(model).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

namespace {

// FATHOM_MLA_PREFILL=up|absorbed forces MLA's prefill form (for measurements); unset or auto: the shape rule.
StatusOr<MlaPrefill> MlaPrefillFromEnvironment() {
  const char* v = std::getenv("FATHOM_MLA_PREFILL");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "auto") return MlaPrefill::kAuto;
  if (s == "up") return MlaPrefill::kUpProjected;
  if (s == "absorbed") return MlaPrefill::kAbsorbed;
  return InvalidArgumentError(fmt::format("FATHOM_MLA_PREFILL='{}': use up, absorbed or auto", s));
}

// $FATHOM_FORCE_TENSOR_PARALLEL=1: tp = 1 also runs through TensorParallelModel and a real communicator (NCCL on a
// GPU), to measure that path's cost against the plain one and to exercise NCCL on one GPU.
bool ForceParallelPath() {
  const char* v = std::getenv("FATHOM_FORCE_TENSOR_PARALLEL");
  return v != nullptr && std::string(v) == "1";
}

#ifdef FATHOM_HAVE_MPI
// Every process's ranks' device memory (total, free), in rank order, on every process: the per-rank memory plan on
// process 0 covers the other nodes' GPUs too. `local` ranks a process; its first is on `backend`.
StatusOr<std::vector<DeviceMemoryInfo>> GatherRankMemory(MpiWorld& world, Backend& backend, TensorParallelModel& model,
                                                         int64_t local) {
  std::vector<DeviceMemoryInfo> mine = {backend.MemoryInfo()};
  for (const DeviceMemoryInfo& m : model.RankMemory()) mine.push_back(m);
  mine.resize(static_cast<size_t>(local));
  std::vector<int64_t> packed, all(static_cast<size_t>(2 * local * world.size()));
  for (const DeviceMemoryInfo& m : mine) {
    packed.push_back(m.total_bytes);
    packed.push_back(m.free_bytes);
  }
  FATHOM_RETURN_IF_ERROR(world.AllGather(packed.data(), all.data(), packed.size() * sizeof(int64_t),
                                         MpiWorld::DefaultTimeout(), "the ranks' device memory"));
  std::vector<DeviceMemoryInfo> out;
  for (size_t i = 0; i < all.size(); i += 2) {
    DeviceMemoryInfo m;
    m.total_bytes = all[i];
    m.free_bytes = all[i + 1];
    out.push_back(m);
  }
  return out;
}

// Step messages from process 0 to the others over MPI broadcasts. Receiving waits as long as it takes (an idle
// server sends nothing); once a message has begun, the collective timeout applies.
class MpiStepChannel final : public StepChannel {
 public:
  explicit MpiStepChannel(MpiWorld& world) : world_(world) {}
  Status Send(const StepMessage& m) override {
    std::vector<uint8_t> bytes = EncodeStep(m);
    return world_.Broadcast(&bytes, 0, MpiWorld::DefaultTimeout(), "a step message");
  }
  StatusOr<StepMessage> Receive() override {
    std::vector<uint8_t> bytes;
    FATHOM_RETURN_IF_ERROR(world_.Broadcast(&bytes, 0, std::chrono::milliseconds(0), "the next step"));
    return DecodeStep(bytes);
  }

 private:
  MpiWorld& world_;
};
#endif

#ifdef FATHOM_HAVE_CUDA
void* CudaStream(Backend& b) {
  auto* gpu = dynamic_cast<CudaBackend*>(&b);
  FATHOM_CHECK(gpu != nullptr, "a CUDA device without a CudaBackend");
  return gpu->stream();
}
#endif

// Before loading onto a GPU: the utilization budget must have been free at startup and hold the weights (rank 0's
// share under tensor parallelism).
Status CheckWeightsFit(const ModelConfig& cfg, const ParallelOptions& po, Backend& backend, double utilization,
                       int64_t start_free_bytes) {
  const DeviceMemoryInfo mem = backend.MemoryInfo();
  if (mem.total_bytes <= 0) return OkStatus();
  FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(cfg.architecture));
  const ParallelConfig par{.tp_size = po.tensor_parallel_size, .expert_parallel = po.enable_expert_parallel};
  FATHOM_ASSIGN_OR_RETURN(const std::vector<WeightSpec> specs, arch->weight_specs(cfg, par));
  const int64_t weights = ComputeWeightStats(specs, nullptr).total_bytes;
  return CheckBudgetFits(mem.total_bytes, mem.free_bytes, start_free_bytes, utilization, weights);
}

}  // namespace

namespace {

#ifdef FATHOM_HAVE_MPI
// Under mpirun a failure anywhere ends the whole job: the local group is aborted first (NCCL kernels waiting for a
// peer end), then MPI_Abort stops every process with the reason, so no process waits for one that failed.
class JobAbortingGroup final : public CommGroup {
 public:
  JobAbortingGroup(std::unique_ptr<CommGroup> inner, MpiWorld& world) : inner_(std::move(inner)), world_(world) {}
  int64_t size() const override { return inner_->size(); }
  void Abort(const Status& why) override {
    inner_->Abort(why);
    world_.Abort(why);
  }
  Status Poll() override { return inner_->Poll(); }

 private:
  std::unique_ptr<CommGroup> inner_;
  MpiWorld& world_;
};
#else
class MpiWorld;
#endif

StatusOr<std::unique_ptr<Model>> LoadParallelModelIn(MpiWorld* world, const ParallelOptions& o,
                                                     const std::string& device, const std::string& folder,
                                                     const ModelConfig& cfg, LoadOptions lo, Backend& backend) {
  const int64_t tp = o.tensor_parallel_size;
  const bool gpu = backend.device() == Device::kCuda;
  // This process's ranks: all of them, or under mpirun a consecutive run of tp / processes ranks.
  int64_t processes = 1, process = 0;
#ifdef FATHOM_HAVE_MPI
  if (world != nullptr) {
    processes = world->size();
    process = world->rank();
  }
#endif
  if (tp % processes != 0) {
    return InvalidArgumentError(
        fmt::format("mpirun started {} processes, but --tensor-parallel-size {} does not divide among them: give a "
                    "multiple of {}",
                    processes, tp, processes));
  }
  const int64_t local = tp / processes, first_rank = process * local;
  if (processes > 1 && !gpu && local != 1) {
    return InvalidArgumentError(fmt::format(
        "on --device cpu each process of an mpirun launch is one rank: start {} processes (mpirun -np {})", tp, tp));
  }
  // Local rank l's backend: l = 0 is `backend`; on GPUs it takes the l-th device from --device's (cuda:K: K + l).
  std::vector<std::unique_ptr<Backend>> backends(static_cast<size_t>(local));
  std::vector<int> devices;
  int first_device = 0;
  if (gpu && device.size() > 5) first_device = std::atoi(device.c_str() + 5);
  for (int64_t l = 1; l < local; ++l) {
    const std::string name = gpu ? fmt::format("cuda:{}", first_device + l) : device;
    auto b = MakeBackend(name);
    if (!b.ok()) {
      return b.status().WithContext(fmt::format(
          "--tensor-parallel-size {}: rank {} needs {}{}", tp, first_rank + l, name,
          gpu ? fmt::format(" (this process's ranks take cuda:{} to cuda:{})", first_device, first_device + local - 1)
              : ""));
    }
    backends[static_cast<size_t>(l)] = std::move(b).value();
  }
  std::unique_ptr<CommGroup> group;
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(local));
  if (gpu) {
#ifdef FATHOM_HAVE_CUDA
    std::vector<void*> streams;
    for (int64_t l = 0; l < local; ++l) {
      devices.push_back(static_cast<int>(first_device + l));
      streams.push_back(CudaStream(l == 0 ? backend : *backends[static_cast<size_t>(l)]));
    }
    StatusOr<std::unique_ptr<NcclGroup>> nccl = InternalError("no NCCL group");
    if (processes == 1) {
      nccl = NcclGroup::CreateLocal(devices, streams, o.enable_expert_parallel);
    } else {
#ifdef FATHOM_HAVE_MPI
      // Process 0 makes the group's unique id; MPI carries it to the others.
      std::vector<uint8_t> id;
      if (process == 0) {
        auto made = NcclGroup::NewUniqueId();
        if (!made.ok()) world->Abort(made.status());
        id = std::move(made).value();
      }
      FATHOM_RETURN_IF_ERROR(world->Broadcast(&id, 0, MpiWorld::DefaultTimeout(), "the NCCL unique id"));
      nccl = NcclGroup::CreateRanks(id, tp, first_rank, devices, streams, o.enable_expert_parallel);
#endif
    }
    if (!nccl.ok()) return nccl.status().WithContext(fmt::format("--tensor-parallel-size {} on {}", tp, device));
    for (int64_t l = 0; l < local; ++l) comms[static_cast<size_t>(l)] = (*nccl)->Rank(first_rank + l);
    group = std::move(nccl).value();
#else
    return UnimplementedError("this fathom was built without CUDA, so without NCCL");
#endif
  } else if (processes > 1) {
#ifdef FATHOM_HAVE_MPI
    auto mpi = std::make_unique<MpiGroup>(*world, o.enable_expert_parallel);
    comms[0] = mpi->Rank();
    group = std::move(mpi);
#endif
  } else {
    auto in_process = std::make_unique<LocalGroup>(tp);
    for (int64_t r = 0; r < tp; ++r) comms[static_cast<size_t>(r)] = in_process->Rank(r, o.enable_expert_parallel);
    group = std::move(in_process);
  }
#ifdef FATHOM_HAVE_MPI
  if (processes > 1) group = std::make_unique<JobAbortingGroup>(std::move(group), *world);
#endif
  std::vector<TensorParallelModel::Rank> ranks(static_cast<size_t>(local));
  for (int64_t l = 0; l < local; ++l) {
    TensorParallelModel::Rank& rank = ranks[static_cast<size_t>(l)];
    rank.comm = std::move(comms[static_cast<size_t>(l)]);
    rank.backend = std::move(backends[static_cast<size_t>(l)]);
    Backend& b = l == 0 ? backend : *rank.backend;
    FATHOM_RETURN_IF_ERROR(b.MakeCurrent());
    lo.show_progress = lo.show_progress && l == 0 && process == 0;
    auto model = LoadModel(folder, cfg, lo, b, *rank.comm);
    if (!model.ok()) {
      const Status s = model.status().WithContext(fmt::format("tensor-parallel rank {} of {}", first_rank + l, tp));
      if (processes > 1) group->Abort(s);  // the other processes must not wait for this one
      return s;
    }
    rank.model = std::move(model).value();
  }
  FATHOM_RETURN_IF_ERROR(backend.MakeCurrent());  // the engine's thread runs this process's first rank
  const std::string where =
      gpu ? fmt::format("on cuda:{}..cuda:{} (NCCL, a thread each)", first_device, first_device + local - 1)
          : std::string(processes > 1 ? "on the CPU (one a process)" : "on the CPU (threads)");
  const std::string experts =
      o.enable_expert_parallel && cfg.moe.n_routed_experts > 0
          ? fmt::format("; expert parallel: {} routed experts a rank", cfg.moe.n_routed_experts / tp)
          : std::string();
  if (processes == 1) {
    FATHOM_LOG_INFO("tensor parallel: {} ranks {}, each loaded its shard{}", tp, where, experts);
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelModel> model,
                            TensorParallelModel::Create(std::move(group), std::move(ranks)));
    return std::unique_ptr<Model>(std::move(model));
  }
#ifdef FATHOM_HAVE_MPI
  FATHOM_LOG_INFO("tensor parallel: {} ranks over {} processes; process {} (pid {}) holds ranks {}..{} {}{}", tp,
                  processes, process, static_cast<int64_t>(getpid()), first_rank, first_rank + local - 1, where,
                  experts);
  if (process == 0) {
    FATHOM_ASSIGN_OR_RETURN(
        std::unique_ptr<TensorParallelModel> model,
        TensorParallelModel::Create(std::move(group), std::move(ranks), std::make_unique<MpiStepChannel>(*world)));
    FATHOM_ASSIGN_OR_RETURN(std::vector<DeviceMemoryInfo> all, GatherRankMemory(*world, backend, *model, local));
    all.erase(all.begin(), all.begin() + local);  // this process's ranks: RankMemory reads them itself
    model->set_remote_memory(std::move(all));
    return std::unique_ptr<Model>(std::move(model));
  }
  // A worker process: it runs process 0's steps until process 0's model is destroyed, then exits here (it never
  // serves, prints or benchmarks anything itself). SIGTERM and SIGINT (which mpirun passes on) are process 0's to
  // act on: it drains, then sends the stop; a worker that died first would fail process 0's last steps.
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  CommGroup* g = group.get();
  auto model = TensorParallelModel::Create(std::move(group), std::move(ranks));
  if (!model.ok()) world->Abort(model.status());
  if (auto m = GatherRankMemory(*world, backend, **model, local); !m.ok()) world->Abort(m.status());
  MpiStepChannel channel(*world);
  const Status s = RunTensorParallelWorker(channel, **model, backend);
  if (!s.ok()) g->Abort(s.WithContext(fmt::format("tensor-parallel process {}", process)));
  FATHOM_LOG_INFO("tensor-parallel process {}: process 0 stopped; exiting", process);
  model->reset();
  std::exit(0);
#else
  return InternalError("unreachable: a multi-process layout without MPI");
#endif
}

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadParallelModel(const ParallelOptions& o, const std::string& device,
                                                   const std::string& folder, const ModelConfig& cfg, LoadOptions lo,
                                                   Backend& backend) {
  const bool launched = LaunchedByMpi();
  if (o.tensor_parallel_size <= 1 && !ForceParallelPath() && !launched) return LoadModel(folder, cfg, lo, backend);
  if (!launched) return LoadParallelModelIn(nullptr, o, device, folder, cfg, std::move(lo), backend);
#ifdef FATHOM_HAVE_MPI
  FATHOM_ASSIGN_OR_RETURN(MpiWorld * world, MpiWorld::Get());
  auto model = LoadParallelModelIn(world, o, device, folder, cfg, std::move(lo), backend);
  // A process that cannot take its part ends the job: the others would wait for it.
  if (!model.ok()) world->Abort(model.status().WithContext(fmt::format("tensor-parallel process {}", world->rank())));
  return model;
#else
  return UnimplementedError("started by mpirun, but this fathom was built without MPI (install libopenmpi-dev)");
#endif
}

StatusOr<LoadedModel> LoadModelAndTokenizer(const EngineOptions& o, TokenizerLoad tokenizer) {
  if (o.threads > 0) SetDefaultThreadCount(o.threads);
  LoadedModel m;
  FATHOM_ASSIGN_OR_RETURN(m.config, LoadModelConfig(o.model));
  FATHOM_ASSIGN_OR_RETURN(LoadFormat format, ParseLoadFormat(o.load_format));
  m.folder = ModelFolder(o.model);

  const std::string tok_dir = o.tokenizer.empty() ? m.folder : o.tokenizer;
  const bool has_tokenizer = std::filesystem::exists(std::filesystem::path(tok_dir) / "tokenizer.json");
  if (tokenizer == TokenizerLoad::kRequired ||
      (tokenizer == TokenizerLoad::kIfPresent && (has_tokenizer || !o.tokenizer.empty()))) {
    auto tok = Tokenizer::FromDirectory(tok_dir);
    if (!tok.ok()) return tok.status().WithContext("loading the tokenizer (pass --tokenizer DIR)");
    m.tokenizer = std::move(tok).value();
  }

  FATHOM_ASSIGN_OR_RETURN(m.backend, MakeBackend(o.device));
  const DeviceMemoryInfo start = m.backend->MemoryInfo();
  if (start.total_bytes > 0) m.start_free_bytes = start.free_bytes;
  FATHOM_RETURN_IF_ERROR(
      CheckWeightsFit(m.config, o.parallel, *m.backend, o.gpu_memory_utilization, m.start_free_bytes));
  LoadOptions lo;
  lo.format = format;
  lo.seed = o.weights_seed;
  lo.run.max_batched_tokens = o.max_num_batched_tokens;
  FATHOM_ASSIGN_OR_RETURN(lo.run.mla_prefill, MlaPrefillFromEnvironment());
  m.run = lo.run;
  if (o.parallel.tensor_parallel_size > 1 || ForceParallelPath() || LaunchedByMpi()) {
    FATHOM_ASSIGN_OR_RETURN(m.model, LoadParallelModel(o.parallel, o.device, m.folder, m.config, lo, *m.backend));
    return m;
  }
  auto model = LoadModel(m.folder, m.config, lo, *m.backend);
  if (!model.ok() && model.status().code() == StatusCode::kNotFound && format != LoadFormat::kDummy) {
    namespace fs = std::filesystem;
    bool has_weights = false;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(m.folder, ec)) {
      has_weights = has_weights || entry.path().extension() == ".safetensors";
    }
    if (!has_weights) {
      return NotFoundError(
          fmt::format("{} (the folder has a config but no weights: --load-format dummy runs it "
                      "with random weights)",
                      model.status().message()));
    }
  }
  if (!model.ok()) return model.status();
  m.model = std::move(model).value();
  return m;
}

std::string DemoDir() {
  if (const char* env = std::getenv("FATHOM_DEMO_DIR"); env != nullptr && *env != '\0') return env;
  return FATHOM_DEMO_DIR;
}

StatusOr<bool> UseDemoWithoutModel(EngineOptions& o) {
  if (!o.model.empty()) return false;
  const std::string dir = DemoDir();
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
    return NotFoundError(fmt::format(
        "the demo model's tokenizer is missing from {}: run scripts/setup to fetch it, or pass --model DIR", dir));
  }
  o.model = dir;
  o.load_format = "dummy";
  FATHOM_LOG_WARN(
      "no --model: using the built-in demo, a tiny DeepSeek-V3-architecture model with random weights; its text is "
      "noise. Pass --model /path/to/hf-checkpoint for real output.");
  return true;
}

StatusOr<EngineConfig> MakeEngineConfig(const EngineOptions& o, const LoadedModel& m) {
  if (o.max_num_seqs <= 0 || o.max_num_batched_tokens <= 0) {
    return InvalidArgumentError("--max-num-seqs and --max-num-batched-tokens must be positive");
  }
  if (o.block_size <= 0) return InvalidArgumentError("--block-size must be positive");
  if (o.max_model_len < 0) return InvalidArgumentError("--max-model-len must be >= 0");
  if (o.max_queue_len < 0 || o.max_queue_delay_ms < 0) {
    return InvalidArgumentError("--max-queue-len and --max-queue-delay-ms must be >= 0");
  }
  EngineConfig ec;
  FATHOM_ASSIGN_OR_RETURN(ec.kv_cache_dtype, ParseKvCacheDtype(o.kv_cache_dtype, m.backend->kv_cache_dtype()));
  if (!m.backend->SupportsKvCacheDtype(*ec.kv_cache_dtype)) {
    return InvalidArgumentError(fmt::format("--kv-cache-dtype {}: the {} backend has no kernels for a {} cache yet",
                                            o.kv_cache_dtype, m.backend->name(), DTypeName(*ec.kv_cache_dtype)));
  }
  if (m.model->kv_cache_spec().v_in_k && !m.backend->ServesMlaKvCacheDtype(*ec.kv_cache_dtype)) {
    // With the MLA decode kernel's f8 form turned off (FATHOM_CUDA_MLA_FP8=0, or FATHOM_CUDA_NO_MLA_ATTENTION=1), an
    // FP8 latent cache would take the per-head kernel, which reads the latent row once per head and, past its
    // workspace, falls to a kernel that cannot hold long contexts.
    return InvalidArgumentError(fmt::format(
        "--kv-cache-dtype {} is not served for MLA models (DeepSeek-V2/V3) on the {} backend with the MLA kernel's "
        "FP8 form off (FATHOM_CUDA_MLA_FP8=0, or FATHOM_CUDA_NO_MLA_ATTENTION=1): use auto or bfloat16",
        o.kv_cache_dtype, m.backend->name()));
  }
  ec.block_size = o.block_size;
  ec.num_blocks = o.num_kv_blocks;
  if (!o.kv_cache_memory.empty()) {
    FATHOM_ASSIGN_OR_RETURN(ec.kv_cache_memory_bytes, ParseBytes(o.kv_cache_memory));
  } else {
    ec.kv_cache_memory_bytes = 1ll << 30;
    const DeviceMemoryInfo mem = m.backend->MemoryInfo();
    if (mem.total_bytes > 0 && o.num_kv_blocks <= 0) {
      // On a GPU the KV cache takes what --gpu-memory-utilization leaves after the weights and activations.
      MemoryPlanInput in;
      in.total_bytes = mem.total_bytes;
      in.free_bytes = mem.free_bytes;
      in.start_free_bytes = m.start_free_bytes;
      in.utilization = o.gpu_memory_utilization;
      in.max_batched_tokens = o.max_num_batched_tokens;
      in.activation_bytes = ActivationReserveBytes(m.config, o.max_num_batched_tokens, o.max_num_seqs);
      in.kv_bytes_per_token = m.model->kv_cache_spec().bytes_per_token(*ec.kv_cache_dtype);
      in.block_size = o.block_size;
      in.max_model_len = o.max_model_len > 0 ? o.max_model_len : m.config.max_position_embeddings;
      // Tensor parallelism: each rank's device is planned; the one with the least room sets every rank's cache.
      std::vector<MemoryPlanInput> per_rank = {in};
      if (auto* tp = dynamic_cast<TensorParallelModel*>(m.model.get())) {
        for (const DeviceMemoryInfo& rm : tp->RankMemory()) {
          MemoryPlanInput rank_in = in;
          rank_in.total_bytes = rm.total_bytes;
          rank_in.free_bytes = rm.free_bytes;
          rank_in.start_free_bytes = -1;  // not measured before this rank's weights: all use counts as fathom's
          per_rank.push_back(rank_in);
        }
      }
      FATHOM_ASSIGN_OR_RETURN(const MemoryPlan plan, PlanDeviceMemoryPerRank(per_rank));
      FATHOM_LOG_INFO("{}", plan.Describe());
      ec.kv_cache_memory_bytes = plan.kv_bytes;
    }
  }
  ec.enable_prefix_caching = o.enable_prefix_caching;
  ec.policy = o.scheduling_policy;
  ec.enforce_eager = o.enforce_eager;
  ec.host_sampling = o.host_sampling;
  ec.scheduler.max_model_len = o.max_model_len;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.max_queue_len = o.max_queue_len;
  ec.scheduler.max_queue_delay_ms = o.max_queue_delay_ms;
  FATHOM_ASSIGN_OR_RETURN(ec.eos_token_ids, LoadEosTokenIds(o.model, m.config));
  if (ec.eos_token_ids.empty() && m.tokenizer && m.tokenizer->eos_id()) {
    ec.eos_token_ids.push_back(*m.tokenizer->eos_id());
  }
  return ec;
}

}  // namespace fathom
