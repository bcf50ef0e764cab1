"""The CUDA device (`CUDA=1`): CUDA C compiled by NVRTC (cuda_compiler.py), run through the NVIDIA driver API
(cuda_driver.py: ctypes over libcuda, no pycuda).

Threads. The device works in its GPU's primary context, the one the CUDA runtime (and so PyTorch or CuPy) uses too.
Kernels compile on the background compile threads, which need no context; loading a module, allocating, copying and
launching happen on whichever thread asks, inside `with device.current():`, which makes the context current where no
context is (and leaves it so, for that thread's next call), or where another context is, for that call only.

Launches. A program prepares its argument array once; a launch writes the buffers' pointers into it and calls
cuLaunchKernel on the device's one stream, without waiting. The host waits only where it reads memory (copyout) or
asks to (`synchronize`). At `DEBUG>=2` each kernel is timed by a pair of CUDA events. `TinyJit` replays a captured
step as one CUDA graph (`CUDADevice.graph`).

Memory. Freed blocks stay with the allocator and serve later requests of their size class, as in PyTorch's caching
allocator (`Device["CUDA"].allocator.stats()` and `.empty_cache()`). Copies go through pinned staging buffers, so a
copy to the GPU returns without waiting for the kernels queued before it.

`MOCKCUDA=1` runs all of this without a GPU over MockDriver (cuda_mock.py): NVRTC still compiles every kernel for an
A100 to check it (and each launch is checked against that GPU's registers and shared memory), and the CPU runs the
same source through cuda_shim.h.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, BinaryIO, Callable

import numpy as np

from lazygrad.codegen.renderer.cstyle import STATIC_SHARED_BYTES, CUDARenderer
from lazygrad.device import Allocator, Compiled, Compiler, DeviceUnavailable, LaunchRefused, read_exactly
from lazygrad.helpers import DEBUG, MOCKCUDA
from lazygrad.runtime.cuda_compiler import MockCUDACompiler, NVRTCCompiler, choose_target, load_nvrtc
from lazygrad.runtime.cuda_driver import LAUNCH_OUT_OF_RESOURCES, OUT_OF_MEMORY, CUDADriver, CUDAError


class CurrentContext:
    """`with device.current():` the device's context is current on this thread inside. Where no context was current,
    it stays current after; where another was, that one is current again after."""

    __slots__ = ("device", "previous")

    def __init__(self, device: CUDADevice):
        self.device = device

    def __enter__(self) -> None:
        device = self.device
        self.previous = device.driver.current_context()
        if self.previous != device.context:
            device.driver.set_current_context(device.context)

    def __exit__(self, *error) -> None:
        if self.previous is not None and self.previous != self.device.context:
            self.device.driver.set_current_context(self.previous)


def argument_array(count: int) -> tuple[ctypes.Array, ctypes.Array]:
    """(values, params): room for `count` pointer-sized argument values, and the array of pointers to them that
    cuLaunchKernel and graph kernel nodes take."""
    values = (ctypes.c_uint64 * count)()
    return values, (ctypes.c_void_p * count)(*(ctypes.addressof(values) + 8 * i for i in range(count)))


class CUDAProgram:
    """A kernel loaded into the device's context and launched on its stream; `release()` unloads it."""

    def __init__(self, device: CUDADevice, name: str, binary: bytes, launch: tuple[int, int, int] = (1, 1, 0)):
        self.device, self.name = device, name
        self.grid, self.block, self.shared = launch  # (blocks, threads per block, bytes of dynamic shared memory)
        with device.current():  # the driver is thread-safe: loading needs no lock, and may take a while (PTX)
            self.module = device.driver.module_load(binary)
            self.function = device.driver.module_function(self.module, name)
            if self.shared > STATIC_SHARED_BYTES:
                device.driver.allow_shared_memory(self.function, self.shared)
        self.values: ctypes.Array | None = None  # the argument values and params, made at the first launch
        self.params: ctypes.Array | None = None
        self.launch: Callable[[], None] | None = None  # the driver's launch of it on `params`, arguments converted
        self.buffers: tuple[int, ...] = ()  # the pointers in `values`
        self.graphs = 0  # graphs that launch this kernel: its module stays loaded while there are any
        self.released = False

    def __call__(self, *buffers: int, wait: bool = False) -> float | None:
        """Queue one launch on `buffers` (device pointers); with `wait` (or at DEBUG>=2), wait for it and return the
        seconds the GPU took (CUDA events)."""
        device = self.device
        driver, context = device.driver, device.context
        with device.lock:
            # (`device.current()` spelled out: this runs on every launch, and most launches find the context current)
            previous = driver.current_context()
            if previous != context:
                driver.set_current_context(context)
            try:
                if buffers != self.buffers:  # (a repeated step gets the same memory back from the allocator)
                    self.set_arguments(buffers)
                if wait or DEBUG.value >= 2:
                    return device.timed(self.launch)
                self.launch()
            except CUDAError as error:
                if error.code == LAUNCH_OUT_OF_RESOURCES:
                    raise LaunchRefused(
                        f"CUDA: kernel {self.name} cannot run in blocks of {self.block} threads: {error}"
                    ) from error
                raise
            finally:
                if previous is not None and previous != context:
                    driver.set_current_context(previous)
        return None

    def timed(self, *buffers: int) -> float:
        """Launch once on `buffers`, wait for it, and return the seconds the GPU took."""
        return self(*buffers, wait=True)

    def set_arguments(self, buffers: tuple[int, ...]) -> None:
        if self.values is None:
            if self.function is None:
                raise RuntimeError(f"CUDA: kernel {self.name} was released and cannot run")
            self.values, self.params = argument_array(len(buffers))
            device = self.device
            self.launch = device.driver.prepared_launch(
                self.function, self.grid, self.block, device.stream, self.params, self.shared
            )
        elif len(buffers) != len(self.values):
            raise ValueError(f"CUDA: kernel {self.name} takes {len(self.values)} buffers, not {len(buffers)}")
        self.values[:] = buffers
        self.buffers = buffers

    def release(self) -> None:
        """Unload the kernel's module, once no graph launches it; the program cannot run after."""
        with self.device.lock:
            self.released = True
            if self.graphs == 0:
                self.unload()

    def unload(self) -> None:
        if self.module is None:
            return
        device = self.device
        with device.lock, device.current():
            device.driver.stream_synchronize(device.stream)  # no queued launch of it may still be waiting
            device.driver.module_unload(self.module)
        self.module = self.function = self.values = self.launch = None
        self.buffers = ()


class CUDAGraph:
    """The kernels of a captured step as one CUDA graph (a chain, in launch order), replayed with one launch. It is
    built at its first call; a later call whose buffers differ updates the arguments of just the kernels that take
    them."""

    def __init__(self, device: CUDADevice, programs: list[CUDAProgram]):
        self.device, self.programs = device, programs
        for program in programs:
            program.graphs += 1
        self.graph = self.executable = None
        self.nodes: list[int] = []
        self.arguments: list[tuple[ctypes.Array, ctypes.Array]] = []
        self.buffers: list[list[int]] = []

    def __call__(self, buffers: list[list[int]]) -> float | None:
        """Launch the graph on each kernel's buffers; at DEBUG>=2, wait for it and return its seconds."""
        device, driver = self.device, self.device.driver
        with device.lock, device.current():
            if self.executable is None:
                self.build(buffers)
            for number, (program, pointers) in enumerate(zip(self.programs, buffers)):
                if pointers != self.buffers[number]:
                    values, params = self.arguments[number]
                    values[:] = self.buffers[number] = pointers
                    driver.graph_set_kernel(
                        self.executable,
                        self.nodes[number],
                        program.function,
                        program.grid,
                        program.block,
                        params,
                        program.shared,
                    )
            if DEBUG.value >= 2:
                return device.timed(lambda: driver.graph_launch(self.executable, device.stream))
            driver.graph_launch(self.executable, device.stream)
        return None

    def build(self, buffers: list[list[int]]) -> None:
        driver = self.device.driver
        self.graph, node = driver.graph_create(), None
        for program, pointers in zip(self.programs, buffers):
            if program.function is None:
                raise RuntimeError(f"CUDA: kernel {program.name} was released and cannot run in a graph")
            values, params = argument_array(len(pointers))
            values[:] = pointers
            node = driver.graph_add_kernel(
                self.graph, node, program.function, program.grid, program.block, params, program.shared
            )
            self.nodes.append(node)
            self.arguments.append((values, params))
            self.buffers.append(list(pointers))
        self.executable = driver.graph_instantiate(self.graph)

    def __del__(self):
        try:
            with self.device.lock:
                if self.executable is not None:
                    with self.device.current():
                        self.device.driver.graph_destroy(self.graph, self.executable)
                for program in self.programs:
                    program.graphs -= 1
                    if program.released and program.graphs == 0:
                        program.unload()
        except Exception:  # interpreter shutdown: the driver may be gone
            pass


def size_class(nbytes: int) -> int:
    """The size of block that serves a request: multiples of 512 bytes up to 1 MiB, above that multiples of an
    eighth of the power of two below the request (so a block is at most 12.5% larger than asked)."""
    if nbytes <= 1 << 20:
        return max(512, -(-nbytes // 512) * 512)
    step = (1 << (nbytes.bit_length() - 1)) // 8
    return -(-nbytes // step) * step


def megabytes(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


class StagingBuffers:
    """Pinned host memory that copies pass through, in chunks of `SIZE` bytes over `COUNT` buffers used in turn. A
    copy to the GPU returns once its data is in a buffer; a buffer is filled again only after the GPU has read it
    (each buffer's event marks its last copy)."""

    SIZE, COUNT = 8 << 20, 2

    def __init__(self, device: CUDADevice):
        self.device = device
        self.buffers: list[tuple[int, int]] = []  # (address, event), made at the first copy
        self.recorded = [False] * self.COUNT  # whether a buffer's event marks a copy yet
        self.turn = 0

    def take(self) -> tuple[int, int]:
        """The next buffer, once its last copy has finished."""
        driver = self.device.driver
        if not self.buffers:
            self.buffers = [(driver.host_alloc(self.SIZE), driver.event_create()) for _ in range(self.COUNT)]
        self.turn = (self.turn + 1) % self.COUNT
        if self.recorded[self.turn]:
            driver.event_synchronize(self.buffers[self.turn][1])
        self.recorded[self.turn] = True
        return self.buffers[self.turn]

    def copyin(self, pointer: int, array: np.ndarray) -> None:
        device, driver = self.device, self.device.driver
        with device.lock, device.current():
            for offset in range(0, array.nbytes, self.SIZE):
                size = min(self.SIZE, array.nbytes - offset)
                address, event = self.take()
                ctypes.memmove(address, array.ctypes.data + offset, size)
                driver.copy_to_device(pointer + offset, address, size, device.stream)
                driver.event_record(event, device.stream)

    def readinto(self, pointer: int, file: BinaryIO, nbytes: int) -> None:
        """Copy the next `nbytes` of a binary file to the GPU, read chunk by chunk into the buffers themselves."""
        device, driver = self.device, self.device.driver
        with device.lock, device.current():
            for offset in range(0, nbytes, self.SIZE):
                size = min(self.SIZE, nbytes - offset)
                address, event = self.take()
                read_exactly(file, memoryview((ctypes.c_char * size).from_address(address)).cast("B"))
                driver.copy_to_device(pointer + offset, address, size, device.stream)
                driver.event_record(event, device.stream)

    def copyout(self, out: np.ndarray, pointer: int) -> None:
        device, driver = self.device, self.device.driver
        with device.lock, device.current():
            for offset in range(0, out.nbytes, self.SIZE):
                size = min(self.SIZE, out.nbytes - offset)
                address, event = self.take()
                driver.copy_to_host(address, pointer + offset, size, device.stream)
                driver.event_record(event, device.stream)
                driver.event_synchronize(event)  # the kernels before it have run, and the data is here
                ctypes.memmove(out.ctypes.data + offset, address, size)


class CUDAAllocator(Allocator):
    """GPU memory that keeps freed blocks for later requests of the same size class (`size_class`), as PyTorch's
    caching allocator does: allocating from the driver is slow, and freeing waits for the GPU. When the driver is
    out of memory the cached blocks are given back and the allocation is tried once more."""

    caches_memory = True

    def __init__(self, device: CUDADevice):
        self.device = device
        self.cache: dict[int, list[int]] = {}  # size class -> free blocks
        self.sizes: dict[int, int] = {}  # block in use -> its size class
        self.in_use = self.cached = self.peak = self.driver_allocations = self.reuses = 0
        self.staging = StagingBuffers(device)

    def alloc(self, nbytes: int) -> int:
        size = size_class(nbytes)
        with self.device.lock:
            if self.cache.get(size):
                pointer = self.cache[size].pop()
                self.cached -= size
                self.reuses += 1
            else:
                pointer = self.allocate(size)
            self.sizes[pointer] = size
            self.in_use += size
            self.peak = max(self.peak, self.in_use)
        return pointer

    def allocate(self, size: int) -> int:
        driver = self.device.driver
        with self.device.current():
            for attempt in range(2):
                try:
                    pointer = driver.mem_alloc(size)
                    self.driver_allocations += 1
                    return pointer
                except CUDAError as error:
                    if error.code != OUT_OF_MEMORY:
                        raise
                if attempt == 0:
                    self.empty_cache()
            free, total = driver.mem_info()
        raise MemoryError(
            f"CUDA: out of memory allocating {megabytes(size)}: lazygrad holds {megabytes(self.in_use)} in live "
            f"buffers and the GPU has {megabytes(free)} free of {megabytes(total)} — free tensors you no longer need "
            "or use smaller batches"
        )

    def free(self, pointer: int) -> None:
        with self.device.lock:
            size = self.sizes.pop(pointer, None)
            if size is None:
                raise ValueError(f"CUDA: cannot free {pointer:#x}: this allocator did not hand it out, or it is free")
            self.in_use -= size
            self.cached += size
            self.cache.setdefault(size, []).append(pointer)

    def empty_cache(self) -> int:
        """Give every cached block back to the driver; the bytes given back."""
        device = self.device
        with device.lock, device.current():
            device.driver.stream_synchronize(device.stream)
            freed = self.cached
            for pointers in self.cache.values():
                for pointer in pointers:
                    device.driver.mem_free(pointer)
            self.cache, self.cached = {}, 0
        return freed

    def stats(self) -> dict[str, int]:
        """Bytes in live buffers, bytes cached for reuse, the most ever in use, and how many blocks came from the
        driver or from the cache."""
        return {
            "in_use_bytes": self.in_use,
            "cached_bytes": self.cached,
            "peak_bytes": self.peak,
            "driver_allocations": self.driver_allocations,
            "reuses": self.reuses,
        }

    def gpu_address(self, handle: int) -> int:
        return handle

    def copyin(self, handle: int, array: np.ndarray) -> None:
        self.staging.copyin(handle, array)

    def copyout(self, out: np.ndarray, handle: int) -> None:
        self.staging.copyout(out, handle)

    def readinto(self, handle: int, file: BinaryIO, nbytes: int) -> None:
        self.staging.readinto(handle, file, nbytes)


class CUDADevice(Compiled):
    """A GPU through a driver object (`CUDADriver`, or `MockDriver` for MOCKCUDA=1): its primary context, one
    stream, a caching allocator, and programs loaded from what `compiler` makes. `max_buffers`: the most buffers a
    kernel may take (see `NVRTCCompiler.max_buffers`; None: no limit); `architecture`: what the tensor-core code
    is compiled for (see `NVRTCCompiler.tensor_core_architecture`; 0: no tensor cores)."""

    def __init__(
        self,
        driver: Any,
        compiler: Compiler,
        ordinal: int = 0,
        max_buffers: int | None = None,
        architecture: int = 0,
    ):
        self.driver, self.ordinal = driver, ordinal
        self.context = driver.primary_context(driver.device(ordinal))
        self.lock = threading.RLock()  # one launch's arguments, the events and staging buffers; re-entered by GC
        with self.current():
            self.stream = driver.stream_create()
            self.timing_events = (driver.event_create(), driver.event_create())
        device = driver.device(ordinal)
        renderer = CUDARenderer.for_architecture(
            architecture, driver.multiprocessors(device), driver.max_shared_memory(device)
        )
        super().__init__("CUDA", CUDAAllocator(self), renderer, compiler, self.load_program, max_buffers)

    def current(self) -> CurrentContext:
        return CurrentContext(self)

    @property
    def description(self) -> str:
        """The GPU, its compute capability, the code compiled for it and the versions of the driver and NVRTC."""
        device = self.driver.device(self.ordinal)
        major, minor = self.driver.compute_capability(device)
        target = getattr(self.compiler, "target", "")
        code = f"{target} ({'CUBIN' if target.startswith('sm_') else 'PTX'})"
        nvrtc = self.compiler.nvrtc.version
        return f"{self.driver.device_name(device)}, compute capability {major}.{minor}, {code}, driver {self.driver.version()}, NVRTC {nvrtc}"

    def load_program(
        self, name: str, binary: bytes, launch: tuple[int, int, int] = (1, 1, 0), work: int = 0
    ) -> CUDAProgram:
        """The runner for kernel `name` in `binary`, loaded on the calling thread (a compile thread, usually)."""
        return CUDAProgram(self, name, binary, launch)

    def graph(self, programs: list[CUDAProgram]) -> CUDAGraph:
        """A replay of these kernels, in this order, as one graph launch (see `CUDAGraph`)."""
        return CUDAGraph(self, programs)

    def timed(self, enqueue: Callable[[], None]) -> float:
        """Queue work between the two timing events, wait for it, and return the seconds the GPU took."""
        start, end = self.timing_events
        self.driver.event_record(start, self.stream)
        enqueue()
        self.driver.event_record(end, self.stream)
        self.driver.event_synchronize(end)
        return self.driver.event_elapsed(start, end)

    def synchronize(self) -> None:
        """Wait until everything queued has finished."""
        with self.lock, self.current():
            self.driver.stream_synchronize(self.stream)


def open_device() -> CUDADevice:
    if MOCKCUDA:
        from lazygrad.runtime.cuda_mock import MockDriver

        driver, compiler = MockDriver(), MockCUDACompiler()
        return CUDADevice(
            driver,
            compiler,
            max_buffers=compiler.max_buffers(driver.version()),
            architecture=compiler.tensor_core_architecture(),
        )
    driver = CUDADriver()
    try:
        capability = driver.compute_capability(driver.device(0))
        compiler = NVRTCCompiler(choose_target(load_nvrtc(), capability))
        return CUDADevice(
            driver,
            compiler,
            max_buffers=compiler.max_buffers(driver.version()),
            architecture=compiler.tensor_core_architecture(),
        )
    except CUDAError as error:  # e.g. the GPU is taken by another process in exclusive mode
        raise DeviceUnavailable(f"CUDA: the GPU cannot be used: {str(error).removeprefix('CUDA: ')}") from None
