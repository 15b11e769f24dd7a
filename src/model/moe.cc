#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/check.h"

namespace fathom {

RouterConfig RouterConfigFrom(const MoeConfig& moe) {
  RouterConfig rc;
  rc.n_experts = moe.n_routed_experts;
  rc.top_k = moe.num_experts_per_tok;
  rc.n_group = moe.n_group;
  rc.topk_group = moe.topk_group;
  rc.scoring = moe.scoring_func == "sigmoid"        ? RouterConfig::Scoring::kSigmoid
               : moe.scoring_func == "sqrtsoftplus" ? RouterConfig::Scoring::kSqrtSoftplus
                                                    : RouterConfig::Scoring::kSoftmax;
  rc.method = moe.topk_method == "noaux_tc"               ? RouterConfig::Method::kNoauxTc
              : moe.topk_method == "group_limited_greedy" ? RouterConfig::Method::kGroupLimitedGreedy
                                                          : RouterConfig::Method::kGreedy;
  rc.norm_topk_prob = moe.norm_topk_prob;
  rc.routed_scaling_factor = static_cast<float>(moe.routed_scaling_factor);
  return rc;
}

moe_route::Params RouteParams(const RouterConfig& rc) {
  FATHOM_CHECK(rc.top_k >= 1 && rc.top_k <= rc.n_experts && rc.top_k <= moe_route::kMaxTopK, "top_k {} with {} experts",
               rc.top_k, rc.n_experts);
  FATHOM_CHECK(rc.n_experts <= moe_route::kMaxExperts, "{} experts", rc.n_experts);
  FATHOM_CHECK(rc.n_group >= 1 && rc.n_group <= moe_route::kMaxGroups && rc.n_experts % rc.n_group == 0 &&
               rc.topk_group >= 1 && rc.topk_group <= rc.n_group);
  moe_route::Params p;
  p.n_experts = static_cast<int32_t>(rc.n_experts);
  p.top_k = static_cast<int32_t>(rc.top_k);
  p.n_group = static_cast<int32_t>(rc.n_group);
  p.topk_group = static_cast<int32_t>(rc.topk_group);
  p.sigmoid = rc.scoring == RouterConfig::Scoring::kSigmoid;
  p.sqrt_softplus = rc.scoring == RouterConfig::Scoring::kSqrtSoftplus;
  p.method = rc.method == RouterConfig::Method::kNoauxTc              ? moe_route::kNoauxTc
             : rc.method == RouterConfig::Method::kGroupLimitedGreedy ? moe_route::kGroupLimitedGreedy
                                                                      : moe_route::kGreedy;
  p.norm_topk_prob = rc.norm_topk_prob;
  p.routed_scaling_factor = rc.routed_scaling_factor;
  return p;
}

namespace {
thread_local const SelectionMarginObserver* margin_observer = nullptr;

// v[chosen[k - 1]] minus the best of v outside `chosen` (values of -inf excluded); +inf when none is left.
float BoundaryGap(const std::vector<float>& v, const std::vector<int32_t>& chosen) {
  std::vector<bool> in(v.size(), false);
  for (int32_t c : chosen) in[static_cast<size_t>(c)] = true;
  float best_out = -INFINITY;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!in[i]) best_out = std::max(best_out, v[i]);
  }
  return best_out == -INFINITY ? INFINITY : v[static_cast<size_t>(chosen.back())] - best_out;
}
}  // namespace

float SelectionMargin(const moe_route::Params& p, const float* logits, const float* bias) {
  const size_t e = static_cast<size_t>(p.n_experts);
  std::vector<float> scores(e), choice(e), weights(static_cast<size_t>(p.top_k));
  std::vector<int32_t> ids(static_cast<size_t>(p.top_k));
  moe_route::RouteToken(p, logits, bias, scores.data(), choice.data(), ids.data(), weights.data());
  float margin = BoundaryGap(choice, ids);  // choice: after the group mask
  if (p.method != moe_route::kGreedy && p.n_group > 1) {
    // The groups' values as RouteToken ranks them, from the unmasked selection values.
    const int32_t per = p.n_experts / p.n_group;
    std::vector<float> unmasked(e), group(static_cast<size_t>(p.n_group));
    for (size_t x = 0; x < e; ++x) unmasked[x] = bias != nullptr ? scores[x] + bias[x] : scores[x];
    for (int32_t g = 0; g < p.n_group; ++g) {
      group[static_cast<size_t>(g)] = moe_route::GroupValue(p, unmasked.data() + g * per, per);
    }
    std::vector<int32_t> kept(static_cast<size_t>(p.topk_group));
    moe_route::TopK(group.data(), p.n_group, p.topk_group, kept.data());
    margin = std::min(margin, BoundaryGap(group, kept));
  }
  return margin;
}

void SetSelectionMarginObserver(const SelectionMarginObserver* observer) {
  margin_observer = observer;
}

bool SelectionMarginObserved() {
  return margin_observer != nullptr;
}

void ReportSelectionMargin(int64_t token, float margin) {
  if (margin_observer != nullptr) (*margin_observer)(token, margin);
}

void RouteExperts(const moe_route::Params& p, const float* logits, int64_t n_tokens, const float* bias, int32_t* ids,
                  float* weights) {
  std::vector<float> scores(static_cast<size_t>(p.n_experts)), choice(static_cast<size_t>(p.n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    moe_route::RouteToken(p, logits + t * p.n_experts, bias, scores.data(), choice.data(), ids + t * p.top_k,
                          weights + t * p.top_k);
    if (margin_observer != nullptr && !p.fixed_ids) {
      (*margin_observer)(t, SelectionMargin(p, logits + t * p.n_experts, bias));
    }
  }
}

void RouteExperts(const RouterConfig& rc, const float* logits, int64_t n_tokens, const float* bias, int32_t* ids,
                  float* weights) {
  RouteExperts(RouteParams(rc), logits, n_tokens, bias, ids, weights);
}

}  // namespace fathom
