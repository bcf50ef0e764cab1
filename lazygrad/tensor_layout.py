"""Layout ops built on movement ops: diagonals, roll, repeat_interleave, meshgrid, unfold, einsum, and the
rearrangements PyTorch names (pixel_shuffle, movedim, ...). Most are views; einsum adds one reduce."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.dtype import dtypes, least_upper_dtype
from lazygrad.tensor_elementwise import NARROW_FLOATS, check_same_device
from lazygrad.tensor_index import refuse_host_values_in_capture
from lazygrad.tensor_movement import as_int, check_has_axis, keyword_aliases, normalize_axis

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def _stacked_operands(first, others: tuple, op_name: str) -> list:
    """The tensors an hstack-like op joins: `Tensor.hstack([a, b])` (torch's form) or `a.hstack(b)`."""
    tensors = list(first) if isinstance(first, (list, tuple)) and not others else [first, *others]
    if not tensors or not all(hasattr(tensor, "uop") for tensor in tensors):
        raise TypeError(f"{op_name}: expected a non-empty list of Tensors, got {[type(t).__name__ for t in tensors]}")
    return tensors


def _rearrange_groups(side: str, formula: str) -> list[list[str]]:
    """One side of a rearrange formula as its top-level axes, each a list of the names merged into it ("1" for an
    axis of size 1, ["..."] for the ellipsis)."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for token in side.replace("(", " ( ").replace(")", " ) ").split():
        if token == "(":
            if current is not None:
                raise ValueError(f"rearrange: nested parentheses in {formula!r}")
            current = []
        elif token == ")":
            if current is None:
                raise ValueError(f"rearrange: an unmatched ')' in {formula!r}")
            groups.append(current)
            current = None
        elif token != "1" and token != "..." and not token.isidentifier():
            raise ValueError(f"rearrange: {token!r} in {formula!r} is not an axis name, 1 or ...")
        elif current is not None:
            if token == "...":
                raise ValueError(f"rearrange: '...' inside parentheses in {formula!r} is not supported")
            current.append(token)
        else:
            groups.append([token])
    if current is not None:
        raise ValueError(f"rearrange: an unclosed '(' in {formula!r}")
    return groups


class LayoutMixin:
    """Rearrangements of a tensor's elements: diagonals, rolls, repeats, grids, windows and einsum."""

    __slots__ = ()

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

    def expand_as(self: Tensor, other: Tensor) -> Tensor:
        """`expand` to other's shape."""
        return self.expand(other.shape)

    def reshape_as(self: Tensor, other: Tensor) -> Tensor:
        """`reshape` to other's shape."""
        return self.reshape(other.shape)

    def view_as(self: Tensor, other: Tensor) -> Tensor:
        """`reshape` to other's shape (torch.Tensor.view_as)."""
        return self.reshape(other.shape)

    def narrow(self: Tensor, dim: int, start: int, length: int) -> Tensor:
        """`length` elements from `start` along `dim` (a negative start counts from the end), as a view."""
        check_has_axis(self.ndim, "narrow")
        dim = normalize_axis(dim, self.ndim, "narrow")
        size = self.shape[dim]
        start = as_int(start) if as_int(start) is not None else start
        length = as_int(length) if as_int(length) is not None else length
        begin = start + size if isinstance(start, int) and -size <= start < 0 else start
        if (
            not isinstance(begin, int)
            or not isinstance(length, int)
            or not (0 <= begin and 0 <= length <= size - begin)
        ):
            raise IndexError(
                f"narrow: start {start} and length {length} do not fit dim {dim} of size {size} in {self.shape}"
            )
        return self.shrink(tuple((begin, begin + length) if axis == dim else None for axis in range(self.ndim)))

    def tile(self: Tensor, *dims, **named) -> Tensor:
        """The tensor repeated `dims` times along its last axes (torch.tile: fewer counts than axes count as 1s
        in front; more add leading axes), given as `tile(2, 3)`, `tile((2, 3))` or torch's `tile(dims=(2, 3))`."""
        if named:
            if set(named) != {"dims"} or dims:
                raise TypeError(f"tile: takes the counts as arguments or as dims=, got {sorted(named)} and {dims}")
            dims = (named["dims"],)
        counts = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return self.repeat(*(1,) * (self.ndim - len(counts)), *counts)

    def movedim(self: Tensor, source, destination) -> Tensor:
        """Axes `source` (an int or a sequence) moved to positions `destination`, the others keeping their order
        (torch.movedim; a view)."""
        sources = (source,) if as_int(source) is not None else tuple(source)
        destinations = (destination,) if as_int(destination) is not None else tuple(destination)
        if len(sources) != len(destinations):
            raise ValueError(
                f"movedim: {len(sources)} source axes {sources} but {len(destinations)} destinations {destinations}"
            )
        sources = tuple(normalize_axis(a, self.ndim, "movedim") for a in sources)
        destinations = tuple(normalize_axis(a, self.ndim, "movedim") for a in destinations)
        if len(set(sources)) != len(sources) or len(set(destinations)) != len(destinations):
            raise ValueError(f"movedim: repeated axes in source {sources} or destination {destinations}")
        if self.ndim == 0:  # (its one axis, 0 or -1 as torch allows, moved onto itself)
            return self
        order: list = [None] * self.ndim
        for axis_from, axis_to in zip(sources, destinations):
            order[axis_to] = axis_from
        rest = iter(a for a in range(self.ndim) if a not in sources)
        return self.permute(tuple(a if a is not None else next(rest) for a in order))

    def moveaxis(self: Tensor, source, destination) -> Tensor:
        """`movedim` by NumPy's name."""
        return self.movedim(source, destination)

    def swapaxes(self: Tensor, axis0: int, axis1: int) -> Tensor:
        """Two axes exchanged (`transpose` by NumPy's name; torch.swapaxes)."""
        return self.transpose(axis0, axis1)

    def swapdims(self: Tensor, dim0: int, dim1: int) -> Tensor:
        """Two axes exchanged (torch.swapdims)."""
        return self.transpose(dim0, dim1)

    def pixel_shuffle(self: Tensor, upscale_factor: int) -> Tensor:
        """(..., C*r*r, H, W) -> (..., C, H*r, W*r): each group of r*r channels becomes an r×r block of pixels
        (torch.nn.functional.pixel_shuffle; a view)."""
        r = as_int(upscale_factor)
        if r is None or r < 1:
            raise ValueError(f"pixel_shuffle: upscale_factor must be a positive int, got {upscale_factor!r}")
        if self.ndim < 3 or self.shape[-3] % (r * r):
            raise ValueError(
                f"pixel_shuffle: input {self.shape} needs at least 3 dimensions with channels (dim -3) divisible by "
                f"upscale_factor**2 = {r * r}"
            )
        *batch, channels, height, width = self.shape
        blocks = self.reshape(*batch, channels // (r * r), r, r, height, width)
        b = len(batch)
        shuffled = blocks.permute(*range(b), b, b + 3, b + 1, b + 4, b + 2)
        return shuffled.reshape(*batch, channels // (r * r), height * r, width * r)

    def pixel_unshuffle(self: Tensor, downscale_factor: int) -> Tensor:
        """(..., C, H*r, W*r) -> (..., C*r*r, H, W), the inverse of `pixel_shuffle`."""
        r = as_int(downscale_factor)
        if r is None or r < 1:
            raise ValueError(f"pixel_unshuffle: downscale_factor must be a positive int, got {downscale_factor!r}")
        if self.ndim < 3 or self.shape[-2] % r or self.shape[-1] % r:
            raise ValueError(
                f"pixel_unshuffle: input {self.shape} needs at least 3 dimensions with height and width (dims -2 and "
                f"-1) divisible by downscale_factor = {r}"
            )
        *batch, channels, height, width = self.shape
        pixels = self.reshape(*batch, channels, height // r, r, width // r, r)
        b = len(batch)
        gathered = pixels.permute(*range(b), b, b + 2, b + 4, b + 1, b + 3)
        return gathered.reshape(*batch, channels * r * r, height // r, width // r)

    def roll(self: Tensor, shifts, dims=None) -> Tensor:
        """Elements shifted by `shifts` along `dims`, wrapping around (torch.roll; no dims: over the flattened
        tensor)."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = tuple(shifts) if isinstance(shifts, (list, tuple)) else (shifts,)
        dims = (dims,) if as_int(dims) is not None else tuple(dims)
        shifts = tuple(shift if as_int(shift) is None else as_int(shift) for shift in shifts)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims; give one shift per dim")
        if not all(isinstance(shift, int) and not isinstance(shift, bool) for shift in shifts):
            raise TypeError(f"roll: shifts must be ints, got {shifts}")
        if dims:
            check_has_axis(self.ndim, "roll")
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
        check_has_axis(self.ndim, "repeat_interleave")
        dim = normalize_axis(dim, self.ndim, "repeat_interleave")
        if as_int(repeats) is not None and not hasattr(repeats, "uop"):
            repeats = as_int(repeats)
            if repeats < 0:
                raise ValueError(f"repeat_interleave: repeats must be non-negative, got {repeats}")
            x = self.unsqueeze(dim + 1)
            x = x.expand(*x.shape[: dim + 1], repeats, *x.shape[dim + 2 :])
            return x.flatten(dim, dim + 1)
        refuse_host_values_in_capture(
            repeats, "repeat_interleave", "Pass repeats as a list (the length depends on them)"
        )
        counts = self._index_values(repeats, "repeat_interleave").reshape(-1)
        if counts.shape != (self.shape[dim],) or (counts < 0).any():
            raise ValueError(
                f"repeat_interleave: repeats must be {self.shape[dim]} non-negative counts (one per element of dim "
                f"{dim} of {self.shape}), got {counts.tolist()}"
            )
        return self[(slice(None),) * dim + (np.repeat(np.arange(len(counts)), counts),)]

    def meshgrid(self: Tensor, *tensors: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of 1-D tensors: "ij" indexing (matrix) or "xy" (the first two axes swapped). Called as
        `x.meshgrid(y)` or `Tensor.meshgrid(x, y)` (or with a list of them), as `cat`."""
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
        tensors = tuple(self) if isinstance(self, (list, tuple)) and not tensors else (self, *tensors)
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
        if self.ndim == 0:  # as torch: a 0-d tensor is one window of its one element, shape (1,)
            if size > 1:
                raise ValueError(f"unfold: size {size} exceeds the one element of a 0-d tensor")
            return self.reshape(1)
        if size > self.shape[dimension]:
            raise ValueError(f"unfold: size {size} exceeds dimension {dimension} of {self.shape}")
        windows = self._window(dimension, size, step, 1)
        return windows.permute(*(a for a in range(windows.ndim) if a != dimension + 1), dimension + 1)

    def rearrange(self: Tensor, formula: str, **sizes: int) -> Tensor:
        """Axes named, split, merged and reordered by an einops formula, as tinygrad's: "b (h w) c -> b h w c" with
        `h=` (or `w=`) given, "b c h w -> b (c h w)", "... h w -> ... w h"; a 1 is an axis of size 1. Movement ops
        only: a reshape, a permute, a reshape."""
        if not isinstance(formula, str) or formula.count("->") != 1:
            raise ValueError(f"rearrange: expected a formula 'input axes -> output axes', got {formula!r}")
        left, right = (_rearrange_groups(side, formula) for side in formula.split("->"))
        named = [[atom for group in side for atom in group if atom != "1"] for side in (left, right)]
        for side in named:
            if len(set(side)) != len(side) or side.count("...") > 1:
                raise ValueError(f"rearrange: {formula!r} names an axis twice on one side")
        if sorted(named[0]) != sorted(named[1]):
            raise ValueError(
                f"rearrange: {formula!r} must name the same axes on both sides, got {named[0]} and {named[1]}"
            )
        fixed = sum(group != ["..."] for group in left)
        if fixed > self.ndim or ["..."] not in left and fixed != self.ndim:
            raise ValueError(f"rearrange: {formula!r} names {fixed} axes, but the tensor {self.shape} has {self.ndim}")
        extra = [f"...{number}" for number in range(self.ndim - fixed)]  # (the axes the ellipsis stands for)

        def atoms(group: list[str]) -> list[str]:
            return extra if group == ["..."] else [atom for atom in group if atom != "1"]

        given = {name: as_int(size) for name, size in sizes.items()}
        if None in given.values():
            raise TypeError(f"rearrange: sizes must be ints, got {sizes}")
        atom_sizes: dict[str, int] = {}
        axis = 0
        for group in left:
            if group == ["..."]:
                atom_sizes.update(zip(extra, self.shape[axis : axis + len(extra)]))
                axis += len(extra)
                continue
            size, unknown, product = self.shape[axis], [a for a in atoms(group) if a not in given], 1
            for atom in atoms(group):
                product *= given.get(atom, 1)
            if len(unknown) > 1 or size % product or (not unknown and product != size):
                raise ValueError(
                    f"rearrange: axis {axis} of {self.shape} (size {size}) cannot be split as ({' '.join(group)}) with "
                    f"sizes {sizes}; give the sizes of all but one of its axes"
                )
            atom_sizes.update({atom: size // product if atom in unknown else given[atom] for atom in atoms(group)})
            axis += 1
        left_atoms = [atom for group in left for atom in atoms(group)]
        right_atoms = [atom for group in right for atom in atoms(group)]
        split = self.reshape(tuple(atom_sizes[atom] for atom in left_atoms))
        moved = split.permute(tuple(left_atoms.index(atom) for atom in right_atoms))
        merged: list[int] = []
        for group in right:
            if group == ["..."]:
                merged.extend(atom_sizes[atom] for atom in extra)
            else:
                merged.append(math.prod(atom_sizes[atom] for atom in atoms(group)))
        return moved.reshape(tuple(merged))

    def ravel(self: Tensor) -> Tensor:
        """The elements as a 1-D tensor in row-major order (torch.ravel: a 0-d tensor gives shape (1,))."""
        return self.reshape(-1)

    @keyword_aliases(sections="indices_or_sections", indices="indices_or_sections")
    def tensor_split(self: Tensor, indices_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
        """Views along `dim` (torch.tensor_split): an int n gives n pieces, the first size % n one longer; a list
        of indices (or a 1-D int tensor) cuts before each, as Python slices x[a:b] between them (so an index past
        the end or below the previous one gives an empty piece)."""
        check_has_axis(self.ndim, "tensor_split")
        dim = normalize_axis(dim, self.ndim, "tensor_split")
        size = self.shape[dim]
        split = indices_or_sections
        if hasattr(split, "uop"):
            if split.dtype.is_float or split.dtype == dtypes.bool or split.ndim > 1:
                raise TypeError(
                    f"tensor_split: a tensor of indices_or_sections must be a 0-d or 1-D int tensor, got {split.dtype} "
                    f"of shape {split.shape}"
                )
            refuse_host_values_in_capture(split, "tensor_split", "Pass the sections or indices as Python ints")
            split = split.item() if split.ndim == 0 else split.tolist()
        if as_int(split) is not None:
            sections = as_int(split)
            if sections <= 0:
                raise ValueError(f"tensor_split: the number of sections must be positive, got {sections}")
            base, extra = divmod(size, sections)
            bounds = [0]
            for piece in range(sections):
                bounds.append(bounds[-1] + base + (piece < extra))
            windows = list(zip(bounds, bounds[1:]))
        elif isinstance(split, (list, tuple)) and all(as_int(index) is not None for index in split):
            cuts = [0, *(as_int(index) for index in split), None]
            windows = []
            for start, stop in zip(cuts, cuts[1:]):
                begin, end, _ = slice(start, stop).indices(size)
                windows.append((begin, max(begin, end)))
        else:
            raise TypeError(
                f"tensor_split: indices_or_sections must be an int, a list of ints or an int tensor, got {split!r}"
            )
        return tuple(self.shrink(tuple(window if a == dim else None for a in range(self.ndim))) for window in windows)

    def hstack(self: Tensor, *others: Tensor) -> Tensor:
        """The tensors joined column-wise: along dim 1, or dim 0 where they are 1-D (torch.hstack; called as
        `Tensor.hstack([a, b])` or `a.hstack(b)`; 0-d ones count as 1-D)."""
        tensors = [t.reshape(1) if t.ndim == 0 else t for t in _stacked_operands(self, others, "hstack")]
        return tensors[0].cat(*tensors[1:], dim=0 if tensors[0].ndim == 1 else 1)

    def vstack(self: Tensor, *others: Tensor) -> Tensor:
        """The tensors joined row-wise, along dim 0, a 1-D (n,) one as a (1, n) row (torch.vstack)."""
        tensors = [t.reshape(1, -1) if t.ndim < 2 else t for t in _stacked_operands(self, others, "vstack")]
        return tensors[0].cat(*tensors[1:], dim=0)

    def dstack(self: Tensor, *others: Tensor) -> Tensor:
        """The tensors joined depth-wise, along dim 2: (n,) as (1, n, 1), (m, n) as (m, n, 1) (torch.dstack)."""
        tensors = _stacked_operands(self, others, "dstack")
        tensors = [t.reshape(1, -1, 1) if t.ndim < 2 else t.unsqueeze(-1) if t.ndim == 2 else t for t in tensors]
        return tensors[0].cat(*tensors[1:], dim=2)

    def column_stack(self: Tensor, *others: Tensor) -> Tensor:
        """The tensors side by side as columns, along dim 1: 0-d and 1-D ones as (n, 1) columns (torch.column_stack)."""
        tensors = [t.reshape(-1, 1) if t.ndim < 2 else t for t in _stacked_operands(self, others, "column_stack")]
        return tensors[0].cat(*tensors[1:], dim=1)

    @classmethod
    def einsum(cls, formula: str, *operands: Tensor) -> Tensor:
        """Einstein summation: `"ij,jk->ik"`-style formulas with `...` and repeated letters (torch.einsum)."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        for operand in operands:
            if not hasattr(operand, "uop"):
                raise TypeError(f"einsum: operands must be Tensors, got {type(operand).__name__}")
        check_same_device("einsum", *operands)
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
        summed = tuple(range(len(output), len(letters)))
        dtype = least_upper_dtype(*(operand.dtype for _, operand in aligned), op_name="einsum")
        # half and bfloat16 products of a sum multiplied and summed in float32, rounded once (see _sum_of_products)
        widened = bool(summed) and dtype in NARROW_FLOATS
        product = None
        for term, operand in aligned:
            operand = operand.float() if widened else operand
            # each operand's axes ordered as `letters`, with size-1 axes for the letters it lacks
            # (as tuples: a 0-d operand of ",->" has no axes, and permute() or reshape() with none is an error)
            permuted = operand.permute(tuple(term.index(c) for c in letters if c in term))
            shaped = permuted.reshape(tuple(operand.shape[term.index(c)] if c in term else 1 for c in letters))
            product = shaped if product is None else product * shaped
        full = product.expand(tuple(sizes[c] for c in letters))
        if widened:
            return full.sum(summed).cast(dtype)
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
