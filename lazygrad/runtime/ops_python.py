"""The PYTHON device: executes the linear program itself, one UOp at a time.

It runs exactly what every renderer sees, so it is the reference for codegen: when a compiled device disagrees
with PYTHON, the renderer (or compiler) is wrong.

Every thread of a launch runs the same UOps in the same order (a linear program has no branches; its loops have
constant bounds; masks are values), so the threads run together, in lockstep: each value is a NumPy array with an
element per thread, computed with the semantics of uop/alu.py. Where threads share memory, lockstep would hide a
missing barrier (every thread's store lands before any thread's next load), so each access is checked instead: a
thread reading what another thread of its block wrote since the last barrier, or writing what another read since
then, is an error. Programs of tensor-core fragments (WMMA) run one thread at a time, on Python scalars.
"""

from __future__ import annotations

import base64
import pickle

import numpy as np

from lazygrad.codegen.renderer import WARP, Renderer, Target, TensorCore
from lazygrad.codegen.transcendental import exp_rules
from lazygrad.codegen.vectorize import wide_accesses
from lazygrad.device import Compiled, Compiler, HostAllocator
from lazygrad.dtype import dtypes
from lazygrad.uop.alu import cast_array, cast_value, exec_alu, exec_alu_array
from lazygrad.uop.ops import WMMA_SOURCES, Ops, UOp


class PythonRenderer(Renderer):
    """The "source" is the linear program itself, pickled. Its target has threads, so the PYTHON device runs the
    programs GPUs get (with small blocks, to keep the emulation quick): it is the reference for their codegen."""

    target = Target(
        vector_width=1,
        max_threads=64,
        block_threads=8,
        shared_memory=1 << 16,
        shuffle_lanes=WARP,  # (CUDA's warp: the same shuffles as CUDA's kernels)
        async_copies=True,  # (CUDA's double-buffered tiles: its copies land at the next barrier)
        wide_bytes=16,  # (CUDA's float4 loads and stores: each checked to be aligned, see `check_wide`)
        cores=4,  # (few, as its blocks are small: a reduce into one value is split, as on a GPU)
        tensor_cores=(  # CUDA's, emulated
            TensorCore((16, 16, 16), dtypes.float16),
            TensorCore((16, 16, 16), dtypes.bfloat16),
            TensorCore((16, 16, 8), dtypes.float32),
        ),
    )
    rewrites = exp_rules  # (exp as the GPU devices take it: their exp2 of its reduced argument)

    def render(self, name: str, program: list[UOp]) -> str:
        return base64.b64encode(pickle.dumps(program)).decode()


class PythonCompiler(Compiler):
    cache_name = "python"

    def compile(self, source: str) -> bytes:
        return source.encode()

    def compile_cached(self, source: str) -> bytes:
        return self.compile(source)


class PythonProgram:
    """Interprets a linear program: loops jump back from ENDRANGE to just after their RANGE. Every thread of every
    block runs the program; the threads of a block run in turns from one barrier to the next, sharing their
    block's memory, as they would on a GPU."""

    def __init__(self, name: str, binary: bytes, launch: tuple[int, ...] = (1, 1), work: int = 0):
        self.name, self.released = name, False  # (`launch`: blocks and threads per block, first)
        self.launch = launch
        self.program: list[UOp] = pickle.loads(base64.b64decode(binary))
        # each loop's RANGE and ENDRANGE positions, matched by nesting: one loop node may be opened twice, one loop
        # after the other (two reduces over the same loop, one run before an output loop opens, one inside it)
        self.loop_end: dict[int, int] = {}
        self.loop_start: dict[int, int] = {}
        opened: list[int] = []
        for position, node in enumerate(self.program):
            if node.op is Ops.RANGE:
                opened.append(position)
            elif node.op is Ops.ENDRANGE:
                start = opened.pop()
                self.loop_end[start], self.loop_start[position] = position, start
        # the first lane of each access a GPU makes wide (`wide_accesses`) -> its lanes: its index must be aligned
        accesses = wide_accesses(self.program, PythonRenderer.target.wide_bytes)
        self.wide = {access.nodes[0]: len(access.nodes) for access in accesses}
        # (a block's threads are told apart by a bit each in the shared-memory checks)
        self.lockstep = launch[1] <= 64 and not any(node.op is Ops.WMMA for node in self.program)

    def release(self) -> None:
        """Nothing to free: the program is Python objects, collected with this one."""
        self.released = True

    def __call__(self, *buffers: np.ndarray) -> None:
        memory = {
            node.arg[0]: buffers[node.arg[0]].view(node.dtype.np)
            for node in self.program
            if node.op is Ops.DEFINE_GLOBAL
        }
        blocks, threads = self.launch[:2]
        if self.lockstep:
            chunk = max(1, LOCKSTEP_THREADS // threads)  # blocks run together
            for first in range(0, blocks, chunk):
                self.run_lockstep(memory, range(first, min(blocks, first + chunk)), threads)
            return
        for block in range(blocks):
            shared: dict[UOp, np.ndarray] = {}
            running = [self.run(memory, shared, block, thread) for thread in range(threads)]
            while running:  # each turn takes every thread to its next barrier, or to its end
                waiting = [thread for thread in running if next(thread, None) is not None]
                if waiting and len(waiting) != len(running):
                    raise RuntimeError(f"{self.name}: some threads of a block reached a barrier the others passed by")
                running = waiting

    def run_lockstep(self, memory: dict[int, np.ndarray], blocks: range, threads: int) -> None:
        """Every thread of `blocks` runs the program at once: a value is an array over those threads (or one NumPy
        scalar, where every thread has the same)."""
        lanes = np.arange(len(blocks) * threads)
        block_row, thread_of = lanes // threads, lanes % threads
        bit = np.left_shift(np.uint64(1), thread_of.astype(np.uint64))
        values: dict[UOp, object] = {}
        counts: dict[UOp, int] = {}
        accumulators: dict[UOp, object] = {}
        shared: dict[UOp, SharedMemory] = {}

        def value(node: UOp):
            return node.dtype.np.type(node.arg) if node.op is Ops.CONST else values[node]

        counter, program = 0, self.program
        with np.errstate(all="ignore"):
            while counter < len(program):
                node = program[counter]
                op, src = node.op, node.src
                if op is Ops.RANGE:
                    counts[node], values[node] = 0, node.dtype.np.type(0)
                    if src[0].arg <= 0:
                        counter = self.loop_end[counter]
                elif op is Ops.ENDRANGE:
                    loop = src[0]
                    counts[loop] += 1
                    values[loop] = loop.dtype.np.type(counts[loop])
                    if counts[loop] < loop.src[0].arg:
                        counter = self.loop_start[counter]
                elif op is Ops.SPECIAL:
                    lane = blocks.start + block_row if node.arg[0] == "block" else thread_of
                    values[node] = lane.astype(node.dtype.np)
                elif op is Ops.DEFINE_LOCAL:
                    shared[node] = SharedMemory(len(blocks), node.arg[1], node.dtype.np)
                elif op is Ops.BARRIER:
                    for block_memory in shared.values():
                        block_memory.synchronize()
                elif op is Ops.SHUFFLE:  # (a value the same in every thread is the one it reads)
                    partner = shuffle_partner(self.name, thread_of, value(src[1]), threads)
                    shuffled = value(src[0])
                    values[node] = shuffled[lanes - thread_of + partner] if np.ndim(shuffled) else shuffled
                elif op is Ops.DEFINE_ACC:
                    accumulators[node] = node.dtype.np.type(node.arg[0])
                elif op is Ops.LOAD and src[0].op is Ops.DEFINE_ACC:
                    values[node] = accumulators[src[0]]
                elif op is Ops.STORE and src[0].op is Ops.DEFINE_ACC:
                    accumulators[src[0]] = value(src[1])
                elif op is Ops.LOAD and src[0].op is Ops.DEFINE_LOCAL:
                    values[node] = shared[src[0]].load(self.name, block_row, value(src[1]), bit)
                elif op is Ops.STORE and src[0].op is Ops.DEFINE_LOCAL:
                    gate = value(src[3]) if len(src) > 3 else True
                    shared[src[0]].store(self.name, block_row, value(src[1]), value(src[2]), gate, bit)
                elif op is Ops.LOAD:
                    if node in self.wide:
                        check_wide(self.name, value(src[1]), self.wide[node])
                    buffer = memory[src[0].arg[0]]
                    values[node] = gather(self.name, buffer, value(src[1]), value(src[2]) if len(src) > 2 else None)
                    if values[node].dtype != node.dtype.np:
                        values[node] = cast_array(values[node], node.dtype)
                elif op is Ops.STORE:
                    if node in self.wide:
                        check_wide(self.name, value(src[1]), self.wide[node])
                    gate = value(src[3]) if len(src) > 3 else True
                    index, stored, gate = np.broadcast_arrays(value(src[1]), value(src[2]), gate, lanes)[:3]
                    buffer = memory[src[0].arg[0]]
                    buffer[inside(self.name, index[gate], buffer.size)] = stored[gate]
                elif op is Ops.CAST:
                    values[node] = cast_array(value(src[0]), node.dtype)
                elif op is Ops.BITCAST:
                    values[node] = np.asarray(value(src[0]), src[0].dtype.np).view(node.dtype.np)
                elif op is not Ops.DEFINE_GLOBAL and op is not Ops.PREFETCH:  # (a PREFETCH: its copies run)
                    values[node] = exec_alu_array(op, node.dtype, [value(s) for s in src])
                counter += 1

    def run(self, memory: dict[int, np.ndarray], shared: dict[UOp, np.ndarray], block: int, thread: int):
        """One thread's run of the program, yielding True at each barrier. Its copies to shared memory (WIDE_COPY,
        CUDA's cp.async) land at its next barrier, as late as a GPU may land them, their destination all bits set
        (a NaN) until then: a program that reads a tile before the barrier after its copies, or copies into a tile
        other threads still read, computes NaNs, as it would race on a GPU."""
        values: dict[UOp, object] = {}
        accumulators: dict[UOp, object] = {}
        copies: list[tuple[np.ndarray, int, np.ndarray, int]] = []  # (destination, start, source, count)

        def value(node: UOp):
            return node.arg if node.op is Ops.CONST else values[node]

        counter, program = 0, self.program
        while counter < len(program):
            node = program[counter]
            op, src = node.op, node.src
            if op is Ops.RANGE:
                values[node] = 0
                if src[0].arg <= 0:
                    counter = self.loop_end[counter]
            elif op is Ops.ENDRANGE:
                loop = src[0]
                values[loop] += 1
                if values[loop] < loop.src[0].arg:
                    counter = self.loop_start[counter]
            elif op is Ops.SPECIAL:
                values[node] = block if node.arg[0] == "block" else thread
            elif op is Ops.DEFINE_LOCAL:
                shared.setdefault(node, np.zeros(node.arg[1], node.dtype.np))
            elif op is Ops.BARRIER:  # (the thread's copies land first: a CUDA kernel waits for them there)
                for to, start, source, count in copies:
                    to[:] = source[start : start + count]
                copies.clear()
                yield True
            elif op is Ops.SHUFFLE:  # (every thread puts its value out, then reads its partner's once all have)
                exchange = shared.setdefault(node, {})
                exchange[thread] = value(src[0])
                yield True
                values[node] = exchange[shuffle_partner(self.name, thread, value(src[1]), len(exchange))]
                yield True
            elif op is Ops.DEFINE_ACC:
                accumulators[node] = node.arg[0]
            elif op is Ops.LOAD and src[0].op is Ops.DEFINE_ACC:
                values[node] = accumulators[src[0]]
            elif op is Ops.STORE and src[0].op is Ops.DEFINE_ACC:
                accumulators[src[0]] = value(src[1])
            elif op is Ops.LOAD:
                if node in self.wide:
                    check_wide(self.name, value(src[1]), self.wide[node])
                local = src[0].op is Ops.DEFINE_LOCAL  # (its third source is the barrier it waits for)
                buffer = shared[src[0]] if local else memory[src[0].arg[0]]
                valid = local or len(src) < 3 or value(src[2])
                if valid:
                    values[node] = buffer[inside(self.name, value(src[1]), buffer.size)].item()
                else:
                    values[node] = node.dtype.np.type(0).item()
                values[node] = cast_value(values[node], node.dtype)
            elif op is Ops.WIDE_COPY:  # (it lands at the next barrier, all bits set until then: see `run`)
                if len(src) < 5 or value(src[4]):
                    if value(src[1]) % node.arg or value(src[3]) % node.arg:  # (its elements' bytes, as a GPU needs)
                        raise RuntimeError(
                            f"{self.name}: a copy of {node.arg * src[0].dtype.itemsize} bytes at an address that is "
                            "not a multiple of its size"
                        )
                    to = shared[src[0]][value(src[1]) : value(src[1]) + node.arg]
                    to.view(np.uint8)[:] = 0xFF
                    copies.append((to, value(src[3]), memory[src[2].arg[0]], node.arg))
            elif op is Ops.WMMA:
                # (no accumulator: the product is the whole reduce)
                added = value(src[WMMA_SOURCES]) if len(src) > WMMA_SOURCES else 0.0
                check_tile(self.name, value(src[2]), node.arg[5], src[0].dtype.itemsize)
                check_tile(self.name, value(src[3]), node.arg[6], src[1].dtype.itemsize)
                tiles = shared[src[0]][value(src[2]) :], shared[src[1]][value(src[3]) :]
                values[node] = multiply_accumulate(node.arg, *tiles, added)
            elif op is Ops.STORE and isinstance(value(src[2]), np.ndarray):
                # a warp's store of its accumulator (row-major): each of its threads stores every 32nd value
                check_tile(self.name, value(src[1]), value(src[2]).shape[1], src[0].dtype.itemsize)
                start, fragment = value(src[1]) + thread % WARP, value(src[2]).reshape(-1)
                shared[src[0]][start : start + fragment.size : WARP] = fragment[thread % WARP :: WARP]
            elif op is Ops.STORE:
                if node in self.wide:
                    check_wide(self.name, value(src[1]), self.wide[node])
                buffer = shared[src[0]] if src[0].op is Ops.DEFINE_LOCAL else memory[src[0].arg[0]]
                if len(src) < 4 or value(src[3]):
                    buffer[inside(self.name, value(src[1]), buffer.size)] = value(src[2])
            elif op is Ops.CAST:
                values[node] = cast_value(value(src[0]), node.dtype)
            elif op is Ops.BITCAST:
                values[node] = np.array(value(src[0]), dtype=src[0].dtype.np).view(node.dtype.np).item()
            elif op is not Ops.DEFINE_GLOBAL and op is not Ops.PREFETCH:  # (a PREFETCH: its copies run)
                values[node] = exec_alu(op, node.dtype, [value(s) for s in src])
            counter += 1


def check_wide(name: str, index, lanes: int) -> None:
    """A wide access (a float4's) must start at a multiple of its lanes, so that its bytes are aligned to their size
    as a GPU requires (cuda_shim.h checks the same)."""
    index = np.asarray(index)
    misaligned = index[index % lanes != 0]
    if misaligned.size:
        raise RuntimeError(f"{name}: a wide access of {lanes} elements at element {misaligned[0]}, not a multiple")


def check_tile(name: str, start: int, stride: int, itemsize: int) -> None:
    """A tensor-core tile's first element must be 32-byte aligned and its rows a multiple of 16 bytes apart, as
    CUDA's load_matrix_sync and store_matrix_sync require (cuda_shim.h checks the same)."""
    if start * itemsize % 32 or stride * itemsize % 16:
        raise RuntimeError(
            f"{name}: a tensor-core tile at byte {start * itemsize} of its memory, its rows {stride * itemsize} bytes "
            "apart: a GPU needs a multiple of 32 bytes and of 16"
        )


def shuffle_partner(name: str, thread, lane, threads: int):
    """The thread (or threads: arrays) of a block a SHUFFLE at `thread` reads: `lane` within the thread's warp, as a
    GPU reads it; an error where that is past the block's `threads`, a thread no GPU would have."""
    partner = (thread & ~(WARP - 1)) + (lane & (WARP - 1))
    if np.any(partner >= threads):
        raise RuntimeError(f"{name}: a shuffle reads a lane past the block's {threads} threads")
    return partner


LOCKSTEP_THREADS = 1 << 15  # threads run together, at most (each value an array over them)


def gather(name: str, buffer: np.ndarray, index, valid) -> np.ndarray:
    """Each thread's element of `buffer` at its `index`, or 0 where its `valid` is false (its index unread)."""
    if valid is None:
        return np.asarray(buffer[inside(name, index, buffer.size)])
    index, valid = np.broadcast_arrays(index, valid)
    if not valid.any():  # (a buffer of no elements is only ever read masked)
        return np.zeros(index.shape, buffer.dtype)
    return np.where(valid, buffer[inside(name, np.where(valid, index, 0), buffer.size)], buffer.dtype.type(0))


def inside(name: str, index, size: int):
    """`index` (one, or each thread's), where every one lies within a buffer of `size` elements: past either end a
    GPU reads or writes other memory, or faults (and NumPy would take a negative index from the end)."""
    if isinstance(index, np.ndarray):
        if not index.size:  # (every thread's access gated off)
            return index
        low, high = index.min(), index.max()
    else:
        low = high = index
    if low < 0 or high >= size:
        raise RuntimeError(f"{name}: an access at element {low if low < 0 else high} of a buffer of {size} elements")
    return index


class SharedMemory:
    """The memory each block of a lockstep run shares, and which of its threads wrote and read each element since
    the last barrier (a bit per thread), to find the accesses a missing barrier leaves unordered."""

    def __init__(self, blocks: int, size: int, dtype: np.dtype):
        self.values = np.zeros((blocks, size), dtype)
        self.writers = np.zeros((blocks, size), np.uint64)
        self.readers = np.zeros((blocks, size), np.uint64)

    def synchronize(self) -> None:
        self.writers[:] = 0
        self.readers[:] = 0

    def load(self, name: str, rows: np.ndarray, index, bit: np.ndarray) -> np.ndarray:
        rows, index, bit = np.broadcast_arrays(rows, inside(name, index, self.values.shape[1]), bit)
        if np.any(self.writers[rows, index] & ~bit):
            raise RuntimeError(
                f"{name}: a thread reads shared memory that another thread of its block wrote since the last "
                "barrier: a barrier is missing between the store and this load"
            )
        np.bitwise_or.at(self.readers, (rows, index), bit)
        return self.values[rows, index]

    def store(self, name: str, rows: np.ndarray, index, stored, gate, bit: np.ndarray) -> None:
        rows, index, stored, gate, bit = np.broadcast_arrays(rows, index, stored, gate, bit)
        rows, index, stored, bit = rows[gate], inside(name, index[gate], self.values.shape[1]), stored[gate], bit[gate]
        if np.any(self.readers[rows, index] & ~bit):
            raise RuntimeError(
                f"{name}: a thread writes shared memory that another thread of its block read since the last "
                "barrier: a barrier is missing between that load and this store"
            )
        np.bitwise_or.at(self.writers, (rows, index), bit)
        self.values[rows, index] = stored


def tile_values(memory: np.ndarray, rows: int, columns: int, layout: str, ldm: int) -> np.ndarray:
    """A tile of a tensor-core input from shared memory as float32 (bfloat16 is held as its bits, float32 is
    rounded to TF32 as the tensor core reads it), rows × columns, its rows (row layout) or columns `ldm` apart."""
    if memory.dtype == np.uint16:
        values = (memory.astype(np.uint32) << 16).view(np.float32)
    elif memory.dtype == np.float32:
        values = tf32(memory)
    else:
        values = memory.astype(np.float32)
    if layout == "row":
        return values[np.arange(rows)[:, None] * ldm + np.arange(columns)]
    return values[np.arange(columns)[:, None] * ldm + np.arange(rows)].T


def tf32(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10 mantissa bits, to nearest with ties away from zero (CUDA's
    __float_to_tf32); infinities and NaN stay as they are."""
    bits = values.view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = np.where(finite, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000), bits)
    return rounded.astype(np.uint32).view(np.float32)


def multiply_accumulate(shape: tuple, memory_a: np.ndarray, memory_b: np.ndarray, accumulator) -> np.ndarray:
    """A tensor core's d = a·b + c on tiles in shared memory, each thread holding the whole fragment: the exact
    products summed into c in float32, in order along k (as cuda_shim.h does)."""
    m, n, k, layout_a, layout_b, ldm_a, ldm_b = shape
    a, b = tile_values(memory_a, m, k, layout_a, ldm_a), tile_values(memory_b, k, n, layout_b, ldm_b)
    result = np.full((m, n), accumulator, np.float32) if np.isscalar(accumulator) else accumulator.copy()
    for step in range(k):
        result += np.outer(a[:, step], b[step, :])  # (products of 11-bit mantissas are exact in float32)
    return result


def open_device() -> Compiled:
    return Compiled("PYTHON", HostAllocator(), PythonRenderer(), PythonCompiler(), PythonProgram)
