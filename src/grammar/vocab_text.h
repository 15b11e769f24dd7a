// The vocabulary of a tokenizer for the grammar engine; separate so that fathom::grammar itself needs no tokenizer
// (the engine links the grammar, not the tokenizer).
//
//   auto vocab = VocabFromTokenizer(*tokenizer, /*extra_eos=*/{eot_id});
#pragma once

#include <memory>
#include <vector>

#include "grammar/matcher.h"

namespace fathom {
class Tokenizer;
}

namespace fathom::grammar {

// Tokenizer::TokenBytes of every id (special tokens never allowed); EOS the tokenizer's eos token and `extra_eos`
// (a model's other end tokens, from generation_config.json).
std::shared_ptr<const TokenVocab> VocabFromTokenizer(const fathom::Tokenizer& tokenizer,
                                                     const std::vector<int32_t>& extra_eos = {});

}  // namespace fathom::grammar
