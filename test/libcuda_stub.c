// A stand-in for libcuda.so.1, built by test_cuda_runtime.py against the real cuda.h so that every function has
// the driver's own prototype and exported name (the header maps cuMemAlloc to cuMemAlloc_v2, and so on). It lets
// lazygrad's ctypes binding (lazygrad/runtime/cuda_driver.py) run without a GPU: memory is host memory, copies copy,
// kernels and graphs record what they were given (stub_* below), and contexts follow the driver's rules: each thread
// has its own current context, none at first, and calls that need one fail with CUDA_ERROR_INVALID_CONTEXT.
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

static __thread CUcontext current;
static int primary_storage, stream_storage, event_storage[64], graph_storage[4], executable_storage[4];
static int event_count, graph_count, executable_count;
#define PRIMARY ((CUcontext)&primary_storage)
#define NEED_CONTEXT \
  if (current != PRIMARY) return CUDA_ERROR_INVALID_CONTEXT

// what the test reads back
int stub_argument_count = 2;  // how many 8-byte arguments a launch or kernel node copies
unsigned long long stub_launch_arguments[8], stub_node_arguments[8];
unsigned int stub_launch_grid, stub_launch_block;
int stub_launches, stub_graph_launches, stub_node_updates, stub_modules_loaded, stub_modules_unloaded;
char stub_function_name[64];
size_t stub_capacity = (size_t)1 << 30, stub_used;

CUresult cuInit(unsigned int flags) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult error, const char **name) {
  *name = error == CUDA_ERROR_INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT"
          : error == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult error, const char **text) {
  *text = error == CUDA_ERROR_INVALID_CONTEXT ? "invalid device context"
          : error == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "unknown error";
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int *count) { *count = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) { *device = ordinal; return CUDA_SUCCESS; }
CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
  strncpy(name, "stub GPU", length);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
  *value = attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR                ? 9
           : attribute == CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ? 227 * 1024
                                                                                 : 0;
  return CUDA_SUCCESS;
}
int stub_dynamic_shared = 0;
CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute, int value) {
  NEED_CONTEXT;
  if (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
  stub_dynamic_shared = value;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) { *context = PRIMARY; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *context) { *context = current; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext context) { current = context; return CUDA_SUCCESS; }

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  NEED_CONTEXT;
  *module = (CUmodule)strdup((const char *)image);
  stub_modules_loaded++;
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule module) {
  NEED_CONTEXT;
  free(module);
  stub_modules_unloaded++;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
  NEED_CONTEXT;
  strncpy(stub_function_name, name, sizeof stub_function_name - 1);
  *function = (CUfunction)module;
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *pointer, size_t size) {
  NEED_CONTEXT;
  if (stub_used + size > stub_capacity) return CUDA_ERROR_OUT_OF_MEMORY;
  stub_used += size;
  *pointer = (CUdeviceptr)malloc(size);
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr pointer) {
  NEED_CONTEXT;
  free((void *)pointer);
  return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
  NEED_CONTEXT;
  *free_bytes = stub_capacity - stub_used;
  *total = stub_capacity;
  return CUDA_SUCCESS;
}
CUresult cuMemHostAlloc(void **address, size_t size, unsigned int flags) {
  NEED_CONTEXT;
  *address = malloc(size);
  return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void *address) {
  NEED_CONTEXT;
  free(address);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr destination, const void *source, size_t size, CUstream stream) {
  NEED_CONTEXT;
  memcpy((void *)destination, source, size);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void *destination, CUdeviceptr source, size_t size, CUstream stream) {
  NEED_CONTEXT;
  memcpy(destination, (const void *)source, size);
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
  NEED_CONTEXT;
  *stream = (CUstream)&stream_storage;
  return flags == CU_STREAM_NON_BLOCKING ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuStreamSynchronize(CUstream stream) {
  NEED_CONTEXT;
  return stream == (CUstream)&stream_storage ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                        unsigned int block_x, unsigned int block_y, unsigned int block_z, unsigned int shared,
                        CUstream stream, void **params, void **extra) {
  NEED_CONTEXT;
  if (grid_y != 1 || grid_z != 1 || block_y != 1 || block_z != 1 || shared != 0 || extra != NULL ||
      stream != (CUstream)&stream_storage)
    return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < stub_argument_count; i++) stub_launch_arguments[i] = *(unsigned long long *)params[i];
  stub_launch_grid = grid_x;
  stub_launch_block = block_x;
  stub_launches++;
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent *event, unsigned int flags) {
  NEED_CONTEXT;
  *event = (CUevent)&event_storage[event_count++ % 64];
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent event, CUstream stream) { NEED_CONTEXT; return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent event) { NEED_CONTEXT; return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float *milliseconds, CUevent start, CUevent end) {
  NEED_CONTEXT;
  *milliseconds = 0.5f;
  return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
  NEED_CONTEXT;
  *graph = (CUgraph)&graph_storage[graph_count++ % 4];
  return CUDA_SUCCESS;
}
static CUresult copy_node(const CUDA_KERNEL_NODE_PARAMS *node) {
  if (node->gridDimY != 1 || node->blockDimZ != 1 || node->extra != NULL || node->kern != NULL) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < stub_argument_count; i++) stub_node_arguments[i] = *(unsigned long long *)node->kernelParams[i];
  return CUDA_SUCCESS;
}
CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *dependencies, size_t count,
                              const CUDA_KERNEL_NODE_PARAMS *parameters) {
  NEED_CONTEXT;
  static int nodes;
  *node = (CUgraphNode)(size_t)(++nodes * 16);
  return copy_node(parameters);
}
CUresult cuGraphInstantiate(CUgraphExec *executable, CUgraph graph, unsigned long long flags) {
  NEED_CONTEXT;
  *executable = (CUgraphExec)&executable_storage[executable_count++ % 4];
  return CUDA_SUCCESS;
}
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec executable, CUgraphNode node,
                                        const CUDA_KERNEL_NODE_PARAMS *parameters) {
  NEED_CONTEXT;
  stub_node_updates++;
  return copy_node(parameters);
}
CUresult cuGraphLaunch(CUgraphExec executable, CUstream stream) { NEED_CONTEXT; stub_graph_launches++; return CUDA_SUCCESS; }
CUresult cuGraphExecDestroy(CUgraphExec executable) { NEED_CONTEXT; return CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph graph) { NEED_CONTEXT; return CUDA_SUCCESS; }
