"""The tensor-core action, TC(axis): a matrix product's reduce loop `axis` runs on the warp-level matrix
multiply-accumulate of a tensor core (the target's `tensor_cores`).

A block is one warp. It computes an m × n tile of the outputs (the innermost output loop along which the first
input of the product moves and the second is fixed gives the tile's rows, the innermost one the other way round its
columns), k reduce iterations at a time: each iteration the warp's threads copy the inputs' m × k and k × n tiles
into shared memory (any prologue computed on the way, each input laid out as it lies in memory, so that
neighbouring threads copy neighbouring elements), wait at a barrier, and multiply-accumulate the tiles into the
warp's accumulator (a WMMA). After the loop the accumulator goes to shared memory, and each thread reads m·n/32 of
its values back for the rest of the kernel (the cast, an epilogue, the store), neighbouring threads neighbouring
columns.

A fragment (the tiles and the accumulator the warp holds together) is a value of the kernel graph like any other:
the reduce over the loop is the sum of the WMMAs (the linearizer makes it one accumulator the WMMA adds into), and
a store of it into shared memory is the warp's store of the whole accumulator. The product is the sum of the exact
products of the inputs (half, bfloat16 or TF32: what a tensor core computes) in float32, not the product rounded to
the inputs' type first, which the same kernel computes without TC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lazygrad.codegen.opt import (
    KernelOptError,
    kernel_nodes,
    loops_by_axis,
    loops_used,
    new_loop,
    output_loops,
    replace_ranges,
    shared_bytes,
    stride,
    upcast,
)
from lazygrad.dtype import dtypes
from lazygrad.uop.ops import LoopKind, Ops, UOp
from lazygrad.uop.symbolic import simplify

if TYPE_CHECKING:
    from lazygrad.codegen.renderer import Target, TensorCore


def product_operands(name: str, reduce: UOp) -> tuple[UOp, UOp, UOp]:
    """The product a sum reduces, as (the product, its first input, its second): `cast(float, a * b)` for inputs
    of a narrow float type, `a * b` for float32."""
    value = reduce.src[0]
    product = value.src[0] if value.op is Ops.CAST else value
    if reduce.arg is not Ops.ADD or product.op is not Ops.MUL:
        raise KernelOptError(f"{name}: the reduce is not a sum of products")
    return product, product.src[0], product.src[1]


def choose_core(name: str, product: UOp, reduce: UOp, target: Target, allow_tf32: bool) -> TensorCore:
    """The target's tensor core for a product of `product`'s type summed in `reduce`'s."""
    core = next((c for c in target.tensor_cores if c.input == product.dtype and c.accumulator == reduce.dtype), None)
    if core is None:
        kinds = ", ".join(f"{c.input.name} into {c.accumulator.name}" for c in target.tensor_cores)
        raise KernelOptError(
            f"{name}: no tensor core multiplies {product.dtype.name} into {reduce.dtype.name} (the device's: {kinds})"
        )
    if product.dtype == dtypes.float32 and not allow_tf32:
        raise KernelOptError(
            f"{name}: float32 products run on tensor cores in TF32 only where allowed "
            "(Tensor.allow_tf32(), ALLOW_TF32=1)"
        )
    return core


def row_major(value: UOp, rows: UOp, columns: UOp) -> bool:
    """Whether an input tile is copied along its columns (row-major): unless the input moves by one element along
    its rows in memory and by more along its columns (a transposed matrix), so that neighbouring threads copy
    neighbouring memory."""
    indices = [node.src[1] for node in value.toposort if node.op is Ops.LOAD and node.src[0].op is Ops.DEFINE_GLOBAL]
    along_rows = any(stride(index, rows) == 1 for index in indices)
    return not along_rows or any(stride(index, columns) == 1 for index in indices)


def stage(value: UOp, tile: tuple[UOp, UOp], shape: tuple[int, int], lane: UOp, threads: int, shared: UOp):
    """The stores of the warp's copy of input `value` into `shared`, and the tile's layout there: the tile of
    `shape` (rows, columns) that `tile` gives as (the input's loop, the loop over tiles that replaces it) for its rows
    and its columns, each thread copying every `threads`-th element from its `lane` on."""
    (row_loop, row_start), (column_loop, column_start) = tile
    rows, columns = shape
    layout = "row" if row_major(value, row_loop, column_loop) else "col"
    stores = []
    for copy in range(rows * columns // threads):
        element = lane + copy * threads
        if layout == "row":
            row, column = element // columns, element % columns
        else:
            row, column = element % rows, element // rows
        position = {row_loop: row_start * rows + row, column_loop: column_start * columns + column}
        stores.append(UOp(Ops.STORE, src=(shared, simplify(element), replace_ranges(value, position, {}))))
    return stores, layout


def tensor_core(sink: UOp, loop: UOp, target: Target | None, allow_tf32: bool) -> UOp:
    """`sink` with the sum of products over reduce loop `loop` made on the target's tensor cores (see above)."""
    name = f"TC({loop.arg[0]})"
    if target is None or not target.tensor_cores:
        raise KernelOptError(f"{name}: the device has no tensor cores")
    if loop.arg[1] is not LoopKind.REDUCE:
        raise KernelOptError(f"{name}: loop {loop.arg[0]} is a {loop.arg[1].name.lower()} loop, not a reduce loop")
    if any(node.arg[1] is not LoopKind.GLOBAL for node in output_loops(sink)):
        raise KernelOptError(f"{name}: a block is one warp: TC comes before any thread action (LOCAL, LOOP)")
    reduces = [node for node in kernel_nodes(sink) if node.op is Ops.RANGE_REDUCE]
    if len(reduces) != 1 or reduces[0].src[1:] != (loop,):
        raise KernelOptError(f"{name}: the kernel must have one reduce, over loop {loop.arg[0]} alone")
    (reduce,) = reduces
    product, first, second = product_operands(name, reduce)
    if any(node.op is Ops.RANGE_REDUCE for node in reduce.src[0].toposort):
        raise KernelOptError(f"{name}: the product holds another reduce")
    core = choose_core(name, product, reduce, target, allow_tf32)
    (m, n, k), threads = core.dims, core.threads
    used = loops_used(sink)
    global_loops = output_loops(sink)
    rows = [node for node in global_loops if node in used[first] and node not in used[second]]
    columns = [node for node in global_loops if node in used[second] and node not in used[first]]
    if not rows or not columns:
        raise KernelOptError(f"{name}: not a matrix product: no output loop along which one input moves, the other not")
    row, column = rows[-1], columns[-1]
    for what, node, size in (("rows", row, m), ("columns", column, n), ("reduce", loop, k)):
        if node.src[0].arg % size:
            raise KernelOptError(
                f"{name}: the tensor core takes {size} {what} at a time; loop {node.arg[0]} has {node.src[0].arg}"
            )
    if threads > target.max_threads or threads % n or m % (threads // n):
        raise KernelOptError(f"{name}: a warp of {threads} threads does not fit this target's blocks")
    taken = [node for node in kernel_nodes(sink) if node.op is Ops.DEFINE_LOCAL]
    memory = sum(shared_bytes(node.dtype) * node.arg[1] for node in taken)
    memory += (m * k + k * n) * product.dtype.itemsize + m * n * core.accumulator.itemsize
    if memory > target.shared_memory:
        raise KernelOptError(
            f"{name}: the tiles need {memory} bytes of shared memory, the device has {target.shared_memory}"
        )
    # the warp's threads: `across` along the tile's columns, `down` rows of them; each thread's `part` loop reads its
    # m·n/threads values of the accumulator back (upcast: straight-line code)
    top = max(loops_by_axis(sink))
    down = threads // n
    lane_row = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, down),), (top + 1, LoopKind.LOCAL))
    lane_column = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, n),), (top + 2, LoopKind.LOCAL))
    part = UOp(Ops.RANGE, loop.dtype, (UOp.const(loop.dtype, m // down),), (top + 3, LoopKind.LOOP))
    lane = lane_row * n + lane_column
    row_tile, column_tile = new_loop(row, row.src[0].arg // m), new_loop(column, column.src[0].arg // n)
    step = new_loop(loop, loop.src[0].arg // k)
    number = len(taken)
    shared_a = UOp(Ops.DEFINE_LOCAL, product.dtype, (), (number, m * k))
    shared_b = UOp(Ops.DEFINE_LOCAL, product.dtype, (), (number + 1, k * n))
    shared_c = UOp(Ops.DEFINE_LOCAL, core.accumulator, (), (number + 2, m * n))
    stores_a, layout_a = stage(first, ((row, row_tile), (loop, step)), (m, k), lane, threads, shared_a)
    stores_b, layout_b = stage(second, ((loop, step), (column, column_tile)), (k, n), lane, threads, shared_b)
    copied = UOp(Ops.BARRIER, src=(*stores_a, *stores_b))
    wmma = UOp(Ops.WMMA, core.accumulator, (shared_a, shared_b, copied), (m, n, k, layout_a, layout_b))
    accumulated = UOp(Ops.RANGE_REDUCE, core.accumulator, (wmma, step), Ops.ADD)
    stored = UOp(Ops.BARRIER, src=(UOp(Ops.STORE, src=(shared_c, UOp.const(loop.dtype, 0), accumulated)),))
    tile_row = part * down + lane_row
    value = UOp(Ops.LOAD, core.accumulator, (shared_c, tile_row * n + lane_column, stored))
    replacements = {reduce: value, row: row_tile * m + tile_row, column: column_tile * n + lane_column}
    sink = replace_ranges(sink, replacements, {})
    return upcast(sink, part, part.src[0].arg)
