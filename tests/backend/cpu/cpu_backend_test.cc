// CpuBackend ops against straightforward double-precision references.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "format/fp8_block.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "testing/attention.h"
#include "testing/golden.h"
#include "testing/random.h"

namespace fathom {
namespace {

using testing::FromVector;
using testing::Random;

float Stored(const Tensor& t, size_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kBF16:
      return Bf16ToF32(t.data<uint16_t>()[i]);
    case DType::kF16:
      return F16ToF32(t.data<uint16_t>()[i]);
    case DType::kF8E4M3:
      return F8E4M3ToF32(t.data<uint8_t>()[i]);
    default:
      return NAN;
  }
}

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesReference) {
  CpuBackend be;
  const int64_t n = 5, in = 37, out = 19;
  Tensor x = FromVector(Random(n * in, 1), {n, in});
  Tensor w = FromVector(Random(out * in, 2), {out, in}, GetParam());
  Tensor b = FromVector(Random(out, 3), {out}, GetParam());
  LinearWeight lw;
  lw.weight = w;
  lw.bias = b;
  Tensor y = be.Alloc(DType::kF32, {n, out});
  be.Linear(x, lw, y);
  ASSERT_TRUE(be.Synchronize().ok());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < out; ++r) {
      double ref = Stored(b, static_cast<size_t>(r));
      for (int64_t c = 0; c < in; ++c)
        ref += double(x.data<float>()[t * in + c]) * Stored(w, static_cast<size_t>(r * in + c));
      EXPECT_NEAR(y.data<float>()[t * out + r], ref, 1e-5) << t << "," << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16));

TEST(CpuBackendTest, LinearFp8BlockScales) {
  CpuBackend be;
  const int64_t n = 3, in = 20, out = 10, bn = 4, bk = 8;  // partial edge blocks in both dims
  Tensor x = FromVector(Random(n * in, 4), {n, in});
  Tensor w = FromVector(Random(out * in, 5, 2.0f), {out, in}, DType::kF8E4M3);
  const int64_t sn = (out + bn - 1) / bn, sk = (in + bk - 1) / bk;
  std::vector<float> sv(static_cast<size_t>(sn * sk));
  for (size_t i = 0; i < sv.size(); ++i) sv[i] = 0.5f + 0.25f * static_cast<float>(i);
  Tensor s = Tensor::Empty(DType::kF32, {sn, sk});
  std::copy(sv.begin(), sv.end(), s.data<float>());
  LinearWeight lw = Fp8BlockWeight(w, s, bn, bk);
  Tensor y = be.Alloc(DType::kF32, {n, out});
  be.Linear(x, lw, y);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < out; ++r) {
      double ref = 0;
      for (int64_t c = 0; c < in; ++c) {
        ref += double(x.data<float>()[t * in + c]) * Stored(w, static_cast<size_t>(r * in + c)) *
               sv[static_cast<size_t>((r / bn) * sk + c / bk)];
      }
      EXPECT_NEAR(y.data<float>()[t * out + r], ref, 1e-4);
    }
  }
}

TEST(CpuBackendTest, RmsNormAndAddRmsNorm) {
  CpuBackend be;
  const int64_t n = 3, h = 10;
  auto xv = Random(n * h, 6);
  Tensor x = FromVector(xv, {n, h});
  Tensor w = FromVector(Random(h, 7), {h}, DType::kBF16);
  Tensor y = be.Alloc(DType::kF32, {n, h});
  be.RmsNorm(x, w, 1e-6f, y);
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += double(xv[t * h + i]) * xv[t * h + i];
    const double inv = 1.0 / std::sqrt(ss / h + 1e-6);
    for (int64_t i = 0; i < h; ++i) {
      EXPECT_NEAR(y.data<float>()[t * h + i], xv[t * h + i] * inv * Stored(w, static_cast<size_t>(i)), 1e-5);
    }
  }
  Tensor res = FromVector(xv, {n, h});
  Tensor d = FromVector(Random(n * h, 8), {n, h});
  be.AddRmsNorm(res, d, w, 1e-6f, y);
  Tensor sum = FromVector(xv, {n, h});
  be.AddInPlace(sum, d);
  Tensor y2 = be.Alloc(DType::kF32, {n, h});
  be.RmsNorm(sum, w, 1e-6f, y2);
  for (int64_t i = 0; i < n * h; ++i) {
    EXPECT_EQ(res.data<float>()[i], sum.data<float>()[i]);
    EXPECT_EQ(y.data<float>()[i], y2.data<float>()[i]);
  }
}

TEST(CpuBackendTest, ArgMaxTakesTheLowestIndexAmongEqualMaxima) {
  CpuBackend be;
  Tensor l =
      FromVector({0.5f, 2.0f, 2.0f, -1.0f, /**/ -3.0f, -3.0f, -3.0f, -3.0f, /**/ 1.0f, 0.0f, 0.0f, 7.0f}, {3, 4});
  Tensor ids = be.Alloc(DType::kI32, {3});
  be.ArgMax(l, ids);
  EXPECT_EQ(ids.data<int32_t>()[0], 1);
  EXPECT_EQ(ids.data<int32_t>()[1], 0);
  EXPECT_EQ(ids.data<int32_t>()[2], 3);
}

// Rows 3 and 1 of 5 (listed out of order) over a 70-id vocabulary (3 words, the last partial): exactly the ids whose
// bit is clear become -inf, allowed ids keep their bits (a NaN and an infinity included), other rows are untouched.
TEST(CpuBackendTest, MaskLogitsSetsExactlyTheDisallowedIdsOfTheListedRowsToMinusInfinity) {
  CpuBackend be;
  const int64_t n = 5, vocab = 70, words = 3;
  std::vector<float> values = Random(static_cast<size_t>(n * vocab), 11, 3.0f);
  values[1 * vocab + 5] = NAN;
  values[3 * vocab + 64] = INFINITY;
  Tensor logits = FromVector(values, {n, vocab});
  const std::vector<int32_t> rows = {3, 1};
  // Row 3: even ids below 64, and ids 64 and 69 (bits past 70 set: ignored). Row 1: ids 0, 5, 33 and 68.
  const std::vector<uint32_t> masks = {0x55555555u,    0x55555555u, 0xffffffc0u | 1u | (1u << 5),
                                       1u | (1u << 5), 1u << 1,     1u << 4};
  ASSERT_TRUE(be.MaskLogits(logits, rows, masks, words).ok());
  const auto allowed = [&](size_t i, int64_t t) { return ((masks[i * words + t / 32] >> (t % 32)) & 1u) != 0; };
  for (int64_t r = 0; r < n; ++r) {
    const auto listed = std::find(rows.begin(), rows.end(), r);
    for (int64_t t = 0; t < vocab; ++t) {
      const float got = logits.data<float>()[r * vocab + t], before = values[static_cast<size_t>(r * vocab + t)];
      if (listed != rows.end() && !allowed(static_cast<size_t>(listed - rows.begin()), t)) {
        EXPECT_EQ(got, -INFINITY) << "row " << r << " id " << t;
      } else {
        EXPECT_EQ(std::memcmp(&got, &before, sizeof(float)), 0) << "row " << r << " id " << t << " changed";
      }
    }
  }
  // Spot checks against the masks as written.
  EXPECT_EQ(logits.data<float>()[3 * vocab + 1], -INFINITY);
  EXPECT_NE(logits.data<float>()[3 * vocab + 2], -INFINITY);
  EXPECT_EQ(logits.data<float>()[3 * vocab + 64], INFINITY);
  EXPECT_NE(logits.data<float>()[3 * vocab + 69], -INFINITY);
  EXPECT_EQ(logits.data<float>()[3 * vocab + 68], -INFINITY);
  EXPECT_TRUE(std::isnan(logits.data<float>()[1 * vocab + 5]));
  EXPECT_NE(logits.data<float>()[1 * vocab + 68], -INFINITY);
  EXPECT_EQ(logits.data<float>()[1 * vocab + 1], -INFINITY);
  // Nothing listed: nothing changes.
  Tensor again = FromVector(values, {n, vocab});
  ASSERT_TRUE(be.MaskLogits(again, {}, {}, words).ok());
  EXPECT_EQ(std::memcmp(again.data<float>(), values.data(), values.size() * sizeof(float)), 0);
}

TEST(CpuBackendTest, MaskLogitsChecksItsSizes) {
  CpuBackend be;
  Tensor logits = FromVector(Random(2 * 40, 3), {2, 40});
  const std::vector<int32_t> row = {1}, bad_row = {2};
  const std::vector<uint32_t> two(2, 0u), three(3, 0u);
  EXPECT_DEATH((void)be.MaskLogits(logits, row, three, 3), "words_per_row");
  EXPECT_DEATH((void)be.MaskLogits(logits, row, three, 2), "masks.size");
  EXPECT_DEATH((void)be.MaskLogits(logits, bad_row, two, 2), "row 2 outside");
}

TEST(CpuBackendTest, RopeInterleavedEqualsNeoxOnPermutedInput) {
  CpuBackend be;
  const int64_t n = 4, heads = 2, d = 8, half = d / 2;
  Tensor pos = Tensor::Empty(DType::kI32, {n});
  for (int i = 0; i < n; ++i) pos.data<int32_t>()[i] = 3 * i + 1;
  Tensor inv = Tensor::Empty(DType::kF32, {half});
  for (int i = 0; i < half; ++i) inv.data<float>()[i] = std::pow(10000.0f, -2.0f * i / d);
  Tensor cos = be.Alloc(DType::kF32, {n, half}), sin = be.Alloc(DType::kF32, {n, half});
  be.RopeCosSin(pos, inv, 1.0f, cos, sin);
  EXPECT_NEAR(cos.data<float>()[1 * half + 0], std::cos(4.0), 1e-6);
  auto xv = Random(n * heads * d, 9);
  Tensor a = FromVector(xv, {n, heads, d});
  // b holds a's pairs de-interleaved: (x0, x2, x4, x6, x1, x3, x5, x7).
  Tensor b = Tensor::Empty(DType::kF32, {n, heads, d});
  for (int64_t r = 0; r < n * heads; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      b.data<float>()[r * d + i] = xv[r * d + 2 * i];
      b.data<float>()[r * d + half + i] = xv[r * d + 2 * i + 1];
    }
  }
  be.ApplyRope(a, cos, sin, /*interleaved=*/true);
  be.ApplyRope(b, cos, sin, /*interleaved=*/false);
  for (int64_t r = 0; r < n * heads; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      EXPECT_FLOAT_EQ(a.data<float>()[r * d + 2 * i], b.data<float>()[r * d + i]);
      EXPECT_FLOAT_EQ(a.data<float>()[r * d + 2 * i + 1], b.data<float>()[r * d + half + i]);
    }
  }
  // Rotation keeps each pair's norm.
  const float x0 = xv[0], x1 = xv[half];
  Tensor c = FromVector(xv, {n, heads, d});
  be.ApplyRope(c, cos, sin, false);
  EXPECT_NEAR(std::hypot(c.data<float>()[0], c.data<float>()[half]), std::hypot(x0, x1), 1e-6);
}

// Paged attention over scattered blocks against dense causal attention on the original K/V.
class PagedAttentionTest : public ::testing::TestWithParam<DType> {};

TEST_P(PagedAttentionTest, MatchesDenseReference) {
  CpuBackend be;
  const int64_t heads = 4, kv_heads = 2, d = 8, block = 4;
  const std::vector<int32_t> cached = {0, 5, 9};  // three sequences: prefill, partial block, crosses blocks
  const std::vector<int32_t> fresh = {6, 1, 3};
  KvCacheSpec spec{1, kv_heads, d, d, false};
  auto kv = KvCache::Allocate(be, spec, GetParam(), 32, block);
  ASSERT_TRUE(kv.ok());
  testing::ScatteredBlocks blocks(32, 3);
  std::vector<std::vector<float>> ks(3), vs(3);  // [len, kv_heads, d] per sequence
  std::vector<std::vector<int32_t>> tables(3);
  for (int s = 0; s < 3; ++s) {
    const int32_t len = cached[s] + fresh[s];
    ks[s] = Random(static_cast<size_t>(len * kv_heads * d), 100 + s);
    vs[s] = Random(static_cast<size_t>(len * kv_heads * d), 200 + s);
    tables[s] = blocks.Take((len + block - 1) / block);
  }
  // First write the cached prefixes, then run the batch of new tokens.
  for (int phase = 0; phase < 2; ++phase) {
    ForwardBatch fb(static_cast<int32_t>(block));
    std::vector<float> kin, vin;
    for (int s = 0; s < 3; ++s) {
      const int32_t from = phase == 0 ? 0 : cached[s], count = phase == 0 ? cached[s] : fresh[s];
      std::vector<int32_t> toks(static_cast<size_t>(count), 0);
      fb.AddSequence(toks, from, tables[s], LogitsMode::kNone);
      kin.insert(kin.end(), ks[s].begin() + from * kv_heads * d, ks[s].begin() + (from + count) * kv_heads * d);
      vin.insert(vin.end(), vs[s].begin() + from * kv_heads * d, vs[s].begin() + (from + count) * kv_heads * d);
    }
    const int64_t n = fb.num_tokens();
    if (n == 0) continue;
    auto dev = BatchOnDevice::Upload(fb, be);
    ASSERT_TRUE(dev.ok());
    Tensor kt = FromVector(kin, {n, kv_heads, d}), vt = FromVector(vin, {n, kv_heads, d});
    be.WriteKv(kt, vt, dev->meta(), kv->layer(0));
    if (phase == 0) continue;
    auto qv = Random(static_cast<size_t>(n * heads * d), 7);
    Tensor q = FromVector(qv, {n, heads, d});
    Tensor out = be.Alloc(DType::kF32, {n, heads, d});
    const float scale = 0.35f;
    testing::PagedAttention(be, q, kv->layer(0), dev->meta(), scale, out);
    ASSERT_TRUE(be.Synchronize().ok());
    auto round = [&](float v) { return GetParam() == DType::kBF16 ? Bf16ToF32(F32ToBf16(v)) : v; };
    int64_t row = 0;
    for (int s = 0; s < 3; ++s) {
      for (int32_t i = 0; i < fresh[s]; ++i, ++row) {
        const int32_t p = cached[s] + i;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kv_heads);
          std::vector<double> sc(static_cast<size_t>(p + 1));
          double mx = -1e30;
          for (int32_t j = 0; j <= p; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < d; ++e)
              dot += double(qv[(row * heads + h) * d + e]) * round(ks[s][(j * kv_heads + g) * d + e]);
            sc[j] = dot * scale;
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (auto& v : sc) sum += (v = std::exp(v - mx));
          for (int64_t e = 0; e < d; ++e) {
            double ref = 0;
            for (int32_t j = 0; j <= p; ++j) ref += sc[j] / sum * round(vs[s][(j * kv_heads + g) * d + e]);
            EXPECT_NEAR(out.data<float>()[(row * heads + h) * d + e], ref, 1e-5) << s << " " << i << " " << h;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, PagedAttentionTest, ::testing::Values(DType::kF32, DType::kBF16));

// The FP8 cache's layout and sizes (KvCacheSpec::k_scale_group): a dense head keeps one scale per token and head,
// MLA's latent row (576 values, V its first 512) nine scales of 64 values.
TEST(Fp8KvCacheTest, ScaleGroupsAndBytesPerToken) {
  const KvCacheSpec qwen{28, 4, 128, 128, false};
  EXPECT_EQ(qwen.k_scale_group(), 128);
  EXPECT_EQ(qwen.v_scale_group(), 128);
  EXPECT_EQ(qwen.bytes_per_token(DType::kBF16), 28 * 4 * 256 * 2);
  EXPECT_EQ(qwen.bytes_per_token(DType::kF8E4M3), 28 * 4 * 2 * (128 + 4));  // 1.94x the tokens of bf16
  const KvCacheSpec v3{61, 1, 576, 512, true};
  EXPECT_EQ(v3.k_scale_group(), 64);
  EXPECT_EQ(v3.bytes_per_token(DType::kF8E4M3), 61 * (576 + 9 * 4));  // 612 bytes a layer
  EXPECT_EQ(v3.bytes_per_token(DType::kBF16), 61 * 576 * 2);
  const KvCacheSpec tiny_mla{2, 1, 48, 32, true};  // gcd 16: three scales, V's the first two
  EXPECT_EQ(tiny_mla.k_scale_group(), 16);
  EXPECT_EQ((KvCacheSpec{1, 2, 96, 96, false}.k_scale_group()), 96);
  EXPECT_EQ((KvCacheSpec{1, 2, 192, 192, false}.k_scale_group()), 64);
  CpuBackend be;
  auto kv = KvCache::Allocate(be, tiny_mla, DType::kF8E4M3, 4, 16);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->layer(1).k_scale.shape(), (std::vector<int64_t>{4, 16, 1, 3}));
  EXPECT_EQ(kv->layer(1).v_scale.shape(), (std::vector<int64_t>{4, 16, 1, 2}));
  EXPECT_EQ(kv->layer(1).v_scale.raw(), kv->layer(1).k_scale.raw());
  EXPECT_TRUE(KvCache::Allocate(be, qwen, DType::kBF16, 2, 16)->layer(0).k_scale.empty());
  EXPECT_EQ(ParseKvCacheDtype("fp8", DType::kBF16).value(), DType::kF8E4M3);
  EXPECT_EQ(ParseKvCacheDtype("fp8_e4m3", DType::kBF16).value(), DType::kF8E4M3);
  EXPECT_EQ(ParseKvCacheDtype("auto", DType::kBF16).value(), DType::kBF16);
  EXPECT_EQ(ParseKvCacheDtype("int8", DType::kBF16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseKvCacheDtype("fp8_e5m2", DType::kBF16).status().code(), StatusCode::kInvalidArgument);
}

// WriteKv into an FP8 cache: each (token, head, group) gets scale = max|x| / 448 and e4m3(x / scale) values, so the
// largest value comes back exactly and every other within e4m3's rounding (half a unit of 3 mantissa bits, or half the
// smallest subnormal). PagedAttention and GatherContext read exactly those dequantized values: they equal the same ops
// on a float32 cache that holds them. Rows span magnitudes from 1e-3 to 1e2 (one scale each), and MLA's shared
// latent row (V inside K, three scale groups) is covered. CopyKvBlocks carries the scales along.
TEST(Fp8KvCacheTest, WritesPerTokenScalesAndReadsBackTheDequantizedValues) {
  CpuBackend be;
  for (const KvCacheSpec& spec : {KvCacheSpec{1, 2, 8, 8, false}, KvCacheSpec{1, 1, 48, 32, true}}) {
    const int64_t kvh = spec.num_kv_heads, kd = spec.k_dim, vd = spec.v_dim, block = 4, n = 11, heads = 4;
    auto f8 = KvCache::Allocate(be, spec, DType::kF8E4M3, 8, block);
    auto f32 = KvCache::Allocate(be, spec, DType::kF32, 8, block);
    ASSERT_TRUE(f8.ok() && f32.ok());
    ForwardBatch fb(static_cast<int32_t>(block));
    const std::vector<int32_t> table = {5, 2, 7};
    fb.AddSequence(std::vector<int32_t>(static_cast<size_t>(n), 0), 0, table, LogitsMode::kNone);
    auto dev = BatchOnDevice::Upload(fb, be);
    ASSERT_TRUE(dev.ok());
    std::vector<float> kin = Random(static_cast<size_t>(n * kvh * kd), 11);
    std::vector<float> vin = Random(static_cast<size_t>(n * kvh * vd), 12);
    for (int64_t r = 0; r < n * kvh; ++r) {  // magnitudes 1e-3 .. 1e2 by row
      const float m = std::pow(10.0f, static_cast<float>(r % 6) - 3.0f);
      for (int64_t i = 0; i < kd; ++i) kin[static_cast<size_t>(r * kd + i)] *= m;
      for (int64_t i = 0; i < vd; ++i) vin[static_cast<size_t>(r * vd + i)] *= m;
    }
    Tensor kt = FromVector(kin, {n, kvh, kd}), vt = FromVector(vin, {n, kvh, vd});
    const TensorView v_arg = spec.v_in_k ? TensorView() : vt.view();
    be.WriteKv(kt, v_arg, dev->meta(), f8->layer(0));
    ASSERT_TRUE(be.Synchronize().ok());
    // Dequantize by hand; check the rule; fill the f32 cache with the dequantized rows.
    const KvLayerView c8 = f8->layer(0), c32 = f32->layer(0);
    auto check_rows = [&](const TensorView& cache, const TensorView& scales, const TensorView& out,
                          const std::vector<float>& src, int64_t dim) {
      const int64_t group = spec.k_scale_group();
      for (int64_t t = 0; t < n; ++t) {
        const int64_t slot = fb.slot_mapping[static_cast<size_t>(t)];
        const int64_t b = slot / block, o = slot % block;
        for (int64_t h = 0; h < kvh; ++h) {
          const uint8_t* codes = static_cast<const uint8_t*>(cache.raw()) + b * cache.stride(0) + o * cache.stride(1) +
                                 h * cache.stride(2);
          const float* sc = scales.data<float>() + b * scales.stride(0) + o * scales.stride(1) + h * scales.stride(2);
          float* dst = out.data<float>() + b * out.stride(0) + o * out.stride(1) + h * out.stride(2);
          const float* x = src.data() + (t * kvh + h) * dim;
          for (int64_t g0 = 0; g0 < dim; g0 += group) {
            float amax = 0.0f;
            for (int64_t i = g0; i < g0 + group; ++i) amax = std::max(amax, std::fabs(x[i]));
            ASSERT_EQ(sc[g0 / group], amax / 448.0f) << t << " " << h << " " << g0;
            for (int64_t i = g0; i < g0 + group; ++i) {
              const float deq = F8E4M3ToF32(codes[i]) * sc[g0 / group];
              dst[i] = deq;
              EXPECT_LE(std::fabs(deq - x[i]), std::fabs(x[i]) / 16.0f + sc[g0 / group] / 1024.0f * 1.0001f)
                  << t << " " << h << " " << i;
              if (std::fabs(x[i]) == amax) {
                EXPECT_NEAR(std::fabs(deq), amax, amax * 1e-6f);
              }
            }
          }
        }
      }
    };
    check_rows(c8.k, c8.k_scale, c32.k, kin, kd);
    if (!spec.v_in_k) check_rows(c8.v, c8.v_scale, c32.v, vin, vd);
    // Attention and the context gather read the dequantized values.
    const std::vector<float> qv = Random(static_cast<size_t>(n * heads * kd), 13);
    Tensor q = FromVector(qv, {n, heads, kd});
    Tensor o8 = be.Alloc(DType::kF32, {n, heads, vd}), o32 = be.Alloc(DType::kF32, {n, heads, vd});
    testing::PagedAttention(be, q, c8, dev->meta(), 0.3f, o8);
    testing::PagedAttention(be, q, c32, dev->meta(), 0.3f, o32);
    ASSERT_TRUE(be.Synchronize().ok());
    EXPECT_LE(testing::MaxAbsDiff(o8.data<float>(), o32.data<float>(), n * heads * vd), 1e-6f);
    if (spec.v_in_k) {
      Tensor g8 = be.Alloc(DType::kF32, {n, kd}), g32 = be.Alloc(DType::kF32, {n, kd});
      testing::Mla(be).GatherContext(c8, dev->meta(), g8);
      testing::Mla(be).GatherContext(c32, dev->meta(), g32);
      ASSERT_TRUE(be.Synchronize().ok());
      EXPECT_EQ(testing::MaxAbsDiff(g8.data<float>(), g32.data<float>(), n * kd), 0.0f);
    }
    // A copied block brings its scales: block 5 (the first 4 tokens) into block 1, read back through a table {1}.
    const KvBlockCopy copy{5, 1};
    ASSERT_TRUE(CopyKvBlocks(be, *f8, std::span<const KvBlockCopy>(&copy, 1)).ok());
    ForwardBatch fb2(static_cast<int32_t>(block));
    const std::vector<int32_t> copied = {1}, original = {5};
    fb2.AddSequence(std::vector<int32_t>(1, 0), 3, copied, LogitsMode::kNone);  // positions 0..3 from block 1
    ForwardBatch fb3(static_cast<int32_t>(block));
    fb3.AddSequence(std::vector<int32_t>(1, 0), 3, original, LogitsMode::kNone);
    auto d2 = BatchOnDevice::Upload(fb2, be);
    auto d3 = BatchOnDevice::Upload(fb3, be);
    ASSERT_TRUE(d2.ok() && d3.ok());
    Tensor q1 = FromVector(std::vector<float>(qv.begin(), qv.begin() + heads * kd), {1, heads, kd});
    Tensor a = be.Alloc(DType::kF32, {1, heads, vd}), b = be.Alloc(DType::kF32, {1, heads, vd});
    testing::PagedAttention(be, q1, c8, d2->meta(), 0.3f, a);
    testing::PagedAttention(be, q1, c8, d3->meta(), 0.3f, b);
    ASSERT_TRUE(be.Synchronize().ok());
    EXPECT_EQ(testing::MaxAbsDiff(a.data<float>(), b.data<float>(), heads * vd), 0.0f);
  }
}

TEST(CpuBackendTest, BadIndicesBecomeErrorsNotCrashes) {
  CpuBackend be;
  Tensor table = FromVector(Random(4 * 3, 1), {4, 3});
  Tensor ids = Tensor::Empty(DType::kI32, {2});
  ids.data<int32_t>()[1] = 9;
  Tensor out = be.Alloc(DType::kF32, {2, 3});
  be.Embedding(ids, table, out);
  Status s = be.Synchronize();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token id 9"), std::string::npos);
  EXPECT_TRUE(be.Synchronize().ok()) << "Synchronize clears the error";

  Tensor rows = be.Alloc(DType::kF32, {1, 3});
  Tensor idx = Tensor::Empty(DType::kI32, {1});
  idx.data<int32_t>()[0] = -1;
  be.GatherRows(table, idx, rows);
  EXPECT_FALSE(be.Synchronize().ok());
}

TEST(CpuBackendTest, SiluMul) {
  CpuBackend be;
  Tensor g = FromVector({-2.0f, 0.0f, 3.0f}, {1, 3}), u = FromVector({1.0f, 5.0f, -1.0f}, {1, 3});
  Tensor o = be.Alloc(DType::kF32, {1, 3});
  be.SiluMul(g, u, o);
  EXPECT_NEAR(o.data<float>()[0], -2.0 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_EQ(o.data<float>()[1], 0.0f);
  EXPECT_NEAR(o.data<float>()[2], -3.0 / (1 + std::exp(-3.0)), 1e-6);
}

}  // namespace
}  // namespace fathom
