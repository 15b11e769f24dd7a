#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <random>
#include <vector>

namespace fathom::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> MustCompile(const Grammar& g, CompileOptions options = {}) {
  auto c = Compile(g, options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

std::shared_ptr<const CompiledGrammar> One(ExprPtr e) {
  GrammarBuilder b;
  const int32_t root = b.Add("root", std::move(e));
  return MustCompile(b.Finish(root));
}

TEST(GrammarTest, LiteralsSequencesAndAlternatives) {
  auto g = One(Alt({Lit("true"), Lit("false"), Seq({Lit("n"), Lit("ull")})}));
  EXPECT_TRUE(Matches(*g, "true"));
  EXPECT_TRUE(Matches(*g, "false"));
  EXPECT_TRUE(Matches(*g, "null"));
  EXPECT_FALSE(Matches(*g, "tru"));
  EXPECT_TRUE(MatchesPrefix(*g, "tru"));
  EXPECT_FALSE(Matches(*g, "truee"));
  EXPECT_FALSE(MatchesPrefix(*g, "x"));
  EXPECT_FALSE(Matches(*g, ""));
}

TEST(GrammarTest, BoundedAndUnboundedRepeats) {
  auto digits = One(Repeat(Bytes({{'0', '9'}}), 2, 4));
  EXPECT_FALSE(Matches(*digits, "1"));
  EXPECT_TRUE(Matches(*digits, "12"));
  EXPECT_TRUE(Matches(*digits, "1234"));
  EXPECT_FALSE(Matches(*digits, "12345"));
  EXPECT_FALSE(MatchesPrefix(*digits, "12345"));
  auto star = One(Seq({Lit("a"), Star(Lit("bc")), Lit("d")}));
  EXPECT_TRUE(Matches(*star, "ad"));
  EXPECT_TRUE(Matches(*star, "abcbcd"));
  EXPECT_FALSE(Matches(*star, "abd"));
  auto plus = One(Plus(Lit("x")));
  EXPECT_FALSE(Matches(*plus, ""));
  EXPECT_TRUE(Matches(*plus, "xxx"));
  auto opt = One(Seq({Opt(Lit("-")), Lit("1")}));
  EXPECT_TRUE(Matches(*opt, "-1"));
  EXPECT_TRUE(Matches(*opt, "1"));
  EXPECT_FALSE(Matches(*opt, "--1"));
}

TEST(GrammarTest, CodePointClassesAreUtf8AndNeverSurrogates) {
  // Every code point outside ASCII's control characters and the quote, one at a time.
  auto g = One(CodePoints({{0, 0x1F}, {'"', '"'}}, /*negate=*/true));
  EXPECT_TRUE(Matches(*g, "a"));
  EXPECT_FALSE(Matches(*g, "\""));
  EXPECT_FALSE(Matches(*g, "\n"));
  EXPECT_TRUE(Matches(*g, "é"));                  // U+00E9, 2 bytes
  EXPECT_TRUE(Matches(*g, "€"));                  // U+20AC, 3 bytes
  EXPECT_TRUE(Matches(*g, "\xF0\x9F\x98\x80"));   // U+1F600, 4 bytes
  EXPECT_TRUE(Matches(*g, "\xF4\x8F\xBF\xBF"));   // U+10FFFF
  EXPECT_FALSE(Matches(*g, "\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(Matches(*g, "\xED\xA0\x80"));      // U+D800, a surrogate
  EXPECT_FALSE(Matches(*g, "\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(Matches(*g, "\xE0\x80\xAF"));      // overlong '/'
  EXPECT_TRUE(MatchesPrefix(*g, "\xE2\x82"));     // half of the euro sign
  EXPECT_FALSE(Matches(*g, "\xE2\x82"));
  // A range across encoded lengths and continuation-byte boundaries: U+007E..U+0801.
  auto r = One(CodePoints({{0x7E, 0x801}}));
  for (char32_t cp : {0x7Eu, 0x7Fu, 0x80u, 0xBFu, 0xC0u, 0x7FFu, 0x800u, 0x801u}) {
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    } else {
      s = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
           static_cast<char>(0x80 | (cp & 0x3F))};
    }
    EXPECT_TRUE(Matches(*r, s)) << static_cast<uint32_t>(cp);
  }
  EXPECT_FALSE(Matches(*r, "\x7D"));
  EXPECT_FALSE(Matches(*r, "\xE0\xA0\x82"));  // U+0802
}

TEST(GrammarTest, RecursiveRulesStayRulesAndNest) {
  GrammarBuilder b;
  const int32_t value = b.Declare("value");
  b.Define(value,
           Alt({Lit("1"), Seq({Lit("["), Opt(Seq({Ref(value), Star(Seq({Lit(","), Ref(value)}))})), Lit("]")})}));
  auto g = MustCompile(b.Finish(value));
  EXPECT_TRUE(Matches(*g, "1"));
  EXPECT_TRUE(Matches(*g, "[]"));
  EXPECT_TRUE(Matches(*g, "[1,[1,[]],[[[1]]]]"));
  EXPECT_FALSE(Matches(*g, "[1,]"));
  EXPECT_FALSE(Matches(*g, "[[1]"));
  EXPECT_TRUE(MatchesPrefix(*g, "[[1"));
  EXPECT_EQ(g->num_rules(), 1u);
}

TEST(GrammarTest, NonRecursiveRulesAreInlined) {
  GrammarBuilder b;
  const int32_t digit = b.Add("digit", Bytes({{'0', '9'}}));
  const int32_t pair = b.Add("pair", Seq({Ref(digit), Lit(":"), Ref(digit)}));
  const int32_t kept = b.Add("kept", Lit("k"), /*keep=*/true);
  const int32_t root = b.Add("root", Seq({Ref(pair), Lit(";"), Ref(pair), Ref(kept)}));
  auto g = MustCompile(b.Finish(root));
  EXPECT_EQ(g->num_rules(), 2u);  // root and the kept rule
  EXPECT_TRUE(Matches(*g, "1:2;3:4k"));
  EXPECT_FALSE(Matches(*g, "1:2;3:4"));
}

TEST(GrammarTest, LeftRecursionIsRefusedByName) {
  GrammarBuilder b;
  const int32_t expr = b.Declare("expr");
  b.Define(expr, Alt({Seq({Ref(expr), Lit("+"), Lit("1")}), Lit("1")}));
  auto c = Compile(b.Finish(expr), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rule 'expr' is left-recursive"), std::string::npos) << c.status().ToString();

  // Through a nullable rule, too.
  GrammarBuilder b2;
  const int32_t a = b2.Declare("a");
  const int32_t maybe = b2.Add("maybe", Opt(Lit("x")), /*keep=*/true);
  b2.Define(a, Alt({Seq({Ref(maybe), Ref(a), Lit("y")}), Lit("z")}));
  auto c2 = Compile(b2.Finish(a), {});
  ASSERT_FALSE(c2.ok());
  EXPECT_NE(c2.status().message().find("left-recursive"), std::string::npos);
}

TEST(GrammarTest, GrammarsOverTheBoundsAreRefused) {
  auto deep = Repeat(Repeat(Repeat(Bytes({{'a', 'z'}}), 0, 100), 0, 100), 0, 100);
  GrammarBuilder b;
  const int32_t root = b.Add("root", deep);
  auto c = Compile(b.Finish(root), CompileOptions{.max_nfa_states = 100'000, .max_dfa_states = 10'000});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("grammar too large: rule 'root'"), std::string::npos) << c.status().ToString();
}

// A server that shuts down stops compiles in progress through CompileOptions::cancel.
TEST(GrammarTest, ACompileStopsWhenCancelled) {
  GrammarBuilder b;
  const int32_t root = b.Add("root", Repeat(Bytes({{'a', 'z'}}), 0, 50));
  const Grammar g = b.Finish(root);
  std::atomic<bool> cancel{true};
  auto c = Compile(g, CompileOptions{.cancel = &cancel});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCancelled);
  cancel.store(false);
  EXPECT_TRUE(Compile(g, CompileOptions{.cancel = &cancel}).ok());
}

// Left recursion through a cycle of 30,000 kept rules, and nullability that reaches back along a chain of them, are
// found without recursion (a recursive search overflowed the stack) and in linear passes (one pass per rule of the
// chain was quadratic).
TEST(GrammarTest, LongCyclesOfRulesAreAnalysedIteratively) {
  constexpr int kRules = 30000;  // two DFA states each: within the 100,000-state bound
  GrammarBuilder b;
  std::vector<int32_t> ids;
  for (int i = 0; i <= kRules; ++i) ids.push_back(b.Declare("c" + std::to_string(i)));
  const int32_t root = b.Declare("root");
  for (int i = 0; i < kRules; ++i) b.Define(ids[i], Ref(ids[i + 1]));
  // The last rule may be empty or go round again after a byte: every rule is recursive (kept) and nullable.
  b.Define(ids[kRules], Alt({Empty(), Seq({Lit("("), Ref(ids[0]), Lit(")")})}));
  b.Define(root, Ref(ids[0]));
  auto ok = Compile(b.Finish(root), {});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->num_rules(), static_cast<size_t>(kRules + 2));  // every rule kept: all of them recursive
  // Now the last rule calls the first before any byte: left recursion, named.
  GrammarBuilder l;
  std::vector<int32_t> lids;
  for (int i = 0; i <= kRules; ++i) lids.push_back(l.Declare("c" + std::to_string(i)));
  for (int i = 0; i < kRules; ++i) l.Define(lids[i], Ref(lids[i + 1]));
  l.Define(lids[kRules], Alt({Lit("x"), Seq({Ref(lids[0]), Lit("y")})}));
  auto left = Compile(l.Finish(lids[0]), {});
  ASSERT_FALSE(left.ok());
  EXPECT_NE(left.status().message().find("left-recursive"), std::string::npos) << left.status().ToString();
}

TEST(GrammarTest, GrammarsThatMatchNothingAreRefusedAndDeadEndsTrimmed) {
  GrammarBuilder b;
  const int32_t root = b.Add("root", Alt({}));
  auto c = Compile(b.Finish(root), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no string satisfies it"), std::string::npos);
  // "ab" then a rule that matches nothing: the prefix "a" leads nowhere, so it is not a viable prefix.
  GrammarBuilder b2;
  const int32_t never = b2.Add("never", Alt({}), /*keep=*/true);
  const int32_t root2 = b2.Add("root", Alt({Seq({Lit("ab"), Ref(never)}), Lit("c")}));
  auto g = MustCompile(b2.Finish(root2));
  EXPECT_TRUE(Matches(*g, "c"));
  EXPECT_FALSE(MatchesPrefix(*g, "a"));
  // A count that cannot be met from a state: at 3 characters of at most 4, "x" then the 2-character "yy" is over.
  auto counted =
      One(CountChars(Seq({Repeat(CharUnit(Lit("x")), 1, -1), CharUnit(Lit("y")), CharUnit(Lit("y"))}), 0, 4));
  EXPECT_TRUE(Matches(*counted, "xxyy"));
  EXPECT_FALSE(MatchesPrefix(*counted, "xxx"));
}

// The number of classes of states[begin, end) under "same finality, and on every byte and call, both edges absent
// or both to equivalent states", computed round by round: the test's own oracle for Minimize.
size_t EquivalenceClasses(const CompiledGrammar& g, int32_t begin, int32_t end) {
  const auto& states = g.states();
  std::vector<int32_t> block(end - begin);
  for (int32_t i = begin; i < end; ++i) block[i - begin] = states[i].final ? 1 : 0;
  size_t count = 0;
  for (;;) {
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<int32_t> next(block.size());
    for (int32_t i = begin; i < end; ++i) {
      std::vector<int32_t> sig = {block[i - begin]};
      for (int b = 0; b < 256; ++b) {
        const int32_t to = g.Next(i, static_cast<uint8_t>(b));
        sig.push_back(to < 0 ? -1 : block[to - begin]);
      }
      for (const auto& c : states[i].calls) {
        sig.push_back(c.rule);
        sig.push_back(block[c.to - begin]);
      }
      next[i - begin] = ids.emplace(sig, static_cast<int32_t>(ids.size())).first->second;
    }
    block = std::move(next);
    if (ids.size() == count) return count;
    count = ids.size();
  }
}

void ExpectMinimal(const CompiledGrammar& g) {
  for (size_t r = 0; r < g.num_rules(); ++r) {
    const int32_t begin = g.rule_begin(static_cast<int32_t>(r));
    const auto end =
        r + 1 < g.num_rules() ? g.rule_begin(static_cast<int32_t>(r + 1)) : static_cast<int32_t>(g.states().size());
    EXPECT_EQ(EquivalenceClasses(g, begin, end), static_cast<size_t>(end - begin))
        << "rule " << g.rule_name(static_cast<int32_t>(r));
    EXPECT_EQ(g.rule_start(static_cast<int32_t>(r)), begin) << "rule " << g.rule_name(static_cast<int32_t>(r));
  }
}

TEST(GrammarTest, EveryRulesDfaIsMinimal) {
  // (a|b)*abb: the textbook automaton has 4 states.
  auto abb = One(Seq({Star(Alt({Lit("a"), Lit("b")})), Lit("abb")}));
  EXPECT_EQ(abb->states().size(), 4u);
  EXPECT_TRUE(Matches(*abb, "babaabb"));
  EXPECT_FALSE(Matches(*abb, "abba"));
  ExpectMinimal(*abb);
  // Equal suffixes merge: "xa|ya|za" is 3 states, whichever first byte.
  auto suffix = One(Alt({Lit("xa"), Lit("ya"), Lit("za")}));
  EXPECT_EQ(suffix->states().size(), 3u);
  // A long chain has no two equivalent states (each is a different distance from the end): 1,001 states.
  auto chain = One(Repeat(Bytes({{'0', '9'}}), 0, 1000));
  EXPECT_EQ(chain->states().size(), 1001u);
  // Random expressions over a small alphabet, with a recursive rule that calls back into itself.
  std::mt19937 rng(7);
  std::function<ExprPtr(int)> random_expr = [&](int depth) -> ExprPtr {
    const int pick = depth > 3 ? static_cast<int>(rng() % 2) : static_cast<int>(rng() % 7);
    switch (pick) {
      case 0:
        return Lit(std::string(1, static_cast<char>('a' + rng() % 3)));
      case 1:
        return Bytes({{static_cast<uint8_t>('a' + rng() % 3), static_cast<uint8_t>('c' + rng() % 2)}});
      case 2:
        return Seq({random_expr(depth + 1), random_expr(depth + 1)});
      case 3:
        return Alt({random_expr(depth + 1), random_expr(depth + 1), random_expr(depth + 1)});
      case 4:
        return Star(random_expr(depth + 1));
      case 5:
        return Repeat(random_expr(depth + 1), static_cast<int>(rng() % 2), 1 + static_cast<int>(rng() % 3));
      default:
        return Opt(random_expr(depth + 1));
    }
  };
  for (int trial = 0; trial < 200; ++trial) {
    GrammarBuilder b;
    const int32_t nest = b.Declare("nest");
    b.Define(nest, Alt({Seq({Lit("("), Opt(Ref(nest)), random_expr(1), Lit(")")}), random_expr(1)}));
    const int32_t root = b.Add("root", Seq({random_expr(0), Ref(nest), random_expr(0)}));
    auto c = Compile(b.Finish(root), {});
    if (!c.ok()) continue;  // a random expression may match nothing
    ExpectMinimal(**c);
  }
}

}  // namespace
}  // namespace fathom::grammar
