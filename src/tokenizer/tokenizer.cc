#include "tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json.h"
#include "tokenizer/utf8.h"

namespace fathom {

// The post-processor reduced to what a single sequence needs: ids before and after it. Pair templates are parsed
// for validation only.
class PostProcessor {
 public:
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

namespace {

// The largest token id a tokenizer.json may use (the ids of the largest real vocabularies are under 2^18).
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("cannot open {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLossError(fmt::format("cannot read {}", path));
  return ss.str();
}

// SAX handler that streams model.vocab and model.merges straight into the BPE tables (the two make up almost all of
// a tokenizer.json) and builds an ordinary DOM for everything else, with those two keys set to null. This halves the
// load time of a 128k-token vocabulary compared with a full DOM parse.
class TokenizerJsonSax {
 public:
  using Json = nlohmann::json;
  explicit TokenizerJsonSax(Json& root) : dom_(root, false) {}

  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::string error;

  bool null() { return Capturing() ? CaptureScalar() : dom_.null(); }
  bool boolean(bool v) { return Capturing() ? CaptureScalar() : dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) {
    if (capture_ == Capture::kVocab && capture_depth_ == 1) return AddVocab(v);
    return Capturing() ? CaptureScalar() : dom_.number_integer(v);
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (capture_ == Capture::kVocab && capture_depth_ == 1) return AddVocab(static_cast<int64_t>(v));
    return Capturing() ? CaptureScalar() : dom_.number_unsigned(v);
  }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return Capturing() ? CaptureScalar() : dom_.number_float(v, s);
  }
  bool string(Json::string_t& s) {
    if (capture_ == Capture::kMerges) {
      if (capture_depth_ == 1) {  // "a b"
        const size_t space = s.find(' ', 1);
        if (space == std::string::npos) return Fail(fmt::format("malformed merge \"{}\"", s));
        merges.emplace_back(s.substr(0, space), s.substr(space + 1));
        return true;
      }
      if (capture_depth_ == 2) {  // ["a", "b"]
        pair_parts_.push_back(std::move(s));
        return true;
      }
      return Fail("malformed merges");
    }
    if (capture_ == Capture::kVocab) return Fail("vocab values must be integers");
    return dom_.string(s);
  }
  bool binary(Json::binary_t& b) { return Capturing() ? CaptureScalar() : dom_.binary(b); }
  bool start_object(std::size_t n) {
    if (Capturing()) {
      if (capture_ == Capture::kVocab && capture_depth_ == 0) {
        capture_depth_ = 1;
        return true;
      }
      return Fail(capture_ == Capture::kVocab ? "vocab must be an object of integers" : "malformed merges");
    }
    path_.push_back(pending_key_);
    return dom_.start_object(n);
  }
  bool key(Json::string_t& k) {
    if (capture_ == Capture::kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    if (Capturing()) return Fail("malformed merges");
    pending_key_ = k;
    // path_ = ["", "model"] inside the model object.
    if (path_.size() == 2 && path_[1] == "model" && (k == "vocab" || k == "merges")) {
      if (!dom_.key(k) || !dom_.null()) return false;
      capture_ = k == "vocab" ? Capture::kVocab : Capture::kMerges;
      capture_depth_ = 0;
      return true;
    }
    return dom_.key(k);
  }
  bool end_object() {
    if (Capturing()) {
      if (capture_ == Capture::kVocab && capture_depth_ == 1) {
        capture_ = Capture::kNone;
        return true;
      }
      return Fail("malformed vocab");
    }
    path_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (Capturing()) {
      if (capture_ == Capture::kMerges && capture_depth_ <= 1) {
        ++capture_depth_;
        pair_parts_.clear();
        return true;
      }
      return Fail(capture_ == Capture::kVocab ? "vocab must be an object of integers" : "malformed merges");
    }
    path_.push_back(pending_key_);
    return dom_.start_array(n);
  }
  bool end_array() {
    if (Capturing()) {
      if (capture_ == Capture::kMerges && capture_depth_ == 2) {
        if (pair_parts_.size() != 2) return Fail("a merge must be a pair of strings");
        merges.emplace_back(std::move(pair_parts_[0]), std::move(pair_parts_[1]));
        capture_depth_ = 1;
        return true;
      }
      if (capture_ == Capture::kMerges && capture_depth_ == 1) {
        capture_ = Capture::kNone;
        return true;
      }
      return Fail("malformed merges");
    }
    path_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& ex) {
    error = fmt::format("JSON parse error at byte {} near '{}': {}", position, token, ex.what());
    return false;
  }

 private:
  enum class Capture { kNone, kVocab, kMerges };
  bool Capturing() const { return capture_ != Capture::kNone; }
  bool CaptureScalar() {
    return Fail(capture_ == Capture::kVocab ? "vocab values must be integers" : "malformed merges");
  }
  bool Fail(std::string message) {
    error = std::move(message);
    return false;
  }
  bool AddVocab(int64_t id) {
    // Ids index tables sized by the largest one: a bound keeps a hostile file from asking for gigabytes.
    if (id < 0 || id >= kMaxTokenId) return Fail(fmt::format("vocab id {} out of range [0, {})", id, kMaxTokenId));
    vocab.emplace_back(std::move(vocab_key_), static_cast<int32_t>(id));
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  std::vector<std::string> path_;
  std::string pending_key_;
  Capture capture_ = Capture::kNone;
  int capture_depth_ = 0;
  std::string vocab_key_;
  std::vector<std::string> pair_parts_;
};

// A strict, fast JSON reader that drives a nlohmann-style SAX handler. nlohmann's own lexer reads one character at
// a time through an input adapter and takes ~100 ms for a 128k-token tokenizer.json; this one copies plain string
// runs in bulk, which keeps the whole load well under the 300 ms budget.
template <typename Handler>
class FastJsonReader {
 public:
  FastJsonReader(std::string_view text, Handler& handler)
      : p_(text.data()), end_(text.data() + text.size()), begin_(text.data()), handler_(handler) {}

  // Returns false on a syntax error (error() says where) or when the handler stopped.
  bool Parse() {
    SkipSpace();
    if (!Value(0)) return false;
    SkipSpace();
    if (p_ != end_) return Error("trailing characters after the JSON value");
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  bool Error(const char* what) {
    if (error_.empty()) error_ = fmt::format("JSON syntax error at byte {}: {}", p_ - begin_, what);
    return false;
  }
  void SkipSpace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool Literal(const char* word, size_t n) {
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return Error("invalid literal");
    p_ += n;
    return true;
  }
  static int Hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool Hex4(uint32_t* out) {
    if (end_ - p_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = Hex(p_[i]);
      if (h < 0) return Error("invalid \\u escape");
      v = v * 16 + static_cast<uint32_t>(h);
    }
    p_ += 4;
    *out = v;
    return true;
  }
  // p_ is just after the opening quote.
  bool String(std::string& out) {
    out.clear();
    while (true) {
      const char* run = p_;
      while (p_ < end_ && *p_ != '"' && *p_ != '\\' && static_cast<unsigned char>(*p_) >= 0x20) ++p_;
      out.append(run, static_cast<size_t>(p_ - run));
      if (p_ >= end_) return Error("unterminated string");
      if (*p_ == '"') {
        ++p_;
        return true;
      }
      if (*p_ != '\\') return Error("control character in string");
      if (++p_ >= end_) return Error("unterminated string");
      const char e = *p_++;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo = 0;
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return Error("unpaired surrogate");
            p_ += 2;
            if (!Hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error("unpaired surrogate");
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Error("invalid escape");
      }
    }
  }
  bool Number() {
    const char* start = p_;
    bool is_float = false;
    if (p_ < end_ && *p_ == '-') ++p_;
    while (p_ < end_ &&
           ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E' || *p_ == '+' || *p_ == '-')) {
      is_float |= *p_ == '.' || *p_ == 'e' || *p_ == 'E';
      ++p_;
    }
    if (p_ == start) return Error("invalid value");
    if (!is_float) {
      if (*start == '-') {
        int64_t v;
        const auto r = std::from_chars(start, p_, v);
        if (r.ec == std::errc() && r.ptr == p_) return handler_.number_integer(v);
      } else {
        uint64_t v;
        const auto r = std::from_chars(start, p_, v);
        if (r.ec == std::errc() && r.ptr == p_) return handler_.number_unsigned(v);
      }
    }
    double d;
    const auto r = std::from_chars(start, p_, d);
    if (r.ec != std::errc() || r.ptr != p_) return Error("invalid number");
    std::string lexeme(start, p_);
    return handler_.number_float(d, lexeme);
  }
  bool Value(int depth) {
    if (depth > 512) return Error("nesting too deep");
    if (p_ >= end_) return Error("unexpected end of input");
    switch (*p_) {
      case '{': {
        ++p_;
        if (!handler_.start_object(static_cast<size_t>(-1))) return false;
        SkipSpace();
        if (p_ < end_ && *p_ == '}') {
          ++p_;
          return handler_.end_object();
        }
        while (true) {
          if (p_ >= end_ || *p_ != '"') return Error("expected a key");
          ++p_;
          if (!String(scratch_) || !handler_.key(scratch_)) return false;
          SkipSpace();
          if (p_ >= end_ || *p_ != ':') return Error("expected ':'");
          ++p_;
          SkipSpace();
          if (!Value(depth + 1)) return false;
          SkipSpace();
          if (p_ < end_ && *p_ == ',') {
            ++p_;
            SkipSpace();
            continue;
          }
          if (p_ < end_ && *p_ == '}') {
            ++p_;
            return handler_.end_object();
          }
          return Error("expected ',' or '}'");
        }
      }
      case '[': {
        ++p_;
        if (!handler_.start_array(static_cast<size_t>(-1))) return false;
        SkipSpace();
        if (p_ < end_ && *p_ == ']') {
          ++p_;
          return handler_.end_array();
        }
        while (true) {
          if (!Value(depth + 1)) return false;
          SkipSpace();
          if (p_ < end_ && *p_ == ',') {
            ++p_;
            SkipSpace();
            continue;
          }
          if (p_ < end_ && *p_ == ']') {
            ++p_;
            return handler_.end_array();
          }
          return Error("expected ',' or ']'");
        }
      }
      case '"':
        ++p_;
        return String(scratch_) && handler_.string(scratch_);
      case 't':
        return Literal("true", 4) && handler_.boolean(true);
      case 'f':
        return Literal("false", 5) && handler_.boolean(false);
      case 'n':
        return Literal("null", 4) && handler_.null();
      default:
        return Number();
    }
  }

  const char* p_;
  const char* end_;
  const char* begin_;
  Handler& handler_;
  std::string scratch_;
  std::string error_;
};

// A special token of tokenizer_config.json: a string or an AddedToken object {"content": ...}.
std::optional<std::string> ConfigToken(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const auto& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

bool IsWordChar(char32_t cp) {
  if (cp == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// The code point that ends just before `pos`.
char32_t PreviousChar(std::string_view text, size_t pos, size_t* start) {
  size_t s = pos - 1;
  while (s > 0 && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
  size_t len;
  *start = s;
  return DecodeUtf8(text, s, &len);
}

Status ParsePostProcessor(const nlohmann::json& json, const Tokenizer& tok, PostProcessor& out) {
  if (json.is_null()) return OkStatus();
  const std::string type = json.value("type", std::string());
  if (type == "ByteLevel") return OkStatus();  // only adjusts offsets
  if (type == "Sequence") {
    for (const auto& item : json.at("processors")) FATHOM_RETURN_IF_ERROR(ParsePostProcessor(item, tok, out));
    return OkStatus();
  }
  if (type == "TemplateProcessing") {
    const auto& specials = json.value("special_tokens", nlohmann::json::object());
    bool seen_sequence = false;
    for (const auto& piece : json.at("single")) {
      if (piece.contains("Sequence")) {
        if (piece.at("Sequence").value("id", std::string("A")) != "A") {
          return UnimplementedError("TemplateProcessing: the single template may only use sequence A");
        }
        seen_sequence = true;
        continue;
      }
      if (!piece.contains("SpecialToken")) return InvalidArgumentError("TemplateProcessing: unknown template piece");
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      std::vector<int32_t> ids;
      if (specials.contains(name)) {
        for (const auto& id : specials.at(name).at("ids")) {
          // An id the vocabulary lacks would reach the model as an out-of-range token (found by fuzz_tokenizer).
          const int64_t vocab = static_cast<int64_t>(tok.vocab_size());
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
            return InvalidArgumentError(fmt::format("TemplateProcessing: special token '{}' has id {}, not a token "
                                                    "of the vocabulary [0, {})", name, JsonText(id), vocab));
          }
          ids.push_back(id.get<int32_t>());
        }
      } else if (auto id = tok.TokenToId(name)) {
        ids.push_back(*id);
      } else {
        return InvalidArgumentError(fmt::format("TemplateProcessing: unknown special token \"{}\"", name));
      }
      auto& target = seen_sequence ? out.suffix : out.prefix;
      target.insert(target.end(), ids.begin(), ids.end());
    }
    return OkStatus();
  }
  return UnimplementedError(fmt::format("unsupported post_processor type \"{}\"", type));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// AddedTokenMatcher

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens) : tokens_(std::move(tokens)) {
  for (const AddedToken* t : tokens_) {
    if (t->content.empty()) continue;
    const auto b0 = static_cast<unsigned char>(t->content[0]);
    first_byte_[b0] = true;
    if (t->content.size() == 1) {
      single_byte_[b0].push_back(t);
    } else {
      by_prefix_[(uint32_t{b0} << 8) | static_cast<unsigned char>(t->content[1])].push_back(t);
    }
  }
  for (auto& [key, list] : by_prefix_) {
    std::stable_sort(list.begin(), list.end(),
                     [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  }
}

void AddedTokenMatcher::Find(std::string_view text, bool skip_special, std::vector<Match>& matches) const {
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[pos]);
    if (!first_byte_[b0]) {
      ++pos;
      continue;
    }
    // Leftmost-longest: the longest token starting here.
    const AddedToken* found = nullptr;
    if (pos + 1 < text.size()) {
      const auto it = by_prefix_.find((uint32_t{b0} << 8) | static_cast<unsigned char>(text[pos + 1]));
      if (it != by_prefix_.end()) {
        for (const AddedToken* t : it->second) {
          if (text.compare(pos, t->content.size(), t->content) == 0) {
            found = t;
            break;
          }
        }
      }
    }
    if (found == nullptr && !single_byte_[b0].empty()) found = single_byte_[b0].front();
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + found->content.size();
    pos = end;
    if (skip_special && found->special) continue;
    if (found->single_word) {
      size_t ignored;
      const bool word_before = begin > 0 && IsWordChar(PreviousChar(text, begin, &ignored));
      size_t len;
      const bool word_after = end < text.size() && IsWordChar(DecodeUtf8(text, end, &len));
      if (word_before || word_after) continue;
    }
    if (found->lstrip) {
      size_t s = begin;
      while (s > start_offset) {
        size_t prev;
        if (!IsUnicodeWhitespace(PreviousChar(text, s, &prev))) break;
        s = prev;
      }
      begin = std::max(s, start_offset);
    }
    if (found->rstrip) {
      while (end < text.size()) {
        size_t len;
        if (!IsUnicodeWhitespace(DecodeUtf8(text, end, &len))) break;
        end += len;
      }
      pos = end;
    }
    matches.push_back({begin, end, found});
    start_offset = end;
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  FATHOM_ASSIGN_OR_RETURN(std::string json, ReadFile(dir + "/tokenizer.json"));
  std::string config;
  if (std::ifstream(dir + "/tokenizer_config.json")) {
    FATHOM_ASSIGN_OR_RETURN(config, ReadFile(dir + "/tokenizer_config.json"));
  }
  auto tok = FromJson(json, config);
  if (!tok.ok()) return tok.status().WithContext(dir);
  return tok;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                         std::string_view config_json) {
  nlohmann::json root;
  TokenizerJsonSax sax(root);
  FastJsonReader<TokenizerJsonSax> reader(tokenizer_json, sax);
  if (!reader.Parse()) {
    return InvalidArgumentError(fmt::format("tokenizer.json: {}", sax.error.empty() ? reader.error() : sax.error));
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  try {
    const auto& model = root.at("model");
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") return UnimplementedError(fmt::format("tokenizer.json: unsupported model type \"{}\"", type));
    if (!model.value("dropout", nlohmann::json()).is_null() && model.at("dropout").get<double>() != 0.0) {
      return UnimplementedError("tokenizer.json: BPE dropout is not supported");
    }
    BpeModel::Options options;
    options.byte_fallback = model.value("byte_fallback", false);
    options.ignore_merges = model.value("ignore_merges", false);
    options.fuse_unk = model.value("fuse_unk", false);
    if (model.contains("unk_token") && model.at("unk_token").is_string()) {
      options.unk_token = model.at("unk_token").get<std::string>();
    }
    if (model.contains("continuing_subword_prefix") && model.at("continuing_subword_prefix").is_string()) {
      options.continuing_subword_prefix = model.at("continuing_subword_prefix").get<std::string>();
    }
    if (model.contains("end_of_word_suffix") && model.at("end_of_word_suffix").is_string()) {
      options.end_of_word_suffix = model.at("end_of_word_suffix").get<std::string>();
    }
    FATHOM_ASSIGN_OR_RETURN(auto bpe, BpeModel::Create(std::move(sax.vocab), sax.merges, std::move(options)));
    FATHOM_RETURN_IF_ERROR(tok->Init(root, std::move(bpe)).WithContext("tokenizer.json"));
    if (!config_json.empty()) {
      const auto config = nlohmann::json::parse(config_json, nullptr, false);
      if (config.is_discarded()) return InvalidArgumentError("tokenizer_config.json: invalid JSON");
      FATHOM_RETURN_IF_ERROR(tok->ApplyConfig(config).WithContext("tokenizer_config.json"));
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(fmt::format("malformed tokenizer: {}", e.what()));
  }
  return tok;
}

Status Tokenizer::Init(const nlohmann::json& json, std::unique_ptr<BpeModel> model) {
  model_ = std::move(model);
  FATHOM_ASSIGN_OR_RETURN(normalizer_, ParseNormalizer(json.value("normalizer", nlohmann::json())));
  FATHOM_ASSIGN_OR_RETURN(pre_tokenizer_, ParsePreTokenizer(json.value("pre_tokenizer", nlohmann::json())));
  FATHOM_ASSIGN_OR_RETURN(decoder_, ParseDecoder(json.value("decoder", nlohmann::json())));
  if (json.contains("truncation") && !json.at("truncation").is_null()) {
    return UnimplementedError("truncation is not supported");
  }
  if (json.contains("padding") && !json.at("padding").is_null()) return UnimplementedError("padding is not supported");

  for (const auto& item : json.value("added_tokens", nlohmann::json::array())) {
    AddedToken t;
    t.content = item.at("content").get<std::string>();
    const auto& id = item.at("id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId) {
      return InvalidArgumentError(fmt::format("added token \"{}\" has id {}, outside [0, {})", t.content, JsonText(id),
                                              kMaxTokenId));
    }
    if (t.content.empty()) return InvalidArgumentError(fmt::format("added token {} has no content", id.get<int64_t>()));
    t.id = id.get<int32_t>();
    t.special = item.value("special", false);
    t.lstrip = item.value("lstrip", false);
    t.rstrip = item.value("rstrip", false);
    t.single_word = item.value("single_word", false);
    t.normalized = item.value("normalized", !t.special);
    added_tokens_.push_back(std::move(t));
  }
  std::vector<const AddedToken*> raw, normalized;
  for (size_t i = 0; i < added_tokens_.size(); ++i) {
    const AddedToken& t = added_tokens_[i];
    added_by_id_[t.id] = i;
    added_by_content_[t.content] = t.id;
    (t.normalized ? normalized : raw).push_back(&t);
  }
  raw_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  normalized_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));

  post_processor_ = std::make_unique<PostProcessor>();
  return ParsePostProcessor(json.value("post_processor", nlohmann::json()), *this, *post_processor_);
}

Status Tokenizer::ApplyConfig(const nlohmann::json& config) {
  config_.bos_token = ConfigToken(config, "bos_token");
  config_.eos_token = ConfigToken(config, "eos_token");
  config_.pad_token = ConfigToken(config, "pad_token");
  config_.unk_token = ConfigToken(config, "unk_token");
  if (config.contains("add_bos_token") && config.at("add_bos_token").is_boolean()) {
    config_.add_bos_token = config.at("add_bos_token").get<bool>();
  }
  if (config.contains("add_eos_token") && config.at("add_eos_token").is_boolean()) {
    config_.add_eos_token = config.at("add_eos_token").get<bool>();
  }
  if (config.contains("chat_template")) {
    const auto& t = config.at("chat_template");
    if (t.is_string()) {
      config_.chat_templates.emplace_back("default", t.get<std::string>());
    } else if (t.is_array()) {
      for (const auto& item : t) {
        config_.chat_templates.emplace_back(item.at("name").get<std::string>(), item.at("template").get<std::string>());
      }
    } else if (!t.is_null()) {
      return InvalidArgumentError("chat_template must be a string or a list of {name, template}");
    }
  }
  if (config_.bos_token) {
    bos_id_ = TokenToId(*config_.bos_token);
    if (!bos_id_)
      return InvalidArgumentError(fmt::format("bos_token \"{}\" is not in the vocabulary", *config_.bos_token));
  }
  if (config_.eos_token) {
    eos_id_ = TokenToId(*config_.eos_token);
    if (!eos_id_)
      return InvalidArgumentError(fmt::format("eos_token \"{}\" is not in the vocabulary", *config_.eos_token));
  }
  // Like transformers, explicit add_bos_token/add_eos_token replace the tokenizer.json post-processor.
  if (config_.add_bos_token || config_.add_eos_token) {
    std::vector<int32_t> prefix, suffix;
    if (config_.add_bos_token.value_or(false)) {
      if (!bos_id_) return InvalidArgumentError("add_bos_token is set but there is no bos_token");
      prefix.push_back(*bos_id_);
    }
    if (config_.add_eos_token.value_or(false)) {
      if (!eos_id_) return InvalidArgumentError("add_eos_token is set but there is no eos_token");
      suffix.push_back(*eos_id_);
    }
    config_affixes_.emplace(std::move(prefix), std::move(suffix));
  }
  return OkStatus();
}

void Tokenizer::EncodeNormalized(std::string_view text, size_t offset, std::vector<int32_t>& ids) const {
  thread_local std::vector<PreToken> pieces;
  pieces.clear();
  pieces.push_back({std::string(text), offset});
  if (pre_tokenizer_) pre_tokenizer_->PreTokenize(pieces);
  for (const PreToken& piece : pieces) model_->Tokenize(piece.text, ids);
}

void Tokenizer::EncodeText(std::string_view text, size_t offset, bool split_special, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::string normalized_storage;
  std::string_view normalized = text;
  if (normalizer_) {
    normalized_storage.assign(text);
    normalizer_->Normalize(normalized_storage);
    normalized = normalized_storage;
  }
  if (normalized_matcher_->empty()) {
    EncodeNormalized(normalized, offset, ids);
    return;
  }
  std::vector<AddedTokenMatcher::Match> matches;
  normalized_matcher_->Find(normalized, split_special, matches);
  size_t last = 0;
  for (const auto& m : matches) {
    if (m.begin > last) EncodeNormalized(normalized.substr(last, m.begin - last), offset + last, ids);
    ids.push_back(m.token->id);
    last = m.end;
  }
  if (last < normalized.size()) EncodeNormalized(normalized.substr(last), offset + last, ids);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, EncodeOptions options) const {
  std::string sanitized;
  if (!IsValidUtf8(text)) {
    sanitized = Utf8Lossy(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) {
    const auto& prefix = config_affixes_ ? config_affixes_->first : post_processor_->prefix;
    ids.insert(ids.end(), prefix.begin(), prefix.end());
  }
  std::vector<AddedTokenMatcher::Match> matches;
  raw_matcher_->Find(text, options.split_special_tokens, matches);
  size_t last = 0;
  for (const auto& m : matches) {
    if (m.begin > last) EncodeText(text.substr(last, m.begin - last), last, options.split_special_tokens, ids);
    ids.push_back(m.token->id);
    last = m.end;
  }
  if (last < text.size()) EncodeText(text.substr(last), last, options.split_special_tokens, ids);
  if (options.add_special_tokens) {
    const auto& suffix = config_affixes_ ? config_affixes_->second : post_processor_->suffix;
    ids.insert(ids.end(), suffix.begin(), suffix.end());
  }
  return ids;
}

std::optional<std::string> Tokenizer::TokenBytes(int32_t id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    const AddedToken& t = added_tokens_[it->second];
    if (t.special) return std::nullopt;
    return t.content;
  }
  const std::string* token = model_->IdToToken(id);
  if (token == nullptr) return std::nullopt;
  if (decoder_) {
    if (std::optional<std::string> bytes = decoder_->TokenBytes(*token)) return bytes;
  }
  std::string out;
  for (size_t i = 0; i < token->size(); ++i) {
    if (token->compare(i, 3, "\xE2\x96\x81") == 0) {
      out.push_back(' ');
      i += 2;
    } else {
      out.push_back((*token)[i]);
    }
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) {
      const AddedToken& t = added_tokens_[it->second];
      if (skip_special_tokens && t.special) continue;
      tokens.push_back(t.content);
      continue;
    }
    if (const std::string* token = model_->IdToToken(id)) tokens.push_back(*token);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  decoder_->DecodeChain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  const auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return added_tokens_[it->second].content;
  if (const std::string* token = model_->IdToToken(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_tokens_[it->second].special;
}

size_t Tokenizer::vocab_size() const {
  size_t n = model_->vocab_size();
  for (const AddedToken& t : added_tokens_) n = std::max(n, static_cast<size_t>(t.id) + 1);
  return n;
}

}  // namespace fathom
