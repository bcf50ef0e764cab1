"""Kernel optimization as data: how a kernel's loops run is an ordered list of actions, each a small frozen value
`Opt(op, axis, amount)` naming a loop by its axis number (the number lowering gave it, which merges keep). Applying
an action rewrites the kernel graph and keeps the math; an action that does not fit the kernel raises
KernelOptError, so a list read from disk or built by a search is checked by applying it. Which list a kernel gets
is decided elsewhere (codegen/heuristic.py, or BEAM in engine/search.py); NOOPT=1 applies none.

The actions:

- MERGE(axis): fuse the loop with the next loop inside it of the same kind (the next output loop, or the next loop
  of the same reduce) into one loop of their product, where their indices only appear as `outer*size + inner`
  (else the merge would add divisions, and is refused);
- UPCAST(axis, amount): an output loop computes `amount` consecutive iterations per iteration (register blocking:
  the copies share loads and registers); an amount equal to the loop's size removes the loop;
- UNROLL(axis, amount): the same for a reduce loop: `amount` copies of the reduced value per iteration, combined
  in straight-line code;
- VECTORIZE(axis): compute the loop several iterations at a time in vector lanes. A reduce loop is marked for the
  compiler's vectorizer (its inputs are contiguous or fixed along it) on a CPU, or computed in vector types by a
  renderer that has them (OpenCL), its vector accumulators combined lane by lane after it; on a device with threads
  whose target computes in vectors, an output loop stays a loop inside each thread, computed in vector types (its
  stores contiguous). The renderer takes as many lanes at a time as the device's vectors hold of the widest value
  the loop computes; no further action takes the loop.
- LANES(axis): each iteration of a reduce loop (which goes) gets an accumulator of its own, updated by the reduce's
  other loops; the accumulators are combined, in order, once those are done. A vector of partial sums then stays in
  a register across the other loops: a compiler that vectorizes a short innermost loop adds up its lanes at every
  exit (a convolution's weight gradient, whose innermost reduce loop runs along an image row of 16);
- SPLIT(axis, amount): run the loop as two of its kind, an outer one and an inner one of `amount` iterations numbered
  axis + 1 (the loops numbered after it move up by one). A loop that a reshape merged from two axes, indexed
  through `// amount` and `% amount`, reads memory by plain strides again once split;
- INNER(axis): output loop `axis` becomes the innermost output loop, the others keeping their order (loops nest by
  number): the inputs that do not move along it are read again by each of its iterations while they are still in
  the cache (a column block of a weight gradient's windows, which every block of its rows reads).

On devices with threads (the target's `max_threads`), every output loop becomes a block index (codegen/threads.py)
unless an action says otherwise:

- LOCAL(axis, amount): split an output loop like SPLIT, the inner `amount` iterations being the threads of a block
  (a loop kept inside the threads too: the threads then share a row's outputs);
- LOOP(axis): keep an output loop a loop inside each thread (a row's reduce is then computed once per thread and
  reused along the row, instead of once per output);
- GROUP(axis, amount): the iterations of a reduce loop are shared by `amount` threads of a block (thread t takes
  iterations t, t + amount, ..., so neighbouring threads read neighbouring memory); each thread's partial result
  goes to memory the block shares, then the partials are combined there: by a tree of rounds with a barrier after
  each where `amount` is a power of two, else by every thread reading all of them after one barrier. On a device
  with shuffles (`Target.shuffle_lanes`: CUDA's warps) the threads of one warp combine first by reading each other's
  values (SHUFFLE, a butterfly of XORed lanes: a power of two of threads a power of two of lanes apart), with no
  memory or barrier; the warps' results then go through shared memory as above, after one barrier. The threads
  are a thread loop of `amount` that the reduces do not depend on where there is one (the threads that store a
  softmax row also compute its max and sum), else a new one numbered axis + 1. Only the first thread stores the
  outputs that do not depend on the threads. GROUP comes after every other action; several may follow each other
  where the later ones share the threads of the first (a softmax row's max and sum), or where the first combined
  by shuffles alone (no memory that the new threads' copies of its combine would race on).
- TILE(axis, amount): split a reduce loop like SPLIT and read the inputs that move along its inner `amount`
  iterations from shared memory: once per outer iteration the threads of the block copy together every element of
  each such input that one of them reads in it (its values over the thread loops and the inner loops; each upcast
  copy is an input of its own), wait at a barrier, and compute from the copy; the iteration ends at a second
  barrier, so the next copy overwrites nothing still to be read. Every thread reaches every barrier: loops have
  constant sizes and a program has no branches (a gate guards one load or store). TILE comes after every other
  action, and no GROUP follows it.

On a CPU (a target with `pack_bytes`):

- PACK(axis): output loop `axis` becomes the innermost output loop, and each input of the reduce that reads the same
  memory all along it and moves along the reduce is first copied into a buffer on the stack, once per iteration of
  the output loops outside it: every element the reduce will read, for all of its iterations (each upcast copy a
  column of its own, side by side), so that the loops inside read it in order, from a cache, instead of from
  strided memory whose rows fall into the same cache sets (the weights of `x @ w`, a column block at a time).
  It comes after the register blocking it reads.
- STASH(axis): the value a reduce over loop `axis` (alone) takes at each iteration, which the outputs compute again
  along an output loop of the same size (a softmax's exponentials), is kept in a buffer on the stack as the reduce
  runs, and the outputs read it back once the reduce is done instead of computing it again.

On every device, and first in the list:

- SCATTER(axis): the kernel's one output is a sum over loops t of values selected by output loop `axis` (a lookup's
  gradient: `Σ_t where(a_t == row, value_t, 0)`, a one-hot column of the table for each row): run it as a scatter.
  Each output iteration of the other loops (a column) first stores zeros along the selecting loop, then adds each
  value_t at row a_t, in order (a store after a load of the same element, in loops of kind SCATTER). That is V + T
  steps a column instead of V·T, but its columns are the only work that runs side by side.

- PIECES(axis): output loop `axis` runs as consecutive loops, one per piece between the iterations where a
  condition of the kernel on it changes (the borders of a cat's pieces, padded along it and added): in each, the
  conditions are known, so it reads only its own piece. A cat of N pieces costs each output one load, not N
  compares and gated loads. The pieces' loops (of kind SCATTER, a piece of one iteration none) open around their
  stores only, inside the other output loops; an elementwise kernel only.

On devices with tensor cores (the target's `tensor_cores`):

- TC(axis, tiles): run the sum of products over reduce loop `axis` on tensor cores, a block computing tiles × tiles
  tensor-core tiles of the outputs (1, the default, 2, 4 or 8: one warp for one tile, else four warps sharing the
  block's copies of the inputs; codegen/tensor_cores.py). TC(axis, tiles, steps, stages) also says how the block
  copies its inputs into shared memory: `steps` tensor-core steps along the reduce a copy, `stages` tiles of each
  input (2: the next copy lands in one while the block computes on the other); without them, the first way of
  `tensor_cores.pipelines` (the most steps that fit, two tiles where the device copies asynchronously). It is the
  only action on threads in the list, and the last; float32 products run so (in TF32) only where the user allows
  it (`Tensor.allow_tf32()`, ALLOW_TF32=1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lazygrad.codegen.lookup import condition_and_value, equal_to_loop, gate_loads_reading
from lazygrad.codegen.lower import reduce_identity
from lazygrad.dtype import DType, dtypes
from lazygrad.helpers import ALLOW_TF32, Kinds, auto, prod
from lazygrad.uop.ops import OUTPUT_KINDS, LoopKind, Ops, UOp
from lazygrad.uop.pattern import substitute
from lazygrad.uop.symbolic import gate_clauses, simplify, simplify_gated_loads, split_term, sum_terms

if TYPE_CHECKING:
    from lazygrad.codegen.renderer import Target


class OptOp(Kinds):
    MERGE = auto()
    UPCAST = auto()
    UNROLL = auto()
    VECTORIZE = auto()
    LANES = auto()
    SPLIT = auto()
    LOCAL = auto()
    LOOP = auto()
    GROUP = auto()
    TILE = auto()
    PACK = auto()
    STASH = auto()
    TC = auto()
    PAD = auto()
    SCATTER = auto()
    INNER = auto()
    PIECES = auto()


THREAD_ACTIONS = frozenset({OptOp.LOCAL, OptOp.GROUP, OptOp.TILE})  # the actions for targets with threads
VECTOR_KINDS = (LoopKind.VECTOR, LoopKind.VECTOR_REDUCE)  # the loops VECTORIZE makes
TILE_COPIES = 16  # the most elements of one staged input a thread copies per iteration of a tile


@dataclass(frozen=True)
class Opt:
    """One optimization action: `op` on the loop numbered `axis`, with `amount` where the action takes one, and
    `more` numbers where it takes several (TC: how it copies its inputs)."""

    op: OptOp
    axis: int
    amount: int = 0
    more: tuple[int, ...] = ()

    def __str__(self) -> str:
        numbers = (self.amount, *self.more) if self.amount or self.more else ()
        return f"{self.op.name}({', '.join(map(str, (self.axis, *numbers)))})"

    def to_json(self) -> list:
        return [self.op.name, self.axis, self.amount, *([list(self.more)] if self.more else [])]

    @staticmethod
    def from_json(value: object) -> Opt:
        """The action a JSON value `[op name, axis, amount]` (or `[op name, axis, amount, [more, ...]]`) describes;
        ValueError for anything else."""
        if not (isinstance(value, list) and len(value) in (3, 4) and value[0] in OptOp.__members__):
            raise ValueError(f"not an optimization action: {value!r}")
        more = value[3] if len(value) == 4 else []
        if len(value) == 4 and not (isinstance(more, list) and more):  # (where given, a list of at least one)
            raise ValueError(f"not an optimization action: {value!r}")
        if not all(type(number) is int and number >= 0 for number in (*value[1:3], *more)):
            raise ValueError(f"not an optimization action: {value!r}")
        return Opt(OptOp[value[0]], value[1], value[2], tuple(more))


class KernelOptError(ValueError):
    """An action that does not apply to this kernel; the message says why."""


# ---- graph rewriting helpers ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def kernel_nodes(sink: UOp) -> tuple[UOp, ...]:
    """The nodes of a kernel graph, sources first; kept for the last few graphs, which the actions and the
    heuristic look through again and again."""
    return tuple(sink.toposort)


def count_divmod(sink: UOp) -> int:
    return sum(node.op in (Ops.IDIV, Ops.MOD) for node in kernel_nodes(sink))


def replace_ranges(
    sink: UOp, replacements: dict[UOp, UOp], reduce_ranges: dict[UOp, tuple[UOp, ...]], simplified: bool = True
) -> UOp:
    """`sink` with ranges replaced by expressions; a RANGE_REDUCE's own range list is given by `reduce_ranges`."""
    done: dict[UOp, UOp] = {}
    # a whole kernel's nodes are kept in kernel_nodes (the actions look at them too); a part's are not
    for node in kernel_nodes(sink) if sink.op is Ops.SINK else sink.toposort:
        if node in replacements:
            done[node] = replacements[node]
        elif node.op is Ops.RANGE_REDUCE:
            ranges = reduce_ranges.get(node, tuple([done[source] for source in node.src[1:]]))
            done[node] = node.replace(src=(done[node.src[0]], *ranges))
        else:
            new_src = tuple([done[source] for source in node.src])
            done[node] = node if new_src == node.src else node.replace(src=new_src)
    return simplify(done[sink]) if simplified else done[sink]


def new_loop(loop: UOp, size: int, kind: LoopKind | None = None) -> UOp:
    """A loop with `loop`'s axis number (and kind, unless given) and `size` iterations."""
    return UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, size),), (loop.arg[0], kind or loop.arg[1]))


def loops_by_axis(sink: UOp) -> dict[int, UOp]:
    return {node.arg[0]: node for node in kernel_nodes(sink) if node.op is Ops.RANGE}


def output_loops(sink: UOp) -> list[UOp]:
    """The loops over the outputs (of every output kind), outermost first."""
    return sorted(
        (node for node in kernel_nodes(sink) if node.op is Ops.RANGE and node.arg[1] in OUTPUT_KINDS),
        key=lambda node: node.arg[0],
    )


def loops_of_kind(sink: UOp, kind: LoopKind) -> list[UOp]:
    return [node for node in output_loops(sink) if node.arg[1] is kind]


def reduces_over(sink: UOp, loop: UOp) -> list[UOp]:
    return [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE and loop in node.src[1:]]


# ---- the actions --------------------------------------------------------------------------------------------------


def merge(sink: UOp, outer: UOp) -> UOp:
    if outer.arg[1] is LoopKind.GLOBAL:
        group = output_loops(sink)
    else:
        reduces = reduces_over(sink, outer)
        group = list(reduces[0].src[1:]) if reduces else []
    if outer not in group:  # (a loop of the threads, or one no reduce runs over)
        raise KernelOptError(
            f"MERGE({outer.arg[0]}): loop {outer.arg[0]} is a {outer.arg[1].name.lower()} loop; MERGE takes an output "
            "loop or a loop of a reduce"
        )
    position = group.index(outer)
    if position + 1 >= len(group) or group[position + 1].arg[1] is not outer.arg[1]:
        raise KernelOptError(f"loop {outer.arg[0]} has no loop inside it of its kind to merge with")
    inner = group[position + 1]
    inner_size = inner.src[0].arg
    if reads_apart(sink, outer, inner):
        raise KernelOptError(f"merging loops {outer.arg[0]} and {inner.arg[0]} would add divisions")
    merged = new_loop(outer, outer.src[0].arg * inner_size)
    reduce_ranges = {}
    for node in kernel_nodes(sink):
        if node.op is Ops.RANGE_REDUCE and outer in node.src[1:] and inner in node.src[1:]:
            reduce_ranges[node] = tuple(merged if r is outer else r for r in node.src[1:] if r is not inner)
    replacements = {outer: merged // inner_size, inner: merged % inner_size}
    if not adds_divisions(sink, replacements):
        candidate = replace_ranges(sink, replacements, reduce_ranges)
        if count_divmod(candidate) <= count_divmod(sink):
            return candidate
    raise KernelOptError(f"merging loops {outer.arg[0]} and {inner.arg[0]} would add divisions")


def adds_divisions(sink: UOp, replacements: dict[UOp, UOp]) -> bool:
    """Whether putting expressions in place of loops gives the kernel more divisions and modulos. Only its integer
    expressions hold those, so this rewrites just the ones that read the loops (a kernel's index math, without the
    values computed from the memory it indexes): the test costs a fraction of rewriting the kernel."""
    used = loops_used(sink)
    loops = frozenset(replacements)
    roots: dict[UOp, None] = {}  # the integer expressions of the loops that something else reads
    for node in kernel_nodes(sink):
        if node.op in (Ops.RANGE, Ops.RANGE_REDUCE) or (node.dtype.is_int and node.op in _INDEX_MATH):
            continue
        for source in node.src:
            if source.dtype.is_int and not loops.isdisjoint(used[source]):
                roots[source] = None
    if not roots:
        return False

    def divisions(root: UOp) -> int:
        return sum(node.op in (Ops.IDIV, Ops.MOD) for node in root.toposort)

    expressions = UOp(Ops.SINK, src=tuple(roots))
    return divisions(simplify(substitute(expressions, replacements))) > divisions(expressions)


_INDEX_MATH = (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.NEG, Ops.MAX, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR)


def reads_apart(sink: UOp, outer: UOp, inner: UOp) -> bool:
    """Whether some memory index reads the two loops other than as `outer * size + inner` (times a stride), where
    both enter every index linearly and no division or modulo sees them: merged, such an index would need the
    division and modulo of the merged loop back. A cheap test before trying the merge (False: try it)."""
    used = loops_used(sink)
    if any(node.op in (Ops.IDIV, Ops.MOD) and not {outer, inner}.isdisjoint(used[node]) for node in kernel_nodes(sink)):
        return False
    size = inner.src[0].arg
    for node in kernel_nodes(sink):
        if node.op in (Ops.LOAD, Ops.STORE) and node.src[0].op is Ops.DEFINE_GLOBAL:
            outer_stride, inner_stride = stride(node.src[1], outer), stride(node.src[1], inner)
            if outer_stride is None or inner_stride is None:
                return False
            if outer_stride != size * inner_stride:
                return True
    return False


def copies_along(sink: UOp, loop: UOp, positions: list[UOp]) -> list[dict[UOp, UOp]]:
    """For each position, the nodes of the kernel that depend on `loop` rebuilt with the position in its place (a
    node that does not depend on it is itself: look it up with `.get(node, node)`). A reduce over `loop` is where
    the dependence ends. Only the dependent part of the graph is walked per copy."""
    dependent: set[UOp] = {loop}
    order: list[UOp] = []
    for node in kernel_nodes(sink):
        if node.op is Ops.RANGE_REDUCE and loop in node.src[1:]:
            continue
        for source in node.src:
            if source in dependent:
                dependent.add(node)
                order.append(node)
                break
    copies = []
    for position in positions:
        done = {loop: position}
        for node in order:
            done[node] = UOp(node.op, node.dtype, tuple([done.get(source, source) for source in node.src]), node.arg)
        copies.append(done)
    return copies


def upcast(sink: UOp, loop: UOp, factor: int) -> UOp:
    """Run output loop `loop` size/factor times, each iteration doing the work of `factor` consecutive ones."""
    outer = new_loop(loop, loop.src[0].arg // factor)
    copies = copies_along(sink, loop, [outer * factor + part for part in range(factor)])
    stores = dict.fromkeys(copy.get(store, store) for store in sink.src for copy in copies)
    # one simplification of all the copies: what they share is simplified once
    return simplify(sink.replace(src=tuple(stores)))


def unroll(sink: UOp, loop: UOp, factor: int) -> UOp:
    """Every reduce over `loop` reduces `factor` copies of its value per iteration of a loop `factor` times
    shorter (none, when `factor` is the loop's size)."""
    size = loop.src[0].arg
    outer = new_loop(loop, size // factor) if factor < size else None
    positions = [UOp.const(loop.dtype, part) if outer is None else outer * factor + part for part in range(factor)]
    copies = copies_along(sink, loop, positions)
    replacements: dict[UOp, UOp] = {}
    for node in reduces_over(sink, loop):
        combined = None
        for done in copies:
            copy = done.get(node.src[0], node.src[0])
            combined = copy if combined is None else combined.alu(node.arg, copy)
        rest = tuple(outer if r is loop else r for r in node.src[1:] if r is not loop or outer is not None)
        replacements[node] = node.replace(src=(combined, *rest)) if rest else combined
    return replace_ranges(sink, replacements, {})


def lanes(sink: UOp, loop: UOp) -> UOp:
    """Every reduce over `loop` as one reduce over its other loops per iteration of `loop`, combined in order."""
    copies = copies_along(sink, loop, [UOp.const(loop.dtype, part) for part in range(loop.src[0].arg)])
    replacements: dict[UOp, UOp] = {}
    for node in reduces_over(sink, loop):
        rest = tuple(r for r in node.src[1:] if r is not loop)
        parts = [done.get(node.src[0], node.src[0]) for done in copies]
        if rest:
            parts = [node.replace(src=(part, *rest)) for part in parts]
        combined = parts[0]
        for part in parts[1:]:
            combined = combined.alu(node.arg, part)
        replacements[node] = combined
    return replace_ranges(sink, replacements, {})


def pad(sink: UOp, loop: UOp, amount: int) -> UOp:
    """Loop `loop` run to the next multiple of `amount` iterations (so that an UPCAST, or a GROUP of a reduce loop, by
    `amount` divides it): in the iterations past its size, the loads that depend on it read nothing (a gated load's
    zero), the stores write nothing, and a reduce over it takes its identity (a max -inf, not the zero a function of
    the loads gives)."""
    size = loop.src[0].arg
    longer = new_loop(loop, -(-size // amount) * amount)
    inside = longer.alu(Ops.CMPLT, UOp.const(longer.dtype, size))
    sink = replace_ranges(sink, {loop: longer}, {}, simplified=False)
    used, done = loops_used(sink), {}
    for node in kernel_nodes(sink):
        new_src = tuple([done[source] for source in node.src])
        new = node if new_src == node.src else node.replace(src=new_src)
        if node.op in (Ops.LOAD, Ops.STORE) and node.src[0].op is Ops.DEFINE_GLOBAL and longer in used[node.src[1]]:
            new = gated(new, inside) if node.op is Ops.STORE else gated_load(new, inside)
        elif node.op is Ops.RANGE_REDUCE and longer in new.src[1:]:
            value = new.src[0]
            identity = UOp.const(value.dtype, reduce_identity(node.arg, value.dtype))
            new = new.replace(src=(inside.where(value, identity), *new.src[1:]))
        done[node] = new
    return simplify(done[sink])


def split(sink: UOp, loop: UOp, amount: int, inner_kind: LoopKind | None = None) -> UOp:
    """`loop` as an outer loop (with its number) around an inner one of `amount` iterations (the next number, and
    `loop`'s kind unless given)."""
    axis = loop.arg[0]
    replacements = {
        node: UOp(Ops.RANGE, node.dtype, node.src, (number + 1, node.arg[1]))
        for number, node in loops_by_axis(sink).items()
        if number > axis
    }
    outer = new_loop(loop, loop.src[0].arg // amount)
    inner = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, amount),), (axis + 1, inner_kind or loop.arg[1]))
    replacements[loop] = outer * amount + inner
    reduce_ranges = {
        node: tuple(new for r in node.src[1:] for new in ((outer, inner) if r is loop else (replacements.get(r, r),)))
        for node in reduces_over(sink, loop)
    }
    return replace_ranges(sink, replacements, reduce_ranges)


def stride(index: UOp, loop: UOp) -> int | None:
    """How much `index` grows when `loop` grows by one, or None when that is not a constant."""
    # the common case first: the loop is a plain term of the index's sum, or not in it at all
    coefficient = 0
    for base, factor in map(split_term, sum_terms(index)):
        if base is loop:
            coefficient += factor
        elif base is not None and loop in base.toposort:
            break
    else:
        return coefficient
    difference = simplify(replace_ranges(index, {loop: loop + 1}, {}) - index)
    return difference.arg if difference.op is Ops.CONST else None


def block_threads(sink: UOp) -> int:
    """The threads of a block the kernel's actions have made so far."""
    return prod(loop.src[0].arg for loop in loops_of_kind(sink, LoopKind.LOCAL))


def local_index(loops: list[UOp]) -> UOp:
    """The position of a thread in its block from its thread loops (outermost first), for shared memory."""
    index = UOp.const(loops[0].dtype, 0)
    for loop in loops:
        index = index * loop.src[0].arg + loop
    return simplify(index)


@functools.lru_cache(maxsize=16)
def loops_used(sink: UOp) -> dict[UOp, frozenset[UOp]]:
    """The loops each node's value depends on: a reduce's value not on its own loops, and a read of memory the
    threads share only on its index (every thread that waited at the barrier before it reads the same) and the
    loops the barrier is inside, besides the threads' (a tile's copy is made once per iteration) and the loops that
    make a copy (a PACK's)."""
    used: dict[UOp, frozenset[UOp]] = {}
    for node in kernel_nodes(sink):
        op, sources = node.op, node.src
        if op is Ops.RANGE:
            used[node] = frozenset([node])
        elif op is Ops.RANGE_REDUCE:
            used[node] = used[sources[0]] - frozenset(sources[1:])
        elif op is Ops.LOAD and sources[0].op is Ops.DEFINE_LOCAL:
            waited = (loop for loop in used[sources[2]] if loop.arg[1] not in (LoopKind.LOCAL, LoopKind.PACK))
            used[node] = used[sources[1]].union(waited)
        elif op is Ops.SHUFFLE:  # (another thread's value: its thread loops are the ones the lane's index gives)
            used[node] = used[sources[1]].union(loop for loop in used[sources[0]] if loop.arg[1] is not LoopKind.LOCAL)
        else:
            used[node] = union_of([used[source] for source in sources])
    return used


def union_of(sets: list[frozenset[UOp]]) -> frozenset[UOp]:
    """The union of `sets`: one of them where it holds all the others (most nodes use the loops, or need the reduces,
    of one of their sources), so that set is shared instead of built again per node."""
    union: frozenset[UOp] = _NO_NODES
    for more in sets:
        if more is not union and not more <= union:
            union = more if union <= more else union | more
    return union


_NO_NODES: frozenset[UOp] = frozenset()


def loops_under(sink: UOp, loop: UOp) -> set[UOp]:
    """The loops the reduces over `loop` depend on besides their own (a reduce inside another's loop depends on that
    loop; one that does not is computed before that loop opens)."""
    used = loops_used(sink)
    return set().union(*(used[reduce] for reduce in reduces_over(sink, loop)))


def shared_thread(sink: UOp, loop: UOp, amount: int) -> UOp | None:
    """A thread loop of `amount` threads that the reduces over `loop` do not depend on, for them to share (the
    threads that store a row's outputs also reduce it), or None."""
    if amount > loop.src[0].arg:  # (more threads than the loop has iterations share the loop outside it too)
        return None
    under = loops_under(sink, loop)
    return next((t for t in loops_of_kind(sink, LoopKind.LOCAL) if t.src[0].arg == amount and t not in under), None)


def loop_outside(sink: UOp, loop: UOp) -> UOp | None:
    """The reduce loop just outside `loop` in every reduce over it and in no other reduce, or None."""
    reduces = reduces_over(sink, loop)
    ranges = [reduce.src[1:] for reduce in reduces]
    outside = {loops[loops.index(loop) - 1] if loops.index(loop) else None for loops in ranges}
    outer = outside.pop() if len(outside) == 1 else None
    if outer is None or outer.arg[1] is not LoopKind.REDUCE:
        return None
    return outer if reduces_over(sink, outer) == reduces else None


def threads_across(sink: UOp, loop: UOp, amount: int) -> tuple[UOp, UOp, UOp]:
    """GROUP by `amount`, a multiple of `loop`'s size: thread t of a new thread loop (`loop`'s axis) takes iteration
    t % size of `loop` and iteration outer * (amount / size) + t / size of the reduce loop just outside it, which
    keeps its axis with fewer iterations (neighbouring threads still move along `loop`). (sink, outer, thread)"""
    size, outer = loop.src[0].arg, loop_outside(sink, loop)
    if outer is None:
        raise KernelOptError(
            f"GROUP({loop.arg[0]}, {amount}): {amount} threads, more than loop {loop.arg[0]}'s {size} iterations, "
            "would share the reduce loop just outside it too, and its reduces have none there (or another reduce "
            f"runs over that loop); use an amount that divides {size}"
        )
    across, outer_size = amount // size, outer.src[0].arg
    if outer_size % across:
        raise KernelOptError(
            f"GROUP({loop.arg[0]}, {amount}): its {across} threads along loop {outer.arg[0]} must divide that loop's "
            f"{outer_size} iterations"
        )
    thread = new_loop(loop, amount, LoopKind.LOCAL)
    fewer = new_loop(outer, outer_size // across)  # (of one iteration where the threads take all: as a SPLIT's)
    reduce_ranges = {
        reduce: tuple(fewer if r is outer else r for r in reduce.src[1:] if r is not loop)
        for reduce in reduces_over(sink, loop)
    }
    sink = replace_ranges(sink, {loop: thread % size, outer: fewer * across + thread // size}, reduce_ranges)
    return sink, fewer, thread


def renumbered(sink: UOp, loop: UOp, number: int) -> tuple[UOp, dict[UOp, UOp]]:
    """`sink` with `loop` numbered `number`, lower than its own, and the loops numbered from there up to it one
    higher each; and the loops it renumbered, old -> new."""
    moved = {
        node: UOp(Ops.RANGE, node.dtype, node.src, (number if node is loop else axis + 1, node.arg[1]))
        for axis, node in loops_by_axis(sink).items()
        if number <= axis <= loop.arg[0]
    }
    return replace_ranges(sink, moved, {}), moved


def group(sink: UOp, loop: UOp, amount: int, lanes: int) -> UOp:
    """Share each reduce over `loop` among `amount` threads (an existing thread loop of that size they do not depend
    on, else a new one): partial results, then a combine through shared memory, or first within each warp of
    `lanes` threads by shuffles where the device has them (`Target.shuffle_lanes`). More threads than `loop` has
    iterations (a multiple of them) also share the reduce loop just outside it (see `threads_across`). New threads
    take the number of the block's first thread loop, which makes them the slowest in the thread index."""
    for node in loops_under(sink, loop):
        if node.arg[1] not in (LoopKind.GLOBAL, LoopKind.LOCAL):  # (a barrier in a loop would need another)
            raise KernelOptError(f"GROUP({loop.arg[0]}, ...): the reduce also runs inside loop {node.arg[0]}")
    size = loop.src[0].arg
    axis, thread = loop.arg[0], shared_thread(sink, loop, amount)
    if thread is None:
        if amount > size:
            sink, outer, thread = threads_across(sink, loop, amount)
        else:
            sink = split(sink, loop, amount, LoopKind.LOCAL)  # thread t takes iterations outer * amount + t
            outer, thread = loops_by_axis(sink)[axis], loops_by_axis(sink)[axis + 1]
        # the new threads move slowest through the thread index: the threads of a block's outputs stay neighbours
        first = min((t.arg[0] for t in loops_of_kind(sink, LoopKind.LOCAL) if t is not thread), default=None)
        if first is not None and first < thread.arg[0]:
            sink, moved = renumbered(sink, thread, first)
            outer, thread = moved.get(outer, outer), moved[thread]
    else:
        outer = new_loop(loop, loop.src[0].arg // amount)
        reduce_ranges = {r: tuple(outer if x is loop else x for x in r.src[1:]) for r in reduces_over(sink, loop)}
        sink = replace_ranges(sink, {loop: outer * amount + thread}, reduce_ranges)
    threads = loops_of_kind(sink, LoopKind.LOCAL)
    here, size = local_index(threads), prod(t.src[0].arg for t in threads)
    # the lane distance between neighbouring threads of the group: the threads of the faster loops lie between them
    apart = prod(t.src[0].arg for t in threads[threads.index(thread) + 1 :])
    reduces = [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE and outer in node.src[1:]]
    zero = UOp.const(thread.dtype, 0)
    partials = {r: r.replace(src=(r.src[0], *(x for x in r.src[1:] if x is not thread))) for r in reduces}
    taken = sum(node.op is Ops.DEFINE_LOCAL for node in kernel_nodes(sink))
    replacements: dict[UOp, UOp] = {}
    # the threads of a warp combine first by shuffles (where the device has them), then the warps' results (each
    # thread's partial, without shuffles) go through shared memory
    warp = warp_threads(amount, apart, lanes)
    count = UOp.const(thread.dtype, amount // warp)
    combine = UOp(Ops.RANGE, thread.dtype, (count,), (max(loops_by_axis(sink)) + 1, LoopKind.REDUCE))
    for number, reduce in enumerate(reduces, start=taken):
        value, step = partials[reduce], 1
        while step < warp:  # a butterfly: after it, every thread holds its warp's combined value
            partner = here.alu(Ops.XOR, UOp.const(here.dtype, step * apart))
            value = value.alu(reduce.arg, UOp(Ops.SHUFFLE, value.dtype, (value, partner)))
            step *= 2
        if warp == amount:  # the first thread's: the same in every thread, which the loop analysis can tell
            replacements[reduce] = UOp(Ops.SHUFFLE, value.dtype, (value, replace_ranges(here, {thread: zero}, {})))
            continue
        shared = UOp(Ops.DEFINE_LOCAL, reduce.dtype, (), (number, size))
        stored = UOp(Ops.BARRIER, src=(UOp(Ops.STORE, src=(shared, here, value)),))
        if warp > 1 or amount & (amount - 1):  # every thread combines the warps' results (or partials) in a loop
            read = UOp(Ops.LOAD, reduce.dtype, (shared, replace_ranges(here, {thread: combine * warp}, {}), stored))
            replacements[reduce] = UOp(Ops.RANGE_REDUCE, reduce.dtype, (read, combine), reduce.arg)
            continue
        # a power of two: a tree, halving the threads that combine each round, a barrier after each
        step = amount // 2
        while step:
            # `thread | step` is `thread + step` below `step`, and above it for the threads that only read: no
            # thread reads what another writes in the same round
            mine = UOp(Ops.LOAD, reduce.dtype, (shared, here, stored))
            other = UOp(
                Ops.LOAD,
                reduce.dtype,
                (shared, replace_ranges(here, {thread: thread.alu(Ops.OR, UOp.const(thread.dtype, step))}, {}), stored),
            )
            below = thread.alu(Ops.CMPLT, UOp.const(thread.dtype, step))
            stored = UOp(Ops.BARRIER, src=(UOp(Ops.STORE, src=(shared, here, mine.alu(reduce.arg, other), below)),))
            step //= 2
        replacements[reduce] = UOp(Ops.LOAD, reduce.dtype, (shared, replace_ranges(here, {thread: zero}, {}), stored))
    return gated_to_first(replace_ranges(sink, replacements, {}, simplified=False), thread)


def warp_threads(amount: int, apart: int, lanes: int) -> int:
    """How many threads of a GROUP of `amount`, `apart` lanes from one to the next, combine within one warp of
    `lanes` by shuffles (XOR of the lane number): 1 (none) unless both are powers of two."""
    if not lanes or amount & (amount - 1) or apart & (apart - 1):
        return 1
    warp = 1
    while warp < amount and warp * 2 * apart <= lanes:
        warp *= 2
    return warp


def gated_to_first(sink: UOp, thread: UOp) -> UOp:
    """`sink`, whose reduces `thread`'s threads combined, with each store that does not depend on the thread made by
    its first thread alone (every thread holds the combined results)."""
    first, used = thread.alu(Ops.CMPLT, UOp.const(thread.dtype, 1)), loops_used(sink)
    stores = [store if thread in used[store] else gated(store, first) for store in sink.src]
    return simplify(sink.replace(src=tuple(stores)))


def shared_bytes(dtype: DType) -> int:
    """The bytes an element of shared memory takes: renderers keep half and bool there as their register values
    (float, int)."""
    return 4 if dtype in (dtypes.float16, dtypes.bool) else dtype.itemsize


def shared_layout(loops: list[UOp], index: UOp, threads: list[UOp]) -> tuple[list[UOp], dict[UOp, int], int]:
    """How a staged input lies in shared memory: its loops ordered as they move through memory (largest stride
    outermost, so that neighbouring threads copy neighbouring elements), each loop's stride in shared memory, and
    the elements it takes. The fastest thread loop gets an odd stride (one element of padding per step), so that
    neighbouring threads reading along it fall in different memory banks."""

    def step(loop: UOp) -> int:  # (a loop the index does not move by a constant step goes outermost)
        moved = stride(index, loop)
        return 1 << 62 if moved is None else abs(moved)

    order = sorted(loops, key=step, reverse=True)
    strides, size = {}, 1
    for loop in reversed(order):
        if loop is threads[-1] and size % 2 == 0 and size > 1:
            size += 1
        strides[loop] = size
        size *= loop.src[0].arg
    return order, strides, size


def tile(sink: UOp, loop: UOp, amount: int, target: Target) -> UOp:
    """Split reduce loop `loop` into an outer loop and an inner one of `amount`, and read the inputs of its reduces
    that move along the inner loop from shared memory: once per outer iteration, the threads of the block copy what
    they all read in it (each input's values over the thread loops and the inner loops it depends on) from memory
    into shared memory, together, then wait at a barrier (the linearizer makes the copy inside the outer loop, before
    the inner one opens, and puts a second barrier at the end of the outer iteration, before the next copy)."""
    name = f"TILE({loop.arg[0]}, {amount})"
    reduces = reduces_over(sink, loop)
    if any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        raise KernelOptError(f"{name}: the reduces over loop {loop.arg[0]} do not all run over the same loops")
    if any(node.op is Ops.RANGE_REDUCE for r in reduces for node in r.src[0].toposort):
        raise KernelOptError(f"{name}: a reduce over loop {loop.arg[0]} holds another reduce")
    threads = loops_of_kind(sink, LoopKind.LOCAL)
    if not threads:
        raise KernelOptError(f"{name}: the block has one thread, no threads to share the copies (LOCAL first)")
    axis = loop.arg[0]
    sink = split(sink, loop, amount)
    loops = loops_by_axis(sink)
    outer, inner, threads = loops[axis], loops[axis + 1], loops_of_kind(sink, LoopKind.LOCAL)
    reduces = reduces_over(sink, outer)
    ranges = reduces[0].src[1:]
    inner_ranges = ranges[ranges.index(outer) + 1 :]
    used, count = loops_used(sink), prod(thread.src[0].arg for thread in threads)
    here = local_index(threads)
    loads = [
        node
        for node in dict.fromkeys(node for r in reduces for node in r.src[0].toposort)
        if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL and inner in used[node]
    ]
    taken = [node for node in kernel_nodes(sink) if node.op is Ops.DEFINE_LOCAL]
    memory = sum(shared_bytes(node.dtype) * node.arg[1] for node in taken)
    stores, reads = [], {}
    for number, load in enumerate(loads, start=len(taken)):
        staged = [node for node in (*threads, *inner_ranges) if node in used[load]]
        order, strides, size = shared_layout(staged, load.src[1], threads)
        elements = prod(node.src[0].arg for node in staged)
        copies = -(-elements // count)
        if copies > TILE_COPIES:
            raise KernelOptError(f"{name}: each thread would copy {copies} elements of an input, over {TILE_COPIES}")
        memory += shared_bytes(load.dtype) * size
        if memory > target.shared_memory:
            raise KernelOptError(
                f"{name}: the staged inputs need {memory} bytes of the device's {target.shared_memory}"
            )
        shared = UOp(Ops.DEFINE_LOCAL, load.dtype, (), (number, size))
        for copy in range(copies):
            # the copy's element number, read as a position along each staged loop (outermost first)
            element, positions, rest = here + copy * count, {}, elements
            for node in order:
                rest //= node.src[0].arg
                positions[node] = element // rest if node is order[0] else (element // rest) % node.src[0].arg
            value = replace_ranges(load, positions, {})
            where = sum((positions[node] * strides[node] for node in order), UOp.const(here.dtype, 0))
            if (copy + 1) * count > elements:  # the last copy: only the threads with an element left
                valid = element.alu(Ops.CMPLT, UOp.const(here.dtype, elements))
                if value.op is Ops.LOAD:  # (reading nothing past the input either)
                    value = value.replace(
                        src=(*value.src[:2], valid if len(value.src) < 3 else value.src[2].logical_and(valid))
                    )
                stores.append(UOp(Ops.STORE, src=(shared, simplify(where), value, valid)))
            else:
                stores.append(UOp(Ops.STORE, src=(shared, simplify(where), value)))
        reads[load] = (shared, simplify(sum((node * strides[node] for node in order), UOp.const(here.dtype, 0))))
    if not reads:
        raise KernelOptError(f"{name}: no input of the reduces moves along the inner loop")
    barrier = UOp(Ops.BARRIER, src=tuple(stores))
    replacements = {load: UOp(Ops.LOAD, load.dtype, (*reads[load], barrier)) for load in loads}
    tiled = {r: r.replace(src=(replace_ranges(r.src[0], replacements, {}, simplified=False), *ranges)) for r in reduces}
    return replace_ranges(sink, tiled, {})


PACKED_DTYPES = (dtypes.float32, dtypes.float64)  # what PACK and STASH keep on the stack (no conversion needed)


def pack(sink: UOp, loop: UOp, target: Target | None) -> UOp:
    """Make output loop `loop` the innermost output loop, and read the inputs of the reduce that do not depend on it
    (and move along the reduce) from copies on the stack: for each output loop outside it, a loop nest over the
    reduce's loops copies what the reduce will read into a buffer per input, one column per load of that input (its
    upcast copies), in the order they sit in memory. The linearizer makes the copy just before `loop` opens."""
    name = f"PACK({loop.arg[0]})"
    if target is None or not target.pack_bytes:
        raise KernelOptError(f"{name}: the device has no stack buffers to copy inputs into (a CPU's)")
    if loop.arg[1] is not LoopKind.GLOBAL:
        raise KernelOptError(f"{name}: loop {loop.arg[0]} is a {loop.arg[1].name.lower()} loop, not an output loop")
    if inside := [other.arg[0] for other in output_loops(sink) if other.arg[1] is not LoopKind.GLOBAL]:
        # (the linearizer opens those inside the global loops: the copies, made outside `loop`, would need them open)
        raise KernelOptError(f"{name}: output loop {inside[0]} would open inside loop {loop.arg[0]}, after its copies")
    reduces = [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE]
    if not reduces or any(r.src[1:] != reduces[0].src[1:] for r in reduces):
        raise KernelOptError(f"{name}: the kernel has no reduce, or reduces over different loops")
    ranges, used = reduces[0].src[1:], loops_used(sink)
    # (a load that moves along the reduce's loops is in its body: every reduce runs over the same loops)
    loads = [
        node
        for node in kernel_nodes(sink)
        if node.op is Ops.LOAD
        and node.src[0].op is Ops.DEFINE_GLOBAL
        and node.dtype in PACKED_DTYPES
        and loop not in used[node]
        and not used[node].isdisjoint(ranges)
    ]
    if not loads:
        raise KernelOptError(f"{name}: no input of the reduce reads the same memory all along loop {loop.arg[0]}")
    staged = [r for r in ranges if any(r in used[load] for load in loads)]
    length = prod(r.src[0].arg for r in staged)
    size = length * sum(load.dtype.itemsize for load in loads)
    if size > target.pack_bytes:
        raise KernelOptError(f"{name}: the copies would take {size} bytes of the stack, over {target.pack_bytes}")
    moved = innermost(sink, loop)
    top = max(loops_by_axis(sink))
    copying = moved | {r: UOp(Ops.RANGE, r.dtype, r.src, (top + 1 + n, LoopKind.PACK)) for n, r in enumerate(staged)}
    by_input: dict[UOp, list[UOp]] = {}
    for load in loads:
        by_input.setdefault(load.src[0], []).append(load)
    stores, reads = [], {}
    taken = sum(node.op is Ops.DEFINE_LOCAL for node in kernel_nodes(sink))
    for number, (buffer, columns) in enumerate(by_input.items(), start=taken):
        columns.sort(key=lambda load: constant_term(load.src[1]))  # neighbours in memory, neighbours in the copy
        local = UOp(Ops.DEFINE_LOCAL, buffer.dtype, (), (number, length * len(columns)))
        read_row, copy_row = (
            flat_index(staged, len(columns)),
            flat_index([copying[r] for r in staged], len(columns)),
        )
        for column, load in enumerate(columns):
            copied = replace_ranges(load, copying, {})
            stores.append(UOp(Ops.STORE, src=(local, simplify(copy_row + column), copied)))
            reads[load] = (local, simplify(read_row + column))
    barrier = UOp(Ops.BARRIER, src=tuple(stores))
    # one pass: the loads read the copies (whose loops are renumbered already), the other loops are renumbered (a
    # simplified kernel stays so: its sums only change the order of their terms)
    replacements = moved | {load: UOp(Ops.LOAD, load.dtype, (*reads[load], barrier)) for load in loads}
    return replace_ranges(sink, replacements, {}, simplified=False)


def innermost(sink: UOp, loop: UOp) -> dict[UOp, UOp]:
    """The output loops renumbered so that `loop` is the innermost of them, the others keeping their order (loops nest
    by number): old loop -> new loop."""
    outputs = output_loops(sink)
    order = [other for other in outputs if other is not loop] + [loop]
    return {old: UOp(Ops.RANGE, old.dtype, old.src, (new.arg[0], old.arg[1])) for old, new in zip(order, outputs)}


def stash(sink: UOp, loop: UOp, target: Target | None) -> UOp:
    """Keep the values the reduce over `loop` takes in a buffer on the stack, for the outputs that compute them again
    along an output loop of the same size: the reduce reads each value back from the buffer right after storing it
    (the compiler forwards it), and the outputs read the buffer behind a barrier on the reduce's result."""
    name = f"STASH({loop.arg[0]})"
    if target is None or not target.pack_bytes:
        raise KernelOptError(f"{name}: the device has no stack buffers to keep values in (a CPU's)")
    if loop.arg[1] not in (LoopKind.REDUCE, LoopKind.VECTOR_REDUCE):
        raise KernelOptError(f"{name}: loop {loop.arg[0]} is a {loop.arg[1].name.lower()} loop, not a reduce loop")
    reduces = reduces_over(sink, loop)
    if len(reduces) != 1 or reduces[0].src[1:] != (loop,):
        raise KernelOptError(f"{name}: it takes one reduce over loop {loop.arg[0]} alone")
    (reduce,), size = reduces, loop.src[0].arg
    if reduce.dtype not in PACKED_DTYPES:
        raise KernelOptError(f"{name}: it keeps float32 and float64 values, not {reduce.dtype}")
    nodes = set(kernel_nodes(sink))
    found = next(
        (
            (output, value)
            for output in output_loops(sink)
            if output.src[0].arg == size and (value := replace_ranges(reduce.src[0], {loop: output}, {})) in nodes
        ),
        None,
    )
    if found is None:
        raise KernelOptError(f"{name}: no output computes the reduce's values again along a loop of {size}")
    if size * reduce.dtype.itemsize > target.pack_bytes:
        raise KernelOptError(f"{name}: the values would take {size * reduce.dtype.itemsize} bytes of the stack")
    output, again = found
    number = sum(node.op is Ops.DEFINE_LOCAL for node in nodes)
    kept = UOp(Ops.DEFINE_LOCAL, reduce.dtype, (), (number, size))
    stored = UOp(Ops.BARRIER, src=(UOp(Ops.STORE, src=(kept, loop, reduce.src[0])),))
    kept_reduce = reduce.replace(src=(UOp(Ops.LOAD, reduce.dtype, (kept, loop, stored)), loop))
    read = UOp(Ops.LOAD, reduce.dtype, (kept, output, UOp(Ops.BARRIER, src=(kept_reduce,))))
    return replace_ranges(sink, {reduce: kept_reduce, again: read}, {}, simplified=False)


def stored_sum(value: UOp) -> tuple[UOp, UOp | None] | None:
    """The sum (a RANGE_REDUCE) a stored value is, with what it is added to (`scatter_add` into a tensor: None for
    0, `index_add` into zeros, as a sum starts from +0.0, so it is never -0.0, and adding 0 leaves it as it is)."""
    if value.op is Ops.RANGE_REDUCE:
        return (value, None) if value.arg is Ops.ADD else None
    if value.op is not Ops.ADD:
        return None
    for reduce, base in (value.src, value.src[::-1]):
        if reduce.op is Ops.RANGE_REDUCE and reduce.arg is Ops.ADD and not set(reduce.src[1:]) & set(base.toposort):
            return reduce, None if base.op is Ops.CONST and base.arg == 0 else base
    return None


def scatter(sink: UOp, loop: UOp) -> UOp:
    """The sum over lookups selected by output loop `loop`, run as a scatter: zeros stored along `loop`, then each
    selected value added at the index that selects it (see SCATTER)."""
    name = f"SCATTER({loop.arg[0]})"
    if loop.arg[1] is not LoopKind.GLOBAL:
        raise KernelOptError(f"{name}: loop {loop.arg[0]} is a {loop.arg[1].name.lower()} loop, not an output loop")
    nodes = kernel_nodes(sink)
    if len(sink.src) != 1 or sink.src[0].op is not Ops.STORE or len(sink.src[0].src) != 3:
        raise KernelOptError(f"{name}: it takes a kernel of one output (and before any other action)")
    output, index, stored = sink.src[0].src
    if (summed := stored_sum(stored)) is None:
        raise KernelOptError(f"{name}: the kernel's output is not a sum (or a sum added to values)")
    reduce, base = summed
    if sum(node.op is Ops.RANGE_REDUCE for node in nodes) != 1:
        raise KernelOptError(f"{name}: the values summed are sums themselves")
    if any(
        node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL and node.src[0].arg == output.arg for node in nodes
    ):
        raise KernelOptError(f"{name}: the kernel reads its output, which the first stores would overwrite")
    selected = condition_and_value(reduce.src[0])
    clauses = gate_clauses(selected[0]) if selected is not None else []
    chosen = next(((clause, a) for clause in clauses if (a := equal_to_loop(clause, loop)) is not None), None)
    if chosen is None:
        raise KernelOptError(f"{name}: the sum does not select its values by loop {loop.arg[0]}")
    used, (clause, a), value = loops_used(sink), chosen, selected[1]
    others = [other for other in clauses if other is not clause]
    # (`value` may be new: the casts around the selection moved onto it)
    if loop in value.toposort or any(loop in used[other] for other in others):
        raise KernelOptError(f"{name}: the values summed depend on loop {loop.arg[0]} beyond its selection")
    # (each step's load of the element it adds to must follow the step before: its index moves with every loop)
    if not set(reduce.src[1:]) <= used[a]:
        raise KernelOptError(f"{name}: the selecting index does not move along every loop of the sum")
    row = a.cast(dtypes.index)
    inside = UOp.const(dtypes.index, -1).lt(row).logical_and(row.lt(loop.src[0].arg))
    # a step whose row is outside the table, or whose other conditions fail, adds -0.0 to row 0: x + -0.0 is x (-0.0,
    # NaN and inf too). Ungated, the steps of neighbouring columns are one vector load, add and store.
    at = substitute(index, {loop: inside.where(row, UOp.const(dtypes.index, 0))})
    nothing = UOp.const(value.dtype, -0.0 if value.dtype.is_float else 0)
    added = functools.reduce(UOp.logical_and, others, inside).where(gate_loads_reading(value, inside, row), nothing)
    # first the values the sums start from (zeros, or those they are added to, as torch's scatter_add adds into self)
    starts_at = {loop: new_loop(loop, loop.src[0].arg, LoopKind.SCATTER)}
    start = UOp.const(reduce.dtype, 0) if base is None else substitute(base, starts_at)
    stores = (
        UOp(Ops.STORE, src=(output, substitute(index, starts_at), start)),
        UOp(Ops.STORE, src=(output, at, UOp(Ops.LOAD, reduce.dtype, (output, at)) + added)),
    )
    steps = {r: new_loop(r, r.src[0].arg, LoopKind.SCATTER) for r in reduce.src[1:]}
    return replace_ranges(sink.replace(src=stores), steps, {})


def _affine(index: UOp, loop: UOp) -> tuple[int, int] | None:
    """(m, k) where `index` is m·loop + k with m nonzero, else None."""
    m = k = 0
    for base, factor in map(split_term, sum_terms(index)):
        if base is None:
            k += factor
        elif base is loop:
            m += factor
        else:
            return None
    return (m, k) if m else None


def borders(sink: UOp, loop: UOp) -> list[int]:
    """The iterations of `loop` (after the first) where a comparison of the kernel's, of m·loop + k with a constant
    (a pad's validity), changes its answer."""
    found = set()
    for node in kernel_nodes(sink):
        if node.op is not Ops.CMPLT or not node.src[0].dtype.is_int:
            continue
        left, right = node.src
        if right.op is Ops.CONST and (line := _affine(left, loop)):  # m·loop + k < c
            (m, k), c = line, right.arg
        elif left.op is Ops.CONST and (line := _affine(right, loop)):  # c < m·loop + k: -m·loop - k < -c
            (m, k), c = (-line[0], -line[1]), -left.arg
        else:
            continue
        # m > 0: true below the first loop >= (c - k) / m; m < 0: true from the first loop > (k - c) / -m
        found.add(-((k - c) // m) if m > 0 else (k - c) // -m + 1)
    return sorted(border for border in found if 0 < border < loop.src[0].arg)


def pieces(sink: UOp, loop: UOp) -> UOp:
    """Output loop `loop` as consecutive loops between its borders, each store made once per piece (see PIECES)."""
    name = f"PIECES({loop.arg[0]})"
    if loop.arg[1] is not LoopKind.GLOBAL:
        raise KernelOptError(f"{name}: loop {loop.arg[0]} is a {loop.arg[1].name.lower()} loop, not an output loop")
    nodes = kernel_nodes(sink)
    if any(node.op in (Ops.RANGE_REDUCE, Ops.BARRIER) for node in nodes) or any(
        node.arg[1] is not LoopKind.GLOBAL for node in nodes if node.op is Ops.RANGE
    ):
        raise KernelOptError(f"{name}: it takes an elementwise kernel whose loops are all output loops")
    if not (cuts := borders(sink, loop)):
        raise KernelOptError(f"{name}: no condition of the kernel changes along loop {loop.arg[0]}")
    used, stores, axis = loops_used(sink), [], max(loops_by_axis(sink)) + 1
    for start, end in zip([0, *cuts], [*cuts, loop.src[0].arg]):
        # (a piece of one iteration is no loop; each other piece's loop is new, its own nest)
        inner = UOp.const(loop.dtype, 0)
        if end - start > 1:
            inner = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, end - start),), (axis, LoopKind.SCATTER))
            axis += 1
        at = {loop: inner + start}
        stores += [replace_ranges(store, at, {}) if loop in used[store] else store for store in sink.src]
    return simplify_gated_loads(sink.replace(src=tuple(dict.fromkeys(stores))))


def flat_index(loops: list[UOp], columns: int) -> UOp:
    """The position in a copy of `columns` columns of the element at `loops` (outermost first)."""
    index, step = UOp.const(loops[0].dtype, 0), columns
    for loop in reversed(loops):
        index = index + loop * step
        step *= loop.src[0].arg
    return index


def constant_term(index: UOp) -> int:
    return sum(factor for base, factor in map(split_term, sum_terms(index)) if base is None)


def staged(sink: UOp) -> bool:
    """Whether the kernel copies inputs into shared memory inside a reduce loop (a tile)."""
    used = loops_used(sink)
    barriers = (node for node in kernel_nodes(sink) if node.op is Ops.BARRIER or node.op is Ops.PREFETCH)
    return any(loop.arg[1] is LoopKind.REDUCE for barrier in barriers for loop in used[barrier])


def threads_exchange(sink: UOp) -> bool:
    """Whether the kernel's threads exchange values (through shared memory, or by shuffles), which ties its thread
    loops to the lanes and memory they were planned with."""
    return any(node.op is Ops.BARRIER or node.op is Ops.SHUFFLE for node in kernel_nodes(sink))


def gated(store: UOp, gate: UOp) -> UOp:
    """`store` made only where `gate` holds (and its own gate, if it has one)."""
    if len(store.src) > 3:
        return store if store.src[3] is gate else store.replace(src=(*store.src[:3], store.src[3].alu(Ops.AND, gate)))
    return store.replace(src=(*store.src, gate))


def gated_load(load: UOp, gate: UOp) -> UOp:
    """A load of device memory that reads only where `gate` holds (and its own mask, if it has one), zero elsewhere."""
    valid = gate if len(load.src) < 3 else load.src[2].alu(Ops.AND, gate)
    return load.replace(src=(*load.src[:2], valid))


def apply_opt(sink: UOp, opt: Opt, target: Target | None = None) -> UOp:
    """`sink` with one action applied; KernelOptError where it does not fit the kernel (or the target)."""
    return _apply_opt(sink, opt, target, bool(ALLOW_TF32) and opt.op is OptOp.TC)


# the heuristic (or BEAM) applies actions to choose them, and then they are applied again, in order, to the same
# prepared kernel: the second time is a lookup (kernel graphs are interned, so the key is cheap to hash); whether TF32
# is allowed is part of the key of a TC, the one action that depends on it
@functools.lru_cache(maxsize=256)
def _apply_opt(sink: UOp, opt: Opt, target: Target | None, allow_tf32: bool) -> UOp:
    loop = loops_by_axis(sink).get(opt.axis)
    if loop is None:
        raise KernelOptError(f"{opt}: the kernel has no loop {opt.axis}")
    if opt.op is OptOp.TC:
        from lazygrad.codegen.tensor_cores import tensor_core  # (it builds on this module's rewrites)

        if threads_exchange(sink):
            raise KernelOptError(f"{opt}: the kernel's threads share memory already (TC comes last)")
        return tensor_core(sink, loop, target, allow_tf32, opt.amount or 1, opt.more)
    if opt.more:
        raise KernelOptError(f"{opt}: {opt.op.name} takes an axis and at most an amount")
    size, kind = loop.src[0].arg, loop.arg[1]
    if kind is LoopKind.VECTOR:
        raise KernelOptError(f"{opt}: loop {opt.axis} is computed in vector lanes (VECTORIZE comes last for a loop)")
    if opt.op is not OptOp.GROUP and threads_exchange(sink):
        raise KernelOptError(
            f"{opt}: the kernel's threads share memory already, or it copies inputs onto the stack (GROUP, TILE and "
            "PACK come after every other action)"
        )
    if opt.op is OptOp.MERGE:
        return merge(sink, loop)
    if opt.op is OptOp.LOOP:
        if kind is not LoopKind.GLOBAL:
            raise KernelOptError(f"{opt}: loop {opt.axis} is a {kind.name.lower()} loop, not an output loop")
        return replace_ranges(sink, {loop: new_loop(loop, size, LoopKind.LOOP)}, {})
    if opt.op is OptOp.VECTORIZE:
        return vectorize(sink, loop, target)
    if opt.op is OptOp.LANES:
        if kind not in (LoopKind.REDUCE, LoopKind.VECTOR_REDUCE) or opt.amount:
            raise KernelOptError(f"{opt}: LANES takes a reduce loop and no amount (every iteration is a lane)")
        return lanes(sink, loop)
    if opt.op is OptOp.INNER:
        if kind is not LoopKind.GLOBAL or opt.amount:
            raise KernelOptError(f"{opt}: INNER takes an output loop and no amount")
        return replace_ranges(sink, innermost(sink, loop), {}, simplified=False)
    if opt.op is OptOp.STASH:
        if opt.amount:
            raise KernelOptError(f"{opt}: STASH takes no amount (the buffer holds the whole reduce)")
        return stash(sink, loop, target)
    if opt.op is OptOp.PACK:
        if opt.amount:
            raise KernelOptError(f"{opt}: PACK takes no amount (the copies hold the whole reduce)")
        return pack(sink, loop, target)
    if opt.op is OptOp.PIECES:
        if opt.amount:
            raise KernelOptError(f"{opt}: PIECES takes no amount (the borders are the kernel's)")
        return pieces(sink, loop)
    if opt.op is OptOp.SCATTER:
        if opt.amount:
            raise KernelOptError(f"{opt}: SCATTER takes no amount (it runs the whole sum)")
        return scatter(sink, loop)
    if opt.op is OptOp.PAD:
        if kind not in (LoopKind.GLOBAL, LoopKind.REDUCE) or opt.amount < 2 or size % opt.amount == 0:
            raise KernelOptError(
                f"{opt}: PAD takes an output or reduce loop and an amount of 2 or more that its {size} misses"
            )
        return pad(sink, loop, opt.amount)
    across = opt.op is OptOp.GROUP and opt.amount > size and opt.amount % size == 0  # (see `threads_across`)
    if opt.amount < 2 or (size % opt.amount and not across):
        raise KernelOptError(
            f"{opt}: the amount must be at least 2 and divide the loop's {size} iterations"
            + (" (or, for a GROUP, be a multiple of them)" if opt.op is OptOp.GROUP else "")
        )
    if opt.op is OptOp.SPLIT:
        if opt.amount == size:
            raise KernelOptError(f"{opt}: the amount must be less than the loop's {size} iterations")
        return split(sink, loop, opt.amount)
    if opt.op in THREAD_ACTIONS:
        return apply_thread_opt(sink, opt, loop, target)
    if opt.op is OptOp.UPCAST:
        if kind not in OUTPUT_KINDS:
            raise KernelOptError(f"{opt}: loop {opt.axis} is a reduce loop: UNROLL it instead")
        if kind is LoopKind.LOCAL:
            raise KernelOptError(f"{opt}: loop {opt.axis} is the threads of a block, not a loop")
        return upcast(sink, loop, opt.amount)
    if kind in OUTPUT_KINDS:
        raise KernelOptError(f"{opt}: loop {opt.axis} is an output loop: UPCAST it instead")
    return unroll(sink, loop, opt.amount)


def vectorize(sink: UOp, loop: UOp, target: Target | None) -> UOp:
    """VECTORIZE: a reduce loop becomes a VECTOR_REDUCE loop; on a device with threads that computes in vectors, an
    output loop (GLOBAL or LOOP) becomes a VECTOR loop inside each thread. A kernel has at most one loop in vector
    types there, and no threads that share memory (a GROUP or TILE computes in scalars)."""
    kind, size = loop.arg[1], loop.src[0].arg
    in_vector_types = target is not None and target.max_threads and target.vector_width > 1
    if in_vector_types and has_vector_loop(sink):
        raise KernelOptError(f"VECTORIZE({loop.arg[0]}): loop {loop.arg[0]} would be the kernel's second vector loop")
    if kind is LoopKind.REDUCE:
        return replace_ranges(sink, {loop: new_loop(loop, size, LoopKind.VECTOR_REDUCE)}, {})
    if kind not in (LoopKind.GLOBAL, LoopKind.LOOP):
        raise KernelOptError(f"VECTORIZE({loop.arg[0]}): loop {loop.arg[0]} is a {kind.name.lower()} loop")
    if not in_vector_types:
        raise KernelOptError(
            f"VECTORIZE({loop.arg[0]}): an output loop is computed in vector types only on a device with threads "
            "whose renderer has them (a CPU's compiler vectorizes output loops by itself)"
        )
    return replace_ranges(sink, {loop: new_loop(loop, size, LoopKind.VECTOR)}, {})


def has_vector_loop(sink: UOp) -> bool:
    """Whether an earlier VECTORIZE made one of the kernel's loops a vector loop."""
    return any(node.arg[1] in VECTOR_KINDS for node in loops_by_axis(sink).values())


def apply_thread_opt(sink: UOp, opt: Opt, loop: UOp, target: Target | None) -> UOp:
    """LOCAL, GROUP and TILE, checked against the target's threads and shared memory."""
    kind = loop.arg[1]
    if target is None or not target.max_threads:
        raise KernelOptError(f"{opt}: the device has no threads")
    if opt.op is not OptOp.LOCAL and target.vector_width > 1 and has_vector_loop(sink):
        raise KernelOptError(f"{opt}: the kernel computes a loop in vector types, and threads that share memory do not")
    if opt.op is OptOp.TILE:
        if kind is not LoopKind.REDUCE:
            raise KernelOptError(f"{opt}: loop {opt.axis} is a {kind.name.lower()} loop, not a reduce loop")
        if opt.amount == loop.src[0].arg:
            raise KernelOptError(f"{opt}: the amount must be less than the loop's {opt.amount} iterations")
        return tile(sink, loop, opt.amount, target)
    if opt.op is OptOp.GROUP and staged(sink):
        raise KernelOptError(f"{opt}: the kernel's reduce reads its inputs from a tile in shared memory")
    reused = opt.op is OptOp.GROUP and shared_thread(sink, loop, opt.amount) is not None
    if opt.op is OptOp.GROUP and not reused and any(node.op is Ops.DEFINE_LOCAL for node in kernel_nodes(sink)):
        # (the threads of the new loop would each repeat the earlier combine, racing on its shared memory)
        raise KernelOptError(
            f"{opt}: an earlier GROUP combines through shared memory; a later one must share its threads"
        )
    if not reused and block_threads(sink) * opt.amount > target.max_threads:
        raise KernelOptError(f"{opt}: a block would have more than the device's {target.max_threads} threads")
    if opt.op is OptOp.LOCAL:
        if kind not in (LoopKind.GLOBAL, LoopKind.LOOP):
            raise KernelOptError(f"{opt}: loop {opt.axis} is a {kind.name.lower()} loop, not an output loop")
        if opt.amount == loop.src[0].arg:
            return replace_ranges(sink, {loop: new_loop(loop, opt.amount, LoopKind.LOCAL)}, {})
        return split(sink, loop, opt.amount, LoopKind.LOCAL)
    if kind is not LoopKind.REDUCE:
        raise KernelOptError(f"{opt}: loop {opt.axis} is a {kind.name.lower()} loop, not a reduce loop")
    taken = sum(shared_bytes(node.dtype) * node.arg[1] for node in kernel_nodes(sink) if node.op is Ops.DEFINE_LOCAL)
    threads = block_threads(sink) * (1 if reused else opt.amount)
    shared = taken + sum(shared_bytes(r.dtype) for r in reduces_over(sink, loop)) * threads
    if shared > target.shared_memory:
        raise KernelOptError(f"{opt}: its partial results need {shared} bytes of the device's {target.shared_memory}")
    return group(sink, loop, opt.amount, target.shuffle_lanes)


def merge_summed_reduces(sink: UOp) -> UOp:
    """Sums over loops of the same sizes that are added together, each read nowhere else, as one sum of the added
    values: `Σ_k a + Σ_k b` is `Σ_k (a + b)`. A kernel with one reduce is a matrix product the heuristic blocks in
    registers, where one with several is not (an LSTM's gates, `x_t @ Wx + h @ Wh`, and the sum over time steps of
    their weight's gradient ran at a few GFLOP/s)."""
    nodes = kernel_nodes(sink)
    readers: dict[UOp, int] = {}
    for node in nodes:
        for source in node.src:
            readers[source] = readers.get(source, 0) + 1
    inner = {node for node in nodes if node.op is Ops.ADD and readers.get(node) == 1}
    inner &= {source for node in nodes if node.op is Ops.ADD for source in node.src}
    replacements: dict[UOp, UOp] = {}
    for node in nodes:
        if node.op is not Ops.ADD or node in inner:
            continue
        terms, stack = [], [node]
        while stack:  # the terms of the sum this node is the top of
            term = stack.pop()
            if term is node or term in inner:
                stack.extend(term.src)
            else:
                terms.append(term)
        groups: dict[tuple, list[UOp]] = {}
        for term in terms:
            if term.op is Ops.RANGE_REDUCE and term.arg is Ops.ADD and readers.get(term) == 1:
                groups.setdefault((term.dtype, tuple(loop.src[0].arg for loop in term.src[1:])), []).append(term)
        if all(len(group) < 2 for group in groups.values()):
            continue
        kept = [term for term in terms if all(term not in group for group in groups.values() if len(group) > 1)]
        for group in groups.values():
            if len(group) < 2:
                continue
            first, *rest = group
            value = first.src[0]
            for other in rest:
                loops = dict(zip(other.src[1:], first.src[1:]))
                value = value.alu(Ops.ADD, replace_ranges(other.src[0], loops, {}, simplified=False))
            kept.append(first.replace(src=(value, *first.src[1:])))
        replacements[node] = functools.reduce(lambda a, b: a.alu(Ops.ADD, b), kept)
    return substitute(sink, replacements) if replacements else sink


def share_reduce_loops(sink: UOp) -> UOp:
    """Reduces over loops of the same sizes, none reading another, over the same loops: one pass over the inputs,
    which they share (a variance's sums of the deviations and of their squares), and a kernel the heuristic blocks
    as a one-reduce kernel (std along axis 0 of 4096 x 1024 ran at 0.3 GFLOP/s, its columns one at a time)."""
    groups: dict[tuple, list[UOp]] = {}
    for node in kernel_nodes(sink):
        if node.op is Ops.RANGE_REDUCE:
            key = tuple((loop.src[0].arg, loop.arg[1]) for loop in node.src[1:])
            groups.setdefault(key, []).append(node)
    replacements: dict[UOp, UOp] = {}
    used = loops_used(sink)
    for group in groups.values():
        first, sharing = group[0], [group[0]]
        for other in group[1:]:
            # (none may read another that runs in the same loops: it would read it mid-sum; and all run inside the
            # same output loops, so the nest they share opens in one place)
            if used[other] != used[first] or any(
                member in other.src[0].toposort or other in member.src[0].toposort for member in sharing
            ):
                continue
            sharing.append(other)
            if other.src[1:] != first.src[1:]:
                loops = dict(zip(other.src[1:], first.src[1:]))
                replacements[other] = other.replace(src=(replace_ranges(other.src[0], loops, {}), *first.src[1:]))
    return substitute(sink, replacements) if replacements else sink


def prepare(sink: UOp) -> UOp:
    """What every optimized kernel gets before its actions: summed reduces over loops of the same sizes become one
    (`merge_summed_reduces`), other reduces over loops of the same sizes share them (`share_reduce_loops`), and
    reduce loops its values do not depend on are dropped (a sum of a broadcast is a product; the gradient of a sum
    or mean reaches a layer as a broadcast constant)."""
    sink = share_reduce_loops(merge_summed_reduces(sink))
    replacements: dict[UOp, UOp] = {}
    for node in kernel_nodes(sink):
        if node.op is not Ops.RANGE_REDUCE or node.arg not in (Ops.ADD, Ops.MAX):
            continue
        used = set(node.src[0].toposort)
        unused = [loop for loop in node.src[1:] if loop not in used]
        if not unused:
            continue
        value = node.src[0]
        if node.arg is Ops.ADD:
            value = value.alu(Ops.MUL, UOp.const(value.dtype, prod(loop.src[0].arg for loop in unused)))
        rest = tuple(loop for loop in node.src[1:] if loop in used)
        replacements[node] = node.replace(src=(value, *rest)) if rest else value
    return replace_ranges(sink, replacements, {}) if replacements else sink


def apply_opts(sink: UOp, opts: tuple[Opt, ...], target: Target | None = None) -> UOp:
    """The prepared kernel `sink` with `opts` applied in order (for a device `target`: the thread actions need
    one with threads), its gated loads simplified last."""
    for opt in opts:
        sink = apply_opt(sink, opt, target)
    return simplify_gated_loads(sink)
