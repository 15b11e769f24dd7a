// Mixture-of-experts routing as DeepSeek defines it, on the host in float32. Backends with a device router must
// choose exactly the same experts (see the tie rule).
//
//   RouterConfig rc = RouterConfigFrom(cfg.moe);
//   std::vector<int32_t> ids(n * rc.top_k);     // [n_tokens, top_k]
//   std::vector<float> weights(n * rc.top_k);   // [n_tokens, top_k]
//   RouteExperts(rc, logits /* [n_tokens, n_experts] */, n, bias /* [n_experts] or nullptr */, ids.data(),
//                weights.data());
//
// Tie rule: between equal scores the lower expert (or group) index wins; selected experts are listed from the
// highest selection score down. The rule itself is model/moe_route.h, shared with the GPU.
#pragma once

#include <cstdint>
#include <functional>

#include "io/model_config.h"
#include "model/moe_route.h"

namespace fathom {

struct RouterConfig {
  enum class Scoring { kSoftmax, kSigmoid, kSqrtSoftplus };
  enum class Method { kGreedy, kGroupLimitedGreedy, kNoauxTc };
  int64_t n_experts = 0;
  int64_t top_k = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  Scoring scoring = Scoring::kSoftmax;
  Method method = Method::kGreedy;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

RouterConfig RouterConfigFrom(const MoeConfig& moe);

// The rule's parameters for moe_route::RouteToken (checks top_k, the expert count and the groups).
moe_route::Params RouteParams(const RouterConfig& rc);

// V2: softmax scores; greedy top-k, or top-k within the topk_group groups with the highest max score.
// V3 (noaux_tc): sigmoid scores; selection on score + bias; groups ranked by the sum of their top-2 selection
// scores; experts outside the kept groups masked to -inf. Weights are the unbiased scores of the chosen experts,
// normalized to sum 1 when norm_topk_prob, then times routed_scaling_factor.
void RouteExperts(const RouterConfig& rc, const float* logits, int64_t n_tokens, const float* bias, int32_t* ids,
                  float* weights);
// The same with the rule's parameters (RouteParams), as the backends' MoeRoute takes them.
void RouteExperts(const moe_route::Params& p, const float* logits, int64_t n_tokens, const float* bias, int32_t* ids,
                  float* weights);

// A token's selection margin: how far its expert choice is from changing. The smallest gap at a selection boundary:
// the last chosen expert's selection value against the best one left out and, for grouped routing, the last kept
// group's value against the best dropped group's. +inf when nothing is left out.
float SelectionMargin(const moe_route::Params& p, const float* logits, const float* bias);

// Test hook (the bf16 golden tests): while set on the calling thread, RouteExperts reports every routed token's
// SelectionMargin, in order (row t of each call as token t), and so does any other top-k choice of the CPU reference
// (DeepSeek-V3.2's indexer: the gap between its last kept and best dropped score, relative to the size of the
// terms summed into them). Pass nullptr to clear.
using SelectionMarginObserver = std::function<void(int64_t token, float margin)>;
void SetSelectionMarginObserver(const SelectionMarginObserver* observer);
// Whether one is set on this thread, and the report to it (nothing when none is).
bool SelectionMarginObserved();
void ReportSelectionMargin(int64_t token, float margin);

}  // namespace fathom
