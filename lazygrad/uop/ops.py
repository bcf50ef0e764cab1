"""The UOp: an immutable, interned node `(op, dtype, src, arg)` that every stage of lazygrad is written in."""

from __future__ import annotations

import functools
import hashlib
import math
import weakref
from typing import Any, Callable

import numpy as np

from lazygrad.dtype import DType, dtypes, round_bfloat16
from lazygrad.helpers import Kinds, auto, prod


class Ops(Kinds):
    """Every kind of UOp. Tensor graphs use the first groups; kernels add the last ones."""

    # data
    BUFFER = auto()  # arg: (unique id, size, device), and for a random source the count it covers
    CONST = auto()  # arg: the Python value
    COPY = auto()  # arg: the target device
    CONTIGUOUS = auto()
    DETACH = auto()  # the same value, with no gradient flowing through
    # src: (value, input): the value, whose gradient goes to the input as the arg (a UOp: the value's derivative
    # by the input) times the value's own
    SLOPE = auto()
    ASSIGN = auto()  # src: (target, value)
    # unary
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    COS = auto()
    SQRT = auto()
    RECIP = auto()
    NEG = auto()
    CAST = auto()
    BITCAST = auto()  # the same bits read as another dtype of the same size
    # binary
    ADD = auto()
    MUL = auto()
    MAX = auto()
    CMPLT = auto()
    CMPNE = auto()
    IDIV = auto()  # integers' division, truncated toward zero
    FDIV = auto()  # floats' true division, correctly rounded (IEEE 754's)
    MOD = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    # ternary
    WHERE = auto()
    # reduce: arg (Ops.ADD | Ops.MUL | Ops.MAX, axes)
    REDUCE = auto()
    # the integers 0..n-1 (arg n): the counter that arange, eye and random numbers are built from
    ARANGE = auto()
    # movement: arg describes the view change
    RESHAPE = auto()
    PERMUTE = auto()
    EXPAND = auto()
    PAD = auto()
    SHRINK = auto()
    FLIP = auto()
    # kernels
    SINK = auto()
    DEFINE_GLOBAL = auto()  # arg: parameter number
    RANGE = auto()  # src: (end,), arg: (axis number, LoopKind)
    LOAD = auto()  # src: (buffer, index[, valid]), (shared buffer, index, barrier) or (accumulator, *ranges)
    STORE = auto()  # src: (buffer, index, value[, gate]) or (accumulator, value)
    RANGE_REDUCE = auto()  # src: (value, *ranges), arg: Ops.ADD | Ops.MAX
    DEFINE_ACC = auto()  # arg: (identity value, number)
    ENDRANGE = auto()  # src: (range,)
    # threads (see codegen/threads.py)
    SPECIAL = auto()  # this thread's block or thread index; arg: ("block" | "thread", how many there are)
    DEFINE_LOCAL = auto()  # memory shared by the threads of a block (on a CPU: on the stack); arg: (number, size)
    BARRIER = auto()  # every thread of the block waits here until all have made the stores in src
    # the value src[0] has in the thread of the same warp whose thread index is src[1] (modulo the warp's size); every
    # thread of the block reads at once, as at a barrier, but through no memory
    SHUFFLE = auto()
    # a warp's matrix multiply-accumulate on tensor cores (see codegen/tensor_cores.py); src: (shared A, shared B,
    # the offsets of the warp's tiles in them, the barrier after their copies or the PREFETCH made after that
    # barrier[, the accumulator added to, once linearized in a reduce]); arg: (m, n, k, A's layout, B's layout, A's
    # ldm, B's ldm), a layout "row" or "col", an ldm the elements from one row (row layout) or column (col layout) of
    # the tile to the next
    WMMA = auto()
    # a thread's copy of `arg` consecutive elements (16, 8 or 4 bytes, aligned) from device memory into shared
    # memory, as one load and one store; src: (shared buffer, index, buffer, index[, gate])
    WIDE_COPY = auto()
    # copies into shared memory for the next iteration of the loop they are made in, while the block computes on
    # what an earlier barrier made ready (double buffering); src: (that barrier, *the copies). They land by the
    # block's next barrier, and nothing reads them before it
    PREFETCH = auto()


WMMA_SOURCES = 5  # a WMMA's sources before the accumulator a linearized one adds into


class LoopKind(Kinds):
    """What a loop (RANGE) of a kernel is for."""

    GLOBAL = auto()  # an output loop
    REDUCE = auto()  # a loop a reduce runs over
    # a reduce loop computed several iterations at a time in vector lanes: by the compiler's vectorizer on a CPU (the
    # inputs are contiguous along it), in the vector types of a renderer that has them (OpenCL) on a device with threads
    VECTOR_REDUCE = auto()
    LOCAL = auto()  # an output loop whose iterations are the threads of a block (on devices with threads)
    LOOP = auto()  # an output loop that stays a loop inside each thread (devices with threads map the others)
    PACK = (
        auto()
    )  # a loop that copies an input into a buffer on the stack (codegen's PACK), before the loops reading it
    SCATTER = auto()  # a loop opened around its stores only, inside the output loops (codegen's SCATTER, PIECES)
    VECTOR = auto()  # a LOOP computed several iterations at a time in vector lanes (a renderer with vector types)


# loops over the outputs, not a reduce
OUTPUT_KINDS = frozenset({LoopKind.GLOBAL, LoopKind.LOCAL, LoopKind.LOOP, LoopKind.VECTOR})


UNARY = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.SQRT, Ops.RECIP, Ops.NEG}
BINARY = {
    Ops.ADD,
    Ops.MUL,
    Ops.MAX,
    Ops.CMPLT,
    Ops.CMPNE,
    Ops.IDIV,
    Ops.FDIV,
    Ops.MOD,
    Ops.AND,
    Ops.OR,
    Ops.XOR,
    Ops.SHL,
    Ops.SHR,
}
ALU = UNARY | BINARY | {Ops.WHERE}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
MOVEMENT = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
COMPARISON = {Ops.CMPLT, Ops.CMPNE}


def _const_key(arg: Any) -> Any:
    # 0.0 == -0.0 and True == 1 in Python; the type and the sign keep such constants apart. NaN equals nothing,
    # not even itself, so it gets a key that does (else every NaN constant would be a new node, and a new kernel).
    if arg is None or type(arg) is tuple:  # most nodes' args (shapes, axes): checked first, every node made asks
        return arg
    if isinstance(arg, float):
        return (float, "nan") if math.isnan(arg) else (float, arg, math.copysign(1.0, arg))
    if isinstance(arg, (bool, int)):
        return (type(arg), arg)
    return arg


def toposort(roots: list[UOp]) -> list[UOp]:
    """Every node reachable from `roots`, sources before users, roots in the order given."""
    order: list[UOp] = []
    visited: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(root, False) for root in reversed(roots)]
    push = stack.append
    while stack:
        node, sources_done = stack.pop()
        if sources_done:
            order.append(node)
            continue
        if node in visited:
            continue
        visited.add(node)
        push((node, True))
        # a plain loop: a generator expression here costs twice as much (this is a hot path)
        for source in reversed(node.src):
            if source not in visited:
                push((source, False))
    return order


_MISSING = object()  # a cached fact not computed yet (None is a fact: the shape of a kernel node)


class _InternRef(weakref.ref):
    """A weak reference to an interned node that carries its key. (weakref.KeyedRef does the same, but through a
    Python __new__ and __init__ on every node made: here both are weakref's own, and the key is set after.)"""

    __slots__ = ("key",)


# structural key -> weak reference to the one node with it (a plain dict of weak references: a WeakValueDictionary
# does the same with more Python per call, and node creation is the hottest path of graph building)
_interned: dict[tuple, _InternRef] = {}


def _forget(reference: _InternRef) -> None:
    """Drop a dead node's entry (unless a new node with the same key took the place already)."""
    if _interned.get(reference.key) is reference:
        del _interned[reference.key]


class UOp:
    """An immutable graph node. Structurally equal UOps are the same object, so `is`/`==` is structural equality."""

    __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")

    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        # (`_const_key` inlined for the args most nodes have: every node made asks)
        key = (op, dtype, src, arg if arg is None or type(arg) is tuple else _const_key(arg))
        if (reference := _interned.get(key)) is not None and (existing := reference()) is not None:
            return existing
        node = object.__new__(cls)
        _set_op(node, op)
        _set_dtype(node, dtype)
        _set_src(node, src)
        _set_arg(node, arg)
        reference = _interned[key] = _InternRef(node, _forget)
        reference.key = key
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("UOp is immutable")

    def __reduce__(self):
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __repr__(self) -> str:
        return f"UOp({self.op}, {self.dtype}, arg={self.arg!r}, src=<{len(self.src)}>)"

    def replace(self, **changes: Any) -> UOp:
        fields = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg} | changes
        return UOp(fields["op"], fields["dtype"], fields["src"], fields["arg"])

    # ---- graph facts ----------------------------------------------------------------------------------------

    @property
    def toposort(self) -> list[UOp]:
        """Every node reachable from this one, sources before users (computed without recursion). Not cached: a
        cached list would hold the node itself, and such a cycle would keep buffers alive until the next gc."""
        return toposort([self])

    def _derive(self, name: str, compute) -> Any:
        """A fact cached on each node, computed from the sources' facts; only nodes missing it are visited, so
        building a long graph node by node stays linear."""
        facts = self.__dict__
        if name in facts:
            return facts[name]
        for source in self.src:  # (a plain loop: the common case is a node built on known ones)
            if name not in source.__dict__:
                break
        else:
            fact = facts[name] = compute(self)
            return fact
        order: list[UOp] = []
        stack: list[tuple[UOp, bool]] = [(self, False)]
        pop, push = stack.pop, stack.append
        visited: set[UOp] = set()
        while stack:
            node, sources_done = pop()
            if sources_done:
                order.append(node)
            elif node not in visited and name not in node.__dict__:
                visited.add(node)
                push((node, True))
                for source in node.src:
                    if name not in source.__dict__:
                        push((source, False))
        for node in order:
            node.__dict__[name] = compute(node)
        return facts[name]

    @property
    def key(self) -> bytes:
        """A content hash, stable across processes (used as the compile-cache key)."""

        def digest(node: UOp) -> bytes:
            hasher = hashlib.sha256(repr((node.op, node.dtype, node.arg)).encode())
            for source in node.src:
                hasher.update(source.__dict__["key"])
            return hasher.digest()

        return self._derive("key", digest)

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The shape of a tensor-graph node; None for kernel nodes."""
        facts = self.__dict__
        cached = facts.get("shape", _MISSING)  # (read on every op built: the cached case first, inline)
        if cached is not _MISSING:
            return cached
        for source in self.src:  # (then a node built on known ones, inline too: `_derive` walks for the rest)
            if "shape" not in source.__dict__:
                return self._derive("shape", _shape_of)
        shape = facts["shape"] = _shape_of(self)
        return shape

    def device(self, default: str) -> str:
        """The device this node's value is computed on: that of the buffers below it, a COPY below it counting
        as its target device (`default` for a graph with neither, such as a constant)."""
        stack, seen = list(self.src) if self.op is Ops.COPY else [self], set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.op is Ops.COPY:
                return node.arg
            if node.op is Ops.BUFFER:
                return node.arg[2]
            stack.extend(node.src)
        return default

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def base(self) -> UOp:
        """The node below any movement ops."""
        node = self
        while node.op in MOVEMENT:
            node = node.src[0]
        return node

    # ---- building ---------------------------------------------------------------------------------------------

    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        # the common case first: an int that the integer dtype holds as it is (index math makes many, the same few
        # again and again: those are kept, a dict look-up instead of a range check, an interning key and its look-up)
        if type(value) is int:
            if (node := _int_consts.get((dtype, value))) is not None:
                return node
            if (limits := _int_limits(dtype)) is not None and limits[0] <= value <= limits[1]:
                node = UOp(Ops.CONST, dtype, (), value)
                if len(_int_consts) < INT_CONSTS_KEPT:
                    _int_consts[(dtype, value)] = node
                return node
        return UOp(Ops.CONST, dtype, (), cast_python(value, dtype))

    def const_like(self, value: Any) -> UOp:
        return UOp.const(self.dtype, value)

    def alu(self, op: Ops, *sources: UOp) -> UOp:
        out_dtype = dtypes.bool if op in COMPARISON else (sources[-1].dtype if op is Ops.WHERE else self.dtype)
        return UOp(op, out_dtype, (self, *sources))

    def _operand(self, other: UOp | int | float | bool) -> UOp:
        return other if isinstance(other, UOp) else self.const_like(other)

    def __add__(self, other):
        return self.alu(Ops.ADD, self._operand(other))

    def __radd__(self, other):
        return self._operand(other).alu(Ops.ADD, self)

    def __mul__(self, other):
        return self.alu(Ops.MUL, self._operand(other))

    def __rmul__(self, other):
        return self._operand(other).alu(Ops.MUL, self)

    def __sub__(self, other):
        return self + (-self._operand(other))

    def __neg__(self):
        return self * -1 if self.dtype.is_int else self.alu(Ops.NEG)

    def __floordiv__(self, other):
        return self.alu(Ops.IDIV, self._operand(other))

    def __mod__(self, other):
        return self.alu(Ops.MOD, self._operand(other))

    def __truediv__(self, other):
        """Float division; by a constant power of two whose reciprocal the dtype holds, the multiply by that
        reciprocal: the exact quotient and the exact product are one number, so both round to the same float, and a
        multiply is the cheaper op (which fusion decisions and codegen see alike)."""
        divisor = self._operand(other)
        moves, constant = [], divisor
        while constant.op in (Ops.RESHAPE, Ops.EXPAND):  # (a number is a constant reshaped and expanded to a shape)
            moves.append((constant.op, constant.arg))
            constant = constant.src[0]
        if constant.op is not Ops.CONST or (reciprocal := exact_reciprocal(constant.arg, self.dtype)) is None:
            return self.alu(Ops.FDIV, divisor)
        factor = UOp.const(constant.dtype, reciprocal)
        for op, arg in reversed(moves):
            factor = UOp(op, factor.dtype, (factor,), arg)
        return self * factor

    def lt(self, other):
        return self.alu(Ops.CMPLT, self._operand(other))

    def ne(self, other):
        return self.alu(Ops.CMPNE, self._operand(other))

    def logical_and(self, other):
        return self.alu(Ops.AND, self._operand(other))

    def where(self, true_value: UOp, false_value: UOp) -> UOp:
        return self.alu(Ops.WHERE, true_value, false_value)

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    # ---- value ranges (for index simplification) ------------------------------------------------------------

    @property
    def bounds(self) -> tuple[Any, Any]:
        """The smallest and largest value an integer/bool node can take (the dtype's limits when unknown)."""
        return self._derive("bounds", _bounds_of)

    @property
    def vmin(self):
        return self.bounds[0]

    @property
    def vmax(self):
        return self.bounds[1]


def cast_python(value: Any, dtype: DType) -> Any:
    """A Python scalar converted as `dtype` would hold it (ints wrap around, floats round through NumPy)."""
    kind = dtype.kind
    if kind == "float":  # (the most common case first: every float constant of a float graph)
        if dtype is dtypes.bfloat16:
            return round_bfloat16(value)
        if -65504.0 <= value <= 65504.0:  # representable in every float dtype: no overflow to silence (the slow part)
            return float(dtype.np.type(value))
        with np.errstate(over="ignore", invalid="ignore"):
            return float(dtype.np.type(value))
    if kind == "bool":
        return bool(value)
    if kind in ("int", "uint"):
        if isinstance(value, float) and not math.isfinite(value):
            return 0
        return wrap_int(int(value), dtype)
    return value


def exact_reciprocal(value: Any, dtype: DType) -> float | None:
    """1 / value, where value is a power of two and the float dtype holds its reciprocal exactly; else None."""
    if dtype not in (dtypes.float16, dtypes.float32, dtypes.float64) or not isinstance(value, (int, float)):
        return None
    if not (math.isfinite(value) and value != 0 and abs(math.frexp(value)[0]) == 0.5):
        return None
    reciprocal = 1 / value
    return reciprocal if cast_python(reciprocal, dtype) == reciprocal else None


def wrap_int(value: int, dtype: DType) -> int:
    """Two's-complement wrap-around of a Python int to `dtype`'s width."""
    value &= (1 << dtype.bits) - 1
    if not dtype.is_unsigned and value >= 1 << (dtype.bits - 1):
        value -= 1 << dtype.bits
    return value


# integer constants made so far (see UOp.const), by dtype and value; the first INT_CONSTS_KEPT stay alive
_int_consts: dict[tuple[DType, int], UOp] = {}
INT_CONSTS_KEPT = 4096


@functools.cache
def _int_limits(dtype: DType) -> tuple[int, int] | None:
    """The range of an integer dtype (None for others)."""
    return dtype_limits(dtype) if dtype.is_int else None


@functools.cache
def dtype_limits(dtype: DType) -> tuple[Any, Any]:
    if dtype == dtypes.bool:
        return False, True
    if dtype.is_int:
        return (0, 2**dtype.bits - 1) if dtype.is_unsigned else (-(2 ** (dtype.bits - 1)), 2 ** (dtype.bits - 1) - 1)
    return -math.inf, math.inf


def _bounds_of(node: UOp) -> tuple[Any, Any]:
    if node.op is Ops.CONST:
        return node.arg, node.arg
    if node.op is Ops.RANGE:
        return 0, node.src[0].vmax - 1
    if node.op is Ops.SPECIAL:
        return 0, node.arg[1] - 1
    if not (node.dtype.is_int or node.dtype == dtypes.bool) or not node.src:
        return dtype_limits(node.dtype)
    limits = dtype_limits(node.dtype)
    (a_min, a_max) = node.src[0].bounds
    if len(node.src) > 1:
        (b_min, b_max) = node.src[1].bounds
    if node.op is Ops.ADD:
        low, high = a_min + b_min, a_max + b_max
    elif node.op is Ops.MUL:
        corners = [a_min * b_min, a_min * b_max, a_max * b_min, a_max * b_max]
        low, high = min(corners), max(corners)
    elif node.op is Ops.IDIV and b_min == b_max and b_min > 0:
        low, high = _floordiv_toward_zero(a_min, b_min), _floordiv_toward_zero(a_max, b_min)
    elif node.op is Ops.MOD and b_min == b_max and b_min > 0:
        low, high = (0 if a_min >= 0 else -(b_min - 1)), (b_min - 1 if a_max > 0 else 0)
        if 0 <= a_min and a_max < b_min:
            low, high = a_min, a_max
    elif node.op is Ops.MAX:
        low, high = max(a_min, b_min), max(a_max, b_max)
    elif node.op is Ops.CMPLT:
        low, high = a_max < b_min, a_min < b_max
    elif node.op is Ops.CMPNE:
        low, high = (a_max < b_min or b_max < a_min), not (a_min == a_max == b_min == b_max)
    elif node.op is Ops.AND and node.dtype == dtypes.bool:
        low, high = a_min and b_min, a_max and b_max
    elif node.op is Ops.AND and a_min >= 0 and b_min >= 0:  # (a group reduction's lanes and partners)
        low, high = 0, min(a_max, b_max)
    elif node.op in (Ops.OR, Ops.XOR) and a_min >= 0 and b_min >= 0:  # (bits up to the higher one's top bit)
        low, high = (max(a_min, b_min) if node.op is Ops.OR else 0), (1 << max(a_max, b_max).bit_length()) - 1
    elif node.op is Ops.NEG and node.dtype != dtypes.bool:
        low, high = -a_max, -a_min
    elif node.op is Ops.SHUFFLE:
        low, high = a_min, a_max
    elif node.op is Ops.WHERE:
        (c_min, c_max) = node.src[2].bounds
        if a_min == a_max:
            return (b_min, b_max) if a_min else (c_min, c_max)
        low, high = min(b_min, c_min), max(b_max, c_max)
    elif node.op is Ops.CAST and node.src[0].dtype.is_int and node.dtype == dtypes.bool:
        # true wherever the value is not 0: always where 0 is out of its range, never where it is 0 alone
        low, high = not a_min <= 0 <= a_max, not a_min == a_max == 0
    elif node.op is Ops.CAST and node.src[0].dtype.is_int:
        low, high = a_min, a_max
    else:
        return limits
    if node.dtype == dtypes.bool:
        return bool(low), bool(high)
    if low < limits[0] or high > limits[1]:
        return limits
    return low, high


def _floordiv_toward_zero(a: int, b: int) -> int:
    # kernels divide integers like C: the quotient is truncated toward zero
    return abs(a) // b * (1 if a >= 0 else -1)


def _shape_of(node: UOp) -> tuple[int, ...] | None:
    # (a table by op: this runs for every tensor-graph node made; its sources' shapes are known, cached facts)
    rule = _SHAPE_RULES.get(node.op)
    return None if rule is None else rule(node)


def _source_shape(node: UOp) -> tuple[int, ...] | None:
    return node.src[0].__dict__["shape"]


def _reduced_shape(node: UOp) -> tuple[int, ...]:
    axes = node.arg[1]
    return tuple([1 if axis in axes else size for axis, size in enumerate(node.src[0].__dict__["shape"])])


_SHAPE_RULES: dict[Ops, Callable[[UOp], tuple[int, ...] | None]] = {
    **dict.fromkeys(
        (*ALU, Ops.CAST, Ops.BITCAST, Ops.FLIP, Ops.CONTIGUOUS, Ops.DETACH, Ops.SLOPE, Ops.COPY, Ops.ASSIGN),
        _source_shape,
    ),
    Ops.WHERE: lambda node: node.src[1].__dict__["shape"],
    Ops.BUFFER: lambda node: (node.arg[1],),
    Ops.DEFINE_GLOBAL: lambda node: (node.arg[1],),
    Ops.CONST: lambda node: (),
    Ops.ARANGE: lambda node: (node.arg,),
    Ops.RESHAPE: lambda node: node.arg,
    Ops.EXPAND: lambda node: node.arg,
    Ops.PERMUTE: lambda node: tuple([node.src[0].__dict__["shape"][axis] for axis in node.arg]),
    Ops.PAD: lambda node: tuple(
        [size + before + after for size, (before, after) in zip(node.src[0].__dict__["shape"], node.arg)]
    ),
    Ops.SHRINK: lambda node: tuple([end - start for start, end in node.arg]),
    Ops.REDUCE: _reduced_shape,
}


# the slots' own setters: UOp.__setattr__ refuses every assignment, so nodes are filled in through these
_set_op, _set_dtype, _set_src, _set_arg = (getattr(UOp, name).__set__ for name in ("op", "dtype", "src", "arg"))
