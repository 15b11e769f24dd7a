// FuzzToolCalls: a model's output through the streaming tool-call parser (server/tools.h) of each format, whole and
// in pieces. The output is the model's, so a prompt can steer it: whatever it holds, the parser must return, and the
// deltas it streamed must add up to the calls it reports (ids and names in the first delta of each call, arguments
// appended), for every way the text arrives.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_targets.h"
#include "server/tools.h"

namespace fathom::fuzz {
namespace {

constexpr server::ToolFormat kFormats[] = {server::ToolFormat::kNone,        server::ToolFormat::kDeepSeekV3,
                                           server::ToolFormat::kDeepSeekV31, server::ToolFormat::kDeepSeekV32,
                                           server::ToolFormat::kHermes,      server::ToolFormat::kLlama3Json,
                                           server::ToolFormat::kDeepSeekV4};

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// Parses `text` in pieces of `piece` bytes and checks the deltas against the calls.
void Parse(server::ToolFormat format, std::string_view text, size_t piece) {
  int n = 0;
  server::ToolCallParser p(format, [&n] { return "call_" + std::to_string(n++); });
  std::vector<server::ToolCall> joined;
  size_t content = 0;
  const auto take = [&](const server::ToolDelta& d) {
    content += d.content.size();
    for (const server::ToolCallDelta& c : d.calls) {
      if (c.first) {
        Check(c.index == static_cast<int32_t>(joined.size()) && !c.id.empty());
        joined.push_back({c.id, c.name, c.arguments});
      } else {
        Check(!joined.empty() && c.index + 1 == static_cast<int32_t>(joined.size()) && c.id.empty());
        joined.back().arguments += c.arguments;
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += piece) take(p.Push(text.substr(i, piece)));
  take(p.Finish());
  const std::vector<server::ToolCall>& calls = p.calls();
  Check(calls.size() == joined.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    Check(calls[i].id == joined[i].id && calls[i].name == joined[i].name && calls[i].arguments == joined[i].arguments);
  }
  // Nothing grows out of nothing: content is some of the text, and calls are no longer than it (plus the braces and
  // quotes that DSML's parameters become, and each argument's JSON escapes: six bytes at most for one).
  Check(content <= text.size());
  size_t args = 0;
  for (const server::ToolCall& c : calls) args += c.arguments.size() + c.name.size();
  Check(args <= 6 * text.size() + 16 * calls.size() + 2);
}

}  // namespace

int FuzzToolCalls(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const server::ToolFormat format = kFormats[data[0] % std::size(kFormats)];
  const size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  Parse(format, text, text.size() + 1);
  Parse(format, text, piece);
  return 0;
}

}  // namespace fathom::fuzz
