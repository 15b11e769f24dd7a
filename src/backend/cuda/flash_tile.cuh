// The per-tile steps of the flash-attention kernels on tensor cores whose mma rows are query rows (a warp's 16 rows
// of one head): MlaContextMmaKernel (mla.cu) and PrefillMmaAttentionKernel (attention_prefill.cu). Fragments follow
// mma.m16n8k16's layouts (mma.cuh): g = lane / 4, tq = lane % 4; a thread holds rows g and g + 8. Scores are in log2
// units (Q pre-scaled by scale * log2 e). Include from .cu files only.
//
//   StageQ<T, 64, kQk>(q, qs0, qs1, row0, rows, head, scale * log2e, sq, row);  __syncthreads();
//   uint32_t qf[kQk / 16][4];        // Q as A fragments
//   int64_t pos[2];
//   LoadQRows<T, kQk / 16>(sq, row, positions, row0, rows, last_pos, warp, lane, qf, pos);
//   float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, o[kV / 8][4] = {};
//   for each key tile in shared memory (sk, sv):
//     float sc[kKeys / 8][4] = {};
//     TileScores<T, kQk / 16, kKeys>(qf, sk, row, lane, sc);
//     ... sc[nt][e] = -INFINITY where masked (key nt * 8 + 2 tq + (e & 1) of row g + 8 (e / 2)) ...
//     uint32_t pa[kKeys / 16][4];
//     TileSoftmax<T, kKeys, kV / 8>(sc, m, l, o, pa);
//     TileAccumulatePv<T, kKeys, kV / 8>(pa, sv, row, lane, o);
//   FinishRows<kV / 8>(l, o, out_of_row_0, out_row_stride, rows_left, lane);
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

// Q's rows [row0, row0 + rows) of head h (float32, q + r * qs0 + h * qs1, rows 16-byte aligned), times qscale and
// rounded to T, into sq ([kRows][row] elements; rows past `rows` zero), by the block's threads. A barrier must follow
// before LoadQFragments.
template <typename T, int kRows, int kQk>
__device__ __forceinline__ void StageQ(const float* q, int64_t qs0, int64_t qs1, int64_t row0, int64_t rows, int64_t h,
                                       float qscale, T* sq, int row) {
  for (int e = threadIdx.x; e < kRows * (kQk / 4); e += blockDim.x) {
    const int r = e / (kQk / 4), d = (e % (kQk / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) v = *reinterpret_cast<const float4*>(q + (row0 + r) * qs0 + h * qs1 + d);
    T* dst = sq + r * row + d;
    dst[0] = FromF<T>(v.x * qscale);
    dst[1] = FromF<T>(v.y * qscale);
    dst[2] = FromF<T>(v.z * qscale);
    dst[3] = FromF<T>(v.w * qscale);
  }
}

// The warp's 16 query rows of sq as A fragments (kKt of 16 dims), and the positions of this thread's two rows (g and
// g + 8 of the warp's; rows past `rows` take last_pos).
template <typename T, int kKt>
__device__ __forceinline__ void LoadQRows(const T* sq, int row, const int32_t* positions, int64_t row0, int64_t rows,
                                          int64_t last_pos, int warp, int lane, uint32_t (&qf)[kKt][4],
                                          int64_t (&pos)[2]) {
#pragma unroll
  for (int kt = 0; kt < kKt; ++kt) {
    LdMatrixX4(qf[kt], sq + (warp * 16 + (lane & 15)) * row + kt * 16 + (lane >> 4) * 8, false);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = warp * 16 + lane / 4 + 8 * i;
    pos[i] = r < rows ? static_cast<int64_t>(positions[row0 + r]) : last_pos;
  }
}

// S = Q K^T for a tile of kKeys keys: sk holds the keys as rows (`row` elements apart), Q's kKt fragments of 16 dims.
template <typename T, int kKt, int kKeys>
__device__ __forceinline__ void TileScores(const uint32_t (&qf)[kKt][4], const T* sk, int row, int lane,
                                           float (&sc)[kKeys / 8][4]) {
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int kt = 0; kt < kKt; ++kt) {
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      const T* kr = sk + (nt * 8 + g) * row + kt * 16 + 2 * tq;
      Mma16816<T>(sc[nt], qf[kt], *reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8));
    }
  }
}

// The online softmax over one tile's masked scores: the rows' running maxima m (the four lanes of a row agree) and
// this lane's partial sums l move on, o is rescaled, and pa gets P rounded to T as A fragments of 16 keys each. A
// row's first tile must hold one unmasked key (m stays finite).
template <typename T, int kKeys, int kVt>
__device__ __forceinline__ void TileSoftmax(const float (&sc)[kKeys / 8][4], float (&m)[2], float (&l)[2],
                                            float (&o)[kVt][4], uint32_t (&pa)[kKeys / 16][4]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], sc[nt][e]);
  }
  float cf[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
    const float nm = fmaxf(m[i], tile_max[i]);
    cf[i] = exp2f(m[i] - nm);
    m[i] = nm;
    l[i] *= cf[i];
  }
#pragma unroll
  for (int nt = 0; nt < kVt; ++nt) {
    o[nt][0] *= cf[0];
    o[nt][1] *= cf[0];
    o[nt][2] *= cf[1];
    o[nt][3] *= cf[1];
  }
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
    const float p0 = exp2f(sc[nt][0] - m[0]), p1 = exp2f(sc[nt][1] - m[0]);
    const float p2 = exp2f(sc[nt][2] - m[1]), p3 = exp2f(sc[nt][3] - m[1]);
    l[0] += p0 + p1;
    l[1] += p2 + p3;
    const int kt = nt / 2, half = nt % 2;
    pa[kt][2 * half] = Pack2(FromF<T>(p0), FromF<T>(p1));
    pa[kt][2 * half + 1] = Pack2(FromF<T>(p2), FromF<T>(p3));
  }
}

// O += P V for the tile: sv holds the values as rows (`row` elements apart), kVt * 8 dims from column 0, read as B
// fragments by ldmatrix.trans.
template <typename T, int kKeys, int kVt>
__device__ __forceinline__ void TileAccumulatePv(const uint32_t (&pa)[kKeys / 16][4], const T* sv, int row, int lane,
                                                 float (&o)[kVt][4]) {
#pragma unroll
  for (int kt = 0; kt < kKeys / 16; ++kt) {
#pragma unroll
    for (int nt = 0; nt < kVt; nt += 2) {
      uint32_t vf[4];
      LdMatrixX4(vf, sv + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * row + nt * 8 + ((lane >> 4) & 1) * 8, true);
      Mma16816<T>(o[nt], pa[kt], vf[0], vf[1]);
      Mma16816<T>(o[nt + 1], pa[kt], vf[2], vf[3]);
    }
  }
}

// The warp's normalized rows: row r of its 16 (this thread's g and g + 8) to out + r * out_stride, for r < rows.
template <int kVt>
__device__ __forceinline__ void FinishRows(float (&l)[2], const float (&o)[kVt][4], float* out, int64_t out_stride,
                                           int64_t rows, int lane) {
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = g + 8 * i;
    if (r >= rows) continue;
    float* dst = out + r * out_stride;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int nt = 0; nt < kVt; ++nt) {
      dst[nt * 8 + 2 * tq] = o[nt][2 * i] * inv;
      dst[nt * 8 + 2 * tq + 1] = o[nt][2 * i + 1] * inv;
    }
  }
}

}  // namespace fathom::cuda
