#include "grammar/gbnf.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace fathom::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> FromGbnf(const std::string& text) {
  auto g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto c = Compile(*g, {});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

std::string Refusal(const std::string& text) {
  auto g = ParseGbnf(text);
  if (!g.ok()) return std::string(g.status().message());
  auto c = Compile(*g, {});
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(GbnfTest, RulesLiteralsClassesAndRepetitions) {
  auto g = FromGbnf(R"(
# a list of answers
root   ::= answer ("," ws answer)*
answer ::= "yes" | "no" | num
num    ::= [1-9] [0-9]{0,2}
ws     ::= [ \t]?
)");
  EXPECT_TRUE(Matches(*g, "yes"));
  EXPECT_TRUE(Matches(*g, "yes, no,\t123,7"));
  EXPECT_FALSE(Matches(*g, "yes,  no"));
  EXPECT_FALSE(Matches(*g, "0"));
  EXPECT_FALSE(Matches(*g, "1234"));
  auto esc = FromGbnf(R"(root ::= "a\"b\\\n" [^\]x] "\u00e9\x41" . "é"+)");
  EXPECT_TRUE(Matches(*esc, "a\"b\\\nqéA€éé"));
  EXPECT_FALSE(Matches(*esc, "a\"b\\\n]éA€é"));
  // Alternatives across lines, up to the next definition.
  auto lines = FromGbnf("root ::= a\n  | b\na ::= \"x\"\nb ::= \"y\" b?\n");
  EXPECT_TRUE(Matches(*lines, "x"));
  EXPECT_TRUE(Matches(*lines, "yyy"));
}

TEST(GbnfTest, RecursionAndTheJsonGrammarOfLlamaCpp) {
  auto g = FromGbnf(R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)");
  EXPECT_TRUE(Matches(*g, R"({"a": [1, 2.5, {"b": null}], "c": "x\n"})"));
  EXPECT_FALSE(Matches(*g, R"({"a": [1,]})"));
}

TEST(GbnfTest, ErrorsNameTheLineAndTheProblem) {
  EXPECT_NE(Refusal("root ::= item\n").find("rule 'item' is used (line 1) but never defined"), std::string::npos);
  EXPECT_NE(Refusal("item ::= \"a\"\n").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(Refusal("root ::= \"a\"\nroot ::= \"b\"\n").find("line 2: rule 'root' is defined twice"),
            std::string::npos);
  EXPECT_NE(Refusal("root ::= \"a\n\"").find("line 1: expected '\"' before the end of the line"), std::string::npos);
  EXPECT_NE(Refusal("root ::= [a-\n").find("expected"), std::string::npos);
  EXPECT_NE(Refusal("root ::= \"a\"{3,1}").find("m <= n"), std::string::npos);
  EXPECT_NE(Refusal("root = \"a\"").find("'::='"), std::string::npos);
  EXPECT_NE(Refusal("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(Refusal("root ::= ( \"a\"").find("closing ')'"), std::string::npos);
}

// A client's grammar that chains 150,000 rules (r_i ::= r_i+1) crashed the server: inlining recursed once per rule,
// and so did the search for recursive rules. Now the search is iterative and the inlining depth is bounded; the
// grammar is refused by name. A chain within the bound compiles.
TEST(GbnfTest, LongRuleChainsAreRefusedNotACrash) {
  auto chain = [](int n) {
    std::string text = "root ::= r0\n";
    for (int i = 0; i < n; ++i) text += fmt::format("r{} ::= r{}\n", i, i + 1);
    text += fmt::format("r{} ::= \"x\"\n", n);
    return text;
  };
  const std::string refusal = Refusal(chain(150000));
  EXPECT_NE(refusal.find("grammar too deep"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("2000"), std::string::npos) << refusal;
  auto g = FromGbnf(chain(500));
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(*g, "x"));
  // Mutual recursion through a long cycle is found as recursion (iteratively), and compiles.
  std::string cycle = "root ::= \"(\" c0 \")\" | \"x\"\n";
  for (int i = 0; i < 20000; ++i) cycle += fmt::format("c{} ::= c{}\n", i, i + 1);
  cycle += "c20000 ::= root\n";
  EXPECT_EQ(Refusal(cycle).find("grammar too deep"), std::string::npos);
}

// Each repetition operator wraps its item once more; a million of them nested a million deep.
TEST(GbnfTest, RepetitionOperatorsAreBounded) {
  EXPECT_NE(Refusal("root ::= \"a\"" + std::string(1000000, '*')).find("at most 8 repetition operators"),
            std::string::npos);
  auto g = FromGbnf("root ::= \"a\"{2}?");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(*g, "aa"));
  EXPECT_TRUE(Matches(*g, ""));
}

// Line numbers in errors are counted once over the text (they were recounted from the start for every rule, which
// made 200k one-line rules take minutes); they stay right deep into a long grammar.
TEST(GbnfTest, LineNumbersStayRightInLongGrammars) {
  std::string text = "root ::= r0\n";
  for (int i = 0; i < 50000; ++i) text += fmt::format("r{} ::= \"a\" | r{}\n", i, i + 1);
  text += "r50000 ::= \"b\"\nr7 ::= \"c\"\n";  // line 50,003 defines r7 again
  EXPECT_NE(Refusal(text).find("line 50003: rule 'r7' is defined twice"), std::string::npos) << Refusal(text);
}

}  // namespace
}  // namespace fathom::grammar
