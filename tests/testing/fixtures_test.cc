// The fixture registry (tests/data/models/registry.json) against the fixture folders: every folder has an entry and
// every entry a folder with config.json, model*.safetensors and expected.safetensors; each entry's family,
// architecture, attention, format, tensor dtypes and features are what its config.json and safetensors headers say;
// its origin and oracle notes match the files beside it. Then the filters, on a registry made up here.
//
// RegistryProblems takes the registry and the models folder as arguments, so that the checks are shown to fail on
// temporary copies with one wrong entry or a folder missing a file (FindsAWrongEntry, FindsAFolderMissingAFile).
#include "testing/fixtures.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "testing/golden.h"
#include "testing/temp_dir.h"

namespace fathom::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Strings = std::vector<std::string>;

std::string RepoRoot() {
  return fs::weakly_canonical(fs::path(DataDir()) / ".." / "..").string();
}

json ReadJsonFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str(), nullptr, /*allow_exceptions=*/false);  // discarded when unreadable
}

// The tensor entries of a safetensors header ({name: {dtype, shape, data_offsets}}), read here rather than through
// io/safetensors.h so that dtypes fathom cannot load yet are still checked. Discarded when unreadable.
json SafetensorsHeader(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), 8) || n > (100u << 20)) return json(json::value_t::discarded);
  std::string text(n, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n))) return json(json::value_t::discarded);
  json h = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (h.is_object()) h.erase("__metadata__");
  return h;
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
int64_t Int(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}
bool Shape(const json& tensor, const std::vector<int64_t>& want) {
  return tensor.contains("shape") && tensor["shape"] == json(want);
}

// What the folder itself says, by the rules of registry.json's "about". A config these rules do not know (a new
// quantization method, V4's attention) gets a problem naming the rule to extend here.
struct Derived {
  std::string attention, format;
  std::set<std::string> dtypes, features;
};

Derived Derive(const json& cfg, const json& tensors, Strings* problems, const std::string& name) {
  Derived d;
  const bool v4 = Str(cfg, "model_type") == "deepseek_v4";
  d.attention = v4 ? "v4" : cfg.contains("kv_lora_rank") && !cfg["kv_lora_rank"].is_null() ? "mla" : "gqa";
  for (const auto& [tensor, entry] : tensors.items()) d.dtypes.insert(Str(entry, "dtype"));

  const json q = cfg.contains("quantization_config") ? cfg["quantization_config"] : json();
  if (q.is_null()) {
    static const std::map<std::string, std::string> kPlain = {{"BF16", "bf16"}, {"F16", "f16"}, {"F32", "f32"}};
    // The matrices' dtype names the format; vectors may be float32 beside them (V3.2's hub checkpoint keeps its
    // indexer's k_norm and the router's e_score_correction_bias in F32).
    std::set<std::string> matrices;
    // DeepSeek-V4 keeps mHC's matrices and the compressors' position biases in F32 and the hash routing table in I64
    // beside its float matrices.
    for (const auto& [tensor, entry] : tensors.items()) {
      const std::string dtype = Str(entry, "dtype");
      if (v4 && (dtype == "F32" || dtype == "I64")) continue;
      if (entry.contains("shape") && entry["shape"].is_array() && entry["shape"].size() >= 2) matrices.insert(dtype);
    }
    if (matrices.size() == 1 && kPlain.count(*matrices.begin())) {
      d.format = kPlain.at(*matrices.begin());
    } else {
      problems->push_back(
          fmt::format("{}: no quantization_config, but its tensors are [{}]", name, fmt::join(d.dtypes, ", ")));
    }
  } else if (Str(q, "quant_method") == "fp8" && q.contains("weight_block_size")) {
    d.format = "fp8-block";
    const json& b = q["weight_block_size"];
    const int64_t b0 = b.is_array() && b.size() == 2 && b[0].is_number_integer() ? b[0].get<int64_t>() : 0;
    const int64_t b1 = b.is_array() && b.size() == 2 && b[1].is_number_integer() ? b[1].get<int64_t>() : 0;
    if (b0 <= 0 || b1 <= 0) problems->push_back(name + ": weight_block_size is not two positive integers");
    int fp8 = 0;
    // DeepSeek-V4's hub names: `<layer>.scale` in F8_E8M0 (V3's: `<layer>.weight_scale_inv` in F32).
    const auto scale_of = [&](const std::string& tensor, const char* dtype_v3) -> std::pair<std::string, std::string> {
      if (!v4) return {tensor + "_scale_inv", dtype_v3};
      const size_t dot = tensor.rfind(".weight");
      return {(dot == std::string::npos ? tensor : tensor.substr(0, dot)) + ".scale", "F8_E8M0"};
    };
    for (const auto& [tensor, entry] : tensors.items()) {
      if (Str(entry, "dtype") != "F8_E4M3" || b0 <= 0 || b1 <= 0) continue;
      ++fp8;
      const json shape = entry.contains("shape") ? entry["shape"] : json();
      const auto [scale, scale_dtype] = scale_of(tensor, "F32");
      if (!shape.is_array() || shape.size() != 2 || !shape[0].is_number_integer() || !shape[1].is_number_integer() ||
          !tensors.contains(scale) || Str(tensors[scale], "dtype") != scale_dtype ||
          !Shape(tensors[scale], {(shape[0].get<int64_t>() + b0 - 1) / b0, (shape[1].get<int64_t>() + b1 - 1) / b1})) {
        problems->push_back(
            fmt::format("{}: {} has no {} {} of one scale per {}x{} block", name, tensor, scale_dtype, scale, b0, b1));
      }
    }
    // MXFP4 experts (expert_dtype fp4): I8 [out, in / 2] codes, each with an F8_E8M0 [out, in / 32] `.scale`.
    if (v4 && Str(cfg, "expert_dtype") == "fp4") {
      d.format += "+mxfp4";
      int fp4 = 0;
      for (const auto& [tensor, entry] : tensors.items()) {
        if (Str(entry, "dtype") != "I8") continue;
        ++fp4;
        const json shape = entry.contains("shape") ? entry["shape"] : json();
        const auto [scale, scale_dtype] = scale_of(tensor, "");
        if (!shape.is_array() || shape.size() != 2 || !shape[1].is_number_integer() || !tensors.contains(scale) ||
            Str(tensors[scale], "dtype") != scale_dtype ||
            !Shape(tensors[scale], {shape[0].get<int64_t>(), shape[1].get<int64_t>() * 2 / 32})) {
          problems->push_back(fmt::format("{}: {} has no F8_E8M0 {} of one scale per 32 inputs", name, tensor, scale));
        }
      }
      if (fp4 == 0) problems->push_back(name + ": expert_dtype fp4 but no I8 tensor");
    }
    if (fp8 == 0) problems->push_back(name + ": an fp8 quantization_config but no F8_E4M3 tensor");
  } else {
    problems->push_back(
        fmt::format("{}: quantization_config {} is not a format the registry test knows: add its "
                    "rule to Derive in tests/testing/fixtures_test.cc",
                    name, q.dump()));
  }

  const int64_t experts =
      std::max({Int(cfg, "n_routed_experts"), Int(cfg, "num_experts"), Int(cfg, "num_local_experts")});
  if (experts > 0) {
    d.features.insert("moe");
    std::string method = Str(cfg, "topk_method");
    std::replace(method.begin(), method.end(), '_', '-');
    if (!method.empty()) d.features.insert(method + "-routing");
  }
  if (Int(cfg, "n_shared_experts") > 0) d.features.insert("shared-experts");
  if (Int(cfg, "q_lora_rank") > 0) d.features.insert("q-lora");
  if (Int(cfg, "index_topk") > 0) d.features.insert("sparse-attention");  // V3.2's and V4's lightning indexer
  if (v4) {
    // V4's topk_method is implied (noaux_tc); its mHC streams and hash-routed layers are always there.
    if (Str(cfg, "topk_method").empty()) d.features.insert("noaux-tc-routing");
    d.features.insert("mhc");
    if (Int(cfg, "num_hash_layers") > 0 || cfg.contains("mlp_layer_types")) d.features.insert("hash-moe");
  }
  if (cfg.contains("tie_word_embeddings") && cfg["tie_word_embeddings"] == true) d.features.insert("tied-embeddings");
  if (tensors.contains("model.layers.0.self_attn.q_proj.bias") &&
      tensors.contains("model.layers.0.self_attn.k_proj.bias") &&
      tensors.contains("model.layers.0.self_attn.v_proj.bias")) {
    d.features.insert("qkv-bias");
  }
  if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()) {
    std::string type = Str(cfg["rope_scaling"], "rope_type");
    if (type.empty()) type = Str(cfg["rope_scaling"], "type");
    if (!type.empty() && type != "default") d.features.insert("rope-" + type);
  }
  return d;
}

// The case numbers k of a golden file's case{k}.input_ids.
std::set<int> Cases(const json& header) {
  std::set<int> cases;
  for (int k = 0; k < 1000; ++k) {
    if (header.contains(fmt::format("case{}.input_ids", k))) cases.insert(k);
  }
  return cases;
}

void CheckExpected(const fs::path& path, int64_t vocab, const std::string& name, Strings* problems) {
  const json h = SafetensorsHeader(path);
  if (!h.is_object()) return problems->push_back(name + ": expected.safetensors has no readable header");
  const std::set<int> cases = Cases(h);
  if (cases.empty() || *cases.rbegin() + 1 != static_cast<int>(cases.size())) {
    problems->push_back(
        fmt::format("{}: expected.safetensors cases are [{}], not 0..n-1", name, fmt::join(cases, ", ")));
  }
  if (h.size() != 3 * cases.size()) {
    problems->push_back(name + ": expected.safetensors holds other keys than case{k}.input_ids/logits/greedy");
  }
  for (int k : cases) {
    const json& ids = h[fmt::format("case{}.input_ids", k)];
    const std::string logits = fmt::format("case{}.logits", k), greedy = fmt::format("case{}.greedy", k);
    const json shape = ids.contains("shape") ? ids["shape"] : json();
    const int64_t t =
        shape.is_array() && shape.size() == 1 && shape[0].is_number_integer() ? shape[0].get<int64_t>() : -1;
    if (Str(ids, "dtype") != "I64" || t <= 0 || !h.contains(logits) || Str(h[logits], "dtype") != "F32" ||
        !Shape(h[logits], {t, vocab}) || !h.contains(greedy) || Str(h[greedy], "dtype") != "I64" ||
        !Shape(h[greedy], {16})) {
      problems->push_back(
          fmt::format("{}: expected.safetensors case{} is not input_ids I64 [T], logits F32 [T, {}], "
                      "greedy I64 [16]",
                      name, k, vocab));
    }
  }
}

void CheckEntry(const FixtureInfo& f, const fs::path& dir, const std::string& repo_root, Strings* problems) {
  const std::string& n = f.name;
  const json cfg = ReadJsonFile(dir / "config.json");
  if (!cfg.is_object()) return problems->push_back(n + ": no readable config.json");
  json tensors = json::object();
  int weight_files = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string file = e.path().filename().string();
    if (file.rfind("model", 0) != 0 || e.path().extension() != ".safetensors") continue;
    ++weight_files;
    const json h = SafetensorsHeader(e.path());
    if (!h.is_object()) return problems->push_back(n + ": " + file + " has no readable header");
    tensors.update(h);
  }
  if (weight_files == 0) return problems->push_back(n + ": no model.safetensors (nor model-*.safetensors shards)");
  if (!fs::exists(dir / "expected.safetensors")) return problems->push_back(n + ": no expected.safetensors");
  CheckExpected(dir / "expected.safetensors", Int(cfg, "vocab_size"), n, problems);

  auto mismatch = [&](const char* field, const std::string& listed, const std::string& actual, const char* why) {
    if (listed != actual)
      problems->push_back(fmt::format("{}: {} is '{}', but {} says '{}'", n, field, listed, why, actual));
  };
  mismatch("family", f.family, Str(cfg, "model_type"), "config.json model_type");
  const json& archs = cfg.contains("architectures") ? cfg["architectures"] : json();
  if (!archs.is_array() || archs.empty() || archs[0] != f.architecture) {
    problems->push_back(
        fmt::format("{}: architecture is '{}', config.json architectures is {}", n, f.architecture, archs.dump()));
  }
  const Derived d = Derive(cfg, tensors, problems, n);
  mismatch("attention", f.attention, d.attention, "config.json (kv_lora_rank set: mla)");
  if (!d.format.empty()) mismatch("format", f.format, d.format, "config.json quantization_config with the dtypes");
  const std::set<std::string> dtypes(f.tensor_dtypes.begin(), f.tensor_dtypes.end());
  if (dtypes != d.dtypes || dtypes.size() != f.tensor_dtypes.size()) {
    problems->push_back(fmt::format("{}: tensor_dtypes are [{}], the model's tensors are [{}]", n,
                                    fmt::join(f.tensor_dtypes, ", "), fmt::join(d.dtypes, ", ")));
  }
  const std::set<std::string> features(f.features.begin(), f.features.end());
  if (features != d.features || features.size() != f.features.size()) {
    problems->push_back(fmt::format("{}: features are [{}], config.json and the weights say [{}]", n,
                                    fmt::join(f.features, ", "), fmt::join(d.features, ", ")));
  }

  const bool has_rerun = fs::exists(dir / "oracle_rerun.safetensors");
  const std::set<int> listed(f.oracle_rerun_cases.begin(), f.oracle_rerun_cases.end());
  const std::set<int> rerun = has_rerun ? Cases(SafetensorsHeader(dir / "oracle_rerun.safetensors")) : std::set<int>{};
  if (listed != rerun || (has_rerun && rerun.empty())) {
    problems->push_back(fmt::format("{}: oracle_rerun_cases are [{}], oracle_rerun.safetensors holds cases [{}]", n,
                                    fmt::join(listed, ", "), fmt::join(rerun, ", ")));
  }

  const bool generated = fs::exists(dir / "FIXTURE.json");
  if (f.origin == kSharedOrigin) {
    if (f.shared_name.empty()) problems->push_back(n + ": a shared origin needs the shared fixture's shared_name");
    if (generated) problems->push_back(n + ": FIXTURE.json says it was made here, the origin says shared");
  } else if (f.origin.rfind(kMadeHerePrefix, 0) == 0) {
    const std::string script = f.origin.substr(kMadeHerePrefix.size());
    if (!fs::is_regular_file(fs::path(repo_root) / script)) {
      problems->push_back(fmt::format("{}: origin names {}, which does not exist in the repository", n, script));
    }
    if (!f.shared_name.empty()) problems->push_back(n + ": made here, but has a shared_name");
    if (generated) {
      const json made = ReadJsonFile(dir / "FIXTURE.json");
      if (!made.is_object() || Str(made, "made_by") != script) {
        problems->push_back(fmt::format("{}: FIXTURE.json's made_by is not {}", n, script));
      }
    } else if (script == "scripts/make_fixture.py") {
      problems->push_back(n + ": made by scripts/make_fixture.py, but has no FIXTURE.json");
    }
  } else {
    problems->push_back(
        fmt::format("{}: origin '{}' is neither '{}' nor '{}<script>'", n, f.origin, kSharedOrigin, kMadeHerePrefix));
  }
}

// Every disagreement between `registry` and the fixture folders under `models_dir` ("made here by" paths are
// resolved from `repo_root`).
Strings RegistryProblems(const std::vector<FixtureInfo>& registry, const std::string& models_dir,
                         const std::string& repo_root) {
  Strings problems;
  std::set<std::string> names;
  for (const FixtureInfo& f : registry) names.insert(f.name);
  for (const fs::directory_entry& e : fs::directory_iterator(models_dir)) {
    if (e.is_directory() && !names.count(e.path().filename().string())) {
      problems.push_back(e.path().filename().string() + ": a fixture folder that is not in the registry");
    }
  }
  for (const FixtureInfo& f : registry) {
    const fs::path dir = fs::path(models_dir) / f.name;
    if (!fs::is_directory(dir)) {
      problems.push_back(f.name + ": in the registry, but there is no folder " + dir.string());
      continue;
    }
    CheckEntry(f, dir, repo_root, &problems);
  }
  return problems;
}

json RegistryJson() {
  return ReadJsonFile(FixtureRegistryPath());
}
json& Entry(json& registry, const std::string& name) {
  for (json& e : registry["fixtures"]) {
    if (e["name"] == name) return e;
  }
  ADD_FAILURE() << "no entry " << name;
  static json none;
  return none;
}

// The problems of a copy of the real registry changed by `edit`, written to a temporary file and read back.
Strings ProblemsAfter(const std::function<void(json&)>& edit) {
  testing::TempDir tmp("fathom_fixtures");
  json j = RegistryJson();
  edit(j);
  std::ofstream(tmp.file("registry.json")) << j.dump(2);
  StatusOr<std::vector<FixtureInfo>> r = ReadFixtureRegistry(tmp.file("registry.json"));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {"unreadable"};
  return RegistryProblems(*r, DataDir() + "/models", RepoRoot());
}

bool Mentions(const Strings& problems, const std::string& a, const std::string& b) {
  return std::any_of(problems.begin(), problems.end(), [&](const std::string& p) {
    return p.find(a) != std::string::npos && p.find(b) != std::string::npos;
  });
}

TEST(FixtureRegistryTest, AgreesWithEveryFixtureFolder) {
  const Strings problems = RegistryProblems(Fixtures(), DataDir() + "/models", RepoRoot());
  EXPECT_TRUE(problems.empty()) << fmt::format("{}", fmt::join(problems, "\n"));
  EXPECT_GE(Fixtures().size(), 8u);
}

TEST(FixtureRegistryTest, FindsAWrongEntry) {
  struct Edit {
    std::string fixture, field, expect;
    std::function<void(json&)> edit;
  };
  const std::vector<Edit> edits = {
      {"qwen2-distill-tiny", "family", "model_type", [](json& e) { e["family"] = "llama"; }},
      {"qwen2-distill-tiny", "architecture", "architectures", [](json& e) { e["architecture"] = "LlamaForCausalLM"; }},
      {"deepseek-v3-tiny", "attention", "kv_lora_rank", [](json& e) { e["attention"] = "gqa"; }},
      {"llama3-distill-tiny", "attention", "kv_lora_rank", [](json& e) { e["attention"] = "mla"; }},
      {"deepseek-v3-fp8-tiny", "format", "quantization_config", [](json& e) { e["format"] = "bf16"; }},
      {"llama3-distill-tiny", "format", "quantization_config", [](json& e) { e["format"] = "fp8-block"; }},
      {"deepseek-v3-fp8-tiny", "tensor_dtypes", "F32",
       [](json& e) {
         e["tensor_dtypes"] = {"BF16", "F8_E4M3"};
       }},
      {"qwen2-tied-tiny", "features", "tied-embeddings", [](json& e) { e["features"] = {"qkv-bias"}; }},
      {"llama-coder-tiny", "features", "moe", [](json& e) { e["features"].push_back("moe"); }},
      {"qwen2-distill-tiny", "features", "qkv-bias", [](json& e) { e["features"] = json::array(); }},
      {"deepseek-v2-lite-tiny", "features", "greedy-routing",
       [](json& e) {
         e["features"] = {"moe", "noaux-tc-routing", "rope-yarn", "shared-experts"};
       }},
      {"deepseek-v3-tiny", "oracle_rerun_cases", "oracle_rerun", [](json& e) { e.erase("oracle_rerun_cases"); }},
      {"llama3-distill-tiny", "oracle_rerun_cases", "oracle_rerun", [](json& e) { e["oracle_rerun_cases"] = {1}; }},
      {"llama3-distill-fp8-tiny", "origin", "does not exist",
       [](json& e) { e["origin"] = "made here by tests/data/tools/no_such_script.py"; }},
      {"llama3-distill-fp8-tiny", "origin", "FIXTURE.json",
       [](json& e) { e["origin"] = "made here by scripts/make_fixture.py"; }},
      {"llama-coder-tiny", "origin", "neither", [](json& e) { e["origin"] = "downloaded"; }},
      {"llama-coder-tiny", "shared_name", "shared_name", [](json& e) { e.erase("shared_name"); }},
  };
  for (const Edit& e : edits) {
    const Strings problems = ProblemsAfter([&](json& j) { e.edit(Entry(j, e.fixture)); });
    EXPECT_TRUE(Mentions(problems, e.fixture, e.expect))
        << e.fixture << " with a wrong " << e.field << ": " << fmt::format("{}", fmt::join(problems, " | "));
  }
  // A folder with no entry, and an entry with no folder.
  Strings problems = ProblemsAfter([](json& j) {
    auto& all = j["fixtures"];
    all.erase(std::remove_if(all.begin(), all.end(), [](const json& e) { return e["name"] == "llama-coder-tiny"; }),
              all.end());
  });
  EXPECT_TRUE(Mentions(problems, "llama-coder-tiny", "not in the registry"))
      << fmt::format("{}", fmt::join(problems, " | "));
  problems = ProblemsAfter([](json& j) {
    json extra = j["fixtures"][0];
    extra["name"] = "no-such-tiny";
    j["fixtures"].push_back(extra);
  });
  EXPECT_TRUE(Mentions(problems, "no-such-tiny", "no folder")) << fmt::format("{}", fmt::join(problems, " | "));
}

TEST(FixtureRegistryTest, FindsAFolderMissingAFile) {
  testing::TempDir models("fathom_fixtures");
  const std::vector<FixtureInfo> one = {Fixture("qwen2-tied-tiny")};
  const fs::path src = ModelDir("qwen2-tied-tiny"), dst = fs::path(models.path()) / "qwen2-tied-tiny";
  fs::create_directories(dst);
  for (const char* file : {"config.json", "model.safetensors", "expected.safetensors"})
    fs::copy(src / file, dst / file);
  EXPECT_TRUE(RegistryProblems(one, models.path(), RepoRoot()).empty());
  for (const char* file : {"expected.safetensors", "model.safetensors", "config.json"}) {
    fs::rename(dst / file, dst / "moved");
    EXPECT_TRUE(Mentions(RegistryProblems(one, models.path(), RepoRoot()), "qwen2-tied-tiny", file)) << file;
    fs::rename(dst / "moved", dst / file);
  }
  fs::copy(src / "expected.safetensors", dst / "oracle_rerun.safetensors");
  EXPECT_TRUE(Mentions(RegistryProblems(one, models.path(), RepoRoot()), "qwen2-tied-tiny", "oracle_rerun"));
  fs::remove(dst / "oracle_rerun.safetensors");
  std::ofstream(dst / "FIXTURE.json") << R"({"made_by": "scripts/make_fixture.py"})";
  EXPECT_TRUE(Mentions(RegistryProblems(one, models.path(), RepoRoot()), "qwen2-tied-tiny", "FIXTURE.json"));
}

TEST(FixtureRegistryTest, ReadFixtureRegistryRefusesMalformedFiles) {
  testing::TempDir tmp("fathom_fixtures");
  EXPECT_FALSE(ReadFixtureRegistry(tmp.file("absent.json")).ok());
  const json good = RegistryJson();
  const std::vector<std::pair<std::string, std::function<void(json&)>>> edits = {
      {"a second entry", [](json& j) { j["fixtures"].push_back(j["fixtures"][0]); }},
      {"no 'family'", [](json& j) { j["fixtures"][0].erase("family"); }},
      {"'features' must be", [](json& j) { j["fixtures"][0]["features"] = "moe"; }},
      {"'oracle_rerun_cases' must be", [](json& j) { j["fixtures"][0]["oracle_rerun_cases"] = {"two"}; }},
      {"no 'fixtures'", [](json& j) { j.erase("fixtures"); }},
  };
  for (const auto& [message, edit] : edits) {
    json j = good;
    edit(j);
    std::ofstream(tmp.file("r.json")) << j.dump();
    StatusOr<std::vector<FixtureInfo>> r = ReadFixtureRegistry(tmp.file("r.json"));
    ASSERT_FALSE(r.ok()) << message;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().ToString();
  }
  std::ofstream(tmp.file("r.json")) << "{\"fixtures\": [";
  EXPECT_FALSE(ReadFixtureRegistry(tmp.file("r.json")).ok());
}

FixtureInfo Made(std::string name, std::string family, std::string format, std::string attention, Strings features) {
  FixtureInfo f;
  f.name = std::move(name);
  f.family = std::move(family);
  f.format = std::move(format);
  f.attention = std::move(attention);
  f.features = std::move(features);
  return f;
}

TEST(FixtureFilterTest, SelectsByEachFieldInRegistryOrder) {
  const std::vector<FixtureInfo> r = {
      Made("d", "qwen2", "bf16", "gqa", {"qkv-bias", "tied-embeddings"}),
      Made("a", "llama", "fp8-block", "gqa", {}),
      Made("c", "deepseek_v3", "bf16", "mla", {"moe", "q-lora"}),
      Made("b", "deepseek_v3", "fp8-block", "mla", {"moe", "q-lora"}),
  };
  EXPECT_EQ(SelectFixtures(r, {}), (Strings{"d", "a", "c", "b"}));
  EXPECT_EQ(SelectFixtures(r, {.family = "deepseek_v3"}), (Strings{"c", "b"}));
  EXPECT_EQ(SelectFixtures(r, {.format = "fp8-block"}), (Strings{"a", "b"}));
  EXPECT_EQ(SelectFixtures(r, {.attention = "gqa"}), (Strings{"d", "a"}));
  EXPECT_EQ(SelectFixtures(r, {.features = {"moe"}}), (Strings{"c", "b"}));
  EXPECT_EQ(SelectFixtures(r, {.features = {"qkv-bias", "tied-embeddings"}}), (Strings{"d"}));
  EXPECT_EQ(SelectFixtures(r, {.features = {"qkv-bias", "moe"}}), Strings{});
  EXPECT_EQ(SelectFixtures(r, {.without = {"moe"}}), (Strings{"d", "a"}));
  EXPECT_EQ(SelectFixtures(r, {.family = "deepseek_v3", .format = "bf16"}), (Strings{"c"}));
  EXPECT_EQ(SelectFixtures(r, {.format = "bf16", .attention = "mla", .features = {"q-lora"}}), (Strings{"c"}));
  EXPECT_EQ(SelectFixtures(r, {.family = "mistral"}), Strings{});
  std::vector<FixtureInfo> tagged = r;
  tagged[1].suites = {"engine"};
  tagged[3].suites = {"cuda-fp8-kv", "engine"};
  EXPECT_EQ(SelectFixtures(tagged, {.suite = "engine"}), (Strings{"a", "b"}));
  EXPECT_EQ(SelectFixtures(tagged, {.attention = "mla", .suite = "engine"}), (Strings{"b"}));
  EXPECT_EQ(SelectFixtures(tagged, {.suite = "no-such-suite"}), Strings{});
  EXPECT_TRUE(r[2].HasFeature("moe"));
  EXPECT_FALSE(r[1].HasFeature("moe"));
}

// Over the real registry: the attention filters (gqa, mla, v4) split it, the feature filters keep what they name, and
// every name is a fixture folder with an oracle.
TEST(FixtureFilterTest, TheRegistrysFiltersPartitionIt) {
  Strings all;
  for (const FixtureInfo& f : Fixtures()) all.push_back(f.name);
  EXPECT_EQ(FixtureNames(), all);
  Strings gqa = FixtureNames({.attention = "gqa"}), mla = FixtureNames({.attention = "mla"});
  Strings v4 = FixtureNames({.attention = "v4"});
  Strings both = gqa;
  both.insert(both.end(), mla.begin(), mla.end());
  both.insert(both.end(), v4.begin(), v4.end());
  std::sort(both.begin(), both.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(both, all);
  for (const std::string& name : FixtureNames({.features = {"moe"}})) EXPECT_TRUE(Fixture(name).HasFeature("moe"));
  for (const std::string& name : FixtureNames({.without = {"moe"}})) EXPECT_FALSE(Fixture(name).HasFeature("moe"));
  for (const std::string& name : all) EXPECT_TRUE(fs::exists(ModelDir(name) + "/expected.safetensors")) << name;
}

TEST(FixtureFilterDeathTest, AFilterThatSelectsNothingIsFatal) {
  EXPECT_DEATH(FixtureNames({.family = "no-such-family"}), "no fixture in .* has family 'no-such-family'");
  EXPECT_DEATH(Fixture("no-such-tiny"), "no fixture named no-such-tiny");
}

}  // namespace
}  // namespace fathom::testing
