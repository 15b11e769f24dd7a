// Decoders of a tokenizer.json pipeline: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence. Any
// other type is rejected by name at load time. A decoder rewrites the list of token strings (HF's decode_chain); the
// decoded text is the concatenation of the result.
//
//   FATHOM_ASSIGN_OR_RETURN(auto decoder, ParseDecoder(json["decoder"]));   // nullptr for `null`
//   std::vector<std::string> tokens = {"Hello", "Ġworld"};
//   decoder->DecodeChain(tokens);                                          // {"Hello world"}
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace fathom {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
  // The bytes one token stands for on its own, before any UTF-8 repair, where this decoder defines them (ByteLevel:
  // every token; ByteFallback: <0xHH> tokens); nullopt elsewhere.
  virtual std::optional<std::string> TokenBytes(const std::string& /*token*/) const { return std::nullopt; }
};

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& json);

}  // namespace fathom
