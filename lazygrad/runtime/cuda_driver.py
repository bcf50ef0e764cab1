"""The NVIDIA driver API (libcuda.so.1) through ctypes: exactly the calls lazygrad's CUDA runtime makes, as methods.

`CUDADriver` is one of three objects with this surface: `MockDriver` (cuda_mock.py) runs the same calls on the CPU
for `MOCKCUDA=1`, and the tests' fake driver records them. The runtime (ops_cuda.py) is the same code over each.

Handles (contexts, modules, functions, streams, events, graphs) are opaque integers. Device pointers are integers.
Kernel arguments are passed as CUDA takes them: an array of pointers, each to one argument's value (`params`).
Every call but the context ones needs a context current on the calling thread; without one the driver answers
CUDA_ERROR_INVALID_CONTEXT ("invalid device context"), raised as `CUDAError`.

Symbols are the ones CUDA 12 and 13 headers link to (`cuMemAlloc_v2`, ...); where a driver lacks the newest name of a
call whose arguments did not change, the older name is used.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

from lazygrad.device import DeviceUnavailable

LIBRARY = "libcuda.so.1"
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_CONTEXT = 0, 1, 2, 201
ILLEGAL_ADDRESS, LAUNCH_OUT_OF_RESOURCES = 700, 701
COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY_MINOR = 75, 76
MULTIPROCESSOR_COUNT = 16
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97  # (CUdevice_attribute)
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # (CUfunction_attribute)
STREAM_NON_BLOCKING = 1  # the stream does not wait for the legacy default stream (other libraries' work)


class CUDAError(RuntimeError):
    """A driver call that failed; `code` is its CUresult."""

    def __init__(self, call: str, code: int, name: str, description: str):
        self.code = code
        super().__init__(f"CUDA: {call} failed: {name} ({description})")


class KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (v2: v1's fields, then `kern` and `ctx`, left zero)."""

    _fields_ = [
        ("func", c_void_p),
        ("gridDimX", c_uint),
        ("gridDimY", c_uint),
        ("gridDimZ", c_uint),
        ("blockDimX", c_uint),
        ("blockDimY", c_uint),
        ("blockDimZ", c_uint),
        ("sharedMemBytes", c_uint),
        ("kernelParams", POINTER(c_void_p)),
        ("extra", POINTER(c_void_p)),
        ("kern", c_void_p),
        ("ctx", c_void_p),
    ]


# name (then older names with the same arguments) -> argument types; every call returns a CUresult
PROTOTYPES: dict[tuple[str, ...], list] = {
    ("cuInit",): [c_uint],
    ("cuDriverGetVersion",): [POINTER(c_int)],
    ("cuGetErrorName",): [c_int, POINTER(c_char_p)],
    ("cuGetErrorString",): [c_int, POINTER(c_char_p)],
    ("cuDeviceGetCount",): [POINTER(c_int)],
    ("cuDeviceGet",): [POINTER(c_int), c_int],
    ("cuDeviceGetName",): [c_char_p, c_int, c_int],
    ("cuDeviceGetAttribute",): [POINTER(c_int), c_int, c_int],
    ("cuFuncSetAttribute",): [c_void_p, c_int, c_int],
    ("cuDevicePrimaryCtxRetain",): [POINTER(c_void_p), c_int],
    ("cuCtxGetCurrent",): [POINTER(c_void_p)],
    ("cuCtxSetCurrent",): [c_void_p],
    ("cuModuleLoadData",): [POINTER(c_void_p), c_void_p],
    ("cuModuleUnload",): [c_void_p],
    ("cuModuleGetFunction",): [POINTER(c_void_p), c_void_p, c_char_p],
    ("cuMemAlloc_v2",): [POINTER(c_uint64), c_size_t],
    ("cuMemFree_v2",): [c_uint64],
    ("cuMemGetInfo_v2",): [POINTER(c_size_t), POINTER(c_size_t)],
    ("cuMemHostAlloc",): [POINTER(c_void_p), c_size_t, c_uint],
    ("cuMemFreeHost",): [c_void_p],
    ("cuMemcpyHtoDAsync_v2",): [c_uint64, c_void_p, c_size_t, c_void_p],
    ("cuMemcpyDtoHAsync_v2",): [c_void_p, c_uint64, c_size_t, c_void_p],
    ("cuStreamCreate",): [POINTER(c_void_p), c_uint],
    ("cuStreamSynchronize",): [c_void_p],
    ("cuLaunchKernel",): [
        c_void_p,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_void_p,
        c_void_p,
        c_void_p,
    ],
    ("cuEventCreate",): [POINTER(c_void_p), c_uint],
    ("cuEventRecord",): [c_void_p, c_void_p],
    ("cuEventSynchronize",): [c_void_p],
    ("cuEventElapsedTime_v2", "cuEventElapsedTime"): [POINTER(c_float), c_void_p, c_void_p],
    ("cuGraphCreate",): [POINTER(c_void_p), c_uint],
    ("cuGraphAddKernelNode_v2", "cuGraphAddKernelNode"): [
        POINTER(c_void_p),
        c_void_p,
        POINTER(c_void_p),
        c_size_t,
        POINTER(KernelNodeParams),
    ],
    ("cuGraphInstantiateWithFlags",): [POINTER(c_void_p), c_void_p, c_ulonglong],
    ("cuGraphExecKernelNodeSetParams_v2", "cuGraphExecKernelNodeSetParams"): [
        c_void_p,
        c_void_p,
        POINTER(KernelNodeParams),
    ],
    ("cuGraphLaunch",): [c_void_p, c_void_p],
    ("cuGraphExecDestroy",): [c_void_p],
    ("cuGraphDestroy",): [c_void_p],
}


class CUDADriver:
    """libcuda, initialized. Raises DeviceUnavailable, saying why, where there is no driver or no GPU."""

    def __init__(self, library: str | None = None):
        library = library or LIBRARY
        try:
            self.library = ctypes.CDLL(library)
        except OSError as error:
            raise DeviceUnavailable(
                f"CUDA: no NVIDIA driver ({error}) — install the NVIDIA driver, or set MOCKCUDA=1 to compile "
                "kernels with NVRTC and run them on the CPU"
            ) from None
        self.calls = {}
        for names, argument_types in PROTOTYPES.items():
            function = next((getattr(self.library, name) for name in names if hasattr(self.library, name)), None)
            if function is None:
                raise DeviceUnavailable(f"CUDA: the NVIDIA driver is too old: {library} has no {names[0]}")
            function.argtypes, function.restype = argument_types, c_int
            self.calls[names[0]] = function
        status = self.calls["cuInit"](0)
        if status != SUCCESS:
            raise DeviceUnavailable(f"CUDA: the NVIDIA driver cannot start: {self.error('cuInit', status)}")
        if self.device_count() == 0:
            raise DeviceUnavailable("CUDA: the NVIDIA driver finds no GPU")
        # the hot calls, bound once; the launch also unprototyped, for launches whose arguments are converted once
        self._launch = self.calls["cuLaunchKernel"]
        self._launch_converted = self.library["cuLaunchKernel"]  # (a function object of its own: no argtypes)
        self._launch_converted.restype = c_int
        self._get_current = self.calls["cuCtxGetCurrent"]
        self._set_current = self.calls["cuCtxSetCurrent"]

    def error(self, call: str, status: int) -> CUDAError:
        name, description = c_char_p(), c_char_p()
        self.calls["cuGetErrorName"](status, byref(name))
        self.calls["cuGetErrorString"](status, byref(description))
        decode = lambda text: text.value.decode() if text.value else f"error {status}"  # noqa: E731
        return CUDAError(call, status, decode(name), decode(description))

    def call(self, name: str, *arguments) -> None:
        status = self.calls[name](*arguments)
        if status != SUCCESS:
            raise self.error(name, status)

    def out(self, name: str, kind, *arguments):
        """Call `name` with a new `kind` as its first (output) argument; that output's value."""
        value = kind()
        self.call(name, byref(value), *arguments)
        return value.value

    # ---- the driver, devices and contexts ----

    def version(self) -> str:
        version = self.out("cuDriverGetVersion", c_int)
        return f"{version // 1000}.{version % 1000 // 10}"

    def device_count(self) -> int:
        return self.out("cuDeviceGetCount", c_int)

    def device(self, ordinal: int) -> int:
        return self.out("cuDeviceGet", c_int, ordinal)

    def device_name(self, device: int) -> str:
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, len(name), device)
        return name.value.decode()

    def compute_capability(self, device: int) -> tuple[int, int]:
        major = self.out("cuDeviceGetAttribute", c_int, COMPUTE_CAPABILITY_MAJOR, device)
        minor = self.out("cuDeviceGetAttribute", c_int, COMPUTE_CAPABILITY_MINOR, device)
        return major, minor

    def multiprocessors(self, device: int) -> int:
        return self.out("cuDeviceGetAttribute", c_int, MULTIPROCESSOR_COUNT, device)

    def max_shared_memory(self, device: int) -> int:
        """The most shared memory a block may have, dynamic shared memory included (the opt-in limit)."""
        return self.out("cuDeviceGetAttribute", c_int, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)

    def allow_shared_memory(self, function: int, nbytes: int) -> None:
        """Let launches of `function` ask for `nbytes` of dynamic shared memory (past 48 KiB it must be allowed)."""
        self.call("cuFuncSetAttribute", function, MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)

    def primary_context(self, device: int) -> int:
        return self.out("cuDevicePrimaryCtxRetain", c_void_p, device)

    def current_context(self) -> int | None:
        current = c_void_p()
        status = self._get_current(byref(current))
        if status != SUCCESS:
            raise self.error("cuCtxGetCurrent", status)
        return current.value

    def set_current_context(self, context: int | None) -> None:
        status = self._set_current(context)
        if status != SUCCESS:
            raise self.error("cuCtxSetCurrent", status)

    # ---- modules ----

    def module_load(self, image: bytes) -> int:
        return self.out("cuModuleLoadData", c_void_p, image)

    def module_unload(self, module: int) -> None:
        self.call("cuModuleUnload", module)

    def module_function(self, module: int, name: str) -> int:
        return self.out("cuModuleGetFunction", c_void_p, module, name.encode())

    # ---- memory ----

    def mem_alloc(self, nbytes: int) -> int:
        return self.out("cuMemAlloc_v2", c_uint64, nbytes)

    def mem_free(self, pointer: int) -> None:
        self.call("cuMemFree_v2", pointer)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the GPU's memory."""
        free, total = c_size_t(), c_size_t()
        self.call("cuMemGetInfo_v2", byref(free), byref(total))
        return free.value, total.value

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory, which the GPU copies from and to without the CPU."""
        return self.out("cuMemHostAlloc", c_void_p, nbytes, 0)

    def host_free(self, address: int) -> None:
        self.call("cuMemFreeHost", address)

    def copy_to_device(self, pointer: int, address: int, nbytes: int, stream: int) -> None:
        self.call("cuMemcpyHtoDAsync_v2", pointer, address, nbytes, stream)

    def copy_to_host(self, address: int, pointer: int, nbytes: int, stream: int) -> None:
        self.call("cuMemcpyDtoHAsync_v2", address, pointer, nbytes, stream)

    # ---- streams, launches, events ----

    def stream_create(self) -> int:
        return self.out("cuStreamCreate", c_void_p, STREAM_NON_BLOCKING)

    def stream_synchronize(self, stream: int) -> None:
        self.call("cuStreamSynchronize", stream)

    def launch(self, function: int, grid: int, block: int, stream: int, params: ctypes.Array, shared: int = 0) -> None:
        status = self._launch(function, grid, 1, 1, block, 1, 1, shared, stream, params, None)
        if status != SUCCESS:
            raise self.error("cuLaunchKernel", status)

    def prepared_launch(
        self, function: int, grid: int, block: int, stream: int, params: ctypes.Array, shared: int = 0
    ) -> Callable[[], None]:
        """`launch` with these arguments, as a call that takes none: they are converted to C values once, which
        halves what ctypes spends on each launch (~1.6 of a repeated small op's microseconds otherwise). `params`
        is read at each launch: write new argument values into it, not a new array."""
        arguments = (
            c_void_p(function),
            *(c_uint(value) for value in (grid, 1, 1, block, 1, 1, shared)),
            c_void_p(stream),
            params,
            None,
        )
        launch = self._launch_converted

        def launch_prepared() -> None:
            status = launch(*arguments)
            if status != SUCCESS:
                raise self.error("cuLaunchKernel", status)

        return launch_prepared

    def event_create(self) -> int:
        return self.out("cuEventCreate", c_void_p, 0)

    def event_record(self, event: int, stream: int) -> None:
        self.call("cuEventRecord", event, stream)

    def event_synchronize(self, event: int) -> None:
        self.call("cuEventSynchronize", event)

    def event_elapsed(self, start: int, end: int) -> float:
        """Seconds between two recorded (and finished) events."""
        return self.out("cuEventElapsedTime_v2", c_float, start, end) * 1e-3

    # ---- graphs ----

    def graph_create(self) -> int:
        return self.out("cuGraphCreate", c_void_p, 0)

    def graph_add_kernel(
        self,
        graph: int,
        dependency: int | None,
        function: int,
        grid: int,
        block: int,
        params: ctypes.Array,
        shared: int = 0,
    ) -> int:
        """A kernel node after `dependency` (None: first); the driver copies the argument values now."""
        dependencies = (c_void_p * 1)(dependency)
        node_params = kernel_node_params(function, grid, block, params, shared)
        count = 0 if dependency is None else 1
        return self.out("cuGraphAddKernelNode_v2", c_void_p, graph, dependencies, count, byref(node_params))

    def graph_instantiate(self, graph: int) -> int:
        return self.out("cuGraphInstantiateWithFlags", c_void_p, graph, 0)

    def graph_set_kernel(
        self, executable: int, node: int, function: int, grid: int, block: int, params: ctypes.Array, shared: int = 0
    ) -> None:
        """New argument values for one kernel node of an instantiated graph."""
        node_params = kernel_node_params(function, grid, block, params, shared)
        self.call("cuGraphExecKernelNodeSetParams_v2", executable, node, byref(node_params))

    def graph_launch(self, executable: int, stream: int) -> None:
        self.call("cuGraphLaunch", executable, stream)

    def graph_destroy(self, graph: int, executable: int) -> None:
        self.call("cuGraphExecDestroy", executable)
        self.call("cuGraphDestroy", graph)


def kernel_node_params(function: int, grid: int, block: int, params: ctypes.Array, shared: int) -> KernelNodeParams:
    return KernelNodeParams(function, grid, 1, 1, block, 1, 1, shared, ctypes.cast(params, POINTER(c_void_p)), None)
