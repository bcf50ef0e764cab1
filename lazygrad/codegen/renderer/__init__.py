"""Renderers: a linear program (list of UOps) becomes source text for one language."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

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
    """The memory a host device's kernel runner shares with its worker threads while it replays a captured step
    (see device.HostGraph): 64-bit words, each group on a cache line of its own, at these word numbers.

    The runner shares a kernel only once every worker is `ready` (a worker that is still starting is not waited
    for: the runner runs the kernel alone): it writes the `job` (function, array of buffer addresses, end of the
    outer loop, chunk size), sets `next` to 0 and then `epoch` to its next number. Each worker waits for `epoch` to
    change, then the runner and the workers take chunks of the outer loop by atomic adds on `next` until none is left;
    a worker writes the epoch it finished to its `done` word, and the runner waits for every `done` word before the
    next kernel. `stop` ends the workers' wait. (`spins` is not a word: see below.)"""

    epoch: int = 0
    next: int = 8
    job: int = 16  # four words: function, buffers, outer loop's end, chunk
    stop: int = 24
    ready: int = 32
    workers: int = 40  # how many workers the runner waits for
    done: int = 48  # worker w's word is done + 8 * w
    # the words per kernel in the runner's table: function, array of buffer addresses, end of the outer loop, and
    # the size of the chunks the outer loop is shared in (0: the kernel runs whole on the runner's thread)
    table: int = 4
    # a wait spins this many times (a pause each, ~100 cycles) before it gives the core away at each try: a thread
    # it waits for may need the core (more threads than cores, another process)
    spins: int = 32

    def words(self, workers: int) -> int:
        return self.done + 8 * workers


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


@dataclass(frozen=True)
class Target:
    """What the optimization heuristics know of the device a renderer writes for."""

    vector_width: int = 16  # floats in a vector register (1: the renderer computes in scalars)
    vector_registers: int = 32
    # devices with threads (GPUs, OpenCL): the most threads a block may have (0: none, a CPU: output loops stay
    # loops, the outermost split across the cores), the threads per block heuristics aim for, and the bytes of
    # memory the threads of a block share
    max_threads: int = 0
    block_threads: int = 0
    shared_memory: int = 0
    tensor_cores: tuple[TensorCore, ...] = ()  # the warp-level matrix operations the device has (codegen's TC)
    # a CPU: the bytes of the stack buffers a kernel may copy an input into (codegen's PACK; 0: none), about half
    # of a core's L2 cache, where the copy stays while the loops inside read it again and again
    pack_bytes: int = 0


class Renderer(ABC):
    """Turns a linear program into source text. `rewrites` are rules the kernel graph goes through first, for ops
    this language has no good form of (e.g. polynomial exp2/log2/sin where the built-ins do not vectorize)."""

    rewrites: PatternMatcher | None = None
    target = Target()
    # True for a renderer with a `join(sources) -> source` that puts several kernels into one compile
    can_join = False
    team = TEAM  # where a host device's kernel runner and its workers share their state (its `render_kernel_runner`)

    def __init__(self, target: Target | None = None):
        if target is not None:
            self.target = target

    @abstractmethod
    def render(self, name: str, program: list[UOp]) -> str:
        """The source of a function called `name` running `program`."""

    def join_group(self, source: str) -> object:
        """For a renderer that can join sources: kernels are joined into one compile only where this is equal."""
        return None
