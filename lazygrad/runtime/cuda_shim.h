// cuda_shim.h: just enough of CUDA to run lazygrad's CUDA C kernels on the CPU (CUDA=1 MOCKCUDA=1).
//
// The kernel source is compiled unchanged as C++ (g++ -std=c++17 -fopenmp) after this header:
// - __global__/__device__ mean nothing; a kernel is an ordinary function;
// - blockIdx/threadIdx/blockDim/gridDim are per-thread (thread_local) variables set before each call;
// - __shared__ is static storage, shared by every thread; blocks run one after another when a kernel uses it;
// - __syncthreads() is an OpenMP barrier between the threads of a block;
// - half is _Float16, with CUDA's conversion functions.
// Warp shuffles, inline PTX, tensor cores and dynamic shared memory are not emulated.
#pragma once
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cstddef>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() _Pragma("omp barrier")

struct uint3 {
  unsigned int x, y, z;
};
typedef uint3 dim3;
static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;

typedef _Float16 half;
typedef _Float16 __half;
static inline float __half2float(half value) { return (float)value; }
static inline half __float2half(float value) { return (half)value; }
static inline float __int_as_float(int bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

namespace lazygrad_shim {

// Calls kernel(arguments[0], arguments[1], ...) with each void* converted to the kernel's parameter type.
template <typename... Parameters, std::size_t... Positions>
void call(void (*kernel)(Parameters...), void **arguments, std::index_sequence<Positions...>) {
  kernel(static_cast<Parameters>(arguments[Positions])...);
}

// Runs grid x block threads of a kernel. A kernel that synchronizes (`cooperative`) runs block after block, each
// block's threads as one OpenMP team so that __syncthreads() can wait for all of them; any other kernel runs its
// threads as a plain parallel loop.
template <typename... Parameters>
void launch(void (*kernel)(Parameters...), void **arguments, unsigned int grid, unsigned int block, bool cooperative) {
  auto run_thread = [&](unsigned int block_index, unsigned int thread_index) {
    blockIdx = {block_index, 0, 0};
    threadIdx = {thread_index, 0, 0};
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    call(kernel, arguments, std::index_sequence_for<Parameters...>{});
  };
  if (cooperative) {
    omp_set_dynamic(0);
    for (unsigned int block_index = 0; block_index < grid; block_index++) {
#pragma omp parallel num_threads(block)
      {
        if ((unsigned int)omp_get_num_threads() != block) {
          fprintf(stderr, "cuda_shim: OpenMP gave %d threads for a block of %u\n", omp_get_num_threads(), block);
          abort();
        }
        run_thread(block_index, (unsigned int)omp_get_thread_num());
      }
    }
  } else {
    long long threads = (long long)grid * block;
#pragma omp parallel for schedule(static)
    for (long long thread = 0; thread < threads; thread++) {
      run_thread((unsigned int)(thread / block), (unsigned int)(thread % block));
    }
  }
}

}  // namespace lazygrad_shim
