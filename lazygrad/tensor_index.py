"""Indexing by data and layout ops: gather/scatter, advanced (NumPy-style) indexing and assignment, masks,
diagonals, roll, repeat_interleave, meshgrid, unfold and einsum.

Selecting by an index tensor is a comparison with an arange (a one-hot mask) followed by a sum: a reduce, so every
op here is a composition of primitives and has a gradient for free. Index values are data, so they are realized and
range-checked when the op is built (as PyTorch checks them): an index outside its axis would otherwise select
nothing and silently give zeros."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from lazygrad.dtype import dtypes, integer_range
from lazygrad.engine.buffers import is_buffer_view
from lazygrad.helpers import prod
from lazygrad.tensor_movement import normalize_axis
from lazygrad.uop.ops import Ops

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
MOVEMENT_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP)


def _is_advanced(item) -> bool:
    """An index item that selects by data: a list, a NumPy array or a Tensor (ints, slices, None, ... are basic)."""
    return isinstance(item, (list, np.ndarray)) or hasattr(item, "uop")


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
        raise IndexError(f"{op_name}: index {bad} is out of range for axis {axis} of size {size} (allowed: {allowed})")


class IndexMixin:
    """Selecting and placing values by index tensors, and layout helpers built on movement ops."""

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
        return index.unsqueeze(axis + 1) == type(self).arange(size, device=self.device).reshape(shape)

    def _sum_selected(self: Tensor, mask: Tensor, axis: int) -> Tensor:
        """The sum over `axis` of this tensor where `mask` holds (zero elsewhere), in this tensor's dtype."""
        return mask.where(self, 0)._sum_unwidened(axis).cast(self.dtype)

    # ---- gather and scatter ----------------------------------------------------------------------------------------

    def _check_gather_index(self: Tensor, dim: int, index: Tensor, op_name: str, other: Tensor | None = None) -> None:
        if not hasattr(index, "uop") or index.dtype.is_float or index.dtype == dtypes.bool:
            kind = index.dtype if hasattr(index, "uop") else type(index).__name__
            raise TypeError(f"{op_name}: index must be an integer Tensor, got {kind}; make it with dtype=dtypes.int32")
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
        _check_range(index.numpy(), self.shape[dim], op_name, dim, allow_negative=False)

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather)."""
        dim = normalize_axis(dim, self.ndim, "gather")
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
        source = self.expand(*(self.shape[dim] if a == dim else s for a, s in enumerate(shape)))
        return source.gather(dim, indices.expand(*(indices.shape[dim] if a == dim else s for a, s in enumerate(shape))))

    def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """The slices at the positions of a 1-D int `index` along `dim` (torch.index_select)."""
        dim = normalize_axis(dim, self.ndim, "index_select")
        if not hasattr(index, "uop") or index.ndim > 1 or index.dtype.is_float or index.dtype == dtypes.bool:
            raise TypeError(f"index_select: index must be a 0-d or 1-D integer Tensor, got {index!r}")
        return self[(slice(None),) * dim + (index.reshape(-1),)]

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
            return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
        dim = normalize_axis(dim, self.ndim, "scatter")
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
        dim = normalize_axis(dim, self.ndim, "scatter_reduce")
        mask, values = self._scatter_inputs(dim, index, src, "scatter_reduce")
        hits = mask._sum_unwidened(dim)
        values = values.expand(mask.shape)
        if include_self:
            # self takes part as one more writer that hits every place
            every = type(self).full((*mask.shape[:dim], 1, *mask.shape[dim + 1 :]), True, device=self.device)
            mask = mask.cat(every, dim=dim)
            values = values.cat(self.unsqueeze(dim), dim=dim)
        if reduce in ("sum", "mean"):
            combined = mask.where(values, 0).sum(dim, dtype=values._unwidened_dtype())
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
        if hasattr(value, "uop"):
            if value.ndim != 0:
                raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
            value = value.cast(self.dtype)
        else:
            value = type(self).full((), value, dtype=self.dtype, device=self.device)
        return mask.where(value, self)

    def masked_select(self: Tensor, mask: Tensor) -> Tensor:
        """The values where the bool `mask` (broadcast with self) holds, as a 1-D tensor in row-major order. The
        mask is realized: the result's length depends on it."""
        if not hasattr(mask, "uop") or mask.dtype != dtypes.bool:
            kind = mask.dtype if hasattr(mask, "uop") else type(mask).__name__
            raise TypeError(f"masked_select: mask must be a bool Tensor, got {kind}")
        shape = _broadcast_shapes("masked_select", [self.shape, mask.shape])
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
        for item in items:
            if _is_advanced(item):
                values = self._index_values(item, "getitem")
                if values.dtype == np.bool_:
                    if values.ndim == 0:
                        raise IndexError("getitem: a 0-d bool index is not supported; use a bool tensor with axes")
                    # a mask stands for the positions of its True values, one index per axis it covers
                    expanded.extend(("index", axis_values, None) for axis_values in np.nonzero(values))
                    continue
                # an int tensor stays in the graph (its values are read only to check them): a captured (jitted)
                # step then indexes with each call's values
                expanded.append(("index", values.astype(np.int64), item if hasattr(item, "uop") else None))
            else:
                expanded.append(item)
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
                _check_range(values, size, "getitem", axis, allow_negative=True)
                if tensor is None:
                    index = type(self)(np.where(values < 0, values + size, values).astype(np.int32), device=self.device)
                else:
                    if tensor.device != self.device:
                        raise ValueError(
                            f"getitem: the index is on {tensor.device} but the tensor is on {self.device}; use .to()"
                        )
                    index = tensor.cast(dtypes.int32)
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
        new values (a view of another tensor does not write through to it). Where an advanced index names a place
        twice, the last value wins (as in NumPy)."""
        self._check_writable()
        target_shape = self[index].shape
        if hasattr(value, "uop"):
            try:
                value = value.cast(self.dtype).expand(target_shape)
            except ValueError:
                raise ValueError(
                    f"setitem: value {value.shape} does not broadcast to the selected shape {target_shape}"
                ) from None
        numpy_index = self._numpy_index(index)
        # which value element lands on each place: computed on the index alone (a static map), -1 for none
        source = np.full(self.numel(), -1, dtype=np.int64)
        source[np.arange(self.numel()).reshape(self.shape)[numpy_index].reshape(-1)] = np.arange(prod(target_shape))
        written = type(self)(source.reshape(self.shape) >= 0, device=self.device)
        if hasattr(value, "uop"):
            value = value.flatten()[np.maximum(source, 0)].reshape(self.shape)
        else:
            value = type(self).full((), value, dtype=self.dtype, device=self.device)
        in_memory = is_buffer_view(self.uop)
        self.assign(written.where(value, self))
        if in_memory:  # written now, as torch does: other views of this memory (reshapes) see the new values
            self.realize()

    def _check_writable(self: Tensor) -> None:
        """A slice, transpose, flip or padding of other data cannot be written through to that data (torch would
        change it too), so setitem on one is an error rather than a silent copy. Reshapes of memory write through
        (see assign), and constants and computations belong to no other tensor's memory."""
        node = self.uop
        if node.op not in MOVEMENT_OPS or is_buffer_view(node):
            return
        while node.op in MOVEMENT_OPS:
            node = node.src[0]
        if node.op not in (Ops.CONST, Ops.ARANGE):
            raise RuntimeError(
                f"setitem: this {self.shape} tensor is a view (a slice, transpose, flip or pad) of another tensor, and "
                "writing into it would not change that tensor as in torch; index the original instead "
                "(x[0, 1] = v rather than y = x[0]; y[1] = v), or make a copy with .contiguous() first"
            )

    def _numpy_index(self: Tensor, index):
        """The index with Tensors replaced by their values, for NumPy."""
        items = index if isinstance(index, tuple) else (index,)
        return tuple(item.numpy() if hasattr(item, "uop") else item for item in items)

    # ---- layout ----------------------------------------------------------------------------------------------------

    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of the dim1 × dim2 planes (above it for offset > 0), as a last axis (a view)."""
        a, b = normalize_axis(dim1, self.ndim, "diagonal"), normalize_axis(dim2, self.ndim, "diagonal")
        if a == b:
            raise ValueError(f"diagonal: dim1 and dim2 name the same axis {a} of {self.shape}")
        x = self.permute(*(i for i in range(self.ndim) if i not in (a, b)), a, b)
        rows, cols = x.shape[-2:]
        count = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
        start = (offset if offset >= 0 else -offset * cols) if count else 0
        # element i of the diagonal sits at start + i*(cols+1) in the flattened plane
        flat = x.reshape(*x.shape[:-2], rows * cols)
        flat = flat.pad(((0, 0),) * (flat.ndim - 1) + ((0, count * (cols + 1)),))
        flat = flat.shrink(tuple(None for _ in flat.shape[:-1]) + ((start, start + count * (cols + 1)),))
        return flat.reshape(*x.shape[:-2], count, cols + 1)[..., 0]

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """A 1-D tensor as the `diagonal`-th diagonal of a square matrix, or a 2-D tensor's diagonal (torch.diag)."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ValueError(f"diag: needs a 1-D or 2-D tensor, got shape {self.shape}; use diagonal() or diag_embed")
        length, size = self.shape[0], self.shape[0] + abs(diagonal)
        start = diagonal if diagonal >= 0 else -diagonal * size
        # the inverse of diagonal(): element i goes to start + i*(size+1) of the flattened matrix
        spread = self.reshape(length, 1).pad(((0, 0), (0, size))).reshape(length * (size + 1))
        spread = spread.pad(((start, size * size - start - length * (size + 1)),))
        return spread.reshape(size, size)

    def roll(self: Tensor, shifts, dims=None) -> Tensor:
        """Elements shifted by `shifts` along `dims`, wrapping around (torch.roll; no dims: over the flattened
        tensor)."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = tuple(shifts) if isinstance(shifts, (list, tuple)) else (shifts,)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims; give one shift per dim")
        if not all(isinstance(shift, int) and not isinstance(shift, bool) for shift in shifts):
            raise TypeError(f"roll: shifts must be ints, got {shifts}")
        result = self
        for shift, dim in zip(shifts, dims):
            dim = normalize_axis(dim, self.ndim, "roll")
            size = self.shape[dim]
            if size == 0 or shift % size == 0:
                continue
            shift %= size
            tail, head = result.split([size - shift, shift], dim)
            result = head.cat(tail, dim=dim)
        return result

    def repeat_interleave(self: Tensor, repeats, dim: int | None = None) -> Tensor:
        """Each element repeated `repeats` times along `dim` (an int, or one count per element; no dim: over the
        flattened tensor)."""
        if dim is None:
            return self.flatten().repeat_interleave(repeats, 0)
        dim = normalize_axis(dim, self.ndim, "repeat_interleave")
        if isinstance(repeats, int):
            if repeats < 0:
                raise ValueError(f"repeat_interleave: repeats must be non-negative, got {repeats}")
            x = self.unsqueeze(dim + 1)
            x = x.expand(*x.shape[: dim + 1], repeats, *x.shape[dim + 2 :])
            return x.flatten(dim, dim + 1)
        counts = self._index_values(repeats, "repeat_interleave").reshape(-1)
        if counts.shape != (self.shape[dim],) or (counts < 0).any():
            raise ValueError(
                f"repeat_interleave: repeats must be {self.shape[dim]} non-negative counts (one per element of dim "
                f"{dim} of {self.shape}), got {counts.tolist()}"
            )
        return self[(slice(None),) * dim + (np.repeat(np.arange(len(counts)), counts),)]

    @classmethod
    def meshgrid(cls, *tensors: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of 1-D tensors: "ij" indexing (matrix) or "xy" (the first two axes swapped)."""
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            tensors = tuple(tensors[0])
        for tensor in tensors:
            if not hasattr(tensor, "uop"):
                raise TypeError(f"meshgrid: expects Tensors, got {type(tensor).__name__}")
            if tensor.ndim > 1:
                raise ValueError(f"meshgrid: expects 0-d or 1-D tensors, got shape {tensor.shape}")
        flat = [t.reshape(-1) for t in tensors]
        shape = tuple(t.shape[0] for t in flat)
        grids = [
            t.reshape(*(size if i == n else 1 for i, size in enumerate(shape))).expand(shape)
            for n, t in enumerate(flat)
        ]
        if indexing == "xy" and len(grids) >= 2:
            grids = [g.transpose(0, 1) for g in grids]
        return tuple(grids)

    def unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
        """Every window of `size` elements, `step` apart, along `dimension`: that axis becomes the count of windows
        and a new last axis holds each window (torch.Tensor.unfold; a view)."""
        dimension = normalize_axis(dimension, self.ndim, "unfold")
        if size <= 0 or step <= 0:
            raise ValueError(f"unfold: size and step must be positive, got size={size}, step={step}")
        if size > self.shape[dimension]:
            raise ValueError(f"unfold: size {size} exceeds dimension {dimension} of {self.shape}")
        windows = self._window(dimension, size, step, 1)
        return windows.permute(*(a for a in range(windows.ndim) if a != dimension + 1), dimension + 1)

    @classmethod
    def einsum(cls, formula: str, *operands: Tensor) -> Tensor:
        """Einstein summation: `"ij,jk->ik"`-style formulas with `...` and repeated letters (torch.einsum)."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        for operand in operands:
            if not hasattr(operand, "uop"):
                raise TypeError(f"einsum: operands must be Tensors, got {type(operand).__name__}")
        formula = formula.replace(" ", "")
        inputs, arrow, output = formula.partition("->")
        terms = inputs.split(",")
        if len(terms) != len(operands):
            raise ValueError(f"einsum: {formula!r} names {len(terms)} operands, but {len(operands)} were given")
        ellipsis_dims = 0
        for term, operand in zip(terms, operands):
            letters = term.replace("...", "")
            if not letters.isalpha() and letters:
                raise ValueError(f"einsum: {formula!r}: subscripts must be letters (and ...), got {term!r}")
            if "..." in term:
                ellipsis_dims = max(ellipsis_dims, operand.ndim - len(letters))
            elif len(term) != operand.ndim:
                raise ValueError(
                    f"einsum: subscript {term!r} has {len(term)} letters but its operand has shape {operand.shape}"
                )
        # "..." becomes upper-case letters (the subscripts themselves use either case; these are reserved here)
        spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in formula][:ellipsis_dims]
        if not arrow:
            counts = {c: inputs.replace("...", "").count(c) for c in inputs.replace("...", "").replace(",", "")}
            output = "..." + "".join(sorted(c for c, n in counts.items() if n == 1))
        output = output.replace("...", "".join(spare))
        sizes: dict[str, int] = {}
        aligned = []
        for term, operand in zip(terms, operands):
            if "..." in term:
                own = operand.ndim - len(term.replace("...", ""))
                term = term.replace("...", "".join(spare[ellipsis_dims - own :]))
            operand = operand._einsum_diagonals(term)
            term = "".join(dict.fromkeys(term))
            for letter, size in zip(term, operand.shape):
                known = sizes.get(letter)
                if known is None or known == 1:
                    sizes[letter] = size
                elif size not in (1, known):
                    raise ValueError(
                        f"einsum: {letter!r} has size {known} in one operand and {size} in another "
                        f"({formula!r} with shapes {[o.shape for o in operands]})"
                    )
            aligned.append((term, operand))
        if len(set(output)) != len(output):
            raise ValueError(f"einsum: output subscripts of {formula!r} repeat a letter")
        for letter in output:
            if letter not in sizes:
                raise ValueError(f"einsum: output subscript {letter!r} of {formula!r} is in no input")
        letters = list(output) + sorted(set(sizes) - set(output))
        product = None
        for term, operand in aligned:
            # each operand's axes ordered as `letters`, with size-1 axes for the letters it lacks
            permuted = operand.permute(*(term.index(c) for c in letters if c in term))
            shaped = permuted.reshape(*(operand.shape[term.index(c)] if c in term else 1 for c in letters))
            product = shaped if product is None else product * shaped
        full = product.expand(*(sizes[c] for c in letters))
        summed = tuple(range(len(output), len(letters)))
        return full._sum_unwidened(summed) if summed else full

    def _einsum_diagonals(self: Tensor, term: str) -> Tensor:
        """For a subscript with a repeated letter ("ii"), the diagonal over those axes, kept at the first one."""
        x, letters = self, list(term)
        for letter in dict.fromkeys(term):
            while letters.count(letter) > 1:
                first = letters.index(letter)
                second = letters.index(letter, first + 1)
                if x.shape[first] != x.shape[second]:
                    raise ValueError(
                        f"einsum: {letter!r} repeats in {term!r} over axes of sizes {x.shape[first]} and {x.shape[second]}"
                    )
                x = x.diagonal(0, first, second)  # the diagonal becomes the last axis: move it back to `first`
                del letters[second], letters[first]
                letters.append(letter)
                order = list(range(x.ndim))
                order.insert(first, order.pop())
                x = x.permute(order)
                letters.insert(first, letters.pop())
        return x
