"""Accumulators that a renderer can keep in vector registers: the lanes of a register block.

An UPCAST makes one accumulator per output of a block, each updated once per iteration of the reduce loop with its
own scalar ops. Where `width` of them, updated in one loop nest, each add a product of one common value (the same
node for all) and a load from consecutive elements of one buffer (or add the loads themselves), they are one vector
accumulator: one vector load, one multiply-add. That is what a compiler's SLP vectorizer would find, found here for
compilers that do not (gcc 12 leaves a register block of a C kernel scalar) and so that a renderer can write less.

The vector update computes each lane exactly as the scalar updates did (the same products, added in the same order),
so a vectorized kernel gives the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import ALU, Ops, UOp

VECTOR_DTYPES = (dtypes.float32, dtypes.float64)


@dataclass(frozen=True)
class AccumulatorVector:
    """`width` accumulators (DEFINE_ACC, in lane order) updated as one vector: each iteration of `loops` adds `loads`
    (in lane order, consecutive elements of one buffer; the first's index is where the vector is read) times `common`
    (None: the loads themselves)."""

    accumulators: tuple[UOp, ...]
    loads: tuple[UOp, ...]
    common: UOp | None
    loops: tuple[UOp, ...]


def _offset(index: UOp) -> tuple[UOp | None, int]:
    """`index` as (the rest, a constant it adds)."""
    if index.op is Ops.CONST:
        return None, index.arg
    if index.op is Ops.ADD and index.src[1].op is Ops.CONST:
        return index.src[0], index.src[1].arg
    if index.op is Ops.ADD and index.src[0].op is Ops.CONST:
        return index.src[1], index.src[0].arg
    return index, 0


def _plain_load(node: UOp) -> bool:
    """A load of memory with no mask (a load of the stack or shared memory never has one)."""
    if node.op is not Ops.LOAD:
        return False
    return node.src[0].op is Ops.DEFINE_LOCAL or (node.src[0].op is Ops.DEFINE_GLOBAL and len(node.src) == 2)


def accumulator_vectors(program: list[UOp], width: int) -> list[AccumulatorVector]:
    """The accumulators of `program` (a linear program) that run as vectors of `width` float32 lanes (half as many
    float64 lanes), each accumulator in one vector at most."""
    updates: dict[UOp, tuple[UOp, UOp]] = {}  # accumulator -> (its read in the loop, the value each iteration adds)
    for node in program:
        if node.op is Ops.STORE and node.src[0].op is Ops.DEFINE_ACC:
            accumulator, updated = node.src
            if updated.op is Ops.ADD and updated.src[0].op is Ops.LOAD and updated.src[0].src[0] is accumulator:
                updates[accumulator] = updated.src
    # candidates by what they share: (loops, buffer, common value, the rest of the index) -> {offset: (acc, load)}
    candidates: dict[tuple, dict[int, tuple[UOp, UOp]]] = {}
    for node in program:
        if node.op is not Ops.DEFINE_ACC or node.dtype not in VECTOR_DTYPES or node not in updates:
            continue
        current, value = updates[node]
        if _plain_load(value):
            roles = [(value, None)]
        elif value.op is Ops.MUL:
            roles = [(a, b) for a, b in (value.src, value.src[::-1]) if _plain_load(a) and a.dtype == node.dtype]
        else:
            continue
        for load, common in roles:
            rest, offset = _offset(load.src[1])
            candidates.setdefault((current.src[1:], load.src[0], common, rest), {}).setdefault(offset, (node, load))
    lanes = {dtypes.float32: width, dtypes.float64: width // 2}
    vectors, taken = [], set()
    for (loops, _, common, _), by_offset in candidates.items():
        offsets = sorted(by_offset)
        position = 0
        while position < len(offsets):
            first = offsets[position]
            size = lanes[by_offset[first][0].dtype]
            run = [first + lane for lane in range(size)]
            members = [by_offset.get(offset) for offset in run]
            if size > 1 and all(member is not None and member[0] not in taken for member in members):
                accumulators, loads = tuple(m[0] for m in members), tuple(m[1] for m in members)
                vectors.append(AccumulatorVector(accumulators, loads, common, loops))
                taken.update(m[0] for m in members)
                position += size
            else:
                position += 1
    return vectors


def lanes_of(vectors: list[AccumulatorVector]) -> dict[UOp, tuple[int, int]]:
    """Each accumulator of `vectors`: (its vector's position in the list, its lane)."""
    return {a: (number, lane) for number, vector in enumerate(vectors) for lane, a in enumerate(vector.accumulators)}


# values of a program with no effect of their own: a renderer may leave one out where nothing it renders reads it
PURE = {Ops.LOAD, Ops.CAST, Ops.BITCAST} | set(ALU)


def replaced_by_vectors(program: list[UOp], vectors: list[AccumulatorVector]) -> set[UOp]:
    """The nodes of `program` the vectors stand in for: each accumulator's scalar update (its read in the loop, its
    add and its store), and the values only those read (the lanes' products and loads, and their indices)."""
    if not vectors:
        return set()
    accumulators = {accumulator for vector in vectors for accumulator in vector.accumulators}
    replaced: set[UOp] = set()
    for node in program:
        if node.op is Ops.STORE and node.src[0] in accumulators:
            replaced.update((node, node.src[1], node.src[1].src[0]))
    # what the vector updates read: the first lane's index, and the common value
    needed = {vector.loads[0].src[1] for vector in vectors} | {v.common for v in vectors if v.common is not None}
    users: dict[UOp, list[UOp]] = {}
    for node in program:
        for source in node.src:
            users.setdefault(source, []).append(node)
    for node in reversed(program):  # (users before the values they read)
        if node in replaced or node in needed or node.op not in PURE or node.src[0].op is Ops.DEFINE_ACC:
            continue
        if all(user in replaced for user in users.get(node, ())):
            replaced.add(node)
    return replaced
