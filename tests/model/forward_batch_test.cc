#include "model/forward_batch.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

TEST(ForwardBatchTest, LayoutOfMixedPrefillAndDecode) {
  ForwardBatch b(4);
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 14};
  const std::vector<int32_t> table_a = {7, 2};
  b.AddSequence(prompt, 0, table_a, LogitsMode::kLast);
  const std::vector<int32_t> next = {42};
  const std::vector<int32_t> table_b = {5, 0, 3};
  b.AddSequence(next, 9, table_b, LogitsMode::kAll);
  EXPECT_EQ(b.num_tokens(), 6);
  EXPECT_EQ(b.num_seqs(), 2);
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 9}));
  // Sequence a: positions 0-3 sit in physical block 7 (slots 28-31), position 4 in block 2 (slot 8).
  EXPECT_EQ(b.slot_mapping, (std::vector<int32_t>{28, 29, 30, 31, 8, 13}));
  EXPECT_EQ(b.query_start, (std::vector<int32_t>{0, 5, 6}));
  EXPECT_EQ(b.seq_lens, (std::vector<int32_t>{5, 10}));
  EXPECT_EQ(b.block_table_start, (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(b.logits_indices, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(b.max_seq_len(), 10);
  EXPECT_TRUE(b.Validate(8, 100).ok());
}

TEST(ForwardBatchTest, ValidateRejectsBadInput) {
  {
    ForwardBatch b(4);
    std::vector<int32_t> t = {1, 2, 300};
    std::vector<int32_t> table = {0};
    b.AddSequence(t, 0, table, LogitsMode::kLast);
    Status s = b.Validate(8, 100);
    EXPECT_NE(s.message().find("token id 300"), std::string::npos) << s.message();
  }
  {
    ForwardBatch b(4);
    std::vector<int32_t> t = {1, 2, 3, 4, 5};
    std::vector<int32_t> table = {0};  // needs 2 blocks
    b.AddSequence(t, 0, table, LogitsMode::kLast);
    EXPECT_NE(b.Validate(8, 100).message().find("needs 2 blocks"), std::string::npos);
  }
  {
    ForwardBatch b(4);
    std::vector<int32_t> t = {1};
    std::vector<int32_t> table = {9};
    b.AddSequence(t, 0, table, LogitsMode::kLast);
    EXPECT_NE(b.Validate(8, 100).message().find("block 9 outside"), std::string::npos);
  }
}

}  // namespace
}  // namespace fathom
