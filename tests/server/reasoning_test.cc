#include "server/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/server.h"

namespace fathom::server {
namespace {

std::pair<std::string, std::string> SplitAll(const std::vector<std::string>& deltas) {
  ReasoningSplitter s;
  std::string reasoning, content;
  for (const std::string& d : deltas) {
    ReasoningDelta out = s.Push(d);
    reasoning += out.reasoning;
    content += out.content;
  }
  ReasoningDelta tail = s.Finish();
  return {reasoning + tail.reasoning, content + tail.content};
}

// The chat template's thinking switch, which a request's `thinking` sets: a variable inside the template's tags, never
// a word of its text or a string literal.
TEST(ThinkingSwitchTest, FindsTheTemplateVariable) {
  EXPECT_EQ(ThinkingSwitch("{% if add_generation_prompt %}<｜Assistant｜>{% if thinking %}<think>{% else %}</think>"
                           "{% endif %}{% endif %}"),
            "thinking");  // DeepSeek-V3.1's form
  EXPECT_EQ(ThinkingSwitch("{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n"
                           "</think>\\n\\n' }}{%- endif %}"),
            "enable_thinking");  // Qwen3's
  EXPECT_EQ(ThinkingSwitch("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"), "");
  EXPECT_EQ(ThinkingSwitch("You are thinking carefully. {{ messages[0]['content'] }}"), "");  // text, not a tag
  EXPECT_EQ(ThinkingSwitch("{{ 'thinking' }}{{ \"thinking\" }}{{ rethinking }}{{ thinking_budget }}"), "");
  EXPECT_EQ(ThinkingSwitch("{% if x %}{{ '<think>' }}{% endif %}"), "");  // R1: opens <think>, no switch
  EXPECT_EQ(ThinkingSwitch("{% if thinking"), "thinking");                // an unclosed tag is still read
}

TEST(ReasoningTest, SplitsAtCloseTag) {
  EXPECT_EQ(SplitAll({"Let me think.</think>The answer"}),
            std::make_pair(std::string("Let me think."), std::string("The answer")));
}

TEST(ReasoningTest, TagSplitAcrossDeltasIsHeldBack) {
  ReasoningSplitter s;
  EXPECT_EQ(s.Push("hmm.</").reasoning, "hmm.");
  ReasoningDelta d = s.Push("thi");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "");
  d = s.Push("nk>Yes");
  EXPECT_EQ(d.content, "Yes");
  EXPECT_FALSE(s.in_reasoning());
  EXPECT_EQ(s.Push("</think> again").content, "</think> again");
}

TEST(ReasoningTest, EveryByteSplitGivesTheSameResult) {
  const std::string text = "<think>\nab</thx</think>cd</think>";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    for (size_t cut2 = cut; cut2 <= text.size(); ++cut2) {
      auto r = SplitAll({text.substr(0, cut), text.substr(cut, cut2 - cut), text.substr(cut2)});
      EXPECT_EQ(r.first, "\nab</thx") << cut << "," << cut2;
      EXPECT_EQ(r.second, "cd</think>") << cut << "," << cut2;
    }
  }
}

TEST(ReasoningTest, ModelOpenedThinkIsDropped) {
  EXPECT_EQ(SplitAll({"  <think>x</think>y"}).first, "x");
  EXPECT_EQ(SplitAll({"<thi", "nk>x</think>y"}).first, "x");
  EXPECT_EQ(SplitAll({"<thin"}).first, "<thin");  // flushed at the end
  EXPECT_EQ(SplitAll({"no close tag"}), std::make_pair(std::string("no close tag"), std::string()));
}

}  // namespace
}  // namespace fathom::server
