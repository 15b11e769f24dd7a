#include "bench/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace fathom::bench {

namespace {

// True for well-formed UTF-8 without U+FFFD (what a decoder emits for a partial character) or control characters
// other than tab and newline.
bool IsCleanText(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      if (c < 0x20 && c != '\t' && c != '\n') return false;
      if (c == 0x7f) return false;
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(extra) >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp == 0xFFFD || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000)) return false;
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

class LocalTokenCounter : public TokenCounter {
 public:
  explicit LocalTokenCounter(const Tokenizer& tok) : tok_(tok) {}
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) override { return tok_.Encode(text); }
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) override { return tok_.Decode(ids); }
  StatusOr<std::vector<int32_t>> CandidateIds() override {
    if (!candidates_.empty()) return candidates_;
    std::unordered_set<int32_t> added;
    for (const AddedToken& t : tok_.added_tokens()) added.insert(t.id);
    const auto vocab = static_cast<int32_t>(tok_.vocab_size());
    for (int32_t id = 0; id < vocab; ++id) {
      if (added.count(id) != 0 || tok_.IsSpecial(id)) continue;
      const int32_t one[] = {id};
      if (IsCleanText(tok_.Decode(one))) candidates_.push_back(id);
    }
    if (candidates_.empty()) return FailedPreconditionError("the tokenizer has no ordinary tokens to build prompts of");
    return candidates_;
  }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> candidates_;
};

struct Generated {
  std::string text;
  std::vector<int32_t> ids;
};

// Text that starts with `prefix_text` (of `prefix_len` tokens) and encodes to `target` tokens, or as close as a
// few rounds of trimming and extending get.
StatusOr<Generated> GenerateText(TokenCounter& tok, const std::vector<int32_t>& candidates,
                                 const std::string& prefix_text, int32_t prefix_len, int32_t target,
                                 std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
  std::vector<int32_t> unique;
  for (int32_t i = prefix_len; i < target; ++i) unique.push_back(candidates[pick(rng)]);
  Generated best;
  int64_t best_diff = std::numeric_limits<int64_t>::max();
  constexpr int kMaxRounds = 10;
  for (int round = 0; round < kMaxRounds; ++round) {
    FATHOM_ASSIGN_OR_RETURN(std::string text, tok.Decode(unique));
    text = prefix_text + text;
    FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> enc, tok.Encode(text));
    const int64_t diff = static_cast<int64_t>(enc.size()) - target;
    if (std::llabs(diff) < best_diff) {
      best_diff = std::llabs(diff);
      best.text = text;
      best.ids = enc;
    }
    if (diff == 0) break;
    // Continue from the tokens the text really has, trimmed or extended by the difference.
    unique.assign(enc.begin() + std::min<int64_t>(prefix_len, static_cast<int64_t>(enc.size())), enc.end());
    if (diff > 0) {
      unique.resize(static_cast<size_t>(std::max<int64_t>(1, static_cast<int64_t>(unique.size()) - diff)));
    } else {
      for (int64_t k = 0; k < -diff; ++k) unique.push_back(candidates[pick(rng)]);
    }
  }
  return best;
}

}  // namespace

std::unique_ptr<TokenCounter> MakeLocalTokenCounter(const Tokenizer& tokenizer) {
  return std::make_unique<LocalTokenCounter>(tokenizer);
}

std::vector<int32_t> SampleLengths(int32_t mean, double range_ratio, int64_t n, std::mt19937_64& rng) {
  const double r = std::clamp(range_ratio, 0.0, 1.0);
  const auto lo = std::max<int32_t>(1, static_cast<int32_t>(std::floor(mean * (1.0 - r))));
  const auto hi = std::max<int32_t>(lo, static_cast<int32_t>(std::floor(mean * (1.0 + r))));
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(lo == hi ? lo : dist(rng));
  return out;
}

StatusOr<std::vector<BenchPrompt>> MakeRandomPrompts(TokenCounter& tok, const WorkloadOptions& o) {
  if (o.input_len <= 0 || o.output_len <= 0) return InvalidArgumentError("--input-len and --output-len must be > 0");
  if (o.shared_prefix_len < 0) return InvalidArgumentError("--shared-prefix-len must be >= 0");
  if (o.range_ratio < 0 || o.range_ratio >= 1) return InvalidArgumentError("--range-ratio must be in [0, 1)");
  std::mt19937_64 rng(o.seed);
  FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> candidates, tok.CandidateIds());
  if (candidates.empty()) return FailedPreconditionError("no candidate tokens for random prompts");
  const std::vector<int32_t> in_lens = SampleLengths(o.input_len, o.range_ratio, o.num_requests, rng);
  const std::vector<int32_t> out_lens = SampleLengths(o.output_len, o.range_ratio, o.num_requests, rng);
  std::string prefix_text;
  int32_t prefix_len = 0;
  if (o.shared_prefix_len > 0) {
    FATHOM_ASSIGN_OR_RETURN(Generated prefix, GenerateText(tok, candidates, "", 0, o.shared_prefix_len, rng));
    prefix_text = std::move(prefix.text);
    prefix_len = static_cast<int32_t>(prefix.ids.size());
  }
  std::vector<BenchPrompt> out;
  out.reserve(static_cast<size_t>(o.num_requests));
  for (int64_t i = 0; i < o.num_requests; ++i) {
    const size_t k = static_cast<size_t>(i);
    FATHOM_ASSIGN_OR_RETURN(Generated g,
                            GenerateText(tok, candidates, prefix_text, prefix_len, prefix_len + in_lens[k], rng));
    BenchPrompt p;
    p.text = std::move(g.text);
    p.ids = std::move(g.ids);
    p.prompt_len = static_cast<int32_t>(p.ids.size());
    p.output_len = out_lens[k];
    out.push_back(std::move(p));
  }
  return out;
}

StatusOr<std::vector<BenchPrompt>> LoadDatasetPrompts(const std::string& path, const WorkloadOptions& o,
                                                      TokenCounter* tok) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("cannot open the dataset '{}'", path));
  std::vector<BenchPrompt> lines;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
      return InvalidArgumentError(fmt::format("{}:{}: expected a JSON object with a \"prompt\" string", path, line_no));
    }
    BenchPrompt p;
    p.text = j["prompt"].get<std::string>();
    p.output_len = o.output_len;
    if (auto it = j.find("output_len"); it != j.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
        return InvalidArgumentError(fmt::format("{}:{}: output_len must be a positive integer", path, line_no));
      }
      p.output_len = it->get<int32_t>();
    }
    lines.push_back(std::move(p));
    if (static_cast<int64_t>(lines.size()) >= o.num_requests) break;
  }
  if (lines.empty()) return InvalidArgumentError(fmt::format("the dataset '{}' has no prompts", path));
  if (tok != nullptr) {
    for (BenchPrompt& p : lines) {
      FATHOM_ASSIGN_OR_RETURN(p.ids, tok->Encode(p.text));
      p.prompt_len = static_cast<int32_t>(p.ids.size());
    }
  }
  std::vector<BenchPrompt> out;
  out.reserve(static_cast<size_t>(o.num_requests));
  for (int64_t i = 0; i < o.num_requests; ++i) out.push_back(lines[static_cast<size_t>(i) % lines.size()]);
  return out;
}

std::vector<double> ArrivalTimes(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (!(rate > 0) || std::isinf(rate) || n <= 1) return out;
  FATHOM_CHECK(burstiness > 0, "burstiness must be positive");
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (size_t i = 1; i < out.size(); ++i) out[i] = out[i - 1] + gap(rng);
  return out;
}

}  // namespace fathom::bench
