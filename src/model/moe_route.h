// DeepSeek's expert choice for one token, written once for the host (model/moe.cc) and the GPU
// (backend/cuda/moe.cu): the same float operations in the same order, so both backends choose the same
// experts with the same weights, ties included.
//
//   moe_route::Params p = ...;                       // from RouterConfig (model/moe.h)
//   float scores[kMaxExperts], choice[kMaxExperts];  // scratch
//   moe_route::RouteToken(p, logits_row, bias_or_null, scores, choice, ids_row, weights_row);
//
// Tie rule: between equal values the lower expert (or group) index wins; chosen experts are listed from the highest
// selection value down. exp is taken in double precision and rounded to float, so the host's and the GPU's
// exponentials agree (each is within an ulp of the double result; they differ only if that lands on a float rounding
// boundary). No expression has a multiply feeding an add, so FMA contraction cannot change a result either.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace fathom::moe_route {

inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxGroups = 64;
inline constexpr int kMaxTopK = 32;

enum Method : int32_t { kGreedy = 0, kGroupLimitedGreedy = 1, kNoauxTc = 2 };

struct Params {
  int32_t n_experts = 0;
  int32_t top_k = 0;
  int32_t n_group = 1;
  int32_t topk_group = 1;
  bool sigmoid = false;  // V3 scoring; softmax otherwise
  int32_t method = kGreedy;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  bool sqrt_softplus = false;  // V4 scoring, sqrt(softplus(logit)); overrides sigmoid and softmax
  // The experts are given (DeepSeek-V4's hash-routed layers: its token's row of tid2eid): RouteToken reads `ids`
  // instead of choosing, and only weighs them.
  bool fixed_ids = false;
};

FATHOM_HOST_DEVICE float Exp(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

// The value a score ranks by: NaN ranks as -inf, so that the order stays total whatever the router computes (with
// NaN compared as is, every later pick of TopK was skipped and returned -1, an expert id outside the table: found by
// fuzz_model_files with NaN router weights).
FATHOM_HOST_DEVICE float RankValue(float x) {
  return x != x ? -INFINITY : x;
}

// True when (va, a) ranks above (vb, b): the higher value, or the lower index among equal values.
FATHOM_HOST_DEVICE bool RanksAbove(float va, int32_t a, float vb, int32_t b) {
  va = RankValue(va);
  vb = RankValue(vb);
  return va > vb || (va == vb && a < b);
}

// The `k` best of v[0, n) in rank order (RanksAbove), each pick the best of those ranking below the previous one.
FATHOM_HOST_DEVICE void TopK(const float* v, int32_t n, int32_t k, int32_t* out) {
  for (int32_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; ++i) {
      if (j > 0 && !RanksAbove(v[out[j - 1]], out[j - 1], v[i], i)) continue;  // already taken or ranked higher
      if (best < 0 || RanksAbove(v[i], i, v[best], best)) best = i;
    }
    out[j] = best;
  }
}

// A group's rank value from its `per` selection values c: the best (group_limited_greedy) or the sum of the two best
// (noaux_tc).
FATHOM_HOST_DEVICE float GroupValue(const Params& p, const float* c, int32_t per) {
  float best = c[0], second = -INFINITY;
  for (int32_t i = 1; i < per; ++i) {
    if (c[i] > best) {
      second = best;
      best = c[i];
    } else if (c[i] > second) {
      second = c[i];
    }
  }
  return p.method == kNoauxTc ? best + (per > 1 ? second : 0.0f) : best;
}

// The chosen experts' weights: their unbiased scores, normalized to sum 1 when norm_topk_prob, then times
// routed_scaling_factor. An id of -1 (no pick: NaN logits) weighs 0.   scores [n_experts]; ids, weights [top_k]
FATHOM_HOST_DEVICE void ChosenWeights(const Params& p, const float* scores, const int32_t* ids, float* weights) {
  float sum = 0.0f;
  for (int32_t j = 0; j < p.top_k; ++j) {
    weights[j] = ids[j] >= 0 ? scores[ids[j]] : 0.0f;
    sum += weights[j];
  }
  for (int32_t j = 0; j < p.top_k; ++j) {
    if (p.norm_topk_prob) weights[j] /= (sum + 1e-20f);
    weights[j] *= p.routed_scaling_factor;
  }
}

// logits [n_experts]; bias [n_experts] or null; scores, choice: scratch [n_experts]; ids, weights [top_k].
// V2: softmax scores; greedy top-k, or top-k within the topk_group groups with the highest max score.
// V4: sqrt(softplus) scores, no groups; hash-routed layers give the ids (fixed_ids).
// V3 (noaux_tc): sigmoid scores; selection on score + bias; groups ranked by the sum of their two best selection
// values; experts outside the kept groups masked to -inf. Weights are the unbiased scores of the chosen experts,
// normalized to sum 1 when norm_topk_prob, then times routed_scaling_factor.
FATHOM_HOST_DEVICE void RouteToken(const Params& p, const float* logits, const float* bias, float* scores,
                                   float* choice, int32_t* ids, float* weights) {
  const int32_t e = p.n_experts, k = p.top_k;
  if (p.sqrt_softplus) {
    // torch's softplus: log1p(exp(x)), x itself above 20.
    for (int32_t i = 0; i < e; ++i) {
      const double x = static_cast<double>(logits[i]);
      scores[i] = static_cast<float>(sqrt(x > 20.0 ? x : log1p(exp(x))));
    }
  } else if (p.sigmoid) {
    for (int32_t i = 0; i < e; ++i) scores[i] = 1.0f / (1.0f + Exp(-logits[i]));
  } else {
    float mx = logits[0];
    for (int32_t i = 1; i < e; ++i) mx = logits[i] > mx ? logits[i] : mx;
    float sum = 0.0f;
    for (int32_t i = 0; i < e; ++i) {
      scores[i] = Exp(logits[i] - mx);
      sum += scores[i];
    }
    for (int32_t i = 0; i < e; ++i) scores[i] /= sum;
  }
  for (int32_t i = 0; i < e; ++i) choice[i] = bias != nullptr ? scores[i] + bias[i] : scores[i];
  if (p.method != kGreedy && p.n_group > 1) {
    const int32_t per = e / p.n_group;
    float group_value[kMaxGroups];
    for (int32_t g = 0; g < p.n_group; ++g) group_value[g] = GroupValue(p, choice + g * per, per);
    int32_t kept[kMaxGroups];
    TopK(group_value, p.n_group, p.topk_group, kept);
    for (int32_t g = 0; g < p.n_group; ++g) {
      bool keep = false;
      for (int32_t j = 0; j < p.topk_group; ++j) keep = keep || kept[j] == g;
      if (!keep) {
        for (int32_t i = g * per; i < (g + 1) * per; ++i) choice[i] = -INFINITY;
      }
    }
  }
  if (p.fixed_ids) {
    for (int32_t j = 0; j < k; ++j) ids[j] = ids[j] >= 0 && ids[j] < e ? ids[j] : -1;  // an id off the table weighs 0
  } else {
    TopK(choice, e, k, ids);
  }
  ChosenWeights(p, scores, ids, weights);
}

}  // namespace fathom::moe_route
