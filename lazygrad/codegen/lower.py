"""Lowering: a kernel AST (tensor ops over DEFINE_GLOBAL parameters) becomes a kernel graph of loops and memory
accesses. Movement ops disappear here: each one turns the index tuple of its output into the index tuple of its
input (and PAD adds a validity condition), so they never copy."""

from __future__ import annotations

from lazygrad.codegen.lookup import collapse_lookups
from lazygrad.dtype import DType, dtypes
from lazygrad.uop.ops import ALU, LoopKind, Ops, UOp, dtype_limits
from lazygrad.uop.symbolic import simplify, simplify_gated_loads

INDEX = dtypes.index
REDUCE_IDENTITY = {Ops.ADD: 0, Ops.MUL: 1}


def index_const(value: int) -> UOp:
    return UOp.const(INDEX, value)


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= size
    return tuple(reversed(strides))


def flat_index(indices: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    total = index_const(0)
    for index, stride, size in zip(indices, strides_of(shape), shape):
        if size != 1:
            total = total + index * stride
    return simplify(total)


def reshaped_indices(
    indices: tuple[UOp, ...], shape: tuple[int, ...], source_shape: tuple[int, ...]
) -> tuple[UOp, ...]:
    """The indices into `source_shape` of the element at `indices` of its reshape to `shape`. Axes of size 1 aside,
    a reshape splits and merges runs of neighbouring axes: each run's indices are computed from the flat index of
    that run alone, and an axis the reshape keeps is its own index. (Where a pad's validity fails, an index may lie
    outside its axis and this differs from the flat index of all axes; the value read there is never used.)"""
    if 0 in shape:
        return tuple(index_const(0) for _ in source_shape)
    inner = [index_const(0)] * len(source_shape)
    outer_axes = [axis for axis, size in enumerate(shape) if size != 1]
    inner_axes = [axis for axis, size in enumerate(source_shape) if size != 1]
    while outer_axes:
        outer, inner_run = [outer_axes.pop(0)], [inner_axes.pop(0)]
        outer_size, inner_size = shape[outer[0]], source_shape[inner_run[0]]
        while outer_size != inner_size:  # grow the smaller side until the run's sizes agree
            if outer_size < inner_size:
                outer.append(outer_axes.pop(0))
                outer_size *= shape[outer[-1]]
            else:
                inner_run.append(inner_axes.pop(0))
                inner_size *= source_shape[inner_run[-1]]
        if len(outer) == 1 and len(inner_run) == 1:
            inner[inner_run[0]] = indices[outer[0]]
            continue
        flat = flat_index(tuple(indices[axis] for axis in outer), tuple(shape[axis] for axis in outer))
        sizes = tuple(source_shape[axis] for axis in inner_run)
        for axis, stride, size in zip(inner_run, strides_of(sizes), sizes):
            inner[axis] = simplify((flat // stride) % size)
    return tuple(inner)


def reduce_identity(op: Ops, dtype: DType) -> object:
    """The value a reduction starts from: 0 for sums, 1 for products, the lowest value for max."""
    if op is Ops.MAX:
        return dtype_limits(dtype)[0]
    return REDUCE_IDENTITY[op]


class Lowerer:
    """Lowers one kernel. Loops get numbers in the order they are created, so equal ASTs give equal programs."""

    def __init__(self):
        self.reduce_ranges: dict[tuple, tuple[UOp, ...]] = {}
        self.next_axis = 0

    def new_range(self, size: int, kind: LoopKind) -> UOp:
        if size == 1:
            return index_const(0)
        node = UOp(Ops.RANGE, INDEX, (index_const(size),), (self.next_axis, kind))
        self.next_axis += 1
        return node

    def lower(self, ast: UOp) -> UOp:
        stores = []
        for store in ast.src:
            output, value = store.src
            ranges = tuple(self.new_range(size, LoopKind.GLOBAL) for size in value.shape)
            lowered = self.lower_value(value, ranges)
            stores.append(UOp(Ops.STORE, src=(output, flat_index(ranges, value.shape), lowered)))
        # every parameter stays in the signature, even one whose loads simplified away
        parameters = tuple(sorted((n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL), key=lambda n: n.arg[0]))
        sink = simplify(UOp(Ops.SINK, src=tuple(stores), arg=parameters))
        return simplify_gated_loads(simplify(collapse_lookups(sink)))

    # ---- the walk ---------------------------------------------------------------------------------------------

    def lower_value(self, root: UOp, indices: tuple[UOp, ...]) -> UOp:
        """The value of `root` at `indices`, built without recursion (kernels may fuse thousands of ops)."""
        done: dict[tuple, UOp] = {}
        start = (root, indices, None)
        # a request waits on the stack with its children (worked out once: it simplifies index expressions)
        stack: list[tuple[tuple, list[tuple] | None]] = [(start, None)]
        while stack:
            request, children = stack.pop()
            if request in done:
                continue
            if children is None:
                children = self.child_requests(*request)
                stack.append((request, children))
                stack.extend((child, None) for child in reversed(children) if child not in done)
                continue
            done[request] = self.build(*request, [done[child] for child in children])
        return done[start]

    def child_requests(self, node: UOp, indices: tuple[UOp, ...], valid: UOp | None) -> list[tuple]:
        """Which (source, indices, valid) values `node` needs at `indices`."""
        op, arg = node.op, node.arg
        if op in (Ops.DEFINE_GLOBAL, Ops.CONST, Ops.ARANGE):
            return []
        if op is Ops.REDUCE:
            if any(node.src[0].shape[axis] == 0 for axis in node.arg[1]):
                return []  # an empty reduce is its identity
            return [(node.src[0], self.reduce_indices(node, indices, valid), valid)]
        if op is Ops.PAD:
            inner, pad_valid = self.pad_indices(node, indices)
            both = pad_valid if valid is None else simplify(valid.logical_and(pad_valid))
            return [(node.src[0], inner, both)]
        if op is Ops.RESHAPE:
            return [(node.src[0], reshaped_indices(indices, node.shape, node.src[0].shape), valid)]
        if op is Ops.PERMUTE:
            inner = [None] * len(arg)
            for output_axis, input_axis in enumerate(arg):
                inner[input_axis] = indices[output_axis]
            return [(node.src[0], tuple(inner), valid)]
        if op is Ops.EXPAND:
            shape = node.src[0].shape
            inner = tuple(index_const(0) if size == 1 else index for index, size in zip(indices, shape))
            return [(node.src[0], inner, valid)]
        if op is Ops.SHRINK:
            inner = tuple(simplify(index + start) if start else index for index, (start, _) in zip(indices, arg))
            return [(node.src[0], inner, valid)]
        if op is Ops.FLIP:
            inner = tuple(
                simplify(index_const(size - 1) - index) if axis in arg else index
                for axis, (index, size) in enumerate(zip(indices, node.shape))
            )
            return [(node.src[0], inner, valid)]
        if op in ALU or op in (Ops.CAST, Ops.BITCAST):
            return [(source, indices, valid) for source in node.src]
        if op is Ops.DETACH or op is Ops.SLOPE:
            return [(node.src[0], indices, valid)]
        raise RuntimeError(f"cannot lower {op} inside a kernel")

    def reduce_indices(self, node: UOp, indices: tuple[UOp, ...], valid: UOp | None) -> tuple[UOp, ...]:
        key = (node, indices, valid)
        if key not in self.reduce_ranges:
            _, axes = node.arg
            shape = node.src[0].shape
            self.reduce_ranges[key] = tuple(
                self.new_range(size, LoopKind.REDUCE) if axis in axes else index
                for axis, (index, size) in enumerate(zip(indices, shape))
            )
        return self.reduce_ranges[key]

    def pad_indices(self, node: UOp, indices: tuple[UOp, ...]) -> tuple[tuple[UOp, ...], UOp]:
        inner, valid = [], UOp.const(dtypes.bool, True)
        for index, (before, after), size in zip(indices, node.arg, node.src[0].shape):
            inner.append(simplify(index - before) if before else index)
            if before or after:
                in_range = index_const(-1).lt(inner[-1]).logical_and(inner[-1].lt(size))
                valid = valid.logical_and(in_range)
        return tuple(inner), simplify(valid)

    def build(self, node: UOp, indices: tuple[UOp, ...], valid: UOp | None, sources: list[UOp]) -> UOp:
        op = node.op
        if op is Ops.DEFINE_GLOBAL:
            index = indices[0]
            return UOp(Ops.LOAD, node.dtype, (node, index) if valid is None else (node, index, valid))
        if op is Ops.CONST:
            return node
        if op is Ops.ARANGE:
            return indices[0].cast(node.dtype)
        if op is Ops.PAD:
            _, pad_valid = self.pad_indices(node, indices)
            return pad_valid.where(sources[0], UOp.const(node.dtype, 0))
        if op is Ops.REDUCE:
            reduce_op, axes = node.arg
            shape = node.src[0].shape
            if any(shape[axis] == 0 for axis in axes):
                return UOp.const(node.dtype, reduce_identity(reduce_op, node.dtype))
            ranges = [self.reduce_indices(node, indices, valid)[axis] for axis in axes if shape[axis] != 1]
            if not ranges:
                return sources[0]
            return UOp(Ops.RANGE_REDUCE, node.dtype, (sources[0], *ranges), reduce_op)
        if op in ALU or op in (Ops.CAST, Ops.BITCAST):
            return node.replace(src=tuple(sources))
        return sources[0]  # movement ops: the source's value at the moved indices


def lower_kernel(ast: UOp) -> UOp:
    """The kernel graph (SINK of STOREs with RANGEs, LOADs and RANGE_REDUCEs) for a scheduled kernel AST."""
    return Lowerer().lower(ast)
