#include "backend/ops/op_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <random>

#include "core/thread_pool.h"
#include "format/fp8_block.h"
#include "format/int4.h"
#include "model/forward_batch.h"
#include "model/mla_sparse.h"
#include "model/model.h"
#include "model/weights.h"
#include "testing/attention.h"

namespace fathom::ops {

namespace {

constexpr DType F32 = DType::kF32, F16 = DType::kF16, BF16 = DType::kBF16, F8 = DType::kF8E4M3;

std::string_view Name(DType t) {
  return t == F8 ? "f8" : DTypeName(t);
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of the seeded uniform pattern in [0, 1): counter-based, so values do not depend on the thread count.
float Uniform(uint64_t key, int64_t i) {
  return static_cast<float>(Mix(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
}

uint64_t KeyOf(uint32_t seed) {
  return Mix(0x5eed0000ull + seed);
}

// Host values of `dtype`: uniform in [-scale, scale) for the float dtypes (rounded to nearest even), random e4m3 codes
// (every finite value, |v| <= 448) for f8.
Tensor RandomHost(DType dtype, const std::vector<int64_t>& shape, uint32_t seed, float scale) {
  Tensor t = Tensor::Empty(dtype, shape);
  const uint64_t key = KeyOf(seed);
  DefaultThreadPool().ParallelFor(t.numel(), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (dtype == F8) {
        uint8_t code = static_cast<uint8_t>(Mix(key + static_cast<uint64_t>(i)) >> 56);
        if ((code & 0x7f) == 0x7f) code ^= 1;  // 0x7f and 0xff are NaN: +-448 instead
        t.data<uint8_t>()[i] = code;
        continue;
      }
      const float v = (2.0f * Uniform(key, i) - 1.0f) * scale;
      ConvertFromF32(&v, 1, dtype, t.view().raw(), i);
    }
  });
  return t;
}

// f8 block scales like DeepSeek-V3's scale_inv: powers of two in [2^-14, 2^-10].
Tensor RandomScales(const std::vector<int64_t>& shape, uint32_t seed) {
  Tensor t = Tensor::Empty(F32, shape);
  const uint64_t key = KeyOf(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<float>()[i] = std::ldexp(1.0f, -14 + static_cast<int>(Mix(key + static_cast<uint64_t>(i)) % 5));
  }
  return t;
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

double WeightBytes(DType w, int64_t out, int64_t in) {
  const double bytes = static_cast<double>(out) * static_cast<double>(in) * static_cast<double>(DTypeSize(w));
  return w == F8 ? bytes + 4.0 * static_cast<double>(CeilDiv(out, 128) * CeilDiv(in, 128)) : bytes;
}

// `view` (contiguous, on be's device; a float dtype or i32) as host floats.
StatusOr<std::vector<float>> ToHost(Backend& be, const TensorView& view) {
  if (view.empty()) return InternalError("an output was never made");
  const int64_t n = view.numel();
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<char> raw(view.nbytes());
  FATHOM_RETURN_IF_ERROR(be.CopyToHost(view, raw.data()));
  if (view.dtype() == DType::kI32) {
    const int32_t* ids = reinterpret_cast<const int32_t*>(raw.data());
    std::transform(ids, ids + n, out.begin(), [](int32_t v) { return static_cast<float>(v); });
  } else {
    ConvertToF32(raw.data(), view.dtype(), 0, n, out.data());
  }
  return out;
}

// A case's inputs on one backend, the op and what to read back: what every family's Prepare builds.
class Setup final : public OpRun {
 public:
  explicit Setup(Backend& be) : be_(be) {}

  // Inputs. Tensors live as long as this; on a failed upload the error is kept (Run returns it) and the host copy
  // stands in, so that building can go on.
  TensorView Put(Tensor host) {
    StatusOr<Tensor> dev = be_.Upload(host);
    if (!dev.ok()) {
      Check(dev.status());
      keep_.push_back(host);
      return host.view();
    }
    if (dev->view().raw() == host.view().raw()) keep_.push_back(host);  // the CPU backend's upload is a view
    keep_.push_back(*dev);
    return dev->view();
  }
  TensorView Random(DType dtype, const std::vector<int64_t>& shape, uint32_t seed, float scale = 1.0f) {
    return Put(RandomHost(dtype, shape, seed, scale));
  }
  TensorView Zeros(DType dtype, const std::vector<int64_t>& shape) {
    Tensor t = be_.Alloc(dtype, shape);
    keep_.push_back(t);
    return t.view();
  }
  TensorView Ints(const std::vector<int32_t>& v) {
    Tensor t = Tensor::Empty(DType::kI32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return Put(t);
  }
  // The batch's metadata on the device (kept).
  const AttentionMetadata& Meta(const ForwardBatch& b) {
    auto dev = std::make_shared<StatusOr<BatchOnDevice>>(BatchOnDevice::Upload(b, be_));
    Hold(dev);
    if (!dev->ok()) {
      Check(dev->status());
      static const AttentionMetadata kNone;
      return kNone;
    }
    return (*dev)->meta();
  }
  // A linear layer's weights [out, in], dense (with a bias of the weight's dtype) or f8 with 128 x 128 block scales
  // (and a bf16 bias), prepared for the backend (PrepareLinear) as the loader does.
  LinearWeight Weight(DType dtype, int64_t out, int64_t in, uint32_t seed, bool bias) {
    LinearWeight w;
    // Dense: uniform with variance 1 / in, so that outputs stay O(1) at every size.
    w.weight = Random(dtype, {out, in}, seed, std::sqrt(3.0f / static_cast<float>(in)));
    if (dtype == F8)
      w = Fp8BlockWeight(w.weight, Put(RandomScales({CeilDiv(out, 128), CeilDiv(in, 128)}, seed + 1000)));
    if (bias) w.bias = Random(dtype == F8 ? BF16 : dtype, {out}, seed + 2000);
    if (ok()) Check(be_.PrepareLinear(w));
    return w;
  }
  void Hold(std::shared_ptr<void> object) { objects_.push_back(std::move(object)); }
  void Check(const Status& s) {
    if (!s.ok() && status_.ok()) status_ = s;
  }
  bool ok() const { return status_.ok(); }

  // What the run is and what it returns.
  std::function<Status()> op;
  void Output(std::string name, const TensorView& view) {
    outputs_.emplace_back(std::move(name), [view] { return view; });
  }
  void Output(std::string name, std::function<TensorView()> view) {
    outputs_.emplace_back(std::move(name), std::move(view));
  }
  // Host-side work on the outputs after they are read (a difference, a selection).
  std::function<void(std::vector<OpOutput>&)> finish;

  Status Run() override {
    FATHOM_RETURN_IF_ERROR(status_);
    return op();
  }
  StatusOr<std::vector<OpOutput>> Outputs() override {
    FATHOM_RETURN_IF_ERROR(status_);
    FATHOM_RETURN_IF_ERROR(be_.Synchronize());
    std::vector<OpOutput> outs;
    for (const auto& [name, view] : outputs_) {
      FATHOM_ASSIGN_OR_RETURN(std::vector<float> values, ToHost(be_, view()));
      outs.push_back({name, std::move(values)});
    }
    if (finish) finish(outs);
    return outs;
  }

 private:
  Backend& be_;
  Status status_;
  std::vector<Tensor> keep_;
  std::vector<std::shared_ptr<void>> objects_;
  std::vector<std::pair<std::string, std::function<TensorView()>>> outputs_;
};

// Sequences that hold `cached` tokens and get `fresh` ones in one step, with blocks scattered over a cache of
// Blocks() blocks (3 spare).
struct Batch {
  std::string name;
  std::vector<int32_t> cached, fresh;
  int32_t block_size = 16;

  int64_t Blocks() const {
    int64_t b = 3;
    for (size_t i = 0; i < cached.size(); ++i) b += CeilDiv(cached[i] + fresh[i], block_size);
    return b;
  }
  int64_t Tokens() const { return std::accumulate(fresh.begin(), fresh.end(), int64_t{0}); }
  int64_t Context() const {  // sum of seq_lens
    int64_t c = 0;
    for (size_t i = 0; i < cached.size(); ++i) c += cached[i] + fresh[i];
    return c;
  }
  int64_t CausalPairs() const {
    int64_t p = 0;
    for (size_t i = 0; i < cached.size(); ++i) {
      for (int32_t j = 0; j < fresh[i]; ++j) p += cached[i] + j + 1;
    }
    return p;
  }
  std::string ToString() const {
    std::string s = name + "[";
    if (cached.size() <= 4) {
      for (size_t i = 0; i < cached.size(); ++i) s += fmt::format("{}{}+{}", i ? "," : "", cached[i], fresh[i]);
    } else {
      s += fmt::format("{}x({}+{})", cached.size(), cached[0], fresh[0]);
    }
    return s + (block_size != 16 ? fmt::format("] bs={}", block_size) : "]");
  }
  ForwardBatch Step() const {
    std::vector<int32_t> perm(static_cast<size_t>(Blocks()));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    ForwardBatch fb(block_size);
    size_t next = 0;
    for (size_t i = 0; i < cached.size(); ++i) {
      const size_t need = static_cast<size_t>(CeilDiv(cached[i] + fresh[i], block_size));
      const std::vector<int32_t> table(perm.begin() + static_cast<std::ptrdiff_t>(next),
                                       perm.begin() + static_cast<std::ptrdiff_t>(next + need));
      next += need;
      fb.AddSequence(std::vector<int32_t>(static_cast<size_t>(fresh[i]), 0), cached[i], table, LogitsMode::kNone);
    }
    return fb;
  }
};

Batch SameSeqs(std::string name, int n, int32_t cached, int32_t fresh) {
  return {std::move(name), std::vector<int32_t>(static_cast<size_t>(n), cached),
          std::vector<int32_t>(static_cast<size_t>(n), fresh)};
}

// Small batches (every machine) and real ones (GPU-only rows).
const Batch kMixed{"mixed", {0, 37, 100, 20}, {24, 1, 3, 1}};  // a prefill next to decodes and a short chunk
const Batch kDecode{"decode", {37, 100, 20, 63}, {1, 1, 1, 1}};
const Batch kPrefill{"prefill", {0, 16}, {40, 17}};  // whole prompts and a chunk after a cached prefix
const Batch kSmallMla{"mixed", {0, 20}, {9, 1}, 64};
const Batch kRealMixed{"mixed", {0, 300, 1000, 511}, {40, 1, 3, 1}};
const Batch kLongDecode{"decode", {4095}, {1}};
const Batch kBatchDecode = SameSeqs("decode", 64, 1023, 1);
const Batch kWideDecode = SameSeqs("decode", 256, 1023, 1);      // Qwen-7B's 256 sequences at 1k
const Batch kBatchLongDecode = SameSeqs("decode", 64, 4095, 1);  // the MLA targets' 64 sequences x 4k
const Batch kOddBlocks{"decode", {37, 100, 5}, {1, 1, 1}, 6};    // blocks of 6: a 4-key step spans two blocks
const Batch kRealPrefill{"prefill", {0, 1024}, {512, 512}};
const Batch kOddPrefill{"prefill", {0, 7}, {70, 33}, 6};  // blocks of 6 under 64-key tiles, partial query tiles

// Positive float32 scales of an FP8 KV cache, uniform in [0.25, 2) / 448: dequantized values within about +-2.
Tensor RandomKvScales(const std::vector<int64_t>& shape, uint32_t seed) {
  Tensor t = Tensor::Empty(F32, shape);
  const uint64_t key = KeyOf(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = (0.25f + 1.75f * Uniform(key, i)) / 448.0f;
  return t;
}

// A KV cache of `dtype` [blocks, block_size, kv_heads, k_dim] with random contents (and V [.., v_dim] apart, or V as
// the first v_dim values of K for MLA), on the backend. FP8: random e4m3 codes and random scales in KvCacheSpec's
// groups (V's the first of K's when V is inside K).
KvLayerView RandomCache(Setup& s, const Batch& b, int64_t kv_heads, int64_t k_dim, int64_t v_dim, bool v_in_k,
                        DType dtype, uint32_t seed) {
  KvLayerView c;
  c.k = s.Random(dtype, {b.Blocks(), b.block_size, kv_heads, k_dim}, seed);
  c.v = v_in_k ? c.k.Slice(3, 0, v_dim) : s.Random(dtype, {b.Blocks(), b.block_size, kv_heads, v_dim}, seed + 1);
  if (dtype == F8) {
    const KvCacheSpec spec{1, kv_heads, k_dim, v_dim, v_in_k};
    const int64_t kg = k_dim / spec.k_scale_group(), vg = v_dim / spec.v_scale_group();
    c.k_scale = s.Put(RandomKvScales({b.Blocks(), b.block_size, kv_heads, kg}, seed + 100));
    c.v_scale = v_in_k ? c.k_scale.Slice(3, 0, vg)
                       : s.Put(RandomKvScales({b.Blocks(), b.block_size, kv_heads, vg}, seed + 101));
  }
  return c;
}

// A cache's bytes per token and KV head: its values and, for FP8, its scales.
double CacheRowBytes(DType dtype, int64_t dim, int64_t group) {
  const double values = static_cast<double>(dim) * static_cast<double>(DTypeSize(dtype));
  return dtype == F8 ? values + 4.0 * static_cast<double>(dim / group) : values;
}

// cos, sin [n, half] of random angles.
std::pair<TensorView, TensorView> RandomCosSin(Setup& s, int64_t n, int64_t half, uint32_t seed) {
  Tensor c = Tensor::Empty(F32, {n, half}), sn = Tensor::Empty(F32, {n, half});
  const uint64_t key = KeyOf(seed);
  for (int64_t i = 0; i < n * half; ++i) {
    const double angle = 2.0 * std::numbers::pi * Uniform(key, i);
    c.data<float>()[i] = static_cast<float>(std::cos(angle));
    sn.data<float>()[i] = static_cast<float>(std::sin(angle));
  }
  return {s.Put(c), s.Put(sn)};
}

// ---------------------------------------------------------------------------------------------------------------
// The case families: a struct of the row's parameters with Op(), Shape(), DTypes(), Bytes(), Flops() and
// Prepare(Backend&), which builds the inputs and the op on one backend.

// out[t] = table[ids[t]], ids with repeats and both ends of the vocabulary.
struct EmbeddingCase {
  int64_t n, vocab, hidden;
  DType table;
  std::string Op() const { return "Embedding"; }
  std::string Shape() const { return fmt::format("n={} vocab={} hidden={}", n, vocab, hidden); }
  std::string DTypes() const { return fmt::format("table={}", Name(table)); }
  double Bytes() const { return static_cast<double>(n * hidden) * (4.0 + static_cast<double>(DTypeSize(table))); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    const uint64_t key = KeyOf(1);
    for (int64_t t = 0; t < n; ++t) ids[static_cast<size_t>(t)] = static_cast<int32_t>(Mix(key + t) % vocab);
    ids[0] = static_cast<int32_t>(vocab - 1);
    if (n > 2) ids[1] = 0, ids[2] = ids[0];
    const TensorView id = s->Ints(ids);                           // [n]
    const TensorView tab = s->Random(table, {vocab, hidden}, 2);  // [vocab, hidden]
    const TensorView out = s->Zeros(F32, {n, hidden});            // [n, hidden]
    s->op = [&be, id, tab, out] {
      be.Embedding(id, tab, out);
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

// RmsNorm, or AddRmsNorm (residual += x first; both outputs compared).
struct RmsNormCase {
  int64_t n, hidden;
  DType weight;
  bool add = false;
  std::string Op() const { return add ? "AddRmsNorm" : "RmsNorm"; }
  std::string Shape() const { return fmt::format("n={} hidden={}", n, hidden); }
  std::string DTypes() const { return fmt::format("x=f32 weight={}", Name(weight)); }
  double Bytes() const { return (add ? 4.0 : 2.0) * 4.0 * static_cast<double>(n * hidden); }
  double Flops() const { return (add ? 5.0 : 4.0) * static_cast<double>(n * hidden); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView x = s->Random(F32, {n, hidden}, 1, 3.0f);  // [n, hidden]
    const TensorView res = s->Random(F32, {n, hidden}, 2);      // [n, hidden]
    const TensorView w = s->Random(weight, {hidden}, 3);        // [hidden]
    const TensorView out = s->Zeros(F32, {n, hidden});          // [n, hidden]
    const bool fused = add;
    s->op = [&be, x, res, w, out, fused] {
      if (fused) {
        be.AddRmsNorm(res, x, w, 1e-6f, out);
      } else {
        be.RmsNorm(x, w, 1e-6f, out);
      }
      return OkStatus();
    };
    s->Output("out", out);
    if (add) s->Output("residual", res);
    return s;
  }
};

// Linear after PrepareLinear: dense f32/f16/bf16 weights with a bias of their dtype or none, and f8 weights with
// 128 x 128 block scales (partial blocks where out or in is not a multiple of 128).
struct LinearCase {
  int64_t n, in, out;
  DType w;
  bool bias = false;
  std::string Op() const { return "Linear"; }
  std::string Shape() const { return fmt::format("n={} in={} out={}", n, in, out); }
  std::string DTypes() const {
    return fmt::format("x=f32 w={}{}", Name(w), bias ? fmt::format(" bias={}", Name(w == F8 ? BF16 : w)) : "");
  }
  double Bytes() const { return WeightBytes(w, out, in) + 4.0 * static_cast<double>(n * (in + out)); }
  double Flops() const { return 2.0 * static_cast<double>(n) * static_cast<double>(in * out); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView x = s->Random(F32, {n, in}, 1);         // [n, in]
    const LinearWeight lw = s->Weight(w, out, in, 2, bias);  // [out, in]
    const TensorView y = s->Zeros(F32, {n, out});            // [n, out]
    s->op = [&be, x, lw, y] {
      be.Linear(x, lw, y);
      return OkStatus();
    };
    s->Output("y", y);
    return s;
  }
};

// SiluMulLinear: silu(gate) * up through a dense down projection [out, inter], gate and up the halves of one fused
// [n, 2 inter] gate_up output (strided views, as GatedMlp passes them).
struct SiluMulLinearCase {
  int64_t n, inter, out;
  DType w;
  bool bias = false;
  std::string Op() const { return "SiluMulLinear"; }
  std::string Shape() const {
    return fmt::format("n={} inter={} out={} (gate, up: halves of [n, 2 inter])", n, inter, out);
  }
  std::string DTypes() const {
    return fmt::format("x=f32 w={}{}", Name(w), bias ? fmt::format(" bias={}", Name(w)) : "");
  }
  double Bytes() const { return WeightBytes(w, out, inter) + 4.0 * static_cast<double>(n * (2 * inter + out)); }
  double Flops() const { return 2.0 * static_cast<double>(n) * static_cast<double>(inter * out); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView gu = s->Random(F32, {n, 2 * inter}, 1, 3.0f);  // [n, 2 inter]: gate | up
    const TensorView gate = gu.Slice(1, 0, inter), up = gu.Slice(1, inter, 2 * inter);
    const LinearWeight lw = s->Weight(w, out, inter, 2, bias);  // [out, inter]
    const TensorView y = s->Zeros(F32, {n, out});               // [n, out]
    s->op = [&be, gate, up, lw, y] {
      be.SiluMulLinear(gate, up, lw, y);
      return OkStatus();
    };
    s->Output("y", y);
    return s;
  }
};

// A random 4-bit layer [out, in] in its checkpoint's layout (format/int4_linear.cc): AWQ or GPTQ (v1 zeros), groups
// of `group` inputs, GPTQ act-order (g_idx the groups of a random order); random codes and zeros, f16 scales in
// [0.001, 0.02). Not yet prepared.
LinearWeight RandomInt4(Setup& s, LinearFormat format, int64_t out, int64_t in, int64_t group, bool act_order,
                        std::mt19937& rng) {
  const bool awq = format == LinearFormat::kAwq;
  const int64_t groups = CeilDiv(in, group);
  const auto words = [&](std::vector<int64_t> shape) {
    Tensor t = Tensor::Empty(DType::kI32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng());
    return s.Put(t);
  };
  const TensorView qweight = words(awq ? std::vector<int64_t>{in, out / 8} : std::vector<int64_t>{in / 8, out});
  Int4Payload p;
  p.qzeros = words({groups, out / 8});
  Tensor sc = Tensor::Empty(DType::kF16, {groups, out});
  std::uniform_real_distribution<float> sd(0.001f, 0.02f);
  for (int64_t i = 0; i < sc.numel(); ++i) sc.data<uint16_t>()[i] = F32ToF16(sd(rng));
  p.scales = s.Put(sc);
  p.group_size = group;
  p.zero_offset = awq ? 0 : 1;
  if (!awq) {
    std::vector<int32_t> order(static_cast<size_t>(in)), g(static_cast<size_t>(in));
    std::iota(order.begin(), order.end(), 0);
    if (act_order) std::shuffle(order.begin(), order.end(), rng);
    for (int64_t i = 0; i < in; ++i)
      g[static_cast<size_t>(order[static_cast<size_t>(i)])] = static_cast<int32_t>(i / group);
    p.g_idx = s.Ints(g);
  }
  return Int4Weight(format, qweight, out, in, std::move(p));
}

// Linear on a random 4-bit layer in its checkpoint's layout (format/int4_linear.cc): AWQ or GPTQ, groups of `group`
// inputs (-1: the whole row), GPTQ act-order (g_idx the groups of a random order) and v1 zeros; f16 scales and a
// bf16 bias. Prepared as the loader does (the CUDA backend repacks it in place).
struct Int4LinearCase {
  int64_t n, in, out;
  LinearFormat format;
  int64_t group;
  bool act_order = false;
  bool bias = false;
  std::string Op() const { return "Linear"; }
  std::string Shape() const { return fmt::format("n={} in={} out={}", n, in, out); }
  std::string DTypes() const {
    return fmt::format("x=f32 w={} group={}{}{}", format == LinearFormat::kAwq ? "awq" : "gptq", group,
                       act_order ? " act-order" : "", bias ? " bias=bf16" : "");
  }
  int64_t Group() const { return group < 0 ? in : group; }
  double Bytes() const {
    const double groups = static_cast<double>(CeilDiv(in, Group()));
    return 0.5 * static_cast<double>(in * out) + 2.5 * groups * static_cast<double>(out) +
           4.0 * static_cast<double>(n * (in + out));
  }
  double Flops() const { return 2.0 * static_cast<double>(n) * static_cast<double>(in * out); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    std::mt19937 rng(static_cast<uint32_t>(in * 31 + out));
    LinearWeight w = RandomInt4(*s, format, out, in, Group(), act_order, rng);
    if (bias) w.bias = s->Random(BF16, {out}, 2000);
    if (s->ok()) s->Check(be.PrepareLinear(w));
    const TensorView x = s->Random(F32, {n, in}, 1);  // [n, in]
    const TensorView y = s->Zeros(F32, {n, out});     // [n, out]
    s->op = [&be, x, w, y] {
      be.Linear(x, w, y);
      return OkStatus();
    };
    s->Output("y", y);
    return s;
  }
};

// LinearFanOut over parts that share x (q/k/v, gate/up; bf16 and f8 parts mixed); bf16 parts carry a bias if asked.
struct FanOutCase {
  struct Part {
    int64_t out;
    DType w;
  };
  int64_t n, in;
  std::vector<Part> parts;
  bool bias = false;
  std::string Op() const { return "LinearFanOut"; }
  std::string Shape() const {
    std::string outs;
    for (const Part& p : parts) outs += fmt::format("{}{}", outs.empty() ? "" : ",", p.out);
    return fmt::format("n={} in={} outs={}", n, in, outs);
  }
  std::string DTypes() const {
    std::string ws;
    for (const Part& p : parts) ws += fmt::format("{}{}", ws.empty() ? "" : ",", Name(p.w));
    return fmt::format("x=f32 w={}{}", ws, bias ? " bias=bf16" : "");
  }
  double Bytes() const {
    double b = 4.0 * static_cast<double>(n * in);
    for (const Part& p : parts) b += WeightBytes(p.w, p.out, in) + 4.0 * static_cast<double>(n * p.out);
    return b;
  }
  double Flops() const {
    double f = 0.0;
    for (const Part& p : parts) f += 2.0 * static_cast<double>(n) * static_cast<double>(in * p.out);
    return f;
  }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView x = s->Random(F32, {n, in}, 1);  // [n, in]
    std::vector<LinearWeight> ws;
    std::vector<TensorView> outs;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& p = parts[i];
      ws.push_back(s->Weight(p.w, p.out, in, 10 + 3 * static_cast<uint32_t>(i), bias && p.w == BF16));  // [out, in]
      outs.push_back(s->Zeros(F32, {n, p.out}));                                                        // [n, out_i]
      s->Output(fmt::format("y{}", i), outs.back());
    }
    s->op = [&be, x, ws, outs] {
      be.LinearFanOut(x, ws, outs);
      return OkStatus();
    };
    return s;
  }
};

// HeadLinear (MLA's absorbed projections): x [n, heads, in] and out [n, heads, out] as strided views inside rows 64
// values wider (q_nope inside q, q_abs inside its buffer); the whole output buffer is compared.
struct HeadLinearCase {
  int64_t n, heads, in, out;
  DType w;
  std::string Op() const { return "HeadLinear"; }
  std::string Shape() const { return fmt::format("n={} heads={} in={} out={}", n, heads, in, out); }
  std::string DTypes() const { return fmt::format("x=f32 w={}", Name(w)); }
  double Bytes() const {
    return WeightBytes(w, heads * out, in) + 4.0 * static_cast<double>(n * heads) * static_cast<double>(in + out);
  }
  double Flops() const { return 2.0 * static_cast<double>(n * heads) * static_cast<double>(in * out); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView xb = s->Random(F32, {n, heads, in + 64}, 1);  // [n, heads, in + 64]
    const TensorView wt =
        s->Random(w, {heads, out, in}, 2, std::sqrt(3.0f / static_cast<float>(in)));  // [heads, out, in]
    const TensorView ob = s->Zeros(F32, {n, heads, out + 64});                        // [n, heads, out + 64]
    const TensorView x = xb.Slice(2, 0, in), o = ob.Slice(2, 0, out);
    s->op = [&be, x, wt, o] {
      be.HeadLinear(x, wt, o);
      return OkStatus();
    };
    s->Output("out", ob);
    return s;
  }
};

// AddInPlace (a += b), or SiluMul on gate and up read as the halves of one fused [n, 2 d] gate_up output.
struct ElementwiseCase {
  bool silu;
  int64_t n, d;
  std::string Op() const { return silu ? "SiluMul" : "AddInPlace"; }
  std::string Shape() const { return fmt::format("n={} d={}{}", n, d, silu ? " (gate, up: halves of [n, 2d])" : ""); }
  std::string DTypes() const { return "f32"; }
  double Bytes() const { return 3.0 * 4.0 * static_cast<double>(n * d); }
  double Flops() const { return (silu ? 5.0 : 1.0) * static_cast<double>(n * d); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    if (silu) {
      const TensorView gu = s->Random(F32, {n, 2 * d}, 1, 6.0f);  // [n, 2d]: gate | up
      const TensorView out = s->Zeros(F32, {n, d});               // [n, d]
      const TensorView gate = gu.Slice(1, 0, d), up = gu.Slice(1, d, 2 * d);
      s->op = [&be, gate, up, out] {
        be.SiluMul(gate, up, out);
        return OkStatus();
      };
      s->Output("out", out);
    } else {
      const TensorView a = s->Random(F32, {n, d}, 1), b = s->Random(F32, {n, d}, 2);  // [n, d]
      s->op = [&be, a, b] {
        be.AddInPlace(a, b);
        return OkStatus();
      };
      s->Output("a", a);
    }
    return s;
  }
};

// RopeCosSin at positions up to max_pos with inv_freq = theta^(-i / half), times `scale` (YaRN's mscale).
struct RopeCosSinCase {
  int64_t n, half;
  double theta;
  float scale;
  int32_t max_pos;
  std::string Op() const { return "RopeCosSin"; }
  std::string Shape() const {
    return fmt::format("n={} half={} theta={:g} scale={:g} max_pos={}", n, half, theta, scale, max_pos);
  }
  std::string DTypes() const { return "positions=i32 inv_freq=f32"; }
  double Bytes() const { return 8.0 * static_cast<double>(n * half) + 4.0 * static_cast<double>(n + half); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    const uint64_t key = KeyOf(1);
    for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(Mix(key + t) % max_pos);
    pos[0] = 0;
    pos[static_cast<size_t>(n - 1)] = max_pos - 1;
    Tensor inv = Tensor::Empty(F32, {half});
    for (int64_t i = 0; i < half; ++i) {
      inv.data<float>()[i] = static_cast<float>(std::pow(theta, -static_cast<double>(i) / static_cast<double>(half)));
    }
    const TensorView p = s->Ints(pos);                                             // [n]
    const TensorView f = s->Put(inv);                                              // [half]
    const TensorView c = s->Zeros(F32, {n, half}), sn = s->Zeros(F32, {n, half});  // [n, half]
    const float sc = scale;
    s->op = [&be, p, f, sc, c, sn] {
      be.RopeCosSin(p, f, sc, c, sn);
      return OkStatus();
    };
    s->Output("cos", c);
    s->Output("sin", sn);
    return s;
  }
};

// ApplyRope in place on x = [n, heads, head_dim - offset] at value `offset` of each head (a strided view: MLA's q_pe
// after q_nope, k_pe after the latent); rotates its first 2 half values, NeoX halves or interleaved pairs. The whole
// buffer is compared (the rest must stay).
struct ApplyRopeCase {
  int64_t n, heads, head_dim, half;
  bool interleaved;
  int64_t offset = 0;
  std::string Op() const { return "ApplyRope"; }
  std::string Shape() const {
    return fmt::format("n={} heads={} head_dim={} rot={} at={} {}", n, heads, head_dim, 2 * half, offset,
                       interleaved ? "interleaved" : "neox");
  }
  std::string DTypes() const { return "f32"; }
  double Bytes() const { return 8.0 * static_cast<double>(n * heads * 2 * half) + 8.0 * static_cast<double>(n * half); }
  double Flops() const { return 6.0 * static_cast<double>(n * heads * half); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView base = s->Random(F32, {n, heads, head_dim}, 1);  // [n, heads, head_dim]
    const std::pair<TensorView, TensorView> cos_sin = RandomCosSin(*s, n, half, 2);
    const TensorView c = cos_sin.first, sn = cos_sin.second;  // [n, half]
    const TensorView x = base.Slice(2, offset, head_dim);
    const bool il = interleaved;
    s->op = [&be, x, c, sn, il] {
      be.ApplyRope(x, c, sn, il);
      return OkStatus();
    };
    s->Output("x", base);
    return s;
  }
};

// WriteKv of a step's new tokens into scattered slots of a cache with random contents: K and V as strided views of a
// fused [n, 2 kv_heads, d] projection, or (mla) one latent row of d values a token and no V (V inside K).
struct WriteKvCase {
  int64_t kv_heads, d;
  bool mla;
  DType cache;
  Batch batch;
  std::string Op() const { return "WriteKv"; }
  std::string Shape() const {
    return fmt::format("kv_heads={} d={}{} batch={}", kv_heads, d, mla ? " (latent, V in K)" : "", batch.ToString());
  }
  std::string DTypes() const { return fmt::format("k,v=f32 cache={}", Name(cache)); }
  double Bytes() const {
    return static_cast<double>(batch.Tokens() * kv_heads * d) * (mla ? 1.0 : 2.0) *
           (4.0 + static_cast<double>(DTypeSize(cache)));
  }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens();
    const KvLayerView kv = RandomCache(*s, batch, kv_heads, d, mla ? d - 64 : d, mla, cache, 3);
    TensorView k, v;
    if (mla) {
      k = s->Random(F32, {n, 1, d}, 1);  // [n, 1, d]
    } else {
      const TensorView kvp = s->Random(F32, {n, 2 * kv_heads, d}, 1);  // [n, 2 kv_heads, d]: k | v
      k = kvp.Slice(1, 0, kv_heads);
      v = kvp.Slice(1, kv_heads, 2 * kv_heads);
    }
    s->op = [&be, k, v, meta, kv] {
      be.WriteKv(k, v, meta, kv);
      return OkStatus();
    };
    s->Output("k_cache", kv.k);
    if (!mla) s->Output("v_cache", kv.v);
    if (kv.fp8()) s->Output("k_scale", kv.k_scale);
    if (kv.fp8() && !mla) s->Output("v_scale", kv.v_scale);
    return s;
  }
};

// RopeWriteKv on q, k, v as the parts of one fused [n, heads + 2 kv_heads, head_dim] qkv output: q and k rotated in
// place (the first 2 half values of each head), k and v written to their slots.
struct RopeWriteKvCase {
  int64_t heads, kv_heads, head_dim, half;
  bool interleaved;
  DType cache;
  Batch batch;
  std::string Op() const { return "RopeWriteKv"; }
  std::string Shape() const {
    return fmt::format("heads={}/{} head_dim={} rot={} {} batch={}", heads, kv_heads, head_dim, 2 * half,
                       interleaved ? "interleaved" : "neox", batch.ToString());
  }
  std::string DTypes() const { return fmt::format("qkv=f32 cache={}", Name(cache)); }
  double Bytes() const {
    const double t = static_cast<double>(batch.Tokens() * head_dim);
    return t * (8.0 * static_cast<double>(heads + kv_heads) +
                2.0 * static_cast<double>(kv_heads) * (4.0 + static_cast<double>(DTypeSize(cache))));
  }
  double Flops() const { return 6.0 * static_cast<double>(batch.Tokens() * (heads + kv_heads) * half); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens();
    const KvLayerView kv = RandomCache(*s, batch, kv_heads, head_dim, head_dim, false, cache, 3);
    const TensorView qkv = s->Random(F32, {n, heads + 2 * kv_heads, head_dim}, 1);  // [n, heads + 2 kv_heads, d]
    const TensorView q = qkv.Slice(1, 0, heads), k = qkv.Slice(1, heads, heads + kv_heads),
                     v = qkv.Slice(1, heads + kv_heads, heads + 2 * kv_heads);
    const std::pair<TensorView, TensorView> cos_sin = RandomCosSin(*s, n, half, 2);
    const TensorView c = cos_sin.first, sn = cos_sin.second;  // [n, half]
    const bool il = interleaved;
    s->op = [&be, q, k, v, c, sn, il, meta, kv] {
      be.RopeWriteKv(q, k, v, c, sn, il, meta, kv);
      return OkStatus();
    };
    s->Output("qkv", qkv);
    s->Output("k_cache", kv.k);
    s->Output("v_cache", kv.v);
    if (kv.fp8()) {
      s->Output("k_scale", kv.k_scale);
      s->Output("v_scale", kv.v_scale);
    }
    return s;
  }
};

// PagedAttention of a step over a cache with random contents (the step's own tokens included, as WriteKv would have
// left them): GQA, f32 and 16-bit caches, and MLA's latent cache (k 576 = kv_lora 512 + rope 64, V its first 512).
struct AttentionCase {
  int64_t heads, kv_heads, k_dim, v_dim;
  bool mla;
  DType cache;
  Batch batch;
  std::string Op() const { return "PagedAttention"; }
  std::string Shape() const {
    return fmt::format("heads={}/{} k={} v={}{} batch={}", heads, kv_heads, k_dim, v_dim, mla ? " (V in K)" : "",
                       batch.ToString());
  }
  std::string DTypes() const { return fmt::format("q=f32 cache={}", Name(cache)); }
  double Bytes() const {
    const KvCacheSpec spec{1, kv_heads, k_dim, v_dim, mla};
    const double row =
        static_cast<double>(kv_heads) * (CacheRowBytes(cache, k_dim, spec.k_scale_group()) +
                                         (mla ? 0.0 : CacheRowBytes(cache, v_dim, spec.v_scale_group())));
    return static_cast<double>(batch.Context()) * row +
           4.0 * static_cast<double>(batch.Tokens() * heads * (k_dim + v_dim));
  }
  double Flops() const { return 2.0 * static_cast<double>(batch.CausalPairs() * heads * (k_dim + v_dim)); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens();
    const KvLayerView kv = RandomCache(*s, batch, kv_heads, k_dim, v_dim, mla, cache, 3);
    const TensorView q = s->Random(F32, {n, heads, k_dim}, 1);                    // [n, heads, k_dim]
    const TensorView out = s->Zeros(F32, {n, heads, v_dim});                      // [n, heads, v_dim]
    const float scale = 1.0f / std::sqrt(static_cast<float>(mla ? 192 : k_dim));  // MLA: nope 128 + rope 64
    const bool mla_cache = mla;
    s->op = [&be, q, kv, meta, scale, out, mla_cache] {
      // Planned at each run (the op table times one layer); MLA's latent cache through its own provider.
      if (mla_cache) {
        testing::MlaAbsorbed(be, q, kv, meta, scale, out);
      } else {
        testing::PagedAttention(be, q, kv, meta, scale, out);
      }
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

// GatherContext of every sequence's cached rows from a latent cache view [blocks, bs, 1, d] (inside rows `pad`
// values wider when pad > 0: a strided view).
struct GatherContextCase {
  int64_t d;
  int64_t pad;
  DType cache;
  Batch batch;
  std::string Op() const { return "GatherContext"; }
  std::string Shape() const { return fmt::format("d={} pad={} batch={}", d, pad, batch.ToString()); }
  std::string DTypes() const { return fmt::format("cache={} out=f32", Name(cache)); }
  double Bytes() const {
    return static_cast<double>(batch.Context() * d) * (4.0 + static_cast<double>(DTypeSize(cache)));
  }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    KvLayerView kv;
    if (cache == F8) {
      FATHOM_CHECK_EQ(pad, 0);
      kv = RandomCache(*s, batch, 1, d, d - 64, true, F8, 3);  // MLA's latent rows, with their scales
    } else {
      const TensorView kb =
          s->Random(cache, {batch.Blocks(), batch.block_size, 1, d + pad}, 3);  // [blocks, bs, 1, d+pad]
      kv.k = kb.Slice(3, 0, d);
    }
    const TensorView out = s->Zeros(F32, {batch.Context(), d});  // [total_seq_len, d]
    s->op = [&be, kv, meta, out] {
      testing::Mla(be).GatherContext(kv, meta, out);
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

// DeepSeek-V3.2's sparse attention (model/mla_sparse.h's MlaSparseOps) on one layer.
MlaSparseOps& Sparse(Backend& be) {
  return AttentionOpsOf<MlaSparseOps>(be);
}

// Small integers in [-2, 2] of `dtype` (f8: the codes of those values): products and sums of them are exact in
// float32, so that the indexer's scores are the same on every backend and its choice (ties included, which integers
// make many of) can be compared exactly.
TensorView SmallInts(Setup& s, DType dtype, const std::vector<int64_t>& shape, uint32_t seed) {
  Tensor t = Tensor::Empty(dtype, shape);
  const uint64_t key = KeyOf(seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int v = static_cast<int>(Uniform(key, i) * 5.0) - 2;
    if (dtype == F8) {
      constexpr std::array<uint8_t, 5> kCodes = {0xC0, 0xB8, 0x00, 0x38, 0x40};  // e4m3 -2, -1, 0, 1, 2
      t.data<uint8_t>()[i] = kCodes[static_cast<size_t>(v + 2)];
      continue;
    }
    const float f = static_cast<float>(v);
    ConvertFromF32(&f, 1, dtype, t.view().raw(), i);
  }
  return s.Put(t);
}

// The side rows of a cache of `dtype` [blocks, bs, 1, d] (with power-of-two scales for f8), zeros or small integers.
KvLayerView SideCache(Setup& s, const Batch& b, int64_t d, DType dtype, bool ints, uint32_t seed) {
  KvLayerView c;
  c.side = ints ? SmallInts(s, dtype, {b.Blocks(), b.block_size, 1, d}, seed)
                : s.Zeros(dtype, {b.Blocks(), b.block_size, 1, d});
  if (dtype == F8) {
    const KvCacheSpec spec{.side_dim = d};
    c.side_scale = s.Put(RandomScales({b.Blocks(), b.block_size, 1, d / spec.side_scale_group()}, seed + 100));
  }
  return c;
}

// MlaSparseOps::WriteIndexKeys: the indexer's key rows LayerNorm'd, roped by halves and written to the side rows.
struct IndexKeysCase {
  int64_t d, rope;
  DType cache;
  Batch batch;
  std::string Op() const { return "WriteIndexKeys"; }
  std::string Shape() const { return fmt::format("d={} rope={} batch={}", d, rope, batch.ToString()); }
  std::string DTypes() const { return fmt::format("k=f32 cache={}", Name(cache)); }
  double Bytes() const {
    return static_cast<double>(batch.Tokens() * d) * (8.0 + static_cast<double>(DTypeSize(cache)));
  }
  double Flops() const { return static_cast<double>(batch.Tokens() * d) * 10.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens();
    const Tensor k0 = RandomHost(F32, {n, d}, 1, 3.0f);
    const TensorView k = s->Zeros(F32, {n, d});  // [n, d]: the projection, normalized in place at each run
    const TensorView k_in = s->Put(k0);
    const TensorView w = s->Random(F32, {d}, 2), bias = s->Random(F32, {d}, 3);
    const auto [cos, sin] = RandomCosSin(*s, n, rope / 2, 4);
    const KvLayerView kv = SideCache(*s, batch, d, cache, false, 5);
    s->op = [&be, k, k_in, w, bias, cos, sin, meta, kv] {
      be.Copy(k_in, k);
      Sparse(be).WriteIndexKeys(k, w, bias, 1e-6f, cos, sin, meta, kv);
      return OkStatus();
    };
    s->Output("side", kv.side);
    if (cache == F8) s->Output("side_scale", kv.side_scale);
    s->Output("k", k);
    return s;
  }
};

// MlaSparseOps::Select on small-integer inputs (exact scores): the positions must be the CPU's, ties included.
struct IndexerSelectCase {
  int64_t heads, d, topk;
  DType cache;
  Batch batch;
  std::string Op() const { return "IndexerSelect"; }
  std::string Shape() const { return fmt::format("heads={} d={} topk={} batch={}", heads, d, topk, batch.ToString()); }
  std::string DTypes() const { return fmt::format("q=f32 cache={}", Name(cache)); }
  double Bytes() const {
    return static_cast<double>(batch.CausalPairs() * d) * static_cast<double>(DTypeSize(cache)) +
           static_cast<double>(batch.Tokens() * topk) * 4.0;
  }
  double Flops() const { return 2.0 * static_cast<double>(batch.CausalPairs() * heads * d); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens();
    const TensorView q = SmallInts(*s, F32, {n, heads, d}, 1);  // [n, heads, d]
    const TensorView w = SmallInts(*s, F32, {n, heads}, 2);     // [n, heads]
    const KvLayerView kv = SideCache(*s, batch, d, cache, true, 3);
    const TensorView selected = s->Zeros(DType::kI32, {n, topk});  // [n, topk]
    s->op = [&be, q, w, kv, meta, selected] {
      Sparse(be).Select(AttentionPlan{}, q, w, kv, meta, 0.5f, selected);
      return OkStatus();
    };
    s->Output("selected", selected);
    return s;
  }
};

// MlaSparseOps::SparseAbsorbed over random selections of each token's positions (min(topk, context) of them,
// ascending, then -1s), on a random latent cache.
struct SparseAbsorbedCase {
  int64_t heads, k_dim, v_dim, topk;
  DType cache;
  Batch batch;
  std::string Op() const { return "SparseAbsorbed"; }
  std::string Shape() const {
    return fmt::format("heads={} k={} v={} topk={} batch={}", heads, k_dim, v_dim, topk, batch.ToString());
  }
  std::string DTypes() const { return fmt::format("q=f32 cache={}", Name(cache)); }
  int64_t Kept() const {
    int64_t kept = 0;
    for (size_t i = 0; i < batch.cached.size(); ++i) {
      for (int32_t j = 0; j < batch.fresh[i]; ++j) kept += std::min<int64_t>(topk, batch.cached[i] + j + 1);
    }
    return kept;
  }
  double Bytes() const {
    const KvCacheSpec spec{1, 1, k_dim, v_dim, true};
    return static_cast<double>(Kept()) * CacheRowBytes(cache, k_dim, spec.k_scale_group()) +
           4.0 * static_cast<double>(batch.Tokens() * heads * (k_dim + v_dim));
  }
  double Flops() const { return 2.0 * static_cast<double>(Kept() * heads * (k_dim + v_dim)); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens();
    const KvLayerView kv = RandomCache(*s, batch, 1, k_dim, v_dim, true, cache, 3);
    const TensorView q = s->Random(F32, {n, heads, k_dim}, 1);  // [n, heads, k_dim]
    const TensorView out = s->Zeros(F32, {n, heads, v_dim});    // [n, heads, v_dim]
    Tensor sel = Tensor::Empty(DType::kI32, {n, topk});         // [n, topk]
    std::mt19937 rng(11);
    int64_t t = 0;
    for (size_t i = 0; i < batch.cached.size(); ++i) {
      for (int32_t j = 0; j < batch.fresh[i]; ++j, ++t) {
        const int32_t ctx = batch.cached[i] + j + 1;
        std::vector<int32_t> all(static_cast<size_t>(ctx));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        const int64_t keep = std::min<int64_t>(topk, ctx);
        std::sort(all.begin(), all.begin() + keep);
        for (int64_t r = 0; r < topk; ++r) sel.data<int32_t>()[t * topk + r] = r < keep ? all[r] : -1;
      }
    }
    const TensorView selected = s->Put(sel);
    const TensorView lists = s->Zeros(DType::kI32, {MlaSparseOps::ListInts(n, topk)});
    AttentionMetadata lists_meta = meta;
    lists_meta.max_seq_len = std::min<int64_t>(meta.max_seq_len, topk);
    const float scale = 1.0f / std::sqrt(192.0f);
    const AttentionShape shape{.heads = heads, .k_dim = k_dim, .v_dim = v_dim};
    s->op = [&be, q, kv, meta, lists_meta, selected, lists, scale, out, shape] {
      const AttentionPlan plan = Sparse(be).Plan(lists_meta, shape, kv);  // planned at each run, as the model does
      Sparse(be).SparseAbsorbed(plan, q, kv, meta, selected, lists, scale, out);
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

// MlaContextAttention at DeepSeek's dims (nope 128, rope 64, v 128): k_nope and v as the halves of the up-projected
// kv [ctx, heads, 256], k_rope the last 64 values of the latent rows [ctx, 576].
struct MlaContextCase {
  int64_t heads;
  Batch batch;
  static constexpr int64_t kNope = 128, kRope = 64, kV = 128, kLora = 512;
  std::string Op() const { return "MlaContextAttention"; }
  std::string Shape() const {
    return fmt::format("heads={} nope={} rope={} v={} batch={}", heads, kNope, kRope, kV, batch.ToString());
  }
  std::string DTypes() const { return "f32"; }
  double Bytes() const {
    const double ctx = static_cast<double>(batch.Context()), n = static_cast<double>(batch.Tokens());
    return 4.0 * (ctx * static_cast<double>(heads * (kNope + kV) + kRope) +
                  n * static_cast<double>(heads * (kNope + kRope + kV)));
  }
  double Flops() const { return 2.0 * static_cast<double>(batch.CausalPairs() * heads * (kNope + kRope + kV)); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const ForwardBatch fb = batch.Step();
    const AttentionMetadata& meta = s->Meta(fb);
    const int64_t n = fb.num_tokens(), ctx = batch.Context();
    const TensorView q = s->Random(F32, {n, heads, kNope + kRope}, 1);  // [n, heads, 192]
    const TensorView kv = s->Random(F32, {ctx, heads, kNope + kV}, 2);  // [ctx, heads, 256]: k_nope | v
    const TensorView lat = s->Random(F32, {ctx, kLora + kRope}, 3);     // [ctx, 576]
    const TensorView out = s->Zeros(F32, {n, heads, kV});               // [n, heads, 128]
    const TensorView k_nope = kv.Slice(2, 0, kNope), v = kv.Slice(2, kNope, kNope + kV);
    const TensorView k_rope = lat.Slice(1, kLora, kLora + kRope);
    const float scale = 1.0f / std::sqrt(static_cast<float>(kNope + kRope));
    s->op = [&be, q, k_nope, k_rope, v, meta, scale, out] {
      testing::Mla(be).ContextAttention(q, k_nope, k_rope, v, meta, scale, out);
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

// GatherRows with repeated indices.
struct GatherRowsCase {
  int64_t rows, m, d;
  std::string Op() const { return "GatherRows"; }
  std::string Shape() const { return fmt::format("x=[{}, {}] m={}", rows, d, m); }
  std::string DTypes() const { return "f32"; }
  double Bytes() const { return 8.0 * static_cast<double>(m * d); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    std::vector<int32_t> idx(static_cast<size_t>(m));
    const uint64_t key = KeyOf(1);
    for (int64_t i = 0; i < m; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(Mix(key + i) % rows);
    const TensorView x = s->Random(F32, {rows, d}, 2);  // [rows, d]
    const TensorView ix = s->Ints(idx);                 // [m]
    const TensorView out = s->Zeros(F32, {m, d});       // [m, d]
    s->op = [&be, x, ix, out] {
      be.GatherRows(x, ix, out);
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

// ScatterAddRows (the MoE combine): `hot` contributions to row 7 first, the rest to the first half of the rows (the
// second half gets none), onto a random `out`.
struct ScatterAddCase {
  int64_t m, d, rows, hot;
  std::string Op() const { return "ScatterAddRows"; }
  std::string Shape() const { return fmt::format("x=[{}, {}] out_rows={} hot={}", m, d, rows, hot); }
  std::string DTypes() const { return "f32"; }
  double Bytes() const { return 4.0 * static_cast<double>(m * d + 2 * rows * d); }
  double Flops() const { return 2.0 * static_cast<double>(m * d); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    std::vector<int32_t> idx(static_cast<size_t>(m));
    const uint64_t key = KeyOf(1);
    for (int64_t i = 0; i < m; ++i) {
      idx[static_cast<size_t>(i)] = i < hot ? 7 : static_cast<int32_t>(Mix(key + i) % (rows / 2));
    }
    const TensorView x = s->Random(F32, {m, d}, 2);       // [m, d]
    const TensorView ix = s->Ints(idx);                   // [m]
    const TensorView w = s->Random(F32, {m}, 3);          // [m]
    const TensorView out = s->Random(F32, {rows, d}, 4);  // [rows, d]
    s->op = [&be, x, ix, w, out] {
      be.ScatterAddRows(x, ix, w, out);
      return OkStatus();
    };
    s->Output("out", out);
    return s;
  }
};

std::string_view MethodName(int32_t m) {
  return m == moe_route::kGreedy ? "greedy" : m == moe_route::kGroupLimitedGreedy ? "group_limited_greedy" : "noaux_tc";
}

// MoeRoute by DeepSeek's rule on logits ~ 2 N(0, 1) (Box-Muller), continuous or on a grid of 1/8 (many exact ties),
// with the correction bias where the method has one.
struct MoeRouteCase {
  moe_route::Params p;
  bool ties;
  int64_t n;
  std::string Op() const { return "MoeRoute"; }
  std::string Shape() const {
    return fmt::format("n={} experts={} top_k={} groups={}/{} {}{}{} scale={:g}{}", n, p.n_experts, p.top_k,
                       p.topk_group, p.n_group, MethodName(p.method), p.sigmoid ? " sigmoid" : " softmax",
                       p.norm_topk_prob ? " norm" : "", p.routed_scaling_factor, ties ? " ties" : "");
  }
  std::string DTypes() const { return p.method == moe_route::kNoauxTc ? "logits=f32 bias=f32" : "logits=f32"; }
  double Bytes() const { return 4.0 * static_cast<double>(n * (p.n_experts + 2 * p.top_k)); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const int64_t e = p.n_experts;
    const uint64_t key = KeyOf(1);
    const auto draw = [&](int64_t i) {
      const double u1 = (static_cast<double>(Uniform(key, 2 * i)) + 0.5 / 16777216.0), u2 = Uniform(key, 2 * i + 1);
      const float v = static_cast<float>(2.0 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
      return ties ? std::round(v * 8.0f) / 8.0f : v;
    };
    Tensor logits = Tensor::Empty(F32, {n, e}), bias = Tensor::Empty(F32, {e});
    for (int64_t i = 0; i < n * e; ++i) logits.data<float>()[i] = draw(i);
    for (int64_t i = 0; i < e; ++i) bias.data<float>()[i] = draw(n * e + i) * 0.05f;
    const TensorView l = s->Put(logits);                                                          // [n, experts]
    const TensorView b = p.method == moe_route::kNoauxTc ? s->Put(bias) : TensorView();           // [experts] or none
    const TensorView ids = s->Zeros(DType::kI32, {n, p.top_k}), w = s->Zeros(F32, {n, p.top_k});  // [n, top_k]
    const moe_route::Params params = p;
    s->op = [&be, l, b, params, ids, w] {
      be.MoeRoute(l, b, params, ids, w);
      return OkStatus();
    };
    s->Output("ids", ids);
    s->Output("weights", w);
    return s;
  }
};

// PrepareLinear on every expert weight and PrepareExperts, as the loader does, then MoeExperts: n tokens routed to
// top_k distinct experts each (random, or skewed: experts 0 .. top_k - 1 for every token) with weights in [0, 1),
// onto a random residual. The output compared is what the experts added (out - residual). With int4_group > 0 the
// experts are random AWQ 4-bit layers (groups of int4_group inputs, f16 scales) and w is unused.
struct MoeExpertsCase {
  int64_t experts, top_k, hidden, inter;
  DType w;
  int64_t n;
  bool skew = false;
  int64_t int4_group = 0;
  std::string Op() const { return "MoeExperts"; }
  // The variants that send these experts through the host-sorted path by design (CudaBackend::MoeExperts): host_moe,
  // and for 4-bit experts the exact float32 kernels of f32_gemm / generic_linear.
  bool HostPath(std::string_view variant) const {
    return variant == "host_moe" || (int4_group > 0 && (variant == "f32_gemm" || variant == "generic_linear"));
  }
  std::string Shape() const {
    return fmt::format("n={} experts={} top_k={} hidden={} inter={}{}", n, experts, top_k, hidden, inter,
                       skew ? " skewed" : "");
  }
  std::string DTypes() const {
    return int4_group > 0 ? fmt::format("x=f32 experts=awq group={}", int4_group)
                          : fmt::format("x=f32 experts={}", Name(w));
  }
  double WeightBytes(int64_t out, int64_t in) const {
    if (int4_group == 0) return ops::WeightBytes(w, out, in);
    return 0.5 * static_cast<double>(out * in) + 2.5 * static_cast<double>(CeilDiv(in, int4_group) * out);
  }
  double ActiveExperts() const {
    if (skew) return static_cast<double>(top_k);
    const double e = static_cast<double>(experts);
    return e * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / e, static_cast<double>(n)));
  }
  double Bytes() const {
    return ActiveExperts() * (2.0 * WeightBytes(inter, hidden) + WeightBytes(hidden, inter)) +
           12.0 * static_cast<double>(n * hidden);
  }
  double Flops() const { return 6.0 * static_cast<double>(n * top_k) * static_cast<double>(hidden * inter); }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    auto set = std::make_shared<ExpertSet>();
    if (int4_group > 0) {
      std::mt19937 rng(static_cast<uint32_t>(hidden * 7 + inter));
      for (int64_t e = 0; e < experts; ++e) {
        for (auto [list, out, in] : {std::tuple{&set->gate, inter, hidden}, std::tuple{&set->up, inter, hidden},
                                     std::tuple{&set->down, hidden, inter}}) {
          LinearWeight lw = RandomInt4(*s, LinearFormat::kAwq, out, in, int4_group, false, rng);
          if (s->ok()) s->Check(be.PrepareLinear(lw));
          list->push_back(lw);
        }
      }
      return Route(be, std::move(s), std::move(set));
    }
    const float in_scale = std::sqrt(3.0f / static_cast<float>(hidden)),
                mid_scale = std::sqrt(3.0f / static_cast<float>(inter));
    const TensorView gate = s->Random(w, {experts, inter, hidden}, 10, in_scale);   // [experts, inter, hidden]
    const TensorView up = s->Random(w, {experts, inter, hidden}, 11, in_scale);     // [experts, inter, hidden]
    const TensorView down = s->Random(w, {experts, hidden, inter}, 12, mid_scale);  // [experts, hidden, inter]
    TensorView gs, us, ds;
    if (w == F8) {
      gs = s->Put(RandomScales({experts, CeilDiv(inter, 128), CeilDiv(hidden, 128)}, 13));
      us = s->Put(RandomScales({experts, CeilDiv(inter, 128), CeilDiv(hidden, 128)}, 14));
      ds = s->Put(RandomScales({experts, CeilDiv(hidden, 128), CeilDiv(inter, 128)}, 15));
    }
    for (int64_t e = 0; e < experts; ++e) {
      for (auto [list, t, sc] :
           {std::tuple{&set->gate, gate, gs}, std::tuple{&set->up, up, us}, std::tuple{&set->down, down, ds}}) {
        LinearWeight lw;
        lw.weight = t.Select(0, e);
        if (w == F8) lw = Fp8BlockWeight(lw.weight, sc.Select(0, e));
        if (s->ok()) s->Check(be.PrepareLinear(lw));
        list->push_back(lw);
      }
    }
    return Route(be, std::move(s), std::move(set));
  }
  // PrepareExperts, then the routing, the input and the residual, and the op.
  std::unique_ptr<OpRun> Route(Backend& be, std::unique_ptr<Setup> s, std::shared_ptr<ExpertSet> set) const {
    if (s->ok()) s->Check(be.PrepareExperts(*set));
    s->Hold(set);
    std::vector<int32_t> ids(static_cast<size_t>(n * top_k));
    std::vector<int32_t> perm(static_cast<size_t>(experts));
    std::mt19937 rng(5);
    for (int64_t t = 0; t < n; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      if (!skew) std::shuffle(perm.begin(), perm.end(), rng);
      std::copy_n(perm.begin(), top_k, ids.begin() + t * top_k);
    }
    const TensorView x = s->Random(F32, {n, hidden}, 1);     // [n, hidden]
    const TensorView id = s->Ints(ids).Reshape({n, top_k});  // [n, top_k]
    Tensor weights = RandomHost(F32, {n, top_k}, 2, 0.5f);   // [n, top_k] in [0, 1)
    for (int64_t i = 0; i < n * top_k; ++i) weights.data<float>()[i] += 0.5f;
    const TensorView wt = s->Put(weights);
    Tensor residual = RandomHost(F32, {n, hidden}, 3, 1.0f);  // [n, hidden]
    const TensorView out = s->Put(residual);
    auto base = std::make_shared<std::vector<float>>(residual.data<float>(), residual.data<float>() + n * hidden);
    const ExpertSet* experts_ptr = set.get();
    s->op = [&be, x, experts_ptr, id, wt, out] { return be.MoeExperts(x, *experts_ptr, id, wt, out); };
    s->Output("added", out);
    s->finish = [base](std::vector<OpOutput>& outs) {
      for (size_t i = 0; i < base->size(); ++i) outs[0].values[i] -= (*base)[i];
    };
    return s;
  }
};

// Rows of logits with planted maxima: row 0 one maximum, row 1 a tie (the lower id wins), row 2 the last id, row 3 all
// equal (id 0); the others random.
Tensor PlantedLogits(int64_t rows, int64_t vocab, uint32_t seed) {
  Tensor l = RandomHost(F32, {rows, vocab}, seed, 4.0f);
  float* p = l.data<float>();
  p[7] = 5.0f;
  if (rows > 1) p[vocab + vocab * 2 / 3] = p[vocab + vocab * 2 / 3 - 1] = 5.0f;
  if (rows > 2) p[2 * vocab + vocab - 1] = 5.0f;
  if (rows > 3) std::fill(p + 3 * vocab, p + 4 * vocab, -1.0f);
  return l;
}

struct ArgMaxCase {
  int64_t rows, vocab;
  std::string Op() const { return "ArgMax"; }
  std::string Shape() const { return fmt::format("rows={} vocab={}", rows, vocab); }
  std::string DTypes() const { return "logits=f32 ids=i32"; }
  double Bytes() const { return 4.0 * static_cast<double>(rows * (vocab + 1)); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView l = s->Put(PlantedLogits(rows, vocab, 1));  // [rows, vocab]
    const TensorView ids = s->Zeros(DType::kI32, {rows});        // [rows]
    s->op = [&be, l, ids] {
      be.ArgMax(l, ids);
      return OkStatus();
    };
    s->Output("ids", ids);
    return s;
  }
};

// SampleRows where the backend has it, over rows of which every fourth is sampled (temperature 0.8, top-k 50, top-p
// 0.9) and the others greedy (PlantedLogits' maxima; row 0 also asks for logprobs): only the greedy rows' tokens are
// compared, with ArgMax's ids on a
// backend that samples on the host (the CPU reference). The host sampler is SampleRows' reference;
// tests/backend/cuda/cuda_sampling_test.cc checks the rest.
struct SampleRowsCase {
  int64_t rows, vocab;
  std::string Op() const { return "SampleRows"; }
  std::string Shape() const { return fmt::format("rows={} vocab={} (greedy rows compared)", rows, vocab); }
  std::string DTypes() const { return "logits=f32"; }
  double Bytes() const { return 4.0 * static_cast<double>(rows * vocab); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView l = s->Put(PlantedLogits(rows, vocab, 2));  // [rows, vocab]
    const TensorView ids = s->Zeros(DType::kI32, {rows});        // [rows]: ArgMax's, without SampleRows
    auto specs = std::make_shared<std::vector<SampleRowSpec>>(static_cast<size_t>(rows));
    auto tokens = std::make_shared<std::vector<SampledToken>>(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      SampleRowSpec& spec = (*specs)[static_cast<size_t>(r)];
      if (r % 4 == 3) spec = SampleRowSpec{.temperature = 0.8f, .top_k = 50, .top_p = 0.9f};
      spec.seed = 1000 + static_cast<uint64_t>(r);
      spec.draw = 3;
    }
    (*specs)[0].logprob = 1;
    (*specs)[0].top_logprobs = 3;
    const bool device = be.SupportsSampling();
    s->Hold(specs);
    s->Hold(tokens);
    s->op = [&be, l, ids, device, specs, tokens] {
      if (!device) {
        be.ArgMax(l, ids);
        return OkStatus();
      }
      return be.SampleRows(l, *specs, {}, *tokens);
    };
    s->Output("ids", ids);
    s->finish = [device, tokens](std::vector<OpOutput>& outs) {
      OpOutput greedy{"greedy_tokens", {}};
      for (size_t r = 0; r < outs[0].values.size(); ++r) {
        if (r % 4 != 3) greedy.values.push_back(device ? static_cast<float>((*tokens)[r].token) : outs[0].values[r]);
      }
      outs = {std::move(greedy)};
    };
    return s;
  }
};

// MaskLogits over a subset of the rows, listed out of order (every row but those with r % 3 == 1, last row first):
// the first listed row allows every id (it must keep its bits), the second none (all -inf), the others a seeded
// random half, with garbage bits past the vocabulary in each last word (ignored). `strided`: the logits are a view
// [rows, vocab] of a [rows, vocab + 16] tensor. The whole tensor is compared: rows not listed, and the padding, must
// stay bit-identical. The masks live in host memory; on the GPU they cross through MaskLogits' pinned staging buffer,
// whose first size (CudaBackend::kMaskStagingBytes, 64 KiB) the 24 x 50257 row exceeds (16 masked rows of 1571
// words), after the smaller rows made it.
struct MaskLogitsCase {
  int64_t rows, vocab;
  bool strided = false;
  std::string Op() const { return "MaskLogits"; }
  std::string Shape() const {
    return fmt::format("rows={} vocab={} masked={}{}", rows, vocab, Listed().size(), strided ? " strided" : "");
  }
  std::string DTypes() const { return "logits=f32 masks=u32"; }
  double Bytes() const {
    const double listed = static_cast<double>(Listed().size());
    return listed * (4.0 * static_cast<double>(vocab) + 4.0 * static_cast<double>(CeilDiv(vocab, 32)));
  }
  double Flops() const { return 0.0; }
  std::vector<int32_t> Listed() const {
    std::vector<int32_t> listed;
    for (int64_t r = rows - 1; r >= 0; --r) {
      if (r % 3 != 1) listed.push_back(static_cast<int32_t>(r));
    }
    return listed;
  }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const int64_t width = strided ? vocab + 16 : vocab, words = CeilDiv(vocab, 32);
    const TensorView whole = s->Random(F32, {rows, width}, 3, 4.0f);  // [rows, width]
    const TensorView logits = strided ? whole.Slice(1, 0, vocab) : whole;
    auto listed = std::make_shared<std::vector<int32_t>>(Listed());
    auto masks = std::make_shared<std::vector<uint32_t>>(listed->size() * static_cast<size_t>(words));
    const uint64_t key = KeyOf(4);
    for (size_t i = 0; i < listed->size(); ++i) {
      uint32_t* m = masks->data() + i * static_cast<size_t>(words);
      for (int64_t w = 0; w < words; ++w) {
        m[w] = i == 0   ? 0xffffffffu
               : i == 1 ? 0u
                        : static_cast<uint32_t>(Mix(key + i * static_cast<uint64_t>(words) + static_cast<uint64_t>(w)));
      }
      if (vocab % 32 != 0 && i != 0) m[words - 1] |= ~((1u << (vocab % 32)) - 1);  // past the vocabulary: ignored
    }
    s->Hold(listed);
    s->Hold(masks);
    s->op = [&be, logits, listed, masks, words] { return be.MaskLogits(logits, *listed, *masks, words); };
    s->Output("logits", whole);
    return s;
  }
};

// Copy between strided views: 2-d [a, c] (b == 0) or 3-d [a, b, c], from a view inside a wider source to one inside
// a wider destination; the whole destination is compared (the rest must stay).
struct CopyCase {
  int64_t a, b, c;
  std::string Op() const { return "Copy"; }
  std::string Shape() const { return b == 0 ? fmt::format("[{}, {}]", a, c) : fmt::format("[{}, {}, {}]", a, b, c); }
  std::string DTypes() const { return "f32"; }
  double Bytes() const { return 8.0 * static_cast<double>(a * std::max<int64_t>(b, 1) * c); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    TensorView src, dst, whole;
    if (b == 0) {
      src = s->Random(F32, {a, c + 16}, 1).Slice(1, 8, 8 + c);  // [a, c] inside [a, c + 16]
      whole = s->Random(F32, {a, c + 32}, 2);                   // [a, c + 32]
      dst = whole.Slice(1, 16, 16 + c);
    } else {
      src = s->Random(F32, {a, b + 3, c + 16}, 1).Slice(1, 1, 1 + b).Slice(2, 8, 8 + c);  // [a, b, c]
      whole = s->Random(F32, {a, b + 1, c + 32}, 2);                                      // [a, b + 1, c + 32]
      dst = whole.Slice(1, 1, 1 + b).Slice(2, 0, c);
    }
    s->op = [&be, src, dst] {
      be.Copy(src, dst);
      return OkStatus();
    };
    s->Output("dst", whole);
    return s;
  }
};

// CopyOnDevice of `count` KV blocks (copy-on-write) within a cache [blocks, bs, kv_heads, d] of random contents.
struct CopyOnDeviceCase {
  int64_t blocks, bs, kv_heads, d;
  DType dtype;
  int64_t from, to, count;
  std::string Op() const { return "CopyOnDevice"; }
  std::string Shape() const {
    return fmt::format("cache=[{}, {}, {}, {}] blocks {}..{} -> {}", blocks, bs, kv_heads, d, from, from + count, to);
  }
  std::string DTypes() const { return std::string(Name(dtype)); }
  double Bytes() const {
    return 2.0 * static_cast<double>(count * bs * kv_heads * d * static_cast<int64_t>(DTypeSize(dtype)));
  }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    const TensorView cache = s->Random(dtype, {blocks, bs, kv_heads, d}, 1);  // [blocks, bs, kv_heads, d]
    const TensorView src = cache.Slice(0, from, from + count), dst = cache.Slice(0, to, to + count);
    s->op = [&be, src, dst] { return be.CopyOnDevice(src, dst); };
    s->Output("cache", cache);
    return s;
  }
};

// The host <-> device copies: Upload of a host tensor (at prepare), CopyFromHost into a tensor from Alloc and
// CopyToHost back (the run), and a tensor from Alloc left alone (Alloc returns zeroed memory).
struct HostCopyCase {
  int64_t numel;
  DType dtype;
  std::string Op() const { return "CopyFromHost+CopyToHost+Upload"; }
  std::string Shape() const { return fmt::format("numel={}", numel); }
  std::string DTypes() const { return std::string(DTypeName(dtype)); }
  double Bytes() const { return 2.0 * static_cast<double>(numel * static_cast<int64_t>(DTypeSize(dtype))); }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    Tensor host = dtype == DType::kI32 ? Tensor::Empty(dtype, {numel}) : RandomHost(dtype, {numel}, 1, 1.0f);
    if (dtype == DType::kI32) {
      for (int64_t i = 0; i < numel; ++i) host.data<int32_t>()[i] = static_cast<int32_t>(Mix(i) % 1000003) - 500000;
    }
    auto src = std::make_shared<Tensor>(RandomHost(dtype == DType::kI32 ? F32 : dtype, {numel}, 2, 1.0f));  // [numel]
    auto back = std::make_shared<std::vector<char>>(src->nbytes());
    s->Hold(src);
    s->Hold(back);
    const TensorView uploaded = s->Put(host);                   // [numel]
    const TensorView copied = s->Zeros(src->dtype(), {numel});  // [numel]
    const TensorView untouched = s->Zeros(dtype, {numel});      // [numel]
    s->op = [&be, src, copied, back] {
      FATHOM_RETURN_IF_ERROR(be.CopyFromHost(src->view().raw(), copied));
      return be.CopyToHost(copied, back->data());
    };
    s->Output("uploaded", uploaded);
    s->Output("copied", copied);
    s->Output("untouched", untouched);
    const DType back_dtype = src->dtype();
    s->finish = [back, back_dtype, numel = numel](std::vector<OpOutput>& outs) {
      OpOutput h{"copied_back", std::vector<float>(static_cast<size_t>(numel))};
      ConvertToF32(back->data(), back_dtype, 0, numel, h.values.data());
      outs.push_back(std::move(h));
    };
    return s;
  }
};

// Dummy weights as the loader makes them (LoadWeights with LoadFormat::kDummy, one spec): on a device backend
// Backend::FillDummy where it has the dtype, else model/weights.h's host FillDummy and an upload; the reference is the
// host FillDummy itself. Random, constant and sharded (dim 0, part 1 of 2) specs.
struct FillDummyCase {
  std::vector<int64_t> shape;
  DType dtype;
  WeightInit init = WeightInit::kRandom;
  float value = 0.0f;
  bool sharded = false;
  std::string Op() const { return "FillDummy"; }
  std::string Shape() const {
    std::string dims;
    for (int64_t x : shape) dims += fmt::format("{}{}", dims.empty() ? "" : ", ", x);
    const char* kind = init == WeightInit::kRandom ? "random" : init == WeightInit::kOnes ? "ones" : "constant";
    return fmt::format("[{}] {}{}{}", dims, kind, init == WeightInit::kConstant ? fmt::format("={:g}", value) : "",
                       sharded ? " shard 1/2 of dim 0" : "");
  }
  std::string DTypes() const { return std::string(Name(dtype)); }
  double Bytes() const {
    double n = static_cast<double>(DTypeSize(dtype));
    for (int64_t x : shape) n *= static_cast<double>(x);
    return n;
  }
  double Flops() const { return 0.0; }
  std::unique_ptr<OpRun> Prepare(Backend& be) const {
    auto s = std::make_unique<Setup>(be);
    WeightSpec spec;
    spec.name = "model.layers.3.mlp.gate_proj.weight";
    spec.shape = shape;
    spec.dtype = dtype;
    spec.init = init;
    spec.init_value = value;
    if (sharded) spec.shard = {.dim = 0, .parts = 2, .index = 1};
    auto store = std::make_shared<std::unique_ptr<WeightStore>>();
    s->Hold(store);
    s->op = [&be, spec, store] {
      LoadOptions opts;
      opts.format = LoadFormat::kDummy;
      opts.seed = 42;
      opts.show_progress = false;
      FATHOM_ASSIGN_OR_RETURN(*store, LoadWeights("", {spec}, opts, be));
      return OkStatus();
    };
    const std::string name = spec.name;
    s->Output("weight", [store, name] { return *store ? (*store)->Get(name) : TensorView(); });
    return s;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// The table.

// Float32 math in another order (GPU kernels against the CPU's).
constexpr Tolerance kF32{1e-7, -1};
// Bit-identical.
constexpr Tolerance kExact{0, 0};
// RoPE's rotations (an FMA here or there).
constexpr Tolerance kRope{1e-7, 1e-5};
// Operands rounded to bf16 for tensor cores (cuBLASLt GEMMs, MoE and MLA tensor-core kernels): relative error about
// 2^-9 a product, an NMSE near 1e-6.
constexpr Tolerance kBf16{1e-4, -1};
// Tensor-core attention (Q and the softmax weights rounded to bf16) on outputs that are means of values in [-1, 1].
constexpr Tolerance kBf16Attention{1e-4, 1.5e-2};
// q, k rotated in float32, then written to a bf16 cache: a float32 ulp can move a bf16 rounding.
constexpr Tolerance kBf16Cache{1e-6, 1e-2};
// Values rotated (or computed) in float32 in another order, then quantized to an FP8 cache: a float32 ulp can move an
// e4m3 rounding by one code (up to 32 in the codes' units, which the outputs hold), so only a small NMSE is bounded.
constexpr Tolerance kF8Cache{1e-5, -1};
// The opt-in W8A8 GEMM: activations quantized to e4m3 per token and 128 columns, about 2.5% rms error.
constexpr Tolerance kW8a8{5e-3, -1};

constexpr bool kGpu = true;  // a row at a real model size

template <typename C>
struct Row {
  C c;
  const char* variant;
  Tolerance tol;
  bool gpu_only = false;
};

template <typename C, size_t N>
void Add(std::vector<OpCase>& cases, const Row<C> (&rows)[N]) {
  for (const Row<C>& r : rows) {
    cases.push_back(OpCase{r.c.Op(), r.c.Shape(), r.c.DTypes(), r.variant, r.tol, r.gpu_only, r.c.Bytes(), r.c.Flops(),
                           [c = r.c](Backend& be) { return c.Prepare(be); }});
    if constexpr (requires { r.c.cache; }) cases.back().kv_cache = r.c.cache;
    if constexpr (requires { r.c.HostPath(r.variant); }) cases.back().host_path = r.c.HostPath(r.variant);
  }
}

// DeepSeek's routers: V2-Lite (softmax, greedy), V2 (group_limited_greedy), V3 (sigmoid noaux_tc with bias).
constexpr moe_route::Params kV2LiteRouter{64, 6, 1, 1, false, moe_route::kGreedy, false, 1.0f};
constexpr moe_route::Params kV2Router{160, 6, 8, 3, false, moe_route::kGroupLimitedGreedy, false, 16.0f};
constexpr moe_route::Params kV3Router{256, 8, 8, 4, true, moe_route::kNoauxTc, true, 2.5f};

std::vector<OpCase> BuildCases() {
  std::vector<OpCase> c;
  // Real sizes: Qwen-7B (hidden 3584, inter 18944, 28 heads / 4 KV heads / head_dim 128, vocab 152064),
  // DeepSeek-V2-Lite (MLA: 16 heads, kv_lora 512, rope 64, nope 128, v 128; 64 experts of 2048 x 1408, top 6) and V3
  // (hidden 7168, 128 heads, 256 experts of 7168 x 2048, top 8, f8 block-scaled weights).
  const Row<EmbeddingCase> embedding_rows[] = {
      {{37, 1000, 256, BF16}, "default", kExact},
      {{9, 500, 301, F32}, "default", kExact},
      {{16, 700, 128, F16}, "default", kExact},
      {{512, 152064, 3584, BF16}, "default", kExact, kGpu},
  };
  Add(c, embedding_rows);
  const Row<RmsNormCase> rms_norm_rows[] = {
      {{5, 301, BF16}, "default", kF32},
      {{9, 2048, F32}, "default", kF32},
      {{5, 301, BF16, true}, "default", kF32},
      {{9, 1536, BF16, true}, "default", kF32},
      {{512, 3584, BF16}, "default", kF32, kGpu},
      {{512, 3584, BF16, true}, "default", kF32, kGpu},
      {{1, 7168, BF16, true}, "default", kF32, kGpu},
  };
  Add(c, rms_norm_rows);
  const Row<LinearCase> linear_rows[] = {
      // decode sizes (n <= 8): the GEMVs
      {{1, 304, 77, BF16, true}, "default", kF32},
      {{3, 304, 77, BF16}, "default", kF32},
      {{8, 256, 96, BF16, true}, "default", kF32},
      {{5, 301, 19, BF16, true}, "default", kF32},  // unaligned: the generic kernel
      {{2, 256, 64, F32, true}, "default", kF32},
      {{4, 128, 80, F16, true}, "default", kF32},
      {{3, 304, 77, BF16, true}, "generic_linear", kF32},
      {{1, 384, 256, F8}, "default", kF32},
      {{5, 304, 77, F8, true}, "default", kF32},  // partial scale blocks in both dims
      {{3, 384, 256, F8}, "generic_linear", kF32},
      // prefill sizes (n > 8): bf16 (and dequantized f8) on cuBLASLt by default, float32 inputs with f32_gemm
      {{11, 304, 77, BF16, true}, "default", kBf16},
      {{11, 304, 77, BF16, true}, "f32_gemm", kF32},
      {{40, 256, 96, F32}, "default", kF32},
      {{24, 128, 80, F16, true}, "default", kF32},
      {{11, 384, 256, F8}, "default", kBf16},
      {{11, 304, 77, F8, true}, "f32_gemm", kF32},
      {{16, 768, 256, F8}, "fp8_gemm", kW8a8},  // 6 K blocks: PrepareLinear pads the scales to 8
      {{5, 512, 128, F8}, "fp8_gemm", kW8a8},
      // Qwen-7B
      {{1, 3584, 4608, BF16, true}, "default", kF32, kGpu},
      {{1, 3584, 18944, BF16}, "default", kF32, kGpu},
      {{1, 18944, 3584, BF16}, "default", kF32, kGpu},
      {{1, 18944, 3584, BF16}, "generic_linear", kF32, kGpu},
      {{1, 18944, 3584, BF16}, "gemv_prefetch", kF32, kGpu},
      {{1, 3584, 3584, BF16}, "default", kF32, kGpu},
      {{1, 3584, 3584, BF16}, "gemv_prefetch", kF32, kGpu},
      {{8, 3584, 18944, BF16}, "default", kF32, kGpu},
      {{1, 3584, 152064, BF16}, "default", kF32, kGpu},
      {{1, 3584, 152064, F16}, "default", kF32, kGpu},  // an AWQ Qwen-7B's f16 lm_head on the GEMV
      {{512, 3584, 4608, BF16, true}, "default", kBf16, kGpu},
      {{512, 3584, 18944, BF16}, "default", kBf16, kGpu},
      {{512, 18944, 3584, BF16}, "default", kBf16, kGpu},
      {{512, 18944, 3584, BF16}, "gemm_tune", kBf16, kGpu},
      {{64, 3584, 4608, BF16, true}, "f32_gemm", kF32, kGpu},
      // DeepSeek-V3 (q_a, kv_a with its partial block, o_proj)
      {{1, 7168, 1536, F8}, "default", kF32, kGpu},
      {{1, 7168, 576, F8}, "default", kF32, kGpu},
      {{1, 16384, 7168, F8}, "default", kF32, kGpu},
      {{512, 7168, 1536, F8}, "default", kBf16, kGpu},
      {{512, 7168, 576, F8}, "default", kBf16, kGpu},
      {{512, 16384, 7168, F8}, "default", kBf16, kGpu},
      {{512, 7168, 1536, F8}, "fp8_gemm", kW8a8, kGpu},
      {{512, 16384, 7168, F8}, "fp8_gemm", kW8a8, kGpu},
  };
  Add(c, linear_rows);
  const Row<SiluMulLinearCase> silu_linear_rows[] = {
      {{3, 64, 32, BF16}, "default", kF32},                 // the GEMV (decode sizes)
      {{16, 256, 64, BF16, true}, "default", kBf16},        // cuBLASLt on staged bf16 inputs
      {{16, 256, 64, BF16, true}, "fused_silu", kBf16},     // the product rounded to bf16 straight into the staging
      {{16, 256, 64, BF16, true}, "no_fused_silu", kBf16},  // the two ops: the product, then the staging pass
      {{16, 256, 64, F32}, "fused_silu", kF32},             // f32 weights: not cuBLASLt, the two ops
      {{512, 18944, 3584, BF16}, "default", kBf16, kGpu},
      {{512, 18944, 3584, BF16}, "fused_silu", kBf16, kGpu},
      {{512, 18944, 3584, BF16}, "no_fused_silu", kBf16, kGpu},
      {{64, 18944, 3584, BF16}, "fused_silu", kBf16, kGpu},
  };
  Add(c, silu_linear_rows);
  constexpr LinearFormat kAwq = LinearFormat::kAwq, kGptq = LinearFormat::kGptq;
  const Row<Int4LinearCase> int4_rows[] = {
      // the W4A16 tensor-core kernel (bf16 inputs), its float32 twin, and the generic kernel on unfit shapes
      {{1, 512, 256, kAwq, 128, false, true}, "default", kBf16},
      {{7, 256, 96, kAwq, 32}, "default", kBf16},
      {{3, 256, 128, kGptq, 64, true, true}, "default", kBf16},
      {{3, 256, 128, kGptq, 64, true, true}, "f32_gemm", kF32},
      {{2, 344, 40, kGptq, -1}, "default", kF32},  // 344 inputs: no tiles, the float32 kernel
      // prefill: dequantized to bf16 for cuBLASLt above int4_gemm_tokens (256)
      {{300, 256, 128, kAwq, 64}, "default", kBf16},
      // R1-Distill-Qwen-7B AWQ (q_proj, gate/up, down: split-K) and Llama-8B GPTQ act-order
      {{1, 3584, 3584, kAwq, 128, false, true}, "default", kBf16, kGpu},
      {{1, 3584, 18944, kAwq, 128}, "default", kBf16, kGpu},
      {{1, 18944, 3584, kAwq, 128}, "default", kBf16, kGpu},
      {{64, 18944, 3584, kAwq, 128}, "default", kBf16, kGpu},
      {{512, 3584, 18944, kAwq, 128}, "default", kBf16, kGpu},
      {{1, 4096, 1024, kGptq, 128, true}, "default", kBf16, kGpu},
  };
  Add(c, int4_rows);
  const std::vector<FanOutCase::Part> qkv{{256, BF16}, {64, BF16}, {64, BF16}}, gate_up{{512, BF16}, {512, BF16}};
  const std::vector<FanOutCase::Part> qwen_qkv{{3584, BF16}, {512, BF16}, {512, BF16}};
  const std::vector<FanOutCase::Part> qwen_gate_up{{18944, BF16}, {18944, BF16}};
  const Row<FanOutCase> fan_out_rows[] = {
      {{1, 256, qkv, true}, "default", kF32},
      {{3, 256, qkv, true}, "default", kF32},
      {{8, 256, gate_up}, "default", kF32},
      {{2, 384, {{256, F8}, {128, BF16}}}, "default", kF32},  // f8 and bf16 parts in one launch
      {{3, 256, {{96, F16}, {64, BF16}}}, "default", kF32},   // f16 (an AWQ checkpoint's unquantized) and bf16
      {{2, 256, qkv, true}, "generic_linear", kF32},
      {{9, 256, qkv, true}, "default", kBf16},
      {{9, 256, qkv, true}, "f32_gemm", kF32},
      {{1, 3584, qwen_qkv, true}, "default", kF32, kGpu},
      {{8, 3584, qwen_qkv, true}, "default", kF32, kGpu},
      {{1, 3584, qwen_gate_up}, "default", kF32, kGpu},
      {{512, 3584, qwen_qkv, true}, "default", kBf16, kGpu},
      {{1, 7168, {{1536, F8}, {576, F8}}}, "default", kF32, kGpu},  // V3's q_a and kv_a
      {{1, 3584, qwen_qkv, true}, "gemv_prefetch", kF32, kGpu},
      {{1, 7168, {{1536, F8}, {576, F8}}}, "gemv_prefetch", kF32, kGpu},
      {{2, 256, qkv, true}, "gemv_prefetch", kF32},
  };
  Add(c, fan_out_rows);
  const Row<HeadLinearCase> head_linear_rows[] = {
      {{1, 4, 64, 128, BF16}, "default", kF32},
      {{3, 4, 128, 64, F32}, "default", kF32},
      {{12, 4, 64, 128, BF16}, "default", kBf16},  // one strided-batched cuBLASLt GEMM
      {{12, 4, 64, 128, BF16}, "f32_gemm", kF32},
      {{1, 16, 128, 512, BF16}, "default", kF32, kGpu},  // V2-Lite's W_UK^T and W_UV
      {{1, 16, 512, 128, BF16}, "default", kF32, kGpu},
      {{40, 16, 128, 512, BF16}, "default", kBf16, kGpu},
      {{40, 16, 512, 128, BF16}, "f32_gemm", kF32, kGpu},
      {{1, 128, 128, 512, BF16}, "default", kF32, kGpu},  // V3
      {{64, 128, 512, 128, BF16}, "default", kBf16, kGpu},
  };
  Add(c, head_linear_rows);
  const Row<ElementwiseCase> elementwise_rows[] = {
      {{false, 9, 300}, "default", kExact},
      {{false, 33, 64}, "default", kExact},
      {{true, 9, 300}, "default", kF32},
      {{true, 5, 1408}, "default", kF32},
      {{false, 512, 3584}, "default", kExact, kGpu},
      {{true, 1, 18944}, "default", kF32, kGpu},
      {{true, 512, 18944}, "default", kF32, kGpu},
  };
  Add(c, elementwise_rows);
  const Row<RopeCosSinCase> rope_cos_sin_rows[] = {
      {{9, 32, 10000.0, 1.0f, 4096}, "default", kRope},
      {{5, 64, 1e6, 1.2f, 32768}, "default", kRope},
      {{512, 64, 1e6, 1.0f, 32768}, "default", kRope, kGpu},
  };
  Add(c, rope_cos_sin_rows);
  const Row<ApplyRopeCase> apply_rope_rows[] = {
      {{9, 4, 64, 32, false}, "default", kRope},
      {{9, 4, 64, 16, false}, "default", kRope},  // partial rotary dims
      {{9, 4, 64, 32, true}, "default", kRope},
      {{9, 4, 192, 32, true, 128}, "default", kRope},  // MLA's q_pe after q_nope
      {{512, 28, 128, 64, false}, "default", kRope, kGpu},
      {{512, 128, 192, 32, true, 128}, "default", kRope, kGpu},
      {{512, 1, 576, 32, true, 512}, "default", kRope, kGpu},  // k_pe after the latent
  };
  Add(c, apply_rope_rows);
  const Row<WriteKvCase> write_kv_rows[] = {
      {{2, 64, false, F32, kMixed}, "default", kExact},
      {{2, 64, false, BF16, kMixed}, "default", kExact},
      {{2, 64, false, F16, kMixed}, "default", kExact},
      {{1, 576, true, BF16, kMixed}, "default", kExact},
      {{2, 64, false, F8, kMixed}, "default", kExact},  // FP8: e4m3 codes and a scale per token and head
      {{1, 576, true, F8, kMixed}, "default", kExact},  // FP8 latent rows: 9 scales of 64 values
      {{4, 128, false, BF16, kRealPrefill}, "default", kExact, kGpu},
      {{1, 576, true, BF16, kRealPrefill}, "default", kExact, kGpu},
      {{4, 128, false, F8, kRealPrefill}, "default", kExact, kGpu},
      {{1, 576, true, F8, kRealPrefill}, "default", kExact, kGpu},
  };
  Add(c, write_kv_rows);
  const Row<RopeWriteKvCase> rope_write_kv_rows[] = {
      {{8, 2, 64, 32, false, F32, kMixed}, "default", kRope},
      {{8, 2, 64, 16, true, F32, kMixed}, "default", kRope},
      {{8, 2, 64, 32, false, BF16, kMixed}, "default", kBf16Cache},
      {{8, 2, 64, 16, true, BF16, kDecode}, "default", kBf16Cache},
      {{8, 2, 64, 32, false, F8, kMixed}, "default", kF8Cache},
      {{28, 4, 128, 64, false, BF16, kRealMixed}, "default", kBf16Cache, kGpu},
      {{28, 4, 128, 32, true, F32, kRealMixed}, "default", kRope, kGpu},
      {{28, 4, 128, 64, false, F8, kRealMixed}, "default", kF8Cache, kGpu},
  };
  Add(c, rope_write_kv_rows);
  // DeepSeek-V3.2's sparse attention: the indexer's keys, its choice (exact: small-integer inputs), and MLA over the
  // chosen rows (MLA's kernel where it fits, the paged kernels at the tiny fixtures' dims).
  const Batch kSparseDecode{"decode", {37, 100, 20, 2}, {1, 1, 1, 1}};
  const Batch kV32Decode = SameSeqs("decode", 32, 4095, 1);
  const Row<IndexKeysCase> index_keys_rows[] = {
      {{32, 8, F32, kMixed}, "default", kRope},
      {{128, 64, BF16, kMixed}, "default", kBf16Cache},
      {{128, 64, F8, kMixed}, "default", kF8Cache},
  };
  Add(c, index_keys_rows);
  const Row<IndexerSelectCase> select_rows[] = {
      {{16, 32, 8, F32, kMixed}, "default", kExact},  // the tiny fixtures' indexer
      {{16, 32, 8, BF16, kSparseDecode}, "default", kExact},
      {{64, 128, 16, BF16, kMixed}, "default", kExact},
      {{64, 128, 16, F8, kMixed}, "default", kExact},
      {{64, 128, 2048, BF16, kLongDecode}, "default", kExact, kGpu},  // V3.2's
      {{64, 128, 2048, BF16, kV32Decode}, "default", kExact, kGpu},
      {{64, 128, 2048, BF16, kRealPrefill}, "default", kExact, kGpu},
  };
  Add(c, select_rows);
  const Row<SparseAbsorbedCase> sparse_rows[] = {
      {{4, 40, 32, 8, F32, kMixed}, "default", kF32},  // the tiny fixtures' dims: the paged kernels
      {{4, 40, 32, 8, BF16, kSparseDecode}, "default", kBf16Attention},
      {{16, 576, 512, 16, BF16, kSmallMla}, "default", kBf16Attention},           // MLA's kernel over the lists
      {{16, 576, 512, 16, BF16, kSmallMla}, "no_mla_attention", kBf16Attention},  // the paged kernels' bf16 P
      {{16, 576, 512, 16, F8, kSmallMla}, "default", kBf16Attention},
      {{128, 576, 512, 2048, BF16, kBatchLongDecode}, "default", kBf16Attention, kGpu},
  };
  Add(c, sparse_rows);
  const Row<AttentionCase> attention_rows[] = {
      // small: GQA 8/2 at head_dim 64, every kernel variant, f32 and bf16 caches, prefill and decode batches
      {{8, 2, 64, 64, false, F32, kMixed}, "default", kF32},
      {{8, 2, 64, 64, false, BF16, kMixed}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, BF16, kDecode}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, F32, kDecode}, "default", kF32},
      {{8, 2, 64, 64, false, BF16, kPrefill}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, F16, kDecode}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, BF16, kDecode}, "no_mma_attention", kF32},
      {{8, 2, 64, 64, false, BF16, kDecode}, "no_gqa_attention", kBf16Attention},
      {{8, 2, 64, 64, false, F32, kDecode}, "no_gqa_attention", kF32},
      {{8, 2, 64, 64, false, BF16, kMixed}, "no_split_attention", kF32},
      {{8, 2, 64, 64, false, BF16, kOddBlocks}, "default", kBf16Attention},  // a 16-key tile spans three blocks
      // the tensor-core prefill kernel (the default; named, so the rows stay if it is not): whole prompts and a chunk
      // after a cached prefix, f16, blocks of 6, and a mixed batch (under 16 rows a sequence: the split kernels); and
      // the split kernels on prefill batches (no_prefill_mma_attention)
      {{8, 2, 64, 64, false, BF16, kPrefill}, "prefill_mma_attention", kBf16Attention},
      {{8, 2, 64, 64, false, BF16, kPrefill}, "no_prefill_mma_attention", kBf16Attention},  // the split kernels
      {{4, 4, 128, 128, false, F16, kOddPrefill}, "no_prefill_mma_attention", kBf16Attention},
      {{8, 2, 64, 64, false, F16, kPrefill}, "prefill_mma_attention", kBf16Attention},
      {{8, 2, 64, 64, false, BF16, kOddPrefill}, "prefill_mma_attention", kBf16Attention},
      {{8, 2, 64, 64, false, BF16, kMixed}, "prefill_mma_attention", kBf16Attention},
      {{4, 4, 128, 128, false, BF16, kOddPrefill}, "prefill_mma_attention", kBf16Attention},
      {{4, 4, 128, 128, false, F32, kDecode}, "default", kF32},               // MHA
      {{4, 2, 96, 96, false, BF16, kDecode}, "default", kF32},                // no packed kernel for head_dim 96
      {{16, 1, 576, 512, true, BF16, kSmallMla}, "default", kBf16Attention},  // MLA: 16 heads a block
      {{16, 1, 576, 512, true, BF16, kSmallMla}, "no_mla_attention", kF32},
      // FP8 caches (e4m3 and scales): GQA (the tensor-core kernel on bf16-widened codes, the CUDA-core one, the
      // per-head one), MHA, prefill, and MLA's latent rows
      {{8, 2, 64, 64, false, F8, kMixed}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, F8, kDecode}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, F8, kDecode}, "no_mma_attention", kF32},
      {{8, 2, 64, 64, false, F8, kPrefill}, "default", kBf16Attention},
      {{8, 2, 64, 64, false, F8, kMixed}, "no_split_attention", kF32},
      {{8, 2, 64, 64, false, F8, kDecode}, "no_gqa_attention", kBf16Attention},
      {{4, 4, 128, 128, false, F8, kDecode}, "default", kBf16Attention},
      {{4, 4, 128, 128, false, F8, kDecode}, "no_mma_attention", kF32},
      {{8, 2, 64, 64, false, F8, kOddBlocks}, "no_mma_attention", kF32},
      {{8, 2, 64, 64, false, F8, kOddBlocks}, "default", kBf16Attention},
      {{4, 2, 256, 256, false, F8, kDecode}, "default", kF32},  // two scale groups of 128 a row: the per-head kernel
      {{16, 1, 576, 512, true, F8, kSmallMla}, "no_mla_fp8", kF32},         // the generic kernels on f8 latent rows
      {{16, 1, 576, 512, true, F8, kSmallMla}, "default", kBf16Attention},  // MLA's kernel on f8 latent rows
      {{16, 1, 576, 512, true, BF16, kSmallMla}, "mla_pipeline", kBf16Attention},
      {{16, 1, 576, 512, true, F8, kSmallMla}, "mla_pipeline_fp8", kBf16Attention},
      {{64, 1, 576, 512, true, BF16, kSmallMla}, "mla_wide_short", kBf16Attention},   // the wide instance: a block a
      {{128, 1, 576, 512, true, BF16, kSmallMla}, "mla_wide_short", kBf16Attention},  // token, or two
      {{128, 1, 576, 512, true, BF16, kSmallMla}, "default", kBf16Attention},  // short contexts: 16 heads a block
      {{128, 1, 576, 512, true, F8, kSmallMla}, "mla_fp8", kBf16Attention},
      // Qwen-7B (28/4/128)
      {{28, 4, 128, 128, false, BF16, kRealMixed}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kLongDecode}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kBatchDecode}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kRealPrefill}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, F32, kRealMixed}, "default", kF32, kGpu},
      {{28, 4, 128, 128, false, BF16, kRealMixed}, "no_mma_attention", kF32, kGpu},
      {{28, 4, 128, 128, false, BF16, kLongDecode}, "no_gqa_attention", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, F32, kLongDecode}, "no_gqa_attention", kF32, kGpu},
      {{28, 4, 128, 128, false, BF16, kBatchDecode}, "no_split_attention", kF32, kGpu},
      {{28, 4, 128, 128, false, F8, kBatchDecode}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kWideDecode}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kOddBlocks}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kWideDecode}, "attention_one_chunk", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, F8, kWideDecode}, "attention_one_chunk", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kRealPrefill}, "attention_one_chunk", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kRealPrefill}, "prefill_mma_attention", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, BF16, kRealPrefill}, "no_prefill_mma_attention", kBf16Attention, kGpu},
      {{32, 8, 128, 128, false, F16, kRealPrefill}, "prefill_mma_attention", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, F8, kWideDecode}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, F8, kWideDecode}, "no_mma_attention", kF32, kGpu},
      {{28, 4, 128, 128, false, F8, kRealMixed}, "default", kBf16Attention, kGpu},
      {{28, 4, 128, 128, false, F8, kRealPrefill}, "no_split_attention", kF32, kGpu},
      // DeepSeek MLA: V2-Lite's 16 heads, V3's 128
      {{16, 1, 576, 512, true, BF16, kRealMixed}, "default", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, BF16, kLongDecode}, "default", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, BF16, kRealMixed}, "no_mla_attention", kF32, kGpu},
      {{128, 1, 576, 512, true, BF16, kRealMixed}, "default", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, BF16, kBatchDecode}, "default", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, BF16, kLongDecode}, "no_mla_attention", kF32, kGpu},
      {{16, 1, 576, 512, true, F8, kRealMixed}, "no_mla_fp8", kF32, kGpu},
      {{16, 1, 576, 512, true, F8, kRealMixed}, "default", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, F8, kRealMixed}, "mla_fp8", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, F8, kBatchLongDecode}, "mla_fp8", kBf16Attention, kGpu},  // against bf16's 16h row
      {{128, 1, 576, 512, true, F8, kBatchLongDecode}, "mla_fp8", kBf16Attention, kGpu},
      // the two-stage MLA kernel: mixed batches, and the 64 x 4k rows of both head counts, bf16 and f8
      {{16, 1, 576, 512, true, BF16, kRealMixed}, "mla_pipeline", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, BF16, kRealMixed}, "mla_pipeline", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, BF16, kBatchLongDecode}, "mla_pipeline", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, BF16, kBatchLongDecode}, "mla_pipeline", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, F8, kBatchLongDecode}, "mla_pipeline_fp8", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, F8, kRealMixed}, "mla_pipeline_fp8", kBf16Attention, kGpu},
      // the 16-head instance at V3's 128 heads (the wide one is the default there): mixed batches, 64 x 1k and 64 x 4k
      {{128, 1, 576, 512, true, BF16, kRealMixed}, "no_mla_wide", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, BF16, kBatchDecode}, "no_mla_wide", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, BF16, kBatchLongDecode}, "no_mla_wide", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, F8, kRealMixed}, "no_mla_wide_fp8", kBf16Attention, kGpu},
      {{128, 1, 576, 512, true, F8, kBatchLongDecode}, "no_mla_wide_fp8", kBf16Attention, kGpu},
      {{16, 1, 576, 512, true, BF16, kBatchLongDecode}, "default", kBf16Attention, kGpu},   // mla_decode_bw_16h
      {{128, 1, 576, 512, true, BF16, kBatchLongDecode}, "default", kBf16Attention, kGpu},  // mla_decode_bw_128h
  };
  Add(c, attention_rows);
  const Row<GatherContextCase> gather_context_rows[] = {
      {{576, 0, BF16, kMixed}, "default", kExact},         {{64, 32, F32, kMixed}, "default", kExact},
      {{576, 0, F8, kMixed}, "default", kExact},           {{576, 0, BF16, kRealMixed}, "default", kExact, kGpu},
      {{576, 0, F8, kRealMixed}, "default", kExact, kGpu},
  };
  Add(c, gather_context_rows);
  const Row<MlaContextCase> mla_context_rows[] = {
      {{2, kMixed}, "default", {1e-4, 1e-2}},
      {{2, kMixed}, "mla_context_plain", {1e-7, 1e-4}},
      {{16, kRealMixed}, "default", {1e-4, 1e-2}, kGpu},
      {{16, kRealMixed}, "mla_context_plain", {1e-7, 1e-4}, kGpu},
      {{128, kRealPrefill}, "default", {1e-4, 1e-2}, kGpu},
  };
  Add(c, mla_context_rows);
  const Row<GatherRowsCase> gather_rows_rows[] = {
      {{64, 100, 300}, "default", kExact},
      {{4096, 24576, 2048},
       "default",
       kExact,
       kGpu},  // V2-Lite's 512-token batch, top 6 (as the host MoE path gathers)
  };
  Add(c, gather_rows_rows);
  const Row<ScatterAddCase> scatter_add_rows[] = {
      {{300, 600, 50, 150}, "default", kF32},  // 150 contributions to one row
      {{3000, 2048, 500, 150}, "default", kF32, kGpu},
  };
  Add(c, scatter_add_rows);
  const Row<MoeRouteCase> moe_route_rows[] = {
      {{kV2LiteRouter, false, 300}, "default", kExact},   {{kV2LiteRouter, true, 300}, "default", kExact},
      {{kV2Router, false, 300}, "default", kExact},       {{kV2Router, true, 300}, "default", kExact},
      {{kV3Router, false, 300}, "default", kExact},       {{kV3Router, true, 300}, "default", kExact},
      {{kV3Router, true, 8192}, "default", kExact, kGpu},
  };
  Add(c, moe_route_rows);
  const Row<MoeExpertsCase> moe_experts_rows[] = {
      {{16, 4, 256, 128, BF16, 1}, "default", kF32},  // grouped GEMVs
      {{16, 4, 256, 128, BF16, 5}, "default", kF32},
      {{16, 4, 256, 128, BF16, 24}, "default", kBf16},  // grouped tensor-core GEMMs
      {{16, 4, 256, 128, BF16, 24, true}, "default", kBf16},
      {{16, 4, 256, 128, BF16, 24}, "f32_gemm", kF32},
      {{16, 4, 256, 128, BF16, 24}, "moe_gemv", kF32},
      {{16, 4, 256, 128, BF16, 5}, "host_moe", kF32},
      {{16, 4, 256, 176, BF16, 24}, "default", kF32},  // inter 176: no tensor-core tiles
      {{16, 4, 256, 192, F8, 3}, "default", kF32},     // f8 with a partial scale block
      {{16, 4, 256, 192, F8, 24}, "default", kBf16},
      // 4-bit (AWQ) experts: grouped W4A16 kernels on tiles of 8, 32 and 64 pairs; groups inside a chunk (32)
      {{16, 4, 256, 128, BF16, 1, false, 128}, "default", kBf16},
      {{16, 4, 256, 128, BF16, 24, false, 64}, "default", kBf16},
      {{16, 4, 256, 128, BF16, 24, true, 32}, "default", kBf16},
      {{16, 4, 256, 128, BF16, 300, false, 128}, "default", kBf16},
      {{16, 4, 256, 128, BF16, 5, false, 128}, "f32_gemm", kF32},  // the host path's float32 kernels
      {{64, 6, 2048, 1408, BF16, 1}, "default", kF32, kGpu},       // V2-Lite
      {{64, 6, 2048, 1408, BF16, 8}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 512}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 512, true}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 7}, "f32_gemm", kF32, kGpu},
      {{64, 6, 2048, 1408, BF16, 64}, "host_moe", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 1, false, 128}, "default", kBf16, kGpu},  // V2-Lite AWQ
      {{64, 6, 2048, 1408, BF16, 8, false, 128}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 64, false, 128}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 256, false, 128}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 1024, false, 128}, "default", kBf16, kGpu},
      {{64, 6, 2048, 1408, BF16, 64, false, 128}, "host_moe", kBf16, kGpu},
      {{256, 8, 7168, 2048, F8, 1}, "default", kF32, kGpu},  // V3
      {{256, 8, 7168, 2048, F8, 64}, "default", kBf16, kGpu},
  };
  Add(c, moe_experts_rows);
  const Row<ArgMaxCase> arg_max_rows[] = {
      {{5, 1000}, "default", kExact},
      {{3, 4099}, "default", kExact},
      {{64, 152064}, "default", kExact, kGpu},
  };
  Add(c, arg_max_rows);
  const Row<SampleRowsCase> sample_rows_rows[] = {
      {{8, 1000}, "default", kExact},
      {{64, 129280}, "default", kExact, kGpu},
  };
  Add(c, sample_rows_rows);
  const Row<MaskLogitsCase> mask_logits_rows[] = {
      {{8, 1000}, "default", kExact},          {{3, 4099, true}, "default", kExact},
      {{24, 50257}, "default", kExact},  // past the pinned staging buffer's first 64 KiB
      {{64, 152064}, "default", kExact, kGpu}, {{256, 129280}, "default", kExact, kGpu},
  };
  Add(c, mask_logits_rows);
  const Row<CopyCase> copy_rows[] = {
      {{40, 0, 100}, "default", kExact},
      {{9, 4, 64}, "default", kExact},
      {{512, 0, 3584}, "default", kExact, kGpu},
      {{512, 128, 128}, "default", kExact, kGpu},  // MLA's v out of the up-projected kv
  };
  Add(c, copy_rows);
  const Row<CopyOnDeviceCase> copy_on_device_rows[] = {
      {{8, 16, 2, 64, BF16, 3, 5, 1}, "default", kExact},
      {{8, 16, 2, 64, F32, 0, 4, 3}, "default", kExact},
      {{1024, 16, 4, 128, BF16, 0, 512, 256}, "default", kExact, kGpu},
  };
  Add(c, copy_on_device_rows);
  const Row<HostCopyCase> host_copy_rows[] = {
      {{1000, DType::kI32}, "default", kExact},
      {{70000, BF16}, "default", kExact},
      {{16 << 20, F32}, "default", kExact, kGpu},
  };
  Add(c, host_copy_rows);
  const Row<FillDummyCase> fill_dummy_rows[] = {
      {{{300, 512}, F32}, "default", kExact},
      {{{256, 1024}, BF16}, "default", kExact},
      {{{512, 384}, F8}, "default", kExact},
      {{{128, 1024}, F16}, "default", kExact},  // no device fill: the host's
      {{{256, 512}, BF16, WeightInit::kRandom, 0.0f, true}, "default", kExact},
      {{{4096}, BF16, WeightInit::kOnes}, "default", kExact},
      {{{70000}, F32, WeightInit::kConstant, 0.5f}, "default", kExact},
      {{{18944, 3584}, BF16}, "default", kExact, kGpu},
      {{{2048, 7168}, F8}, "default", kExact, kGpu},
  };
  Add(c, fill_dummy_rows);
  return c;
}

constexpr std::array<std::string_view, 25> kVariants = {"default",
                                                        "generic_linear",
                                                        "f32_gemm",
                                                        "fp8_gemm",
                                                        "gemm_tune",
                                                        "no_split_attention",
                                                        "no_gqa_attention",
                                                        "no_mma_attention",
                                                        "no_mla_attention",
                                                        "mla_context_plain",
                                                        "host_moe",
                                                        "moe_gemv",
                                                        "attention_one_chunk",
                                                        "mla_wide_short",
                                                        "no_mla_wide",
                                                        "no_mla_wide_fp8",
                                                        "gemv_prefetch",
                                                        "fused_silu",
                                                        "no_fused_silu",
                                                        "prefill_mma_attention",
                                                        "no_prefill_mma_attention",
                                                        "mla_fp8",
                                                        "no_mla_fp8",
                                                        "mla_pipeline",
                                                        "mla_pipeline_fp8"};

}  // namespace

bool Tolerance::Accepts(const OutputError& e) const {
  if (e.shape_mismatch) return false;
  if (exact()) return e.mismatches == 0;
  return e.nmse <= nmse && (max_abs < 0 || e.max_abs <= max_abs);
}

std::string Tolerance::ToString() const {
  if (exact()) return "bit-identical";
  return max_abs < 0 ? fmt::format("nmse <= {:g}", nmse)
                     : fmt::format("nmse <= {:g}, max |err| <= {:g}", nmse, max_abs);
}

std::string OutputError::ToString() const {
  if (shape_mismatch) return fmt::format("{}: missing or of another length", name);
  std::string s = fmt::format("{}: nmse {:.3g}, max |err| {:.3g}, {} elements differ", name, nmse, max_abs, mismatches);
  if (first_mismatch >= 0) {
    s += fmt::format(" (first at {}: ref {:.9g}, got {:.9g})", first_mismatch, ref_at_first, got_at_first);
  }
  return s;
}

std::string OpCase::Describe() const {
  return fmt::format("{} [{}] {} variant={}", op, shape, dtypes, variant);
}

std::string OpCase::Name() const {
  const std::string text = fmt::format("{} {} {} {}", op, shape, dtypes, variant);
  std::string name;
  for (const char ch : text) {
    if (ch == '=') continue;
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      name.push_back(ch);
    } else if (!name.empty() && name.back() != '_') {
      name.push_back('_');
    }
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name;
}

const std::vector<OpCase>& AllOpCases() {
  static const std::vector<OpCase> cases = BuildCases();
  return cases;
}

std::span<const std::string_view> KnownVariants() {
  return kVariants;
}

StatusOr<std::vector<OpOutput>> RunOpCase(const OpCase& c, Backend& be) {
  std::unique_ptr<OpRun> run = c.prepare(be);
  FATHOM_RETURN_IF_ERROR(run->Run());
  return run->Outputs();
}

std::vector<OutputError> CompareOutputs(const std::vector<OpOutput>& ref, const std::vector<OpOutput>& got) {
  std::vector<OutputError> errors;
  for (size_t o = 0; o < ref.size(); ++o) {
    OutputError e;
    e.name = ref[o].name;
    if (o >= got.size() || got[o].name != ref[o].name || got[o].values.size() != ref[o].values.size()) {
      e.shape_mismatch = true;
      errors.push_back(e);
      continue;
    }
    const std::vector<float>&r = ref[o].values, &g = got[o].values;
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < r.size(); ++i) {
      const double d = static_cast<double>(g[i]) - static_cast<double>(r[i]);
      err += d * d;
      norm += static_cast<double>(r[i]) * static_cast<double>(r[i]);
      if (!(std::fabs(d) <= e.max_abs)) e.max_abs = std::fabs(d);  // NaN sticks
      if (std::memcmp(&r[i], &g[i], sizeof(float)) != 0) {
        if (e.mismatches++ == 0) {
          e.first_mismatch = static_cast<int64_t>(i);
          e.ref_at_first = r[i];
          e.got_at_first = g[i];
        }
      }
    }
    e.nmse = err == 0.0 ? 0.0 : norm > 0.0 ? err / norm : INFINITY;
    if (std::isnan(err)) e.nmse = NAN;
    errors.push_back(e);
  }
  return errors;
}

}  // namespace fathom::ops
