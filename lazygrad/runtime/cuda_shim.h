// cuda_shim.h: just enough of CUDA to run lazygrad's CUDA C kernels on the CPU (CUDA=1 MOCKCUDA=1).
//
// The kernel source is compiled unchanged as C++ (g++ -std=c++17) after this header:
// - __global__/__device__/__launch_bounds__ mean nothing; a kernel is an ordinary function;
// - blockIdx/threadIdx/blockDim/gridDim are variables set before each thread runs;
// - __shared__ is static storage, shared by every thread; blocks run one after another when a kernel uses it;
//   dynamic shared memory (LAZYGRAD_DYNAMIC_SHARED, whose size the renderer writes) is a static array of that size;
// - the threads of a block that synchronize run as fibers on the launching thread, one after another, each on a
//   stack of its own: __syncthreads() switches to the next thread, and the block goes on past a barrier once all
//   of its threads have reached it (a block where some threads end while others wait at a barrier, or where
//   they wait at different barriers of the source, is an error);
// - half is _Float16, with CUDA's conversion functions.
// - tensor cores (nvcuda::wmma from mma.h): every thread of a warp holds a whole fragment and computes the whole
//   multiply-accumulate (the exact products summed into the accumulator in float, in order along k), so loads and
//   products agree between the threads; a warp's store is shared out, each thread storing every 32nd value. The
//   threads of a warp must make the same calls (as a GPU's warp makes each as one): a block that ends otherwise
//   is an error.
// - __shfl_sync: every thread of the block puts its value out, waits for the others (a barrier), reads its
//   partner's. Kernels shuffle where every thread of the block does, as at a barrier; the mask must name the
//   warp's lanes the block has, and the lane read must be one of them.
// - cp.async (LAZYGRAD_COPY_ASYNC) lands at the thread's next LAZYGRAD_WAIT_COPIES, the latest a GPU may land
//   it, and its destination reads as all bits set (a NaN) until then: a kernel that reads a tile before waiting for
//   it, or copies into a tile other threads still read, computes NaNs here as it would race on a GPU. A tile's
//   load from shared memory in PTX (LAZYGRAD_LOAD_MATRIX) is load_matrix_sync.
// - an address a GPU faults on is an error: a cp.async's or a wide access's (a float4's) not a multiple of its
//   size, a tensor-core tile's first element not 32-byte aligned or its rows not a multiple of 16 bytes apart.
// Inline PTX is not emulated.
//
// It includes no C++ library header (<cmath> alone would double the compile time), only a few of C's: the math
// functions kernels call are GCC builtins, and the parameter-position list is built here.
#pragma once
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace lazygrad_shim {
static inline void barrier(unsigned int site);
}

#define __global__
#define __launch_bounds__(threads)
#define __device__
#define __host__
#define __forceinline__ inline
#define __align__(bytes) __attribute__((aligned(bytes)))
#define __shared__ static
#define __syncthreads() lazygrad_shim::barrier(__COUNTER__ + 1)  // (each in the source a site of its own)
#define LAZYGRAD_DYNAMIC_SHARED(bytes) static __align__(32) unsigned char lazygrad_shared[bytes]
#define LAZYGRAD_COPY_ASYNC(cache, to, start, bytes) lazygrad_shim::copy_async(to, start, bytes)
#define LAZYGRAD_WAIT_COPIES() lazygrad_shim::wait_copies()
#define LAZYGRAD_WIDE(type, address) (*lazygrad_shim::wide<type>(address))
#define LAZYGRAD_LOAD_MATRIX(use, layout, shape, type, fragment, tile, ldm) \
  nvcuda::wmma::load_matrix_sync(fragment, tile, ldm)

struct uint3 {
  unsigned int x, y, z;
};
typedef uint3 dim3;
struct __attribute__((aligned(8))) uint2 {
  unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned int x, y, z, w;
};
struct __attribute__((aligned(16))) int4 {
  int x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(16))) double2 {
  double x, y;
};
struct __attribute__((aligned(16))) longlong2 {
  long long x, y;
};
struct __attribute__((aligned(16))) ulonglong2 {
  unsigned long long x, y;
};
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

namespace lazygrad_shim {
// (`call`: the CUDA call that fails, where it is not the kernel's code)
static void fail(const char *message, unsigned int block_index, const char *call = nullptr) {
  fprintf(stderr, "cuda_shim: %s%s%s (block %u)\n", call ? call : "", call ? ": " : "", message, block_index);
  __builtin_abort();
}

// What a GPU faults on or leaves undefined for an address: `what` is an error unless `address` is a multiple of
// `alignment` bytes
static inline void check_aligned(const void *address, unsigned long alignment, const char *what) {
  if ((unsigned long)address % alignment != 0) fail(what, blockIdx.x);
}

// A wide access (LAZYGRAD_WIDE: a float4's 16 bytes read or written at once) at `address`
template <typename Vector, typename Element>
static inline Vector *wide(Element *address) {
  check_aligned(address, sizeof(Vector), "a wide load or store (float4) at an address that is not a multiple of its size");
  return (Vector *)address;
}

// Each thread's copies in flight (cp.async), landed by its next wait: a thread with more than PENDING_COPIES lands
// them all first (a GPU may land a copy at any time before the wait)
struct Copy {
  void *to;
  const void *from;
  unsigned int bytes;
};
constexpr unsigned int PENDING_COPIES = 64;
static Copy pending[1024][PENDING_COPIES];
static unsigned int pending_count[1024];

static inline void wait_copies() {
  unsigned int thread = threadIdx.x;
  for (unsigned int i = 0; i < pending_count[thread]; i++) {
    const Copy &copy = pending[thread][i];
    __builtin_memcpy(copy.to, copy.from, copy.bytes);
  }
  pending_count[thread] = 0;
}

// Each thread's tensor-core calls (the kind, tile and stride of each, in order), folded into one number: the
// threads of a warp must make the same calls together, as a GPU's warp makes each as one (checked as a block ends)
static unsigned long long warp_calls[1024];

static inline void note_warp_call(unsigned long long kind, const void *tile, unsigned long long stride) {
  unsigned long long &calls = warp_calls[threadIdx.x];
  calls = calls * 1099511628211ull ^ (kind + 31 * (unsigned long long)tile + 1000003 * stride);
}

static inline void copy_async(void *to, const void *from, unsigned int bytes) {
  check_aligned(to, bytes, "cp.async to an address that is not a multiple of its size");
  check_aligned(from, bytes, "cp.async from an address that is not a multiple of its size");
  unsigned int thread = threadIdx.x;
  if (pending_count[thread] == PENDING_COPIES) wait_copies();
  __builtin_memset(to, 0xff, bytes);  // (what the destination may hold until the copy lands: a NaN)
  pending[thread][pending_count[thread]++] = {to, from, bytes};
}
}  // namespace lazygrad_shim

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
static inline double fmod(double a, double b) { return __builtin_fmod(a, b); }
static inline float fmodf(float a, float b) { return __builtin_fmodf(a, b); }
static inline double fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
static inline float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// The value `value` has in the thread of the same warp at lane `lane` (modulo the warp's 32, as on a GPU). The
// barrier before the exchange keeps a thread from overwriting a value another has yet to read in the one before.
// `mask` must name the lanes the block has in the thread's warp (a GPU waits for lanes named that never come, and
// leaves a read of a lane not named undefined).
template <typename T>
static inline T __shfl_sync(unsigned int mask, T value, int lane) {
  unsigned int first = threadIdx.x & ~31u, lanes = blockDim.x - first < 32u ? blockDim.x - first : 32u;
  if (mask != (lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u))
    lazygrad_shim::fail("__shfl_sync: a mask other than the lanes the block has in the warp", blockIdx.x);
  if (((mask >> ((unsigned int)lane & 31u)) & 1u) == 0)
    lazygrad_shim::fail("__shfl_sync: a read of a lane the mask leaves out", blockIdx.x);
  static T exchange[1024];
  lazygrad_shim::barrier(0);
  exchange[threadIdx.x] = value;
  lazygrad_shim::barrier(0);
  return exchange[(threadIdx.x & ~31u) | ((unsigned int)lane & 31u)];
}

// bfloat16 is its bits (memory only: kernels compute in float)
struct __nv_bfloat16 {
  unsigned short bits;
};

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

constexpr int warp_size = 32;

template <typename Use, int M, int N, int K, typename Element, typename Layout = void>
struct fragment {
  static constexpr int rows = __is_same(Use, matrix_b) ? K : M;
  static constexpr int columns = __is_same(Use, matrix_a) ? K : N;
  static constexpr int num_elements = rows * columns;
  float x[rows * columns];  // the whole matrix, row-major, in every thread
};

static inline float element_value(half value) { return (float)value; }
static inline float element_value(float value) { return value; }
static inline float element_value(__nv_bfloat16 value) { return bit_cast<float>((unsigned int)value.bits << 16); }

// round to TF32's 10 mantissa bits, to nearest with ties away from zero (infinities and NaN stay)
static inline float __float_to_tf32(float value) {
  unsigned int bits = bit_cast<unsigned int>(value);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  return bit_cast<float>(bits);
}

// A tile's first element must be 32-byte aligned, and its rows (or columns) a multiple of 16 bytes apart
static inline void check_tile(const char *call, const void *memory, unsigned long stride_bytes) {
  const char *problem = (unsigned long)memory % 32 != 0 ? "a tile whose first element is not 32-byte aligned"
                        : stride_bytes % 16 != 0        ? "a tile whose rows are not a multiple of 16 bytes apart"
                                                        : nullptr;
  if (problem != nullptr) lazygrad_shim::fail(problem, blockIdx.x, call);
}

template <typename Use, int M, int N, int K, typename Element, typename Layout, typename Value>
void fill_fragment(fragment<Use, M, N, K, Element, Layout> &target, Value value) {
  for (int i = 0; i < target.num_elements; i++) target.x[i] = (float)value;
}

template <typename Use, int M, int N, int K, typename Element, typename Layout, typename Memory>
void load_matrix_sync(fragment<Use, M, N, K, Element, Layout> &target, const Memory *memory, unsigned int ldm) {
  check_tile("load_matrix_sync", memory, ldm * sizeof(Memory));
  lazygrad_shim::note_warp_call(1, memory, ldm);
  using fragment_type = fragment<Use, M, N, K, Element, Layout>;
  for (int row = 0; row < fragment_type::rows; row++) {
    for (int column = 0; column < fragment_type::columns; column++) {
      unsigned int index = __is_same(Layout, row_major) ? row * ldm + column : column * ldm + row;
      target.x[row * fragment_type::columns + column] = element_value(memory[index]);
    }
  }
}

template <int M, int N, int K, typename ElementA, typename LayoutA, typename ElementB, typename LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float> &result, const fragment<matrix_a, M, N, K, ElementA, LayoutA> &a,
              const fragment<matrix_b, M, N, K, ElementB, LayoutB> &b,
              const fragment<accumulator, M, N, K, float> &added) {
  lazygrad_shim::note_warp_call(3, nullptr, M * N * K);
  float sums[M * N];
  for (int row = 0; row < M; row++) {
    for (int column = 0; column < N; column++) {
      float sum = added.x[row * N + column];
      for (int step = 0; step < K; step++) sum += a.x[row * K + step] * b.x[step * N + column];
      sums[row * N + column] = sum;
    }
  }
  for (int i = 0; i < M * N; i++) result.x[i] = sums[i];
}

template <int M, int N, int K>
void store_matrix_sync(float *memory, const fragment<accumulator, M, N, K, float> &source, unsigned int ldm,
                       layout_t layout) {
  check_tile("store_matrix_sync", memory, ldm * sizeof(float));
  lazygrad_shim::note_warp_call(2, memory, ldm);
  for (int i = threadIdx.x % warp_size; i < M * N; i += warp_size) {
    int row = i / N, column = i % N;
    memory[layout == mem_row_major ? row * ldm + column : column * ldm + row] = source.x[i];
  }
}

}  // namespace wmma
}  // namespace nvcuda

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

// ---- fibers: the threads of a block that synchronize ----

// each thread's stack (a tensor-core kernel's fragments take ~30 KiB), below it a page no thread may touch: a
// thread that overflows its stack faults there, where it would otherwise write over its neighbour's
constexpr unsigned long STACK_BYTES = 256 * 1024;

#if defined(__x86_64__)
// A fiber's context is its saved stack pointer. switch_context(&save, load) pushes the callee-saved registers and
// the SSE and x87 control words, stores the stack pointer in save, and pops the same from the stack at load;
// fiber_start is where a new fiber's first switch returns to: it calls the function in r12.
typedef void *Context;
extern "C" __attribute__((visibility("hidden"))) void lazygrad_switch_context(Context *save, Context load);
extern "C" __attribute__((visibility("hidden"))) void lazygrad_fiber_start();
asm(R"(
  .text
  .p2align 4
  .globl lazygrad_switch_context
  .hidden lazygrad_switch_context
  .type lazygrad_switch_context, @function
lazygrad_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size lazygrad_switch_context, .-lazygrad_switch_context
  .globl lazygrad_fiber_start
  .hidden lazygrad_fiber_start
  .type lazygrad_fiber_start, @function
lazygrad_fiber_start:
  callq *%r12
  ud2
  .size lazygrad_fiber_start, .-lazygrad_fiber_start
)");

static inline void switch_context(Context *save, Context *load) { lazygrad_switch_context(save, *load); }

// A new fiber's context: its stack holding what switch_context pops (this thread's control words; entry in r12),
// then fiber_start as the return address, 16-byte aligned below it as a call needs
static inline void make_context(Context *context, unsigned char *stack, void (*entry)()) {
  unsigned int control[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
  void **top = (void **)(stack + STACK_BYTES);
  *--top = (void *)lazygrad_fiber_start;
  *--top = nullptr;  // rbp
  *--top = nullptr;  // rbx
  *--top = (void *)entry;  // r12
  for (int i = 0; i < 3; i++) *--top = nullptr;  // r13, r14, r15
  --top;
  __builtin_memcpy(top, control, sizeof control);
  *context = top;
}
#else
typedef ucontext_t Context;
static inline void switch_context(Context *save, Context *load) { swapcontext(save, load); }
static inline void make_context(Context *context, unsigned char *stack, void (*entry)()) {
  getcontext(context);
  context->uc_stack.ss_sp = stack;
  context->uc_stack.ss_size = STACK_BYTES;
  context->uc_link = nullptr;
  makecontext(context, entry, 0);
}
#endif

// The block whose threads run now: `run(launch)` runs the thread `current` (threadIdx says which); each thread's
// context while it waits at a barrier, the scheduler's while a thread runs
struct Block {
  void (*run)(void *launch);
  void *launch;
  unsigned int current;
  bool current_ended;
  Context scheduler;
  Context *contexts;
};
static Block *running;

static void fiber_main() {
  Block *block = running;
  block->run(block->launch);
  block->current_ended = true;
  switch_context(&block->contexts[block->current], &block->scheduler);  // (never resumed)
  __builtin_unreachable();
}

// where each thread of the running block waits: a __syncthreads() of the source (numbered from 1), or a shuffle's (0)
static unsigned int barrier_sites[1024];

static inline void barrier(unsigned int site) {
  barrier_sites[threadIdx.x] = site;
  switch_context(&running->contexts[running->current], &running->scheduler);
}

// Runs the threads of a block that synchronize, as fibers on this thread, round by round: each thread runs until it
// reaches a barrier or its end; past the barrier once all have reached it.
static void run_block(void (*run)(void *), void *launch, unsigned int threads, unsigned int block_index,
                      unsigned char **stacks, Context *contexts) {
  Block block = {run, launch, 0, false, {}, contexts};
  for (unsigned int thread = 0; thread < threads; thread++) {
    make_context(&contexts[thread], stacks[thread], fiber_main);
    pending_count[thread] = 0;  // (copies a thread of the last block never waited for never land)
    warp_calls[thread] = 0;
  }
  running = &block;
  for (bool waiting = true; waiting;) {
    unsigned int ended = 0;
    for (unsigned int thread = 0; thread < threads; thread++) {
      block.current = thread;
      block.current_ended = false;
      threadIdx = {thread, 0, 0};
      switch_context(&block.scheduler, &contexts[thread]);
      ended += block.current_ended;
    }
    if (ended != 0 && ended != threads)
      fail("some threads of a block ended while others wait at a barrier", block_index);
    waiting = ended == 0;
    for (unsigned int thread = 1; waiting && thread < threads; thread++)
      if (barrier_sites[thread] != barrier_sites[0])
        fail("the threads of a block wait at different barriers (a GPU's would not meet)", block_index);
  }
  for (unsigned int thread = 1; thread < threads; thread++)
    if (thread % 32 != 0 && warp_calls[thread] != warp_calls[thread - 1])
      fail("the threads of a warp made different tensor-core calls (a GPU's warp makes each as one)", block_index);
  running = nullptr;
}

// Calls kernel(*params[0], *params[1], ...) for one thread, the kernel and params behind `launch`
template <typename... Parameters>
struct Launch {
  void (*kernel)(Parameters...);
  void **params;
  static void run(void *self) {
    Launch *launch = static_cast<Launch *>(self);
    call(launch->kernel, launch->params, positions_for<sizeof...(Parameters)>{});
  }
};

// Runs grid x block threads of a kernel. A kernel that synchronizes (`cooperative`) runs block after block, each
// block's threads as fibers (see run_block); any other kernel runs its threads as a plain loop.
template <typename... Parameters>
void launch(void (*kernel)(Parameters...), void **params, unsigned int grid, unsigned int block, bool cooperative) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  if (cooperative) {
    Launch<Parameters...> state = {kernel, params};
    // each thread's guard page and stack (whose pages only its use makes real), then their contexts
    unsigned long page = sysconf(_SC_PAGESIZE), span = page + STACK_BYTES;
    unsigned long bytes = block * (span + sizeof(Context) + sizeof(unsigned char *));
    void *memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) fail("no memory for the threads' stacks", 0);
    unsigned char *start = static_cast<unsigned char *>(memory);
    Context *contexts = reinterpret_cast<Context *>(start + block * span);
    unsigned char **stacks = reinterpret_cast<unsigned char **>(contexts + block);
    for (unsigned int thread = 0; thread < block; thread++) {
      mprotect(start + thread * span, page, PROT_NONE);
      stacks[thread] = start + thread * span + page;
    }
    for (unsigned int block_index = 0; block_index < grid; block_index++) {
      blockIdx = {block_index, 0, 0};
      run_block(Launch<Parameters...>::run, &state, block, block_index, stacks, contexts);
    }
    munmap(memory, bytes);
  } else {
    long long threads = (long long)grid * block;
    for (long long thread = 0; thread < threads; thread++) {
      blockIdx = {(unsigned int)(thread / block), 0, 0};
      threadIdx = {(unsigned int)(thread % block), 0, 0};
      call(kernel, params, positions_for<sizeof...(Parameters)>{});
    }
  }
}

}  // namespace lazygrad_shim
