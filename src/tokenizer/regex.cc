#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

namespace fathom {
namespace {

// Per-thread match data and JIT stack, so that FindAll allocates nothing in the common case.
struct ThreadMatchState {
  ThreadMatchState() {
    match_data = pcre2_match_data_create(32, nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(match_context);
    pcre2_jit_stack_free(jit_stack);
  }
  pcre2_match_data* match_data;
  pcre2_jit_stack* jit_stack;
  pcre2_match_context* match_context;
};

ThreadMatchState& State() {
  thread_local ThreadMatchState state;
  return state;
}

// Oniguruma (used by HF tokenizers) counts U+0085 as \s; PCRE2 with UCP does not. Rewrite \s and \S so that the
// two agree on every code point.
std::string TranslatePattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  std::unique_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  const std::string translated = TranslatePattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    return InvalidArgumentError(fmt::format("cannot compile regex '{}' at offset {}: {}", pattern, error_offset,
                                            reinterpret_cast<const char*>(buffer)));
  }
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

std::string Regex::Escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == 0) {
        out += "\\x{0}";
      } else {
        out += '\\';
        out += c;
      }
    } else {
      out += c;
    }
  }
  return out;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& state = State();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset <= text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), offset, 0, state.match_data, state.match_context)
                        : pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, state.match_data,
                                      state.match_context);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit: stop matching
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: skip one character.
      if (begin >= text.size()) break;
      offset = begin + 1;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
}

}  // namespace fathom
