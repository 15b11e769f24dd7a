// FuzzGrammar: the structured-output grammar compiler (src/grammar/) through each of its front ends, as the server's
// ConstraintCompiler calls them (src/server/constraints.cc), then the reference matchers over strings the compiled
// grammar itself produces.
//
//   build/fuzz-fast/tests/fuzz/fuzz_grammar -runs=1000000 CORPUS_COPY    # a copy of tests/data/fuzz/grammar
//
// The input's first byte picks the front end (its value mod 3: '0' JSON Schema, '1' a regex, '2' GBNF; for JSON
// Schema, its value / 3 mod 3 is JsonSchemaOptions::max_whitespace); the rest is the front end's text.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_targets.h"
#include "grammar/gbnf.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "server/json_limits.h"

namespace fathom::fuzz {
namespace {

// The server bounds request bodies, and a schema or grammar is one field of one: past this the compiler's costs are
// those of many small inputs, which the fuzzer explores faster.
constexpr size_t kMaxInput = 64 << 10;
// Small automata bounds (the server's are 400k NFA and 100k DFA states) keep one execution to milliseconds; a grammar
// that needs more is refused, which is itself a path worth fuzzing. (With minimization by rounds, quadratic in a long
// chain, it took 60% of the fuzzer's time at a bound of 5000 DFA states; Hopcroft's refinement is now under 1%.)
constexpr grammar::CompileOptions kCompile{.max_nfa_states = 20000, .max_dfa_states = 2000};
// Walks (below) stop at this many bytes, and at this nesting of rule calls.
constexpr size_t kMaxWalkBytes = 256;
constexpr size_t kMaxWalkDepth = 64;

void Die(const char* what, std::string_view text) {
  std::fprintf(stderr, "FuzzGrammar: %s: '%.*s'\n", what, static_cast<int>(std::min<size_t>(text.size(), 400)),
               text.data());
  __builtin_trap();
}

// Every refusal is a kInvalidArgument that says why (the server answers it as a 400 quoting the message).
void CheckRefusal(const Status& s) {
  if (s.code() != StatusCode::kInvalidArgument || s.message().empty()) {
    Die("a refusal that is not an InvalidArgument with a message", s.message());
  }
}

// A string the compiled grammar produces: a walk from the root rule's start along byte edges, rule calls and
// returns, each choice read from `choices` (cycled). Compile trims every edge into a state from which its rule
// cannot end, so each walk spells a prefix of some matched string; true when it stopped where the whole grammar may
// end (then it spells a matched string).
bool Walk(const grammar::CompiledGrammar& g, std::string_view choices, std::string* out) {
  out->clear();
  if (choices.empty()) choices = "\x01";
  size_t next = 0;
  auto choose = [&](size_t n) -> size_t {
    const auto c = static_cast<uint8_t>(choices[next++ % choices.size()]);
    return c % n;
  };
  int32_t state = g.root_start();
  std::vector<int32_t> returns;  // where each open call continues
  // Calls and returns read no byte, and a rule may call a nullable one in a loop: the steps are bounded too.
  for (size_t steps = 0; steps < 4 * kMaxWalkBytes && out->size() < kMaxWalkBytes; ++steps) {
    const grammar::CompiledGrammar::State& st = g.states()[state];
    const size_t calls = returns.size() < kMaxWalkDepth ? st.calls.size() : 0;
    const size_t options = st.bytes.size() + calls + (st.final ? 1 : 0);
    if (options == 0) return false;  // only calls, at the depth bound
    size_t k = choose(options);
    if (k < st.bytes.size()) {
      const auto& e = st.bytes[k];
      out->push_back(static_cast<char>(e.lo + choose(static_cast<size_t>(e.hi - e.lo) + 1)));
      state = e.to;
    } else if ((k -= st.bytes.size()) < calls) {
      returns.push_back(st.calls[k].to);
      state = g.rule_start(st.calls[k].rule);
    } else if (returns.empty()) {
      return true;  // the root rule ends here
    } else {
      state = returns.back();
      returns.pop_back();
    }
  }
  return false;
}

// JSON syntax only, and a number too large for a double counts as valid: nlohmann refuses 1e999 (error 406) where
// JSON itself allows it, and a schema's number grammar may write one.
class JsonSyntax final : public nlohmann::json_sax<nlohmann::json> {
 public:
  static bool Valid(std::string_view text) {
    JsonSyntax sax;
    return nlohmann::json::sax_parse(text, &sax) || sax.error_id_ == 406;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    error_id_ = ex.id;
    return false;
  }

 private:
  int error_id_ = 0;
};

// The reference matchers (grammar::Matches, MatchesPrefix) keep every stack of rule calls apart, so an ambiguous
// grammar of several rules costs them exponentially many stacks in the length of the text: they are written for
// tests, not for clients' grammars (the server's GrammarMatcher shares stacks). So over a grammar with calls they are
// run on short texts only, and not at all past a few rules; a grammar without calls is one DFA, matched in linear
// time.
size_t ReferenceMatchBytes(const grammar::CompiledGrammar& g) {
  bool calls = false;
  for (const auto& st : g.states()) calls |= !st.calls.empty();
  if (!calls) return kMaxWalkBytes;
  if (g.num_rules() <= 2) return 8;
  if (g.num_rules() <= 4) return 4;
  return 0;
}

void Exercise(const grammar::CompiledGrammar& g, std::string_view choices, bool json) {
  const size_t match_bytes = ReferenceMatchBytes(g);
  std::string walked;
  for (int i = 0; i < 3; ++i) {
    // Each walk reads the choices from a different place, so that one input yields different strings.
    const bool complete = Walk(g, choices.substr(std::min(choices.size(), static_cast<size_t>(i) * 7)), &walked);
    // What a JSON Schema's grammar writes is always JSON (json_schema.h: valid instances only).
    if (json && complete && !JsonSyntax::Valid(walked)) Die("a JSON Schema grammar wrote invalid JSON", walked);
    if (match_bytes == 0) continue;
    // A prefix of what a walk spells is a prefix of a match, however short.
    const std::string_view head = std::string_view(walked).substr(0, match_bytes);
    if (!grammar::MatchesPrefix(g, head)) Die("a string the grammar produced is not a prefix of a match", head);
    if (complete && walked.size() <= match_bytes && !grammar::Matches(g, walked)) {
      Die("a string the grammar produced does not match", walked);
    }
    // The same string one byte off: no invariant but consistency (a match is a prefix of one).
    std::string changed(head);
    if (changed.empty()) {
      changed.push_back(choices.empty() ? 'x' : choices.back());
    } else {
      changed.back() = static_cast<char>(changed.back() + 1 + i);
    }
    if (grammar::Matches(g, changed) && !grammar::MatchesPrefix(g, changed)) Die("a match but not a prefix", changed);
  }
  if (match_bytes == 0) return;
  // And the input's own last bytes, as text.
  const std::string_view tail = choices.substr(choices.size() - std::min(choices.size(), match_bytes));
  if (grammar::Matches(g, tail) && !grammar::MatchesPrefix(g, tail)) Die("a match but not a prefix", tail);
}

}  // namespace

int FuzzGrammar(const uint8_t* data, size_t size) {
  if (size == 0 || size > kMaxInput) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  StatusOr<grammar::Grammar> g = InvalidArgumentError("no front end");
  bool json = false;
  switch (data[0] % 3) {
    case 0: {  // JSON Schema, checked and parsed as a request body's schema is
      if (!server::CheckJsonLimits(text).ok()) return 0;
      const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return 0;
      grammar::JsonSchemaOptions options;
      options.max_whitespace = data[0] / 3 % 3;
      g = grammar::JsonSchemaToGrammar(schema, options);
      json = true;
      break;
    }
    case 1: {  // a regex constraint: one rule, as ToGrammar in constraints.cc builds it
      StatusOr<grammar::ExprPtr> e = grammar::RegexToExpr(text, grammar::RawUtf8, {});
      if (!e.ok()) {
        g = e.status();
        break;
      }
      grammar::GrammarBuilder b;
      const int32_t root = b.Add("regex", *e);
      g = b.Finish(root);
      break;
    }
    default:
      g = grammar::ParseGbnf(text);
      break;
  }
  if (!g.ok()) {
    CheckRefusal(g.status());
    return 0;
  }
  StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled = grammar::Compile(*g, kCompile);
  if (!compiled.ok()) {
    CheckRefusal(compiled.status());
    return 0;
  }
  Exercise(**compiled, text, json);
  return 0;
}

}  // namespace fathom::fuzz
