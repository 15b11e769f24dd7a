#include "grammar/vocab_text.h"

#include "tokenizer/tokenizer.h"

namespace fathom::grammar {

std::shared_ptr<const TokenVocab> VocabFromTokenizer(const fathom::Tokenizer& tokenizer,
                                                     const std::vector<int32_t>& extra_eos) {
  std::vector<std::optional<std::string>> tokens(tokenizer.vocab_size());
  for (size_t id = 0; id < tokens.size(); ++id) tokens[id] = tokenizer.TokenBytes(static_cast<int32_t>(id));
  std::vector<int32_t> eos = extra_eos;
  if (tokenizer.eos_id()) eos.push_back(*tokenizer.eos_id());
  return TokenVocab::Build(tokens, std::move(eos));
}

}  // namespace fathom::grammar
