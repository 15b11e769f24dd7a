#include "model/weight_specs.h"

#include <fmt/format.h>

namespace fathom {

std::string LayerName(int64_t i, const std::string& rest) {
  return fmt::format("model.layers.{}.{}", i, rest);
}

WeightSpec& WeightSpecBuilder::Tensor(std::string name, std::vector<int64_t> shape, WeightInit init) {
  return Tensor(std::move(name), std::move(shape), init, cfg_.dtype);
}

WeightSpec& WeightSpecBuilder::Tensor(std::string name, std::vector<int64_t> shape, WeightInit init, DType dtype) {
  WeightSpec w;
  w.name = std::move(name);
  w.shape = std::move(shape);
  w.dtype = dtype;
  w.init = init;
  specs_.push_back(std::move(w));
  return specs_.back();
}

void WeightSpecBuilder::Embedding(std::string name) {
  WeightSpec& w = Tensor(std::move(name), {cfg_.vocab_size, cfg_.hidden_size});
  // One row per token: counted neither as read nor as active beyond that row (DeepSeek's "activated" convention).
  w.read_fraction = w.active_fraction = 1.0 / static_cast<double>(cfg_.vocab_size);
}

void WeightSpecBuilder::Linear(const std::string& prefix, int64_t out, int64_t in, LinearOptions options) {
  if (!status_.ok()) return;
  StatusOr<std::shared_ptr<const LinearMethod>> method =
      LinearMethodFor(cfg_.quant, prefix, options.quantizable, options.routed_expert);
  if (!method.ok()) {
    status_ = method.status();
    return;
  }
  LinearSpec l;
  l.prefix = prefix;
  l.out = out;
  l.in = in;
  l.bias = options.bias;
  l.dtype = cfg_.dtype;
  l.read_fraction = l.active_fraction = options.active;
  l.split = options.split;
  l.parallel = parallel_;
  l.parts = options.parts;
  l.part = options.part;
  status_ = AddLinearSpecs(*std::move(method), l, &specs_);
}

void WeightSpecBuilder::RequireSplit(const char* what, int64_t n) {
  if (!status_.ok() || parallel_.Divides(n)) return;
  status_ = InvalidArgumentError(
      fmt::format("{} ({}) does not split into {} tensor-parallel ranks", what, n, parallel_.tp_size));
}

void WeightSpecBuilder::RequireKvSplit(int64_t num_kv_heads) {
  if (!status_.ok() || parallel_.SplitsKvHeads(num_kv_heads)) return;
  status_ = InvalidArgumentError(fmt::format(
      "num_key_value_heads ({}) does not split into {} tensor-parallel ranks, nor do the ranks share its heads evenly",
      num_kv_heads, parallel_.tp_size));
}

StatusOr<std::vector<WeightSpec>> WeightSpecBuilder::Finish() {
  if (!status_.ok()) return status_;
  return std::move(specs_);
}

}  // namespace fathom
