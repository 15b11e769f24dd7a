// One model step over a batch of sequences, each appending new tokens to its paged KV cache.
//
//   ForwardBatch batch(/*block_size=*/16);
//   batch.AddSequence(prompt_a, /*num_cached=*/0, blocks_a, LogitsMode::kLast);     // prefill (or a chunk of it)
//   batch.AddSequence({next_b}, /*num_cached=*/37, blocks_b, LogitsMode::kLast);    // decode
//   FATHOM_RETURN_IF_ERROR(batch.Validate(num_blocks, vocab_size));
//   model.Forward(batch, kv, &logits);   // logits [batch.num_logits(), vocab]
//
// Each sequence's block table must cover num_cached + new tokens. Token rows are laid out sequence after
// sequence; positions are num_cached, num_cached + 1, ...
// A cache with a window group (KvCacheSpec::window_tokens: DeepSeek-V4) takes a second table a sequence, as long as
// the first, -1 where the window has passed (kv::KvCacheManager::window_blocks): every sequence passes one or none
// does.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace fathom {

enum class LogitsMode { kNone, kLast, kAll };

struct ForwardBatch {
  explicit ForwardBatch(int32_t block_size_ = 16) : block_size(block_size_) {
    query_start.push_back(0);
    block_table_start.push_back(0);
  }

  void AddSequence(std::span<const int32_t> tokens, int32_t num_cached, std::span<const int32_t> block_table,
                   LogitsMode mode, std::span<const int32_t> window_table = {});

  // Checks token ids, block ids and table lengths; a bad request must not reach a kernel. With a window group
  // (window_tokens > 0) every sequence has a window table whose blocks of the last window_tokens tokens before the new
  // ones, and of the new ones, are in [0, window_blocks).
  Status Validate(int64_t num_blocks, int64_t vocab_size, int64_t window_blocks = 0, int64_t window_tokens = 0) const;
  bool has_window() const { return !window_block_table_start.empty(); }

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(seq_lens.size()); }
  int64_t num_logits() const { return static_cast<int64_t>(logits_indices.size()); }
  int32_t max_seq_len() const;

  int32_t block_size;
  std::vector<int32_t> token_ids;          // [n_tokens]
  std::vector<int32_t> positions;          // [n_tokens]
  std::vector<int32_t> slot_mapping;       // [n_tokens]
  std::vector<int32_t> query_start;        // [n_seqs + 1]
  std::vector<int32_t> seq_lens;           // [n_seqs]
  std::vector<int32_t> block_table_start;  // [n_seqs + 1]
  std::vector<int32_t> block_tables;       // [sum of table lengths]
  std::vector<int32_t> logits_indices;     // [n_logits], token rows whose logits are returned, in order
  // A window group's (empty without one).
  std::vector<int32_t> window_slot_mapping;       // [n_tokens]
  std::vector<int32_t> window_block_table_start;  // [n_seqs + 1]
  std::vector<int32_t> window_block_tables;       // [sum of table lengths]
};

}  // namespace fathom
