// Grammars over bytes for constrained decoding: an expression tree (regex-like, with references to named rules)
// and its compiled form, one DFA over bytes per rule whose edges may also call other rules (a recursive transition
// network). Everything a constraint accepts — JSON Schema, regexes, choices, EBNF — is lowered to this, then
// `Compile` inlines every rule that is not recursive, so that a schema without recursion is one DFA.
//
// Written by hand: the grammar engines that serve LLMs (xgrammar, llguidance) are not packaged for Debian.
//
//   GrammarBuilder b;
//   int value = b.Declare("value");
//   b.Define(value, Alt({Lit("1"), Seq({Lit("["), Ref(value), Lit("]")})}));
//   FATHOM_ASSIGN_OR_RETURN(auto g, Compile(b.Finish(value), CompileOptions{}));
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace fathom::grammar {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind : uint8_t { kEmpty, kBytes, kSeq, kAlt, kRepeat, kRef, kChar, kCount };

// One node of a grammar expression. Build with the functions below, not by hand.
struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  std::vector<std::pair<uint8_t, uint8_t>> ranges;  // kBytes: inclusive byte ranges, sorted, disjoint
  std::vector<ExprPtr> items;                       // kSeq, kAlt; kRepeat, kChar, kCount: one item
  int32_t min = 0, max = -1;                        // kRepeat, kCount: max -1 is unbounded
  int32_t rule = -1;                                // kRef
};

ExprPtr Empty();
ExprPtr Bytes(std::vector<std::pair<uint8_t, uint8_t>> ranges);  // normalized (sorted, merged)
ExprPtr Lit(std::string_view bytes);
ExprPtr Seq(std::vector<ExprPtr> items);
ExprPtr Alt(std::vector<ExprPtr> items);  // an empty list matches nothing
ExprPtr Repeat(ExprPtr item, int32_t min, int32_t max);
inline ExprPtr Star(ExprPtr item) {
  return Repeat(std::move(item), 0, -1);
}
inline ExprPtr Plus(ExprPtr item) {
  return Repeat(std::move(item), 1, -1);
}
inline ExprPtr Opt(ExprPtr item) {
  return Repeat(std::move(item), 0, 1);
}
ExprPtr Ref(int32_t rule);
// `item` is one character: inside CountChars it counts as one; elsewhere it is `item`.
ExprPtr CharUnit(ExprPtr item);
// The strings of `item` that hold from `min` to `max` (-1: no bound) CharUnits: a length bound intersected with a
// pattern. Built as the product of `item`'s automaton with a counter, so it costs (max + 1) copies of it.
ExprPtr CountChars(ExprPtr item, int32_t min, int32_t max);
ExprPtr Nothing();  // matches no string

// Code points as UTF-8: the set of `ranges` (inclusive code point ranges), or its complement within U+0000..U+10FFFF
// when `negate`. Surrogates (U+D800..U+DFFF) are never produced.
ExprPtr CodePoints(std::vector<std::pair<char32_t, char32_t>> ranges, bool negate = false);
// Any one UTF-8 encoded code point.
ExprPtr AnyCodePoint();

struct Rule {
  std::string name;
  ExprPtr body;
  // Kept as a rule of its own even when it is not recursive: its positions' token masks are then computed once for
  // every caller (a JSON string's body, say).
  bool keep = false;
};

struct Grammar {
  std::vector<Rule> rules;
  int32_t root = 0;
};

class GrammarBuilder {
 public:
  int32_t Declare(std::string name, bool keep = false);
  void Define(int32_t rule, ExprPtr body);
  int32_t Add(std::string name, ExprPtr body, bool keep = false) {
    const int32_t r = Declare(std::move(name), keep);
    Define(r, std::move(body));
    return r;
  }
  size_t size() const { return grammar_.rules.size(); }
  // Copies every rule of `other` into this builder (its references renumbered) and returns the rule of its root:
  // a grammar built elsewhere (a JSON schema's, say) used as one rule of a larger one.
  int32_t Include(const Grammar& other);
  Grammar Finish(int32_t root);

 private:
  Grammar grammar_;
};

struct CompileOptions {
  // Bounds on the automata, so that a grammar that blows up is refused instead of stalling its caller.
  size_t max_nfa_states = 400'000;
  size_t max_dfa_states = 100'000;
  // Set from another thread to stop a compile early (kCancelled): a server that shuts down.
  const std::atomic<bool>* cancel = nullptr;
};

// The compiled grammar: states of all rules' DFAs in one numbering.
class CompiledGrammar {
 public:
  struct ByteEdge {
    uint8_t lo, hi;
    int32_t to;
  };
  struct CallEdge {
    int32_t rule, to;  // call `rule`, then continue at state `to`
  };
  struct State {
    std::vector<ByteEdge> bytes;  // sorted, disjoint
    std::vector<CallEdge> calls;
    bool final = false;  // the rule may end here
    int32_t rule = -1;
  };

  const std::vector<State>& states() const { return states_; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  int32_t root_start() const { return rule_start_[root_]; }
  size_t num_rules() const { return rule_start_.size(); }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  // The first state of `rule` (its states are contiguous), and for a rule that calls no other, a hash of its DFA
  // (0 otherwise): rules with equal fingerprints in any grammars accept the same tokens from the same states.
  int32_t rule_begin(int32_t rule) const { return rule_begin_[rule]; }
  uint64_t fingerprint(int32_t rule) const { return fingerprints_[rule]; }
  // The target of `state`'s byte edge on `b`, or -1.
  int32_t Next(int32_t state, uint8_t b) const {
    for (const ByteEdge& e : states_[state].bytes) {
      if (b < e.lo) return -1;
      if (b <= e.hi) return e.to;
    }
    return -1;
  }

 private:
  friend StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar&, const CompileOptions&);
  std::vector<State> states_;
  std::vector<int32_t> rule_start_, rule_begin_;
  std::vector<uint64_t> fingerprints_;
  std::vector<std::string> rule_names_;
  int32_t root_ = 0;
};

// Inlines non-recursive rules (those not `keep`), builds each remaining rule's DFA, and refuses left recursion and
// grammars over the size bounds (kInvalidArgument, naming the rule).
StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar, const CompileOptions& options);

// Whether the compiled grammar matches `text` exactly, and whether `text` is the start of some string it matches
// (reference matchers for tests, one stack at a time; no token masks).
bool Matches(const CompiledGrammar& grammar, std::string_view text);
bool MatchesPrefix(const CompiledGrammar& grammar, std::string_view text);

}  // namespace fathom::grammar
