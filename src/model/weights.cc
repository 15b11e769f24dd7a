#include "model/weights.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <optional>

#include "core/bytes.h"
#include "core/logging.h"
#include "core/thread_pool.h"

namespace fathom {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

StatusOr<LoadFormat> ParseLoadFormat(const std::string& name) {
  if (name == "auto") return LoadFormat::kAuto;
  if (name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return InvalidArgumentError(fmt::format("unknown load format '{}' (use auto, safetensors or dummy)", name));
}

const TensorView& WeightStore::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  FATHOM_CHECK(it != tensors_.end(), "weight '{}' was not loaded", name);
  return it->second;
}

const TensorView* WeightStore::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void WeightStore::Put(const std::string& name, Tensor owned) {
  tensors_[name] = owned.view();
  owned_.push_back(std::move(owned));
}

void WeightStore::AddLinear(std::shared_ptr<const LinearBinding> binding) {
  const std::string prefix = binding->spec.prefix;
  linears_[prefix] = std::move(binding);
}

const LinearBinding* WeightStore::FindLinear(const std::string& prefix) const {
  auto it = linears_.find(prefix);
  return it == linears_.end() ? nullptr : it->second.get();
}

StatusOr<LinearWeight> WeightStore::UnpreparedLinear(const std::string& prefix) const {
  const LinearBinding* b = FindLinear(prefix);
  if (b == nullptr) return NotFoundError(fmt::format("no linear layer '{}' among the loaded weights", prefix));
  return b->method->Bind(b->spec, [this](const std::string& n) { return Find(n); });
}

StatusOr<LinearWeight> WeightStore::Linear(const std::string& prefix, Backend& backend) const {
  FATHOM_ASSIGN_OR_RETURN(LinearWeight w, UnpreparedLinear(prefix));
  FATHOM_RETURN_IF_ERROR(backend.PrepareLinear(w));
  return w;
}

namespace {

// What a dummy weight holds: a constant, or the uniform pattern `key` in [-scale, scale] (FillDummy).
struct DummyPattern {
  std::optional<float> constant;
  uint64_t key = 0;
  float scale = 0.0f;
};

DummyPattern PatternOf(const WeightSpec& spec, uint64_t seed) {
  DummyPattern p;
  if (spec.init != WeightInit::kRandom && spec.init != WeightInit::kRandomIndex) {
    p.constant = spec.init == WeightInit::kOnes ? 1.0f : spec.init == WeightInit::kConstant ? spec.init_value : 0.0f;
    return p;
  }
  // Uniform in [-a, a] with a standard deviation of 0.02, the usual initializer_range.
  p.scale = 0.02f * 1.7320508f;
  p.key = SplitMix64(HashName(spec.name) ^ SplitMix64(seed));
  return p;
}

// Element i of a rank's shard is element GlobalIndex(i) of the whole tensor (row-major), so that shards hold the
// values of their part of the unsharded dummy tensor.
struct ShardIndex {
  int64_t inner = 1;       // elements of the shard per step of the dimensions before the shard's
  int64_t full_inner = 1;  // the same in the whole tensor
  int64_t offset = 0;      // where the shard starts within a full_inner run
  int64_t operator()(int64_t i) const { return i / inner * full_inner + offset + i % inner; }
};

ShardIndex IndexOf(const WeightSpec& spec) {
  ShardIndex m;
  if (!spec.shard.sharded()) {
    m.inner = m.full_inner = std::max<int64_t>(spec.numel(), 1);
    return m;
  }
  const size_t d = static_cast<size_t>(spec.shard.dim);
  for (size_t i = d; i < spec.shape.size(); ++i) m.inner *= spec.shape[i];
  m.full_inner = m.inner * spec.shard.parts;
  m.offset = m.inner * spec.shard.index;
  return m;
}

}  // namespace

void FillDummy(const WeightSpec& spec, uint64_t seed, const TensorView& out) {
  const int64_t n = out.numel();
  const DType dt = out.dtype();
  FATHOM_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16 || dt == DType::kF8E4M3 ||
                   dt == DType::kI32 || dt == DType::kI64 || dt == DType::kI8 || dt == DType::kF8E8M0,
               "dummy weights of dtype {}", DTypeName(dt));
  const DummyPattern pattern = PatternOf(spec, seed);
  const ShardIndex index = IndexOf(spec);
  DefaultThreadPool().ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t r = SplitMix64(pattern.key + static_cast<uint64_t>(index(i)));
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      const float v = pattern.constant ? *pattern.constant : (2.0f * u - 1.0f) * pattern.scale;
      switch (dt) {
        case DType::kF32:
          out.data<float>()[i] = v;
          break;
        case DType::kBF16:
          out.data<uint16_t>()[i] = F32ToBf16(v);
          break;
        case DType::kF16:
          out.data<uint16_t>()[i] = F32ToF16(v);
          break;
        case DType::kI32:  // packed 4-bit codes: random bits (eight random nibbles), or the constant; group indices
          out.data<int32_t>()[i] = spec.init == WeightInit::kGroupIndex
                                       ? static_cast<int32_t>(index(i) / static_cast<int64_t>(spec.init_value))
                                   : pattern.constant ? static_cast<int32_t>(*pattern.constant)
                                                      : static_cast<int32_t>(r);
          break;
        case DType::kI64:  // indices (DeepSeek-V4's token-to-expert table): uniform in [0, init_value)
          out.data<int64_t>()[i] = spec.init == WeightInit::kRandomIndex
                                       ? static_cast<int64_t>(r % static_cast<uint64_t>(spec.init_value))
                                       : static_cast<int64_t>(pattern.constant ? *pattern.constant : 0.0f);
          break;
        case DType::kI8:  // packed 4-bit codes (MXFP4): random bits, or the constant
          out.data<uint8_t>()[i] = pattern.constant ? static_cast<uint8_t>(*pattern.constant) : static_cast<uint8_t>(r);
          break;
        case DType::kF8E8M0:  // scale codes: the constant (2^(code - 127))
          out.data<uint8_t>()[i] = static_cast<uint8_t>(pattern.constant ? *pattern.constant : 127.0f);
          break;
        default:  // f8: random codes with |value| <= 1.875, to be scaled by a dummy weight_scale_inv
          out.data<uint8_t>()[i] = pattern.constant ? F32ToF8E4M3(v) : static_cast<uint8_t>(r & 0xbf);
          break;
      }
    }
  });
}

namespace {

// A contiguous host copy of a strided view (a rank's column shard), for backends that upload contiguous memory.
Tensor ContiguousCopy(const TensorView& v) {
  Tensor out = Tensor::Empty(v.dtype(), v.shape());
  const size_t elem = DTypeSize(v.dtype());
  const int64_t rows = v.numel() / v.dim(v.ndim() - 1), cols = v.dim(v.ndim() - 1);
  FATHOM_CHECK(v.ndim() <= 2 && v.stride(v.ndim() - 1) == 1, "a {}-d strided weight view", v.ndim());
  for (int64_t r = 0; r < rows; ++r) {
    const char* src =
        static_cast<const char*>(v.raw()) + static_cast<size_t>(r * (v.ndim() == 2 ? v.stride(0) : 0)) * elem;
    std::memcpy(static_cast<char*>(out.view().raw()) + static_cast<size_t>(r * cols) * elem, src,
                static_cast<size_t>(cols) * elem);
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<WeightStore>> LoadWeights(const std::string& model_dir, const std::vector<WeightSpec>& specs,
                                                   const LoadOptions& options, Backend& backend) {
  auto store = std::make_unique<WeightStore>();
  LoadFormat format = options.format;
  std::unique_ptr<Checkpoint> ckpt;
  if (format == LoadFormat::kAuto || format == LoadFormat::kSafetensors) {
    StatusOr<std::unique_ptr<Checkpoint>> opened = Checkpoint::Open(model_dir);
    if (!opened.ok()) return opened.status();
    ckpt = std::move(opened).value();
    format = LoadFormat::kSafetensors;
  }
  int64_t total_bytes = 0;
  for (const WeightSpec& s : specs) total_bytes += s.numel() * static_cast<int64_t>(DTypeSize(s.dtype));
  // Dummy weights filled in host memory (the CPU backend's) must fit there: a config that asks for more is an error
  // naming both sizes, not an allocation that fails halfway (std::bad_alloc).
  if (format == LoadFormat::kDummy && backend.device() == Device::kCpu) {
    const int64_t available = AvailableHostMemoryBytes();
    if (available > 0 && total_bytes > available) {
      return ResourceExhaustedError(fmt::format("dummy weights of this config need {} of host memory; {} is available",
                                                FormatBytes(total_bytes), FormatBytes(available)));
    }
  }
  std::optional<Progress> progress;
  if (options.show_progress) {
    progress.emplace(format == LoadFormat::kDummy ? "generating dummy weights" : "loading weights", total_bytes, "B");
  }

  for (const WeightSpec& s : specs) {
    if (s.linear) store->AddLinear(s.linear);
    const int64_t spec_bytes = s.numel() * static_cast<int64_t>(DTypeSize(s.dtype));
    if (format == LoadFormat::kDummy) {
      if (!s.fallback.empty() && store->Has(s.fallback) && s.shares_storage) {
        store->PutView(s.name, store->Get(s.fallback));
        continue;
      }
      // Made on the device where the backend can (nothing crosses the bus; the same values as FillDummy's). A shard
      // of the first dimension is a contiguous run of the whole tensor: its pattern is the whole one's, shifted.
      if (backend.device() != Device::kCpu && s.shard.dim <= 0 && s.init != WeightInit::kGroupIndex &&
          s.init != WeightInit::kRandomIndex && IsFloating(s.dtype)) {
        const DummyPattern pattern = PatternOf(s, options.seed);
        const uint64_t shift = s.shard.sharded() ? static_cast<uint64_t>(s.shard.index * s.numel()) : 0;
        const DeviceMemoryInfo mem = backend.MemoryInfo();
        if (mem.total_bytes > 0 && mem.free_bytes < spec_bytes) {
          return ResourceExhaustedError(fmt::format("dummy weight '{}' needs {} bytes; the device has {} free", s.name,
                                                    spec_bytes, mem.free_bytes));
        }
        Tensor dev = backend.Alloc(s.dtype, s.shape);
        const Status made = backend.FillDummy(dev, pattern.key + shift, pattern.scale, pattern.constant);
        if (made.ok()) {
          store->Put(s.name, std::move(dev));
          if (progress) progress->Advance(spec_bytes);
          continue;
        }
        if (made.code() != StatusCode::kUnimplemented) return made;
      }
      Tensor host = Tensor::Empty(s.dtype, s.shape);
      FillDummy(s, options.seed, host);
      FATHOM_ASSIGN_OR_RETURN(Tensor dev, backend.Upload(host));
      if (dev.view().raw() == host.view().raw()) {
        store->Put(s.name, std::move(host));
      } else {
        store->Put(s.name, std::move(dev));
      }
      if (progress) progress->Advance(spec_bytes);
      continue;
    }
    std::string source = s.name;
    // Tied weights always read the tensor they are tied to, as transformers does; other fallbacks only apply when
    // the checkpoint lacks the tensor.
    if (!s.fallback.empty() && (s.shares_storage || !ckpt->Has(source)) && ckpt->Has(s.fallback)) source = s.fallback;
    if (!ckpt->Has(source)) {
      return NotFoundError(fmt::format("tensor '{}' is missing from the checkpoint in '{}'", s.name, model_dir));
    }
    if (source != s.name && store->Has(source)) {
      store->PutView(s.name, store->Get(source));
      continue;
    }
    FATHOM_ASSIGN_OR_RETURN(TensorView view, ckpt->Get(source, std::nullopt, s.full_shape()));
    Tensor copy;  // a rank's part of the tensor, or its decoded scales: a slice of the mmap unless copied
    // Power-of-two scales stored as F8_E8M0 (DeepSeek-V4's FP8 `.scale`) where float32 ones are wanted (the FP8
    // block format's scale_inv): decoded once, here, exactly.
    if (view.dtype() == DType::kF8E8M0 && s.dtype == DType::kF32) {
      copy = Tensor::Empty(DType::kF32, view.shape());
      const Tensor packed = view.is_contiguous() ? Tensor() : ContiguousCopy(view);
      const TensorView src = packed.empty() ? view : packed.view();
      ConvertToF32(src.raw(), DType::kF8E8M0, 0, src.numel(), copy.view().data<float>());
      view = copy.view();
    }
    // Any float dtype can stand in for another (kernels convert); which one a weight format needs (f8 e4m3 and its
    // f32 scales) is its method's check, when the layer is bound. Other dtypes must be the spec's.
    if (IsFloating(s.dtype) ? !IsFloating(view.dtype()) : view.dtype() != s.dtype) {
      return InvalidArgumentError(fmt::format("tensor '{}' in '{}' has dtype {}, expected {}", source,
                                              ckpt->FileOf(source), DTypeSafetensorsName(view.dtype()),
                                              DTypeSafetensorsName(s.dtype)));
    }
    if (s.shard.sharded()) {
      const int64_t part = s.shape[static_cast<size_t>(s.shard.dim)];
      view = view.Slice(s.shard.dim, s.shard.index * part, (s.shard.index + 1) * part);
      if (!view.is_contiguous()) {
        copy = ContiguousCopy(view);
        view = copy.view();
      }
    }
    FATHOM_ASSIGN_OR_RETURN(Tensor dev, backend.Upload(view));
    if (!copy.empty() && dev.view().raw() == copy.view().raw()) dev = std::move(copy);  // the CPU backend's view
    store->Put(s.name, std::move(dev));
    if (progress) progress->Advance(spec_bytes);
  }
  if (progress) progress->Finish();
  if (ckpt) {
    int skipped = 0;
    for (const std::string& name : ckpt->names()) {
      bool used = store->Has(name);
      if (!used) ++skipped;
    }
    if (skipped > 0) FATHOM_LOG_DEBUG("{} checkpoint tensors are not used by the model", skipped);
    store->KeepAlive(std::shared_ptr<Checkpoint>(std::move(ckpt)));
  }
  return store;
}

WeightStats ComputeWeightStats(const std::vector<WeightSpec>& specs, const WeightStore* store) {
  WeightStats st;
  for (const WeightSpec& s : specs) {
    const int64_t n = Numel(s.shape);
    DType dt = s.dtype;
    if (store != nullptr) {
      if (const TensorView* v = store->Find(s.name)) dt = v->dtype();
    }
    const double bytes = static_cast<double>(n) * static_cast<double>(DTypeSize(dt));
    st.bytes_read_per_token += bytes * s.read_fraction;
    if (s.shares_storage) continue;
    if (s.draft) {
      st.draft_params += n * s.params_per_element;
      st.draft_bytes += static_cast<int64_t>(bytes);
      st.bytes_by_dtype[dt] += static_cast<int64_t>(bytes);
      st.total_bytes += static_cast<int64_t>(bytes);
      continue;
    }
    st.total_params += n * s.params_per_element;
    st.active_params += static_cast<double>(n * s.params_per_element) * s.active_fraction;
    st.bytes_by_dtype[dt] += static_cast<int64_t>(bytes);
    st.total_bytes += static_cast<int64_t>(bytes);
  }
  return st;
}

}  // namespace fathom
