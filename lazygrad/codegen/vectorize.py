"""Accumulators that a renderer can keep in vector registers: the lanes of a register block.

An UPCAST makes one accumulator per output of a block, each updated once per iteration of the reduce loop with its
own scalar ops. Where `width` of them, updated in one loop nest, each add a product of one common value (the same
node for all) and a load from consecutive elements of one buffer (or add the loads themselves), they are one vector
accumulator: one vector load, one multiply-add. That is what a compiler's SLP vectorizer would find, found here for
compilers that do not (gcc 12 leaves a register block of a C kernel scalar) and so that a renderer can write less.

The vector update computes each lane exactly as the scalar updates did (the same products, added in the same order),
so a vectorized kernel gives the same values.

The same holds after the reduce: a block's outputs are stored one scalar at a time, each computed from its
accumulator by the same ops (a bias, a relu), as are a copy's elements (a PACK). Where `width` stores write
consecutive elements of one buffer the same computation lane by lane (`StoreVector`), they are one vector
computation and one vector store.

A renderer that computes in scalars (CUDA C) still reads and writes memory in vectors: `wide_accesses` finds the
loads and stores of consecutive, aligned elements that it makes as one access (a float4), each lane then a scalar.
"""

from __future__ import annotations

from dataclasses import dataclass

from lazygrad.dtype import dtypes
from lazygrad.uop.ops import ALU, Ops, UOp

VECTOR_DTYPES = (dtypes.float32, dtypes.float64)


@dataclass(frozen=True)
class AccumulatorVector:
    """`width` accumulators (DEFINE_ACC, in lane order) updated as one vector: each iteration of `loops` adds `loads`
    (in lane order, elements `stride` apart in one buffer; the first's index is where the vector is read) times
    `common` (None: the loads themselves); or, where `value` is given (and `loads` empty), that computation's lanes
    (a sum of products: `x @ w1 + y @ w2` in one reduce)."""

    accumulators: tuple[UOp, ...]
    loads: tuple[UOp, ...]
    common: UOp | None
    loops: tuple[UOp, ...]
    value: Lanes | None = None
    stride: int = 1


def split_offset(index: UOp) -> tuple[UOp | None, int]:
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


def _plain_loads(value: UOp) -> list[UOp]:
    """The plain loads a value reads, in the order of a walk from it (sources in order, each node once)."""
    loads, seen, stack = [], set(), [value]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if _plain_load(node):
            loads.append(node)
        elif node.op in ALU:
            stack.extend(reversed(node.src))
    return loads


def accumulator_vectors(
    program: list[UOp], width: int, trees: bool = False, strided: bool = False, interleaved: bool = False
) -> list[AccumulatorVector]:
    """The accumulators of `program` (a linear program) that run as vectors of `width` float32 lanes (half as many
    float64 lanes), each accumulator in one vector at most. With `trees`, also those that add any computation that
    is one lane by lane (`Lanes`), not only a load or a load times a common value. With `strided`, also loads of
    elements a fixed stride apart (a register block of a convolution's output channels reads one weight per
    channel, a whole filter apart), for a renderer that gathers them: each lane's scalar update would be its own
    multiply-add; a gather is kept where other vectors of the block share it (one alone does worse than a loop
    the compiler vectorizes along the reduce). With `interleaved`, also loads of every other element (a convolution
    with stride 2: a block's outputs along an image row read its pixels two apart), for a renderer that reads them
    as contiguous vectors and a shuffle."""
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
            rest, offset = split_offset(load.src[1])
            candidates.setdefault((current.src[1:], load.src[0], common, rest), {}).setdefault(offset, (node, load))
    lanes = {dtypes.float32: width, dtypes.float64: width // 2}
    vectors: list[AccumulatorVector] = []
    taken: set[UOp] = set()
    _runs(candidates, lanes, taken, vectors, steps={1})  # vector loads first: a gather only where none is
    if interleaved:
        _runs(candidates, lanes, taken, vectors, steps=set(LOAD_STRIDES[1:]))
    if strided:
        gathers: list[AccumulatorVector] = []
        _runs(candidates, lanes, taken, gathers, steps=None)
        shared: dict[UOp, int] = {}
        for vector in gathers:
            shared[vector.loads[0]] = shared.get(vector.loads[0], 0) + 1
        for vector in gathers:
            if shared[vector.loads[0]] > 1:
                vectors.append(vector)
            else:
                taken.difference_update(vector.accumulators)
    if trees:
        left = {a: update for a, update in updates.items() if a not in taken and a.dtype in VECTOR_DTYPES}
        # (a renderer that reads every other element, or gathers, reads a computation's lanes so too)
        vectors += _computed_vectors(left, lanes, LOAD_STRIDES if interleaved or strided else (1,))
    return vectors


def _runs(
    candidates: dict, lanes: dict, taken: set[UOp], vectors: list[AccumulatorVector], steps: set[int] | None
) -> None:
    """Add the vectors of each candidate group (offset -> (accumulator, load)) whose loads are a fixed stride apart,
    a stride of `steps` (None: any but 1), to `vectors`; their accumulators to `taken`."""
    for (loops, _, common, _), by_offset in candidates.items():
        offsets = sorted(by_offset)
        for at, first in enumerate(offsets):
            size = lanes[by_offset[first][0].dtype]
            if size < 2 or by_offset[first][0] in taken or at + 1 == len(offsets):
                continue
            step = offsets[at + 1] - first
            if step not in steps if steps is not None else step == 1:
                continue
            members = [by_offset.get(first + lane * step) for lane in range(size)]
            if all(member is not None and member[0] not in taken for member in members):
                accumulators, loads = tuple(m[0] for m in members), tuple(m[1] for m in members)
                vectors.append(AccumulatorVector(accumulators, loads, common, loops, stride=step))
                taken.update(accumulators)


def _computed_vectors(
    updates: dict[UOp, tuple[UOp, UOp]], lanes: dict, strides: tuple[int, ...]
) -> list[AccumulatorVector]:
    """Vectors of accumulators that each add a computation that is one lane by lane (a product of two loads that
    both move from lane to lane too, where `_runs` found no common factor). Lane neighbours read the same buffers at
    the same places but for loads that move by one of `strides` from lane to lane: accumulators are grouped by the
    buffers and places their loads read, and a vector is a run whose loads' offsets step by the same amounts."""
    shapes: dict[tuple, dict[tuple[int, ...], UOp]] = {}
    for accumulator, (current, value) in updates.items():
        if value.op not in ALU:
            continue
        loads = [(load.src[0], *split_offset(load.src[1])) for load in _plain_loads(value)]
        if loads:
            key = (current.src[1:], accumulator.dtype, tuple((buffer, rest) for buffer, rest, _ in loads))
            shapes.setdefault(key, {}).setdefault(tuple(offset for _, _, offset in loads), accumulator)
    vectors, taken = [], set()
    for (loops, dtype, _), by_offsets in shapes.items():
        size, offsets = lanes[dtype], sorted(by_offsets)
        for first in offsets if size > 1 else ():
            if by_offsets[first] in taken:
                continue
            # (consecutive loads before every other one: a row of outputs is read by plain vectors where it can be)
            steps = {tuple(b - a for a, b in zip(first, other)) for other in offsets}
            for step in sorted(steps, key=lambda step: (max(step), step)):
                if not (set(step) <= {0, *strides} and any(step)):
                    continue
                run = [by_offsets.get(tuple(a + lane * d for a, d in zip(first, step))) for lane in range(size)]
                if any(member is None or member in taken for member in run):
                    continue
                # (a reduce's loop stores nothing its updates read: the lanes' loads may all be made at the first's)
                value = _lanes(tuple(updates[member][1] for member in run), {}, set(), ())
                if value is not None:
                    vectors.append(AccumulatorVector(tuple(run), (), None, loops, value))
                    taken.update(run)
                    break
    return vectors


@dataclass(frozen=True)
class Lanes:
    """One value per lane, computed as one vector: `kind` "same" (one node in every lane), "constants", "load"
    (elements `stride` apart in one buffer, consecutive or every other, read from the first lane's index),
    "accumulators" (the lanes of one `AccumulatorVector`, in order: `vector` is its position), "scalars" (scalar
    accumulators read after their loop, put together) or "op" (one op in every lane, on `sources`)."""

    kind: str
    nodes: tuple[UOp, ...]
    sources: tuple[Lanes, ...] = ()
    vector: int = -1
    stride: int = 1


@dataclass(frozen=True)
class StoreVector:
    """Stores (in lane order) of consecutive elements of one buffer in one loop nest, of `value`'s lanes."""

    stores: tuple[UOp, ...]
    value: Lanes
    loops: tuple[UOp, ...]  # the loops open around them
    last: UOp  # the store that comes last in the program: where the vector store stands


# the ops a vector of lanes computes: float arithmetic and comparisons, and logic on their results (casts, integer
# ops with their wrap-around and division rules, and transcendental calls stay scalar)
LANE_OPS = {
    Ops.ADD,
    Ops.MUL,
    Ops.NEG,
    Ops.MAX,
    Ops.CMPLT,
    Ops.CMPNE,
    Ops.WHERE,
    Ops.RECIP,
    Ops.FDIV,
    Ops.SQRT,
    Ops.AND,
    Ops.OR,
    Ops.XOR,
}
LANE_DTYPES = (*VECTOR_DTYPES, dtypes.bool)
# the strides of a vector load: consecutive elements, or every other one (the pixels a convolution with stride 2
# reads along an image row, two loads and a shuffle)
LOAD_STRIDES = (1, 2)


def _loop_nests(program: list[UOp]) -> dict[UOp, tuple[UOp, ...]]:
    """Each node of `program`: the loops open around it."""
    nests, open_loops = {}, ()
    for node in program:
        if node.op is Ops.ENDRANGE:
            open_loops = open_loops[:-1]
        nests[node] = open_loops
        if node.op is Ops.RANGE:
            open_loops = (*open_loops, node)
    return nests


def _lanes(
    nodes: tuple[UOp, ...],
    lane_of: dict[UOp, tuple[int, int]],
    written: set[UOp],
    stores: tuple[UOp, ...],
    seen: dict | None = None,
) -> Lanes | None:
    """`nodes` (one per lane) as one vector computation for `stores`, or None. The vector's loads happen where the
    last store stands, after the others' scalar places: so no load of a buffer the kernel writes (`written`), but
    of the stores' own buffer, each lane at the element it stores (an update in place). `seen` holds the answers
    so far: lanes share their subexpressions (an exp's expansion reads its argument many times), and without it a
    value is walked once per path to it, exponentially many."""
    seen = {} if seen is None else seen
    if nodes not in seen:
        seen[nodes] = _lanes_of_nodes(nodes, lane_of, written, stores, seen)
    return seen[nodes]


def _lanes_of_nodes(nodes, lane_of, written, stores, seen) -> Lanes | None:
    first = nodes[0]
    if first.dtype not in LANE_DTYPES or any(node.dtype != first.dtype for node in nodes):
        return None
    if all(node is first for node in nodes):  # (computed where it stands, as a scalar)
        return None if first.op is Ops.LOAD and first.src[0] in written else Lanes("same", nodes)
    if all(node.op is Ops.CONST for node in nodes):
        return Lanes("constants", nodes)
    if all(node.op is Ops.LOAD for node in nodes) and first.dtype != dtypes.bool:
        buffer = first.src[0]
        if all(_plain_load(node) and node.src[0] is buffer for node in nodes):
            if buffer in written:
                in_place = buffer is stores[0].src[0] and all(n.src[1] is s.src[1] for n, s in zip(nodes, stores))
                return Lanes("load", nodes) if in_place else None
            rest, start = split_offset(first.src[1])
            offsets = [split_offset(node.src[1]) for node in nodes]
            for step in LOAD_STRIDES:
                if all(r is rest and offset == start + lane * step for lane, (r, offset) in enumerate(offsets)):
                    return Lanes("load", nodes, stride=step)
        if all(len(node.src) == 1 and node.src[0].op is Ops.DEFINE_ACC for node in nodes):  # after their loop
            if all(node.src[0] not in lane_of for node in nodes):
                return Lanes("scalars", nodes)
            number = lane_of.get(first.src[0], (-1,))[0]
            if [lane_of.get(node.src[0]) for node in nodes] == [(number, lane) for lane in range(len(nodes))]:
                return Lanes("accumulators", nodes, vector=number)
        return None
    if first.op not in LANE_OPS or any(node.op is not first.op for node in nodes):
        return None
    if first.op is Ops.NEG and first.dtype == dtypes.bool:
        return None
    sources = []
    for position in range(len(first.src)):
        lanes = _lanes(tuple(node.src[position] for node in nodes), lane_of, written, stores, seen)
        if lanes is None:
            return None
        sources.append(lanes)
    return Lanes("op", nodes, tuple(sources))


def store_vectors(program: list[UOp], width: int, vectors: list[AccumulatorVector]) -> list[StoreVector]:
    """The stores of `program` that run as vector stores of `width` float32 lanes (half as many float64 lanes): runs
    of stores to consecutive elements of one buffer, in one loop nest, whose values are one computation lane by lane
    (reading an accumulator vector's lanes in order, consecutive elements of memory, the same value or constants)."""
    nests, lane_of = _loop_nests(program), lanes_of(vectors)
    position = {node: number for number, node in enumerate(program)}
    stores = [node for node in program if node.op is Ops.STORE and len(node.src) == 3]
    written = {node.src[0] for node in stores}
    candidates: dict[tuple, dict[int, UOp]] = {}
    for node in stores:
        buffer, index, value = node.src
        if buffer.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL) and value.dtype in VECTOR_DTYPES:
            rest, offset = split_offset(index)
            candidates.setdefault((buffer, rest, nests[node], value.dtype), {}).setdefault(offset, node)
    found = []
    for (_, _, loops, dtype), by_offset in candidates.items():
        size = width if dtype == dtypes.float32 else width // 2
        offsets = sorted(by_offset)
        at = 0
        while size > 1 and at < len(offsets):
            run = [by_offset.get(offsets[at] + lane) for lane in range(size)]
            if all(store is not None for store in run):
                lanes = _lanes(tuple(store.src[2] for store in run), lane_of, written, tuple(run))
                if lanes is not None:
                    found.append(StoreVector(tuple(run), lanes, loops, max(run, key=position.__getitem__)))
                    at += size
                    continue
            at += 1
    return found


def lanes_of(vectors: list[AccumulatorVector]) -> dict[UOp, tuple[int, int]]:
    """Each accumulator of `vectors`: (its vector's position in the list, its lane)."""
    return {a: (number, lane) for number, vector in enumerate(vectors) for lane, a in enumerate(vector.accumulators)}


# values of a program with no effect of their own: a renderer may leave one out where nothing it renders reads it
PURE = {Ops.LOAD, Ops.CAST, Ops.BITCAST} | set(ALU)


def replaced_by_vectors(
    program: list[UOp], vectors: list[AccumulatorVector], stored: list[StoreVector] | tuple = ()
) -> set[UOp]:
    """The nodes of `program` the vectors stand in for: each accumulator's scalar update (its read in the loop, its
    add and its store), each vector store's scalar stores, and the values only those read (the lanes' products and
    loads, their indices, the accumulators' reads after their loop)."""
    if not vectors and not stored:
        return set()
    accumulators = {accumulator for vector in vectors for accumulator in vector.accumulators}
    replaced: set[UOp] = set()
    for node in program:
        if node.op is Ops.STORE and node.src[0] in accumulators:
            replaced.update((node, node.src[1], node.src[1].src[0]))
    # what the vectors read as scalars: the first lane's index, the common value, a value every lane shares
    needed = {vector.loads[0].src[1] for vector in vectors if vector.loads}
    needed |= {vector.common for vector in vectors if vector.common is not None}
    lanes = [group.value for group in stored] + [vector.value for vector in vectors if vector.value is not None]
    while lanes:
        value = lanes.pop()
        if value.kind == "same":
            needed.add(value.nodes[0])
        elif value.kind == "scalars":
            needed.update(value.nodes)
        elif value.kind == "load":
            needed.add(value.nodes[0].src[1])
        lanes.extend(value.sources)
    for group in stored:
        replaced.update(group.stores)
        needed.add(group.stores[0].src[1])
    users: dict[UOp, list[UOp]] = {}
    for node in program:
        for source in node.src:
            users.setdefault(source, []).append(node)
    for node in reversed(program):  # (users before the values they read)
        # (an accumulator's read inside its loop stays: its update reads it, or its vector's update stands there)
        if node in replaced or node in needed or node.op not in PURE:
            continue
        if node.src[0].op is Ops.DEFINE_ACC and len(node.src) > 1:
            continue
        if all(user in replaced for user in users.get(node, ())):
            replaced.add(node)
    return replaced


# ---- wide accesses: vectors of memory, lanes computed as scalars -----------------------------------------------

WIDE_DTYPES = (dtypes.float32, dtypes.int32, dtypes.uint32, dtypes.float64, dtypes.int64, dtypes.uint64)


@dataclass(frozen=True)
class WideAccess:
    """Loads (or stores) of consecutive elements of one buffer of device memory, in lane order, that a renderer
    computing in scalars makes as one access of all their bytes (CUDA's float4): the first lane's element is a
    multiple of the lanes wherever the kernel reads it, so the access is aligned to its size. No loop opens or
    closes between the lanes. The wide load stands at the lane that comes first in the program, `leader` (every
    lane's index is its index plus the difference of their lanes); the lanes come in lane order, except where the
    kernel never writes the memory they read. The wide store stands at the last lane's store (every lane's value is
    computed by then)."""

    nodes: tuple[UOp, ...]
    leader: int = 0


def multiple_of(index: UOp, lanes: int) -> bool:
    """Whether integer `index` is a multiple of `lanes` for every value of the loops and thread indices in it: a
    constant that is, a sum of such terms, a product with one (`x * 4`, `(t * 4) * y`) or a shift past it."""
    if index.op is Ops.CONST:
        return index.arg % lanes == 0
    if index.op is Ops.ADD:
        return all(multiple_of(source, lanes) for source in index.src)
    if index.op is Ops.MUL:
        return any(multiple_of(source, lanes) for source in index.src)
    if index.op is Ops.SHL and index.src[1].op is Ops.CONST:
        return (1 << index.src[1].arg) % lanes == 0 or multiple_of(index.src[0], lanes)
    return False


def wide_accesses(program: list[UOp], wide_bytes: int) -> list[WideAccess]:
    """The loads and stores of `program` (a linear program) made as accesses of `wide_bytes` each: runs of plain
    loads (unmasked stores) of a 4- or 8-byte type at consecutive elements of one buffer of device memory, whose
    first element is a multiple of the run's length (see `WideAccess`), where moving the lanes to one place changes
    nothing (see `_apart`): an update in place (an optimizer's) reads its vector and writes it back."""
    position = {node: at for at, node in enumerate(program)}
    written = {node.src[0] for node in program if node.op is Ops.STORE}
    # (a loop opened twice repeats nodes of its first body: a lane there would be rendered twice, once where its
    # vector is out of scope or not yet read)
    repeated = {node for at, node in enumerate(program) if position[node] != at}
    # (op, buffer, the index but its constant, dtype) -> {constant: access}
    candidates: dict[tuple, dict[int, UOp]] = {}
    for node in program:
        if node.op is Ops.LOAD and _plain_load(node) and node.src[0].op is Ops.DEFINE_GLOBAL:
            dtype = node.dtype
        elif node.op is Ops.STORE and len(node.src) == 3 and node.src[0].op is Ops.DEFINE_GLOBAL:
            dtype = node.src[2].dtype
        else:
            continue
        if dtype in WIDE_DTYPES and wide_bytes > dtype.itemsize:
            rest, offset = split_offset(node.src[1])
            candidates.setdefault((node.op, node.src[0], rest, dtype), {}).setdefault(offset, node)
    found = []
    for (op, buffer, rest, dtype), by_offset in candidates.items():
        lanes = wide_bytes // dtype.itemsize
        if rest is not None and not multiple_of(rest, lanes):
            continue
        for first in sorted(offset for offset in by_offset if offset % lanes == 0):
            run = tuple(by_offset.get(first + lane) for lane in range(lanes))
            if any(node is None or node in repeated for node in run):
                continue
            places = [position[node] for node in run]
            # (lanes out of order cross no access of memory nothing writes: an integer sum's linearized lanes)
            if places != sorted(places) and (op is not Ops.LOAD or buffer in written):
                continue
            if all(_apart(node, run, position) for node in program[min(places) + 1 : max(places)]):
                found.append(WideAccess(run, places.index(min(places))))
    return found


def _apart(node: UOp, run: tuple[UOp, ...], position: dict[UOp, int]) -> bool:
    """Whether `node`, between the lanes of `run`, lets them be made at one place (a load run at its first lane, a
    store run at its last): it opens or closes no loop, and any access of the run's buffer keeps its order with the
    lane of the same element. A load run is read earlier, so a store between may write only an element whose lane
    was read before it (an update in place: each element read, then written); a store run is written later, so an
    access between may touch only an element whose lane is written after it. An element outside the run, or one
    not provably the same (another index), keeps them apart; loads between loads never do."""
    if node.op in (Ops.RANGE, Ops.ENDRANGE):
        return False
    first = run[0]
    if node.op is Ops.WIDE_COPY:  # (a read of its third source, into shared memory: keeps a store run apart)
        return first.op is Ops.LOAD or node.src[2] is not first.src[0]
    if node in run or node.op not in (Ops.LOAD, Ops.STORE) or not node.src or node.src[0] is not first.src[0]:
        return True
    if first.op is Ops.LOAD and node.op is Ops.LOAD:
        return True
    rest, offset = split_offset(node.src[1])
    for member in run:
        if (element := split_offset(member.src[1]))[0] is rest and element[1] == offset:
            moved_past = (
                position[member] > position[node] if first.op is Ops.LOAD else position[member] < position[node]
            )
            return not moved_past
    return False
