#include "server/constraints.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/vocab_text.h"
#include "server/tools.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

StatusOr<grammar::Grammar> ToGrammar(const server::ConstraintSpec& spec) {
  using Kind = server::ConstraintSpec::Kind;
  grammar::JsonSchemaOptions options;
  switch (spec.kind) {
    case Kind::kJsonObject:
      return grammar::AnyJsonGrammar(options, /*object_only=*/true);
    case Kind::kJsonSchema: {
      auto schema = nlohmann::ordered_json::parse(spec.body, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return InvalidArgumentError("the schema is not JSON");
      return grammar::JsonSchemaToGrammar(schema, options);
    }
    case Kind::kRegex: {
      FATHOM_ASSIGN_OR_RETURN(grammar::ExprPtr e, grammar::RegexToExpr(spec.body, grammar::RawUtf8, {}));
      grammar::GrammarBuilder b;
      const int32_t root = b.Add("regex", e);
      return b.Finish(root);
    }
    case Kind::kGrammar:
      return grammar::ParseGbnf(spec.body);
    case Kind::kTools: {
      auto body = nlohmann::ordered_json::parse(spec.body, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded() || !body.is_object()) return InternalError("a tools constraint that is not JSON");
      server::ToolsSpec tools;
      tools.tools = body.value("tools", nlohmann::ordered_json::array());
      tools.choice = body.value("choice", "") == "named" ? server::ToolsSpec::Choice::kNamed
                                                         : server::ToolsSpec::Choice::kRequired;
      tools.name = body.value("name", "");
      tools.parallel = body.value("parallel", true);
      FATHOM_ASSIGN_OR_RETURN(std::optional<server::ToolFormat> format,
                              server::ParseToolCallParser(body.value("format", "none")));
      return server::ToolCallGrammar(format.value_or(server::ToolFormat::kNone), tools);
    }
    case Kind::kChoice: {
      auto choices = nlohmann::json::parse(spec.body, nullptr, /*allow_exceptions=*/false);
      std::vector<grammar::ExprPtr> alts;
      for (const auto& c : choices) alts.push_back(grammar::Lit(c.get<std::string>()));
      grammar::GrammarBuilder b;
      const int32_t root = b.Add("choice", grammar::Alt(std::move(alts)));
      return b.Finish(root);
    }
  }
  return InternalError("unknown constraint kind");
}

}  // namespace

ConstraintCompiler::ConstraintCompiler(const Tokenizer* tokenizer, std::vector<int64_t> eos_ids, size_t capacity)
    : tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)), capacity_(capacity) {}

StatusOr<std::shared_ptr<grammar::GrammarCache>> ConstraintCompiler::Get(const server::ConstraintSpec& spec,
                                                                         double* compile_s) {
  if (compile_s != nullptr) *compile_s = 0.0;
  if (tokenizer_ == nullptr) return FailedPreconditionError("structured output needs the model's tokenizer");
  const std::string key = fmt::format("{}\n{}", static_cast<int>(spec.kind), spec.body);
  std::shared_ptr<const grammar::TokenVocab> vocab;
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    if (!vocab_) {
      std::vector<int32_t> eos(eos_ids_.begin(), eos_ids_.end());
      vocab_ = grammar::VocabFromTokenizer(*tokenizer_, eos);
    }
    vocab = vocab_;
  }
  // Compiled outside the lock: one slow schema does not hold up the others. Bounded by CompileOptions' state
  // limits, so a schema that blows up is refused rather than compiled for long.
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<grammar::Grammar> g = ToGrammar(spec);
  StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> c =
      g.ok() ? grammar::Compile(*g, grammar::CompileOptions{.cancel = cancel_})
             : StatusOr<std::shared_ptr<const grammar::CompiledGrammar>>(g.status());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lock(mu_);
  if (compile_s != nullptr) *compile_s = seconds;
  if (!c.ok() && c.status().code() == StatusCode::kCancelled) {
    return UnavailableError("the server is shutting down");
  }
  if (!c.ok()) {
    return InvalidArgumentError(fmt::format("'{}': {}", spec.param, c.status().message()));
  }
  auto cache = std::make_shared<grammar::GrammarCache>(*c, vocab);
  // The start's closure is computed here, on this thread, not first on the engine's: a grammar whose rules each call
  // two others before a byte expands to exponentially many stacks, and one over the budget is refused now.
  { grammar::GrammarMatcher start(cache); }
  if (cache->over_budget()) {
    return InvalidArgumentError(fmt::format(
        "'{}': grammar too complex: its start expands to more than {} stacks of rule calls (rules that each call "
        "others before reading a byte); simplify it",
        spec.param, grammar::MatcherOptions().max_closure_stacks));
  }
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;  // compiled meanwhile
  lru_.emplace_front(key, cache);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return cache;
}

}  // namespace fathom
