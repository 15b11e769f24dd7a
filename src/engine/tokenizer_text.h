// TextStreams backed by the tokenizer's StreamingDecoder and StopStringMatcher (src/tokenizer/streaming.h).
//
//   FATHOM_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromDirectory(dir));
//   auto core = EngineCore::Create(*model, backend, config, TokenizerTextStreams(*tok));   // tok outlives the core
#pragma once

#include "engine/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

// Special tokens are skipped in the text.
TextStreamFactory TokenizerTextStreams(const Tokenizer& tokenizer);

}  // namespace fathom
