// Token masks for a compiled grammar: which tokens of the real vocabulary may come next.
//
// The vocabulary is a trie of the tokens' bytes (`TokenVocab`; special tokens are never allowed, EOS only where the
// grammar may end). A matcher's state is a set of stacks of grammar states (a pushdown automaton over bytes, its
// stacks shared in one arena); sets are interned and their byte transitions cached, a lazily built DFA over the
// automaton's configurations, so that walking the trie costs one table lookup a byte. For each grammar state the
// tokens it accepts without leaving its rule are found once, by one walk of the trie, and kept as a bitmask; only
// the tokens that leave the rule mid-token (a JSON string's closing quote and what follows, say) are walked again
// against the caller's state, once for each distinct shape of what remains. The state that tokens reach is bounded
// by `MatcherOptions::max_depth` (nesting) so that a recursive grammar cannot grow without bound.
//
//   auto vocab = TokenVocab::Build(token_bytes, /*eos_ids=*/{eos});
//   GrammarMatcher m(std::make_shared<GrammarCache>(grammar, vocab));
//   std::vector<uint32_t> mask(vocab->mask_words());
//   m.FillMask(mask);                // bit t of mask[t / 32] set: token t may come next
//   if (!m.AcceptToken(sampled)) ...  // a token outside the mask is refused, the state unchanged
//   if (m.terminated()) ...           // EOS was accepted
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/grammar.h"

namespace fathom::grammar {

class TokenVocab {
 public:
  // `tokens[id]`: the token's bytes, or nullopt for a token no grammar may produce (special tokens, empty ones).
  static std::shared_ptr<const TokenVocab> Build(const std::vector<std::optional<std::string>>& tokens,
                                                 std::vector<int32_t> eos_ids);

  size_t size() const { return size_; }
  size_t mask_words() const { return (size_ + 31) / 32; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const std::string* bytes(int32_t id) const;

  // The trie, nodes in depth-first order (0 is the root, holding no byte; a node's subtree is the nodes from it to
  // `skip`), children sorted by byte, so that a walk is one pass over the array.
  struct Node {
    int32_t skip;                // the first node after this subtree
    int32_t tok_begin, tok_end;  // order() indices of this subtree's tokens; the first tok_own end here
    int32_t shape;               // equal for nodes whose subtrees spell the same suffixes
    uint16_t tok_own;
    uint8_t depth;  // bytes from the root (tokens longer than 255 bytes are left out)
    uint8_t byte;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  // Token ids in depth-first order of the trie.
  const std::vector<int32_t>& order() const { return order_; }
  uint64_t id() const { return id_; }  // unique in the process

 private:
  uint64_t id_ = 0;
  size_t size_ = 0;
  std::vector<int32_t> eos_ids_;
  std::vector<std::optional<std::string>> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> order_;
};

struct MatcherOptions {
  int32_t max_depth = 256;  // nesting of rule calls
  // Interned stack sets, each with a 1 KB transition row: bounded so that a grammar's memory is (100 MB). Past it no
  // new configuration is made, and a token that needs one is not allowed (a request then ends with an error).
  size_t max_configurations = 100'000;
  // Stacks one closure may visit (the calls a configuration makes before its next byte, followed to their ends). A
  // grammar whose rules each call two others first has exponentially many such stacks: 18 rules of 885 bytes took
  // 10 s for a first mask. Past the budget the grammar is over budget (GrammarCache::over_budget): the server refuses
  // it when its start already is, and a configuration met later allows no token (the request ends with an error).
  size_t max_closure_stacks = 50'000;
};

// What one grammar knows about one vocabulary: interned configurations, their transitions, per-state token masks.
// Shared by every matcher of that grammar (a cache by schema keeps it warm); thread-safe, one matcher at a time.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
               MatcherOptions options = {});
  ~GrammarCache();

  const CompiledGrammar& grammar() const { return *grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  // Whether a closure or the configurations outgrew MatcherOptions' budgets (then the tokens they would have
  // allowed are not allowed).
  bool over_budget() {
    std::lock_guard lock(mu_);
    return over_budget_;
  }

 private:
  friend class GrammarMatcher;
  struct Config {
    std::vector<int32_t> stacks;  // arena node ids, sorted
    bool accept = false;          // the grammar may end here
  };
  struct PositionMask {
    std::vector<uint32_t> accept;  // tokens that stay inside the state's rule (or end it at their last byte)
    std::vector<int32_t> pops;     // trie nodes after which the rule ended with bytes of the token left
  };
  using SharedMask = std::shared_ptr<const PositionMask>;

  int32_t NodeId(int32_t pos, int32_t parent);
  // The stacks reachable from `node` before a byte is read, into `out`; `visited` (this closure's stacks) also
  // counts them against max_closure_stacks.
  void Close(int32_t node, std::vector<int32_t>& out, bool& accept, std::unordered_set<int32_t>& visited);
  int32_t Intern(std::vector<int32_t> stacks, bool accept);
  int32_t Step(int32_t config, uint8_t byte) {
    const int32_t cached = steps_[static_cast<size_t>(config) * 256 + byte];
    return cached != -2 ? cached : ComputeStep(config, byte);
  }
  int32_t ComputeStep(int32_t config, uint8_t byte);
  bool HasStacks(int32_t config) const { return flags_[config] & 2; }
  bool Accepts(int32_t config) const { return flags_[config] & 1; }
  int32_t Initial();
  int32_t Continuation(int32_t parent_node);  // configuration of returning to `parent_node`
  const PositionMask& Position(int32_t pos);
  void FillMask(int32_t config, std::span<uint32_t> mask);
  // Tokens below trie node `node` accepted from `config`, as offsets from the node's first token.
  void WalkChildren(int32_t node, int32_t config, int32_t base, std::vector<int32_t>& offsets);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  MatcherOptions options_;
  std::mutex mu_;
  struct ArenaNode {
    int32_t pos, parent, depth;
  };
  std::vector<ArenaNode> arena_;
  std::unordered_map<uint64_t, int32_t> arena_ids_;
  std::vector<Config> configs_;
  std::unordered_map<std::string, int32_t> config_ids_;
  std::vector<int32_t> steps_;  // [configs * 256 + byte]: -2 = not computed yet, 0 = dead
  std::vector<uint8_t> flags_;  // per configuration: 1 accept, 2 has stacks
  std::unordered_map<int32_t, int32_t> continuations_;
  std::vector<SharedMask> positions_;
  int32_t initial_ = -1;
  bool over_budget_ = false;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<GrammarCache> cache);

  // Sets `mask` (vocab().mask_words() words) to the tokens that may come next. When the grammar has ended, only EOS.
  void FillMask(std::span<uint32_t> mask);
  // Advances by one token; false (state unchanged) for a token the grammar does not allow.
  bool AcceptToken(int32_t token);
  // Advances by raw bytes (a forced prefix, say); false if the grammar does not allow them.
  bool AcceptBytes(std::string_view bytes);
  // Undoes the last `n` accepted tokens.
  void Rollback(size_t n);
  // The grammar may end here (EOS is allowed).
  bool CanEnd() const;
  // EOS has been accepted, or no byte may follow.
  bool terminated() const { return terminated_; }
  const TokenVocab& vocab() const { return cache_->vocab(); }

 private:
  std::shared_ptr<GrammarCache> cache_;
  int32_t config_;
  std::vector<int32_t> history_;
  bool terminated_ = false;
};

}  // namespace fathom::grammar
