// FATHOM_HOST_DEVICE marks a function that host code and CUDA kernels both call (router rules, the sampler's RNG):
// inline on the host, __host__ __device__ __forceinline__ under nvcc.
//
//   FATHOM_HOST_DEVICE float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
#pragma once

#if defined(__CUDACC__)
#define FATHOM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FATHOM_HOST_DEVICE inline
#endif
