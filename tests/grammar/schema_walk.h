// Random walks under a grammar's masks, for the schema corpus test and bench/grammar_bench: tokens drawn uniformly
// from the mask, then, after `close_after` tokens, drawn so that the output closes (EOS when allowed, else a
// one-byte token of '"', ']' or '}', else any one-byte token), as a model with random logits and a bias toward
// closing tokens would.
//
//   WalkResult r = RandomWalk(matcher, seed, {.max_tokens = 600, .close_after = 48});
//   if (r.finished) validate(r.text);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace fathom::grammar {

struct WalkOptions {
  int max_tokens = 600;
  int close_after = 48;
};

struct WalkResult {
  std::string text;
  bool finished = false;  // EOS accepted
  int tokens = 0;
  std::vector<double> mask_us;  // FillMask time at each step
};

WalkResult RandomWalk(GrammarMatcher& matcher, uint64_t seed, const WalkOptions& options);

}  // namespace fathom::grammar
