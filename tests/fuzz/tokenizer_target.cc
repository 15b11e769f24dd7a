// FuzzTokenizer: a tokenizer.json (and optionally a tokenizer_config.json and a text) loaded, then encoded and
// decoded, in one piece and as a stream.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_targets.h"
#include "tokenizer/streaming.h"
#include "tokenizer/tokenizer.h"

namespace fathom::fuzz {

// Input: tokenizer.json ["#config" line, tokenizer_config.json] ["#text" line, text].
int FuzzTokenizer(const uint8_t* data, size_t size) {
  std::string_view head, text, json, config;
  SplitAt(std::string_view(reinterpret_cast<const char*>(data), size), "#text", &head, &text);
  SplitAt(head, "#config", &json, &config);
  StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::FromJson(json, config);
  static const bool verbose = std::getenv("FATHOM_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "--- %s\n", loaded.ok() ? "loaded" : loaded.status().ToString().c_str());
  if (!loaded.ok()) {
    if (loaded.status().message().empty()) __builtin_trap();
    return 0;
  }
  const Tokenizer& tok = **loaded;
  const int64_t vocab = static_cast<int64_t>(tok.vocab_size());
  if (text.empty()) text = "Hello, world! 12345 <｜User｜>ça 🦊\n\tdef f(x):  return x";
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids =
        tok.Encode(text, {.add_special_tokens = special, .split_special_tokens = !special});
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) __builtin_trap();  // every id encoded is one the model has
    }
    const std::string decoded = tok.Decode(ids, /*skip_special_tokens=*/special);
    StreamingDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Add(id);
    streamed += stream.Flush();
    (void)decoded;
    (void)streamed;
  }
  // Ids from the input, in and out of range (HF skips the ones outside the vocabulary).
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 2 < text.size() && ids.size() < 256; i += 3) {
    const uint32_t v = static_cast<uint8_t>(text[i]) | static_cast<uint8_t>(text[i + 1]) << 8 |
                       static_cast<uint32_t>(static_cast<uint8_t>(text[i + 2])) << 16;
    ids.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(vocab + 16)) - 8);
  }
  (void)tok.Decode(ids);
  (void)tok.Decode(ids, /*skip_special_tokens=*/true);
  StreamingDecoder stream(tok, /*skip_special_tokens=*/true);
  for (int32_t id : ids) (void)stream.Add(id);
  (void)stream.Flush();
  for (int32_t id : ids) {
    (void)tok.IdToToken(id);
    (void)tok.IsSpecial(id);
  }
  return 0;
}

}  // namespace fathom::fuzz
