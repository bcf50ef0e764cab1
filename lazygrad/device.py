"""Devices: the registry with env-var selection, `Buffer`, and `Compiled` — a renderer, a compiler with a
content-keyed cache, an allocator and a program runner."""

from __future__ import annotations

import array
import ctypes
import hashlib
import importlib
import operator
import os
import threading
from abc import ABC, abstractmethod
from typing import Any, BinaryIO, Callable

import numpy as np

from lazygrad.diskcache import disk_cache
from lazygrad.dtype import DType
from lazygrad.helpers import DEVICE_ENV_VARS, GlobalCounters, device_env_vars

KNOWN_DEVICES = ("LLVM", "GPU", "CUDA", "CPU", "PYTHON")


class DeviceUnavailable(RuntimeError):
    """A device that cannot run here; the message says why and how to fix it."""


class LaunchRefused(RuntimeError):
    """A kernel the device cannot run in blocks (work-groups) of the size it was shaped for: its threads would need
    more registers than a block of them can have. BEAM passes over such a candidate."""


class _DeviceRegistry:
    """`Device.DEFAULT` names the default device; `Device["LLVM"]` is the (lazily created) device object."""

    def __init__(self):
        self._opened: dict[str, Compiled] = {}
        self._default: str | None = None

    @staticmethod
    def canonicalize(name: str) -> str:
        """The registry name for a user's device string: "llvm" → "LLVM", "clang" → "CPU", "cuda:0" → "CUDA"."""
        if not isinstance(name, str):
            raise TypeError(
                f"device must be a string, got {type(name).__name__} {name!r}: name it as "
                f"{', '.join(map(repr, KNOWN_DEVICES))}, optionally with ':0' (e.g. 'CUDA:0')"
            )
        kind, colon, index = name.upper().partition(":")
        kind = DEVICE_ENV_VARS.get(kind, kind)
        if kind not in KNOWN_DEVICES or colon and not index.isdecimal():
            raise ValueError(f"unknown device {name!r}: choose one of {', '.join(KNOWN_DEVICES)}")
        # (there is one device of each kind: "CUDA:1" used to run silently on the one CUDA device)
        if colon and int(index) != 0:
            raise ValueError(f"{name.upper()}: lazygrad uses one device of each kind; use {kind!r} or '{kind}:0'")
        return kind

    def __getitem__(self, name: str) -> Compiled:
        if (opened := self._opened.get(name)) is not None:
            return opened
        name = self.canonicalize(name)
        if name not in self._opened:
            module = importlib.import_module(f"lazygrad.runtime.ops_{name.lower()}")
            self._opened[name] = module.open_device()
        return self._opened[name]

    def empty_cache(self) -> int:
        """Give back the memory lazygrad keeps from dead buffers for reuse (torch.cuda.empty_cache): the memory pool's
        (up to 1 GiB, reused by exact size) and each opened device allocator's own cache; the bytes given back."""
        freed = memory_pool.held
        memory_pool.clear()
        return freed + sum(device.allocator.empty_cache() for device in list(self._opened.values()))

    @property
    def DEFAULT(self) -> str:
        if self._default is None:
            chosen = device_env_vars()
            devices = sorted({DEVICE_ENV_VARS[var] for var in chosen})
            if len(devices) > 1:
                raise ValueError(
                    f"device variables {' and '.join(f'{var}=1' for var in chosen)} are both set: pick one device"
                )
            self._default = devices[0] if devices else "LLVM"
        return self._default

    @DEFAULT.setter
    def DEFAULT(self, name: str) -> None:
        self._default = self.canonicalize(name)


Device = _DeviceRegistry()


class MemoryPool:
    """Memory of dead buffers, kept for the next buffer of the same device and size: fresh memory costs more than
    the kernels of a small step (a device allocation, or on the host new pages that fault when first written).
    Holds at most `limit` bytes; beyond that, memory goes back to the device."""

    def __init__(self, limit: int = 1 << 30):
        self.limit, self.held = limit, 0
        self.free_memory: dict[tuple[str, int], list[Any]] = {}

    def take(self, device: str, nbytes: int) -> Any:
        """Kept memory of exactly this size, or fresh memory."""
        counters = GlobalCounters
        used = counters.memory_used = counters.memory_used + nbytes
        if used > counters.memory_peak:
            counters.memory_peak = used
        kept = self.free_memory.get((device, nbytes))
        if kept:
            self.held -= nbytes
            return kept.pop()
        return Device[device].allocator.alloc(nbytes)

    def give_back(self, device: str, nbytes: int, handle: Any) -> None:
        GlobalCounters.memory_used -= nbytes
        allocator = Device[device].allocator
        if allocator.caches_memory or self.held + nbytes > self.limit:
            allocator.free(handle)
            return
        self.held += nbytes
        kept = self.free_memory.get((device, nbytes))
        if kept is None:
            kept = self.free_memory[(device, nbytes)] = []
        kept.append(handle)

    def clear(self) -> None:
        """Give all kept memory back to the devices."""
        for (device, _), handles in self.free_memory.items():
            for handle in handles:
                Device[device].allocator.free(handle)
        self.free_memory, self.held = {}, 0


memory_pool = MemoryPool()


class Buffer:
    """Memory on a device holding `size` elements of `dtype`; allocated on first use (from the memory pool)."""

    def __init__(self, device: str, size: int, dtype: DType):
        self.device, self.size, self.dtype = device, size, dtype
        self.nbytes = size * dtype.itemsize
        self._allocated_bytes = max(self.nbytes, dtype.itemsize)  # (an empty buffer still gets one element)
        self._handle: Any = None

    @property
    def handle(self) -> Any:
        if self._handle is None:
            self._handle = memory_pool.take(self.device, self._allocated_bytes)
        return self._handle

    @property
    def is_allocated(self) -> bool:
        return self._handle is not None

    def copyin(self, data: np.ndarray) -> Buffer:
        array = np.ascontiguousarray(data, dtype=self.dtype.np).reshape(-1)
        if array.size != self.size:
            raise ValueError(f"copyin of {array.size} elements into a buffer of {self.size}")
        Device[self.device].allocator.copyin(self.handle, array)
        return self

    def numpy(self) -> np.ndarray:
        out = np.empty(self.size, dtype=self.dtype.np)
        if self.size:
            Device[self.device].allocator.copyout(out, self.handle)
        return out

    def __del__(self):
        if self._handle is not None:
            try:
                memory_pool.give_back(self.device, self._allocated_bytes, self._handle)
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype}>"


class Allocator(ABC):
    """Allocates device memory and copies NumPy arrays in and out of it."""

    # True where the allocator keeps freed memory for reuse itself: the memory pool then hands it straight back
    caches_memory = False

    @abstractmethod
    def alloc(self, nbytes: int) -> Any:
        """A handle to `nbytes` of device memory."""

    def free(self, handle: Any) -> None:
        """Give memory back (a no-op where the handle frees itself)."""

    def empty_cache(self) -> int:
        """Give back the freed memory this allocator keeps for reuse (see `caches_memory`); the bytes given back."""
        return 0

    @abstractmethod
    def copyin(self, handle: Any, array: np.ndarray) -> None:
        """Copy a contiguous array into device memory."""

    @abstractmethod
    def copyout(self, out: np.ndarray, handle: Any) -> None:
        """Copy device memory into a contiguous array."""

    def host_bytes(self, handle: Any) -> np.ndarray | None:
        """The memory itself as host bytes, where it is this process's memory; None for memory on a device."""
        return None

    def gpu_address(self, handle: Any) -> int | None:
        """The address of GPU memory, for libraries that read it themselves (a CUDA-aware MPI); None elsewhere."""
        return None

    def readinto(self, handle: Any, file: BinaryIO, nbytes: int) -> None:
        """Fill the first `nbytes` of the memory with the next `nbytes` of a binary file: straight into it where it is
        host memory (`host_bytes`), else through one host array of that size."""
        memory = self.host_bytes(handle)
        if memory is not None:
            read_exactly(file, memoryview(memory[:nbytes]))
            return
        array = np.empty(nbytes, dtype=np.uint8)
        read_exactly(file, memoryview(array))
        self.copyin(handle, array)


def read_exactly(file: BinaryIO, memory: memoryview) -> None:
    """Fill `memory` from the file, or raise if the file ends first."""
    done = 0
    while done < len(memory):
        count = file.readinto(memory[done:])
        if not count:
            raise EOFError(f"{getattr(file, 'name', 'file')} ended {len(memory) - done} bytes early")
        done += count


class HostMemory(np.ndarray):
    """A NumPy byte array that knows its address (asking NumPy for it on every kernel launch is slow)."""

    address: int


class HostAllocator(Allocator):
    """Memory in this process, as NumPy byte arrays (used by the CPU-side devices)."""

    def alloc(self, nbytes: int) -> HostMemory:
        # 64-byte alignment so 512-bit vector loads never straddle
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 64
        memory = raw[offset : offset + nbytes].view(HostMemory)
        memory.address = raw.ctypes.data + offset
        return memory

    def copyin(self, handle: np.ndarray, array: np.ndarray) -> None:
        handle[: array.nbytes] = array.view(np.uint8)

    def copyout(self, out: np.ndarray, handle: np.ndarray) -> None:
        out.view(np.uint8)[:] = handle[: out.nbytes]

    def host_bytes(self, handle: np.ndarray) -> np.ndarray:
        return handle


class Compiler(ABC):
    """Turns source text into a binary, kept in the disk cache by (compiler, source)."""

    cache_name = "compiler"  # the compiler's identity: its version and target, and the settings that change its output

    @abstractmethod
    def compile(self, source: str) -> bytes:
        """The binary for `source`."""

    def compile_cached(self, source: str) -> bytes:
        binary = disk_cache.get(self.cache_name, source)
        if binary is not None:
            GlobalCounters.compile_cache_hits += 1
            return binary
        binary = self.compile(source)
        GlobalCounters.compile_count += 1
        disk_cache.put(self.cache_name, source, binary)
        return binary


class LoadedBinaries:
    """Binaries loaded into a device, each once, shared by the programs made from it (an LLVM batch is one binary
    for several kernels) and unloaded when the last of those programs is released."""

    def __init__(self, load: Callable[[bytes], Any], unload: Callable[[Any], None]):
        self.load, self.unload = load, unload
        self.loaded: dict[bytes, list] = {}  # by the binary's hash: [what `load` returned, programs using it]
        self.lock = threading.Lock()  # programs are made on the compile threads

    def acquire(self, binary: bytes, lookup: Callable[[Any], Any]) -> tuple[bytes, Any]:
        """For one more program: (the binary's hash, `lookup(loaded binary)`); pass the hash to `release` when done.
        `lookup` (finding a function in the binary) runs under the lock."""
        digest = hashlib.sha256(binary).digest()
        with self.lock:
            entry = self.loaded.get(digest)
            if entry is None:
                entry = self.loaded[digest] = [self.load(binary), 0]
            found = lookup(entry[0])
            entry[1] += 1
            return digest, found

    def release(self, digest: bytes) -> None:
        """One program is done with the binary; the last one unloads it."""
        with self.lock:
            entry = self.loaded[digest]
            entry[1] -= 1
            if entry[1] == 0:
                del self.loaded[digest]
                self.unload(entry[0])


class Compiled:
    """A device: its renderer (linear UOps → source), compiler (source → binary), allocator and program runner.
    `max_buffers`: the most buffers one kernel may take, where the device limits its kernels' parameters (None: no
    limit); the scheduler computes parts of a graph apart to stay within it. `unsupported_dtypes`: the dtypes it
    cannot compute in, each with the reason (tensors of them are an error at the line that makes them)."""

    def __init__(
        self,
        name: str,
        allocator: Allocator,
        renderer: Any,
        compiler: Compiler,
        runtime: Callable,
        max_buffers: int | None = None,
    ):
        self.name, self.allocator, self.renderer, self.compiler, self.runtime = (
            name,
            allocator,
            renderer,
            compiler,
            runtime,
        )
        self.max_buffers = max_buffers
        # dtype -> why this device cannot compute in it (an OpenCL device without doubles)
        self.unsupported_dtypes: dict[DType, str] = {}


def describe_devices() -> list[tuple[str, str]]:
    """Each known device with "available" or the reason it is not."""
    rows = []
    for name in KNOWN_DEVICES:
        try:
            Device[name]
            rows.append((name, "available"))
        except (DeviceUnavailable, ImportError) as error:
            rows.append((name, f"unavailable: {error}"))
    return rows


# the array.array type code of an address
ADDRESS_TYPECODE = {4: "I", 8: "Q"}[ctypes.sizeof(ctypes.c_void_p)]


class HostProgram(ABC):
    """A kernel compiled to this CPU: a function `void name(void **buffers, int64 start, int64 end)` in a binary
    loaded through the device's `binaries` (shared by the programs made from it), called through ctypes with an array
    of the buffers' addresses (one argument however many buffers: ctypes calls take at most 1024) and the [start, end)
    range of its outermost loop (the launch's "blocks", see codegen/threads.py). A kernel with enough work shares that
    loop with the other cores through the device's `Team` (ctypes releases the GIL during each call, so the threads
    run in parallel). `release()` gives the binary back; the program cannot run after."""

    # below this many innermost statement runs in all, starting workers costs more than they save
    PARALLEL_WORK = 1 << 17
    SIGNATURE = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    binaries: LoadedBinaries  # each device's own
    device: HostDevice  # the device whose programs these are (its Team)

    def __init__(self, name: str, binary: bytes, launch: tuple[int, int] = (1, 1), work: int = 0):
        self.name = name
        self.digest: bytes | None
        self.digest, self.address = self.binaries.acquire(binary, lambda loaded: self.address_of(loaded, name))
        self.function: Callable | None = ctypes.CFUNCTYPE(None, *self.SIGNATURE)(self.address)
        self.outer, self.work = launch[0], work
        # the last call's buffer addresses, their array, and its address (see __call__)
        self.arguments: tuple[list[int], array.array, int] | None = None

    @abstractmethod
    def address_of(self, loaded: Any, name: str) -> int:
        """The address of the function `name` in a loaded binary."""

    @property
    def released(self) -> bool:
        return self.digest is None

    def release(self) -> None:
        """Done with this kernel: its binary is unloaded once no program made from it is in use. Idempotent."""
        if self.digest is not None:
            digest, self.digest = self.digest, None
            self.function = None
            self.binaries.release(digest)

    def __call__(self, *buffers: HostMemory) -> None:
        # The array of addresses is built once and used again while the buffers stay where they were (a repeated
        # small step gets its memory back from the pool). An array.array is the quickest to build; the local
        # `arguments` keeps it alive until every part has run, even if another call replaces it meanwhile.
        addresses = [buffer.address for buffer in buffers]
        arguments = self.arguments
        if arguments is None or arguments[0] != addresses:
            arguments = self.arguments = (addresses, *packed_addresses(addresses))
        self.run(arguments[2])

    def run(self, pointer: int) -> None:
        """Run on the buffers whose addresses are in the array at `pointer` (kept alive by the caller)."""
        function = self.function
        if function is None:
            raise RuntimeError(f"kernel {self.name} was released and cannot run anymore")
        if self.work < self.PARALLEL_WORK or self.outer < 2 or CORES < 2:
            function(pointer, 0, self.outer)
            return
        team = self.device.team()
        table = array.array(ADDRESS_TYPECODE, [self.address, pointer, self.outer, team.chunk(self, 0)])
        team.run(table.buffer_info()[0], 1)


def packed_addresses(addresses: list[int]) -> tuple[array.array, int]:
    """The addresses as a C array of pointers, and the array's own address (valid while the array lives)."""
    packed = array.array(ADDRESS_TYPECODE, addresses)
    return packed, packed.buffer_info()[0]


class Team:
    """Runs a table of kernels through a host device's kernel runner (one native call) with a worker on each other
    core, which joins each shared kernel it finds open and takes chunks of its outer loop (see codegen's TeamLayout).
    A worker spins while it waits, so a run of small kernels costs the other cores no wake-up each, and one that
    starts late only misses the kernels before it. After a call it waits a little longer (`TeamLayout.linger`) for
    the next: eager ops, one call each with the Python that builds the next between them, find it awake (a 1000²
    row sum: 83 -> 64 us). Then it sleeps on a lock of its own, which a call releases (a thread pool's submit cost a
    call some 10 us of Python). One call at a time shares the team's words: another, from another thread meanwhile,
    runs alone."""

    CHUNKS = 2  # chunks of a shared kernel per thread (more balance the threads' work better, fewer cost less)

    def __init__(self, runner: HostProgram, worker: HostProgram, layout: Any):
        self.runner, self.worker, self.layout = runner, worker, layout
        self.workers = CORES - 1
        self._forget_threads()
        if hasattr(os, "register_at_fork"):  # (a forked child has none of the threads: it starts its own)
            os.register_at_fork(after_in_child=self._forget_threads)

    def _forget_threads(self) -> None:
        self.calling = threading.Lock()  # held by the call that shares the words
        self.wakes: list[threading.Lock] = []  # each worker thread's (started at the first shared call)
        self.inside: list[bool] = []  # whether each worker is in the native worker function (what it last said)
        self.words = self.closed_words()  # the words every shared call uses
        self.words[self.layout.idle] = 1

    def closed_words(self) -> array.array:
        words = array.array("q", [0]) * self.layout.words
        words[self.layout.state] = self.layout.closed
        return words

    def chunk(self, program: HostProgram, work: int) -> int:
        """The chunk size `program`'s outer loop is shared in where it runs `work` innermost statements or more
        (0: it runs whole on the caller's thread)."""
        if not self.workers or program.outer < 2 or program.work < work:
            return 0
        return -(-program.outer // (CORES * self.CHUNKS))

    def run(self, table: int, count: int, shared: bool = True) -> None:
        """Run the `count` kernels of the table at address `table`, with the workers if `shared`."""
        if not (shared and self.workers and self.calling.acquire(blocking=False)):
            # words no worker sees, held in a name until the call returns (the runner writes to them)
            private = self.closed_words()
            self.runner.function(table, private.buffer_info()[0], count)
            return
        words = self.words
        try:
            words[self.layout.idle] = 0
            self._wake()
            self.runner.function(table, words.buffer_info()[0], count)
        finally:
            words[self.layout.idle] = 1
            self.calling.release()

    def _wake(self) -> None:
        """Wake every worker that sleeps. (A lock released for a worker still lingering in native code lets it
        linger once more when it comes out: whether it has come out is written under the GIL, too late to ask.)"""
        if not self.wakes:
            for number in range(self.workers):
                wake = threading.Lock()
                wake.acquire()
                self.wakes.append(wake)
                self.inside.append(False)
                threading.Thread(
                    target=self._serve, args=(number, wake), name=f"lazygrad-worker-{number}", daemon=True
                ).start()
        for wake in self.wakes:
            if wake.locked():
                try:
                    wake.release()
                except RuntimeError:  # another thread's call woke it just now
                    pass

    def _serve(self, number: int, wake: threading.Lock) -> None:
        """A worker thread: each time it is woken, it waits for shared kernels in native code until it has lingered
        after a call (the words stay alive while it does: the local reference holds them)."""
        while True:
            wake.acquire()
            words, self.inside[number] = self.words, True
            try:
                self.worker.function(None, words.buffer_info()[0], 0)
            finally:
                self.inside[number], words = False, None


class HostGraph:
    """The kernels of a captured step on a host device, replayed from a table of each kernel's (function, array of
    buffer addresses, end of the outermost loop, chunk size) by the device's `Team` in one call from Python: the
    kernels with SHARED_WORK innermost statement runs or more are shared with the other cores, where they run
    HostProgram.PARALLEL_WORK or more together (starting the workers costs a call some 20 us). A kernel's array is
    built at the first call and again only where its buffers changed (a TinyJit's inputs)."""

    SHARED_WORK = 1 << 12

    def __init__(self, programs: list[HostProgram], team: Team):
        self.programs, self.team = programs, team
        self.bound: list[list[HostMemory]] = [[] for _ in programs]
        self.arguments: list[array.array | None] = [None] * len(programs)  # (kept alive: the table points at them)
        words = self.words = team.layout.table
        self.table = array.array(ADDRESS_TYPECODE, [0] * (words * len(programs)))
        self.table[0::words] = array.array(ADDRESS_TYPECODE, [program.address for program in programs])
        self.table[2::words] = array.array(ADDRESS_TYPECODE, [program.outer for program in programs])
        chunks = [team.chunk(program, self.SHARED_WORK) for program in programs]
        self.table[3::words] = array.array(ADDRESS_TYPECODE, chunks)
        shared_work = sum(program.work for program, chunk in zip(programs, chunks) if chunk)
        self.shared = shared_work >= HostProgram.PARALLEL_WORK

    def __call__(self, buffers: list[list[HostMemory]]) -> None:
        """Run every kernel, in order, on its buffers' memory."""
        for number, bound in enumerate(buffers):
            before = self.bound[number]
            if len(bound) != len(before) or not all(map(operator.is_, bound, before)):
                self.bound[number] = bound
                packed, self.table[self.words * number + 1] = packed_addresses([memory.address for memory in bound])
                self.arguments[number] = packed
        for program in self.programs:
            if program.function is None:
                raise RuntimeError(f"kernel {program.name} was released and cannot run anymore")
        self.team.run(self.table.buffer_info()[0], len(self.programs), self.shared)


class HostDevice(Compiled):
    """A device whose kernels run on this CPU (`HostProgram`s): a TinyJit replays a captured step as a `HostGraph`,
    and a kernel with enough work is shared with the other cores through the device's `Team`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.runtime.device = self  # (each host device has a program class of its own)
        self._team: Team | None = None

    def graph(self, programs: list[HostProgram]) -> HostGraph:
        return HostGraph(programs, self.team())

    def schedule_graph(self, programs: list[HostProgram]) -> HostGraph | None:
        """A graph for a repeated schedule's kernels where it shares them with the other cores (its workers then
        wait beside the whole schedule); None where launching them one by one costs less."""
        graph = self.graph(programs)
        return graph if graph.shared else None

    def team(self) -> Team:
        """The kernel runner `void name(void **table, int64 team, int64 count)` and its workers' function `void
        name_worker(void *unused, int64 team, int64 number)`: their source comes from the renderer, compiled once
        per process (outside the disk cache and the compile counters)."""
        if self._team is None:
            binary = self.compiler.compile(self.renderer.render_kernel_runner(KERNEL_RUNNER))
            runner, worker = self.runtime(KERNEL_RUNNER, binary), self.runtime(KERNEL_RUNNER + "_worker", binary)
            self._team = Team(runner, worker, self.renderer.team)
        return self._team


# the name of a host device's kernel runner
KERNEL_RUNNER = "lazygrad_run_kernels"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, within a container's CPU quota (cgroup v2's cpu.max),
    not every core of the machine: a spinning worker on a core the process does not get stalls the others."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as limits:
            quota, period = limits.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cores


CORES = usable_cores()
