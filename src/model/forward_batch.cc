#include "model/forward_batch.h"

#include <fmt/format.h>

#include <algorithm>

namespace fathom {

void ForwardBatch::AddSequence(std::span<const int32_t> tokens, int32_t num_cached, std::span<const int32_t> table,
                               LogitsMode mode) {
  const int32_t first_row = static_cast<int32_t>(token_ids.size());
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

Status ForwardBatch::Validate(int64_t num_blocks, int64_t vocab_size) const {
  if (block_size <= 0) return InvalidArgumentError(fmt::format("block_size must be positive, got {}", block_size));
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
  }
  return OkStatus();
}

}  // namespace fathom
