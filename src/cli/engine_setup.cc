#include "cli/engine_setup.h"

#include <fmt/format.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "core/logging.h"

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

Status RunParallelWorker(ParallelWorker& worker) {
  // SIGTERM and SIGINT (which mpirun passes on) are process 0's to act on: it drains, then sends the stop; a worker
  // that died first would fail process 0's last steps.
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGINT, SIG_IGN);
  return worker.Run();
}

}  // namespace fathom
