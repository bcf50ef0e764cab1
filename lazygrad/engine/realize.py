"""Running a schedule: each kernel AST is lowered, optimized, linearized, rendered and compiled once per device (in
memory by the interned AST, for the PROGRAM_CACHE most recently used kernels; on disk by the hash of the source), then
launched on its buffers."""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable

from lazygrad.codegen.heuristic import heuristic_opts
from lazygrad.codegen.index_width import narrow_indices
from lazygrad.codegen.linearize import linearize
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.narrow_dtypes import lower_narrow_dtypes
from lazygrad.codegen.opt import Opt, apply_opts, prepare
from lazygrad.codegen.renderer import WARP, kernel_name
from lazygrad.codegen.threads import kernel_launch, map_threads
from lazygrad.device import CORES, Buffer, Device
from lazygrad.diskcache import disk_cache
from lazygrad.engine.buffers import buffer_of
from lazygrad.engine.schedule import Schedule, ScheduleItem
from lazygrad.engine.search import beam_key, beam_opts
from lazygrad.helpers import ALLOW_TF32, BEAM, DEBUG, NOOPT, PROGRAM_CACHE, GlobalCounters
from lazygrad.uop.ops import ALU, Ops, UOp
from lazygrad.uop.pattern import graph_rewrite


@dataclass
class CompiledKernel:
    """A kernel ready to launch, with what DEBUG=2 reports about it."""

    name: str
    program: Any
    source: str
    ops: int  # arithmetic ops per launch
    memory: int  # bytes read and written per launch
    global_size: int


# The program cache. Ownership of device code: a compiled kernel's program is released (its device code freed) when
# the CompiledKernel is garbage: out of the cache and held by nothing else — not a TinyJit's captured launches (nor the
# device graph built from them), not a launch under way. The releases wait in `_unused` and happen in `remember`, on
# the thread that runs schedules, never inside whatever code the garbage collector interrupted.
# (device, kernel AST, NOOPT, BEAM, ALLOW_TF32): what chooses its optimization actions is part of the key
ProgramKey = tuple[str, UOp, bool, int, bool]


def program_key(device_name: str, ast: UOp) -> ProgramKey:
    return (device_name, ast, *program_settings())


def program_settings() -> tuple[bool, int, bool]:
    """The part of every program key that the settings decide (read once per schedule: a schedule runs under one)."""
    return bool(NOOPT.value), BEAM.value, bool(ALLOW_TF32.value)


# compiled kernels, least recently used first, at most PROGRAM_CACHE of them
_programs: OrderedDict[ProgramKey, CompiledKernel] = OrderedDict()
_building: dict[ProgramKey, Future] = {}  # kernels being compiled
# kernels out of the cache that something still holds (a TinyJit): used again rather than built a second time
_evicted: weakref.WeakValueDictionary[ProgramKey, CompiledKernel] = weakref.WeakValueDictionary()
_unused: deque = deque()  # programs of collected kernels, to release


def new_compiled_kernel(
    name: str, program: Any, source: str, ops: int, memory: int, global_size: int
) -> CompiledKernel:
    """A CompiledKernel whose program is queued for release once the kernel is garbage."""
    kernel = CompiledKernel(name, program, source, ops, memory, global_size)
    if hasattr(program, "release"):
        weakref.finalize(kernel, _unused.append, program).atexit = False
    return kernel


def remember(key: ProgramKey, kernel: CompiledKernel) -> None:
    """Put a kernel in the program cache as its most recently used one; beyond PROGRAM_CACHE kernels, the least
    recently used leave it (their code is freed once nothing else holds them). Then release what is unused."""
    limit = PROGRAM_CACHE.value
    if limit < 1:
        raise ValueError(f"PROGRAM_CACHE={limit}: the program cache takes an integer >= 1 (compiled kernels in memory)")
    _programs[key] = kernel
    _programs.move_to_end(key)
    while len(_programs) > limit:
        evict_oldest()
    release_unused()


def evict_oldest() -> None:
    """Take the least recently used kernel out of the cache (a function: no local keeps it alive after)."""
    key, kernel = _programs.popitem(last=False)
    _evicted[key] = kernel


def release_unused() -> None:
    """Free the device code of every kernel that left the program cache and that nothing holds anymore."""
    while _unused:
        _unused.popleft().release()


def live_programs() -> int:
    """Compiled kernels in memory: in the program cache, or out of it and still held (by a TinyJit)."""
    return len(_programs) + sum(1 for key in _evicted.keys() if key not in _programs)


@functools.cache
def compile_pool() -> ThreadPoolExecutor:
    """Where device compilers run: they release the GIL, so this thread goes on generating the next kernel."""
    return ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="lazygrad-compile")


def measure_work(program: list[UOp]) -> tuple[int, int, int]:
    """For one launch: floating-point ops, bytes of the buffers it touches, and how many times innermost
    statements run in all (the work that decides whether a kernel is worth splitting across cores); all from
    loop trip counts."""
    ops = trips_total = 0
    trips, stack = 1, []
    for node in program:
        if node.op is Ops.SPECIAL:  # every thread of every block runs the program
            trips *= node.arg[1]
        elif node.op is Ops.RANGE:
            stack.append(trips)
            trips *= node.src[0].arg
        elif node.op is Ops.ENDRANGE:
            trips_total += trips
            trips = stack.pop()
        elif node.op is Ops.WMMA:
            # a warp's m·n·k multiply-adds, which every one of its threads executes in the program: once per warp
            m, n, k = node.arg[:3]
            ops += trips * 2 * m * n * k // WARP
        elif node.op in ALU and (node.dtype.is_float or (node.src and node.src[-1].dtype.is_float)):
            ops += trips
    memory = sum(node.arg[1] * node.dtype.itemsize for node in program if node.op is Ops.DEFINE_GLOBAL)
    return ops, memory, max(trips_total, trips)


def get_kernel(device_name: str, ast: UOp, key: ProgramKey | None = None) -> CompiledKernel:
    """The compiled kernel for `ast` on a device, built once while it is in memory (and compiled once per machine).
    `key` is `program_key(device_name, ast)`, where the caller has it already."""
    # ASTs are interned, so an equal kernel is the same object: a dictionary lookup, no hashing of the graph
    if key is None:
        key = program_key(device_name, ast)
    kernel = _programs.get(key)
    if kernel is not None:
        _programs.move_to_end(key)
        GlobalCounters.compile_cache_hits += 1
        return kernel
    kernel = _evicted.pop(key, None)
    if kernel is not None:
        GlobalCounters.compile_cache_hits += 1
    else:
        if key not in _building:
            build_kernels(device_name, [ast])
        try:
            kernel = _building[key].result()
        finally:  # a failed build is not remembered: the next use builds it again
            _building.pop(key, None)
    remember(key, kernel)
    return kernel


@dataclass
class GeneratedKernel:
    """A kernel's source and what is known of it before it is compiled."""

    name: str
    source: str
    ops: int
    memory: int
    work: int
    # (blocks, threads per block, bytes of shared memory a block asks for at launch); on a CPU, the iterations it may
    # split across cores
    launch: tuple[int, int, int]


# Kernels compiled together, where the device's language can join sources: each compiler call has a fixed cost
# (LLVM at O3: ~20 ms, optimizing and emitting even a 2k-character kernel), so small kernels share a call, in
# batches of up to BATCH_SIZE; a kernel of ALONE_SOURCE characters or more (a register-blocked product, a long
# elementwise chain: 16k-100k characters of IR, 0.05-0.3 s) is compiled on its own, on one core while the other
# compiles the rest or generates the next kernels. (Batches that ended once they held 16k characters made a new
# process's first MLP step ~15 % slower, with small kernels in more calls; batches of 64k compiled a long chain's
# three large kernels on one core, 0.6 -> 0.9 s.)
BATCH_SIZE = 8
ALONE_SOURCE = 16_000


def build_kernels(device_name: str, asts: list[UOp]) -> None:
    """Start building kernels: code is generated here, one kernel after another, while the compiler (which releases
    the GIL) works in the background on the ones before. Where the renderer can join sources (LLVM IR), kernels
    are compiled in batches, since each compiler call has a high fixed cost, each batch of kernels the renderer
    lets share a compile (`join_group`); batches follow the order of `asts`, so the same schedule makes the same
    batches, and the disk cache finds them. `get_kernel` waits for them."""
    device = Device[device_name]
    joins = device.renderer.can_join
    pending: dict[object, list[tuple[Future, GeneratedKernel]]] = {}  # per join group, the batch being filled
    unsubmitted: dict[Future, ProgramKey] = {}
    with collector_paused():
        for ast in asts:
            try:
                kernel = kept_kernel(device, ast)
                if kernel is None:
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    kernel = generate_kernel(device, ast)
                    count_generation(time.thread_time() - start_cpu, time.perf_counter() - start)
                    keep_kernel(device, ast, kernel)
            except BaseException:
                for key in unsubmitted.values():  # no one may wait for these forever
                    del _building[key]
                raise
            future: Future = Future()
            key = program_key(device_name, ast)
            _building[key], unsubmitted[future] = future, key
            if not joins or len(kernel.source) >= ALONE_SOURCE:
                _submit(device, [(future, kernel)], 1, unsubmitted)
                continue
            group = device.renderer.join_group(kernel.source)
            batch = pending.setdefault(group, [])
            batch.append((future, kernel))
            if len(batch) == BATCH_SIZE:
                _submit(device, pending.pop(group), 1, unsubmitted)
    # with nothing left to generate, the last kernels are shared by every core
    for batch in pending.values():
        _submit(device, batch, max(1, min(CORES // len(pending), len(batch))), unsubmitted)


def count_generation(seconds: float, wall_seconds: float) -> None:
    """Add one generated kernel's time to GlobalCounters (extra/bench.py reports them per kernel and the slowest):
    the CPU time of the thread generating it, which is the generation's own work, and the wall time, which also
    counts the time the compile threads beside it took its core."""
    counters = GlobalCounters
    counters.generate_count += 1
    counters.generate_time_s += seconds
    counters.generate_max_s = max(counters.generate_max_s, seconds)
    counters.generate_wall_s += wall_seconds
    counters.generate_wall_max_s = max(counters.generate_wall_max_s, wall_seconds)


def _submit(
    device: Any, batch: list[tuple[Future, GeneratedKernel]], parts: int, unsubmitted: dict[Future, ProgramKey]
) -> None:
    """Compile a batch, in `parts` compiles on the compile threads (BEAM: here and now, as a single compile: it
    times kernels as it generates them, with no compiles beside it to skew the timings)."""
    for future, _ in batch:
        del unsubmitted[future]
    if BEAM:
        _compile_batch(device, batch)
        return
    for part in range(parts):
        compile_pool().submit(
            _compile_batch, device, batch[part * len(batch) // parts : (part + 1) * len(batch) // parts]
        )


class collector_paused:
    """Pause Python's cyclic garbage collector for a `with` block that builds or drops many graph nodes: kernel
    generation, a backward pass, an optimizer's update, a realize. Graph nodes (UOps, their tuples and dicts) have no
    cycles among them, so the collector finds nothing in them, but their count triggers it: it would scan the live
    graphs again and again, and a step's graph, alive across collections, is promoted to the oldest generation, whose
    collections scan every object of the process (~100 ms each once torch is imported). A training step without
    TinyJit lost a third of its time so (ResNet18 mean 102 ms against a median of 65). Paused, the graph a realize
    frees leaves the collector's count as it found it. Kernels are generated under one pause per schedule, not per
    kernel: between kernels the collector still ran (4 full collections of ~75 ms in a cold ResNet18 step). What
    little cyclic garbage is made meanwhile is collected once the collector runs again. (A class, not a generator:
    a realize enters it on every eager op.)"""

    __slots__ = ("enabled",)

    def __enter__(self) -> None:
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            gc.enable()


def _compile_batch(device: Any, batch: list[tuple[Future, GeneratedKernel]]) -> None:
    """Compile a batch into one binary and hand each kernel of it to its future (or the error to all)."""
    try:
        sources = [kernel.source for _, kernel in batch]
        binary = device.compiler.compile_cached(sources[0] if len(sources) == 1 else device.renderer.join(sources))
        for future, kernel in batch:
            runner = device.runtime(kernel.name, binary, kernel.launch, kernel.work)
            future.set_result(
                new_compiled_kernel(
                    kernel.name, runner, kernel.source, kernel.ops, kernel.memory, kernel.launch[0] * kernel.launch[1]
                )
            )
    except BaseException as error:  # noqa: BLE001 -- the error belongs to whoever waits for these kernels
        for future, _ in batch:
            if not future.done():
                future.set_exception(error)


def generate_kernel(device: Any, ast: UOp) -> GeneratedKernel:
    """Lower a kernel AST, choose its optimization actions (none with NOOPT; BEAM's timed choice; else the
    heuristic's), apply them, then linearize and render it for a device."""
    if DEBUG >= 5:
        print_graph(ast)
    lowered = lower_kernel(ast)
    if NOOPT:
        return render_kernel(device, ast, lowered, ())
    prepared = prepare(lowered)
    if BEAM:
        candidates: list[Any] = []

        def build(opts: tuple[Opt, ...]) -> tuple[Any, list[tuple[str, int, Any]]]:
            program, parameters = build_candidate(device, ast, prepared, opts)
            candidates.append(program)
            return program, parameters

        try:
            opts = beam_opts(device, ast, prepared, build)
        finally:  # timed and done with: their code is freed now
            for program in candidates:
                if hasattr(program, "release"):
                    program.release()
    else:
        opts = heuristic_opts(prepared, device.renderer.target)
    return render_kernel(device, ast, apply_opts(prepared, opts, device.renderer.target), opts)


def build_candidate(
    device: Any, ast: UOp, prepared: UOp, opts: tuple[Opt, ...]
) -> tuple[Any, list[tuple[str, int, Any]]]:
    """A kernel compiled with the actions `opts`, ready to time, and its parameters' (device, size, dtype)."""
    kernel = render_kernel(device, ast, apply_opts(prepared, opts, device.renderer.target), opts)
    program = device.runtime(kernel.name, device.compiler.compile_cached(kernel.source), kernel.launch, kernel.work)
    parameters = sorted((n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg[0])
    return program, [(device.name, node.arg[1], node.dtype) for node in parameters]


def render_kernel(device: Any, ast: UOp, kernel_graph: UOp, opts: tuple[Opt, ...]) -> GeneratedKernel:
    """Map a kernel graph (of the kernel `ast`, optimized by the actions `opts`) onto the device's threads, then
    linearize and render it."""
    kernel_graph = map_threads(kernel_graph, device.renderer.target)
    if device.renderer.target.max_threads:  # (a device with threads, as GPUs are: see index_width)
        kernel_graph = narrow_indices(kernel_graph)
    kernel_graph = lower_narrow_dtypes(kernel_graph)  # no renderer computes in bfloat16 or int8..int16
    if device.renderer.rewrites is not None:
        kernel_graph = graph_rewrite(kernel_graph, device.renderer.rewrites)
    program = linearize(kernel_graph)
    if DEBUG >= 6:
        for position, node in enumerate(program):
            print(
                f"{position:4d} {node.op.name:14s} {str(node.dtype):18s} {[program.index(s) if s in program else s.arg for s in node.src]} {node.arg}"
            )
    name = unique_name(device.name, ast, kernel_name(program))
    if DEBUG >= 3:
        print(f"{name}: {' '.join(str(opt) for opt in opts) or 'no optimization actions'}")
    source = device.renderer.render(name, program)
    if DEBUG >= 4:
        print(source)
    ops, memory, work = measure_work(program)
    return GeneratedKernel(name, source, ops, memory, work, kernel_launch(program, device.renderer))


_names_taken: dict[str, set[str]] = {}  # per device, the names its kernels have in this process
_names: dict[tuple[str, bytes, bool], str] = {}  # by device, the AST's content hash and NOOPT: ~200 bytes a kernel


def unique_name(device_name: str, ast: UOp, name: str) -> str:
    """`name`, or `name` with a number after it when another kernel of this process already has it: programs may
    share one symbol table (the LLVM device loads many kernels into one engine), and DEBUG output tells them apart.
    A kernel keeps its name, so one built again after it left the program cache has the same source, and the disk
    cache finds it."""
    key = (device_name, ast.key, bool(NOOPT))
    if key not in _names:
        taken, unique, count = _names_taken.setdefault(device_name, set()), name, 1
        while unique in taken:
            count += 1
            unique = f"{name}n{count}"
        taken.add(unique)
        _names[key] = unique
    return _names[key]


def claim_name(device_name: str, ast: UOp, name: str) -> bool:
    """Whether `ast`'s kernel can have `name` (a kernel generated by another process): it has it already, or no
    other kernel of this process has it, and now this one does."""
    key = (device_name, ast.key, bool(NOOPT))
    if key in _names:
        return _names[key] == name
    taken = _names_taken.setdefault(device_name, set())
    if name in taken:
        return False
    taken.add(name)
    _names[key] = name
    return True


# Generated kernels are kept on disk as well, by the kernel AST and everything else that decides the source: the
# device and its compiler's identity (the CPU or GPU model), the settings that choose actions, and lazygrad's own code
# (a changed code generator writes other sources). A later process then skips generating them (most of a large
# model's first step once its binaries are on disk). DEBUG>=3 generates every kernel, to print how.
KERNEL_TABLE = "kernels"


@functools.cache
def code_version() -> str:
    """The hash of lazygrad's Python sources, read once."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(root)):
        for file in sorted(files):
            if file.endswith((".py", ".h")):
                path = os.path.join(folder, file)
                with open(path, "rb") as source:
                    digest.update(os.path.relpath(path, root).encode() + b"\0" + source.read())
    return digest.hexdigest()


def kernel_key(device: Any, ast: UOp) -> str:
    """A BEAM choice's key (the kernel, the device and its CPU or GPU model), with the code and the settings."""
    return f"{beam_key(device, ast)} {code_version()} {program_settings()}"


def kept_kernel(device: Any, ast: UOp) -> GeneratedKernel | None:
    """The kernel an earlier process generated for `ast` on this device, where the disk cache has it and its name is
    free in this process; else None."""
    if DEBUG >= 3:
        return None
    kept = disk_cache.get(KERNEL_TABLE, kernel_key(device, ast))
    if kept is None:
        return None
    try:
        fields = json.loads(kept)
        kernel = GeneratedKernel(**fields | {"launch": tuple(fields["launch"])})
    except (ValueError, TypeError, KeyError):  # (not what this code keeps: generated again, and kept anew)
        return None
    return kernel if claim_name(device.name, ast, kernel.name) else None


def keep_kernel(device: Any, ast: UOp, kernel: GeneratedKernel) -> None:
    if DEBUG < 3:
        disk_cache.put(KERNEL_TABLE, kernel_key(device, ast), json.dumps(asdict(kernel)).encode())


def print_graph(root: UOp) -> None:
    numbers = {node: i for i, node in enumerate(root.toposort)}
    for node in root.toposort:
        print(
            f"{numbers[node]:4d} {node.op.name:14s} {str(node.dtype):18s} {[numbers[s] for s in node.src]} {node.arg}"
        )


@dataclass
class Launch:
    """One recorded kernel launch, or one host step (a copy, a collective over MPI): what a JIT replays."""

    kernel: CompiledKernel | None
    buffers: list[UOp]
    device: str
    host: Callable[..., None] | None = None  # a host step: called with the Buffers instead of a kernel


class _Capture(threading.local):
    """While a JIT captures on a thread, the launches of that thread (and only that thread) are appended here;
    `inputs` holds the buffers of the captured function's tensor arguments."""

    launches: list[Launch] | None = None
    inputs: frozenset[UOp] = frozenset()


def computed_from_capture_inputs(node: UOp) -> bool:
    """Whether, during a capture, the graph `node` reads values computed from the captured function's inputs: one of
    their buffers, or a buffer a captured launch wrote from them (or from such a buffer)."""
    if capture.launches is None or not capture.inputs:
        return False
    derived = set(capture.inputs)
    for launch in capture.launches:
        if launch.buffers and any(read in derived for read in launch.buffers[1:]):
            derived.add(launch.buffers[0])
    return any(source in derived for source in node.toposort if source.op is Ops.BUFFER)


capture = _Capture()
# held while a thread schedules, runs and stores a graph's results (Tensor.realize_all)
realize_lock = threading.RLock()


def copy_buffers(destination: Buffer, source: Buffer) -> None:
    destination.copyin(source.numpy()[: destination.size])


def run_host(function: Callable[..., None], buffers: list[UOp], device: str) -> None:
    """Run a host step: Python code that reads and writes buffers between kernels (`function(*Buffers)`). A JIT
    capture records it beside the kernels, and its replay calls it again at the same place."""
    function(*[buffer_of(node) for node in buffers])
    if capture.launches is not None:
        capture.launches.append(Launch(None, buffers, device, function))


def run_item(item: ScheduleItem, key: ProgramKey | None = None) -> None:
    """Run one item of a schedule (`key`: its kernel's program key, where the caller has it already)."""
    if item.kind == "copy":
        run_host(copy_buffers, item.buffers, item.device)
        return
    buffers = [buffer_of(node) for node in item.buffers]
    if buffers[0].size == 0:
        return
    # (get_kernel's common case inlined: a repeated small graph's launch is mostly such overhead)
    kernel = _programs.get(key) if key is not None else None
    if kernel is not None:
        _programs.move_to_end(key)
        GlobalCounters.compile_cache_hits += 1
    else:
        kernel = get_kernel(item.device, item.ast, key)
    if capture.launches is not None:
        capture.launches.append(Launch(kernel, item.buffers, item.device))
    launch_kernel(kernel, buffers, item.device)


def launch_kernel(kernel: CompiledKernel, buffers: list[Buffer], device_name: str) -> None:
    """Run a compiled kernel on buffers, counting it (and printing it at DEBUG>=2)."""
    start = time.perf_counter()
    measured = kernel.program(*[buffer.handle for buffer in buffers])
    # a device that times its own launches (GPU profiling events at DEBUG>=2) returns the seconds
    elapsed = measured if measured.__class__ is float else time.perf_counter() - start
    counters = GlobalCounters  # (count_launched for one kernel, inline: this runs on every launch)
    counters.kernel_count += 1
    counters.global_ops += kernel.ops
    counters.global_mem += kernel.memory
    counters.time_sum_s += elapsed
    if DEBUG.value >= 2:
        print(
            f"*** {Device[device_name].name:6s} {GlobalCounters.kernel_count:4d} {kernel.name:28s} global {kernel.global_size:<10d} "
            f"{elapsed * 1e3:9.3f} ms {kernel.ops / elapsed / 1e9 if elapsed else 0:8.2f} GFLOP/s "
            f"{kernel.memory / elapsed / 1e9 if elapsed else 0:8.2f} GB/s"
        )


def count_launched(kernels: list[CompiledKernel], seconds: float) -> None:
    """Count kernels that ran (one launch each, or one graph launch for all) and the seconds they took."""
    ops = memory = 0
    for kernel in kernels:  # (a plain loop: two generator sums cost more than most single launches' other counting)
        ops += kernel.ops
        memory += kernel.memory
    GlobalCounters.kernel_count += len(kernels)
    GlobalCounters.global_ops += ops
    GlobalCounters.global_mem += memory
    GlobalCounters.time_sum_s += seconds


def run_as_graph(plan: Any, kernels: list[tuple[ProgramKey, list[int], str]], buffers: list[UOp]) -> bool:
    """Run a repeated schedule's built kernels as one graph of their device, where the device offers one for them
    (`schedule_graph`: a host device, where some kernel is worth sharing with the other cores, whose workers then
    wait beside the whole schedule instead of starting for each kernel); False where it does not."""
    kept = plan.graph
    if kept is not None and kept[1] is None:  # (no graph: the kernels' sizes decided that, they stay the same)
        return False
    compiled = [_programs[key] for key, _, _ in kernels]
    # (the plan holds its kernels weakly: they leave the program cache, and free their code, as any other)
    if kept is None or any(ref() is not kernel for ref, kernel in zip(kept[0], compiled)):
        device = kernels[0][2]
        same = all(other == device for _, _, other in kernels)
        offer = getattr(Device[device], "schedule_graph", None) if same else None
        graph = offer([kernel.program for kernel in compiled]) if offer else None
        kept = plan.graph = ([weakref.ref(kernel) for kernel in compiled], graph)
    graph = kept[1]
    if graph is None:
        return False
    bound = [[buffer_of(buffers[slot]) for slot in slots] for _, slots, _ in kernels]
    if not all(memories[0].size for memories in bound):  # (an empty output: its kernel does not run)
        return False
    handles = [[memory.handle for memory in memories] for memories in bound]
    for key, _, _ in kernels:
        _programs.move_to_end(key)
    start = time.perf_counter()
    graph(handles)
    count_launched(compiled, time.perf_counter() - start)
    GlobalCounters.compile_cache_hits += len(compiled)
    return True


def run_schedule(schedule: Schedule) -> None:
    """Run every kernel in order. A plan whose kernels are all built runs from the launches prepared for it (a repeated
    small graph: nothing per kernel but the launch); otherwise every kernel not built yet starts building first, so a
    cold schedule generates code for the next kernels while the compiler works on the first."""
    plan, buffers = schedule.plan, schedule.buffers
    if plan.overwritten:
        schedule.forget_overwritten()
    settings = program_settings()
    launches = plan.launches
    if launches is None or launches[0] != settings:
        # per kernel: its program key (None for a copy), buffer slots and device
        kernels = [
            ((dev, ast, *settings) if kind == "kernel" else None, slots, dev) for ast, slots, dev, kind in plan.kernels
        ]
        launches = plan.launches = (settings, kernels)
        plan.graph = None
    if capture.launches is None:
        for key, _, _ in launches[1]:
            if key not in _programs:
                break
        else:
            kept = plan.graph  # (a plan its device offered no graph for is launched kernel by kernel: checked inline)
            if (kept is None or kept[1] is not None) and launches[1] and DEBUG.value < 2:
                if run_as_graph(plan, launches[1], buffers):
                    return
            for key, slots, device in launches[1]:
                kernel = _programs[key]
                _programs.move_to_end(key)
                memories = [buffers[slot].__dict__["buffer"] for slot in slots]  # (buffer_of, inline)
                if memories[0].size:
                    launch_kernel(kernel, memories, device)
            GlobalCounters.compile_cache_hits += len(launches[1])
            return
    items = schedule.items
    keys = [key for key, _, _ in launches[1]]
    new: dict[str, dict[UOp, None]] = {}  # per device, in schedule order, without repeats
    for item, key in zip(items, keys):
        if (
            item.kind == "kernel"
            and key not in _programs
            and key not in _building
            and key not in _evicted
            and buffer_of(item.buffers[0]).size
        ):
            new.setdefault(item.device, {})[item.ast] = None
    for device_name, asts in new.items():
        build_kernels(device_name, list(asts))
    for item, key in zip(items, keys):
        run_item(item, key)
