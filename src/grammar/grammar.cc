#include "grammar/grammar.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <set>

namespace fathom::grammar {

ExprPtr Empty() {
  return std::make_shared<Expr>();
}

ExprPtr Nothing() {
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kAlt;
  return e;
}

ExprPtr Bytes(std::vector<std::pair<uint8_t, uint8_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint8_t, uint8_t>> merged;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!merged.empty() && static_cast<int>(lo) <= static_cast<int>(merged.back().second) + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (merged.empty()) return Nothing();
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kBytes;
  e->ranges = std::move(merged);
  return e;
}

ExprPtr Lit(std::string_view bytes) {
  if (bytes.empty()) return Empty();
  std::vector<ExprPtr> items;
  items.reserve(bytes.size());
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    items.push_back(Bytes({{b, b}}));
  }
  return items.size() == 1 ? items[0] : Seq(std::move(items));
}

ExprPtr Seq(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& item : items) {
    if (item->kind == ExprKind::kEmpty) continue;
    if (item->kind == ExprKind::kSeq) {
      flat.insert(flat.end(), item->items.begin(), item->items.end());
    } else {
      flat.push_back(std::move(item));
    }
  }
  if (flat.empty()) return Empty();
  if (flat.size() == 1) return flat[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kSeq;
  e->items = std::move(flat);
  return e;
}

ExprPtr Alt(std::vector<ExprPtr> items) {
  std::vector<ExprPtr> flat;
  for (auto& item : items) {
    if (item->kind == ExprKind::kAlt) {
      flat.insert(flat.end(), item->items.begin(), item->items.end());
    } else {
      flat.push_back(std::move(item));
    }
  }
  if (flat.size() == 1) return flat[0];
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kAlt;
  e->items = std::move(flat);
  return e;
}

ExprPtr Repeat(ExprPtr item, int32_t min, int32_t max) {
  FATHOM_CHECK(min >= 0 && (max == -1 || max >= min));
  if (max == 0) return Empty();
  if (min == 1 && max == 1) return item;
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kRepeat;
  e->items = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}

ExprPtr Ref(int32_t rule) {
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kRef;
  e->rule = rule;
  return e;
}

ExprPtr CharUnit(ExprPtr item) {
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kChar;
  e->items = {std::move(item)};
  return e;
}

ExprPtr CountChars(ExprPtr item, int32_t min, int32_t max) {
  FATHOM_CHECK(min >= 0 && (max == -1 || max >= min));
  auto e = std::make_shared<Expr>();
  e->kind = ExprKind::kCount;
  e->items = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// UTF-8 byte sequences for the code points [lo, hi] that all have the same encoded length: split until each piece
// is a product of byte ranges (the classic construction of regex engines' UTF-8 automata).
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

void Utf8Sequences(char32_t lo, char32_t hi, std::vector<ByteSeq>& out) {
  static constexpr char32_t kLimits[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (int n = 0; n < 3; ++n) {
    if (lo <= kLimits[n] && hi > kLimits[n]) {
      Utf8Sequences(lo, kLimits[n], out);
      Utf8Sequences(kLimits[n] + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  const int len = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  // Split so that every continuation byte below the first differing one spans its full range 0x80..0xBF.
  for (int i = 1; i < len; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  auto encode = [len](char32_t cp, uint8_t* b) {
    if (len == 2) {
      b[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    } else if (len == 3) {
      b[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    } else {
      b[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    }
  };
  uint8_t a[4], z[4];
  encode(lo, a);
  encode(hi, z);
  ByteSeq seq;
  for (int i = 0; i < len; ++i) seq.emplace_back(a[i], z[i]);
  out.push_back(std::move(seq));
}

// Byte-range sequences as an expression with shared suffixes: sequences that end in the same range share it, so a
// large class (all but a few code points, say) is a handful of automaton states rather than one chain a sequence.
ExprPtr FactorSuffixes(std::vector<ByteSeq> seqs) {
  std::map<std::pair<uint8_t, uint8_t>, std::vector<ByteSeq>> by_last;
  std::vector<std::pair<uint8_t, uint8_t>> singles;
  bool empty = false;
  for (ByteSeq& q : seqs) {
    if (q.empty()) {
      empty = true;
    } else if (q.size() == 1) {
      singles.push_back(q[0]);
    } else {
      const auto last = q.back();
      q.pop_back();
      by_last[last].push_back(std::move(q));
    }
  }
  std::vector<ExprPtr> alts;
  if (empty) alts.push_back(Empty());
  if (!singles.empty()) alts.push_back(Bytes(singles));
  for (auto& [last, prefixes] : by_last) alts.push_back(Seq({FactorSuffixes(std::move(prefixes)), Bytes({last})}));
  return Alt(std::move(alts));
}

}  // namespace

ExprPtr CodePoints(std::vector<std::pair<char32_t, char32_t>> ranges, bool negate) {
  std::vector<std::pair<char32_t, char32_t>> clean;
  for (auto [lo, hi] : ranges) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo <= hi) clean.emplace_back(lo, hi);
  }
  std::sort(clean.begin(), clean.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (auto [lo, hi] : clean) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negate) {
    std::vector<std::pair<char32_t, char32_t>> inverse;
    char32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) inverse.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodePoint) inverse.emplace_back(next, kMaxCodePoint);
    merged = std::move(inverse);
  }
  // Never surrogates: they are not valid in UTF-8.
  std::vector<std::pair<char32_t, char32_t>> valid;
  for (auto [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      valid.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) valid.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) valid.emplace_back(0xE000, hi);
  }
  std::vector<ByteSeq> seqs;
  for (auto [lo, hi] : valid) Utf8Sequences(lo, hi, seqs);
  if (seqs.empty()) return Nothing();
  return FactorSuffixes(std::move(seqs));
}

ExprPtr AnyCodePoint() {
  static const ExprPtr any = CodePoints({}, /*negate=*/true);
  return any;
}

int32_t GrammarBuilder::Declare(std::string name, bool keep) {
  grammar_.rules.push_back(Rule{std::move(name), nullptr, keep});
  return static_cast<int32_t>(grammar_.rules.size() - 1);
}

void GrammarBuilder::Define(int32_t rule, ExprPtr body) {
  FATHOM_CHECK(rule >= 0 && static_cast<size_t>(rule) < grammar_.rules.size());
  grammar_.rules[rule].body = std::move(body);
}

namespace {

ExprPtr Renumbered(const ExprPtr& e, int32_t offset) {
  if (e->kind == ExprKind::kRef) return Ref(e->rule + offset);
  if (e->items.empty()) return e;
  auto copy = std::make_shared<Expr>(*e);
  for (ExprPtr& item : copy->items) item = Renumbered(item, offset);
  return copy;
}

}  // namespace

int32_t GrammarBuilder::Include(const Grammar& other) {
  const auto offset = static_cast<int32_t>(grammar_.rules.size());
  for (const Rule& r : other.rules) {
    grammar_.rules.push_back(Rule{r.name, r.body ? Renumbered(r.body, offset) : nullptr, r.keep});
  }
  return other.root + offset;
}

Grammar GrammarBuilder::Finish(int32_t root) {
  grammar_.root = root;
  for (Rule& r : grammar_.rules) {
    if (!r.body) r.body = Nothing();
  }
  return std::move(grammar_);
}

namespace {

void CollectRefs(const Expr& e, std::set<int32_t>& out) {
  if (e.kind == ExprKind::kRef) out.insert(e.rule);
  for (const auto& item : e.items) CollectRefs(*item, out);
}

struct Nfa {
  struct State {
    std::vector<int32_t> eps;
    std::vector<CompiledGrammar::ByteEdge> bytes;
    std::vector<CompiledGrammar::CallEdge> calls;
    std::vector<std::pair<const Expr*, int32_t>> chars;  // inside CountChars: one character, then the state
  };
  std::vector<State> states;
  size_t limit = 0;
  bool over = false;
  bool too_deep = false;  // over because rules and groups nest deeper than NfaBuilder::kMaxBuildDepth

  int32_t Add() {
    if (states.size() >= limit) {
      over = true;
      return 0;
    }
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
};

class NfaBuilder {
 public:
  NfaBuilder(const Grammar& g, const std::vector<bool>& kept, Nfa& nfa) : g_(g), kept_(kept), nfa_(nfa) {}

  // Thompson fragment of `e`: (start, end).
  std::pair<int32_t, int32_t> Build(const Expr& e) {
    if (nfa_.over) return {0, 0};
    // Inlined rules and nested groups recurse here: a client's grammar may chain 150,000 rules (r_i ::= r_i+1), so
    // the depth is bounded and the grammar refused past it, rather than the stack.
    if (depth_ >= kMaxBuildDepth || (stack_floor_ != 0 && FrameAddress() < stack_floor_)) {
      nfa_.over = true;
      nfa_.too_deep = true;
      return {0, 0};
    }
    ++depth_;
    const std::pair<int32_t, int32_t> fragment = BuildAt(e);
    --depth_;
    return fragment;
  }

  static constexpr int kMaxBuildDepth = 2000;
  // Build also stops this close to the end of the thread's stack: a level costs a few KB (2.5 KB under ASan), and
  // the compiling thread's stack may be smaller than the main thread's.
  static constexpr uintptr_t kStackMarginBytes = 512 << 10;
  void set_stack_floor(uintptr_t floor) { stack_floor_ = floor; }

 private:
  std::pair<int32_t, int32_t> BuildAt(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kEmpty: {
        const int32_t s = nfa_.Add();
        return {s, s};
      }
      case ExprKind::kBytes: {
        const int32_t s = nfa_.Add(), t = nfa_.Add();
        if (nfa_.over) return {0, 0};
        for (auto [lo, hi] : e.ranges) nfa_.states[s].bytes.push_back({lo, hi, t});
        return {s, t};
      }
      case ExprKind::kSeq: {
        auto [s, t] = Build(*e.items[0]);
        for (size_t i = 1; i < e.items.size() && !nfa_.over; ++i) {
          auto [s2, t2] = Build(*e.items[i]);
          if (nfa_.over) break;
          nfa_.states[t].eps.push_back(s2);
          t = t2;
        }
        return {s, t};
      }
      case ExprKind::kAlt: {
        const int32_t s = nfa_.Add(), t = nfa_.Add();
        for (const auto& item : e.items) {
          auto [s2, t2] = Build(*item);
          if (nfa_.over) return {0, 0};
          nfa_.states[s].eps.push_back(s2);
          nfa_.states[t2].eps.push_back(t);
        }
        return {s, t};
      }
      case ExprKind::kRepeat: {
        const Expr& item = *e.items[0];
        int32_t s = nfa_.Add();
        int32_t t = s;
        for (int32_t i = 0; i < e.min && !nfa_.over; ++i) {
          auto [s2, t2] = Build(item);
          if (nfa_.over) break;
          nfa_.states[t].eps.push_back(s2);
          t = t2;
        }
        if (nfa_.over) return {0, 0};
        if (e.max == -1) {
          auto [s2, t2] = Build(item);
          if (nfa_.over) return {0, 0};
          nfa_.states[t].eps.push_back(s2);
          nfa_.states[t2].eps.push_back(t);
          return {s, t};
        }
        const int32_t end = nfa_.Add();
        for (int32_t i = e.min; i < e.max && !nfa_.over; ++i) {
          auto [s2, t2] = Build(item);
          if (nfa_.over) break;
          nfa_.states[t].eps.push_back(s2);
          nfa_.states[t].eps.push_back(end);
          t = t2;
        }
        if (nfa_.over) return {0, 0};
        nfa_.states[t].eps.push_back(end);
        return {s, end};
      }
      case ExprKind::kChar: {
        if (!count_chars_) return Build(*e.items[0]);
        const int32_t s = nfa_.Add(), t = nfa_.Add();
        if (nfa_.over) return {0, 0};
        nfa_.states[s].chars.emplace_back(e.items[0].get(), t);
        return {s, t};
      }
      case ExprKind::kCount:
        return BuildCount(e);
      case ExprKind::kRef: {
        if (kept_[e.rule]) {
          const int32_t s = nfa_.Add(), t = nfa_.Add();
          if (nfa_.over) return {0, 0};
          nfa_.states[s].calls.push_back({e.rule, t});
          return {s, t};
        }
        return Build(*g_.rules[e.rule].body);  // not recursive, so this terminates
      }
    }
    return {0, 0};
  }

  // The product of the item's automaton (characters as single edges) with a counter of characters 0..K, where K is
  // max, or min when unbounded (the counter then stays at K).
  std::pair<int32_t, int32_t> BuildCount(const Expr& e) {
    FATHOM_CHECK(!count_chars_, "CountChars inside CountChars");
    Nfa inner;
    inner.limit = nfa_.limit;
    NfaBuilder ib(g_, kept_, inner);
    ib.count_chars_ = true;
    ib.depth_ = depth_;
    ib.stack_floor_ = stack_floor_;
    auto [is, ie] = ib.Build(*e.items[0]);
    if (inner.over) {
      nfa_.over = true;
      nfa_.too_deep = nfa_.too_deep || inner.too_deep;
      return {0, 0};
    }
    const int32_t levels = (e.max < 0 ? e.min : e.max) + 1;
    const auto n = static_cast<int32_t>(inner.states.size());
    if (static_cast<size_t>(levels) * n + nfa_.states.size() >= nfa_.limit) {
      nfa_.over = true;
      return {0, 0};
    }
    const auto base = static_cast<int32_t>(nfa_.states.size());
    for (int32_t i = 0; i < levels * n; ++i) nfa_.Add();
    const int32_t end = nfa_.Add();
    if (nfa_.over) return {0, 0};
    for (int32_t c = 0; c < levels; ++c) {
      const int32_t off = base + c * n;
      for (int32_t i = 0; i < n; ++i) {
        const Nfa::State& st = inner.states[i];
        for (int32_t t : st.eps) nfa_.states[off + i].eps.push_back(off + t);
        for (const auto& b : st.bytes) nfa_.states[off + i].bytes.push_back({b.lo, b.hi, off + b.to});
        for (const auto& call : st.calls) nfa_.states[off + i].calls.push_back({call.rule, off + call.to});
        const int32_t next = c + 1 < levels ? c + 1 : (e.max < 0 ? c : -1);
        if (next < 0) continue;
        for (const auto& [item, to] : st.chars) {
          auto [fs, fe] = Build(*item);
          if (nfa_.over) return {0, 0};
          nfa_.states[off + i].eps.push_back(fs);
          nfa_.states[fe].eps.push_back(base + next * n + to);
        }
      }
      if (c >= e.min) nfa_.states[off + ie].eps.push_back(end);
    }
    return {base + is, end};
  }

  static uintptr_t FrameAddress() { return reinterpret_cast<uintptr_t>(__builtin_frame_address(0)); }

  bool count_chars_ = false;
  int depth_ = 0;
  uintptr_t stack_floor_ = 0;  // 0: no check
  const Grammar& g_;
  const std::vector<bool>& kept_;
  Nfa& nfa_;
};

void EpsClosure(const Nfa& nfa, std::vector<int32_t>& set) {
  std::vector<int32_t> work = set;
  std::vector<char> seen(nfa.states.size(), 0);
  for (int32_t s : set) seen[s] = 1;
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    for (int32_t t : nfa.states[s].eps) {
      if (!seen[t]) {
        seen[t] = 1;
        set.push_back(t);
        work.push_back(t);
      }
    }
  }
  std::sort(set.begin(), set.end());
}

// The lowest address this thread's stack may grow to before NfaBuilder stops (its margin above the real end), or 0
// when the stack's extent cannot be read.
uintptr_t StackFloor() {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
  void* addr = nullptr;
  size_t size = 0;
  const bool ok = pthread_attr_getstack(&attr, &addr, &size) == 0;
  pthread_attr_destroy(&attr);
  if (!ok || size <= 2 * NfaBuilder::kStackMarginBytes) return 0;
  return reinterpret_cast<uintptr_t>(addr) + NfaBuilder::kStackMarginBytes;
}

// Tarjan's strongly connected components over the rule reference graph: which rules are recursive. Iterative (an
// explicit stack of (rule, next reference) frames), since a grammar may chain 100k+ rules and a client writes it.
std::vector<bool> RecursiveRules(const std::vector<std::set<int32_t>>& refs) {
  const size_t n = refs.size();
  std::vector<int32_t> index(n, -1), low(n, 0);
  std::vector<bool> on_stack(n, false), recursive(n, false);
  std::vector<int32_t> stack;
  int32_t counter = 0;
  struct Frame {
    int32_t v;
    std::set<int32_t>::const_iterator next;
  };
  std::vector<Frame> frames;
  auto open = [&](int32_t v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack[v] = true;
    frames.push_back({v, refs[v].begin()});
  };
  for (size_t root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    open(static_cast<int32_t>(root));
    while (!frames.empty()) {
      Frame& f = frames.back();
      const int32_t v = f.v;
      if (f.next != refs[v].end()) {
        const int32_t w = *f.next++;
        if (index[w] < 0) {
          open(w);  // invalidates `f`
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        std::vector<int32_t> scc;
        int32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          scc.push_back(w);
        } while (w != v);
        const bool cyclic = scc.size() > 1 || refs[v].count(v) > 0;
        for (int32_t x : scc) recursive[x] = cyclic;
      }
      frames.pop_back();
      if (!frames.empty()) low[frames.back().v] = std::min(low[frames.back().v], low[v]);
    }
  }
  return recursive;
}

// Rules with more transitions than this are left unminimized (the index takes about 12 bytes a transition).
constexpr size_t kMaxMinimizeTransitions = size_t{1} << 20;

// The byte classes of states[begin, end): the maximal byte ranges that no edge's boundary cuts, numbered from 0 in
// byte order. Returns each byte's class; `count` gets their number.
std::array<int32_t, 256> ByteClasses(const std::vector<CompiledGrammar::State>& states, size_t begin, int32_t& count) {
  std::array<bool, 257> cut{};
  cut[0] = true;
  for (size_t k = begin; k < states.size(); ++k) {
    for (const auto& e : states[k].bytes) cut[e.lo] = cut[e.hi + 1] = true;
  }
  std::array<int32_t, 256> byte_class{};
  count = 0;
  for (int b = 0; b < 256; ++b) byte_class[b] = (count += cut[b] ? 1 : 0) - 1;
  return byte_class;
}

// The number of (state, symbol) transitions Minimize indexes for states[begin, end): a byte edge counts once per
// byte class it spans, a call edge once.
size_t MinimizeTransitions(const std::vector<CompiledGrammar::State>& states, size_t begin) {
  int32_t num_classes = 0;
  const auto byte_class = ByteClasses(states, begin, num_classes);
  size_t total = 0;
  for (size_t k = begin; k < states.size(); ++k) {
    for (const auto& e : states[k].bytes) total += byte_class[e.hi] - byte_class[e.lo] + 1;
    total += states[k].calls.size();
  }
  return total;
}

// Minimizes the DFA of one rule (states[begin, end), its start `start`) by Hopcroft's partition refinement, then
// numbers its states breadth-first from the start, so that equal rules have equal states in equal order. Returns
// the new start (always `begin`).
//
// The alphabet is the rule's byte classes (the maximal byte ranges no edge boundary cuts) and its callees. A
// missing edge goes to an implicit dead state that is equivalent to no real state (so the result is the same as
// comparing edges, present or absent, round by round). That state is never a splitter: for a complete DFA,
// splitting by every initial block but one suffices. Time O(T log n) for T transitions, where round-by-round
// refinement takes as many rounds as the DFA is deep.
int32_t Minimize(std::vector<CompiledGrammar::State>& states, int32_t begin, int32_t start) {
  const auto end = static_cast<int32_t>(states.size());
  const int32_t n = end - begin;
  int32_t num_classes = 0;
  const auto byte_class = ByteClasses(states, begin, num_classes);
  std::vector<int32_t> callees;
  for (int32_t k = begin; k < end; ++k) {
    for (const auto& c : states[k].calls) callees.push_back(c.rule);
  }
  std::sort(callees.begin(), callees.end());
  callees.erase(std::unique(callees.begin(), callees.end()), callees.end());

  // Inverse transitions, grouped by target: (symbol, source) pairs, targets and sources relative to `begin`.
  struct Inverse {
    int32_t to, symbol, from;
  };
  std::vector<Inverse> inverse;
  for (int32_t s = 0; s < n; ++s) {
    const auto& st = states[begin + s];
    for (const auto& e : st.bytes) {
      for (int32_t c = byte_class[e.lo]; c <= byte_class[e.hi]; ++c) inverse.push_back({e.to - begin, c, s});
    }
    for (const auto& c : st.calls) {
      const auto callee = std::lower_bound(callees.begin(), callees.end(), c.rule) - callees.begin();
      inverse.push_back({c.to - begin, num_classes + static_cast<int32_t>(callee), s});
    }
  }
  std::sort(inverse.begin(), inverse.end(), [](const Inverse& x, const Inverse& y) { return x.to < y.to; });
  std::vector<size_t> inverse_begin(n + 1, 0);
  for (const auto& t : inverse) ++inverse_begin[t.to + 1];
  for (int32_t s = 0; s < n; ++s) inverse_begin[s + 1] += inverse_begin[s];

  // A refinable partition: block b holds elems[first[b], last[b]); during a split, its marked states are
  // elems[first[b], mid[b]).
  std::vector<int32_t> elems(n), loc(n), block(n);
  std::vector<int32_t> first, last, mid;
  std::vector<bool> in_work;
  std::vector<int32_t> work;
  {
    int32_t pos = 0;
    for (const bool final : {true, false}) {
      const int32_t from = pos;
      for (int32_t s = 0; s < n; ++s) {
        if (states[begin + s].final != final) continue;
        elems[pos] = s;
        loc[s] = pos++;
        block[s] = static_cast<int32_t>(first.size());
      }
      if (pos == from) continue;
      work.push_back(static_cast<int32_t>(first.size()));
      first.push_back(from);
      last.push_back(pos);
      mid.push_back(from);
      in_work.push_back(true);
    }
  }
  std::vector<int32_t> splitter;
  std::vector<std::pair<int32_t, int32_t>> preimage;  // (symbol, source)
  std::vector<int32_t> touched;
  while (!work.empty()) {
    const int32_t a = work.back();
    work.pop_back();
    in_work[a] = false;
    splitter.assign(elems.begin() + first[a], elems.begin() + last[a]);
    preimage.clear();
    for (const int32_t t : splitter) {
      for (size_t k = inverse_begin[t]; k < inverse_begin[t + 1]; ++k) {
        preimage.emplace_back(inverse[k].symbol, inverse[k].from);
      }
    }
    std::sort(preimage.begin(), preimage.end());
    for (size_t g = 0; g < preimage.size();) {
      // One symbol's preimage of the splitter: mark its states, then split every block it cuts.
      const int32_t symbol = preimage[g].first;
      for (; g < preimage.size() && preimage[g].first == symbol; ++g) {
        const int32_t s = preimage[g].second;
        const int32_t b = block[s];
        if (loc[s] < mid[b]) continue;
        if (mid[b] == first[b]) touched.push_back(b);
        const int32_t other = elems[mid[b]];
        std::swap(elems[loc[s]], elems[mid[b]]);
        loc[other] = loc[s];
        loc[s] = mid[b]++;
      }
      for (const int32_t b : touched) {
        if (mid[b] == last[b]) {
          mid[b] = first[b];
          continue;
        }
        const auto nb = static_cast<int32_t>(first.size());
        first.push_back(first[b]);
        last.push_back(mid[b]);
        mid.push_back(first[b]);
        first[b] = mid[b];
        for (int32_t i = first[nb]; i < last[nb]; ++i) block[elems[i]] = nb;
        const bool add_new = in_work[b] || last[nb] - first[nb] <= last[b] - first[b];
        in_work.push_back(add_new);
        if (add_new) {
          work.push_back(nb);
        } else {
          in_work[b] = true;
          work.push_back(b);
        }
      }
      touched.clear();
    }
  }
  const auto blocks = static_cast<int32_t>(first.size());
  // Breadth-first numbering of the blocks from the start's.
  std::vector<int32_t> number(blocks, -1), rep(blocks, -1);
  for (int32_t i = 0; i < n; ++i) {
    if (rep[block[i]] < 0) rep[block[i]] = begin + i;
  }
  std::vector<int32_t> queue = {block[start - begin]};
  number[queue[0]] = 0;
  for (size_t q = 0; q < queue.size(); ++q) {
    const auto& st = states[rep[queue[q]]];
    auto visit = [&](int32_t to) {
      const int32_t b = block[to - begin];
      if (number[b] < 0) {
        number[b] = static_cast<int32_t>(queue.size());
        queue.push_back(b);
      }
    };
    for (const auto& e : st.bytes) visit(e.to);
    for (const auto& c : st.calls) visit(c.to);
  }
  std::vector<CompiledGrammar::State> out(queue.size());
  for (size_t k = 0; k < queue.size(); ++k) {
    CompiledGrammar::State st = states[rep[queue[k]]];
    std::vector<CompiledGrammar::ByteEdge> bytes;
    for (auto e : st.bytes) {
      e.to = begin + number[block[e.to - begin]];
      if (!bytes.empty() && bytes.back().to == e.to && bytes.back().hi + 1 == e.lo) {
        bytes.back().hi = e.hi;
      } else {
        bytes.push_back(e);
      }
    }
    st.bytes = std::move(bytes);
    for (auto& c : st.calls) c.to = begin + number[block[c.to - begin]];
    out[k] = std::move(st);
  }
  states.resize(begin);
  states.insert(states.end(), std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
  return begin;
}

}  // namespace

StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar, const CompileOptions& options) {
  const size_t n = grammar.rules.size();
  if (n == 0 || grammar.root < 0 || static_cast<size_t>(grammar.root) >= n) {
    return InvalidArgumentError("grammar: no root rule");
  }
  std::vector<std::set<int32_t>> refs(n);
  for (size_t r = 0; r < n; ++r) {
    if (grammar.rules[r].body) CollectRefs(*grammar.rules[r].body, refs[r]);
    for (int32_t t : refs[r]) {
      if (t < 0 || static_cast<size_t>(t) >= n) return InvalidArgumentError("grammar: a reference to no rule");
    }
  }
  const std::vector<bool> recursive = RecursiveRules(refs);
  std::vector<bool> kept(n, false);
  for (size_t r = 0; r < n; ++r) kept[r] = recursive[r] || grammar.rules[r].keep;
  kept[grammar.root] = true;

  // Only the rules reachable from the root through kept rules are compiled.
  std::vector<int32_t> order;
  std::vector<int32_t> compiled_id(n, -1);
  {
    std::vector<int32_t> work = {grammar.root};
    std::vector<bool> seen(n, false);
    seen[grammar.root] = true;
    while (!work.empty()) {
      const int32_t r = work.back();
      work.pop_back();
      if (kept[r]) {
        compiled_id[r] = static_cast<int32_t>(order.size());
        order.push_back(r);
      }
      for (int32_t t : refs[r]) {
        if (!seen[t]) {
          seen[t] = true;
          work.push_back(t);
        }
      }
    }
  }

  auto out = std::shared_ptr<CompiledGrammar>(new CompiledGrammar());
  out->root_ = 0;
  const uintptr_t stack_floor = StackFloor();
  size_t nfa_total = 0;
  for (int32_t r : order) {
    Nfa nfa;
    nfa.limit = options.max_nfa_states - std::min(nfa_total, options.max_nfa_states);
    NfaBuilder builder(grammar, kept, nfa);
    builder.set_stack_floor(stack_floor);
    // Plain variables, not a structured binding: `intern` below captures `end` (clang 14 cannot capture bindings).
    const std::pair<int32_t, int32_t> fragment = builder.Build(*grammar.rules[r].body);
    const int32_t start = fragment.first, end = fragment.second;
    if (nfa.too_deep) {
      return InvalidArgumentError(fmt::format(
          "grammar too deep: rule '{}' nests rules and groups more than {} deep, or deeper than the compiling "
          "thread's stack allows (a chain of rules that each use the next, say)",
          grammar.rules[r].name, NfaBuilder::kMaxBuildDepth));
    }
    if (nfa.over) {
      return InvalidArgumentError(fmt::format("grammar too large: rule '{}' needs more than {} automaton states",
                                              grammar.rules[r].name, options.max_nfa_states));
    }
    nfa_total += nfa.states.size();

    // Subset construction.
    const auto rule_begin = static_cast<int32_t>(out->states_.size());
    const int32_t rule_index = compiled_id[r];
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> pending;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      EpsClosure(nfa, set);
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      const int32_t id = static_cast<int32_t>(out->states_.size());
      CompiledGrammar::State st;
      st.rule = rule_index;
      st.final = std::binary_search(set.begin(), set.end(), end);
      out->states_.push_back(std::move(st));
      ids.emplace(set, id);
      pending.push_back(std::move(set));
      return id;
    };
    out->rule_start_.push_back(intern({start}));
    out->rule_names_.push_back(grammar.rules[r].name);
    while (!pending.empty()) {
      if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
        return CancelledError("grammar compilation cancelled (the server is shutting down)");
      }
      if (out->states_.size() > options.max_dfa_states) {
        return InvalidArgumentError(fmt::format("grammar too large: rule '{}' needs more than {} DFA states",
                                                grammar.rules[r].name, options.max_dfa_states));
      }
      std::vector<int32_t> set = std::move(pending.back());
      pending.pop_back();
      const int32_t id = ids.at(set);
      std::vector<CompiledGrammar::ByteEdge> edges;
      std::map<int32_t, std::vector<int32_t>> calls;
      for (int32_t s : set) {
        edges.insert(edges.end(), nfa.states[s].bytes.begin(), nfa.states[s].bytes.end());
        for (const auto& c : nfa.states[s].calls) calls[c.rule].push_back(c.to);
      }
      std::vector<int> cuts;
      for (const auto& e : edges) {
        cuts.push_back(e.lo);
        cuts.push_back(e.hi + 1);
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<CompiledGrammar::ByteEdge> dfa_edges;
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        const int lo = cuts[i], hi = cuts[i + 1] - 1;
        std::vector<int32_t> targets;
        for (const auto& e : edges) {
          if (e.lo <= lo && hi <= e.hi) targets.push_back(e.to);
        }
        if (targets.empty()) continue;
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        const int32_t to = intern(std::move(targets));
        if (!dfa_edges.empty() && dfa_edges.back().to == to && dfa_edges.back().hi + 1 == lo) {
          dfa_edges.back().hi = static_cast<uint8_t>(hi);
        } else {
          dfa_edges.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
        }
      }
      std::vector<CompiledGrammar::CallEdge> dfa_calls;
      for (auto& [callee, targets] : calls) {
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        dfa_calls.push_back({compiled_id[callee], intern(std::move(targets))});
      }
      out->states_[id].bytes = std::move(dfa_edges);
      out->states_[id].calls = std::move(dfa_calls);
    }
    if (MinimizeTransitions(out->states_, rule_begin) <= kMaxMinimizeTransitions) {
      out->rule_start_.back() = Minimize(out->states_, rule_begin, out->rule_start_.back());
    }
    out->rule_begin_.push_back(rule_begin);
    // FNV-1a over the DFA (states relative to the rule), with its start; 0 for a rule with calls.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
      for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xFF)) * 1099511628211ull;
    };
    mix(static_cast<uint64_t>(out->rule_start_.back() - rule_begin));
    bool leaf = true;
    for (size_t k = rule_begin; k < out->states_.size(); ++k) {
      const auto& st = out->states_[k];
      leaf &= st.calls.empty();
      mix(st.final ? 0xF1 : 0xF0);
      for (const auto& e : st.bytes) mix((uint64_t{e.lo} << 40) | (uint64_t{e.hi} << 32) | (e.to - rule_begin));
      mix(0xE0);
    }
    out->fingerprints_.push_back(leaf ? (h == 0 ? 1 : h) : 0);
  }

  // Trim: keep only edges into states from which the rule can still end (a call counts when its callee can end and
  // its continuation can). Without this a bounded count (a pattern under maxLength, say) would let a matcher into a
  // state that no string completes, and no token would be allowed there.
  {
    const size_t ns = out->states_.size();
    std::vector<std::vector<int32_t>> dependents(ns);
    for (size_t k = 0; k < ns; ++k) {
      for (const auto& e : out->states_[k].bytes) dependents[e.to].push_back(static_cast<int32_t>(k));
      for (const auto& c : out->states_[k].calls) {
        dependents[c.to].push_back(static_cast<int32_t>(k));
        dependents[out->rule_start_[c.rule]].push_back(static_cast<int32_t>(k));
      }
    }
    std::vector<char> live(ns, 0);
    std::vector<int32_t> work;
    for (size_t k = 0; k < ns; ++k) {
      if (out->states_[k].final) {
        live[k] = 1;
        work.push_back(static_cast<int32_t>(k));
      }
    }
    auto can_end = [&](int32_t k) {
      for (const auto& e : out->states_[k].bytes) {
        if (live[e.to]) return true;
      }
      for (const auto& c : out->states_[k].calls) {
        if (live[c.to] && live[out->rule_start_[c.rule]]) return true;
      }
      return false;
    };
    while (!work.empty()) {
      const int32_t t = work.back();
      work.pop_back();
      for (int32_t k : dependents[t]) {
        if (!live[k] && can_end(k)) {
          live[k] = 1;
          work.push_back(k);
        }
      }
    }
    if (!live[out->rule_start_[0]]) {
      return InvalidArgumentError("grammar: no string satisfies it (within the supported bounds)");
    }
    for (auto& st : out->states_) {
      std::erase_if(st.bytes, [&](const CompiledGrammar::ByteEdge& e) { return !live[e.to]; });
      std::erase_if(st.calls,
                    [&](const CompiledGrammar::CallEdge& c) { return !live[c.to] || !live[out->rule_start_[c.rule]]; });
    }
  }

  // Left recursion: a rule that can call itself before reading a byte would make the matcher's stacks grow forever.
  // Worklists and explicit stacks throughout: a client's grammar may hold 100k+ mutually recursive rules, which a
  // recursive walk or a pass-until-nothing-changes loop (one pass per rule of a chain: quadratic) would not survive.
  const size_t nr = order.size();
  // callers[t]: the rules with a call edge to t, to revisit when t turns out nullable.
  std::vector<std::vector<int32_t>> callers(nr);
  {
    std::set<std::pair<int32_t, int32_t>> edges;  // (callee, caller)
    for (const auto& st : out->states_) {
      for (const auto& c : st.calls) edges.insert({c.rule, st.rule});
    }
    for (const auto& [callee, caller] : edges) callers[callee].push_back(caller);
  }
  std::vector<bool> nullable(nr, false);
  {
    std::vector<int32_t> pending(nr);
    for (size_t r = 0; r < nr; ++r) pending[r] = static_cast<int32_t>(nr - 1 - r);
    std::vector<bool> queued(nr, true);
    while (!pending.empty()) {
      const int32_t r = pending.back();
      pending.pop_back();
      queued[r] = false;
      if (nullable[r]) continue;
      std::vector<int32_t> work = {out->rule_start_[r]};
      std::set<int32_t> seen = {work[0]};
      while (!work.empty() && !nullable[r]) {
        const int32_t s = work.back();
        work.pop_back();
        if (out->states_[s].final) nullable[r] = true;
        for (const auto& c : out->states_[s].calls) {
          if (nullable[c.rule] && seen.insert(c.to).second) work.push_back(c.to);
        }
      }
      if (nullable[r]) {
        for (int32_t caller : callers[r]) {
          if (!nullable[caller] && !queued[caller]) {
            queued[caller] = true;
            pending.push_back(caller);
          }
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> left(nr);
  for (size_t r = 0; r < nr; ++r) {
    std::set<int32_t> callees;
    std::vector<int32_t> work = {out->rule_start_[r]};
    std::set<int32_t> seen = {work[0]};
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      for (const auto& c : out->states_[s].calls) {
        callees.insert(c.rule);
        if (nullable[c.rule] && seen.insert(c.to).second) work.push_back(c.to);
      }
    }
    left[r].assign(callees.begin(), callees.end());
  }
  // A cycle in the left-call graph, by depth-first search with an explicit stack of (rule, next edge).
  std::vector<int> color(nr, 0);  // 0 unvisited, 1 on the stack, 2 done
  std::vector<std::pair<int32_t, size_t>> stack;
  for (size_t root_rule = 0; root_rule < nr; ++root_rule) {
    if (color[root_rule] != 0) continue;
    stack.push_back({static_cast<int32_t>(root_rule), 0});
    color[root_rule] = 1;
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      if (next == left[r].size()) {
        color[r] = 2;
        stack.pop_back();
        continue;
      }
      const int32_t t = left[r][next++];
      if (color[t] == 1) {
        return InvalidArgumentError(
            fmt::format("grammar: rule '{}' is left-recursive, which is not supported", out->rule_names_[t]));
      }
      if (color[t] == 0) {
        color[t] = 1;
        stack.push_back({t, 0});  // invalidates r and next
      }
    }
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(out));
}

namespace {

// 0: no, 1: a prefix only, 2: a full match.
int Match(const CompiledGrammar& g, std::string_view text) {
  using Stack = std::vector<int32_t>;  // top at the back: the current state, below it the return states
  constexpr size_t kMaxDepth = 1000;
  std::set<Stack> current;
  bool accept = false;
  std::function<void(Stack, std::set<Stack>&, bool&)> close = [&](Stack s, std::set<Stack>& out, bool& acc) {
    if (s.size() > kMaxDepth || out.count(s)) return;
    const auto& st = g.states()[s.back()];
    out.insert(s);
    for (const auto& c : st.calls) {
      Stack t = s;
      t.back() = c.to;
      t.push_back(g.rule_start(c.rule));
      close(std::move(t), out, acc);
    }
    if (st.final) {
      Stack t = s;
      t.pop_back();
      if (t.empty()) {
        acc = true;
      } else {
        close(std::move(t), out, acc);
      }
    }
  };
  close({g.root_start()}, current, accept);
  for (char c : text) {
    std::set<Stack> next;
    bool acc = false;
    for (const Stack& s : current) {
      const int32_t to = g.Next(s.back(), static_cast<uint8_t>(c));
      if (to < 0) continue;
      Stack t = s;
      t.back() = to;
      close(std::move(t), next, acc);
    }
    current = std::move(next);
    accept = acc;
    if (current.empty() && !accept) return 0;
  }
  return accept ? 2 : 1;
}

}  // namespace

bool Matches(const CompiledGrammar& g, std::string_view text) {
  return Match(g, text) == 2;
}
bool MatchesPrefix(const CompiledGrammar& g, std::string_view text) {
  return Match(g, text) > 0;
}

}  // namespace fathom::grammar
