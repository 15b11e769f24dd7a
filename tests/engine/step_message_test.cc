// Step messages (process 0 to the other processes of a multi-process tensor-parallel layout): every kind survives
// encoding, and bytes that are not a whole message are DATA_LOSS, never a crash or a wrong batch.
#include "engine/step_message.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

TEST(StepMessageTest, EveryKindRoundTrips) {
  ForwardBatch b(16);
  const std::vector<int32_t> prompt = {5, 6, 7}, table_a = {3}, decode = {9}, table_b = {1, 4};
  b.AddSequence(prompt, 0, table_a, LogitsMode::kLast);
  b.AddSequence(decode, 20, table_b, LogitsMode::kAll);
  auto fwd = DecodeStep(EncodeStep(StepMessage::Forward(b, 64, 16, DType::kBF16)));
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  EXPECT_EQ(fwd->kind, StepMessage::Kind::kForward);
  EXPECT_EQ(fwd->batch.block_size, 16);
  EXPECT_EQ(fwd->batch.token_ids, b.token_ids);
  EXPECT_EQ(fwd->batch.positions, b.positions);
  EXPECT_EQ(fwd->batch.slot_mapping, b.slot_mapping);
  EXPECT_EQ(fwd->batch.query_start, b.query_start);
  EXPECT_EQ(fwd->batch.seq_lens, b.seq_lens);
  EXPECT_EQ(fwd->batch.block_table_start, b.block_table_start);
  EXPECT_EQ(fwd->batch.block_tables, b.block_tables);
  EXPECT_EQ(fwd->batch.logits_indices, b.logits_indices);
  EXPECT_EQ(fwd->num_blocks, 64);
  EXPECT_EQ(fwd->block_size, 16);
  EXPECT_EQ(fwd->kv_dtype, DType::kBF16);
  EXPECT_TRUE(fwd->batch.Validate(64, 100).ok());

  const std::vector<KvBlockCopy> copies = {{1, 2}, {7, 3}};
  auto cp = DecodeStep(EncodeStep(StepMessage::CopyBlocks(copies)));
  ASSERT_TRUE(cp.ok());
  ASSERT_EQ(cp->copies.size(), 2u);
  EXPECT_EQ(cp->copies[1].src, 7);
  EXPECT_EQ(cp->copies[1].dst, 3);

  ModelRunOptions run;
  run.max_batched_tokens = 8192;
  run.prefill_form = PrefillForm::kCompact;
  auto ro = DecodeStep(EncodeStep(StepMessage::RunOptions(run)));
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ(ro->run.max_batched_tokens, 8192);
  EXPECT_EQ(ro->run.prefill_form, PrefillForm::kCompact);

  auto stop = DecodeStep(EncodeStep(StepMessage::Stop()));
  ASSERT_TRUE(stop.ok());
  EXPECT_EQ(stop->kind, StepMessage::Kind::kStop);
}

TEST(StepMessageTest, TruncatedOrForeignBytesAreDataLoss) {
  ForwardBatch b(16);
  const std::vector<int32_t> prompt = {5, 6, 7}, table = {3};
  b.AddSequence(prompt, 0, table, LogitsMode::kLast);
  const std::vector<uint8_t> whole = EncodeStep(StepMessage::Forward(b, 8, 16, DType::kF32));
  for (size_t n = 0; n < whole.size(); ++n) {
    auto cut = DecodeStep(std::span<const uint8_t>(whole.data(), n));
    ASSERT_FALSE(cut.ok()) << n << " bytes";
    EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
  }
  std::vector<uint8_t> longer = whole;
  longer.push_back(0);
  EXPECT_EQ(DecodeStep(longer).status().code(), StatusCode::kDataLoss);
  std::vector<uint8_t> foreign = whole;
  foreign[0] ^= 0xff;
  EXPECT_EQ(DecodeStep(foreign).status().code(), StatusCode::kDataLoss);
  std::vector<uint8_t> kind = whole;
  kind[4] = 99;
  EXPECT_EQ(DecodeStep(kind).status().code(), StatusCode::kDataLoss);
  // A length field that claims more than the message holds.
  std::vector<uint8_t> huge = whole;
  huge[16] = 0x7f;  // the token count's top byte
  EXPECT_EQ(DecodeStep(huge).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace fathom
