// Normalizers of a tokenizer.json pipeline: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Replace, Prepend, Strip and
// Sequence. Any other type is rejected by name at load time.
//
//   FATHOM_ASSIGN_OR_RETURN(auto normalizer, ParseNormalizer(json["normalizer"]));  // nullptr for `null`
//   if (normalizer) normalizer->Normalize(text);
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/status.h"

namespace fathom {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place.
  virtual void Normalize(std::string& text) const = 0;
};

// Parses the "normalizer" object of tokenizer.json. Returns nullptr for null and for an empty Sequence.
StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& json);

}  // namespace fathom
