#include "engine/engine_builder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "comm/local_group.h"
#include "core/bytes.h"
#include "core/env.h"
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
#include "model/weights.h"

namespace fathom {

StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (device.size() > 5) {
      const char* first = device.data() + 5;
      const char* last = device.data() + device.size();
      const auto [end, ec] = std::from_chars(first, last, index);
      if (ec != std::errc() || end != last || index < 0) {
        return InvalidArgumentError(fmt::format("unknown device '{}' (use cpu, cuda or cuda:N)", device));
      }
    }
#ifdef FATHOM_HAVE_CUDA
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> gpu, CudaBackend::Create(index));
    return std::unique_ptr<Backend>(std::move(gpu));
#else
    return UnimplementedError("this fathom was built without CUDA (configure with the cuda-release preset)");
#endif
  }
  return InvalidArgumentError(fmt::format("unknown device '{}' (use cpu, cuda or cuda:N)", device));
}

std::string ModelFolder(const std::string& model) {
  namespace fs = std::filesystem;
  if (fs::is_directory(model)) return model;
  const fs::path parent = fs::path(model).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

namespace {

// FATHOM_MLA_PREFILL=up|absorbed forces the prefill form (ModelRunOptions::prefill_form: MLA's up-projected form is
// the expanded one, its absorbed form the compact one; for measurements); unset or auto: the layout's shape rule.
StatusOr<PrefillForm> PrefillFormFromEnvironment() {
  FATHOM_ASSIGN_OR_RETURN(const std::optional<std::string_view> v,
                          EnvChoice("FATHOM_MLA_PREFILL", {"auto", "up", "absorbed"}));
  if (v == "up") return PrefillForm::kExpanded;
  if (v == "absorbed") return PrefillForm::kCompact;
  return PrefillForm::kAuto;
}

// $FATHOM_FORCE_TENSOR_PARALLEL=1 (a switch, core/env.h): tp = 1 also runs through TensorParallelModel and a real
// communicator (NCCL on a GPU), to measure that path's cost against the plain one and to exercise NCCL on one GPU.
StatusOr<bool> ForceParallelPath() {
  FATHOM_ASSIGN_OR_RETURN(const std::optional<bool> v, EnvSwitch("FATHOM_FORCE_TENSOR_PARALLEL"));
  return v.value_or(false);
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

// A worker process's part: its ranks run process 0's steps, received over MPI, until process 0's model is destroyed.
class MpiWorker final : public ParallelWorker {
 public:
  MpiWorker(MpiWorld& world, CommGroup& group, std::unique_ptr<TensorParallelModel> model, Backend& backend,
            int64_t process)
      : world_(world), group_(group), model_(std::move(model)), backend_(backend), process_(process) {}
  Status Run() override {
    MpiStepChannel channel(world_);
    const Status s = RunTensorParallelWorker(channel, *model_, backend_);
    if (!s.ok()) group_.Abort(s.WithContext(fmt::format("tensor-parallel process {}", process_)));
    FATHOM_LOG_INFO("tensor-parallel process {}: process 0 stopped; exiting", process_);
    model_.reset();
    return s;
  }

 private:
  MpiWorld& world_;
  CommGroup& group_;  // owned by model_
  std::unique_ptr<TensorParallelModel> model_;
  Backend& backend_;
  int64_t process_;
};
#else
class MpiWorld;
#endif

StatusOr<ParallelModel> LoadParallelModelIn([[maybe_unused]] MpiWorld* world, const ParallelOptions& o,
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
      streams.push_back((l == 0 ? backend : *backends[static_cast<size_t>(l)]).native_stream());
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
    return ParallelModel{.model = std::move(model), .worker = nullptr};
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
    return ParallelModel{.model = std::move(model), .worker = nullptr};
  }
  // A worker process: it runs process 0's steps (MpiWorker) instead of serving.
  CommGroup* g = group.get();
  auto model = TensorParallelModel::Create(std::move(group), std::move(ranks));
  if (!model.ok()) world->Abort(model.status());
  if (auto m = GatherRankMemory(*world, backend, **model, local); !m.ok()) world->Abort(m.status());
  return ParallelModel{.model = nullptr,
                       .worker = std::make_unique<MpiWorker>(*world, *g, std::move(model).value(), backend, process)};
#else
  return InternalError("unreachable: a multi-process layout without MPI");
#endif
}

}  // namespace

StatusOr<ParallelModel> LoadParallelModel(const ParallelOptions& o, const std::string& device,
                                          const std::string& folder, const ModelConfig& cfg, LoadOptions lo,
                                          Backend& backend) {
  const bool launched = LaunchedByMpi();
  FATHOM_ASSIGN_OR_RETURN(const bool forced, ForceParallelPath());
  if (o.tensor_parallel_size <= 1 && !forced && !launched) {
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(folder, cfg, lo, backend));
    return ParallelModel{.model = std::move(model), .worker = nullptr};
  }
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
  FATHOM_ASSIGN_OR_RETURN(lo.run.prefill_form, PrefillFormFromEnvironment());
  m.run = lo.run;
  FATHOM_ASSIGN_OR_RETURN(const bool forced, ForceParallelPath());
  if (o.parallel.tensor_parallel_size > 1 || forced || LaunchedByMpi()) {
    FATHOM_ASSIGN_OR_RETURN(ParallelModel p,
                            LoadParallelModel(o.parallel, o.device, m.folder, m.config, lo, *m.backend));
    m.model = std::move(p.model);
    m.worker = std::move(p.worker);
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
  // The model's attention layout must have a provider here that serves this cache dtype at speed (model/attention.h).
  const AttentionLayout layout = m.model->kv_cache_spec().layout;
  const AttentionOps* attention = m.backend->attention_ops(layout);
  if (attention == nullptr) {
    return InvalidArgumentError(
        fmt::format("the {} backend has no provider of the {} attention layout that this model "
                    "uses",
                    m.backend->name(), AttentionLayoutName(layout)));
  }
  if (const Status st = attention->ServesCacheDtype(*ec.kv_cache_dtype); !st.ok()) {
    return InvalidArgumentError(fmt::format("--kv-cache-dtype {}: {}", o.kv_cache_dtype, st.message()));
  }
  ec.block_size = o.block_size;
  ec.num_blocks = o.num_kv_blocks;
  if (!o.kv_cache_memory.empty()) {
    FATHOM_ASSIGN_OR_RETURN(ec.kv_cache_memory_bytes, ParseBytes(o.kv_cache_memory, "--kv-cache-memory"));
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
      for (const DeviceMemoryInfo& rm : m.model->RankMemory()) {
        MemoryPlanInput rank_in = in;
        rank_in.total_bytes = rm.total_bytes;
        rank_in.free_bytes = rm.free_bytes;
        rank_in.start_free_bytes = -1;  // not measured before this rank's weights: all use counts as fathom's
        per_rank.push_back(rank_in);
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
