// cuda_shim.h: just enough of CUDA to run lazygrad's CUDA C kernels on the CPU (CUDA=1 MOCKCUDA=1).
//
// The kernel source is compiled unchanged as C++ (g++ -std=c++17 -fopenmp) after this header:
// - __global__/__device__ mean nothing; a kernel is an ordinary function;
// - blockIdx/threadIdx/blockDim/gridDim are per-thread (thread_local) variables set before each call;
// - __shared__ is static storage, shared by every thread; blocks run one after another when a kernel uses it;
// - __syncthreads() is an OpenMP barrier between the threads of a block;
// - half is _Float16, with CUDA's conversion functions.
// Warp shuffles, inline PTX, tensor cores and dynamic shared memory are not emulated.
//
// It includes no C++ library header (<cmath> alone would double the compile time): the math functions kernels call
// are GCC builtins, and the parameter-position list is built here.
#pragma once
#include <omp.h>

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
template <typename To, typename From>
static inline To bit_cast(From value) {
  To result;
  __builtin_memcpy(&result, &value, sizeof result);
  return result;
}
static inline int __float_as_int(float value) { return bit_cast<int>(value); }
static inline unsigned int __float_as_uint(float value) { return bit_cast<unsigned int>(value); }
static inline float __int_as_float(int value) { return bit_cast<float>(value); }
static inline float __uint_as_float(unsigned int value) { return bit_cast<float>(value); }
static inline long long __double_as_longlong(double value) { return bit_cast<long long>(value); }
static inline double __longlong_as_double(long long value) { return bit_cast<double>(value); }
static inline double sqrt(double value) { return __builtin_sqrt(value); }
static inline double exp2(double value) { return __builtin_exp2(value); }
static inline double log2(double value) { return __builtin_log2(value); }
static inline double sin(double value) { return __builtin_sin(value); }
static inline double cos(double value) { return __builtin_cos(value); }
static inline float sqrtf(float value) { return __builtin_sqrtf(value); }
static inline float exp2f(float value) { return __builtin_exp2f(value); }
static inline float log2f(float value) { return __builtin_log2f(value); }
static inline float sinf(float value) { return __builtin_sinf(value); }
static inline float cosf(float value) { return __builtin_cosf(value); }

namespace lazygrad_shim {

// positions_for<N> is positions<0, 1, ..., N-1>, built in one step by GCC's __integer_pack (what
// std::make_integer_sequence uses), so a kernel may have thousands of parameters without deep template recursion
template <unsigned int... Positions>
struct positions {};
template <unsigned int Count>
using positions_for = positions<__integer_pack(Count)...>;

// Calls kernel(*params[0], *params[1], ...): as with cuLaunchKernel, params[i] points to parameter i's value.
template <typename... Parameters, unsigned int... Positions>
void call(void (*kernel)(Parameters...), void **params, positions<Positions...>) {
  kernel(*static_cast<Parameters *>(params[Positions])...);
}

// Runs grid x block threads of a kernel. A kernel that synchronizes (`cooperative`) runs block after block, each
// block's threads as one OpenMP team so that __syncthreads() can wait for all of them; any other kernel runs its
// threads as a plain parallel loop.
template <typename... Parameters>
void launch(void (*kernel)(Parameters...), void **params, unsigned int grid, unsigned int block, bool cooperative) {
  auto run_thread = [&](unsigned int block_index, unsigned int thread_index) {
    blockIdx = {block_index, 0, 0};
    threadIdx = {thread_index, 0, 0};
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    call(kernel, params, positions_for<sizeof...(Parameters)>{});
  };
  if (cooperative) {
    omp_set_dynamic(0);
    for (unsigned int block_index = 0; block_index < grid; block_index++) {
#pragma omp parallel num_threads(block)
      {
        if ((unsigned int)omp_get_num_threads() != block) {
          __builtin_printf("cuda_shim: OpenMP gave %d threads for a block of %u\n", omp_get_num_threads(), block);
          __builtin_abort();
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
