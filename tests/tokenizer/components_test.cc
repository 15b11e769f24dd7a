// Unit tests for each component of the tokenizer pipeline, on small tokenizers built inside the tests (including a
// SentencePiece-style BPE with byte fallback, as Llama-2 and Gemma use).
#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "tests_tokenizer_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fathom {
namespace {

using nlohmann::json;
using Ranges = std::vector<std::pair<size_t, size_t>>;

// ----------------------------------------------------------------------------------------------------------- UTF-8

TEST(Utf8Test, LossyReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(Utf8Lossy("abc"), "abc");
  EXPECT_EQ(Utf8Lossy("a\xE2\x82"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");                                                // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(Utf8Lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // two invalid bytes: two U+FFFD
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");          // truncated emoji at the end
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: each byte
}

TEST(Utf8Test, CompletePrefixDropsOnlyAnIncompleteTail) {
  EXPECT_EQ(CompleteUtf8PrefixLength("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(CompleteUtf8PrefixLength("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(CompleteUtf8PrefixLength("ab\xC3"), 2u);
  EXPECT_EQ(CompleteUtf8PrefixLength("ab\xFF"), 3u);  // invalid, not incomplete
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo"));
  EXPECT_FALSE(IsValidUtf8("h\xC3llo"));
}

// ----------------------------------------------------------------------------------------------------------- Regex

TEST(RegexTest, FindsUnicodeClassesAndSkipsEmptyMatches) {
  auto re = Regex::Compile(R"(\p{L}+|\p{N})");
  ASSERT_TRUE(re.ok());
  Ranges m;
  (*re)->FindAll("héllo 42", m);
  EXPECT_EQ(m, (Ranges{{0, 6}, {7, 8}, {8, 9}}));
  auto empty = Regex::Compile("x*");
  ASSERT_TRUE(empty.ok());
  m.clear();
  (*empty)->FindAll("axxb", m);
  EXPECT_EQ(m, (Ranges{{1, 3}}));
}

TEST(RegexTest, WhitespaceIncludesNextLineLikeOniguruma) {
  auto re = Regex::Compile(R"(\s+|[^\s]+)");
  ASSERT_TRUE(re.ok());
  Ranges m;
  (*re)->FindAll(
      "a\xC2\x85"
      "b",
      m);  // U+0085 NEXT LINE
  EXPECT_EQ(m, (Ranges{{0, 1}, {1, 3}, {3, 4}}));
}

TEST(RegexTest, EscapeMatchesLiterally) {
  auto re = Regex::Compile(Regex::Escape("a.b*"));
  ASSERT_TRUE(re.ok());
  Ranges m;
  (*re)->FindAll("axb a.b* a.b", m);
  EXPECT_EQ(m, (Ranges{{4, 8}}));
  EXPECT_FALSE(Regex::Compile("(unclosed").ok());
}

// ----------------------------------------------------------------------------------------------------------- Split

std::vector<std::string> Pieces(const std::string& text, const Ranges& ranges) {
  std::vector<std::string> out;
  for (auto [b, e] : ranges) out.push_back(text.substr(b, e - b));
  return out;
}

TEST(SplitTest, AllBehavioursMatchHfDocs) {
  const std::string text = "the-final--countdown";
  Ranges dashes = {{3, 4}, {9, 10}, {10, 11}};
  using V = std::vector<std::string>;
  EXPECT_EQ(Pieces(text, SplitByMatches(text.size(), dashes, SplitBehavior::kRemoved, false)),
            (V{"the", "final", "countdown"}));
  EXPECT_EQ(Pieces(text, SplitByMatches(text.size(), dashes, SplitBehavior::kIsolated, false)),
            (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(Pieces(text, SplitByMatches(text.size(), dashes, SplitBehavior::kMergedWithPrevious, false)),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(Pieces(text, SplitByMatches(text.size(), dashes, SplitBehavior::kMergedWithNext, false)),
            (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(Pieces(text, SplitByMatches(text.size(), dashes, SplitBehavior::kContiguous, false)),
            (V{"the", "-", "final", "--", "countdown"}));
  // invert: the non-dash runs are the matches.
  EXPECT_EQ(Pieces(text, SplitByMatches(text.size(), dashes, SplitBehavior::kRemoved, true)), (V{"-", "-", "-"}));
}

std::vector<std::string> PreTokenize(const json& config, const std::string& text) {
  auto pre = ParsePreTokenizer(config);
  EXPECT_TRUE(pre.ok()) << pre.status().ToString();
  std::vector<PreToken> pieces = {{text, 0}};
  (*pre)->PreTokenize(pieces);
  std::vector<std::string> out;
  for (auto& p : pieces) out.push_back(p.text);
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizerTest, SplitWithRegexAndInvert) {
  EXPECT_EQ(
      PreTokenize(json::parse(R"({"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"Removed","invert":false})"),
                  "a  b c"),
      (V{"a", "b", "c"}));
  EXPECT_EQ(
      PreTokenize(json::parse(R"({"type":"Split","pattern":{"Regex":"\\d+"},"behavior":"Isolated","invert":true})"),
                  "ab12cd"),
      (V{"ab", "12", "cd"}));
  EXPECT_EQ(
      PreTokenize(json::parse(R"({"type":"Split","pattern":{"String":"."},"behavior":"MergedWithPrevious"})"), "a.b.c"),
      (V{"a.", "b.", "c"}));
}

TEST(PreTokenizerTest, ByteLevelWithPrefixSpaceAndRegex) {
  EXPECT_EQ(
      PreTokenize(json::parse(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})"), "Hello world!"),
      (V{"\xC4\xA0Hello", "\xC4\xA0world", "!"}));
  // Without the regex the whole piece is kept; bytes map to the GPT-2 alphabet (é = C3 A9 -> Ã ©).
  EXPECT_EQ(PreTokenize(json::parse(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":false})"), "a é"),
            (V{"a\xC4\xA0\xC3\x83\xC2\xA9"}));
}

TEST(PreTokenizerTest, MetaspacePrependSchemes) {
  const std::string r = "\xE2\x96\x81";
  EXPECT_EQ(PreTokenize(json::parse(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})"),
                        "hi there"),
            (V{r + "hi", r + "there"}));
  EXPECT_EQ(PreTokenize(json::parse(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":false})"),
                        "hi there"),
            (V{"hi" + r + "there"}));
  auto pre = ParsePreTokenizer(
      json::parse(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false})"));
  ASSERT_TRUE(pre.ok());
  std::vector<PreToken> pieces = {{"a b", 0}, {"c", 5}};
  (*pre)->PreTokenize(pieces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].text, r + "a" + r + "b");
  EXPECT_EQ(pieces[1].text, "c");  // not at the start of the input: no prefix
}

TEST(PreTokenizerTest, DigitsAndSequence) {
  EXPECT_EQ(PreTokenize(json::parse(R"({"type":"Digits","individual_digits":true})"), "ab123c"),
            (V{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(PreTokenize(json::parse(R"({"type":"Digits","individual_digits":false})"), "ab123c"),
            (V{"ab", "123", "c"}));
  EXPECT_EQ(PreTokenize(json::parse(R"({"type":"Sequence","pretokenizers":[
                 {"type":"Split","pattern":{"String":" "},"behavior":"Removed"},
                 {"type":"Digits","individual_digits":true}]})"),
                        "x12 y"),
            (V{"x", "1", "2", "y"}));
}

// -----------------------------------------------------------------------------------------------------------
// Normalizers

std::string Normalize(const json& config, std::string text) {
  auto n = ParseNormalizer(config);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  if (*n) (*n)->Normalize(text);
  return text;
}

TEST(NormalizerTest, UnicodeForms) {
  EXPECT_EQ(Normalize(json::parse(R"({"type":"NFC"})"), "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(Normalize(json::parse(R"({"type":"NFD"})"), "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Normalize(json::parse(R"({"type":"NFKC"})"), "\xEF\xAC\x81 \xEF\xBC\x91"),
            "fi 1");  // ﬁ ligature, fullwidth 1
  EXPECT_EQ(Normalize(json::parse(R"({"type":"NFC"})"), "plain ascii"), "plain ascii");
}

TEST(NormalizerTest, ReplacePrependLowercaseSequence) {
  EXPECT_EQ(Normalize(json::parse(R"({"type":"Sequence","normalizers":[
                {"type":"Prepend","prepend":"▁"},
                {"type":"Replace","pattern":{"String":" "},"content":"▁"},
                {"type":"Lowercase"}]})"),
                      "Hello World"),
            "\xE2\x96\x81hello\xE2\x96\x81world");
  EXPECT_EQ(Normalize(json::parse(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "})"), "a \t\n b"),
            "a b");
  EXPECT_EQ(Normalize(json::parse(R"({"type":"Prepend","prepend":"_"})"), ""), "");  // nothing to prepend to
  EXPECT_EQ(Normalize(json::parse(R"({"type":"Sequence","normalizers":[]})"), "x"), "x");
  EXPECT_EQ(Normalize(json::parse("null"), "x"), "x");
}

// ----------------------------------------------------------------------------------------------------------- Decoders

std::string DecodeTokens(const json& config, std::vector<std::string> tokens) {
  auto d = ParseDecoder(config);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  (*d)->DecodeChain(tokens);
  std::string out;
  for (auto& t : tokens) out += t;
  return out;
}

TEST(DecoderTest, ByteLevelJoinsBytesAndPassesForeignTokensThrough) {
  EXPECT_EQ(DecodeTokens(json::parse(R"({"type":"ByteLevel"})"), {"Hello", "\xC4\xA0w\xC3\x83", "\xC2\xA9"}),
            "Hello w\xC3\xA9");
  // A special token outside the byte alphabet keeps its UTF-8 bytes.
  EXPECT_EQ(DecodeTokens(json::parse(R"({"type":"ByteLevel"})"), {"<｜User｜>", "Hi"}), "<｜User｜>Hi");
  // An incomplete character becomes U+FFFD.
  EXPECT_EQ(DecodeTokens(json::parse(R"({"type":"ByteLevel"})"), {"\xC3\x83"}), "\xEF\xBF\xBD");
}

TEST(DecoderTest, SentencePieceChain) {
  const json chain = json::parse(R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"▁"},"content":" "},
      {"type":"ByteFallback"},{"type":"Fuse"},
      {"type":"Strip","content":" ","start":1,"stop":0}]})");
  EXPECT_EQ(DecodeTokens(chain, {"▁h", "<0xC3>", "<0xA9>", "llo", "▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}),
            "h\xC3\xA9llo \xF0\x9F\x98\x80");
  // An invalid byte run becomes one U+FFFD per byte.
  EXPECT_EQ(DecodeTokens(chain, {"▁a", "<0xF0>", "<0x9F>", "b"}),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
}

TEST(DecoderTest, MetaspaceDropsReplacementInFirstTokenOnly) {
  EXPECT_EQ(DecodeTokens(json::parse(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})"),
                         {"▁Hey", "▁friend"}),
            "Hey friend");
  EXPECT_EQ(DecodeTokens(json::parse(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never"})"),
                         {"▁Hey", "▁friend"}),
            " Hey friend");
}

TEST(DecoderTest, StripRemovesAtMostTheConfiguredCount) {
  EXPECT_EQ(DecodeTokens(json::parse(R"({"type":"Strip","content":"x","start":2,"stop":1})"), {"xxxaxx"}), "xax");
}

// ----------------------------------------------------------------------------------------------------------- Rejection

TEST(LoadTest, UnsupportedComponentsAreRejectedByName) {
  EXPECT_NE(ParseNormalizer(json::parse(R"({"type":"BertNormalizer"})")).status().message().find("BertNormalizer"),
            std::string::npos);
  EXPECT_NE(ParsePreTokenizer(json::parse(R"({"type":"Whitespace"})")).status().message().find("Whitespace"),
            std::string::npos);
  EXPECT_NE(ParseDecoder(json::parse(R"({"type":"WordPiece"})")).status().message().find("WordPiece"),
            std::string::npos);
  EXPECT_NE(ParsePreTokenizer(json::parse(R"({"type":"Split","pattern":{"String":"x"},"behavior":"Sideways"})"))
                .status()
                .message()
                .find("Sideways"),
            std::string::npos);
  auto model = Tokenizer::FromJson(R"({"model":{"type":"WordPiece","vocab":{"a":0}}})", "");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("WordPiece"), std::string::npos);
  auto post = Tokenizer::FromJson(
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"post_processor":{"type":"RobertaProcessing"}})", "");
  ASSERT_FALSE(post.ok());
  EXPECT_NE(post.status().message().find("RobertaProcessing"), std::string::npos);
  auto bad_merge = Tokenizer::FromJson(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}})", "");
  EXPECT_FALSE(bad_merge.ok());
  EXPECT_FALSE(Tokenizer::FromJson("{not json", "").ok());
}

// Degenerate settings that once hung or were taken silently are errors at load: an empty Metaspace replacement
// (its pre-tokenizer grew memory without end; its decoder spun), an empty Strip content, ids beyond any vocabulary.
TEST(LoadTest, DegenerateSettingsAreErrorsAtLoad) {
  for (const char* r : {R"({"type":"Metaspace","replacement":""})", R"({"type":"Metaspace","replacement":"ab"})",
                        R"({"type":"Metaspace","replacement":"\u2581\u2581"})"}) {
    const auto pre = ParsePreTokenizer(json::parse(r));
    EXPECT_FALSE(pre.ok()) << r;
    EXPECT_NE(pre.status().message().find("must be exactly one character"), std::string::npos) << r;
    EXPECT_FALSE(ParseDecoder(json::parse(r)).ok()) << r;
  }
  EXPECT_TRUE(ParsePreTokenizer(json::parse(R"({"type":"Metaspace","replacement":"\u2581"})")).ok());
  EXPECT_FALSE(ParseDecoder(json::parse(R"({"type":"Strip","content":"","start":1000000000000,"stop":0})")).ok());
  const auto huge_added = Tokenizer::FromJson(
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":1000000000000,"content":"<x>"}]})",
      "");
  ASSERT_FALSE(huge_added.ok());
  EXPECT_NE(huge_added.status().message().find("has id 1000000000000, outside"), std::string::npos)
      << huge_added.status().message();
  const auto negative_added = Tokenizer::FromJson(
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":-1,"content":"<x>"}]})", "");
  EXPECT_FALSE(negative_added.ok());
  // A vocab id of 2^31 - 1 would size the id tables at 2^31 entries.
  const auto huge_vocab = Tokenizer::FromJson(R"({"model":{"type":"BPE","vocab":{"a":2147483647},"merges":[]}})", "");
  ASSERT_FALSE(huge_vocab.ok());
  EXPECT_NE(huge_vocab.status().message().find("out of range"), std::string::npos);
  // A post-processor's special token id must be a token of the vocabulary, or encoding with special tokens would
  // hand the model an id it does not have (found by fuzz_tokenizer: a mangled "added_tokens" key).
  const char* const kTemplate =
      R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]},"post_processor":{"type":"TemplateProcessing",)"
      R"("single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],)"
      R"("special_tokens":{"<s>":{"id":"<s>","ids":[%s],"tokens":["<s>"]}}}})";
  for (const char* id : {"2", "-1", "1.5", "\"x\""}) {
    char buf[512];
    std::snprintf(buf, sizeof buf, kTemplate, id);
    const auto bad_special = Tokenizer::FromJson(buf, "");
    ASSERT_FALSE(bad_special.ok()) << id;
    EXPECT_NE(bad_special.status().message().find("not a token of the vocabulary [0, 2)"), std::string::npos)
        << bad_special.status().message();
  }
  char ok[512];
  std::snprintf(ok, sizeof ok, kTemplate, "1");
  const auto good = Tokenizer::FromJson(ok, "");
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ((*good)->Encode("a", {.add_special_tokens = true}), (std::vector<int32_t>{1, 0}));
}

// ----------------------------------------------------------------------------------------------------------- BPE

std::string Tokens(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += (out.empty() ? "" : " ") + tok.IdToToken(id).value_or("?");
  return out;
}

TEST(BpeTest, SentencePieceStyleWithByteFallback) {
  auto tok = Load(SentencePieceJson(true, false));
  EXPECT_EQ(Tokens(*tok, tok->Encode("hello world")), "▁hello ▁world");
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80";  // héllo 😀
  const auto ids = tok->Encode(text);
  EXPECT_EQ(Tokens(*tok, ids), "▁h <0xC3> <0xA9> ll o ▁ <0xF0> <0x9F> <0x98> <0x80>");
  EXPECT_EQ(tok->Decode(ids), text);
  EXPECT_EQ(tok->Encode("hello", {.add_special_tokens = true}).front(), 1);  // TemplateProcessing BOS
  // As in HF, the Prepend normalizer applies to every piece between special tokens, and Strip only touches the
  // start of the fused text.
  EXPECT_EQ(tok->Decode(tok->Encode("<s>hello</s>")), "<s> hello</s>");
  EXPECT_EQ(tok->Decode(tok->Encode("<s>hello</s>"), /*skip_special_tokens=*/true), "hello");
}

TEST(BpeTest, MetaspacePreTokenizerVariant) {
  auto tok = Load(SentencePieceJson(true, true));
  EXPECT_EQ(Tokens(*tok, tok->Encode("hello world")), "▁hello ▁world");
  EXPECT_EQ(tok->Decode(tok->Encode("hello world")), "hello world");
  // After a special token the piece does not start the input: no prefix (prepend_scheme "first").
  EXPECT_EQ(Tokens(*tok, tok->Encode("<s>hello")), "<s> h ell o");
}

TEST(BpeTest, UnknownCharactersFuseIntoOneUnk) {
  auto tok = Load(SentencePieceJson(false, false));
  EXPECT_EQ(Tokens(*tok, tok->Encode("h\xC3\xA9\xC3\xA9llo")), "▁h <unk> ll o");
}

TEST(BpeTest, PairAndStringMergesAreEquivalent) {
  json a = SentencePieceJson(true, false);
  json b = a;
  json pairs = json::array();
  for (const auto& m : a["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ');
    pairs.push_back({s.substr(0, sp), s.substr(sp + 1)});
  }
  b["model"]["merges"] = pairs;
  auto ta = Load(a), tb = Load(b);
  for (const char* text : {"hello world", "world hello", "lower", "dd ll"}) {
    EXPECT_EQ(ta->Encode(text), tb->Encode(text)) << text;
  }
}

TEST(BpeTest, MergesFollowRankNotPosition) {
  // "a b" has a worse rank than "b c": "abc" -> a bc.
  json j = json::parse(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4},"merges":["b c","a b"]}})");
  auto tok = Load(j);
  EXPECT_EQ(tok->Encode("abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(tok->Encode("abab"), (std::vector<int32_t>{3, 3}));
}

TEST(BpeTest, IgnoreMergesUsesWholeWordFromVocab) {
  // "abc" is in the vocab but no merge produces it.
  json j = json::parse(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"abc":4},"merges":["a b"],
                           "ignore_merges":false}})");
  EXPECT_EQ(Load(j)->Encode("abc"), (std::vector<int32_t>{3, 2}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(Load(j)->Encode("abc"), (std::vector<int32_t>{4}));
}

// ----------------------------------------------------------------------------------------------------------- Added
// tokens

json AddedTokensJson(const std::string& flags) {
  json j = json::parse(R"({"model":{"type":"BPE","vocab":{" ":0,"a":1,"b":2,"x":3,"<m>":4},"merges":[]},
                           "pre_tokenizer":null})");
  json token = json::parse(R"({"id":4,"content":"<m>","single_word":false,"lstrip":false,"rstrip":false,
                               "normalized":false,"special":true})");
  for (const char* f : {"lstrip", "rstrip", "single_word"}) token[f] = flags.find(f) != std::string::npos;
  j["added_tokens"] = json::array({token});
  return j;
}

TEST(AddedTokensTest, StripAndSingleWordSemantics) {
  using Ids = std::vector<int32_t>;
  EXPECT_EQ(Load(AddedTokensJson(""))->Encode("a <m> b"), (Ids{1, 0, 4, 0, 2}));
  EXPECT_EQ(Load(AddedTokensJson("lstrip"))->Encode("a  <m> b"), (Ids{1, 4, 0, 2}));
  EXPECT_EQ(Load(AddedTokensJson("rstrip"))->Encode("a <m>  b"), (Ids{1, 0, 4, 2}));
  EXPECT_EQ(Load(AddedTokensJson("lstrip rstrip"))->Encode("a <m> b"), (Ids{1, 4, 2}));
  // single_word: only matched when not inside a word.
  auto single = Load(AddedTokensJson("single_word"));
  EXPECT_EQ(single->Encode("a <m> b"), (Ids{1, 0, 4, 0, 2}));
  const Ids inside_word = single->Encode("a<m>");
  EXPECT_EQ(std::count(inside_word.begin(), inside_word.end(), 4), 0);
  EXPECT_EQ(single->Encode("a <m>"), (Ids{1, 0, 4}));
}

TEST(AddedTokensTest, SplitSpecialTokensEncodesThemAsText) {
  auto tok = Load(AddedTokensJson(""));
  const auto ids = tok->Encode("a<m>", {.split_special_tokens = true});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 4), 0);
  EXPECT_EQ(tok->Encode("a<m>"), (std::vector<int32_t>{1, 4}));
}

TEST(ConfigTest, AddBosTokenFromTokenizerConfig) {
  auto tok = Load(SentencePieceJson(true, false), R"({"bos_token":"<s>","eos_token":"</s>","add_bos_token":false,
                                                     "add_eos_token":true})");
  const auto ids = tok->Encode("hello", {.add_special_tokens = true});
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids.front(), 1);  // config overrides the TemplateProcessing BOS
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(Tokenizer::FromJson(SentencePieceJson(true, false).dump(), R"({"bos_token":"<nope>"})").ok());
}

TEST(ChatTemplateTest, NamedTemplatesAndBosAddedOnlyOnce) {
  // tokenizer_config.json may hold a list of named templates; "default" is used unless tools ask for "tool_use".
  const std::string config = R"({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true, "chat_template": [
      {"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
      {"name": "tool_use", "template": "{{ bos_token }}tools:{{ tools | length }}"}]})";
  auto tok = Load(SentencePieceJson(true, false), config);
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hello"}])");
  auto chat = ChatTemplate::FromTokenizer(*tok);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_EQ((*chat)->name(), "default");
  const auto rendered = (*chat)->Render(request);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered, "hello");
  // The template did not emit BOS and add_bos_token is set: EncodePrompt adds it.
  EXPECT_EQ((*chat)->EncodePrompt(*rendered).front(), 1);

  auto tools = ChatTemplate::FromTokenizer(*tok, "", /*for_tools=*/true);
  ASSERT_TRUE(tools.ok());
  EXPECT_EQ((*tools)->name(), "tool_use");
  request.tools = nlohmann::ordered_json::parse(R"([{"type": "function"}])");
  const auto with_bos = (*tools)->Render(request);
  ASSERT_TRUE(with_bos.ok());
  EXPECT_EQ(*with_bos, "<s>tools:1");
  // The template emitted BOS itself: no second one.
  const auto ids = (*tools)->EncodePrompt(*with_bos);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_NE(ids[1], 1);

  EXPECT_EQ(ChatTemplate::FromTokenizer(*tok, "nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizer(*Load(SentencePieceJson(true, false))).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace fathom
