#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"

namespace fathom {

RouterConfig RouterConfigFrom(const MoeConfig& moe) {
  RouterConfig rc;
  rc.n_experts = moe.n_routed_experts;
  rc.top_k = moe.num_experts_per_tok;
  rc.n_group = moe.n_group;
  rc.topk_group = moe.topk_group;
  rc.scoring = moe.scoring_func == "sigmoid" ? RouterConfig::Scoring::kSigmoid : RouterConfig::Scoring::kSoftmax;
  rc.method = moe.topk_method == "noaux_tc"               ? RouterConfig::Method::kNoauxTc
              : moe.topk_method == "group_limited_greedy" ? RouterConfig::Method::kGroupLimitedGreedy
                                                          : RouterConfig::Method::kGreedy;
  rc.norm_topk_prob = moe.norm_topk_prob;
  rc.routed_scaling_factor = static_cast<float>(moe.routed_scaling_factor);
  return rc;
}

namespace {

// Indices of the k largest values, highest first, lower index first among equals.
void TopK(const std::vector<float>& v, int64_t k, std::vector<int32_t>& out) {
  out.resize(v.size());
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(),
                    [&](int32_t a, int32_t b) { return v[a] != v[b] ? v[a] > v[b] : a < b; });
  out.resize(static_cast<size_t>(k));
}

}  // namespace

void RouteExperts(const RouterConfig& rc, const float* logits, int64_t n_tokens, const float* bias, int32_t* ids,
                  float* weights) {
  const int64_t e = rc.n_experts, k = rc.top_k;
  FATHOM_CHECK(k >= 1 && k <= e, "top_k {} with {} experts", k, e);
  FATHOM_CHECK(rc.n_group >= 1 && e % rc.n_group == 0 && rc.topk_group <= rc.n_group);
  const int64_t per_group = e / rc.n_group;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(static_cast<size_t>(e)), choice(static_cast<size_t>(e));
  std::vector<float> group_score(static_cast<size_t>(rc.n_group)), tmp;
  std::vector<int32_t> top, groups;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * e;
    if (rc.scoring == RouterConfig::Scoring::kSoftmax) {
      const float mx = *std::max_element(l, l + e);
      float sum = 0.0f;
      for (int64_t i = 0; i < e; ++i) sum += (scores[i] = std::exp(l[i] - mx));
      for (int64_t i = 0; i < e; ++i) scores[i] /= sum;
    } else {
      for (int64_t i = 0; i < e; ++i) scores[i] = 1.0f / (1.0f + std::exp(-l[i]));
    }
    for (int64_t i = 0; i < e; ++i) choice[i] = scores[i] + (bias != nullptr ? bias[i] : 0.0f);
    if (rc.method != RouterConfig::Method::kGreedy && rc.n_group > 1) {
      for (int64_t g = 0; g < rc.n_group; ++g) {
        const float* c = choice.data() + g * per_group;
        if (rc.method == RouterConfig::Method::kNoauxTc) {
          tmp.assign(c, c + per_group);
          std::sort(tmp.begin(), tmp.end(), std::greater<float>());
          group_score[g] = tmp[0] + (per_group > 1 ? tmp[1] : 0.0f);
        } else {
          group_score[g] = *std::max_element(c, c + per_group);
        }
      }
      TopK(group_score, rc.topk_group, groups);
      std::vector<bool> keep(static_cast<size_t>(rc.n_group), false);
      for (int32_t g : groups) keep[g] = true;
      for (int64_t i = 0; i < e; ++i) {
        if (!keep[i / per_group]) choice[i] = neg_inf;
      }
    }
    TopK(choice, k, top);
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = top[j];
      weights[t * k + j] = scores[top[j]];
      sum += scores[top[j]];
    }
    for (int64_t j = 0; j < k; ++j) {
      if (rc.norm_topk_prob) weights[t * k + j] /= (sum + 1e-20f);
      weights[t * k + j] *= rc.routed_scaling_factor;
    }
  }
}

}  // namespace fathom
