"""Indexing by data: gather/scatter, advanced (NumPy-style) indexing and assignment, masks.

Selecting by an index tensor is a comparison with an arange (a one-hot mask) followed by a sum: a reduce, so every
op here is a composition of primitives and has a gradient for free. Index values are data, so they are realized and
range-checked when the op is built (as PyTorch checks them): an index outside its axis would otherwise select
nothing and silently give zeros."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from lazygrad.dtype import check_fits, dtypes, fits, integer_range
from lazygrad.engine.buffers import is_buffer_view, strided_view, views_memory, write_target
from lazygrad.engine.jit import JitError
from lazygrad.engine.realize import computed_from_capture_inputs, run_host
from lazygrad.helpers import prod
from lazygrad.tensor_elementwise import check_same_device
from lazygrad.tensor_movement import keyword_aliases, normalize_axis
from lazygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
MOVEMENT_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP)


def _is_advanced(item) -> bool:
    """An index item that selects by data: a list, a range, a NumPy array or a Tensor (ints, slices, None, ... are
    basic). A range is a list of its ints, as in torch and NumPy (not a slice: x[range(2)] is advanced)."""
    return isinstance(item, (list, range, np.ndarray)) or hasattr(item, "uop")


# what to write instead of an op whose graph is built from the values of its indices, inside a TinyJit function
WRITE_FIX = (
    "Write with scatter or index_copy (x.assign(x.index_copy(0, index, value))), which follow each call's indices, "
    "or with a where for a bool mask (x.assign(mask.where(value, x))); or write outside the TinyJit function"
)
SELECT_FIX = (
    "Keep the shape with a where (mask.where(x, 0)), or select outside the TinyJit function (the result's length "
    "depends on the values)"
)


def refuse_host_values_in_capture(tensor, op_name: str, fix: str) -> None:
    """An error inside a TinyJit capture where `tensor`, whose values `op_name` reads on the host to build its graph
    (the places a setitem writes, a mask's positions), is computed from the captured function's inputs: a replay runs
    only the captured kernels, so it would silently keep this call's values."""
    if hasattr(tensor, "uop") and computed_from_capture_inputs(tensor.uop):
        raise JitError(
            f"TinyJit: {op_name} reads the values of a tensor computed from the function's inputs on the host, to "
            f"build its graph; a replay runs only the captured kernels, so it would keep this call's values. {fix}"
        )


def _broadcast_shapes(op_name: str, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise IndexError(
            f"{op_name}: index shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together "
            "(NumPy rules: each dimension equal or 1)"
        ) from None


def _check_range(values: np.ndarray, size: int, op_name: str, axis: int, allow_negative: bool) -> None:
    low = -size if allow_negative else 0
    wrong = (values < low) | (values >= size)
    if wrong.any():
        bad = values.reshape(-1)[int(wrong.reshape(-1).argmax())]
        allowed = f"{low}..{size - 1}" if size else "none (the axis is empty)"
        # (torch refuses negative indices here too; only x[idx], take and index_fill count them from the end)
        hint = (
            f"; negative indices are not allowed in {op_name}: add the size ({bad} + {size})"
            if -size <= bad < 0
            else ""
        )
        raise IndexError(
            f"{op_name}: index {bad} is out of range for axis {axis} of size {size} (allowed: {allowed}){hint}"
        )


def _check_index(index, size: int, op_name: str, axis: int, allow_negative: bool) -> None:
    """`_check_range` of an index: of a Tensor's values as a host step, so that a TinyJit replay checks each call's
    indices too (it would read zeros where an index is out of range, and a row of the wrapped value where an int64
    index does not fit the int32 the lookup compares in)."""
    if not hasattr(index, "uop"):
        _check_range(index, size, op_name, axis, allow_negative)
        return
    index = index.contiguous().realize()
    shape = index.shape
    run_host(
        lambda buffer: _check_range(buffer.numpy().reshape(shape), size, op_name, axis, allow_negative),
        [index.uop.base],
        index.device,
    )


def comparable_index(index):
    """An index ready to compare with an arange: uint64 (no int dtype holds it beside int32) as int64, which holds
    every value of an index checked to lie inside its axis."""
    return index.cast(dtypes.int64) if index.dtype == dtypes.uint64 else index


def _one_element(value):
    """A 0-d tensor as a tensor of one element (a number as it is)."""
    return value.reshape(1) if getattr(value, "ndim", None) == 0 else value


def _numpy_ints_as_ints(index):
    """An index with NumPy's integer scalars (what iterating an array gives) made Python ints."""
    if isinstance(index, np.integer):
        return int(index)
    if isinstance(index, tuple) and any(isinstance(item, np.integer) for item in index):
        return tuple(int(item) if isinstance(item, np.integer) else item for item in index)
    return index


def _holders(node) -> list:
    """The live tensors holding `node` (from the map Tensor's `uop` setter keeps with the node; this module does not
    import tensor.py at run time)."""
    return [
        tensor for reference in list(node.__dict__.get("tensors", {}).values()) if (tensor := reference()) is not None
    ]


def move_views(base: UOp, memory: UOp, tensors=None) -> None:
    """Make every tensor among `tensors` that is made of `base` by movement ops (by default the live tensors holding
    a view of it, see `view_holders`) made of `memory` instead, `base` having just been computed there: a view of a
    tensor shows later writes into its memory, as torch's does."""
    if tensors is None:
        tensors = view_holders(base)
    for tensor in tensors:
        chain, node = [], tensor._uop
        while node is not base and (node.op in MOVEMENT_OPS or node.op is Ops.DETACH):
            chain.append(node)
            node = node.src[0]
        moves = [link for link in reversed(chain) if link.op is not Ops.DETACH]
        # (a chain torch copies with, a flip or a pad, keeps the values it was made from)
        if node is base and moves and strided_view(moves, base.shape):
            for link in reversed(chain):
                node = UOp(link.op, link.dtype, (memory if node is base else node,), link.arg)
            tensor.uop = node


def view_holders(node) -> list:
    """The live tensors holding a view of `node` in torch's terms: one of the nodes its movement ops were made as
    (see tensor_movement's `_movement`), or a view of one of those. (A walk of every realized node's views: kept to
    the nodes that have some.)"""
    found, pending = [], [node]
    while pending:
        for reference in list(pending.pop().__dict__.get("views", {}).values()):
            if (view := reference()) is None:
                continue
            if holders := view.__dict__.get("tensors"):
                found += [tensor for reference in list(holders.values()) if (tensor := reference()) is not None]
            if "views" in view.__dict__:
                pending.append(view)
    return found


def _source(node: UOp) -> UOp:
    """The node a movement op (or a DETACH) is made of, past the DETACH nodes that movement ops made with gradients
    off put on their results (see tensor_movement's `_movement`): the same values, as torch's views under no_grad."""
    node = node.src[0]
    while node.op is Ops.DETACH:
        node = node.src[0]
    return node


def _held_by_another(node, tensor) -> bool:
    """Whether a live tensor other than `tensor` holds `node`."""
    return any(held is not tensor for held in _holders(node))


class IndexMixin:
    """Selecting and placing values by index tensors."""

    __slots__ = ()

    # ---- helpers ---------------------------------------------------------------------------------------------------

    def _index_values(self: Tensor, index, op_name: str) -> np.ndarray:
        """The values of an index (Tensor, list or array) as a NumPy int64 array, or a TypeError for non-integers."""
        values = index.numpy() if hasattr(index, "uop") else np.asarray(index)
        if values.size == 0 and values.dtype.kind == "f":  # an empty list
            values = values.astype(np.int64)
        if values.dtype.kind not in "iub":
            raise TypeError(
                f"{op_name}: indices must be integers (or a bool mask), got {values.dtype}; cast with .int()"
            )
        return values

    def _one_hot_mask(self: Tensor, index: Tensor, size: int, axis: int) -> Tensor:
        """`index` with a new axis of `size` after `axis`: True where that axis' position equals the index."""
        shape = [1] * (index.ndim + 1)
        shape[axis + 1] = size
        return comparable_index(index).unsqueeze(axis + 1) == type(self).arange(size, device=self.device).reshape(shape)

    def _sum_selected(self: Tensor, mask: Tensor, axis: int) -> Tensor:
        """The sum over `axis` of this tensor where `mask` holds (zero elsewhere), in this tensor's dtype."""
        return mask.where(self, 0)._sum_unwidened(axis).cast(self.dtype)

    # ---- gather and scatter ----------------------------------------------------------------------------------------

    def _check_gather_index(self: Tensor, dim: int, index: Tensor, op_name: str, other: Tensor | None = None) -> None:
        if not hasattr(index, "uop") or index.dtype.is_float or index.dtype == dtypes.bool:
            kind = index.dtype if hasattr(index, "uop") else type(index).__name__
            raise TypeError(f"{op_name}: index must be an integer Tensor, got {kind}; make it with dtype=dtypes.int32")
        check_same_device(op_name, self, index, other)
        if index.ndim != self.ndim:
            raise ValueError(
                f"{op_name}: index {index.shape} must have as many dimensions as the input {self.shape}; "
                "unsqueeze or reshape it"
            )
        for axis, (wanted, size) in enumerate(zip(index.shape, self.shape)):
            if axis != dim and wanted > size:
                raise ValueError(
                    f"{op_name}: index {index.shape} is larger than the input {self.shape} in dimension {axis} "
                    f"(only dimension {dim} may differ)"
                )
            if other is not None and wanted > other.shape[axis]:
                raise ValueError(f"{op_name}: index {index.shape} is larger than src {other.shape} in dimension {axis}")
        _check_index(index, self.shape[dim], op_name, dim, allow_negative=False)

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather)."""
        dim = normalize_axis(dim, self.ndim, "gather")
        if self.ndim == 0 and getattr(index, "ndim", None) == 0:  # (torch's 0-d gather: as of one element)
            return self.reshape(1).gather(0, index.reshape(1)).reshape(())
        self._check_gather_index(dim, index, "gather")
        window = tuple(None if axis == dim else (0, size) for axis, size in enumerate(index.shape))
        # (..., S, ...) against a mask (..., K, S, ...): each of the K picks one of the S values
        values = self.shrink(window).unsqueeze(dim)
        return values._sum_selected(self._one_hot_mask(index, self.shape[dim], dim), dim + 1)

    def take_along_dim(self: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
        """gather with the other axes of self and `indices` broadcast together (no dim: over the flattened
        tensor), as torch.take_along_dim."""
        if dim is None:
            return self.flatten().gather(0, indices.flatten())
        dim = normalize_axis(dim, self.ndim, "take_along_dim")
        if not hasattr(indices, "uop") or indices.ndim != self.ndim:
            raise ValueError(
                f"take_along_dim: indices must be a Tensor with the input's {self.ndim} dimensions, got "
                f"{getattr(indices, 'shape', type(indices).__name__)}"
            )
        others = [(1 if a == dim else s) for a, s in enumerate(self.shape)]
        index_others = [(1 if a == dim else s) for a, s in enumerate(indices.shape)]
        shape = list(_broadcast_shapes("take_along_dim", [tuple(others), tuple(index_others)]))
        # (as tuples: 0-d ones have no axes, and expand() with none is an error)
        source = self.expand(tuple(self.shape[dim] if a == dim else s for a, s in enumerate(shape)))
        return source.gather(
            dim, indices.expand(tuple(indices.shape[dim] if a == dim else s for a, s in enumerate(shape)))
        )

    def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """The slices at the positions of a 1-D int `index` along `dim` (torch.index_select)."""
        dim = normalize_axis(dim, self.ndim, "index_select")
        if not hasattr(index, "uop") or index.ndim > 1 or index.dtype.is_float or index.dtype == dtypes.bool:
            raise TypeError(f"index_select: index must be a 0-d or 1-D integer Tensor, got {index!r}")
        check_same_device("index_select", self, index)
        # checked here, under this op's name and without getitem's negative indices, which torch refuses here
        if self.ndim == 0:  # as torch: a 0-d tensor's one axis, picked by exactly one index (0)
            if index.numel() != 1:
                raise ValueError(f"index_select: a 0-d tensor takes exactly one index, got {index.numel()}")
            _check_index(index, 1, "index_select", dim, allow_negative=False)
            return self
        _check_index(index, self.shape[dim], "index_select", dim, allow_negative=False)
        return self[(slice(None),) * dim + (index.reshape(-1),)]

    def take(self: Tensor, index) -> Tensor:
        """The elements of the flattened tensor at `index` (an int Tensor, list or array; negative counts from the
        end), in index's shape (torch.take)."""
        if not _is_advanced(index) or (values := self._index_values(index, "take")).dtype == np.bool_:
            raise TypeError(f"take: index must be an int Tensor, list or array, got {index!r}")
        _check_range(values, self.numel(), "take", 0, allow_negative=True)
        return self.flatten()[index]

    def _along_dim_index(self: Tensor, dim: int, index, source, op_name: str) -> tuple[int, Tensor]:
        """The checked axis and a 1-D int `index` into it, expanded to `source`'s shape (self's, with len(index)
        at dim) as scatter takes it: the shared part of index_add and index_copy."""
        dim = normalize_axis(dim, self.ndim, op_name)
        if not hasattr(index, "uop") or index.ndim > 1 or index.dtype.is_float or index.dtype == dtypes.bool:
            raise TypeError(f"{op_name}: index must be a 0-d or 1-D integer Tensor, got {index!r}")
        if not hasattr(source, "uop"):
            raise TypeError(f"{op_name}: source must be a Tensor, got {type(source).__name__}")
        index = index.reshape(-1)
        wanted = tuple(index.shape[0] if axis == dim else size for axis, size in enumerate(self.shape))
        if source.shape != wanted:
            raise ValueError(
                f"{op_name}: source {source.shape} must be the input's shape {self.shape} with dim {dim} the index's "
                f"length {index.shape[0]}: {wanted}"
            )
        _check_index(index, self.shape[dim], op_name, dim, allow_negative=False)
        return dim, index.reshape(tuple(wanted[dim] if axis == dim else 1 for axis in range(self.ndim))).expand(wanted)

    def index_add(self: Tensor, dim: int, index: Tensor, source: Tensor, alpha=1) -> Tensor:
        """A copy of self with alpha * source[..., i, ...] added to self[..., index[i], ...] along `dim`; repeated
        indices add up (torch.index_add)."""
        if self.ndim == 0:
            return self.reshape(1).index_add(dim, index, source.reshape(-1), alpha).reshape(())
        dim, spread = self._along_dim_index(dim, index, source, "index_add")
        scaled = source if alpha == 1 else source * alpha
        return self.scatter_reduce(dim, spread, scaled, "sum", include_self=True)

    def index_copy(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
        """A copy of self with self[..., index[i], ...] = source[..., i, ...] along `dim` (torch.index_copy; where
        an index repeats, the last one wins)."""
        if self.ndim == 0:
            return self.reshape(1).index_copy(dim, index, source.reshape(-1)).reshape(())
        dim, spread = self._along_dim_index(dim, index, source, "index_copy")
        return self.scatter(dim, spread, source)

    def index_fill(self: Tensor, dim: int, index: Tensor, value) -> Tensor:
        """A copy of self with `value` at positions `index` (1-D ints, negative from the end) along `dim`."""
        dim = normalize_axis(dim, max(self.ndim, 1), "index_fill")
        if not hasattr(index, "uop") or index.ndim > 1 or index.dtype.is_float or index.dtype == dtypes.bool:
            raise TypeError(f"index_fill: index must be a 0-d or 1-D integer Tensor, got {index!r}")
        size = self.shape[dim] if self.ndim else 1
        refuse_host_values_in_capture(index, "index_fill", WRITE_FIX)
        positions = self._index_values(index, "index_fill").reshape(-1)
        _check_range(positions, size, "index_fill", dim, allow_negative=True)
        chosen = np.zeros(size, dtype=np.bool_)
        chosen[positions] = True
        shape = [1] * self.ndim
        if self.ndim:
            shape[dim] = size
        mask = type(self)(chosen.reshape(shape), device=self.device)
        return self.masked_fill(mask, value)

    def index_put(self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
        """A copy of self with self[indices] = values (`accumulate`: added, repeated places adding up), where
        `indices` is a tuple of index tensors for the leading axes, as torch.index_put."""
        if not isinstance(indices, (tuple, list)) or not all(_is_advanced(item) for item in indices):
            raise TypeError("index_put: indices must be a tuple of Tensors (or lists or arrays), one per leading axis")
        if not indices:
            raise IndexError("index_put: give at least one index tensor")
        arrays = []
        for item in indices:
            refuse_host_values_in_capture(item, "index_put", WRITE_FIX)
            item_values = self._index_values(item, "index_put")
            arrays.extend(np.nonzero(item_values) if item_values.dtype == np.bool_ else [item_values])
        if len(arrays) > self.ndim:
            raise IndexError(f"index_put: {len(arrays)} indices for a tensor with {self.ndim} dimensions {self.shape}")
        for axis, axis_values in enumerate(arrays):
            _check_range(axis_values, self.shape[axis], "index_put", axis, allow_negative=True)
        shape = _broadcast_shapes("index_put", [a.shape for a in arrays])
        leading, rest = self.shape[: len(arrays)], self.shape[len(arrays) :]
        wrapped = [np.broadcast_to(a % size if size else a, shape) for a, size in zip(arrays, leading)]
        flat_positions = np.ravel_multi_index(tuple(wrapped), leading).reshape(-1)
        if not hasattr(values, "uop"):
            values = type(self).full((), values, dtype=self.dtype, device=self.device)
        try:
            values = values.cast(self.dtype).expand(*shape, *rest)
        except ValueError:
            raise ValueError(
                f"index_put: values {values.shape} do not broadcast to the indexed shape {shape + rest}"
            ) from None
        values = values.reshape(-1, *rest)
        flat = self.reshape(prod(leading), *rest)
        position_tensor = type(self)(flat_positions.astype(np.int64), device=self.device)
        put = flat.index_add if accumulate else flat.index_copy
        return put(0, position_tensor, values).reshape(self.shape)

    def nonzero(self: Tensor, as_tuple: bool = False):
        """The indices of the non-zero elements, computed on the host (the count depends on the values, so the
        tensor is realized): an int64 (count, ndim) tensor, or with `as_tuple` one 1-D tensor per axis, as torch."""
        refuse_host_values_in_capture(self, "nonzero", SELECT_FIX)
        values = self.numpy()
        if as_tuple:
            return tuple(
                type(self)(axis_values.astype(np.int64), device=self.device)
                for axis_values in np.nonzero(np.atleast_1d(values))
            )
        return type(self)(np.argwhere(values).astype(np.int64), device=self.device)

    @keyword_aliases(dim="axis")
    def count_nonzero(self: Tensor, axis=None) -> Tensor:
        """The number of non-zero elements over `axis` (an int, a tuple, or None for all; `dim=` too), as int64, as
        torch.count_nonzero. NaN counts as non-zero. Unlike `nonzero`, a reduce in the graph: nothing is read."""
        axes = self._axes(axis, "count_nonzero")  # (checked under this op's name)
        return (self != 0).sum(axes, dtype=dtypes.int64)

    def argwhere(self: Tensor) -> Tensor:
        """`nonzero()`: the (count, ndim) indices of the non-zero elements (torch.argwhere)."""
        return self.nonzero()

    def scatter(self: Tensor, dim: int, index: Tensor, src=None, reduce: str | None = None, value=None) -> Tensor:
        """A copy of self with self[..., index[..., i, ...], ...] = src[..., i, ...] along `dim` (torch.scatter;
        `src` may be a number, or pass `value=`). Where two indices name the same place, the last one along `dim`
        wins. `reduce="add"|"multiply"` combines with the values already there instead."""
        if (src is None) == (value is None):
            raise TypeError("scatter: pass exactly one of src (a Tensor or number) and value (a number)")
        src = value if src is None else src
        if reduce is not None:
            if reduce not in ("add", "multiply"):
                raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
            return self._scatter_combine(dim, index, src, "sum" if reduce == "add" else "prod", True, "scatter")
        dim = normalize_axis(dim, self.ndim, "scatter")
        if self.ndim == 0 and getattr(index, "ndim", None) == 0:  # (torch's 0-d scatter: as of one element)
            return self.reshape(1).scatter(0, index.reshape(1), _one_element(src)).reshape(())
        mask, values = self._scatter_inputs(dim, index, src, "scatter")
        count = mask.shape[dim]
        # the last writer: number the writers 1..K along dim and keep the largest number that hits each place
        order_shape = [1] * mask.ndim
        order_shape[dim] = count
        order = type(self).arange(1, count + 1, device=self.device).reshape(order_shape)
        numbered = mask.where(order, 0)
        last = numbered.max(dim, keepdim=True) if count else numbered._sum_unwidened(dim, keepdim=True)
        chosen = mask & (numbered == last)
        written = values._sum_selected(chosen, dim)
        return (last.squeeze(dim) > 0).where(written, self)

    def _scatter_inputs(self: Tensor, dim: int, index: Tensor, src, op_name: str) -> tuple[Tensor, Tensor]:
        """The one-hot mask (index shape with self's size inserted after dim, padded to self's other sizes) and the
        source values shaped to broadcast against it."""
        tensor_type = type(self)
        if hasattr(src, "uop"):
            if src.ndim != self.ndim:
                raise ValueError(f"{op_name}: src {src.shape} must have as many dimensions as the input {self.shape}")
            self._check_gather_index(dim, index, op_name, src)
            src = src.shrink(tuple((0, size) for size in index.shape)).cast(self.dtype)
        else:
            self._check_gather_index(dim, index, op_name)
            src = tensor_type.full(index.shape, src, dtype=self.dtype, device=self.device)
        # other axes where index is shorter than self: pad with no hits
        padding = tuple(
            (0, 0) if axis == dim else (0, size - index.shape[axis]) for axis, size in enumerate(self.shape)
        )
        mask = self._one_hot_mask(index, self.shape[dim], dim).pad(padding[: dim + 1] + ((0, 0),) + padding[dim + 1 :])
        values = src.pad(padding).unsqueeze(dim + 1)
        return mask, values

    def scatter_reduce(
        self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True
    ) -> Tensor:
        """Combine src[..., i, ...] into self[..., index[..., i, ...], ...] along `dim` with `reduce` (sum, prod,
        mean, amax or amin), counting self's values too when `include_self` (torch.scatter_reduce). Places no
        index names keep self's value."""
        if reduce not in SCATTER_REDUCTIONS:
            raise ValueError(f"scatter_reduce: reduce must be one of {', '.join(SCATTER_REDUCTIONS)}, got {reduce!r}")
        return self._scatter_combine(dim, index, src, reduce, include_self, "scatter_reduce")

    def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """A copy of self with src[..., i, ...] added to self[..., index[..., i, ...], ...] along `dim`; repeated
        indices add up (torch.scatter_add: scatter_reduce's "sum" with include_self)."""
        if not hasattr(src, "uop"):
            raise TypeError(
                f"scatter_add: src must be a Tensor, got {type(src).__name__}; for a number use "
                "scatter(dim, index, value, reduce='add')"
            )
        return self._scatter_combine(dim, index, src, "sum", True, "scatter_add")

    def _scatter_combine(
        self: Tensor, dim: int, index: Tensor, src, reduce: str, include_self: bool, op_name: str
    ) -> Tensor:
        """scatter_reduce's work, its errors naming `op_name` (the op the user called)."""
        dim = normalize_axis(dim, self.ndim, op_name)
        if self.ndim == 0 and getattr(index, "ndim", None) == 0:
            one = self.reshape(1)._scatter_combine(
                0, index.reshape(1), _one_element(src), reduce, include_self, op_name
            )
            return one.reshape(())
        mask, values = self._scatter_inputs(dim, index, src, op_name)
        hits = mask._sum_unwidened(dim)
        values = values.expand(mask.shape)
        if include_self and reduce not in ("sum", "mean"):
            # self takes part as one more writer that hits every place
            every = type(self).full((*mask.shape[:dim], 1, *mask.shape[dim + 1 :]), True, device=self.device)
            mask = mask.cat(every, dim=dim)
            values = values.cat(self.unsqueeze(dim), dim=dim)
        if reduce in ("sum", "mean"):
            combined = mask.where(values, 0).sum(dim, dtype=values._unwidened_dtype())
            if include_self:  # (added to the sum: into zeros, the sum alone is left, which codegen runs as a scatter)
                combined = self.cast(combined.dtype) + combined
            if reduce == "mean":
                count = hits + 1 if include_self else hits.maximum(1)
                combined = combined / count if self.dtype.is_float else combined.floordiv(count)
        elif reduce == "prod":
            combined = mask.where(values, 1).prod(dim, dtype=values._unwidened_dtype())
        else:
            if self.dtype.is_float:
                empty = float("-inf") if reduce == "amax" else float("inf")
            else:
                empty = (
                    integer_range(self.dtype)[0 if reduce == "amax" else 1]
                    if self.dtype != dtypes.bool
                    else reduce == "amin"
                )
            selected = mask.where(values, empty)
            combined = selected.max(dim) if reduce == "amax" else selected.min(dim)
        combined = combined.cast(self.dtype)
        return combined if include_self else (hits > 0).where(combined, self)

    # ---- masks -----------------------------------------------------------------------------------------------------

    def masked_fill(self: Tensor, mask: Tensor, value) -> Tensor:
        """`value` where the bool `mask` (broadcast to self) holds, self elsewhere."""
        if not hasattr(mask, "uop") or mask.dtype != dtypes.bool:
            kind = mask.dtype if hasattr(mask, "uop") else type(mask).__name__
            raise TypeError(f"masked_fill: mask must be a bool Tensor, got {kind}; compare to make one (x > 0)")
        shape = _broadcast_shapes("masked_fill", [self.shape, mask.shape])
        if shape != self.shape:
            raise ValueError(f"masked_fill: mask {mask.shape} does not broadcast to the input's shape {self.shape}")
        check_same_device("masked_fill", self, mask, value)
        if hasattr(value, "uop"):
            if value.ndim != 0:
                raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
            value = value.cast(self.dtype)
        else:
            check_fits("masked_fill", value, self.dtype, of_tensor=True)
            value = type(self).full((), value, dtype=self.dtype, device=self.device)
        return mask.where(value, self)

    def masked_select(self: Tensor, mask: Tensor) -> Tensor:
        """The values where the bool `mask` (broadcast with self) holds, as a 1-D tensor in row-major order. The
        mask is realized: the result's length depends on it."""
        if not hasattr(mask, "uop") or mask.dtype != dtypes.bool:
            kind = mask.dtype if hasattr(mask, "uop") else type(mask).__name__
            raise TypeError(f"masked_select: mask must be a bool Tensor, got {kind}")
        shape = _broadcast_shapes("masked_select", [self.shape, mask.shape])
        refuse_host_values_in_capture(mask, "masked_select", SELECT_FIX)
        positions = np.flatnonzero(np.broadcast_to(mask.numpy(), shape))
        return self.expand(shape).flatten()[positions]

    # ---- advanced indexing -----------------------------------------------------------------------------------------

    def __getitem__(self: Tensor, index) -> Tensor:
        """NumPy indexing: ints, slices, None and ... select views; lists, arrays and int or bool Tensors select by
        value (advanced indexing, broadcast together; their axes go where the first one was when they are adjacent,
        else first). As in torch, an int selects first, so it never separates advanced indices."""
        items = index if isinstance(index, tuple) else (index,)
        for item in items:
            if isinstance(item, bool) or not (
                item is None or item is Ellipsis or isinstance(item, (int, slice)) or _is_advanced(item)
            ):
                if isinstance(item, np.integer):  # (checked only here: indexing is a hot path)
                    return self[_numpy_ints_as_ints(index)]
                raise TypeError(
                    f"getitem: unsupported index {item!r}; use ints, slices, None, ..., lists, NumPy arrays or "
                    "int/bool Tensors"
                )
        if not any(_is_advanced(item) for item in items):
            return super().__getitem__(index)
        basic, positions, indices = self._split_index(items)
        view = super().__getitem__(tuple(basic))
        shape = _broadcast_shapes("getitem", [i.shape for i in indices])
        sizes = [view.shape[p] for p in positions]
        flat = None
        for axis_index, stride in zip(indices, np.cumprod([1, *sizes[::-1]])[-2::-1]):
            term = axis_index * int(stride)
            flat = term if flat is None else flat + term
        flat = flat.expand(shape) if flat.shape != shape else flat
        others = [axis for axis in range(view.ndim) if axis not in positions]
        moved = view.permute(*others, *positions).reshape(*(view.shape[a] for a in others), 1, prod(sizes))
        moved = moved.reshape(*moved.shape[:-2], *([1] * len(shape)), moved.shape[-1])
        mask = flat.unsqueeze(-1) == type(self).arange(prod(sizes), device=self.device)
        result = moved._sum_selected(mask, -1)
        # the index axes go where the first indexed axis was when the indexed axes are adjacent, else first
        adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
        before = len([a for a in others if a < positions[0]]) if adjacent else 0
        if before == len(others):
            return result
        count = len(shape)
        order = [*range(before), *range(len(others), len(others) + count), *range(before, len(others))]
        return result.permute(order)

    def _split_index(self: Tensor, items: tuple) -> tuple[list, list[int], list[Tensor]]:
        """Split an advanced index into basic items (index positions become full slices), the axes of the view they
        give that the advanced indices select on, and those indices as non-negative int tensors (range-checked)."""
        expanded: list = []
        axis: int | None = 0  # the axis the next item indexes (None after an ellipsis: known later)
        for item in items:
            if not _is_advanced(item):
                expanded.append(item)
                axis = None if item is Ellipsis or axis is None else axis + (item is not None)
                continue
            if hasattr(item, "uop") and item.dtype.is_int and item.dtype != dtypes.bool:
                # an int tensor stays in the graph, its values checked in a host step (`_check_index`): a captured
                # (jitted) step then indexes with each call's values, and nothing reads them here
                expanded.append(("index", None, item))
                axis = None if axis is None else axis + 1
                continue
            values = self._index_values(item, "getitem")
            if values.dtype == np.bool_:
                refuse_host_values_in_capture(item, "getitem with a bool mask", SELECT_FIX)
                if values.ndim == 0:
                    raise IndexError("getitem: a 0-d bool index is not supported; use a bool tensor with axes")
                covered = self.shape[axis : axis + values.ndim] if axis is not None else values.shape
                if values.shape != covered:
                    raise IndexError(
                        f"getitem: a bool mask of shape {values.shape} must have the shape {covered} of the axes it "
                        f"selects from (axis {axis} on) of the tensor {self.shape}"
                    )
                # a mask stands for the positions of its True values, one index per axis it covers
                expanded.extend(("index", axis_values, None) for axis_values in np.nonzero(values))
                axis = None if axis is None else axis + values.ndim
                continue
            expanded.append(("index", values.astype(np.int64), None))
            axis = None if axis is None else axis + 1
        consuming = sum(item is not None and item is not Ellipsis for item in expanded)
        if sum(item is Ellipsis for item in expanded) > 1:
            raise IndexError("getitem: an index can only have a single ellipsis (...)")
        if consuming > self.ndim:
            raise IndexError(f"getitem: too many indices ({consuming}) for a tensor of shape {self.shape}")
        if Ellipsis in expanded:
            at = expanded.index(Ellipsis)
            expanded[at : at + 1] = [slice(None)] * (self.ndim - consuming)
        basic, positions, indices, axis, out_axis = [], [], [], 0, 0
        for item in expanded:
            if item is None:
                basic.append(None)
                out_axis += 1
                continue
            if isinstance(item, int):  # an int selects before the advanced indices apply, as in torch
                basic.append(item)
                axis += 1
                continue
            if isinstance(item, tuple):
                _, values, tensor = item
                size = self.shape[axis]
                _check_index(values if tensor is None else tensor, size, "getitem", axis, allow_negative=True)
                # int32 keeps the one-hot compare narrow; an axis longer than 2**31 needs int64, or far indices
                # wrap and select nothing (silently 0)
                wide = not fits(size - 1, dtypes.int32)
                if tensor is None:
                    values = np.where(values < 0, values + size, values).astype(np.int64 if wide else np.int32)
                    index = type(self)(values, device=self.device)
                else:
                    if tensor.device != self.device:
                        raise ValueError(
                            f"getitem: the index is on {tensor.device} but the tensor is on {self.device}; use .to()"
                        )
                    index = tensor.cast(dtypes.int64 if wide else dtypes.int32)
                    index = (index < 0).where(index + size, index)
                basic.append(slice(None))
                positions.append(out_axis)
                indices.append(index)
            elif isinstance(item, slice):
                basic.append(item)
            else:
                raise TypeError(f"getitem: unsupported index {item!r}; use ints, slices, None, ..., lists or Tensors")
            axis += 1
            out_axis += 1
        return basic, positions, indices

    def __setitem__(self: Tensor, index, value) -> None:
        """Write `value` (broadcast to self[index]) into the selected places, in place: this tensor then holds the
        new values (a slice or transpose of another tensor passes the write on to it: see `_check_writable`). Where
        an advanced index names a place twice, the last value wins (as in NumPy). A list, tuple or NumPy array value
        is taken as a tensor of this tensor's dtype, as NumPy takes it."""
        # (as `+=` refuses, see Tensor._in_place: a graph read from this tensor before the write would get no gradient)
        if self.requires_grad and not type(self).no_grad and views_memory(self._uop) and self._history is None:
            raise RuntimeError(
                f"setitem: this {self.shape} tensor requires grad and holds its own values (a leaf), so writing into "
                "it would lose what its gradient needs, as torch refuses; do it under `with Tensor.test():` "
                "(Tensor.no_grad, torch.no_grad()), or write into a copy (y = x.clone(); y[i] = v: gradients flow "
                "back to x where y was not written)"
            )
        self._check_writable("setitem")
        index = _numpy_ints_as_ints(index)
        for item in index if isinstance(index, tuple) else (index,):  # (their places are found on the host)
            refuse_host_values_in_capture(item, "setitem with a tensor index", WRITE_FIX)
        try:
            selected = self[index]
        except (IndexError, TypeError, ValueError) as error:  # (the selection is getitem's: the error names setitem)
            if str(error).startswith("getitem: "):
                raise type(error)(f"setitem: {str(error)[len('getitem: ') :]}") from None
            raise
        if hasattr(value, "uop") and value._uop is selected._uop:
            return  # (`x[i] += v`: Python writes the view x[i] back, into which the write went through already)
        target_shape = selected.shape
        if isinstance(value, (list, tuple, np.ndarray, np.generic)):
            value = self._setitem_value(value)
        check_same_device("setitem", self, value)
        if hasattr(value, "uop"):
            # (leading axes of size 1 beyond the selection's are dropped, as torch and NumPy broadcast a value)
            while value.ndim > len(target_shape) and value.shape[0] == 1:
                value = value.reshape(value.shape[1:])
            try:
                value = value.cast(self.dtype).expand(target_shape)
            except ValueError:
                raise ValueError(
                    f"setitem: value {value.shape} does not broadcast to the selected shape {target_shape}"
                ) from None
        if prod(target_shape) == 0:  # nothing selected: nothing to write (t[2:2] = ...)
            return
        # which value element lands on each place, -1 for none: a static map, computed by indexing the places' own
        # numbers the way getitem indexes (torch's order: x[0, :, [0, 3]] is (rows, 2), where NumPy's is (2, rows))
        numbers = dtypes.int32 if self.numel() < 2**31 else dtypes.int64
        places = type(self).arange(self.numel(), dtype=numbers, device=self.device).reshape(self.shape)[index]
        source = np.full(self.numel(), -1, dtype=np.int64)
        source[places.numpy().reshape(-1)] = np.arange(prod(target_shape))
        written = type(self)(source.reshape(self.shape) >= 0, device=self.device)
        if hasattr(value, "uop"):
            value = value.flatten()[np.maximum(source, 0)].reshape(self.shape)
        else:
            check_fits("setitem", value, self.dtype, of_tensor=True)
            value = type(self).full((), value, dtype=self.dtype, device=self.device)
        in_memory = write_target(self._uop) is not None
        self.assign(written.where(value, self))
        if in_memory:  # written now, as torch does: other views of this memory (reshapes) see the new values
            self.realize()

    def _setitem_value(self: Tensor, value) -> Tensor:
        """A list, tuple or NumPy value for setitem as a tensor of this tensor's dtype. As with a number, a value the
        dtype cannot hold is an error (never wrapped); floats written into an int tensor truncate, as a cast does."""
        try:
            array = np.asarray(value)
        except ValueError as error:  # (a ragged list)
            raise ValueError(f"setitem: the value must be rectangular (nested lists of one length): {error}") from None
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"setitem: the value must hold numbers (bools, ints or floats), got {type(value).__name__} of "
                f"{array.dtype} (ints beyond int64 or ragged lists give object); pass a Tensor or a list of numbers"
            )
        check_fits("setitem", array, self.dtype, of_tensor=True)
        return type(self)(array, dtype=self.dtype, device=self.device)

    def _check_writable(self: Tensor, op_name: str) -> tuple[UOp, list[UOp]] | None:
        """Make a write into this tensor (setitem, assign) reach what it views, or refuse it. Reshapes of memory
        write through (see assign); a reshape of a tensor not in memory yet (a computation, a constant such as
        `Tensor.zeros(4)`, a flip) first computes that tensor into its buffer, so the write reaches it as in torch.
        A slice or transpose of another tensor (or of memory) is written through to it as well, as torch's: for
        that, the node below and the movement ops over it (this tensor's first) are returned, for `_write_through`;
        an expand (several of its elements one element below), or a view of a leaf that requires grad while
        gradients are on, is refused. Movement ops that copy in torch (a flip, a pad, a repeat) make a value of their
        own, which a write simply replaces, as a computation's; so does a view of values no live tensor holds."""
        node = self._uop
        if node.op is Ops.DETACH and _source(node).op in MOVEMENT_OPS:
            node = _source(node)  # (a view made with gradients off: a view all the same)
        if node.op not in MOVEMENT_OPS:
            if node.op is not Ops.ASSIGN and write_target(node) is None:
                self._viewed_before_written(op_name)
            return
        if write_target(node) is not None:
            self._check_memory_unshared(node, op_name)
            return
        # the values this tensor is a view of: those of the deepest tensor below it (else the deepest node) that its
        # movement ops make a view of (a computation, a constant, or a copy such as a flip, whose own values they are)
        chain = [node]
        while _source(chain[-1]).op in MOVEMENT_OPS:
            chain.append(_source(chain[-1]))
        cuts = [cut for cut in range(len(chain), 0, -1) if strided_view(chain[:cut][::-1], chain[cut - 1].src[0].shape)]
        if not cuts:
            self._viewed_before_written(op_name)
            return  # a copy (a flip, a pad, ...): a value of its own
        held_cuts = [cut for cut in cuts if _held_by_another(_source(chain[cut - 1]), self)]
        cut = held_cuts[0] if held_cuts else cuts[0]
        between, below, held = chain[:cut], _source(chain[cut - 1]), bool(held_cuts)
        if all(link.op is Ops.RESHAPE for link in between):
            if held or below.op not in (Ops.CONST, Ops.ARANGE, Ops.BUFFER):
                self._realize_reshaped_base(below, op_name)
            else:  # (a view of a constant no live tensor holds: nothing else shows the write)
                self._viewed_before_written(op_name)
            return
        if not held and below.op is not Ops.BUFFER:
            self._viewed_before_written(op_name)
            return  # (a view of a computation or constant no live tensor holds: `w.grad`, a permuted product's)
        if any(link.op is Ops.FLIP for link in between):
            self._viewed_before_written(op_name)
            return None  # (a flip is a copy in torch: a value of its own, though a slice may show memory in order)
        if any(link.op is Ops.EXPAND for link in between):
            raise RuntimeError(
                f"{op_name}: this {self.shape} tensor is an expanded view of another tensor (several of its elements "
                "are one element of that tensor), so a write into it has no single value to leave there, as torch "
                "refuses; write into a copy (.contiguous()) or into the tensor below"
            )
        leaves = [t for t in _holders(below) if t.requires_grad and views_memory(t._uop) and t._history is None]
        if leaves and not type(self).no_grad:
            raise RuntimeError(
                f"{op_name}: this {self.shape} tensor is a view (a slice or transpose) of a {leaves[0].shape} tensor "
                "that requires grad and holds its own values (a leaf), so writing into it would lose what its "
                "gradient needs, as torch refuses; do it under `with Tensor.test():` (Tensor.no_grad, "
                "torch.no_grad()), or write into a copy (y = x.clone(); y[i] = v)"
            )
        return below, between

    def _check_memory_unshared(self: Tensor, node, op_name: str) -> None:
        """Refuse a write through a reshape of memory that equal computations, realized together, share: it would
        change every one of them (a direct write gives the others a copy, see Tensor.assign; through a reshape, which
        of them it was made of is not known)."""
        while node.op in MOVEMENT_OPS or node.op is Ops.DETACH:
            node = node.src[0]
            holders = node.__dict__.get("tensors", {}) if node.__dict__.get("shared") else {}
            if (count := sum(reference() is not None for reference in list(holders.values()))) > 1:
                raise RuntimeError(
                    f"{op_name}: this {self.shape} tensor is a reshape of a {node.shape} buffer that {count} tensors "
                    "share (equal computations realized together are one buffer), so writing through it would change "
                    "all of them; give the one you write into a buffer of its own first (x = x.clone())"
                )

    def _realize_reshaped_base(self: Tensor, base, op_name: str) -> None:
        """Compute `base` (the node under this tensor's reshapes, not in memory yet) into its buffer, switching the
        tensor that holds it to that buffer, and make this tensor a reshape of the buffer: a write into this tensor
        then reaches that tensor, as torch's reshape is a view."""
        holders = len(_holders(base))
        if holders > 1:
            # equal computations are one node until realized: computed, they would share one buffer, and a write
            # through this reshape would change every one of them
            raise RuntimeError(
                f"{op_name}: this {self.shape} tensor is a reshape of a {base.shape} computation that {holders} "
                "tensors hold (equal computations are one node until computed), so writing through it would change "
                "all of them; give the one you write into a buffer of its own first (x = x.contiguous()), or write "
                "into a copy (y = x.reshape(...).contiguous())"
            )
        owner = self._put_in_memory(base, op_name)
        self.uop = owner.reshape(self.shape)._uop
        if len(_holders(self._uop)) > 1:
            # equal reshapes of it (`a = x.sum(1); b = x.sum(1)`: one node) are one view of the buffer now: the write
            # gives the others a copy (see Tensor.assign), as they are separate tensors in torch
            self._uop.__dict__["shared"] = True

    def _put_in_memory(self: Tensor, base, op_name: str) -> Tensor:
        """Compute `base` (a node not in memory) into its buffer, switching every live tensor holding it, and every
        live tensor made of it by movement ops, onto that buffer; returns a tensor of the buffer."""
        # realizing switches every live tensor holding `base` to the buffer (the owner takes gradients as the tensor
        # written does, so the buffer keeps the computation's history: `y = x @ w; y += b` trains w)
        wants = None if self.requires_grad is not False else False
        owner = type(self)(base, device=self.device, requires_grad=wants).realize()
        if not is_buffer_view(owner._uop):
            if views_memory(owner._uop):  # (a flip or a pad of memory stays lazy when realized: copied here)
                owner = type(self)(owner.contiguous()._uop, device=self.device, requires_grad=wants).realize()
                for tensor in _holders(base):
                    tensor.uop = owner._uop
            if not is_buffer_view(owner._uop):
                raise RuntimeError(
                    f"{op_name}: computing the {base.shape} tensor under this {self.shape} one left it a "
                    f"{owner._uop.op} view, not memory, so the write could not reach it; write into a copy "
                    "(.contiguous()) instead"
                )
        # every live tensor made of it by movement ops (a view of x made before, this very reshape of it made again)
        # is now made of its buffer: a view of it shows the write, as in torch
        owner._uop.__dict__.pop("shared", None)  # (the tensors holding `base` are one: see Tensor.assign)
        move_views(base, owner._uop, [t for t in type(self)._live_tensors() if t is not owner])
        return owner

    def _viewed_before_written(self: Tensor, op_name: str) -> None:
        """Before a write into this tensor while it is not in memory (a computation, a constant): where a live tensor
        is a view of it (a reshape, transpose, slice or expand made of it, as torch's), compute it into its buffer
        and move those views onto it, so they show the write as torch's do. (A view no live tensor holds needs
        nothing: graphs made of it keep the values they were made from.)"""
        base = self._uop
        if not view_holders(base):
            return
        if (holders := len(_holders(base))) > 1:  # (equal computations are one node: whose views they are is unknown)
            raise RuntimeError(
                f"{op_name}: this {self.shape} tensor has views (reshapes, slices, transposes made of it) and {holders} "
                "tensors hold its computation (equal computations are one node until computed), so the write could "
                "not reach only its own views; give it a buffer of its own before making the views "
                "(x = x.contiguous())"
            )
        self._put_in_memory(base, op_name)
