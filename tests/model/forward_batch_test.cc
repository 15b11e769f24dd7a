#include "model/forward_batch.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"

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

// The device copy of a batch is one packed i32 buffer; its views hold each array in order.
TEST(ForwardBatchTest, BatchOnDevicePacksEveryArrayOnce) {
  ForwardBatch b(4);
  b.AddSequence(std::vector<int32_t>{10, 11, 12, 13, 14}, 0, std::vector<int32_t>{7, 2}, LogitsMode::kLast);
  b.AddSequence(std::vector<int32_t>{42}, 9, std::vector<int32_t>{5, 0, 3}, LogitsMode::kAll);
  std::vector<int32_t> packed;
  BatchOnDevice::Pack(b, &packed);
  EXPECT_EQ(BatchOnDevice::PackedSize(b), static_cast<int64_t>(packed.size()));
  EXPECT_EQ(packed, (std::vector<int32_t>{0, 1, 2, 3, 4, 9, 28, 29, 30, 31, 8,  13, 0,  5,  6, 5, 10,
                                          0, 2, 5, 7, 2, 5, 0,  3,  10, 11, 12, 13, 14, 42, 4, 5}));
  CpuBackend cpu;
  auto dev = BatchOnDevice::Upload(b, cpu);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto values = [](const TensorView& t) {
    return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  };
  const AttentionMetadata& m = dev->meta();
  EXPECT_EQ(values(m.positions), b.positions);
  EXPECT_EQ(values(m.slot_mapping), b.slot_mapping);
  EXPECT_EQ(values(m.query_start), b.query_start);
  EXPECT_EQ(values(m.seq_lens), b.seq_lens);
  EXPECT_EQ(values(m.block_table_start), b.block_table_start);
  EXPECT_EQ(values(m.block_tables), b.block_tables);
  EXPECT_EQ(values(dev->token_ids()), b.token_ids);
  EXPECT_EQ(values(dev->logits_indices()), b.logits_indices);
  EXPECT_EQ(m.num_seqs, 2);
  EXPECT_EQ(m.num_tokens, 6);
  EXPECT_EQ(m.max_seq_len, 10);
  EXPECT_EQ(m.total_seq_len, 15);
  // 5 fresh tokens see 1..5 keys (15 pairs); 1 token after 9 cached sees 10.
  EXPECT_EQ(m.causal_pairs, 25);
  // Moving the batch keeps its views valid (the CPU backend's views point into its host buffer).
  BatchOnDevice moved = std::move(dev).value();
  EXPECT_EQ(values(moved.token_ids()), b.token_ids);
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
