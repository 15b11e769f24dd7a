#include "backend/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/attention_layouts.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"
#include "format/linear_method.h"

namespace fathom {

namespace {

using cpu::CacheRow;
using cpu::DotF32;
using cpu::GroupOf;
using cpu::ScaleRow;
using cpu::StoreCacheRow;

ThreadPool& Pool() {
  return DefaultThreadPool();
}

float* F32Row(const TensorView& t, int64_t row) {
  return t.data<float>() + row * t.stride(0);
}

}  // namespace

CpuBackend::CpuBackend() : layouts_(cpu::MakeAttentionLayouts(*this)) {
  for (const auto& l : layouts_) FATHOM_CHECK(l != nullptr, "an attention layout without a CPU provider");
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::RecordError(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = std::move(s);
}

Status CpuBackend::Synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = first_error_;
  first_error_ = OkStatus();
  return s;
}

Tensor CpuBackend::Alloc(DType dtype, std::span<const int64_t> shape) {
  return Tensor::Empty(dtype, shape);
}

StatusOr<Tensor> CpuBackend::Upload(const TensorView& host) {
  if (host.device() != Device::kCpu) return InvalidArgumentError("CpuBackend::Upload needs a host tensor");
  if (!host.is_contiguous()) return InvalidArgumentError("CpuBackend::Upload needs a contiguous tensor");
  const std::vector<int64_t> shape = host.shape();
  return Tensor::Adopt(host.raw(), host.dtype(), shape, Device::kCpu, [](void*) {});
}

Status CpuBackend::CopyToHost(const TensorView& src, void* dst) {
  if (!src.is_contiguous()) return InvalidArgumentError("CopyToHost needs a contiguous tensor");
  if (src.nbytes() == 0) return OkStatus();  // an empty vector's data() may be null, which memcpy may not take
  std::memcpy(dst, src.raw(), src.nbytes());
  return OkStatus();
}

Status CpuBackend::CopyFromHost(const void* src, const TensorView& dst) {
  if (!dst.is_contiguous()) return InvalidArgumentError("CopyFromHost needs a contiguous tensor");
  if (dst.nbytes() == 0) return OkStatus();
  std::memcpy(dst.raw(), src, dst.nbytes());
  return OkStatus();
}

Status CpuBackend::CopyOnDevice(const TensorView& src, const TensorView& dst) {
  if (!src.is_contiguous() || !dst.is_contiguous() || src.dtype() != dst.dtype() || src.numel() != dst.numel()) {
    return InvalidArgumentError("CopyOnDevice needs contiguous tensors of one dtype and size");
  }
  std::memmove(dst.raw(), src.raw(), src.nbytes());
  return OkStatus();
}

void CpuBackend::Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const int64_t n = ids.dim(0), hidden = table.dim(1), vocab = table.dim(0);
  FATHOM_CHECK_EQ(out.dim(1), hidden);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = ids.data<int32_t>()[t];
    if (id < 0 || id >= vocab) {
      RecordError(InvalidArgumentError(fmt::format("token id {} outside the vocabulary [0, {})", id, vocab)));
      return;
    }
  }
  Pool().ParallelFor(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int32_t id = ids.data<int32_t>()[t];
      ConvertToF32(table.raw(), table.dtype(), id * table.stride(0), hidden, F32Row(out, t));
    }
  });
}

void CpuBackend::RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  const int64_t n = x.dim(0), h = x.dim(1);
  std::vector<float> w(static_cast<size_t>(h));
  ConvertToF32(weight.raw(), weight.dtype(), 0, h, w.data());
  Pool().ParallelFor(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xr = F32Row(x, t);
      float* o = F32Row(out, t);
      double ss = 0.0;
      for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
      for (int64_t i = 0; i < h; ++i) o[i] = w[i] * (xr[i] * inv);
    }
  });
}

void CpuBackend::AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                            const TensorView& out) {
  AddInPlace(residual, x);
  RmsNorm(residual, weight, eps, out);
}

void CpuBackend::Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  const int64_t n = x.dim(0), in = x.dim(1), m = w.out_features();
  FATHOM_CHECK_EQ(w.in_features(), in);
  FATHOM_CHECK_EQ(out.dim(0), n);
  FATHOM_CHECK_EQ(out.dim(1), m);
  FATHOM_CHECK(x.stride(1) == 1 && out.stride(1) == 1, "Linear needs unit inner strides");
  FATHOM_CHECK(w.fp8_block() ? w.format_payload != nullptr && w.weight.dtype() == DType::kF8E4M3
                             : w.weight.dtype() != DType::kF8E4M3,
               "a {} weight in format {}", DTypeName(w.weight.dtype()), static_cast<int>(w.format));
  std::vector<float> bias;
  if (!w.bias.empty()) {
    bias.resize(static_cast<size_t>(m));
    ConvertToF32(w.bias.raw(), w.bias.dtype(), 0, m, bias.data());
  }
  // Row-parallel over W in tiles: each tile of weight rows is converted to float32 once, then dotted with every
  // token. At n = 1 this is a row-parallel GEMV that reads each weight once.
  constexpr int64_t kTile = 8;
  const int64_t tiles = (m + kTile - 1) / kTile;
  Pool().ParallelFor(tiles, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> buf;
    buf.resize(static_cast<size_t>(kTile * in));
    for (int64_t tile = b; tile < e; ++tile) {
      const int64_t r0 = tile * kTile, r1 = std::min(m, r0 + kTile);
      for (int64_t r = r0; r < r1; ++r) DequantizeRow(w, r, buf.data() + (r - r0) * in);
      for (int64_t t = 0; t < n; ++t) {
        const float* xr = x.data<float>() + t * x.stride(0);
        float* o = out.data<float>() + t * out.stride(0);
        for (int64_t r = r0; r < r1; ++r) {
          float acc = DotF32(xr, buf.data() + (r - r0) * in, in);
          if (!bias.empty()) acc += bias[r];
          o[r] = acc;
        }
      }
    }
  });
}

void CpuBackend::AddInPlace(const TensorView& a, const TensorView& b) {
  const int64_t n = a.dim(0), d = a.dim(1);
  Pool().ParallelFor(n, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      float* ar = F32Row(a, t);
      const float* br = F32Row(b, t);
      for (int64_t i = 0; i < d; ++i) ar[i] += br[i];
    }
  });
}

void CpuBackend::SiluMul(const TensorView& gate, const TensorView& up, const TensorView& out) {
  ClampedSiluMul(gate, up, 0.0f, out);
}

void CpuBackend::ClampedSiluMul(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) {
  const int64_t n = gate.dim(0), d = gate.dim(1);
  const bool clamp = limit > 0.0f;
  Pool().ParallelFor(n, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* g = F32Row(gate, t);
      const float* u = F32Row(up, t);
      float* o = F32Row(out, t);
      for (int64_t i = 0; i < d; ++i) {
        // torch's clamp: NaN stays NaN (std::min and std::clamp return it as the first argument).
        const float gv = clamp ? std::min(g[i], limit) : g[i], uv = clamp ? std::clamp(u[i], -limit, limit) : u[i];
        o[i] = gv / (1.0f + std::exp(-gv)) * uv;
      }
    }
  });
}

void CpuBackend::RopeCosSin(const TensorView& positions, const TensorView& inv_freq, float scale, const TensorView& cos,
                            const TensorView& sin) {
  const int64_t n = positions.dim(0), half = inv_freq.dim(0);
  FATHOM_CHECK_EQ(cos.dim(1), half);
  for (int64_t t = 0; t < n; ++t) {
    const float pos = static_cast<float>(positions.data<int32_t>()[t]);
    for (int64_t i = 0; i < half; ++i) {
      // float32 angle as transformers computes it, then cos/sin of that float.
      const float angle = pos * inv_freq.data<float>()[i];
      F32Row(cos, t)[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
      F32Row(sin, t)[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
    }
  }
}

void CpuBackend::ApplyRope(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved) {
  const int64_t n = x.dim(0), heads = x.dim(1), half = cos.dim(1);
  FATHOM_CHECK_LE(2 * half, x.dim(2));
  FATHOM_CHECK_EQ(x.stride(2), 1);
  Pool().ParallelFor(n, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const float* c = F32Row(cos, t);
      const float* s = F32Row(sin, t);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.data<float>() + t * x.stride(0) + h * x.stride(1);
        for (int64_t i = 0; i < half; ++i) {
          float* a = interleaved ? &v[2 * i] : &v[i];
          float* b = interleaved ? &v[2 * i + 1] : &v[i + half];
          const float x1 = *a, x2 = *b;
          *a = x1 * c[i] - x2 * s[i];
          *b = x2 * c[i] + x1 * s[i];
        }
      }
    }
  });
}

void CpuBackend::WriteKv(const TensorView& k, const TensorView& v, const AttentionMetadata& meta,
                         const KvLayerView& cache) {
  const int64_t n = k.dim(0), heads = k.dim(1), kd = k.dim(2);
  const int64_t vd = v.empty() ? 0 : v.dim(2);
  const int64_t capacity = cache.k.dim(0) * cache.k.dim(1);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t slot = meta.slot_mapping.data<int32_t>()[t];
    if (slot < 0 || slot >= capacity) {
      RecordError(InvalidArgumentError(
          fmt::format("token row {} has KV slot {} outside the cache's {} slots", t, slot, capacity)));
      return;
    }
  }
  const bool fp8 = cache.fp8();
  FATHOM_CHECK(!fp8 || (!cache.k_scale.empty() && (vd == 0 || !cache.v_scale.empty())));
  Pool().ParallelFor(n, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int32_t slot = meta.slot_mapping.data<int32_t>()[t];
      for (int64_t h = 0; h < heads; ++h) {
        const float* ks = k.data<float>() + t * k.stride(0) + h * k.stride(1);
        char* kdst = CacheRow(cache.k, slot, meta.block_size, h);
        StoreCacheRow(ks, kd, cache.k.dtype(), kdst, fp8 ? ScaleRow(cache.k_scale, slot, meta.block_size, h) : nullptr,
                      fp8 ? cache.k_scale.dim(3) : 0);
        if (vd > 0) {
          const float* vs = v.data<float>() + t * v.stride(0) + h * v.stride(1);
          StoreCacheRow(vs, vd, cache.v.dtype(), CacheRow(cache.v, slot, meta.block_size, h),
                        fp8 ? ScaleRow(cache.v_scale, slot, meta.block_size, h) : nullptr,
                        fp8 ? cache.v_scale.dim(3) : 0);
        }
      }
    }
  });
}

void CpuBackend::GatherRows(const TensorView& x, const TensorView& indices, const TensorView& out) {
  const int64_t m = indices.dim(0), d = x.dim(1);
  for (int64_t i = 0; i < m; ++i) {
    const int32_t r = indices.data<int32_t>()[i];
    if (r < 0 || r >= x.dim(0)) {
      RecordError(InvalidArgumentError(fmt::format("gather index {} outside [0, {})", r, x.dim(0))));
      return;
    }
    std::memcpy(F32Row(out, i), F32Row(x, r), static_cast<size_t>(d) * sizeof(float));
  }
}

void CpuBackend::ScatterAddRows(const TensorView& x, const TensorView& indices, const TensorView& weights,
                                const TensorView& out) {
  const int64_t m = indices.dim(0), d = x.dim(1);
  FATHOM_CHECK_EQ(out.dim(1), d);
  for (int64_t i = 0; i < m; ++i) {
    const int32_t r = indices.data<int32_t>()[i];
    if (r < 0 || r >= out.dim(0)) {
      RecordError(InvalidArgumentError(fmt::format("scatter index {} outside [0, {})", r, out.dim(0))));
      return;
    }
  }
  // Serial over i keeps the accumulation order fixed; parallel over columns.
  Pool().ParallelFor(d, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = 0; i < m; ++i) {
      const float w = weights.data<float>()[i];
      const float* src = F32Row(x, i);
      float* dst = F32Row(out, indices.data<int32_t>()[i]);
      for (int64_t c = lo; c < hi; ++c) dst[c] += w * src[c];
    }
  });
}

void CpuBackend::ArgMax(const TensorView& logits, const TensorView& ids) {
  FATHOM_CHECK_EQ(logits.dim(0), ids.dim(0));
  const int64_t vocab = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* row = logits.data<float>() + r * logits.stride(0);
    ids.data<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
}

Status CpuBackend::MaskLogits(const TensorView& logits, std::span<const int32_t> rows, std::span<const uint32_t> masks,
                              int64_t words_per_row) {
  CheckMaskLogitsArgs(logits, rows, masks, words_per_row);
  const int64_t vocab = logits.dim(1);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < rows.size(); ++i) {
    float* row = F32Row(logits, rows[i]);
    const uint32_t* mask = masks.data() + static_cast<int64_t>(i) * words_per_row;
    for (int64_t t = 0; t < vocab; ++t) {
      if (((mask[t >> 5] >> (t & 31)) & 1u) == 0) row[t] = kNegInf;
    }
  }
  return OkStatus();
}

void CpuBackend::Copy(const TensorView& src, const TensorView& dst) {
  FATHOM_CHECK_EQ(src.ndim(), dst.ndim());
  FATHOM_CHECK(src.ndim() == 2 || src.ndim() == 3, "Copy of a {}-d view", src.ndim());
  FATHOM_CHECK(src.dtype() == DType::kF32 && dst.dtype() == DType::kF32, "Copy of non-f32 views");
  for (int i = 0; i < src.ndim(); ++i) FATHOM_CHECK_EQ(src.dim(i), dst.dim(i));
  const int64_t d0 = src.dim(0), d1 = src.ndim() == 3 ? src.dim(1) : 1, inner = src.dim(src.ndim() - 1);
  FATHOM_CHECK(src.stride(src.ndim() - 1) == 1 && dst.stride(dst.ndim() - 1) == 1, "Copy needs unit inner strides");
  for (int64_t a = 0; a < d0; ++a) {
    for (int64_t b = 0; b < d1; ++b) {
      const int64_t so = a * src.stride(0) + (src.ndim() == 3 ? b * src.stride(1) : 0);
      const int64_t dof = a * dst.stride(0) + (dst.ndim() == 3 ? b * dst.stride(1) : 0);
      std::memcpy(dst.data<float>() + dof, src.data<float>() + so, static_cast<size_t>(inner) * sizeof(float));
    }
  }
}

}  // namespace fathom
