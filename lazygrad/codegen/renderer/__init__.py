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

    def __init__(self, target: Target | None = None):
        if target is not None:
            self.target = target

    @abstractmethod
    def render(self, name: str, program: list[UOp]) -> str:
        """The source of a function called `name` running `program`."""

    def join_group(self, source: str) -> object:
        """For a renderer that can join sources: kernels are joined into one compile only where this is equal."""
        return None
