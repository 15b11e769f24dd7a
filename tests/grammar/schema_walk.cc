#include "grammar/schema_walk.h"

#include <chrono>
#include <random>

namespace fathom::grammar {

WalkResult RandomWalk(GrammarMatcher& m, uint64_t seed, const WalkOptions& options) {
  const TokenVocab& vocab = m.vocab();
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(vocab.mask_words());
  std::vector<int32_t> allowed, closing, short_ones;
  WalkResult r;
  for (int step = 0; step < options.max_tokens; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    m.FillMask(mask);
    r.mask_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    allowed.clear();
    closing.clear();
    short_ones.clear();
    bool eos = false;
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
        const auto t = static_cast<int32_t>(w * 32 + __builtin_ctz(bits));
        const std::string* b = vocab.bytes(t);
        if (b == nullptr) {
          eos = true;
          continue;
        }
        allowed.push_back(t);
        if (b->size() == 1) {
          short_ones.push_back(t);
          if ((*b)[0] == '"' || (*b)[0] == ']' || (*b)[0] == '}') closing.push_back(t);
        }
      }
    }
    int32_t pick = -1;
    if (step >= options.close_after) {
      if (eos) {
        pick = vocab.eos_ids().front();
      } else if (!closing.empty()) {
        pick = closing[rng() % closing.size()];
      } else if (!short_ones.empty()) {
        pick = short_ones[rng() % short_ones.size()];
      }
    }
    if (pick < 0) {
      if (allowed.empty() && !eos) break;  // a dead end: the caller sees finished == false
      if (allowed.empty() || (eos && rng() % 16 == 0)) {
        pick = vocab.eos_ids().front();
      } else {
        pick = allowed[rng() % allowed.size()];
      }
    }
    if (!m.AcceptToken(pick)) break;
    ++r.tokens;
    if (m.terminated()) {
      r.finished = true;
      break;
    }
    r.text += *vocab.bytes(pick);
  }
  return r;
}

}  // namespace fathom::grammar
