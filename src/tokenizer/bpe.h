// The BPE model of a tokenizer.json: vocab + ranked merges, byte_fallback, ignore_merges, unk_token (optionally
// fused), continuing_subword_prefix and end_of_word_suffix. Merging follows HF tokenizers exactly: the pair with the
// lowest merge rank is merged first, ties going to the leftmost pair. Thread-safe; a word cache makes repeated
// words cheap.
//
//   BpeModel::Options options;  options.byte_fallback = true;
//   FATHOM_ASSIGN_OR_RETURN(auto bpe, BpeModel::Create(std::move(vocab), std::move(merges), options));
//   std::vector<int32_t> ids;
//   bpe->Tokenize("Ġhello", ids);   // appends the ids of one pre-tokenized word
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace fathom {

// Transparent hashing so that maps keyed by std::string can be probed with a std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  struct Options {
    bool byte_fallback = false;
    bool ignore_merges = false;
    bool fuse_unk = false;
    std::optional<std::string> unk_token;
    std::string continuing_subword_prefix;
    std::string end_of_word_suffix;
  };

  // `vocab` lists (token, id); a repeated token keeps its last id. `merges` are (left, right) in rank order. Every
  // merge part and result must be in the vocabulary, and unk_token too when given.
  static StatusOr<std::unique_ptr<BpeModel>> Create(std::vector<std::pair<std::string, int32_t>> vocab,
                                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                                    Options options);

  // Appends the ids of one word (already pre-tokenized and normalized).
  void Tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token string of `id`, or nullptr when the id is not in the vocabulary.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id.
  size_t vocab_size() const { return id_to_token_.size(); }
  const Options& options() const { return options_; }

 private:
  BpeModel() = default;
  struct MergeValue {
    int32_t rank;
    int32_t new_id;
  };
  // Open-addressing hash map from (left id, right id) to its merge.
  class PairMap {
   public:
    void Reserve(size_t n);
    bool Insert(uint64_t key, MergeValue value);  // false if the key was already present (first one wins)
    const MergeValue* Find(uint64_t key) const {
      size_t slot = Hash(key) & mask_;
      while (true) {
        const Entry& e = entries_[slot];
        if (e.key == key) return &e.value;
        if (e.key == kEmpty) return nullptr;
        slot = (slot + 1) & mask_;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static size_t Hash(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20); }
    struct Entry {
      uint64_t key = kEmpty;
      MergeValue value{};
    };
    std::vector<Entry> entries_;
    size_t mask_ = 0;
  };
  // Open-addressing index from token string to id; the strings live in id_to_token_.
  class TokenIndex {
   public:
    void Reserve(size_t n);
    // Inserts or overwrites.
    void Insert(std::string_view token, int32_t id, const std::vector<std::string>& tokens);
    int32_t Find(std::string_view token, const std::vector<std::string>& tokens) const {
      const uint64_t h = Hash(token);
      size_t slot = h & mask_;
      const uint32_t tag = static_cast<uint32_t>(h >> 32);
      while (true) {
        const uint64_t e = slots_[slot];
        if (e == 0) return -1;
        if (static_cast<uint32_t>(e >> 32) == tag) {
          const auto id = static_cast<int32_t>(static_cast<uint32_t>(e) - 1);
          if (tokens[id] == token) return id;
        }
        slot = (slot + 1) & mask_;
      }
    }

   private:
    static uint64_t Hash(std::string_view s) { return std::hash<std::string_view>()(s) * 0x9E3779B97F4A7C15ull; }
    std::vector<uint64_t> slots_;  // (hash tag << 32) | (id + 1); 0 = empty
    size_t mask_ = 0;
  };

  static uint64_t PairKey(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void MergeWord(std::string_view word, std::vector<int32_t>& ids) const;
  int32_t CharId(std::string_view word, size_t begin, size_t end) const;

  Options options_;
  TokenIndex vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  PairMap merges_;
  std::vector<int32_t> bmp_char_ids_;    // code point < 0x10000 -> id of its one-character token, or -1
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" -> id, or -1
  std::optional<int32_t> unk_id_;

  static constexpr size_t kCacheCapacity = 100000;
  static constexpr size_t kMaxCachedWordLength = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace fathom
