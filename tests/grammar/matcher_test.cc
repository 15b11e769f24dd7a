#include "grammar/matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace fathom::grammar {
namespace {

bool Bit(const std::vector<uint32_t>& mask, int32_t t) {
  return (mask[t >> 5] >> (t & 31)) & 1;
}

// A small vocabulary that exercises the hard cases: every 1- and 2-byte string over the grammar's characters,
// tokens that span several grammar elements, UTF-8 characters whole and split between tokens, a special token.
struct TestVocab {
  std::vector<std::optional<std::string>> tokens;
  int32_t eos = -1, special = -1;
};

TestVocab MakeVocab() {
  TestVocab v;
  const std::string alphabet = "[]{},:\"\\a1 u0";
  for (char a : alphabet) v.tokens.push_back(std::string(1, a));
  for (char a : alphabet) {
    for (char b : alphabet) v.tokens.push_back(std::string{a, b});
  }
  for (const char* s :
       {"\"],",     "\",\"", "a\"]", "]]]",        "[[[",   "\":\"", "\"}",  "é",    "\xC3",  "\xA9", "€",
        "\xE2\x82", "\xAC",  "\xE2", "\x82\xAC\"", "a\xE2", "\\u00", "\\\"", "1111", "\"a\"", "true"}) {
    v.tokens.push_back(std::string(s));
  }
  v.tokens.push_back(std::string("a"));  // a duplicate of another token's bytes
  v.special = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back(std::nullopt);
  v.eos = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back(std::string("</s>"));
  return v;
}

// Walks random allowed tokens and checks every mask against the reference matcher: a token is allowed exactly when
// the text with it is the start of a string of the grammar; EOS exactly when the text is one.
void CheckAgainstReference(const std::shared_ptr<const CompiledGrammar>& g, int seeds, int steps) {
  TestVocab tv = MakeVocab();
  auto vocab = TokenVocab::Build(tv.tokens, {tv.eos});
  auto cache = std::make_shared<GrammarCache>(g, vocab);
  std::vector<uint32_t> mask(vocab->mask_words());
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(seed);
    GrammarMatcher m(cache);
    std::string text;
    for (int step = 0; step < steps; ++step) {
      m.FillMask(mask);
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < tv.tokens.size(); ++t) {
        const auto id = static_cast<int32_t>(t);
        bool expect;
        if (id == tv.eos) {
          expect = Matches(*g, text);
        } else if (!tv.tokens[t]) {
          expect = false;
        } else {
          expect = MatchesPrefix(*g, text + *tv.tokens[t]);
        }
        ASSERT_EQ(Bit(mask, id), expect) << "seed " << seed << " after '" << text << "': token " << id << " '"
                                         << tv.tokens[t].value_or("<special>") << "'";
        if (expect) allowed.push_back(id);
      }
      ASSERT_EQ(m.CanEnd(), Matches(*g, text));
      if (allowed.empty()) break;
      // A token outside the mask is refused and changes nothing.
      for (size_t t = 0; t < tv.tokens.size(); ++t) {
        if (!Bit(mask, static_cast<int32_t>(t))) {
          ASSERT_FALSE(m.AcceptToken(static_cast<int32_t>(t)));
          break;
        }
      }
      // Prefer not to end, so that walks go deep.
      std::vector<int32_t> non_eos;
      for (int32_t a : allowed) {
        if (a != tv.eos) non_eos.push_back(a);
      }
      const int32_t pick =
          !non_eos.empty() && rng() % 10 != 0 ? non_eos[rng() % non_eos.size()] : allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.AcceptToken(pick));
      if (pick == tv.eos) {
        EXPECT_TRUE(m.terminated());
        m.FillMask(mask);
        for (size_t t = 0; t < tv.tokens.size(); ++t)
          EXPECT_EQ(Bit(mask, static_cast<int32_t>(t)), t == size_t(tv.eos));
        break;
      }
      text += *tv.tokens[pick];
    }
  }
}

// JSON-like values: recursive arrays and objects, strings with escapes and any code point, a kept string rule.
std::shared_ptr<const CompiledGrammar> JsonLike() {
  GrammarBuilder b;
  const int32_t value = b.Declare("value");
  const int32_t str = b.Declare("string", /*keep=*/true);
  const int32_t ws = b.Add("ws", Star(Lit(" ")), /*keep=*/true);  // nullable, kept: pops before any byte
  auto hex = Bytes({{'0', '9'}, {'a', 'f'}});
  b.Define(str, Seq({Lit("\""),
                     Star(Alt({CodePoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true),
                               Seq({Lit("\\"), Alt({Bytes({{'"', '"'}, {'\\', '\\'}, {'n', 'n'}}),
                                                    Seq({Lit("u"), Repeat(hex, 4, 4)})})})})),
                     Lit("\"")}));
  auto array = Seq({Lit("["), Ref(ws), Opt(Seq({Ref(value), Star(Seq({Lit(","), Ref(ws), Ref(value)}))})), Lit("]")});
  auto object =
      Seq({Lit("{"), Opt(Seq({Ref(str), Lit(":"), Ref(value), Star(Seq({Lit(","), Ref(str), Lit(":"), Ref(value)}))})),
           Lit("}")});
  b.Define(value, Seq({Alt({Ref(str), Plus(Lit("1")), Lit("true"), array, object}), Ref(ws)}));
  auto c = Compile(b.Finish(value), {});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(GrammarMatcherTest, MasksMatchTheReferenceOnARecursiveGrammar) {
  CheckAgainstReference(JsonLike(), 40, 40);
}

TEST(GrammarMatcherTest, MasksMatchTheReferenceOnARegularGrammar) {
  GrammarBuilder b;
  const int32_t root =
      b.Add("root", Seq({Lit("["), Repeat(Alt({Lit("a"), Lit("1"), Lit("é")}), 1, 5), Lit("]"), Opt(Lit(",\"€\""))}));
  auto g = Compile(b.Finish(root), {});
  ASSERT_TRUE(g.ok());
  CheckAgainstReference(*g, 30, 12);
}

TEST(GrammarMatcherTest, TokensSpanningRuleEndsContinueInTheCaller) {
  // "a" ends the kept rule mid-token in "a\"]": the rest is checked against the caller.
  GrammarBuilder b;
  const int32_t inner = b.Add("inner", Plus(Lit("a")), /*keep=*/true);
  const int32_t root = b.Add("root", Seq({Lit("\""), Ref(inner), Lit("\"]")}));
  auto g = Compile(b.Finish(root), {});
  ASSERT_TRUE(g.ok());
  TestVocab tv = MakeVocab();
  auto vocab = TokenVocab::Build(tv.tokens, {tv.eos});
  GrammarMatcher m(std::make_shared<GrammarCache>(*g, vocab));
  std::vector<uint32_t> mask(vocab->mask_words());
  auto id_of = [&](const std::string& s) {
    for (size_t t = 0; t < tv.tokens.size(); ++t) {
      if (tv.tokens[t] == s) return static_cast<int32_t>(t);
    }
    return -1;
  };
  ASSERT_TRUE(m.AcceptToken(id_of("\"")));
  ASSERT_TRUE(m.AcceptToken(id_of("a")));
  m.FillMask(mask);
  EXPECT_TRUE(Bit(mask, id_of("a\"]")));
  EXPECT_TRUE(Bit(mask, id_of("\"")));
  EXPECT_FALSE(Bit(mask, id_of("\"],")));
  EXPECT_FALSE(Bit(mask, tv.eos));
  ASSERT_TRUE(m.AcceptToken(id_of("a\"]")));
  EXPECT_TRUE(m.CanEnd());
  m.FillMask(mask);
  for (size_t t = 0; t < tv.tokens.size(); ++t) EXPECT_EQ(Bit(mask, static_cast<int32_t>(t)), t == size_t(tv.eos));
}

TEST(GrammarMatcherTest, RollbackRestoresEarlierStates) {
  auto g = JsonLike();
  TestVocab tv = MakeVocab();
  auto vocab = TokenVocab::Build(tv.tokens, {tv.eos});
  GrammarMatcher m(std::make_shared<GrammarCache>(g, vocab));
  std::vector<uint32_t> before(vocab->mask_words()), after(vocab->mask_words());
  m.FillMask(before);
  ASSERT_TRUE(m.AcceptToken(0));  // "["
  ASSERT_TRUE(m.AcceptToken(0));  // "["
  m.Rollback(2);
  m.FillMask(after);
  EXPECT_EQ(before, after);
}

TEST(GrammarMatcherTest, NestingIsBoundedByMaxDepth) {
  // Past max_depth, no further '[' is allowed; the value can still be closed.
  auto g = JsonLike();
  TestVocab tv = MakeVocab();
  auto vocab = TokenVocab::Build(tv.tokens, {tv.eos});
  GrammarMatcher m(std::make_shared<GrammarCache>(g, vocab, MatcherOptions{.max_depth = 8}));
  int opened = 0;
  while (m.AcceptToken(0) && opened < 100) ++opened;
  EXPECT_GT(opened, 2);
  EXPECT_LT(opened, 8);
  std::vector<uint32_t> mask(vocab->mask_words());
  m.FillMask(mask);
  EXPECT_TRUE(Bit(mask, 1));  // "]"
}

// Rules that each call two others before reading a byte have exponentially many call stacks at their start:
// r_i ::= r_(i+1) "a" | r_(i+2) "b" | "(" root ")" | "z". 18 such rules (885 bytes of GBNF) took 10 s for a first
// mask; the closure's budget stops it, the cache says so (the server then refuses the grammar), and nothing is allowed.
TEST(GrammarMatcherTest, AClosureOverItsBudgetStopsAndAllowsNothing) {
  auto make = [](int n) {
    GrammarBuilder b;
    std::vector<int32_t> r;
    const int32_t root = b.Declare("root");
    for (int i = 0; i <= n + 1; ++i) r.push_back(b.Declare("r" + std::to_string(i)));
    b.Define(root, Ref(r[0]));
    for (int i = 0; i < n; ++i) {
      b.Define(r[i], Alt({Seq({Ref(r[i + 1]), Lit("a")}), Seq({Ref(r[i + 2]), Lit("b")}),
                          Seq({Lit("("), Ref(root), Lit(")")}), Lit("z")}));
    }
    b.Define(r[n], Lit("z"));
    b.Define(r[n + 1], Lit("z"));
    auto c = Compile(b.Finish(root), {});
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return *c;
  };
  TestVocab tv = MakeVocab();
  auto vocab = TokenVocab::Build(tv.tokens, {tv.eos});
  // Within the budget: a few rules still match as before.
  auto small = std::make_shared<GrammarCache>(make(6), vocab);
  GrammarMatcher ok(small);
  EXPECT_FALSE(small->over_budget());
  EXPECT_TRUE(ok.AcceptBytes("za"));
  // Past it: 40 rules would be about 10^8 stacks.
  auto big = std::make_shared<GrammarCache>(make(40), vocab, MatcherOptions{.max_closure_stacks = 20000});
  GrammarMatcher stopped(big);
  EXPECT_TRUE(big->over_budget());
  std::vector<uint32_t> mask(vocab->mask_words());
  stopped.FillMask(mask);
  for (uint32_t w : mask) EXPECT_EQ(w, 0u);
}

}  // namespace
}  // namespace fathom::grammar
