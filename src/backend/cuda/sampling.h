// The sampling kernels: one token per logits row on the device, by the host sampler's rule (engine/sampler.cc), so
// that non-greedy rows need not copy their 4 x vocab bytes to the host; greedy decoding's argmax; structured output's
// token masks; and the test kernel that pins core/philox.h to cuRAND. Launchers follow launcher.h: pointers, strides
// and a stream in, a cudaError_t (as int) out, no allocation.
//
//   // logits [rows, vocab] (row stride ls); specs, adjust, saved and out on the device.
//   cuda::LaunchSampleRows(logits, ls, rows, vocab, specs, adjust, saved, out, stream);
//   cuda::LaunchArgMax(logits, ls, rows, vocab, ids, stream);
//   cuda::LaunchMaskLogits(logits, ls, vocab, mask_rows, n_masked, masks, (vocab + 31) / 32, stream);
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"
#include "model/sample_rows.h"

namespace fathom::cuda {

// One block per row. The row's LogitAdjust entries change `logits` in place (their raw values go to saved[j], for
// the chosen token's logprob); specs [rows]; adjust and saved [total entries]; out [rows].
int LaunchSampleRows(float* logits, int64_t ls, int64_t rows, int64_t vocab, const SampleRowSpec* specs,
                     const LogitAdjust* adjust, float* saved, SampledToken* out, Stream s);

// ids[r] = argmax of row r of x [rows, cols] (row stride xs), the lowest index among equal maxima (as
// std::max_element; a row of NaNs only gives 0).
int LaunchArgMax(const float* x, int64_t xs, int64_t rows, int64_t cols, int32_t* ids, Stream s);

// For i < n_rows: logits[rows[i] * ls + t] = -inf for every t < vocab whose bit is clear in masks[i * words + t / 32]
// (bit t % 32); other logits untouched. rows [n_rows] and masks [n_rows, words] on the device; words >= ceil(vocab /
// 32). One thread a logit over a 1-d grid (no cap on n_rows).
int LaunchMaskLogits(float* logits, int64_t ls, int64_t vocab, const int32_t* rows, int64_t n_rows,
                     const uint32_t* masks, int64_t words, Stream s);

// For the test that pins core/philox.h to cuRAND: r[i] = cuRAND's curand_Philox4x32_10(c[i], k[i]) (4 words), then
// core/philox.h's Philox4x32 computed on the device (4 words). c [n][4]; k [n][2]; r [n][8]. Device pointers.
int LaunchCurandPhilox(const uint32_t* c, const uint32_t* k, int64_t n, uint32_t* r, Stream s);

}  // namespace fathom::cuda
