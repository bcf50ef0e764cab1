"""`MockDriver`: the driver calls the CUDA runtime makes (see cuda_driver.py), carried out on the CPU for `CUDA=1
MOCKCUDA=1`, so that every test run without a GPU goes through the same runtime code as a GPU would.

Modules are the shared libraries MockCUDACompiler builds (a kernel, its `lazygrad_launch_<name>` entry and the
registers and shared memory ptxas gave it). A launch that an A100 would refuse fails as it would there: a block of
more than 1,024 threads, or of more registers than a multiprocessor has, or asking for more shared memory than
allowed; so does one giving a kernel less dynamic shared memory than it uses (a GPU's would fault). Device and
pinned memory are host memory, and work runs when it is issued, so streams and events have nothing to wait for (an
event holds the host clock's time). A graph keeps copies of its kernels' argument values, as the driver does.
Contexts follow the driver's rules: each thread has its own current context, none at first, and every call but the
context ones fails with "invalid device context" unless the primary context is current on the calling thread.
"""

from __future__ import annotations

import _ctypes
import ctypes
import itertools
import os
import threading
import time

import numpy as np

from lazygrad.runtime.cuda_driver import (
    ILLEGAL_ADDRESS,
    INVALID_CONTEXT,
    INVALID_VALUE,
    LAUNCH_OUT_OF_RESOURCES,
    CUDAError,
)
from lazygrad.runtime.ops_cpu import load_shared_library

PRIMARY_CONTEXT = 0x1000
ALIGNMENT = 64  # every allocation starts on a 64-byte boundary, as the kernels' vector loads expect
LAUNCH_TYPES = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
# an A100's limits, which a launch is checked against: its threads, a multiprocessor's registers (given out to each
# warp in steps of 256), shared memory without asking (48 KiB) and with (`allow_shared_memory`)
MAX_THREADS, REGISTERS, REGISTER_STEP, WARP = 1024, 65536, 256, 32
SHARED_BYTES, MAX_SHARED_BYTES = 48 * 1024, 163 * 1024


class MockFunction:
    """A kernel of a loaded module: its entry `run(params, grid, block)`, what ptxas gave it (registers a thread,
    bytes of static shared memory), the dynamic shared memory it uses and the most its launches may ask for."""

    __slots__ = ("run", "registers", "static_shared", "uses_shared", "dynamic_shared")

    def __init__(self, run, registers: int, static_shared: int, uses_shared: int):
        self.run, self.registers, self.static_shared, self.uses_shared = run, registers, static_shared, uses_shared
        self.dynamic_shared = SHARED_BYTES - static_shared

    def check(self, call: str, block: int, shared: int) -> None:
        """Fail as the driver would a launch of `block` threads asking for `shared` bytes of dynamic shared memory
        that the GPU cannot run: too many threads, registers, or shared memory."""
        if not 0 < block <= MAX_THREADS:
            raise CUDAError(call, INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", f"a block of {block} threads")
        per_warp = -(-self.registers * WARP // REGISTER_STEP) * REGISTER_STEP
        if -(-block // WARP) * per_warp > REGISTERS:
            raise CUDAError(
                call,
                LAUNCH_OUT_OF_RESOURCES,
                "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                f"too many resources requested for launch: {block} threads of {self.registers} registers",
            )
        if shared > self.dynamic_shared:
            raise CUDAError(
                call,
                INVALID_VALUE,
                "CUDA_ERROR_INVALID_VALUE",
                f"{shared} bytes of dynamic shared memory, {self.dynamic_shared} allowed",
            )
        if shared < self.uses_shared:  # (the GPU would fault on its reads past the end, once the kernel runs)
            raise CUDAError(
                call,
                ILLEGAL_ADDRESS,
                "CUDA_ERROR_ILLEGAL_ADDRESS",
                f"the kernel uses {self.uses_shared} bytes of dynamic shared memory, the launch gives {shared}",
            )


def copy_params(params: ctypes.Array) -> tuple[ctypes.Array, ctypes.Array]:
    """A copy of each argument's value (all are 8 bytes: the runtime passes device pointers), and params to them."""
    values = (ctypes.c_uint64 * len(params))(*(ctypes.c_uint64.from_address(pointer).value for pointer in params))
    return values, (ctypes.c_void_p * len(params))(*(ctypes.addressof(values) + 8 * i for i in range(len(params))))


class MockDriver:
    """The CUDA driver's surface over this process's memory and the CPU."""

    def __init__(self):
        self.thread = threading.local()
        self.lock = threading.Lock()
        self.handles = itertools.count(1)
        self.memory: dict[int, np.ndarray] = {}  # device and pinned host allocations, by address
        self.modules: dict[int, ctypes.CDLL] = {}
        self.times: dict[int, float] = {}  # when each event was recorded
        self.graphs: dict[int, list[tuple]] = {}  # graphs and instantiated graphs: their kernel nodes

    def require_context(self, call: str) -> None:
        if getattr(self.thread, "context", None) != PRIMARY_CONTEXT:
            raise CUDAError(call, INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context")

    def new_handle(self) -> int:
        with self.lock:
            return next(self.handles)

    # ---- the driver, devices and contexts ----

    def version(self) -> str:
        return "none (MOCKCUDA)"

    def device_count(self) -> int:
        return 1

    def device(self, ordinal: int) -> int:
        return ordinal

    def device_name(self, device: int) -> str:
        return "the CPU (MOCKCUDA=1)"

    def compute_capability(self, device: int) -> tuple[int, int]:
        return 8, 0

    def multiprocessors(self, device: int) -> int:
        return 108  # an A100's, as the compute capability is

    def max_shared_memory(self, device: int) -> int:
        return MAX_SHARED_BYTES

    def allow_shared_memory(self, function: MockFunction, nbytes: int) -> None:
        self.require_context("cuFuncSetAttribute")
        if nbytes + function.static_shared > MAX_SHARED_BYTES:
            raise CUDAError("cuFuncSetAttribute", INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument")
        function.dynamic_shared = max(function.dynamic_shared, nbytes)

    def primary_context(self, device: int) -> int:
        return PRIMARY_CONTEXT

    def current_context(self) -> int | None:
        return getattr(self.thread, "context", None)

    def set_current_context(self, context: int | None) -> None:
        self.thread.context = context

    # ---- modules ----

    def module_load(self, image: bytes) -> int:
        self.require_context("cuModuleLoadData")
        handle = self.new_handle()
        self.modules[handle] = load_shared_library(image)
        return handle

    def module_unload(self, module: int) -> None:
        self.require_context("cuModuleUnload")
        _ctypes.dlclose(self.modules.pop(module)._handle)

    def module_function(self, module: int, name: str) -> MockFunction:
        self.require_context("cuModuleGetFunction")
        library = self.modules[module]
        try:
            run = getattr(library, f"lazygrad_launch_{name}")
        except AttributeError:
            raise CUDAError("cuModuleGetFunction", 500, "CUDA_ERROR_NOT_FOUND", "named symbol not found") from None
        run.argtypes, run.restype = LAUNCH_TYPES, None
        return MockFunction(run, *(ctypes.c_uint * 3).in_dll(library, f"lazygrad_resources_{name}"))

    # ---- memory ----

    def mem_alloc(self, nbytes: int) -> int:
        self.require_context("cuMemAlloc")
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        address = raw.ctypes.data + (-raw.ctypes.data) % ALIGNMENT
        self.memory[address] = raw
        return address

    def mem_free(self, pointer: int) -> None:
        self.require_context("cuMemFree")
        del self.memory[pointer]

    def mem_info(self) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    host_alloc, host_free = mem_alloc, mem_free

    def copy_to_device(self, pointer: int, address: int, nbytes: int, stream: int) -> None:
        self.require_context("cuMemcpyHtoDAsync")
        ctypes.memmove(pointer, address, nbytes)

    def copy_to_host(self, address: int, pointer: int, nbytes: int, stream: int) -> None:
        self.require_context("cuMemcpyDtoHAsync")
        ctypes.memmove(address, pointer, nbytes)

    # ---- streams, launches, events ----

    def stream_create(self) -> int:
        self.require_context("cuStreamCreate")
        return self.new_handle()

    def stream_synchronize(self, stream: int) -> None:
        self.require_context("cuStreamSynchronize")

    def launch(
        self, function: MockFunction, grid: int, block: int, stream: int, params: ctypes.Array, shared: int = 0
    ) -> None:
        self.require_context("cuLaunchKernel")
        function.check("cuLaunchKernel", block, shared)
        function.run(params, grid, block)

    def prepared_launch(self, function, grid: int, block: int, stream: int, params: ctypes.Array, shared: int = 0):
        return lambda: self.launch(function, grid, block, stream, params, shared)  # (`launch` looked up each time)

    def event_create(self) -> int:
        self.require_context("cuEventCreate")
        return self.new_handle()

    def event_record(self, event: int, stream: int) -> None:
        self.require_context("cuEventRecord")
        self.times[event] = time.perf_counter()

    def event_synchronize(self, event: int) -> None:
        self.require_context("cuEventSynchronize")

    def event_elapsed(self, start: int, end: int) -> float:
        self.require_context("cuEventElapsedTime")
        return self.times[end] - self.times[start]

    # ---- graphs ----

    def graph_create(self) -> int:
        self.require_context("cuGraphCreate")
        handle = self.new_handle()
        self.graphs[handle] = []
        return handle

    def graph_add_kernel(
        self, graph: int, dependency, function, grid: int, block: int, params: ctypes.Array, shared: int = 0
    ) -> int:
        self.require_context("cuGraphAddKernelNode")
        function.check("cuGraphAddKernelNode", block, shared)
        nodes = self.graphs[graph]
        if dependency is not None and dependency != len(nodes) - 1:
            raise CUDAError(
                "cuGraphAddKernelNode", INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "the mock builds chains only"
            )
        nodes.append((function, grid, block, copy_params(params)))
        return len(nodes) - 1

    def graph_instantiate(self, graph: int) -> int:
        self.require_context("cuGraphInstantiate")
        handle = self.new_handle()
        self.graphs[handle] = list(self.graphs[graph])
        return handle

    def graph_set_kernel(
        self, executable: int, node: int, function, grid: int, block: int, params, shared: int = 0
    ) -> None:
        self.require_context("cuGraphExecKernelNodeSetParams")
        function.check("cuGraphExecKernelNodeSetParams", block, shared)
        self.graphs[executable][node] = (function, grid, block, copy_params(params))

    def graph_launch(self, executable: int, stream: int) -> None:
        self.require_context("cuGraphLaunch")
        for function, grid, block, (_, params) in self.graphs[executable]:
            function.run(params, grid, block)

    def graph_destroy(self, graph: int, executable: int) -> None:
        self.require_context("cuGraphDestroy")
        del self.graphs[executable], self.graphs[graph]
