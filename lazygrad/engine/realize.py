"""Running a schedule: each kernel AST is lowered, optimized, linearized, rendered and compiled once per device (in
memory by the interned AST, on disk by the hash of the source), then launched on its buffers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lazygrad.codegen.linearize import linearize
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.opt import optimize
from lazygrad.codegen.renderer import kernel_name
from lazygrad.device import Buffer, Device
from lazygrad.engine.buffers import buffer_of
from lazygrad.engine.schedule import ScheduleItem
from lazygrad.helpers import DEBUG, NOOPT, GlobalCounters, prod
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


_programs: dict[tuple[str, UOp, bool], CompiledKernel] = {}


def measure_work(program: list[UOp]) -> tuple[int, int, int]:
    """For one launch: floating-point ops, bytes of the buffers it touches, and how many times innermost
    statements run in all (the work that decides whether a kernel is worth splitting across cores); all from
    loop trip counts."""
    ops = trips_total = 0
    trips, stack = 1, []
    for node in program:
        if node.op is Ops.RANGE:
            stack.append(trips)
            trips *= node.src[0].arg
        elif node.op is Ops.ENDRANGE:
            trips_total += trips
            trips = stack.pop()
        elif node.op in ALU and (node.dtype.is_float or (node.src and node.src[-1].dtype.is_float)):
            ops += trips
    memory = sum(node.arg[1] * node.dtype.itemsize for node in program if node.op is Ops.DEFINE_GLOBAL)
    return ops, memory, max(trips_total, trips)


def get_kernel(device_name: str, ast: UOp) -> CompiledKernel:
    """The compiled kernel for `ast` on a device, built once per process (and compiled once per machine)."""
    # ASTs are interned, so an equal kernel is the same object: a dictionary lookup, no hashing of the graph
    key = (device_name, ast, bool(NOOPT))
    if key in _programs:
        GlobalCounters.compile_cache_hits += 1
        return _programs[key]
    device = Device[device_name]
    if DEBUG >= 5:
        print_graph(ast)
    kernel_graph = lower_kernel(ast)
    if not NOOPT:
        kernel_graph = optimize(kernel_graph)
    if device.renderer.rewrites is not None:
        kernel_graph = graph_rewrite(kernel_graph, device.renderer.rewrites)
    program = linearize(kernel_graph)
    if DEBUG >= 6:
        for position, node in enumerate(program):
            print(
                f"{position:4d} {node.op.name:14s} {str(node.dtype):18s} {[program.index(s) if s in program else s.arg for s in node.src]} {node.arg}"
            )
    name = kernel_name(program)
    source = device.renderer.render(name, program)
    if DEBUG >= 4:
        print(source)
    binary = device.compiler.compile_cached(source)
    ops, memory, work = measure_work(program)
    # the sizes of the global loops, outermost first: GPU-style devices launch threads over (some of) them
    global_loops = tuple(node.src[0].arg for node in program if node.op is Ops.RANGE and node.arg[1] == "global")
    runner = device.runtime(name, binary, global_loops, work)
    kernel = CompiledKernel(name, runner, source, ops, memory, prod(global_loops))
    _programs[key] = kernel
    return kernel


def print_graph(root: UOp) -> None:
    numbers = {node: i for i, node in enumerate(root.toposort)}
    for node in root.toposort:
        print(
            f"{numbers[node]:4d} {node.op.name:14s} {str(node.dtype):18s} {[numbers[s] for s in node.src]} {node.arg}"
        )


@dataclass
class Launch:
    """One recorded kernel launch (or copy): what a JIT replays."""

    kernel: CompiledKernel | None
    buffers: list[UOp]
    device: str


# while a JIT captures, every launch is appended here
capture: list[Launch] | None = None


def copy_buffers(destination: Buffer, source: Buffer) -> None:
    destination.copyin(source.numpy()[: destination.size])


def run_item(item: ScheduleItem) -> None:
    buffers = [buffer_of(node) for node in item.buffers]
    if item.kind == "copy":
        copy_buffers(*buffers)
        if capture is not None:
            capture.append(Launch(None, item.buffers, item.device))
        return
    if buffers[0].size == 0:
        return
    kernel = get_kernel(item.device, item.ast)
    if capture is not None:
        capture.append(Launch(kernel, item.buffers, item.device))
    launch_kernel(kernel, buffers, item.device)


def launch_kernel(kernel: CompiledKernel, buffers: list[Buffer], device_name: str) -> None:
    """Run a compiled kernel on buffers, counting it (and printing it at DEBUG>=2)."""
    start = time.perf_counter()
    measured = kernel.program(*(buffer.handle for buffer in buffers))
    # a device that times its own launches (GPU profiling events at DEBUG>=2) returns the seconds
    elapsed = measured if isinstance(measured, float) else time.perf_counter() - start
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += kernel.ops
    GlobalCounters.global_mem += kernel.memory
    GlobalCounters.time_sum_s += elapsed
    if DEBUG >= 2:
        print(
            f"*** {Device[device_name].name:6s} {GlobalCounters.kernel_count:4d} {kernel.name:28s} global {kernel.global_size:<10d} "
            f"{elapsed * 1e3:9.3f} ms {kernel.ops / elapsed / 1e9 if elapsed else 0:8.2f} GFLOP/s "
            f"{kernel.memory / elapsed / 1e9 if elapsed else 0:8.2f} GB/s"
        )


def run_schedule(schedule: list[ScheduleItem]) -> None:
    """Run every item in order."""
    for item in schedule:
        run_item(item)
