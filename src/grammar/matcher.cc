#include "grammar/matcher.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

namespace fathom::grammar {

std::shared_ptr<const TokenVocab> TokenVocab::Build(const std::vector<std::optional<std::string>>& tokens,
                                                    std::vector<int32_t> eos_ids) {
  static std::atomic<uint64_t> next_id{1};
  auto v = std::make_shared<TokenVocab>();
  v->id_ = next_id++;
  v->size_ = tokens.size();
  v->bytes_ = tokens;
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  std::erase_if(eos_ids, [&](int32_t id) { return id < 0 || static_cast<size_t>(id) >= tokens.size(); });
  v->eos_ids_ = std::move(eos_ids);
  for (int32_t id : v->eos_ids_) v->bytes_[id].reset();  // EOS is allowed by CanEnd, never as bytes

  // Tokens sorted by bytes give the trie's depth-first order directly.
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (v->bytes_[i] && !v->bytes_[i]->empty()) ids.push_back(static_cast<int32_t>(i));
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const int c = v->bytes_[a]->compare(*v->bytes_[b]);
    return c != 0 ? c < 0 : a < b;
  });

  // Nodes in preorder, from the sorted tokens: a path of open nodes.
  std::erase_if(ids, [&](int32_t id) { return v->bytes_[id]->size() > 255; });
  v->order_ = ids;
  v->nodes_.push_back(Node{0, 0, 0, -1, 0, 0, 0});
  std::vector<int32_t> path = {0};
  std::string prefix;
  auto close_top = [&](int32_t order_end) {
    Node& n = v->nodes_[path.back()];
    n.tok_end = order_end;
    n.skip = static_cast<int32_t>(v->nodes_.size());
    path.pop_back();
  };
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& s = *v->bytes_[ids[k]];
    size_t common = 0;
    while (common < prefix.size() && common < s.size() && prefix[common] == s[common]) ++common;
    while (path.size() > common + 1) close_top(static_cast<int32_t>(k));
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(v->nodes_.size()));
      v->nodes_.push_back(
          Node{0, static_cast<int32_t>(k), 0, -1, 0, static_cast<uint8_t>(d + 1), static_cast<uint8_t>(s[d])});
    }
    v->nodes_[path.back()].tok_own++;
    prefix = s;
  }
  while (!path.empty()) close_top(static_cast<int32_t>(ids.size()));
  // Shapes, bottom-up (a node's children follow it in preorder): the node's own token count and its children's
  // bytes and shapes.
  std::map<std::vector<int32_t>, int32_t> shapes;
  std::vector<int32_t> key;
  for (size_t i = v->nodes_.size(); i-- > 0;) {
    Node& n = v->nodes_[i];
    key.assign(1, n.tok_own);
    for (int32_t c = static_cast<int32_t>(i) + 1; c < n.skip; c = v->nodes_[c].skip) {
      key.push_back(v->nodes_[c].byte);
      key.push_back(v->nodes_[c].shape);
    }
    n.shape = shapes.emplace(key, static_cast<int32_t>(shapes.size())).first->second;
  }
  return v;
}

const std::string* TokenVocab::bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= size_ || !bytes_[id]) return nullptr;
  return &*bytes_[id];
}

GrammarCache::GrammarCache(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocab> vocab,
                           MatcherOptions options)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), options_(options) {
  positions_.resize(grammar_->states().size());
  Intern({}, false);  // 0: dead
}

GrammarCache::~GrammarCache() = default;

int32_t GrammarCache::NodeId(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = arena_ids_.emplace(key, static_cast<int32_t>(arena_.size()));
  if (inserted) arena_.push_back({pos, parent, parent < 0 ? 1 : arena_[parent].depth + 1});
  return it->second;
}

void GrammarCache::Close(int32_t node, std::vector<int32_t>& out, bool& accept, std::unordered_set<int32_t>& visited) {
  if (over_budget_ || !visited.insert(node).second) return;
  if (visited.size() > options_.max_closure_stacks) {
    over_budget_ = true;
    return;
  }
  const ArenaNode an = arena_[node];
  const CompiledGrammar::State& st = grammar_->states()[an.pos];
  if (!st.bytes.empty()) out.push_back(node);
  if (!st.calls.empty() && an.depth < options_.max_depth) {
    for (const auto& c : st.calls) {
      const int32_t cont = NodeId(c.to, an.parent);
      Close(NodeId(grammar_->rule_start(c.rule), cont), out, accept, visited);
    }
  }
  if (st.final) {
    if (an.parent < 0) {
      accept = true;
    } else {
      Close(an.parent, out, accept, visited);
    }
  }
}

int32_t GrammarCache::Intern(std::vector<int32_t> stacks, bool accept) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.empty() && !accept && !configs_.empty()) return 0;
  std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
  key.push_back(accept ? 1 : 0);
  auto [it, inserted] = config_ids_.emplace(std::move(key), static_cast<int32_t>(configs_.size()));
  if (inserted) {
    if (configs_.size() >= options_.max_configurations) over_budget_ = true;
    flags_.push_back(static_cast<uint8_t>((accept ? 1 : 0) | (stacks.empty() ? 0 : 2)));
    configs_.push_back(Config{std::move(stacks), accept});
    steps_.resize(steps_.size() + 256, -2);
  }
  return it->second;
}

int32_t GrammarCache::ComputeStep(int32_t config, uint8_t byte) {
  if (over_budget_) return 0;
  std::vector<int32_t> out;
  std::unordered_set<int32_t> visited;
  bool accept = false;
  // configs_ may grow below: copy the stacks first.
  const std::vector<int32_t> stacks = configs_[config].stacks;
  for (int32_t node : stacks) {
    const ArenaNode an = arena_[node];
    const int32_t to = grammar_->Next(an.pos, byte);
    if (to < 0) continue;
    Close(NodeId(to, an.parent), out, accept, visited);
  }
  // A closure cut short is not the configuration: nothing is allowed from here (the dead one).
  const int32_t next = over_budget_ ? 0 : Intern(std::move(out), accept);
  steps_[static_cast<size_t>(config) * 256 + byte] = next;  // steps_ may have grown: index again
  return next;
}

int32_t GrammarCache::Initial() {
  if (initial_ < 0) {
    std::vector<int32_t> out;
    std::unordered_set<int32_t> visited;
    bool accept = false;
    Close(NodeId(grammar_->root_start(), -1), out, accept, visited);
    initial_ = over_budget_ ? 0 : Intern(std::move(out), accept);
  }
  return initial_;
}

int32_t GrammarCache::Continuation(int32_t parent_node) {
  auto it = continuations_.find(parent_node);
  if (it != continuations_.end()) return it->second;
  std::vector<int32_t> out;
  std::unordered_set<int32_t> visited;
  bool accept = false;
  Close(parent_node, out, accept, visited);
  const int32_t c = over_budget_ ? 0 : Intern(std::move(out), accept);
  continuations_.emplace(parent_node, c);
  return c;
}

namespace {

// Masks of states of rules that call no other (a JSON string's body, a bounded string, a format), shared by every
// grammar of the process at one vocabulary: found by (vocabulary, rule fingerprint, state in the rule). Bounded at
// kMaxSharedMasks masks a vocabulary (16 KB each at a 128k vocabulary: 64 MB); past that, grammars keep their own.
constexpr size_t kMaxSharedMasks = 4096;

struct SharedMasks {
  std::mutex mu;
  std::map<std::tuple<uint64_t, uint64_t, int32_t>, std::shared_ptr<const void>> masks;
  std::map<uint64_t, size_t> count;  // by vocabulary
};

SharedMasks& Shared() {
  static SharedMasks* s = new SharedMasks();  // never destroyed: matchers may outlive static destruction order
  return *s;
}

}  // namespace

const GrammarCache::PositionMask& GrammarCache::Position(int32_t pos) {
  if (positions_[pos]) return *positions_[pos];
  const int32_t rule = grammar_->states()[pos].rule;
  const uint64_t fp = grammar_->fingerprint(rule);
  const auto key = std::make_tuple(vocab_->id(), fp, pos - grammar_->rule_begin(rule));
  if (fp != 0) {
    SharedMasks& shared = Shared();
    std::lock_guard lock(shared.mu);
    if (auto it = shared.masks.find(key); it != shared.masks.end()) {
      positions_[pos] = std::static_pointer_cast<const PositionMask>(it->second);
      return *positions_[pos];
    }
  }
  auto pm = std::make_shared<PositionMask>();
  pm->accept.assign(vocab_->mask_words(), 0);
  const auto& nodes = vocab_->nodes();
  const auto& order = vocab_->order();
  // The state alone, below it nothing: a pop shows as `accept` of the configuration reached. One pass over the
  // trie in preorder; config_at[d] is the configuration after the first d bytes of the current path.
  int32_t config_at[257];
  config_at[0] = Intern({NodeId(pos, -1)}, false);
  uint32_t* accept = pm->accept.data();
  const auto n_nodes = static_cast<int32_t>(nodes.size());
  for (int32_t i = 1; i < n_nodes;) {
    const TokenVocab::Node& n = nodes[i];
    const int32_t next = Step(config_at[n.depth - 1], n.byte);
    if (next == 0) {
      i = n.skip;
      continue;
    }
    for (int32_t k = n.tok_begin; k < n.tok_begin + n.tok_own; ++k) {
      const int32_t t = order[k];
      accept[t >> 5] |= 1u << (t & 31);
    }
    const bool kids = n.skip != i + 1;
    if (kids && Accepts(next)) pm->pops.push_back(i);
    if (kids && HasStacks(next)) {
      config_at[n.depth] = next;
      ++i;
    } else {
      i = n.skip;
    }
  }
  if (fp != 0) {
    SharedMasks& shared = Shared();
    std::lock_guard lock(shared.mu);
    if (size_t& n = shared.count[vocab_->id()]; n < kMaxSharedMasks && shared.masks.emplace(key, pm).second) ++n;
  }
  positions_[pos] = std::move(pm);
  return *positions_[pos];
}

void GrammarCache::WalkChildren(int32_t node, int32_t config, int32_t base, std::vector<int32_t>& offsets) {
  const auto& nodes = vocab_->nodes();
  const int32_t depth0 = nodes[node].depth;
  int32_t config_at[257];
  config_at[depth0] = config;
  for (int32_t i = node + 1; i < nodes[node].skip;) {
    const TokenVocab::Node& n = nodes[i];
    const int32_t next = Step(config_at[n.depth - 1], n.byte);
    if (next == 0) {
      i = n.skip;
      continue;
    }
    for (int32_t k = n.tok_begin; k < n.tok_begin + n.tok_own; ++k) offsets.push_back(k - base);
    if (n.skip != i + 1 && HasStacks(next)) {
      config_at[n.depth] = next;
      ++i;
    } else {
      i = n.skip;
    }
  }
}

void GrammarCache::FillMask(int32_t config, std::span<uint32_t> mask) {
  FATHOM_CHECK(mask.size() >= vocab_->mask_words());
  std::fill(mask.begin(), mask.end(), 0u);
  const auto& nodes = vocab_->nodes();
  const auto& order = vocab_->order();
  const std::vector<int32_t> stacks = configs_[config].stacks;
  std::unordered_map<int32_t, std::vector<int32_t>> by_shape;
  std::vector<int32_t> offsets;
  for (int32_t s : stacks) {
    const ArenaNode an = arena_[s];
    const PositionMask& pm = Position(an.pos);
    const uint32_t* a = pm.accept.data();
    for (size_t w = 0; w < pm.accept.size(); ++w) mask[w] |= a[w];
    if (an.parent < 0 || pm.pops.empty()) continue;
    const int32_t cont = Continuation(an.parent);
    if (cont == 0) continue;
    by_shape.clear();
    for (int32_t n : pm.pops) {
      const TokenVocab::Node& tn = nodes[n];
      auto [it, inserted] = by_shape.try_emplace(tn.shape);
      if (inserted) WalkChildren(n, cont, tn.tok_begin, it->second);
      for (int32_t off : it->second) {
        const int32_t t = order[tn.tok_begin + off];
        mask[t >> 5] |= 1u << (t & 31);
      }
    }
  }
  if (Accepts(config)) {
    for (int32_t eos : vocab_->eos_ids()) mask[eos >> 5] |= 1u << (eos & 31);
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarCache> cache) : cache_(std::move(cache)) {
  std::lock_guard lock(cache_->mu_);
  config_ = cache_->Initial();
}

void GrammarMatcher::FillMask(std::span<uint32_t> mask) {
  if (terminated_) {
    std::fill(mask.begin(), mask.end(), 0u);
    for (int32_t eos : vocab().eos_ids()) mask[eos >> 5] |= 1u << (eos & 31);
    return;
  }
  std::lock_guard lock(cache_->mu_);
  cache_->FillMask(config_, mask);
}

bool GrammarMatcher::AcceptToken(int32_t token) {
  if (terminated_) return false;
  const auto& eos = vocab().eos_ids();
  if (std::binary_search(eos.begin(), eos.end(), token)) {
    if (!CanEnd()) return false;
    history_.push_back(config_);
    terminated_ = true;
    return true;
  }
  const std::string* bytes = vocab().bytes(token);
  if (bytes == nullptr) return false;
  std::lock_guard lock(cache_->mu_);
  int32_t c = config_;
  for (char b : *bytes) {
    c = cache_->Step(c, static_cast<uint8_t>(b));
    if (c == 0) return false;
  }
  history_.push_back(config_);
  config_ = c;
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (terminated_) return bytes.empty();
  std::lock_guard lock(cache_->mu_);
  int32_t c = config_;
  for (char b : bytes) {
    c = cache_->Step(c, static_cast<uint8_t>(b));
    if (c == 0) return false;
  }
  config_ = c;
  return true;
}

void GrammarMatcher::Rollback(size_t n) {
  FATHOM_CHECK(n <= history_.size());
  if (n == 0) return;
  terminated_ = false;  // EOS, when accepted, was the last token
  config_ = history_[history_.size() - n];
  history_.resize(history_.size() - n);
}

bool GrammarMatcher::CanEnd() const {
  std::lock_guard lock(cache_->mu_);
  return cache_->Accepts(config_);
}

}  // namespace fathom::grammar
