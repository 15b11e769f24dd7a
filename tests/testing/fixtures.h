// The oracle fixture registry, tests/data/models/registry.json: every fixture folder under tests/data/models, with
// its family, weight format, attention layout, features and origin. Tests iterate fixtures by filter instead of
// naming them, so that a new fixture needs one registry entry and no test edits (tests/data/models/README.md).
//
//   INSTANTIATE_TEST_SUITE_P(MlaFixtures, MyTest, ::testing::ValuesIn(testing::FixtureNames({.attention = "mla"})),
//                            testing::FixtureName);
//   testing::FixtureNames({.features = {"moe"}});                 // every MoE fixture, in registry order
//   testing::FixtureNames({.format = "bf16", .without = {"moe"}});
//   testing::FixtureNames({.suite = "engine"});                   // the subset a test picked, named in the registry
//   for (const testing::FixtureInfo& f : testing::Fixtures()) ...
//
// testing_fixtures_test checks every entry against its folder (config.json, the safetensors headers).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace fathom::testing {

// The origin of the fixtures copied unchanged from the shared reference data (reference/models).
inline constexpr std::string_view kSharedOrigin = "shared reference/models (transformers 5.17 / torch 2.11, float32)";
// The prefix of the origin of a fixture made in this repository: "made here by <path from the repository root>".
inline constexpr std::string_view kMadeHerePrefix = "made here by ";

struct FixtureInfo {
  std::string name;                        // its folder under tests/data/models
  std::string family;                      // config.json model_type: "llama", "qwen2", "deepseek_v3", ...
  std::string architecture;                // config.json architectures[0]
  std::string format;                      // weight format: "bf16", "f32", "fp8-block", ...
  std::vector<std::string> tensor_dtypes;  // the dtypes of model*.safetensors, as safetensors spells them
  std::string attention;                   // "gqa" (MHA included) or "mla"
  std::vector<std::string> features;       // "moe", "tied-embeddings", "qkv-bias", "noaux-tc-routing", ...
  std::vector<std::string> suites;         // the tests that run a chosen subset and include it ("engine", ...)
  std::string origin;                      // kSharedOrigin, or kMadeHerePrefix + a script's path
  std::string shared_name;                 // the shared reference fixture it is a copy of (shared origin only)
  std::string source;                      // the fixture it was derived from, if any
  std::string oracle;                      // notes on its expected.safetensors
  std::vector<int> oracle_rerun_cases;     // the cases that oracle_rerun.safetensors overrides

  bool HasFeature(std::string_view feature) const;
};

// Empty fields match anything; every one of `features` must be present and none of `without`. (The `= {}`s let
// designated initializers name only some fields under -Wmissing-field-initializers.)
struct FixtureFilter {
  std::string family = {};
  std::string format = {};
  std::string attention = {};
  std::vector<std::string> features = {};
  std::vector<std::string> without = {};
  std::string suite = {};  // one of the entry's `suites` (a test that runs a chosen subset, for CI time)
};

bool Matches(const FixtureInfo& fixture, const FixtureFilter& filter);

// DataDir() + "/models/registry.json".
std::string FixtureRegistryPath();
// Reads and checks the shape of a registry file: required fields present and of the right type, names unique.
StatusOr<std::vector<FixtureInfo>> ReadFixtureRegistry(const std::string& path);

// The registry at FixtureRegistryPath(), read once; a registry that cannot be read is a fatal error.
const std::vector<FixtureInfo>& Fixtures();
// The entry named `name` in Fixtures(); a name not there is a fatal error.
const FixtureInfo& Fixture(const std::string& name);

// The names of the entries of `registry` that match `filter`, in registry order (possibly none).
std::vector<std::string> SelectFixtures(const std::vector<FixtureInfo>& registry, const FixtureFilter& filter);
// SelectFixtures over Fixtures(), for ::testing::ValuesIn. A filter that selects nothing is a fatal error (an empty
// instantiation would silently run nothing).
std::vector<std::string> FixtureNames(const FixtureFilter& filter = {});

}  // namespace fathom::testing
