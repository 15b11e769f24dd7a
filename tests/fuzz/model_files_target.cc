// FuzzModelFiles: config.json + a .safetensors file, loaded the way `fathom serve --model DIR` loads a checkpoint,
// then one forward step when they load.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/logging.h"
#include "fuzz_targets.h"
#include "io/model_config.h"
#include "model/model.h"
#include "model/registry.h"

namespace fathom::fuzz {
namespace {

void WriteFile(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) __builtin_trap();  // the fuzzer's own folder must be writable
}

// A folder of this process's own (tmpfs where there is one), reused by every input.
const std::filesystem::path& Folder() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::filesystem::path d = base / ("fathom-fuzz-model-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] { std::filesystem::remove_all(Folder()); });
    return d;
  }();
  return dir;
}

}  // namespace

int FuzzModelFiles(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  std::string_view config, tensors;
  SplitAt(std::string_view(reinterpret_cast<const char*>(data), size), "#safetensors", &config, &tensors);
  const std::filesystem::path& dir = Folder();
  WriteFile(dir / "config.json", config);
  WriteFile(dir / "model.safetensors", tensors);

  StatusOr<ModelConfig> cfg = LoadModelConfig(dir.string());
  static const bool verbose = std::getenv("FATHOM_FUZZ_VERBOSE") != nullptr;  // how far each input got
  if (verbose && !cfg.ok()) std::fprintf(stderr, "--- config: %s\n", cfg.status().ToString().c_str());
  if (!cfg.ok()) {
    if (cfg.status().message().empty()) __builtin_trap();
    return 0;
  }
  StatusOr<const Architecture*> arch = FindArchitecture(cfg->architecture);
  if (!arch.ok()) return 0;
  (void)(*arch)->weight_specs(*cfg);  // sizing alone (fathom inspect) must be safe too
  CpuBackend backend;
  LoadOptions opts;
  opts.format = LoadFormat::kSafetensors;
  opts.show_progress = false;
  StatusOr<std::unique_ptr<Model>> model = LoadModel(dir.string(), *cfg, opts, backend);
  if (verbose) std::fprintf(stderr, "--- %s\n", model.ok() ? "loaded" : model.status().ToString().c_str());
  if (!model.ok()) {
    if (model.status().message().empty()) __builtin_trap();
    return 0;
  }
  // Weights that load run: whatever their values (NaN, inf), a forward step returns logits of the right shape.
  StatusOr<KvCache> kv = KvCache::Allocate(backend, (*model)->kv_cache_spec(), DType::kF32, 2, 16);
  if (!kv.ok()) return 0;
  ForwardBatch batch(16);
  const std::vector<int32_t> prompt = {0, static_cast<int32_t>(cfg->vocab_size - 1)};
  const std::vector<int32_t> blocks = {1};
  batch.AddSequence(prompt, 0, blocks, LogitsMode::kLast);
  Tensor logits;
  if (Status s = (*model)->Forward(batch, *kv, &logits); !s.ok()) return 0;
  if (logits.view().dim(0) != 1 || logits.view().dim(1) != cfg->vocab_size) __builtin_trap();
  return 0;
}

}  // namespace fathom::fuzz
