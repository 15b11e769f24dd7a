// What a benchmark sends: prompts of random tokens that re-encode to exactly the asked length with the model's
// tokenizer (local, or the server's /tokenize and /detokenize), or prompts from a JSONL dataset; and the lengths and
// arrival times of the requests.
//
//   auto tok = MakeLocalTokenCounter(*tokenizer);                        // or a RemoteTokenCounter (online.h)
//   WorkloadOptions w{.num_requests = 100, .input_len = 1024, .output_len = 128, .range_ratio = 0.5};
//   FATHOM_ASSIGN_OR_RETURN(std::vector<BenchPrompt> prompts, MakeRandomPrompts(*tok, w));
//   FATHOM_ASSIGN_OR_RETURN(prompts, LoadDatasetPrompts("prompts.jsonl", w, tok.get()));   // {"prompt": ...}
//   std::vector<double> at = ArrivalTimes(100, /*rate=*/8.0, /*burstiness=*/1.0, /*seed=*/0);  // Poisson, seconds
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace fathom::bench {

struct BenchPrompt {
  std::string text = {};
  std::vector<int32_t> ids = {};  // the text's tokens (no special tokens); empty when no tokenizer counted them
  int32_t prompt_len = 0;         // ids.size(), or 0 when unknown
  int32_t output_len = 0;         // max_tokens
};

// Tokenizer access for prompt generation. Encode adds no special tokens.
class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  virtual StatusOr<std::vector<int32_t>> Encode(const std::string& text) = 0;
  virtual StatusOr<std::string> Decode(const std::vector<int32_t>& ids) = 0;
  // The ids random prompts draw from: ordinary tokens that decode to clean text on their own.
  virtual StatusOr<std::vector<int32_t>> CandidateIds() = 0;
};

// Over a loaded tokenizer (which must outlive the counter).
std::unique_ptr<TokenCounter> MakeLocalTokenCounter(const Tokenizer& tokenizer);

struct WorkloadOptions {
  int64_t num_requests = 1000;
  int32_t input_len = 1024;
  int32_t output_len = 128;
  double range_ratio = 0.0;       // lengths uniform in [len * (1 - r), len * (1 + r)]
  int32_t shared_prefix_len = 0;  // tokens of one random prefix that every prompt starts with (not in input_len)
  uint64_t seed = 0;
};

// `n` lengths uniform in [round(mean * (1 - ratio)), round(mean * (1 + ratio))], at least 1.
std::vector<int32_t> SampleLengths(int32_t mean, double range_ratio, int64_t n, std::mt19937_64& rng);

// Random-token prompts: ids drawn from CandidateIds(), decoded, re-encoded and trimmed or extended until the text
// encodes to exactly shared_prefix_len + input length tokens (a few prompts may miss by a token when the
// tokenizer merges across the edit; prompt_len then holds the real count).
StatusOr<std::vector<BenchPrompt>> MakeRandomPrompts(TokenCounter& tok, const WorkloadOptions& o);

// One prompt per line of {"prompt": "...", "output_len": N (optional)}; the first num_requests lines, cycling when
// the file has fewer. `tok` (may be null) counts the prompt tokens.
StatusOr<std::vector<BenchPrompt>> LoadDatasetPrompts(const std::string& path, const WorkloadOptions& o,
                                                      TokenCounter* tok);

// Send times in seconds from the start: the first at 0, then gaps drawn from a gamma distribution of shape
// `burstiness` and mean 1 / rate (burstiness 1: Poisson; < 1 burstier; > 1 more regular). rate inf: all at 0.
std::vector<double> ArrivalTimes(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace fathom::bench
