#include "tokenizer/pre_tokenizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include "tokenizer/pattern.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace fathom {
namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

void EmitRanges(const PreToken& piece, const Ranges& ranges, std::vector<PreToken>& out) {
  if (ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == piece.text.size()) {
    out.push_back(piece);
    return;
  }
  for (auto [begin, end] : ranges) out.push_back({piece.text.substr(begin, end - begin), piece.offset + begin});
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, SplitBehavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}

  void PreTokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces.size() * 4);
    Ranges matches;
    for (const PreToken& piece : pieces) {
      matches.clear();
      re_->FindAll(piece.text, matches);
      EmitRanges(piece, SplitByMatches(piece.text.size(), matches, behavior_, invert_), out);
    }
    pieces = std::move(out);
  }

 private:
  std::unique_ptr<Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}

  void PreTokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> split;
    Ranges matches;
    for (PreToken& piece : pieces) {
      if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) piece.text.insert(0, " ");
      if (re_) {
        matches.clear();
        re_->FindAll(piece.text, matches);
        EmitRanges(piece, SplitByMatches(piece.text.size(), matches, SplitBehavior::kIsolated, false), split);
      } else if (!piece.text.empty()) {
        split.push_back(std::move(piece));
      }
    }
    const auto& table = ByteLevelAlphabetUtf8();
    for (PreToken& piece : split) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (char c : piece.text) mapped += table[static_cast<unsigned char>(c)];
      piece.text = std::move(mapped);
    }
    pieces = std::move(split);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}

  void PreTokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    for (const PreToken& piece : pieces) {
      std::string text;
      text.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text += c;
        }
      }
      const bool starts_with_replacement = text.compare(0, replacement_.size(), replacement_) == 0;
      const bool prepend = !starts_with_replacement && (scheme_ == PrependScheme::kAlways ||
                                                        (scheme_ == PrependScheme::kFirst && piece.offset == 0));
      if (prepend) text.insert(0, replacement_);
      if (!split_) {
        if (!text.empty()) out.push_back({std::move(text), piece.offset});
        continue;
      }
      Ranges matches;
      for (size_t pos = text.find(replacement_); pos != std::string::npos;
           pos = text.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      EmitRanges({text, piece.offset}, SplitByMatches(text.size(), matches, SplitBehavior::kMergedWithNext, false),
                 out);
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

bool IsNumeric(char32_t cp) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL || category == UTF8PROC_CATEGORY_NO;
}

class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}

  void PreTokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    Ranges matches;
    for (const PreToken& piece : pieces) {
      matches.clear();
      for (size_t i = 0; i < piece.text.size();) {
        size_t len;
        const char32_t cp = DecodeUtf8(piece.text, i, &len);
        if (IsNumeric(cp)) matches.emplace_back(i, i + len);
        i += len;
      }
      EmitRanges(piece,
                 SplitByMatches(piece.text.size(), matches,
                                individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false),
                 out);
    }
    pieces = std::move(out);
  }

 private:
  bool individual_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& part : parts_) part->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

StatusOr<SplitBehavior> ParseSplitBehavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return UnimplementedError(fmt::format("unsupported split behavior \"{}\"", name));
}

std::vector<std::pair<size_t, size_t>> SplitByMatches(size_t size,
                                                      const std::vector<std::pair<size_t, size_t>>& matches,
                                                      SplitBehavior behavior, bool invert) {
  // Cover [0, size) with alternating gaps and matches, as HF's find_matches does.
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t last = 0;
  for (auto [begin, end] : matches) {
    if (begin > last) parts.push_back({last, begin, invert});
    parts.push_back({begin, end, !invert});
    last = end;
  }
  if (last < size || parts.empty()) parts.push_back({last, size, invert});

  std::vector<Part> merged;
  merged.reserve(parts.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      merged = std::move(parts);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) merged.push_back(p);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  ranges.reserve(merged.size());
  for (const Part& p : merged) {
    if (p.end > p.begin) ranges.emplace_back(p.begin, p.end);
  }
  return ranges;
}

const std::array<char32_t, 256>& ByteLevelAlphabet() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

const std::array<std::string, 256>& ByteLevelAlphabetUtf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) AppendUtf8(t[b], ByteLevelAlphabet()[b]);
    return t;
  }();
  return table;
}

Status CheckMetaspaceReplacement(std::string_view r) {
  size_t len = 0;
  if (r.empty() || (DecodeUtf8(r, 0, &len), len != r.size()) || !IsValidUtf8(r)) {
    return InvalidArgumentError(
        fmt::format("Metaspace replacement \"{}\" must be exactly one character", Utf8Lossy(std::string(r))));
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& json) {
  if (json.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!json.is_object() || !json.contains("type")) return InvalidArgumentError("pre_tokenizer without a \"type\"");
  const std::string type = json.at("type").get<std::string>();
  if (type == "Split") {
    FATHOM_ASSIGN_OR_RETURN(auto re, ParsePattern(json.at("pattern")));
    FATHOM_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseSplitBehavior(json.at("behavior").get<std::string>()));
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(re), behavior, json.value("invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> re;
    if (json.value("use_regex", true)) {
      FATHOM_ASSIGN_OR_RETURN(re, Regex::Compile(kGpt2Pattern));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(json.value("add_prefix_space", true), std::move(re)));
  }
  if (type == "Metaspace") {
    PrependScheme scheme = PrependScheme::kAlways;
    if (json.contains("prepend_scheme")) {
      const std::string name = json.at("prepend_scheme").get<std::string>();
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return UnimplementedError(fmt::format("unsupported Metaspace prepend_scheme \"{}\"", name));
      }
    } else if (json.contains("add_prefix_space")) {
      scheme = json.at("add_prefix_space").get<bool>() ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    const std::string replacement = json.value("replacement", std::string("\xE2\x96\x81"));
    FATHOM_RETURN_IF_ERROR(CheckMetaspaceReplacement(replacement));
    return std::unique_ptr<PreTokenizer>(new MetaspacePreTokenizer(replacement, scheme, json.value("split", true)));
  }
  if (type == "Digits") {
    return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(json.value("individual_digits", false)));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& item : json.at("pretokenizers")) {
      FATHOM_ASSIGN_OR_RETURN(auto part, ParsePreTokenizer(item));
      if (part) parts.push_back(std::move(part));
    }
    if (parts.empty()) return std::unique_ptr<PreTokenizer>();
    if (parts.size() == 1) return std::move(parts[0]);
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  return UnimplementedError(fmt::format("unsupported pre_tokenizer type \"{}\"", type));
}

}  // namespace fathom
