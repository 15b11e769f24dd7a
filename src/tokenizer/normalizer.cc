#include "tokenizer/normalizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace fathom {
namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  void Normalize(std::string& text) const override {
    if (text.empty()) return;
    // Pure ASCII is invariant under every normalization form.
    bool ascii = true;
    for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return;
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                     &result, static_cast<utf8proc_option_t>(options_));
    if (n >= 0) text.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }

 private:
  int options_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void Normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      size_t len;
      const char32_t cp = DecodeUtf8(text, i, &len);
      AppendUtf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
      i += len;
    }
    text = std::move(out);
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  void Normalize(std::string& text) const override { text = RegexReplaceAll(*re_, text, content_); }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void Normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t len;
        if (!IsUnicodeWhitespace(DecodeUtf8(text, begin, &len))) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t len;
        if (!IsUnicodeWhitespace(DecodeUtf8(text, start, &len))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void Normalize(std::string& text) const override {
    for (const auto& part : parts_) part->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& json) {
  if (json.is_null()) return std::unique_ptr<Normalizer>();
  if (!json.is_object() || !json.contains("type")) return InvalidArgumentError("normalizer without a \"type\"");
  const std::string type = json.at("type").get<std::string>();
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  if (type == "NFKC") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Replace") {
    FATHOM_ASSIGN_OR_RETURN(auto re, ParsePattern(json.at("pattern")));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(re), json.at("content").get<std::string>()));
  }
  if (type == "Prepend")
    return std::unique_ptr<Normalizer>(new PrependNormalizer(json.at("prepend").get<std::string>()));
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(json.value("strip_left", true), json.value("strip_right", true)));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& item : json.at("normalizers")) {
      FATHOM_ASSIGN_OR_RETURN(auto part, ParseNormalizer(item));
      if (part) parts.push_back(std::move(part));
    }
    if (parts.empty()) return std::unique_ptr<Normalizer>();
    if (parts.size() == 1) return std::move(parts[0]);
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return UnimplementedError(fmt::format("unsupported normalizer type \"{}\"", type));
}

}  // namespace fathom
