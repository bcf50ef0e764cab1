"""Renderers: a linear program (list of UOps) becomes source text for one language."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from lazygrad.codegen.vectorize import Lanes
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.ops import OUTPUT_KINDS, Ops, UOp
from lazygrad.uop.pattern import PatternMatcher


def kernel_name(program: list[UOp]) -> str:
    """A readable name: `r_` for kernels with a reduce loop, `E_` for elementwise ones, then the sizes of the block
    and thread indices and of the loops."""
    loops = [node for node in program if node.op is Ops.RANGE]
    sizes = [node.arg[1] for node in program if node.op is Ops.SPECIAL] + [loop.src[0].arg for loop in loops]
    prefix = "r" if any(loop.arg[1] not in OUTPUT_KINDS for loop in loops) else "E"
    return "_".join([prefix] + [str(size) for size in sizes]) if sizes else prefix + "_1"


@dataclass(frozen=True)
class TeamLayout:
    """The memory a host device's kernel runner shares with the worker threads that help it (see device.Team):
    64-bit words, each group on a cache line of its own, at these word numbers.

    For each kernel it shares, the runner writes the `job` (function, array of buffer addresses, end of the outer
    loop, chunk size), sets `next` to 0, then opens the kernel: `state` becomes the next epoch with no worker in it.
    A worker joins an open kernel by adding one to `state` (a compare-and-swap, so it cannot join one that closed
    meanwhile), and the runner and the workers in it take chunks of the outer loop by atomic adds on `next` until
    none is left; a worker then leaves (subtracts one). The runner, out of chunks, closes the kernel (sets the
    `closed` bit) and waits until every worker in it has left, before it writes the next job. A worker that starts
    late (a sleeping thread's wake-up takes tens of microseconds) just joins a later kernel, or none. The words stay
    from call to call: `idle` is set while no call runs, and a worker that then finds no kernel open for `linger`
    more tries returns (to sleep until a call wakes it); one that finds the next call's first kernel sooner joins it
    at once. (`table`, `spins` and `linger` are not words: see below.)"""

    state: int = 0  # epoch * `epoch_unit` + `closed` + the workers in the kernel
    next: int = 8
    job: int = 16  # four words: function, buffers, outer loop's end, chunk
    idle: int = 24
    words: int = 32
    closed: int = 1 << 16
    epoch_unit: int = 1 << 17
    # the words per kernel in the runner's table: function, array of buffer addresses, end of the outer loop, and
    # the size of the chunks the outer loop is shared in (0: the kernel runs whole on the runner's thread)
    table: int = 4
    # a wait spins this many times (a pause each, ~100 cycles) before it gives the core away at each try: a thread
    # it waits for may need the core (more threads than cores, another process)
    spins: int = 32
    # the tries a worker waits once a call has ended (each a yield of the core past the spins: 0.75 ms in all on a
    # 2-vCPU Zen 5) before it sleeps: a run of eager ops, one call each with Python between them, finds it awake
    linger: int = 2000


TEAM = TeamLayout()

WARP = 32  # the threads that hold a tensor core's fragments and make its operation together


@dataclass(frozen=True)
class TensorCore:
    """A matrix multiply-accumulate the `threads` of a warp make together: an (m × k) matrix of `input` values
    times a (k × n) one, added to an (m × n) accumulator of `accumulator` values."""

    dims: tuple[int, int, int]  # (m, n, k)
    input: DType
    accumulator: DType = dtypes.float32
    threads: int = WARP


SPLIT_REDUCE_LENGTH = 1 << 18  # the shortest reduce worth a kernel more to share it (see `Target.reduce_parts`)
# A GPU's blocks per multiprocessor that a split reduce aims for: 256 blocks of 256 threads, two on most of an H200's
# 132 multiprocessors, read a sum's 64 MB at 1.9 TB/s of its 4.8 (too few loads in flight to hide the memory's latency)
BLOCKS_PER_CORE = 8
PART_COUNTS = tuple(1 << bits for bits in range(12, 3, -1))  # the part counts to choose from, most first


@dataclass(frozen=True)
class Target:
    """What the optimization heuristics know of the device a renderer writes for."""

    vector_width: int = 16  # floats in a vector register (1: the renderer computes in scalars)
    vector_registers: int = 32
    fma: bool = True  # a fused multiply-add instruction (without one, LLVM's llvm.fma is a call of libm's fma)
    # devices with threads (GPUs, OpenCL): the most threads a block may have (0: none, a CPU: output loops stay
    # loops, the outermost split across the cores), the threads per block heuristics aim for, and the bytes of
    # memory the threads of a block share
    max_threads: int = 0
    block_threads: int = 0
    shared_memory: int = 0
    tensor_cores: tuple[TensorCore, ...] = ()  # the warp-level matrix operations the device has (codegen's TC)
    # the threads of a warp, which read each other's values by shuffles (SHUFFLE: a GROUP combines within a warp
    # without shared memory or barriers); 0: the device has no shuffles
    shuffle_lanes: int = 0
    # a thread's copy from device to shared memory (WIDE_COPY) goes on without it (CUDA's cp.async, compute
    # capability 8.0 and newer): it lands by the block's next barrier, and holds no registers meanwhile
    async_copies: bool = False
    # the bytes a thread reads or writes device memory in at once where the elements are consecutive and aligned to
    # that size (CUDA's float4: 16); a renderer computing in scalars splits the vector into its lanes (0: every
    # access one element)
    wide_bytes: int = 0
    # a CPU: the bytes of the stack buffers a kernel may copy an input into (codegen's PACK; 0: none), about half
    # of a core's L2 cache, where the copy stays while the loops inside read it again and again
    pack_bytes: int = 0
    # the processors that share a kernel's work: a CPU's cores (its outer loop's chunks), a GPU's multiprocessors
    # (its blocks). A reduce into fewer values than this is split so that all of them share it (`reduce_parts`)
    cores: int = 1

    def reduce_parts(self, outputs: int, length: int, rounds: bool = False) -> int:
        """Into how many parts the scheduler splits a reduce of `length` values into each of `outputs` (1: none). A
        kernel's cores share its outputs, so a long reduce into fewer outputs than cores reduces its parts first (a
        kernel with `outputs * parts` outputs), then the parts (a small kernel). A long reduce that `rounds` (a float
        sum or product) is split whatever its outputs: unsplit, each output's values go into one accumulator, whose
        rounding grows with the length (the mean of a million float32 values near 1000 was 0.9% off, where torch's
        cascaded sums are exact to 1e-7). A reduce whose length no part count divides is padded to one with its
        identity (a sum's zeros, a max's lowest value). At most 256 parts, or on a GPU enough for `BLOCKS_PER_CORE`
        blocks on each multiprocessor, each part at least 1024 values."""
        if length < SPLIT_REDUCE_LENGTH or (outputs >= self.cores and not rounds):
            return 1
        most = 256
        if self.max_threads and outputs < self.cores:
            most = max(most, BLOCKS_PER_CORE * self.cores // outputs)
        counts = [parts for parts in PART_COUNTS if parts <= most and length // parts >= 1024]
        return next((parts for parts in counts if length % parts == 0), counts[0])


class Renderer(ABC):
    """Turns a linear program into source text. `rewrites` are rules the kernel graph goes through first, for ops
    this language has no good form of (e.g. polynomial exp2/log2/sin where the built-ins do not vectorize)."""

    rewrites: PatternMatcher | None = None
    target = Target()
    # True for a renderer with a `join(sources) -> source` that puts several kernels into one compile
    can_join = False
    team = TEAM  # where a host device's kernel runner and its workers share their state (its `render_kernel_runner`)

    # Every float a*b + c (and c - a*b) is written as one fused multiply-add, whatever else reads a*b, in scalar and
    # in vector code. A compiler left to contract multiply-adds itself fuses one where the product has no other
    # reader, so two kernels that recompute a value could round it differently, and a max's gradient (which finds
    # the maximum by comparing the recomputed values with the stored one) could find none. (On a target without the
    # instruction, each is a product then a sum, in every kernel alike.) An accumulator's update acc + a*b only
    # changes the reduce's result, which no other kernel computes again: a renderer may leave those.
    fuses_accumulator_updates = True

    def __init__(self, target: Target | None = None):
        if target is not None:
            self.target = target

    def fused_product(self, node: UOp) -> tuple[int, bool] | None:
        """Which source of the float sum `node` is the product its fused multiply-add takes (the second if both are),
        and whether it is negated; None where `node` is no such sum (or an accumulator's update left alone)."""
        if node.op is not Ops.ADD or node.dtype not in (dtypes.float32, dtypes.float64):
            return None
        # (an update reads its accumulator inside its loops: a LOAD of it with the loops as sources)
        reads_inside = (s.op is Ops.LOAD and s.src[0].op is Ops.DEFINE_ACC and len(s.src) > 1 for s in node.src)
        if not self.fuses_accumulator_updates and any(reads_inside):
            return None
        for position in (1, 0):
            product = node.src[position]
            negated = product.op is Ops.NEG
            if (product.src[0] if negated else product).op is Ops.MUL:
                return position, negated
        return None

    def fused_operands(self, node: UOp) -> tuple[UOp, UOp, UOp, bool] | None:
        """(a, b, c, negated) of the float sum `node` that `fused_product` fuses: c + a*b, or c - a*b; else None."""
        if (fused := self.fused_product(node)) is None:
            return None
        position, negated = fused
        product = node.src[position].src[0] if negated else node.src[position]
        return product.src[0], product.src[1], node.src[1 - position], negated

    def fused_lanes(self, lanes: Lanes) -> tuple[Lanes, Lanes, Lanes, bool] | None:
        """(a, b, c, negated) of a computation's lanes that each lane's `fused_product` fuses. (Lanes of one op have
        the same op at each source in every lane, so every lane fuses the same source.)"""
        if lanes.kind != "op" or (fused := self.fused_product(lanes.nodes[0])) is None:
            return None
        position, negated = fused
        product = lanes.sources[position]
        if negated:  # (the negation, and then the product, are lanes of an op or one value in every lane)
            product = product.sources[0] if product.kind == "op" else Lanes("same", (product.nodes[0].src[0],))
        if product.kind == "same":
            a, b = (Lanes("same", (source,) * len(lanes.nodes)) for source in product.nodes[0].src)
        else:
            a, b = product.sources
        return a, b, lanes.sources[1 - position], negated

    @abstractmethod
    def render(self, name: str, program: list[UOp]) -> str:
        """The source of a function called `name` running `program`."""

    def dynamic_shared_bytes(self, program: list[UOp]) -> int:
        """The bytes of shared memory a launch of `program` asks for (0: the kernel declares all it uses)."""
        return 0

    def join_group(self, source: str) -> object:
        """For a renderer that can join sources: kernels are joined into one compile only where this is equal."""
        return None
