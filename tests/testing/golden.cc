#include "testing/golden.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"
#include "model/moe.h"
#include "model/registry.h"

namespace fathom::testing {

std::string DataDir() {
  return FATHOM_TEST_DATA_DIR;
}
std::string ModelDir(const std::string& name) {
  return DataDir() + "/models/" + name;
}

StatusOr<GoldenSet> LoadGolden(const std::string& model_dir, const std::string& file_name, int only_case) {
  FATHOM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(model_dir + "/" + file_name));
  GoldenSet g;
  for (int k = only_case < 0 ? 0 : only_case;; ++k) {
    if (only_case >= 0 && k > only_case) break;
    const SafetensorsEntry* ids = file->Find(fmt::format("case{}.input_ids", k));
    if (ids == nullptr) break;
    const SafetensorsEntry* logits = file->Find(fmt::format("case{}.logits", k));
    const SafetensorsEntry* greedy = file->Find(fmt::format("case{}.greedy", k));
    if (logits == nullptr || greedy == nullptr || ids->dtype != DType::kI64 || logits->dtype != DType::kF32 ||
        greedy->dtype != DType::kI64 || logits->shape.size() != 2) {
      return DataLossError(fmt::format("expected.safetensors case{} is malformed", k));
    }
    GoldenCase c;
    TensorView iv = file->View(*ids), lv = file->View(*logits), gv = file->View(*greedy);
    for (int64_t i = 0; i < iv.numel(); ++i) c.input_ids.push_back(static_cast<int32_t>(iv.data<int64_t>()[i]));
    for (int64_t i = 0; i < gv.numel(); ++i) c.greedy.push_back(static_cast<int32_t>(gv.data<int64_t>()[i]));
    c.vocab = lv.dim(1);
    c.logits.assign(lv.data<float>(), lv.data<float>() + lv.numel());
    if (lv.dim(0) != iv.numel()) return DataLossError(fmt::format("case{}: logits rows != input length", k));
    g.cases.push_back(std::move(c));
  }
  if (g.cases.empty()) return DataLossError("expected.safetensors holds no cases");
  return g;
}

StatusOr<GoldenSet> LoadGoldenWithReruns(const std::string& model_dir) {
  FATHOM_ASSIGN_OR_RETURN(GoldenSet g, LoadGolden(model_dir));
  const std::string rerun = "oracle_rerun.safetensors";
  if (!std::filesystem::exists(model_dir + "/" + rerun)) return g;
  FATHOM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(model_dir + "/" + rerun));
  for (size_t c = 0; c < g.cases.size(); ++c) {
    if (file->Find(fmt::format("case{}.input_ids", c)) == nullptr) continue;
    FATHOM_ASSIGN_OR_RETURN(GoldenSet one, LoadGolden(model_dir, rerun, static_cast<int>(c)));
    if (one.cases[0].input_ids != g.cases[c].input_ids) {
      return DataLossError(fmt::format("{}: case{} has other input ids than expected.safetensors", rerun, c));
    }
    g.cases[c] = std::move(one.cases[0]);
  }
  return g;
}

ScatteredBlocks::ScatteredBlocks(int32_t num_blocks, uint32_t seed) : num_blocks_(num_blocks) {
  for (int32_t i = 0; i < num_blocks; ++i) free_.push_back(i);
  std::mt19937 rng(seed);
  std::shuffle(free_.begin(), free_.end(), rng);
}

std::vector<int32_t> ScatteredBlocks::Take(int32_t n) {
  FATHOM_CHECK_LE(static_cast<size_t>(n), free_.size());
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  return out;
}

float MaxAbsDiff(const float* a, const float* b, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

StatusOr<std::vector<std::vector<float>>> ForwardCasesChunked(Model& model, Backend& backend, const GoldenSet& golden,
                                                              const std::vector<int>& pattern, uint32_t block_seed,
                                                              int32_t block_size, DType kv_dtype) {
  const size_t n = golden.cases.size();
  const int64_t vocab = model.config().vocab_size;
  const KvCacheSpec spec = model.kv_cache_spec();
  FATHOM_ASSIGN_OR_RETURN(KvCache kv,
                          KvCache::Allocate(backend, spec, kv_dtype, 64, block_size, TestWindowBlocks(spec, 64)));
  ScatteredBlocks blocks(64, block_seed);
  std::vector<std::vector<int32_t>> tables(n);
  std::vector<int32_t> done(n, 0);
  std::vector<std::vector<float>> out(n);
  for (size_t c = 0; c < n; ++c) {
    const auto len = static_cast<int32_t>(golden.cases[c].input_ids.size());
    tables[c] = blocks.Take((len + block_size - 1) / block_size);
  }
  for (size_t step = 0;; ++step) {
    ForwardBatch batch(block_size);
    std::vector<std::pair<size_t, int32_t>> rows;  // case, tokens
    for (size_t c = 0; c < n; ++c) {
      const auto& ids = golden.cases[c].input_ids;
      const int32_t left = static_cast<int32_t>(ids.size()) - done[c];
      if (left == 0) continue;
      const int want = pattern[(step + c) % pattern.size()];
      const int32_t take = want == 0 ? left : std::min<int32_t>(left, want);
      batch.AddSequence(std::span<const int32_t>(ids.data() + done[c], static_cast<size_t>(take)), done[c], tables[c],
                        LogitsMode::kAll, TestWindowTable(spec, tables[c]));
      rows.emplace_back(c, take);
      done[c] += take;
    }
    if (rows.empty()) return out;
    Tensor logits;  // [tokens, vocab]
    FATHOM_RETURN_IF_ERROR(model.Forward(batch, kv, &logits));
    std::vector<float> h(static_cast<size_t>(logits.numel()));
    FATHOM_RETURN_IF_ERROR(backend.CopyToHost(logits, h.data()));
    size_t r = 0;
    for (const auto& [c, count] : rows) {
      out[c].insert(out[c].end(), h.begin() + static_cast<int64_t>(r) * vocab,
                    h.begin() + static_cast<int64_t>(r + static_cast<size_t>(count)) * vocab);
      r += static_cast<size_t>(count);
    }
  }
}

std::string FixtureName(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

float Margin(const float* row, int64_t n, int32_t* best) {
  int32_t b = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[b]) b = static_cast<int32_t>(i);
  }
  float second = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (i != b) second = std::max(second, row[i]);
  }
  *best = b;
  return row[b] - second;
}

GreedyRun GreedyTogether(Model& model, Backend& backend, const std::vector<std::vector<int32_t>>& prompts, size_t steps,
                         int64_t vocab) {
  constexpr int32_t kBs = 16;
  GreedyRun r;
  r.tokens.resize(prompts.size());
  r.margins.resize(prompts.size());
  const KvCacheSpec spec = model.kv_cache_spec();
  auto kv = KvCache::Allocate(backend, spec, DType::kF32, 128, kBs, TestWindowBlocks(spec, 128));
  EXPECT_TRUE(kv.ok());
  if (!kv.ok()) return r;
  ScatteredBlocks blocks(128, 9);
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> cached(prompts.size(), 0);
  for (const auto& p : prompts) {
    tables.push_back(blocks.Take(static_cast<int32_t>((p.size() + steps + kBs - 1) / kBs)));
  }
  for (size_t step = 0; step < steps; ++step) {
    ForwardBatch b(kBs);
    std::vector<std::vector<int32_t>> inputs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      inputs[i] = step == 0 ? prompts[i] : std::vector<int32_t>{r.tokens[i].back()};
      b.AddSequence(inputs[i], cached[i], tables[i], LogitsMode::kLast, TestWindowTable(spec, tables[i]));
    }
    Tensor logits;
    const Status s = model.Forward(b, *kv, &logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return r;
    std::vector<float> h(static_cast<size_t>(logits.numel()));
    EXPECT_TRUE(backend.CopyToHost(logits, h.data()).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      int32_t next = 0;
      r.margins[i].push_back(Margin(h.data() + static_cast<int64_t>(i) * vocab, vocab, &next));
      r.tokens[i].push_back(next);
      cached[i] += static_cast<int32_t>(inputs[i].size());
    }
  }
  return r;
}

size_t ExpectGreedyAloneEqualsTogether(Model& model, Backend& backend, const std::vector<std::vector<int32_t>>& prompts,
                                       size_t steps, int64_t vocab, float min_margin) {
  const GreedyRun together = GreedyTogether(model, backend, prompts, steps, vocab);
  size_t compared = 0;
  for (size_t c = 0; c < prompts.size(); ++c) {
    const GreedyRun alone = GreedyTogether(model, backend, {prompts[c]}, steps, vocab);
    for (size_t s = 0; s < steps && s < alone.tokens[0].size() && s < together.tokens[c].size(); ++s) {
      if (alone.margins[0][s] < min_margin || together.margins[c][s] < min_margin) break;
      EXPECT_EQ(alone.tokens[0][s], together.tokens[c][s]) << "case " << c << " step " << s;
      ++compared;
    }
  }
  return compared;
}

StatusOr<std::vector<float>> RouteMargins(const std::string& model_dir, const ModelConfig& cfg,
                                          const std::vector<int32_t>& tokens) {
  CpuBackend cpu;
  LoadOptions opts;
  opts.show_progress = false;
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(model_dir, cfg, opts, cpu));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int32_t blocks = static_cast<int32_t>((n + 15) / 16);
  const KvCacheSpec spec = model->kv_cache_spec();
  FATHOM_ASSIGN_OR_RETURN(auto kv,
                          KvCache::Allocate(cpu, spec, DType::kF32, blocks, 16, TestWindowBlocks(spec, blocks)));
  std::vector<float> margin(static_cast<size_t>(n), INFINITY);
  const SelectionMarginObserver observer = [&](int64_t t, float m) {
    if (t < n) margin[static_cast<size_t>(t)] = std::min(margin[static_cast<size_t>(t)], m);
  };
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int32_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = i;
  ForwardBatch b(16);
  b.AddSequence(tokens, 0, table, LogitsMode::kLast, TestWindowTable(spec, table));
  Tensor logits;
  SetSelectionMarginObserver(&observer);
  const Status st = model->Forward(b, kv, &logits);
  SetSelectionMarginObserver(nullptr);
  FATHOM_RETURN_IF_ERROR(st);
  return margin;
}

}  // namespace fathom::testing
