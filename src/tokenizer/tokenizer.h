// A Hugging Face `tokenizer.json` pipeline that encodes and decodes exactly like HF tokenizers:
// added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and decoders back. tokenizer_config.json
// supplies bos/eos/pad, add_bos_token/add_eos_token and the chat templates. Components that are not supported are
// refused by name when loading, never approximated.
//
//   FATHOM_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromDirectory("/models/DeepSeek-V3"));
//   std::vector<int32_t> ids = tok->Encode("Hello, world!");                          // no BOS
//   std::vector<int32_t> with_bos = tok->Encode(text, {.add_special_tokens = true});
//   std::string text = tok->Decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace fathom {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// What tokenizer_config.json says (all optional).
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // Named chat templates; a plain string template is stored under "default".
  std::vector<std::pair<std::string, std::string>> chat_templates;
};

// Finds added tokens in text, leftmost-longest, with HF's lstrip/rstrip/single_word rules.
class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin, end;  // byte range to replace by the token (includes stripped whitespace)
    const AddedToken* token;
  };
  explicit AddedTokenMatcher(std::vector<const AddedToken*> tokens);
  bool empty() const { return tokens_.empty(); }
  // Matches in `text`, in order; special tokens are ignored when `skip_special`.
  void Find(std::string_view text, bool skip_special, std::vector<Match>& matches) const;

 private:
  std::vector<const AddedToken*> tokens_;
  // First two bytes (or the single byte << 8 | 0x100 for one-byte tokens) -> candidates, longest first.
  std::unordered_map<uint32_t, std::vector<const AddedToken*>> by_prefix_;
  std::array<bool, 256> first_byte_{};
  std::vector<const AddedToken*> single_byte_[256];
};

class PostProcessor;

class Tokenizer {
 public:
  struct EncodeOptions {
    // Adds BOS/EOS as tokenizer_config.json's add_bos_token/add_eos_token say, or else as the post-processor says.
    bool add_special_tokens = false;
    // Treats special-token strings in the text as plain text.
    bool split_special_tokens = false;
  };

  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  // `config_json` may be empty.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json, std::string_view config_json);

  ~Tokenizer();

  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<int32_t> Encode(std::string_view text, EncodeOptions options) const;
  std::vector<int32_t> Encode(std::string_view text) const { return Encode(text, EncodeOptions{}); }

  // Ids outside the vocabulary are skipped, as HF does.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  // The bytes token `id` stands for on its own, before any UTF-8 repair (a token holding half of a character gives
  // that half); nullopt for special tokens and ids outside the vocabulary. Exact for byte-level vocabularies; for
  // others, <0xHH> byte tokens give their byte and U+2581 a space.
  std::optional<std::string> TokenBytes(int32_t id) const;
  // One past the largest id (model and added tokens).
  size_t vocab_size() const;

  const TokenizerConfig& config() const { return config_; }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  Tokenizer();
  Status Init(const nlohmann::json& json, std::unique_ptr<BpeModel> model);
  Status ApplyConfig(const nlohmann::json& config);
  void EncodeText(std::string_view text, size_t offset, bool split_special, std::vector<int32_t>& ids) const;
  void EncodeNormalized(std::string_view text, size_t offset, std::vector<int32_t>& ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  StringIdMap added_by_content_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;         // normalized == false
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;  // normalized == true
  TokenizerConfig config_;
  std::optional<int32_t> bos_id_, eos_id_;
  // When set (tokenizer_config.json has add_bos_token/add_eos_token), replaces the post-processor.
  std::optional<std::pair<std::vector<int32_t>, std::vector<int32_t>>> config_affixes_;
};

}  // namespace fathom
