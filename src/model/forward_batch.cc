#include "model/forward_batch.h"

#include <fmt/format.h>

#include <algorithm>

namespace fathom {

void ForwardBatch::AddSequence(std::span<const int32_t> tokens, int32_t num_cached, std::span<const int32_t> table,
                               LogitsMode mode, std::span<const int32_t> window_table) {
  const int32_t first_row = static_cast<int32_t>(token_ids.size());
  if (!window_table.empty() || has_window()) {
    // A batch that mixes sequences with and without a window table is refused by Validate (the starts fall short).
    if (!has_window() && num_seqs() == 0) window_block_table_start.push_back(0);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int32_t pos = num_cached + static_cast<int32_t>(i);
      const size_t block_index = static_cast<size_t>(pos / block_size);
      const int32_t block = block_index < window_table.size() ? window_table[block_index] : -1;
      window_slot_mapping.push_back(block < 0 ? -1 : block * block_size + pos % block_size);
    }
    window_block_tables.insert(window_block_tables.end(), window_table.begin(), window_table.end());
    if (has_window()) window_block_table_start.push_back(static_cast<int32_t>(window_block_tables.size()));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = num_cached + static_cast<int32_t>(i);
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    const size_t block_index = static_cast<size_t>(pos / block_size);
    // An out-of-range table is reported by Validate(); keep the slot harmless until then.
    const int32_t block = block_index < table.size() ? table[block_index] : -1;
    slot_mapping.push_back(block < 0 ? -1 : block * block_size + pos % block_size);
  }
  const int32_t rows = static_cast<int32_t>(tokens.size());
  query_start.push_back(first_row + rows);
  seq_lens.push_back(num_cached + rows);
  block_tables.insert(block_tables.end(), table.begin(), table.end());
  block_table_start.push_back(static_cast<int32_t>(block_tables.size()));
  if (mode == LogitsMode::kLast && rows > 0) logits_indices.push_back(first_row + rows - 1);
  if (mode == LogitsMode::kAll) {
    for (int32_t r = 0; r < rows; ++r) logits_indices.push_back(first_row + r);
  }
}

int32_t ForwardBatch::max_seq_len() const {
  return seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
}

Status ForwardBatch::Validate(int64_t num_blocks, int64_t vocab_size, int64_t window_blocks,
                              int64_t window_tokens) const {
  if (block_size <= 0) return InvalidArgumentError(fmt::format("block_size must be positive, got {}", block_size));
  if (has_window() != (window_tokens > 0)) {
    return InvalidArgumentError(window_tokens > 0
                                    ? "the KV cache has a window group: every sequence needs a window table"
                                    : "the batch has window tables but the KV cache no window group");
  }
  if (has_window() &&
      (window_block_table_start.size() != seq_lens.size() + 1 || window_slot_mapping.size() != token_ids.size())) {
    return InvalidArgumentError("the batch mixes sequences with and without a window table");
  }
  for (size_t t = 0; t < token_ids.size(); ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= vocab_size) {
      return InvalidArgumentError(
          fmt::format("token id {} at row {} is outside the vocabulary [0, {})", token_ids[t], t, vocab_size));
    }
  }
  for (int64_t s = 0; s < num_seqs(); ++s) {
    const int64_t blocks = block_table_start[s + 1] - block_table_start[s];
    const int64_t needed = (seq_lens[s] + block_size - 1) / block_size;
    if (blocks < needed) {
      return InvalidArgumentError(fmt::format("sequence {} holds {} tokens and needs {} blocks, its table has {}", s,
                                              seq_lens[s], needed, blocks));
    }
    for (int64_t i = block_table_start[s]; i < block_table_start[s] + needed; ++i) {
      if (block_tables[i] < 0 || block_tables[i] >= num_blocks) {
        return InvalidArgumentError(
            fmt::format("sequence {} uses block {} outside the pool of {} blocks", s, block_tables[i], num_blocks));
      }
    }
    if (query_start[s + 1] - query_start[s] > seq_lens[s]) {
      return InvalidArgumentError(fmt::format("sequence {} has a negative cached length", s));
    }
    if (!has_window()) continue;
    // The window blocks read this step: from window_tokens before the first new token to the last.
    const int64_t start = window_block_table_start[s], wblocks = window_block_table_start[s + 1] - start;
    const int64_t cached = seq_lens[s] - (query_start[s + 1] - query_start[s]);
    if (wblocks < needed) {
      return InvalidArgumentError(
          fmt::format("sequence {} needs {} window blocks, its window table has {}", s, needed, wblocks));
    }
    for (int64_t i = std::max<int64_t>(0, cached - window_tokens) / block_size; i < needed; ++i) {
      const int32_t id = window_block_tables[static_cast<size_t>(start + i)];
      if (id < 0 || id >= window_blocks) {
        return InvalidArgumentError(
            fmt::format("sequence {} reads window block {} outside the pool of {} blocks", s, id, window_blocks));
      }
    }
  }
  return OkStatus();
}

}  // namespace fathom
