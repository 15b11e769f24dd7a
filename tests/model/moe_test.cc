// Routing on hand-built cases: ties, negative biased scores, and group masks that change the winner.
#include "model/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

namespace fathom {
namespace {

float Logit(float p) {
  return std::log(p / (1.0f - p));
}  // inverse sigmoid

RouterConfig V3(int64_t experts, int64_t k, int64_t groups, int64_t topk_groups) {
  RouterConfig rc;
  rc.n_experts = experts;
  rc.top_k = k;
  rc.n_group = groups;
  rc.topk_group = topk_groups;
  rc.scoring = RouterConfig::Scoring::kSigmoid;
  rc.method = RouterConfig::Method::kNoauxTc;
  rc.norm_topk_prob = true;
  rc.routed_scaling_factor = 2.5f;
  return rc;
}

TEST(MoeRoutingTest, SoftmaxGreedyTopK) {
  RouterConfig rc;
  rc.n_experts = 4;
  rc.top_k = 2;
  const float logits[] = {0.0f, 2.0f, 1.0f, -1.0f};
  int32_t ids[2];
  float w[2];
  RouteExperts(rc, logits, 1, nullptr, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  const double z = std::exp(0.0) + std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(w[0], std::exp(2.0) / z, 1e-6);  // not renormalized (norm_topk_prob false), factor 1
  EXPECT_NEAR(w[1], std::exp(1.0) / z, 1e-6);
}

TEST(MoeRoutingTest, TiesGoToTheLowerIndex) {
  RouterConfig rc;
  rc.n_experts = 5;
  rc.top_k = 2;
  const float logits[] = {1.0f, 3.0f, 1.0f, 3.0f, 3.0f};
  int32_t ids[2];
  float w[2];
  RouteExperts(rc, logits, 1, nullptr, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
}

TEST(MoeRoutingTest, NanScoresRankLastAndEveryPickIsAnExpert) {
  // NaN router logits (NaN weights in a checkpoint) once left picks at -1, an index outside the expert table.
  const float nan = std::nanf("");
  for (const RouterConfig& rc : {V3(8, 4, 4, 2), [] {
                                   RouterConfig g;
                                   g.n_experts = 8;
                                   g.top_k = 4;
                                   return g;
                                 }()}) {
    const float logits[] = {nan, 1.0f, nan, nan, -2.0f, nan, nan, nan};
    int32_t ids[4];
    float w[4];
    RouteExperts(rc, logits, 1, nullptr, ids, w);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 8);
    }
    EXPECT_NE(ids[0], ids[1]);
    const float all_nan[8] = {nan, nan, nan, nan, nan, nan, nan, nan};
    RouteExperts(rc, all_nan, 1, nullptr, ids, w);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 8);
    }
  }
}

TEST(MoeRoutingTest, GroupLimitedGreedyRanksGroupsByMax) {
  RouterConfig rc;
  rc.n_experts = 6;
  rc.top_k = 2;
  rc.n_group = 3;
  rc.topk_group = 1;
  rc.method = RouterConfig::Method::kGroupLimitedGreedy;
  // Group 0 {0,1}: max 2.0; group 1 {2,3}: max 2.5 but a weak partner; group 2 {4,5}: 1.9, 1.9.
  const float logits[] = {2.0f, 1.8f, 2.5f, -3.0f, 1.9f, 1.9f};
  int32_t ids[2];
  float w[2];
  RouteExperts(rc, logits, 1, nullptr, ids, w);
  EXPECT_EQ(ids[0], 2);  // only group 1 is kept
  EXPECT_EQ(ids[1], 3);
}

TEST(MoeRoutingTest, NoauxTcGroupMaskChangesTheWinner) {
  // Two groups of 4. Expert 0 has the highest score, but group 1's top-2 sum is larger, so group 0 is masked and
  // expert 0 loses to experts of group 1.
  RouterConfig rc = V3(8, 2, 2, 1);
  const float p[] = {0.95f, 0.10f, 0.10f, 0.10f, 0.80f, 0.70f, 0.05f, 0.05f};
  float logits[8];
  for (int i = 0; i < 8; ++i) logits[i] = Logit(p[i]);
  int32_t ids[2];
  float w[2];
  RouteExperts(rc, logits, 1, nullptr, ids, w);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 5);
  EXPECT_NEAR(w[0], 2.5 * 0.80 / 1.50, 1e-5);  // unbiased scores, normalized, times routed_scaling_factor
  EXPECT_NEAR(w[1], 2.5 * 0.70 / 1.50, 1e-5);
}

TEST(MoeRoutingTest, NoauxTcBiasSelectsButDoesNotWeight) {
  RouterConfig rc = V3(4, 2, 1, 1);
  const float p[] = {0.9f, 0.6f, 0.5f, 0.4f};
  float logits[4];
  for (int i = 0; i < 4; ++i) logits[i] = Logit(p[i]);
  // Negative biased scores: expert 0 falls to 0.9 - 1.2 = -0.3, below expert 3 at 0.4 - 0.5 = -0.1.
  const float bias[] = {-1.2f, 0.0f, 0.0f, -0.5f};
  int32_t ids[2];
  float w[2];
  RouteExperts(rc, logits, 1, bias, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[0], 2.5 * 0.6 / 1.1, 1e-5);
  EXPECT_NEAR(w[1], 2.5 * 0.5 / 1.1, 1e-5);
}

TEST(MoeRoutingTest, NegativeBiasedScoresInKeptGroupsBeatMaskedExperts) {
  // Every kept expert has a negative biased score; the masked group's experts (-inf) must still lose.
  RouterConfig rc = V3(4, 2, 2, 1);
  const float p[] = {0.2f, 0.1f, 0.3f, 0.3f};
  float logits[4];
  for (int i = 0; i < 4; ++i) logits[i] = Logit(p[i]);
  const float bias[] = {-0.5f, -0.5f, -2.0f, -2.0f};  // group 0 sums -0.7, group 1 sums -3.4
  int32_t ids[2];
  float w[2];
  RouteExperts(rc, logits, 1, bias, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
}

TEST(MoeRoutingTest, GroupTiesGoToTheLowerGroup) {
  RouterConfig rc = V3(4, 1, 2, 1);
  const float logits[] = {0.0f, 0.0f, 0.0f, 0.0f};
  int32_t ids[1];
  float w[1];
  RouteExperts(rc, logits, 1, nullptr, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_NEAR(w[0], 2.5, 1e-6);  // a single expert normalizes to 1
}

// The selection margin: the gap between the last chosen expert and the best one left out, and for grouped routing
// between the last kept group and the best dropped one; the observer sees every routed token's margin.
TEST(MoeRoutingTest, SelectionMarginIsTheGapAtTheBoundary) {
  RouterConfig rc;
  rc.n_experts = 4;
  rc.top_k = 2;
  const float logits[] = {0.0f, 2.0f, 1.0f, 0.9f, /* token 1: a tie at the boundary */ 1.0f, 3.0f, 1.0f, 0.0f};
  const moe_route::Params p = RouteParams(rc);
  const double z = std::exp(0.0) + std::exp(2.0) + std::exp(1.0) + std::exp(0.9);
  EXPECT_NEAR(SelectionMargin(p, logits, nullptr), (std::exp(1.0) - std::exp(0.9)) / z, 1e-6);
  EXPECT_EQ(SelectionMargin(p, logits + 4, nullptr), 0.0f);
  std::vector<std::pair<int64_t, float>> seen;
  const SelectionMarginObserver observer = [&](int64_t t, float m) { seen.emplace_back(t, m); };
  SetSelectionMarginObserver(&observer);
  int32_t ids[4];
  float w[4];
  RouteExperts(rc, logits, 2, nullptr, ids, w);
  SetSelectionMarginObserver(nullptr);
  RouteExperts(rc, logits, 2, nullptr, ids, w);  // no longer observed
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, 0);
  EXPECT_EQ(seen[1].first, 1);
  EXPECT_EQ(seen[1].second, 0.0f);
  // Grouped (V3): group 1's top-2 sum 1.50 beats group 0's 1.05 by 0.45, less than the experts' boundary gap (0.70,
  // the last chosen, against 0.05, the best left out of the kept group: 0.65).
  RouterConfig v3 = V3(8, 2, 2, 1);
  const float q[] = {0.95f, 0.10f, 0.10f, 0.10f, 0.80f, 0.70f, 0.05f, 0.05f};
  float lq[8];
  for (int i = 0; i < 8; ++i) lq[i] = Logit(q[i]);
  EXPECT_NEAR(SelectionMargin(RouteParams(v3), lq, nullptr), 0.45f, 1e-5);
}

TEST(MoeRoutingTest, ManyTokens) {
  RouterConfig rc = V3(8, 2, 4, 2);
  std::vector<float> logits(3 * 8);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  std::vector<int32_t> ids(6);
  std::vector<float> w(6);
  RouteExperts(rc, logits.data(), 3, nullptr, ids.data(), w.data());
  for (int t = 0; t < 3; ++t) {
    EXPECT_NE(ids[t * 2], ids[t * 2 + 1]);
    EXPECT_NEAR(w[t * 2] + w[t * 2 + 1], 2.5, 1e-5);
  }
}

}  // namespace
}  // namespace fathom
