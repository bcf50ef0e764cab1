"""Movement ops (reshape, permute, expand, pad, shrink, flip), indexing and joining. None of these copy: each is
a UOp that the consuming kernel turns into index arithmetic. Of a tensor in memory, those torch makes views of (a
reshape that keeps the layout, a slice, a transpose, an expand) are views: they show the memory's contents whenever
they are read. The others (a flip, a pad, a repeat, a reshape of a transpose, `cat` of one tensor) are values, as
torch's copies: they keep the contents they were made from (see engine/buffers.py's `memory_of`)."""

from __future__ import annotations

import functools
import math
import weakref
from typing import TYPE_CHECKING, Callable, Sequence

from lazygrad.dtype import DType, dtypes
from lazygrad.engine.buffers import DETACHED_VIEW, memory_of, views_memory, writes_pending
from lazygrad.helpers import prod
from lazygrad.tensor_elementwise import check_same_device
from lazygrad.uop.ops import MOVEMENT, Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def as_int(value) -> int | None:
    """`value` as a Python int where it is one: an int, a NumPy integer or a one-element int tensor, as torch takes
    them for sizes and axes (not a bool); else None."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return None
    try:
        return value.__index__()
    except (TypeError, ValueError):
        return None


def _sizes(args: tuple, op_name: str) -> tuple:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    sizes = tuple(as_int(size) for size in args)
    if None in sizes:
        raise TypeError(f"{op_name}: sizes must be ints, got {args}")
    return sizes


def normalize_axis(axis: int, ndim: int, op_name: str) -> int:
    """`axis` as a non-negative index, or an IndexError naming the op and the valid range."""
    if type(axis) is not int:
        if (index := as_int(axis)) is None:
            raise TypeError(f"{op_name}: axis must be an int, got {axis!r}")
        axis = index
    low, high = (-ndim, ndim - 1) if ndim else (-1, 0)
    if not low <= axis <= high:
        raise IndexError(
            f"{op_name}: axis {axis} is out of range for a tensor with {ndim} dimensions (expected {low}..{high})"
        )
    return axis % max(ndim, 1)


def check_has_axis(ndim: int, op_name: str) -> None:
    """An IndexError for ops that take an axis apart (split, chunk, unbind, narrow, roll and repeat_interleave
    along a dim): a 0-d tensor has none, and torch refuses these too (normalize_axis alone lets its axis 0 pass)."""
    if ndim == 0:
        raise IndexError(f"{op_name}: needs a tensor with at least 1 dimension, got a 0-d tensor; reshape(1) first")


def _dim_given_last(others: tuple, dim: int, op_name: str) -> tuple[tuple, int]:
    """(tensors, dim) where torch's positional dim (`Tensor.cat([a, b], 1)`) came last among the tensors."""
    last = others[-1] if others else None
    if hasattr(last, "__index__") and not hasattr(last, "uop") and not isinstance(last, bool) and dim == 0:
        others, dim = others[:-1], last.__index__()  # (an int, a NumPy int)
    for other in others:
        if not hasattr(other, "uop"):
            raise TypeError(
                f"{op_name}: expected tensors to join, got {type(other).__name__} {other!r}; pass the axis as dim="
            )
    return others, dim


def _first_of(tensors: list | tuple, op_name: str) -> Tensor:
    """The first of a list of tensors given in torch's form (`Tensor.cat([a, b])`), checked."""
    if not tensors or not all(hasattr(tensor, "uop") for tensor in tensors):
        raise TypeError(f"{op_name}: expected a non-empty list of Tensors, got {[type(t).__name__ for t in tensors]}")
    return tensors[0]


def keyword_aliases(**aliases: str) -> Callable:
    """A decorator letting a method take PyTorch's keyword names beside its own (tinygrad's): with
    `@keyword_aliases(dim="axis")`, `x.sum(dim=1)` is `x.sum(axis=1)`. Passing both names is a TypeError."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def with_aliases(self, *args, **kwargs):
            for alias, name in aliases.items():
                if alias in kwargs:
                    if name in kwargs:
                        raise TypeError(
                            f"{method.__name__}: got both {name}= and {alias}= (the same argument: {alias} is "
                            f"PyTorch's name for {name}); pass one"
                        )
                    kwargs[name] = kwargs.pop(alias)
            return method(self, *args, **kwargs)

        return with_aliases

    return decorate


class MovementMixin:
    """Views of a tensor: they change how indices map to values, never the values."""

    __slots__ = ()

    def _movement(self: Tensor, op: Ops, arg) -> Tensor:
        # a view of memory is made of the memory's node (it reads the writes pending on it when read: see
        # Tensor.uop); a copy in torch's terms (a flip or a pad of memory) of the values now, so the writes pending
        # on the memory run first (movement ops made of the memory's node stay views where more movement ops make
        # them one again, as a diagonal is cut out of a pad)
        source = self._uop
        node = UOp(op, self.dtype, (source,), arg)
        if writes_pending and (buffer := memory_of(source)) is not None and "writes" in buffer.__dict__:
            if memory_of(node) is None:
                self.realize()
        result = self._new(node)
        # (noted on a source not in memory: a write into it, or its realization, moves the tensors made of it that are
        # views in torch's terms onto its memory, see tensor_index's `move_views`; a view of memory shows its writes
        # already. A computation's node dies with its graph, and its notes with it)
        if source.op is not Ops.BUFFER and memory_of(source) is None:
            views = source.__dict__.get("views")
            if views is None:
                views = source.__dict__["views"] = {}
            elif len(views) >= 64:  # (a loop of views of one long-lived value: the dead ones go)
                for key in [key for key, reference in views.items() if reference() is None]:
                    del views[key]
            views[id(node)] = weakref.ref(node)
        if result._requires_grad is False and memory_of(source) is not None:
            # (made with gradients off: still a view of the memory, through which no gradient flows; or a copy, as
            # `memory_of` tells, once asked)
            result.uop = UOp(Ops.DETACH, self.dtype, (node,), DETACHED_VIEW)
        return result

    def _copied(self: Tensor, source: Tensor) -> Tensor:
        """The result of an op torch copies with (the one-tensor `cat`, `repeat`, a flip or pad that moves nothing)
        as a value of its own where it would be `source` itself or movement ops (over memory, or over a tensor that a
        write through a reshape of it later puts in memory): a no-op cast, which keeps the kernels, and no longer
        shows later writes into the memory (or into `source`)."""
        if self is not source and not views_memory(self._uop) and self._uop.op not in MOVEMENT:
            return self
        # (of memory, the values now, after the writes pending on it; of a value, as it is)
        node = self.uop if memory_of(source._uop) is not None else self._uop
        return self._new(UOp(Ops.CAST, self.dtype, (node,)))

    def reshape(self: Tensor, shape, *more) -> Tensor:
        """The same values in a new shape: `reshape(2, 3)`, `reshape((2, 3))` or `reshape(shape=(2, 3))`; one size may
        be -1 (it is inferred)."""
        shape = _sizes((shape, *more), "reshape")
        if shape.count(-1) > 1:
            raise ValueError(f"reshape: only one size can be -1, got {shape}")
        if any(size < -1 for size in shape):
            raise ValueError(f"reshape: sizes must be non-negative (or -1), got {shape}")
        if -1 in shape:
            known = prod(size for size in shape if size != -1)
            if known == 0 or self.numel() % known:
                raise ValueError(f"reshape: cannot reshape {self.shape} ({self.numel()} elements) into {shape}")
            shape = tuple(self.numel() // known if size == -1 else size for size in shape)
        if prod(shape) != self.numel():
            raise ValueError(
                f"reshape: cannot reshape {self.shape} ({self.numel()} elements) into {shape} ({prod(shape)} elements)"
            )
        if shape == self.shape:
            return self
        return self._movement(Ops.RESHAPE, shape)

    def view(self: Tensor, shape, *more) -> Tensor:
        """`reshape` (a view where the layout allows, as torch's), or, given a dtype, torch's `view(dtype)`: the
        same bytes read as that dtype (`bitcast`)."""
        if not more and isinstance(shape, DType):
            return self.bitcast(shape)
        return self.reshape(shape, *more)

    @keyword_aliases(dims="order")
    def permute(self: Tensor, order, *more) -> Tensor:
        """The axes reordered: output axis i is input axis order[i] (`permute(1, 0)`, `permute((1, 0))`,
        `permute(order=(1, 0))` or PyTorch's `permute(dims=(1, 0))`)."""
        order = tuple(normalize_axis(axis, self.ndim, "permute") for axis in _sizes((order, *more), "permute"))
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"permute: {order} is not a permutation of the {self.ndim} axes of a {self.shape} tensor")
        return self if order == tuple(range(self.ndim)) else self._movement(Ops.PERMUTE, order)

    def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
        """Axes `dim0` and `dim1` exchanged (a view); a 0-d tensor's one axis (0 or -1) with itself is the tensor,
        as in torch."""
        a, b = normalize_axis(dim0, self.ndim, "transpose"), normalize_axis(dim1, self.ndim, "transpose")
        if self.ndim == 0:
            return self
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self: Tensor) -> Tensor:
        """The matrix transposed (a 0-d or 1-d tensor as it is). On more axes NumPy and PyTorch reverse them all where
        tinygrad swaps the first two, so there it is an error rather than one of the two silently."""
        if self.ndim > 2:
            raise ValueError(
                f".T: ambiguous on a {self.ndim}-d tensor {self.shape} (NumPy and PyTorch reverse every axis, tinygrad "
                "swaps the first two); say which: .permute(*reversed(range(x.ndim))), .transpose(0, 1), or .mT for "
                "the last two"
            )
        return self.transpose() if self.ndim == 2 else self

    @property
    def mT(self: Tensor) -> Tensor:
        """The last two axes swapped: each matrix of a batch transposed (torch's mT)."""
        if self.ndim < 2:
            raise ValueError(
                f".mT: needs at least 2 axes (a batch of matrices), got a {self.ndim}-d tensor {self.shape}"
            )
        return self.transpose(-2, -1)

    @keyword_aliases(size="shape")
    def expand(self: Tensor, shape, *more) -> Tensor:
        """Size-1 axes repeated to `shape` without copying (-1 keeps a size; new leading axes may be added); the
        sizes may come as arguments, one tuple, `shape=` or PyTorch's `size=`."""
        shape = _sizes((shape, *more), "expand")
        if len(shape) < self.ndim:
            raise ValueError(f"expand: cannot expand {self.shape} to fewer dimensions {shape}")
        current = (1,) * (len(shape) - self.ndim) + self.shape
        shape = tuple(old if new == -1 else new for old, new in zip(current, shape))
        for old, new in zip(current, shape):
            if old != new and old != 1:
                raise ValueError(f"expand: cannot expand {self.shape} to {shape}: only size-1 axes can be expanded")
        base = self.reshape(current)
        return base if shape == current else base._movement(Ops.EXPAND, shape)

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        start, end = normalize_axis(start_dim, self.ndim, "flatten"), normalize_axis(end_dim, self.ndim, "flatten")
        if start > end:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(self.shape[:start] + (prod(self.shape[start : end + 1]),) + self.shape[end + 1 :])

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        dim = normalize_axis(dim, self.ndim, "unflatten")
        return self.reshape(self.shape[:dim] + tuple(sizes) + self.shape[dim + 1 :])

    def squeeze(self: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
        """The axes of size 1 removed: all, or those of `dim` (an axis or several, as torch; others stay)."""
        if dim is None:
            return self.reshape(tuple(size for size in self.shape if size != 1))
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        axes = {normalize_axis(axis, self.ndim, "squeeze") for axis in dims}
        if self.ndim == 0:
            return self
        return self.reshape(tuple(size for axis, size in enumerate(self.shape) if axis not in axes or size != 1))

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        shape = self.shape
        dim = normalize_axis(dim, len(shape) + 1, "unsqueeze")
        return self._movement(Ops.RESHAPE, shape[:dim] + (1,) + shape[dim:])  # (always a valid reshape)

    def pad(self: Tensor, padding, mode: str = "constant", value: float = 0.0) -> Tensor:
        """Pad with `value`: `padding` is ((before, after), ...) per axis (None for none), or a flat torch-style
        (left, right, top, bottom, ...) starting from the last axis. Negative amounts crop. `mode` "reflect",
        "replicate" or "circular" fills from the tensor's own values instead."""
        if isinstance(mode, (int, float)) and not isinstance(mode, bool):
            mode, value = "constant", mode  # pad(padding, value), the order before modes existed
        padding = tuple(padding)
        if padding and all(as_int(p) is not None for p in padding):
            padding = tuple(as_int(p) for p in padding)
            if len(padding) % 2 or len(padding) // 2 > self.ndim:
                raise ValueError(
                    f"pad: a flat padding needs an even count of at most {2 * self.ndim} ints, got {padding}"
                )
            pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)][::-1]
            padding = ((0, 0),) * (self.ndim - len(pairs)) + tuple(pairs)
        if len(padding) != self.ndim:
            raise ValueError(f"pad: need one (before, after) pair per axis of {self.shape}, got {padding}")
        for pair in padding:
            if pair is not None and (not isinstance(pair, (tuple, list)) or len(pair) != 2):
                raise ValueError(f"pad: each axis needs a (before, after) pair or None, got {pair!r} in {padding}")
        pairs = tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
        if mode != "constant":
            return self._pad_mode(pairs, mode)
        # negative padding crops first
        if any(b < 0 or a < 0 for b, a in pairs):
            cropped = self.shrink(tuple((max(0, -b), size - max(0, -a)) for (b, a), size in zip(pairs, self.shape)))
            positive = tuple((max(0, b), max(0, a)) for b, a in pairs)
        else:
            cropped, positive = self, pairs
        if all(p == (0, 0) for p in positive):
            return cropped._copied(self)  # (torch's pad copies)
        padded = cropped._movement(Ops.PAD, positive)
        if not self.dtype.is_float and isinstance(value, float):  # (as torch: the value in the tensor's dtype)
            if not math.isfinite(value):
                raise ValueError(f"pad: value {value} does not fit a {self.dtype} tensor; cast the tensor to a float")
            value = bool(value) if self.dtype == dtypes.bool else math.trunc(value)
        if value == 0 and not (self.dtype.is_float and math.copysign(1.0, value) < 0):  # (-0.0 pads with -0.0)
            return padded
        inside = (
            type(self).full(cropped.shape, True, dtype=dtypes.bool, device=self.device)._movement(Ops.PAD, positive)
        )
        return inside.where(padded, value)

    def shrink(self: Tensor, arg) -> Tensor:
        """The window [start, end) of each axis (None keeps an axis whole)."""
        shape = self.shape
        arg = tuple(
            (0, size) if window is None else (int(window[0]), int(window[1])) for window, size in zip(arg, shape)
        )
        if len(arg) != len(shape):
            raise ValueError(f"shrink: need one (start, end) pair per axis of {shape}, got {arg}")
        for (start, end), size in zip(arg, shape):
            if not 0 <= start <= end <= size:
                raise ValueError(f"shrink: window {(start, end)} does not fit an axis of size {size} in {shape}")
        if all(window == (0, size) for window, size in zip(arg, shape)):
            return self
        return self._movement(Ops.SHRINK, arg)

    @keyword_aliases(dims="axis")
    def flip(self: Tensor, axis, *more) -> Tensor:
        """The order of elements reversed along `axis`: `flip(0)`, `flip(0, 1)`, `flip((0, 1))` or PyTorch's
        `flip(dims=(0, 1))`."""
        axes = tuple(axis) if isinstance(axis, (tuple, list)) and not more else (axis, *more)
        normalized = [normalize_axis(a, self.ndim, "flip") for a in axes]
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"flip: axes {axes} repeat an axis")
        axes = tuple(sorted(normalized))
        axes = tuple(a for a in axes if self.ndim and self.shape[a] > 1)  # (a scalar's axis 0 is itself, as in torch)
        if not axes:
            return self._copied(self)  # (torch's flip copies)
        flipped = self._movement(Ops.FLIP, axes)
        # (a flip of memory's expanded axes, or of a flip, would show the memory as it is: a view, where torch copies)
        return flipped._copied(self) if memory_of(flipped._uop) is not None else flipped

    def repeat(self: Tensor, *repeats) -> Tensor:
        """The tensor tiled `repeats` times along each axis."""
        repeats = _sizes(repeats, "repeat")
        if len(repeats) < self.ndim:
            raise ValueError(f"repeat: need at least {self.ndim} repeat counts for {self.shape}, got {repeats}")
        base = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
        interleaved = base.reshape(tuple(s for size in base.shape for s in (1, size)))
        expanded = interleaved.expand(tuple(s for r, size in zip(repeats, base.shape) for s in (r, size)))
        # (torch's repeat copies: of memory, the expand it is made of would be a view, so it is a value of its own)
        return expanded.reshape(tuple(r * size for r, size in zip(repeats, base.shape)))._copied(self)

    # ---- indexing ------------------------------------------------------------------------------------------------

    def __getitem__(self: Tensor, index) -> Tensor:
        """Basic indexing: ints, slices (any step), None and Ellipsis."""
        items = index if isinstance(index, tuple) else (index,)
        for item in items:
            if not (item is None or item is Ellipsis or isinstance(item, (int, slice))) or isinstance(item, bool):
                raise TypeError(f"getitem: unsupported index {item!r}; use ints, slices, None or ...")
        if sum(item is Ellipsis for item in items) > 1:
            raise IndexError("getitem: an index can only have a single ellipsis (...)")
        consuming = sum(item is not None and item is not Ellipsis for item in items)
        if consuming > self.ndim:
            raise IndexError(f"getitem: too many indices ({consuming}) for a tensor of shape {self.shape}")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items = items[:at] + (slice(None),) * (self.ndim - consuming) + items[at + 1 :]
        else:
            items = items + (slice(None),) * (self.ndim - consuming)
        result, axis, final_shape = self, 0, []
        windows, steps = [], []
        for item in items:
            if item is None:
                final_shape.append(1)
                continue
            size = self.shape[axis]
            if isinstance(item, int):
                if not -size <= item < size:
                    raise IndexError(
                        f"getitem: index {item} is out of range for axis {axis} of size {size} in {self.shape}"
                    )
                item %= size
                windows.append((item, item + 1))
                steps.append(1)
            else:
                start, stop, step = item.indices(size)
                if step > 0:
                    count = max(0, math.ceil((stop - start) / step))
                    windows.append((start, start + max(0, (count - 1) * step + 1) if count else start))
                else:
                    count = max(0, math.ceil((start - stop) / -step))
                    low = start - (count - 1) * -step if count else start
                    windows.append((low, start + 1) if count else (0, 0))
                steps.append(step)
                final_shape.append(count)
            axis += 1
        result = result.shrink(tuple(windows))
        flips = [i for i, step in enumerate(steps) if step < 0]
        if flips:
            result = result.flip(flips)
        if any(abs(step) > 1 for step in steps):
            result = result._strided([abs(step) for step in steps])
        return result.reshape(tuple(final_shape))

    def _strided(self: Tensor, steps: list[int]) -> Tensor:
        """Every steps[i]-th element of each axis, starting at the first (pad to a multiple, reshape, take one)."""
        padded_shape = [math.ceil(size / step) * step for size, step in zip(self.shape, steps)]
        padding = tuple((0, p - size) for p, size in zip(padded_shape, self.shape))
        # (a view of memory: the padding is never selected)
        padded = self._movement(Ops.PAD, padding) if any(after for _, after in padding) else self
        split = padded.reshape(tuple(s for p, step in zip(padded_shape, steps) for s in (p // step, step)))
        taken = split.shrink(tuple(w for p, step in zip(padded_shape, steps) for w in ((0, p // step), (0, 1))))
        return taken.reshape(tuple(p // step for p, step in zip(padded_shape, steps)))

    # ---- joining and splitting -------------------------------------------------------------------------------------

    def cat(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
        """The tensors joined along `dim`; every other axis must match (`a.cat(b)`, `Tensor.cat(a, b)` or torch's
        `Tensor.cat([a, b])`)."""
        others, dim = _dim_given_last(others, dim, "cat")
        if isinstance(self, (list, tuple)):
            return _first_of(self, "cat").cat(*self[1:], *others, dim=dim)
        tensors = (self, *others)
        check_same_device("cat", *tensors)
        dim = normalize_axis(dim, self.ndim, "cat")
        for other in others:
            if other.ndim != self.ndim or any(
                a != b for i, (a, b) in enumerate(zip(self.shape, other.shape)) if i != dim
            ):
                raise ValueError(f"cat: shapes {self.shape} and {other.shape} differ outside dim {dim}")
        from lazygrad.dtype import least_upper_dtype

        dtype = least_upper_dtype(*(t.dtype for t in tensors), op_name="cat")
        sizes = [t.shape[dim] for t in tensors]
        total, ndim = sum(sizes), self.ndim
        if not others:  # (torch's cat makes a new tensor: not a view of this one's memory)
            return self.cast(dtype)._copied(self)
        result, offset = None, 0
        for tensor, size in zip(tensors, sizes):
            # each piece padded with zeros to the whole length (the sizes are checked: a PAD node at once)
            piece = tensor.cast(dtype)
            if size != total:
                padding = [(0, 0)] * ndim
                padding[dim] = (offset, total - offset - size)
                piece = piece._movement(Ops.PAD, tuple(padding))
            result = piece if result is None else (result | piece if dtype == dtypes.bool else result + piece)
            offset += size
        return result

    def stack(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
        """The tensors joined along a new axis `dim` (`a.stack(b)`, `Tensor.stack(a, b)` or torch's
        `Tensor.stack([a, b])`)."""
        others, dim = _dim_given_last(others, dim, "stack")
        if isinstance(self, (list, tuple)):
            return _first_of(self, "stack").stack(*self[1:], *others, dim=dim)
        tensors = (self, *others)
        dim = normalize_axis(dim, self.ndim + 1, "stack")
        for other in others:
            if other.shape != self.shape:
                raise ValueError(f"stack: all tensors need the same shape, got {self.shape} and {other.shape}")
        return self.unsqueeze(dim).cat(*(t.unsqueeze(dim) for t in tensors[1:]), dim=dim)

    @keyword_aliases(split_size_or_sections="sizes", split_size="sizes")
    def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Pieces of `sizes` (or of equal size `sizes`, the last one smaller) along `dim`."""
        check_has_axis(self.ndim, "split")
        dim = normalize_axis(dim, self.ndim, "split")
        length = self.shape[dim]
        if as_int(sizes) is not None:
            sizes = as_int(sizes)
            if sizes <= 0:
                raise ValueError(f"split: size must be positive, got {sizes}")
            sizes = [min(sizes, length - start) for start in range(0, length, sizes)] or [0]
        if sum(sizes) != length:
            raise ValueError(
                f"split: sizes {list(sizes)} do not add up to {length}, the size of dim {dim} of {self.shape}"
            )
        pieces, start = [], 0
        for size in sizes:
            window = [None] * self.ndim
            window[dim] = (start, start + size)
            pieces.append(self.shrink(tuple(window)))
            start += size
        return tuple(pieces)

    def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
        """The slices along `dim`, that axis removed (torch.unbind)."""
        check_has_axis(self.ndim, "unbind")
        dim = normalize_axis(dim, self.ndim, "unbind")
        return tuple(self[(slice(None),) * dim + (index,)] for index in range(self.shape[dim]))

    def t(self: Tensor) -> Tensor:
        """A 0-d, 1-D or 2-D tensor transposed (torch's .t(): the others are an error, use .mT or .transpose)."""
        if self.ndim > 2:
            raise ValueError(f"t: needs at most 2 dimensions, got {self.shape}; use .mT or .transpose(dim0, dim1)")
        return self if self.ndim < 2 else self.transpose(0, 1)

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """`chunks` nearly equal pieces along `dim`."""
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        check_has_axis(self.ndim, "chunk")
        dim = normalize_axis(dim, self.ndim, "chunk")
        if self.shape[dim] == 0:  # (as torch: that many empty pieces)
            return tuple(self._movement(Ops.RESHAPE, self.shape) for _ in range(chunks))
        return self.split(math.ceil(self.shape[dim] / chunks), dim)
