// Small tokenizers built in code for the tokenizer tests.
//
//   auto tok = LoadTokenizer(SentencePieceJson(/*byte_fallback=*/true, /*metaspace=*/false));
#pragma once

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

// A SentencePiece-style BPE (Llama-2 / Gemma layout): Prepend + Replace normalizer, no pre-tokenizer, byte
// fallback, and the Replace/ByteFallback/Fuse/Strip decoder.
inline nlohmann::json SentencePieceJson(bool byte_fallback, bool metaspace) {
  using nlohmann::json;
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int next = 259;
  for (const char* t : {"▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "ell", "▁hell", "▁hello", "▁w", "or",
                        "▁wor", "ld", "▁world"}) {
    vocab[t] = next++;
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::parse(R"([
    {"id":0,"content":"<unk>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
    {"id":2,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}])");
  if (metaspace) {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] =
        json::parse(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false})");
    j["decoder"] = json::parse(R"({"type":"Sequence","decoders":[
        {"type":"ByteFallback"},{"type":"Metaspace","replacement":"▁","prepend_scheme":"first"}]})");
  } else {
    j["normalizer"] = json::parse(R"({"type":"Sequence","normalizers":[
        {"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]})");
    j["pre_tokenizer"] = nullptr;
    j["decoder"] = json::parse(R"({"type":"Sequence","decoders":[
        {"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},
        {"type":"Strip","content":" ","start":1,"stop":0}]})");
  }
  j["post_processor"] = json::parse(R"({"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
      "pair":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
      "special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}})");
  j["model"] = {
      {"type", "BPE"},
      {"dropout", nullptr},
      {"unk_token", "<unk>"},
      {"fuse_unk", true},
      {"byte_fallback", byte_fallback},
      {"vocab", vocab},
      {"merges", json::array({"▁ h", "l l", "e ll", "▁h ell", "▁hell o", "▁ w", "o r", "▁w or", "l d", "▁wor ld"})}};
  return j;
}

inline std::unique_ptr<Tokenizer> Load(const nlohmann::json& j, const std::string& config = "") {
  auto tok = Tokenizer::FromJson(j.dump(), config);
  FATHOM_CHECK(tok.ok(), "{}", tok.status().ToString());
  return std::move(tok).value();
}

}  // namespace fathom
