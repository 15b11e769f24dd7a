#include "testing/fixtures.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/check.h"
#include "testing/golden.h"

namespace fathom::testing {
namespace {

using nlohmann::json;

Status ReadString(const json& j, const std::string& where, const char* key, bool required, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return DataLossError(fmt::format("{}: no '{}'", where, key));
    return OkStatus();
  }
  if (!it->is_string() || (required && it->get<std::string>().empty())) {
    return DataLossError(fmt::format("{}: '{}' must be a non-empty string", where, key));
  }
  *out = it->get<std::string>();
  return OkStatus();
}

Status ReadStrings(const json& j, const std::string& where, const char* key, bool required,
                   std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return DataLossError(fmt::format("{}: no '{}'", where, key));
    return OkStatus();
  }
  if (!it->is_array()) return DataLossError(fmt::format("{}: '{}' must be an array of strings", where, key));
  for (const json& s : *it) {
    if (!s.is_string() || s.get<std::string>().empty()) {
      return DataLossError(fmt::format("{}: '{}' must be an array of non-empty strings", where, key));
    }
    out->push_back(s.get<std::string>());
  }
  return OkStatus();
}

}  // namespace

bool FixtureInfo::HasFeature(std::string_view feature) const {
  return std::find(features.begin(), features.end(), feature) != features.end();
}

bool Matches(const FixtureInfo& f, const FixtureFilter& filter) {
  if (!filter.family.empty() && f.family != filter.family) return false;
  if (!filter.format.empty() && f.format != filter.format) return false;
  if (!filter.attention.empty() && f.attention != filter.attention) return false;
  for (const std::string& feature : filter.features) {
    if (!f.HasFeature(feature)) return false;
  }
  for (const std::string& feature : filter.without) {
    if (f.HasFeature(feature)) return false;
  }
  if (!filter.suite.empty() && std::find(f.suites.begin(), f.suites.end(), filter.suite) == f.suites.end()) {
    return false;
  }
  return true;
}

std::string FixtureRegistryPath() {
  return DataDir() + "/models/registry.json";
}

StatusOr<std::vector<FixtureInfo>> ReadFixtureRegistry(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("cannot open the fixture registry {}", path));
  std::stringstream text;
  text << in.rdbuf();
  json root = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return DataLossError(fmt::format("{}: not valid JSON", path));
  if (!root.is_object() || !root.contains("fixtures") || !root["fixtures"].is_array()) {
    return DataLossError(fmt::format("{}: no 'fixtures' array", path));
  }
  std::vector<FixtureInfo> out;
  std::set<std::string> names;
  for (size_t i = 0; i < root["fixtures"].size(); ++i) {
    const json& e = root["fixtures"][i];
    std::string where = fmt::format("{}: fixtures[{}]", path, i);
    if (!e.is_object()) return DataLossError(where + ": not an object");
    FixtureInfo f;
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "name", true, &f.name));
    where += " (" + f.name + ")";
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "family", true, &f.family));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "architecture", true, &f.architecture));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "format", true, &f.format));
    FATHOM_RETURN_IF_ERROR(ReadStrings(e, where, "tensor_dtypes", true, &f.tensor_dtypes));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "attention", true, &f.attention));
    FATHOM_RETURN_IF_ERROR(ReadStrings(e, where, "features", true, &f.features));
    FATHOM_RETURN_IF_ERROR(ReadStrings(e, where, "suites", false, &f.suites));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "origin", true, &f.origin));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "shared_name", false, &f.shared_name));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "source", false, &f.source));
    FATHOM_RETURN_IF_ERROR(ReadString(e, where, "oracle", true, &f.oracle));
    if (auto it = e.find("oracle_rerun_cases"); it != e.end() && !it->is_null()) {
      if (!it->is_array()) return DataLossError(where + ": 'oracle_rerun_cases' must be an array of case numbers");
      for (const json& c : *it) {
        if (!c.is_number_integer() || c.get<int64_t>() < 0 || c.get<int64_t>() > 1000) {
          return DataLossError(where + ": 'oracle_rerun_cases' must be an array of case numbers");
        }
        f.oracle_rerun_cases.push_back(c.get<int>());
      }
    }
    if (!names.insert(f.name).second) return DataLossError(fmt::format("{}: a second entry named {}", path, f.name));
    out.push_back(std::move(f));
  }
  if (out.empty()) return DataLossError(fmt::format("{}: no fixtures", path));
  return out;
}

const std::vector<FixtureInfo>& Fixtures() {
  static const std::vector<FixtureInfo> registry = [] {
    StatusOr<std::vector<FixtureInfo>> r = ReadFixtureRegistry(FixtureRegistryPath());
    FATHOM_CHECK(r.ok(), "{}", r.status().ToString());
    return std::move(r).value();
  }();
  return registry;
}

const FixtureInfo& Fixture(const std::string& name) {
  const std::vector<FixtureInfo>& all = Fixtures();
  auto it = std::find_if(all.begin(), all.end(), [&](const FixtureInfo& f) { return f.name == name; });
  FATHOM_CHECK(it != all.end(), "no fixture named {} in {}", name, FixtureRegistryPath());
  return *it;
}

std::vector<std::string> SelectFixtures(const std::vector<FixtureInfo>& registry, const FixtureFilter& filter) {
  std::vector<std::string> names;
  for (const FixtureInfo& f : registry) {
    if (Matches(f, filter)) names.push_back(f.name);
  }
  return names;
}

std::vector<std::string> FixtureNames(const FixtureFilter& filter) {
  std::vector<std::string> names = SelectFixtures(Fixtures(), filter);
  FATHOM_CHECK(!names.empty(),
               "no fixture in {} has family '{}', format '{}', attention '{}', features [{}], none of [{}] and suite "
               "'{}'",
               FixtureRegistryPath(), filter.family, filter.format, filter.attention, fmt::join(filter.features, ", "),
               fmt::join(filter.without, ", "), filter.suite);
  return names;
}

}  // namespace fathom::testing
