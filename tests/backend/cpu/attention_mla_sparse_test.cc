// DeepSeek-V3.2's sparse MLA on the CPU (backend/cpu/attention_mla_sparse.cc, model/mla_sparse.h's MlaSparseOps)
// against straightforward double-precision references: the indexer's key rows, its top-k choice (ties to the lower
// position, short contexts keep everything), and the absorbed attention over the chosen rows; plus the cache's side
// row (allocation, bytes, copy-on-write).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "model/forward_batch.h"
#include "model/mla_sparse.h"
#include "model/model.h"
#include "model/moe.h"
#include "testing/attention.h"
#include "testing/golden.h"
#include "testing/random.h"

namespace fathom {
namespace {

using testing::FromVector;
using testing::Random;

constexpr int64_t kBlock = 4;
constexpr int64_t kLora = 6, kRope = 2, kSide = 4;  // latent rows of 8, V the first 6; indexer keys of 4

KvCacheSpec SparseSpec() {
  return KvCacheSpec{.num_layers = 1,
                     .num_kv_heads = 1,
                     .k_dim = kLora + kRope,
                     .v_dim = kLora,
                     .v_in_k = true,
                     .layout = AttentionLayout::kMlaSparse,
                     .side_dim = kSide};
}

MlaSparseOps& Sparse(Backend& be) {
  return AttentionOpsOf<MlaSparseOps>(be);
}

// Two sequences: one of 11 tokens in one step (contexts 1 .. 11), and one with 5 cached tokens and 2 new ones.
struct Batch {
  ForwardBatch fb{static_cast<int32_t>(kBlock)};
  std::vector<int32_t> positions;  // each new token's
  std::vector<int32_t> seq;        // each new token's sequence
  std::vector<std::vector<int32_t>> tables = {{6, 1, 4}, {3, 0}};
};

Batch TwoSequences(int32_t first_from, int32_t first_count, int32_t second_from, int32_t second_count) {
  Batch b;
  b.fb.AddSequence(std::vector<int32_t>(static_cast<size_t>(first_count), 0), first_from, b.tables[0],
                   LogitsMode::kNone);
  b.fb.AddSequence(std::vector<int32_t>(static_cast<size_t>(second_count), 0), second_from, b.tables[1],
                   LogitsMode::kNone);
  for (int32_t i = 0; i < first_count; ++i) {
    b.positions.push_back(first_from + i);
    b.seq.push_back(0);
  }
  for (int32_t i = 0; i < second_count; ++i) {
    b.positions.push_back(second_from + i);
    b.seq.push_back(1);
  }
  return b;
}

// Writes every position's side row (side[s][p], kSide values) and latent row (latent[s][p]) of both sequences.
void FillCache(CpuBackend& be, const KvLayerView& cache, const std::vector<std::vector<float>>& side,
               const std::vector<std::vector<float>>& latent, const std::vector<int32_t>& lens) {
  Batch all = TwoSequences(0, lens[0], 0, lens[1]);
  auto dev = BatchOnDevice::Upload(all.fb, be);
  ASSERT_TRUE(dev.ok());
  std::vector<float> srows, lrows;
  for (int s = 0; s < 2; ++s) {
    srows.insert(srows.end(), side[s].begin(), side[s].end());
    lrows.insert(lrows.end(), latent[s].begin(), latent[s].end());
  }
  const int64_t n = all.fb.num_tokens();
  KvLayerView side_view;
  side_view.k = cache.side;
  side_view.k_scale = cache.side_scale;
  be.WriteKv(FromVector(srows, {n, 1, kSide}), TensorView(), dev->meta(), side_view);
  be.WriteKv(FromVector(lrows, {n, 1, kLora + kRope}), TensorView(), dev->meta(), cache);
  ASSERT_TRUE(be.Synchronize().ok());
}

// A cache of `dtype` holding random rows for both sequences at every position (side rows of magnitude up to
// side_scale).
const std::vector<int32_t> kLens = {11, 7};
struct SparseCache {
  KvCache kv;
  std::vector<std::vector<float>> side, latent;  // per sequence: [position, kSide], [position, kLora + kRope]
};
SparseCache RandomCache(CpuBackend& be, DType dtype, uint32_t seed, float side_scale = 1.0f) {
  StatusOr<KvCache> kv = KvCache::Allocate(be, SparseSpec(), dtype, 8, kBlock);
  FATHOM_CHECK(kv.ok());
  SparseCache c{std::move(kv).value(), std::vector<std::vector<float>>(2), std::vector<std::vector<float>>(2)};
  for (int s = 0; s < 2; ++s) {
    c.side[s] = Random(static_cast<size_t>(kLens[s] * kSide), seed + s, side_scale);
    c.latent[s] = Random(static_cast<size_t>(kLens[s] * (kLora + kRope)), seed + 10 + s);
  }
  FillCache(be, c.kv.layer(0), c.side, c.latent, kLens);
  return c;
}

// The indexer's choice by its definition, in double precision.
std::vector<int32_t> ExpectedSelection(const std::vector<float>& q, const std::vector<float>& w,
                                       const std::vector<float>& side, int64_t t, int64_t heads, int32_t pos,
                                       int64_t topk, double scale) {
  std::vector<double> score(static_cast<size_t>(pos + 1));
  for (int32_t j = 0; j <= pos; ++j) {
    double sum = 0;
    for (int64_t h = 0; h < heads; ++h) {
      double dot = 0;
      for (int64_t e = 0; e < kSide; ++e) dot += double(q[(t * heads + h) * kSide + e]) * side[j * kSide + e];
      sum += w[t * heads + h] * std::max(dot, 0.0);
    }
    score[static_cast<size_t>(j)] = sum * scale;
  }
  std::vector<int32_t> order(static_cast<size_t>(pos + 1));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  order.resize(static_cast<size_t>(std::min<int64_t>(topk, pos + 1)));
  std::sort(order.begin(), order.end());
  order.resize(static_cast<size_t>(topk), -1);
  return order;
}

TEST(CpuMlaSparseTest, SelectKeepsTheTopKByTheIndexScoreInPositionOrder) {
  CpuBackend be;
  SparseCache c = RandomCache(be, DType::kF32, 10);
  const KvCache* kv = &c.kv;
  Batch b = TwoSequences(0, 11, 5, 2);
  auto dev = BatchOnDevice::Upload(b.fb, be);
  ASSERT_TRUE(dev.ok());
  const int64_t n = b.fb.num_tokens(), heads = 3, topk = 4;
  const std::vector<float> qv = Random(static_cast<size_t>(n * heads * kSide), 1);
  const std::vector<float> wv = Random(static_cast<size_t>(n * heads), 2);
  Tensor selected = be.Alloc(DType::kI32, {n, topk});
  const float scale = 0.3f;
  MlaSparseOps& ops = Sparse(be);
  const AttentionPlan plan = ops.Plan(dev->meta(), {.heads = 2, .k_dim = kLora + kRope, .v_dim = kLora}, kv->layer(0));
  ops.Select(plan, FromVector(qv, {n, heads, kSide}), FromVector(wv, {n, heads}), kv->layer(0), dev->meta(), scale,
             selected);
  ASSERT_TRUE(be.Synchronize().ok());
  int64_t partial = 0, full = 0;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<int32_t> want =
        ExpectedSelection(qv, wv, c.side[b.seq[t]], t, heads, b.positions[t], topk, scale);
    const std::vector<int32_t> got(selected.data<int32_t>() + t * topk, selected.data<int32_t>() + (t + 1) * topk);
    EXPECT_EQ(got, want) << "token " << t << " at position " << b.positions[t];
    (b.positions[t] + 1 < topk ? partial : full) += 1;
  }
  EXPECT_EQ(partial, 3);  // positions 0, 1, 2 keep every earlier token and end their lists with -1
  EXPECT_EQ(full, n - 3);
}

// An FP8 cache's side rows (e4m3 with a scale a row group) are scored as the values they hold: the choice equals the
// one over a float32 cache that holds those dequantized rows.
TEST(CpuMlaSparseTest, SelectOverAnFp8SideRowScoresTheValuesItHolds) {
  CpuBackend be;
  SparseCache c8 = RandomCache(be, DType::kF8E4M3, 60, /*side_scale=*/5.0f);
  const KvCache* f8 = &c8.kv;
  const std::vector<std::vector<float>>& side = c8.side;
  const std::vector<int32_t>& lens = kLens;
  auto f32 = KvCache::Allocate(be, SparseSpec(), DType::kF32, 8, kBlock);
  ASSERT_TRUE(f32.ok());
  // The dequantized rows, written into the float32 cache.
  std::vector<std::vector<float>> held(2);
  Batch layout = TwoSequences(0, lens[0], 0, lens[1]);
  for (int s = 0; s < 2; ++s) {
    for (int32_t p = 0; p < lens[s]; ++p) {
      const int64_t slot = layout.tables[s][p / kBlock] * kBlock + p % kBlock;
      std::vector<float> row(kSide);
      cpu::LoadCacheRow(cpu::CacheRow(f8->layer(0).side, slot, kBlock, 0), DType::kF8E4M3,
                        cpu::ScaleRow(f8->layer(0).side_scale, slot, kBlock, 0), kSide, kSide, row.data());
      held[s].insert(held[s].end(), row.begin(), row.end());
      for (int64_t e = 0; e < kSide; ++e) {
        EXPECT_NEAR(row[e], side[s][p * kSide + e], std::abs(side[s][p * kSide + e]) / 16 + 1e-6) << s << " " << p;
      }
    }
  }
  FillCache(be, f32->layer(0), held, c8.latent, lens);
  Batch b = TwoSequences(0, 11, 5, 2);
  auto dev = BatchOnDevice::Upload(b.fb, be);
  ASSERT_TRUE(dev.ok());
  const int64_t n = b.fb.num_tokens(), heads = 3, topk = 4;
  Tensor q = FromVector(Random(static_cast<size_t>(n * heads * kSide), 11), {n, heads, kSide});
  Tensor w = FromVector(Random(static_cast<size_t>(n * heads), 12), {n, heads});
  Tensor sel8 = be.Alloc(DType::kI32, {n, topk}), sel32 = be.Alloc(DType::kI32, {n, topk});
  Sparse(be).Select(AttentionPlan{}, q, w, f8->layer(0), dev->meta(), 0.5f, sel8);
  Sparse(be).Select(AttentionPlan{}, q, w, f32->layer(0), dev->meta(), 0.5f, sel32);
  ASSERT_TRUE(be.Synchronize().ok());
  EXPECT_EQ(std::vector<int32_t>(sel8.data<int32_t>(), sel8.data<int32_t>() + n * topk),
            std::vector<int32_t>(sel32.data<int32_t>(), sel32.data<int32_t>() + n * topk));
}

TEST(CpuMlaSparseTest, EqualScoresGoToTheLowerPosition) {
  CpuBackend be;
  auto kv = KvCache::Allocate(be, SparseSpec(), DType::kF32, 8, kBlock);
  ASSERT_TRUE(kv.ok());
  const std::vector<int32_t>& lens = kLens;
  // Every key row of the first sequence the same: every score ties. In the second, rows 1 and 4 are the largest and
  // equal, and row 2 is zero (a score of exactly 0 after the ReLU, as are all rows that every head scores below 0).
  std::vector<std::vector<float>> side(2), latent(2);
  side[0].assign(static_cast<size_t>(lens[0] * kSide), 0.5f);
  side[1].assign(static_cast<size_t>(lens[1] * kSide), 0.25f);
  for (int64_t e = 0; e < kSide; ++e) {
    side[1][1 * kSide + e] = side[1][4 * kSide + e] = 1.0f;
    side[1][2 * kSide + e] = 0.0f;
  }
  for (int s = 0; s < 2; ++s) latent[s] = Random(static_cast<size_t>(lens[s] * (kLora + kRope)), 30 + s);
  FillCache(be, kv->layer(0), side, latent, lens);
  Batch b = TwoSequences(10, 1, 6, 1);
  auto dev = BatchOnDevice::Upload(b.fb, be);
  ASSERT_TRUE(dev.ok());
  const int64_t heads = 2, topk = 3;
  Tensor q = FromVector(std::vector<float>(2 * heads * kSide, 1.0f), {2, heads, kSide});
  Tensor w = FromVector(std::vector<float>(2 * heads, 1.0f), {2, heads});
  Tensor selected = be.Alloc(DType::kI32, {2, topk});
  MlaSparseOps& ops = Sparse(be);
  ops.Select(AttentionPlan{}, q, w, kv->layer(0), dev->meta(), 1.0f, selected);
  ASSERT_TRUE(be.Synchronize().ok());
  const int32_t* s = selected.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(s, s + 3), (std::vector<int32_t>{0, 1, 2}));
  // Rows 1 and 4 (score 4), then the 0.25 rows 0, 3, 5, 6 (score 1): the lowest of them, 0.
  EXPECT_EQ(std::vector<int32_t>(s + 3, s + 6), (std::vector<int32_t>{0, 1, 4}));
  // The bf16 golden tests' hook (model/moe.h): each token's margin, the gap at the top-k boundary relative to the
  // terms' size. Keeping 2: the first sequence's ties give 0; the second keeps rows 1 and 4 (4) over 1: 3 / 4.
  std::vector<float> margins;
  const SelectionMarginObserver observer = [&](int64_t t, float m) {
    EXPECT_EQ(t, static_cast<int64_t>(margins.size()));
    margins.push_back(m);
  };
  Tensor two = be.Alloc(DType::kI32, {2, 2});
  SetSelectionMarginObserver(&observer);
  ops.Select(AttentionPlan{}, q, w, kv->layer(0), dev->meta(), 1.0f, two);
  SetSelectionMarginObserver(nullptr);
  EXPECT_EQ(margins, (std::vector<float>{0.0f, 0.75f}));
  ops.Select(AttentionPlan{}, q, w, kv->layer(0), dev->meta(), 1.0f, two);  // unobserved: nothing more
  EXPECT_EQ(margins.size(), 2u);
}

TEST(CpuMlaSparseTest, SparseAbsorbedAttendsToTheSelectedRowsOnly) {
  CpuBackend be;
  SparseCache c = RandomCache(be, DType::kF32, 40);
  const KvCache* kv = &c.kv;
  Batch b = TwoSequences(0, 11, 5, 2);
  auto dev = BatchOnDevice::Upload(b.fb, be);
  ASSERT_TRUE(dev.ok());
  const int64_t n = b.fb.num_tokens(), heads = 2, d = kLora + kRope, topk = 3;
  const float scale = 0.4f;
  Tensor q = FromVector(Random(static_cast<size_t>(n * heads * d), 3), {n, heads, d});
  // Every position selected: the dense absorbed attention, bit for bit.
  Tensor all = be.Alloc(DType::kI32, {n, 11});
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t j = 0; j < 11; ++j) all.data<int32_t>()[t * 11 + j] = j <= b.positions[t] ? j : -1;
  }
  Tensor dense = be.Alloc(DType::kF32, {n, heads, kLora}), sparse = be.Alloc(DType::kF32, {n, heads, kLora});
  testing::MlaAbsorbed(be, q, kv->layer(0), dev->meta(), scale, dense);
  Sparse(be).SparseAbsorbed(AttentionPlan{}, q, kv->layer(0), dev->meta(), all, TensorView(), scale, sparse);
  ASSERT_TRUE(be.Synchronize().ok());
  EXPECT_EQ(testing::MaxAbsDiff(dense.data<float>(), sparse.data<float>(), n * heads * kLora), 0.0f);
  // A chosen subset: the softmax over those rows alone.
  Tensor some = be.Alloc(DType::kI32, {n, topk});
  for (int64_t t = 0; t < n; ++t) {
    const int32_t p = b.positions[t];
    const std::vector<int32_t> pick = p >= 4 ? std::vector<int32_t>{0, p / 2, p} : std::vector<int32_t>{p, -1, -1};
    std::copy(pick.begin(), pick.end(), some.data<int32_t>() + t * topk);
  }
  Sparse(be).SparseAbsorbed(AttentionPlan{}, q, kv->layer(0), dev->meta(), some, TensorView(), scale, sparse);
  ASSERT_TRUE(be.Synchronize().ok());
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float>& rows = c.latent[b.seq[t]];
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<int32_t> pick;
      for (int64_t i = 0; i < topk && some.data<int32_t>()[t * topk + i] >= 0; ++i) {
        pick.push_back(some.data<int32_t>()[t * topk + i]);
      }
      std::vector<double> p(pick.size());
      double mx = -1e30, sum = 0;
      for (size_t i = 0; i < pick.size(); ++i) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += double(q.data<float>()[(t * heads + h) * d + e]) * rows[pick[i] * d + e];
        p[i] = dot * scale;
        mx = std::max(mx, p[i]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int64_t e = 0; e < kLora; ++e) {
        double want = 0;
        for (size_t i = 0; i < pick.size(); ++i) want += p[i] / sum * rows[pick[i] * d + e];
        EXPECT_NEAR(sparse.data<float>()[(t * heads + h) * kLora + e], want, 1e-5) << t << " " << h << " " << e;
      }
    }
  }
  // A selected position past the token's own is an error, not a read of another token's row.
  some.data<int32_t>()[0] = 5;  // token 0 is at position 0
  Sparse(be).SparseAbsorbed(AttentionPlan{}, q, kv->layer(0), dev->meta(), some, TensorView(), scale, sparse);
  EXPECT_EQ(be.Synchronize().code(), StatusCode::kInvalidArgument);
}

TEST(CpuMlaSparseTest, WriteIndexKeysNormsRotatesByHalvesAndWritesTheSideRow) {
  CpuBackend be;
  auto kv = KvCache::Allocate(be, SparseSpec(), DType::kF32, 8, kBlock);
  ASSERT_TRUE(kv.ok());
  Batch b = TwoSequences(0, 3, 0, 2);
  auto dev = BatchOnDevice::Upload(b.fb, be);
  ASSERT_TRUE(dev.ok());
  const int64_t n = 5;
  const std::vector<float> kin = Random(static_cast<size_t>(n * kSide), 5, 3.0f);
  const std::vector<float> wv = Random(kSide, 6), bv = Random(kSide, 7);
  const std::vector<float> cv = Random(static_cast<size_t>(n), 8), sv = Random(static_cast<size_t>(n), 9);
  Tensor k = FromVector(kin, {n, kSide});
  // One rotated pair (kRope = 2: values 0 and 1, halves of the rope part), values 2 and 3 pass through.
  Sparse(be).WriteIndexKeys(k, FromVector(wv, {kSide}), FromVector(bv, {kSide}), 1e-6f, FromVector(cv, {n, 1}),
                            FromVector(sv, {n, 1}), dev->meta(), kv->layer(0));
  ASSERT_TRUE(be.Synchronize().ok());
  const TensorView& side = kv->layer(0).side;
  for (int64_t t = 0; t < n; ++t) {
    double mean = 0, var = 0;
    for (int64_t e = 0; e < kSide; ++e) mean += kin[t * kSide + e] / double(kSide);
    for (int64_t e = 0; e < kSide; ++e) var += std::pow(kin[t * kSide + e] - mean, 2) / double(kSide);
    std::vector<double> y(kSide);
    for (int64_t e = 0; e < kSide; ++e) y[e] = (kin[t * kSide + e] - mean) / std::sqrt(var + 1e-6) * wv[e] + bv[e];
    const double x1 = y[0], x2 = y[1];
    y[0] = x1 * cv[t] - x2 * sv[t];
    y[1] = x2 * cv[t] + x1 * sv[t];
    const int32_t p = b.positions[t];
    const int64_t slot = b.tables[b.seq[t]][p / kBlock] * kBlock + p % kBlock;
    for (int64_t e = 0; e < kSide; ++e) {
      EXPECT_NEAR(side.data<float>()[slot * kSide + e], y[e], 1e-5) << t << " " << e;
    }
  }
}

TEST(CpuMlaSparseTest, TheSideRowIsAllocatedCountedAndCopiedWithItsBlock) {
  CpuBackend be;
  const KvCacheSpec spec = SparseSpec();
  EXPECT_EQ(spec.values_per_token(), kLora + kRope + kSide);
  EXPECT_EQ(spec.bytes_per_token(DType::kBF16), 2 * (kLora + kRope + kSide));
  // FP8: one scale for the latent row's groups (gcd(8, 6) = 2: 4 of them) and one for the side row (4 values: 1).
  EXPECT_EQ(spec.bytes_per_token(DType::kF8E4M3), (kLora + kRope + kSide) + 4 * (4 + 1));
  KvCacheSpec dense = spec;
  dense.side_dim = 0;
  EXPECT_FALSE(dense.SameShape(spec));
  auto kv = KvCache::Allocate(be, spec, DType::kF8E4M3, 4, kBlock);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->layer(0).side.shape(), (std::vector<int64_t>{4, kBlock, 1, kSide}));
  EXPECT_EQ(kv->layer(0).side_scale.shape(), (std::vector<int64_t>{4, kBlock, 1, 1}));
  auto f32 = KvCache::Allocate(be, spec, DType::kF32, 4, kBlock);
  ASSERT_TRUE(f32.ok());
  const TensorView side = f32->layer(0).side;
  for (int64_t i = 0; i < kBlock * kSide; ++i) side.data<float>()[1 * kBlock * kSide + i] = static_cast<float>(i + 1);
  const KvBlockCopy copy{.src = 1, .dst = 3};
  ASSERT_TRUE(CopyKvBlocks(be, *f32, std::span<const KvBlockCopy>(&copy, 1)).ok());
  for (int64_t i = 0; i < kBlock * kSide; ++i) {
    EXPECT_EQ(side.data<float>()[3 * kBlock * kSide + i], static_cast<float>(i + 1));
  }
}

}  // namespace
}  // namespace fathom
