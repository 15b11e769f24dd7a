#include "tokenizer/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tokenizer/pattern.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace fathom {
namespace {

class ByteLevelDecoder final : public Decoder {
 public:
  ByteLevelDecoder() {
    std::fill(std::begin(char_to_byte_), std::end(char_to_byte_), -1);
    const auto& alphabet = ByteLevelAlphabet();
    for (int b = 0; b < 256; ++b) char_to_byte_[alphabet[b]] = static_cast<unsigned char>(b);
  }
  // Each token maps back to bytes character by character; a token holding a character outside the byte alphabet
  // (an added token, say) contributes its UTF-8 bytes unchanged. The bytes of all tokens are then read as UTF-8,
  // invalid sequences becoming U+FFFD.
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& token : tokens) {
      token_bytes.clear();
      bool all = true;
      for (size_t i = 0; i < token.size();) {
        size_t len;
        const char32_t cp = DecodeUtf8(token, i, &len);
        i += len;
        if (cp < 0x200 && char_to_byte_[cp] >= 0) {
          token_bytes.push_back(static_cast<char>(char_to_byte_[cp]));
        } else {
          all = false;
          break;
        }
      }
      bytes += all ? token_bytes : token;
    }
    tokens.assign(1, Utf8Lossy(bytes));
  }
  // A token holding a character outside the byte alphabet (an added token) stands for its UTF-8, as above.
  std::optional<std::string> TokenBytes(const std::string& token) const override {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      size_t len;
      const char32_t cp = DecodeUtf8(token, i, &len);
      i += len;
      if (cp >= 0x200 || char_to_byte_[cp] < 0) return token;
      bytes.push_back(static_cast<char>(char_to_byte_[cp]));
    }
    return bytes;
  }

 private:
  int char_to_byte_[0x200];
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) token = RegexReplaceAll(*re_, token, content_);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

bool ParseByteToken(const std::string& token, unsigned char* byte) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return false;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<unsigned char>(hi * 16 + lo);
  return true;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  // Runs of <0xXX> tokens become the UTF-8 text they spell; a run that is not valid UTF-8 becomes one U+FFFD per
  // byte, as in HF.
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        std::string replacement;
        for (size_t i = 0; i < pending.size(); ++i) AppendUtf8(replacement, kReplacementChar);
        out.push_back(std::move(replacement));
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      unsigned char byte;
      if (ParseByteToken(token, &byte)) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
  std::optional<std::string> TokenBytes(const std::string& token) const override {
    unsigned char byte;
    if (!ParseByteToken(token, &byte)) return std::nullopt;
    return std::string(1, static_cast<char>(byte));
  }
};

class FuseDecoder final : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++i) {
        begin += content_.size();
      }
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  // As in HF: every replacement character becomes a space, except in the first token, where they are all dropped
  // unless the prepend scheme is "never".
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t pos = 0; pos < token.size();) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          if (i != 0 || !strip_first_) out += ' ';
          pos += replacement_.size();
        } else {
          out += token[pos++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& part : parts_) part->DecodeChain(tokens);
  }
  std::optional<std::string> TokenBytes(const std::string& token) const override {
    for (const auto& part : parts_) {
      if (auto bytes = part->TokenBytes(token)) return bytes;
    }
    return std::nullopt;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& json) {
  if (json.is_null()) return std::unique_ptr<Decoder>();
  if (!json.is_object() || !json.contains("type")) return InvalidArgumentError("decoder without a \"type\"");
  const std::string type = json.at("type").get<std::string>();
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Replace") {
    FATHOM_ASSIGN_OR_RETURN(auto re, ParsePattern(json.at("pattern")));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(re), json.at("content").get<std::string>()));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    const std::string content = json.at("content").get<std::string>();
    // HF's content is one character: an empty one would strip forever without moving.
    if (content.empty()) return InvalidArgumentError("the Strip decoder's content must not be empty");
    return std::unique_ptr<Decoder>(
        new StripDecoder(content, json.value("start", size_t{0}), json.value("stop", size_t{0})));
  }
  if (type == "Metaspace") {
    bool strip_first = true;
    if (json.contains("prepend_scheme")) {
      strip_first = json.at("prepend_scheme").get<std::string>() != "never";
    } else if (json.contains("add_prefix_space")) {
      strip_first = json.at("add_prefix_space").get<bool>();
    }
    const std::string replacement = json.value("replacement", std::string("\xE2\x96\x81"));
    FATHOM_RETURN_IF_ERROR(CheckMetaspaceReplacement(replacement));
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(replacement, strip_first));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& item : json.at("decoders")) {
      FATHOM_ASSIGN_OR_RETURN(auto part, ParseDecoder(item));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  return UnimplementedError(fmt::format("unsupported decoder type \"{}\"", type));
}

}  // namespace fathom
