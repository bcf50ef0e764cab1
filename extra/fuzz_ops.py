"""The random-graph fuzzer's vocabulary: the program under construction, its leaves and its ops.

Every op builds the same value twice, as a lazy lazygrad tensor and as a NumPy array, and records the lazygrad
expression that built it, so a failing program can be printed as a runnable script. ``extra/fuzz.py`` strings the
ops into programs and checks them.

Leaves are NumPy arrays, ``Tensor.rand``/``Tensor.randn`` (left lazy, so the generator is computed inside the
kernels that read it; its values are read back with ``.numpy()`` from a twin drawn after the same
``Tensor.manual_seed``) and ``Tensor.arange``. Values are kept small (rescaled by a power of two when they grow) and
comparisons keep a margin from every element, so float32 rounding differences never flip a branch.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lazygrad import Tensor

MAX_INPUT_ELEMENTS = 300
MAX_ELEMENTS = 600  # after expand or pad
MAX_DIMS = 4
VALUE_LIMIT = 8.0  # rescale a value whose magnitude grows past this
COMPARISON_MARGIN = 1e-2  # a comparison's threshold stays this far from every compared element
SCALARS = (0.5, -1.25, 2.0, 3.0, -0.75)


@dataclass
class Value:
    """One node of a generated program: its name, the lazygrad tensor and the NumPy array it must equal."""

    name: str
    tensor: Tensor
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape both sides share."""
        return self.array.shape


@dataclass
class Program:
    """A program under construction: every value so far, the lines that built them and its leaves."""

    seed: int
    rng: np.random.Generator
    values: list[Value] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    leaves: set[str] = field(default_factory=set)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # the leaves that are NumPy arrays
    motif: str = "none"

    def add_input(self, shape: tuple[int, ...], make_leaf: Callable | None = None) -> Value:
        """A new leaf of the given shape, made by ``make_leaf`` or by a random one of LEAVES: a NumPy array, random
        numbers or an arange."""
        make_leaf = make_leaf or LEAVES[int(self.rng.choice(len(LEAVES), p=LEAF_WEIGHTS))][0]
        name = f"v{len(self.values)}"
        self.leaves.add(name)
        return self._keep(make_leaf(self, name, shape))

    def apply(self, code: str, tensor: Tensor, array: np.ndarray) -> Value:
        """Record a new value; ``code`` is the lazygrad expression that built ``tensor``."""
        name = f"v{len(self.values)}"
        self.lines.append(f"{name} = {code}")
        value = self._keep(Value(name, tensor, np.asarray(array)))
        if value.array.size and float(np.abs(value.array).max()) > VALUE_LIMIT:
            value = self.rescale(value)
        return value

    def rescale(self, value: Value) -> Value:
        """Multiply by a power of two (exact in float32) so the magnitude drops to at most VALUE_LIMIT."""
        exponent = math.ceil(math.log2(float(np.abs(value.array).max()) / VALUE_LIMIT))
        factor = 2.0**-exponent
        return self.apply(f"{value.name} * {factor!r}", value.tensor * factor, value.array * np.float32(factor))

    def _keep(self, value: Value) -> Value:
        self.values.append(value)
        return value

    def listing(self) -> str:
        """The program as indented source lines, for error messages."""
        return "\n".join(f"    {line}" for line in self.lines)

    def reproducer(self) -> str:
        """A standalone script that rebuilds the program and prints every computed value beside NumPy's."""
        parts = ["import numpy as np", "from lazygrad import Tensor", "", "inputs = {"]
        parts += [
            f"    {name!r}: np.array({array.tolist()!r}, dtype=np.float32)," for name, array in self.inputs.items()
        ]
        parts += ["}", *self.lines, ""]
        for value in self.values:
            if value.name not in self.leaves:
                parts.append(f"print({value.name!r}, {value.name}.numpy().tolist())")
                parts.append(f"#   numpy: {value.array.tolist()}")
        return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------------
# leaves


def array_leaf(program: Program, name: str, shape: tuple[int, ...]) -> Value:
    """A float32 NumPy array, standard normal or uniform in [-2, 2)."""
    rng = program.rng
    array = (rng.standard_normal(shape) if rng.random() < 0.5 else rng.uniform(-2, 2, shape)).astype(np.float32)
    program.inputs[name] = array
    program.lines.append(f"{name} = Tensor(inputs[{name!r}])  # shape {shape}")
    return Value(name, Tensor(array), array)


def random_leaf(program: Program, name: str, shape: tuple[int, ...]) -> Value:
    """``Tensor.rand`` scaled to [-2, 2), or ``Tensor.randn``. The leaf stays lazy; its values come from a twin drawn
    after the same seed and read back with ``.numpy()``, so NumPy computes on exactly the numbers lazygrad drew."""
    rng = program.rng
    seed = int(rng.integers(1 << 31))
    normal = bool(rng.random() < 0.4)
    draw = Tensor.randn if normal else Tensor.rand
    Tensor.manual_seed(seed)
    drawn = draw(*shape).numpy()
    Tensor.manual_seed(seed)
    program.lines.append(f"Tensor.manual_seed({seed})")
    if normal:
        program.lines.append(f"{name} = Tensor.randn(*{shape!r})")
        return Value(name, draw(*shape), drawn)
    program.lines.append(f"{name} = Tensor.rand(*{shape!r}) * 4 - 2")
    return Value(name, draw(*shape) * 4 - 2, drawn * np.float32(4) - np.float32(2))  # exact in float32


def arange_leaf(program: Program, name: str, shape: tuple[int, ...]) -> Value:
    """``Tensor.arange(start, stop, step).reshape(shape)`` with a power-of-two step: every value is exact."""
    rng = program.rng
    size = math.prod(shape)
    step = float(rng.choice([1.0, 0.5, 0.25, -0.25, -0.5]))
    while abs(step) * size > VALUE_LIMIT:
        step /= 2
    start = float(rng.choice([-4.0, -2.0, -0.5, 0.0])) if step > 0 else float(rng.choice([0.0, 2.0, 4.0]))
    stop = start + step * size  # exact, so arange counts exactly `size` values
    program.lines.append(f"{name} = Tensor.arange({start!r}, {stop!r}, {step!r}).reshape({shape!r})")
    array = (np.arange(size, dtype=np.float32) * np.float32(step) + np.float32(start)).reshape(shape)
    return Value(name, Tensor.arange(start, stop, step).reshape(shape), array)


LEAVES: list[tuple[Callable[[Program, str, tuple[int, ...]], Value], float]] = [
    (array_leaf, 0.45),
    (random_leaf, 0.35),
    (arange_leaf, 0.2),
]
LEAF_WEIGHTS = np.array([weight for _, weight in LEAVES]) / sum(weight for _, weight in LEAVES)


# ---------------------------------------------------------------------------------------------------------
# shapes and small random choices


def random_shape(rng: np.random.Generator, max_elements: int = MAX_INPUT_ELEMENTS) -> tuple[int, ...]:
    """A random shape with 1 to 4 dims of size 1..7 and at most ``max_elements`` elements."""
    while True:
        shape = tuple(int(size) for size in rng.integers(1, 8, size=int(rng.integers(1, MAX_DIMS + 1))))
        if math.prod(shape) <= max_elements:
            return shape


def random_factorization(rng: np.random.Generator, size: int) -> tuple[int, ...]:
    """A random shape with 1 to 4 dims (some possibly 1) whose product is ``size``."""
    factors = []
    remaining, divisor = size, 2
    while remaining > 1:
        while remaining % divisor == 0:
            factors.append(divisor)
            remaining //= divisor
        divisor += 1
    dims = [1] * int(rng.integers(1, MAX_DIMS + 1))
    for factor in factors:
        dims[int(rng.integers(len(dims)))] *= factor
    return tuple(dims)


def random_axes(rng: np.random.Generator, ndim: int) -> int | tuple[int, ...] | None:
    """Reduce axes: None (everything), one axis (sometimes negative) or a tuple of distinct axes."""
    choice = rng.random()
    if choice < 0.15:
        return None
    if choice < 0.6 or ndim == 1:
        axis = int(rng.integers(ndim))
        return axis - ndim if rng.random() < 0.3 else axis
    count = int(rng.integers(1, ndim + 1))
    return tuple(sorted(int(axis) for axis in rng.choice(ndim, size=count, replace=False)))


def random_real_axes(rng: np.random.Generator, shape: tuple[int, ...]) -> int | tuple[int, ...] | None:
    """Like :func:`random_axes`, but reducing at least one dim of size > 1 whenever there is one."""
    axes = random_axes(rng, len(shape))
    chosen = range(len(shape)) if axes is None else [axes] if isinstance(axes, int) else axes
    real = [axis for axis, size in enumerate(shape) if size > 1]
    if real and all(shape[axis] == 1 for axis in chosen):
        return int(rng.choice(real))
    return axes


def comparison_threshold(rng: np.random.Generator, array: np.ndarray) -> float:
    """A float32 threshold at least COMPARISON_MARGIN away from every element, inside the range if possible."""
    values = np.unique(array.astype(np.float64))
    middles = (values[:-1] + values[1:]) / 2
    wide = middles[(values[1:] - values[:-1]) > 4 * COMPARISON_MARGIN]
    if len(wide):
        threshold = float(rng.choice(wide))
    else:
        threshold = float(values[-1] + 0.5 if rng.random() < 0.5 else values[0] - 0.5)
    return float(np.float32(threshold))


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy's broadcast of the shapes, or None when they do not broadcast or the result is too big."""
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        return None
    return shape if len(shape) <= MAX_DIMS and math.prod(shape) <= MAX_ELEMENTS else None


def partner(program: Program, value: Value) -> Value:
    """A second operand that broadcasts with ``value``: an earlier value or a new (maybe size-1-dim) leaf."""
    rng = program.rng
    candidates = [other for other in program.values if broadcast_shape(other.shape, value.shape) is not None]
    if candidates and rng.random() < 0.5:
        return candidates[int(rng.integers(len(candidates)))]
    shape = [1 if rng.random() < 0.3 else size for size in value.shape]
    drop = int(rng.integers(len(shape) + 1)) if rng.random() < 0.2 else 0
    return program.add_input(tuple(shape[drop:]))


# ---------------------------------------------------------------------------------------------------------
# elementwise ops


def op_neg(program: Program, x: Value) -> Value:
    """``-x``."""
    return program.apply(f"-{x.name}", -x.tensor, -x.array)


def op_relu(program: Program, x: Value) -> Value:
    """``x.relu()``."""
    return program.apply(f"{x.name}.relu()", x.tensor.relu(), np.maximum(x.array, np.float32(0)))


def op_exp(program: Program, x: Value) -> Value:
    """``exp`` of ``x`` clipped to [-3, 3], so it stays small."""
    return program.apply(f"{x.name}.clip(-3, 3).exp()", x.tensor.clip(-3, 3).exp(), np.exp(np.clip(x.array, -3, 3)))


def op_sin(program: Program, x: Value) -> Value:
    """``x.sin()`` (values stay within +-VALUE_LIMIT, where float32 sin is accurate)."""
    return program.apply(f"{x.name}.sin()", x.tensor.sin(), np.sin(x.array))


def op_sqrt(program: Program, x: Value) -> Value:
    """``sqrt(x*x + 0.25)``: a square root of a positive value."""
    code = f"({x.name} * {x.name} + 0.25).sqrt()"
    return program.apply(code, (x.tensor * x.tensor + 0.25).sqrt(), np.sqrt(x.array * x.array + np.float32(0.25)))


def op_reciprocal(program: Program, x: Value) -> Value:
    """``1 / (x*x + 1)``: a division by a value of at least 1."""
    code = f"1 / ({x.name} * {x.name} + 1)"
    return program.apply(code, 1 / (x.tensor * x.tensor + 1), np.float32(1) / (x.array * x.array + np.float32(1)))


def op_scalar(program: Program, x: Value) -> Value:
    """``x`` combined with a Python scalar: ``x + c``, ``x * c``, ``c - x`` or ``x.maximum(c)``."""
    scalar = float(program.rng.choice(SCALARS))
    kind = int(program.rng.integers(4))
    if kind == 0:
        return program.apply(f"{x.name} + {scalar!r}", x.tensor + scalar, x.array + np.float32(scalar))
    if kind == 1:
        return program.apply(f"{x.name} * {scalar!r}", x.tensor * scalar, x.array * np.float32(scalar))
    if kind == 2:
        return program.apply(f"{scalar!r} - {x.name}", scalar - x.tensor, np.float32(scalar) - x.array)
    return program.apply(f"{x.name}.maximum({scalar!r})", x.tensor.maximum(scalar), np.maximum(x.array, scalar))


BINARY_OPS: dict[str, tuple[str, Callable, Callable]] = {
    # name: (lazygrad code template, lazygrad function, NumPy function)
    "add": ("{0} + {1}", lambda left, right: left + right, np.add),
    "sub": ("{0} - {1}", lambda left, right: left - right, np.subtract),
    "mul": ("{0} * {1}", lambda left, right: left * right, np.multiply),
    "maximum": ("{0}.maximum({1})", lambda left, right: left.maximum(right), np.maximum),
}


def op_binary(program: Program, x: Value, y: Value | None = None) -> Value:
    """Add, sub, mul or maximum of ``x`` and ``y``, by default a broadcastable partner (``x`` itself now and then),
    in either order."""
    if y is None:
        y = x if program.rng.random() < 0.1 else partner(program, x)
    left, right = (x, y) if program.rng.random() < 0.7 else (y, x)
    template, tensor_function, numpy_function = BINARY_OPS[str(program.rng.choice(list(BINARY_OPS)))]
    code = template.format(left.name, right.name)
    return program.apply(code, tensor_function(left.tensor, right.tensor), numpy_function(left.array, right.array))


def op_where(program: Program, x: Value) -> Value:
    """``(x > threshold).where(a, b)``, or ``(x < y).where(...)`` when no element pair is close to a tie."""
    rng = program.rng
    y = partner(program, x)
    if (
        broadcast_shape(x.shape, y.shape) == x.shape
        and np.abs(x.array - y.array).min() > COMPARISON_MARGIN
        and rng.random() < 0.5
    ):
        condition_code, condition, mask = f"({x.name} < {y.name})", x.tensor < y.tensor, x.array < y.array
    else:
        threshold = comparison_threshold(rng, x.array)
        condition_code, condition = f"({x.name} > {threshold!r})", x.tensor > threshold
        mask = x.array > np.float32(threshold)
    if rng.random() < 0.5:
        scalar = float(rng.choice(SCALARS))
        code = f"{condition_code}.where({y.name}, {scalar!r})"
        return program.apply(code, condition.where(y.tensor, scalar), np.where(mask, y.array, np.float32(scalar)))
    code = f"{condition_code}.where({x.name}, {y.name})"
    return program.apply(code, condition.where(x.tensor, y.tensor), np.where(mask, x.array, y.array))


# ---------------------------------------------------------------------------------------------------------
# reductions


def reduce_value(program: Program, x: Value, kind: str, axis, keepdim: bool) -> Value:
    """``x.sum(...)`` or ``x.max(...)`` on both sides."""
    code = f"{x.name}.{kind}(axis={axis!r}, keepdim={keepdim})"
    tensor = getattr(x.tensor, kind)(axis=axis, keepdim=keepdim)
    array = getattr(x.array, kind)(axis=axis, keepdims=keepdim)
    return program.apply(code, tensor, np.asarray(array, dtype=np.float32))


def op_reduce(program: Program, x: Value) -> Value:
    """A sum or max over random axes, with or without keepdim."""
    rng = program.rng
    if x.array.ndim == 0:
        return op_scalar(program, x)
    kind = "sum" if rng.random() < 0.6 else "max"
    return reduce_value(program, x, kind, random_axes(rng, x.array.ndim), bool(rng.random() < 0.5))


# ---------------------------------------------------------------------------------------------------------
# movement ops


def reshape_to(program: Program, x: Value, shape: tuple[int, ...]) -> Value:
    """``x.reshape(shape)``."""
    return program.apply(f"{x.name}.reshape({shape!r})", x.tensor.reshape(shape), x.array.reshape(shape))


def op_reshape(program: Program, x: Value) -> Value:
    """Reshape to a random factorization of the size."""
    return reshape_to(program, x, random_factorization(program.rng, x.array.size))


def op_permute(program: Program, x: Value) -> Value:
    """A random permutation of the dims (a reshape for fewer than two dims)."""
    ndim = x.array.ndim
    if ndim < 2:
        return op_reshape(program, x)
    order = tuple(int(axis) for axis in program.rng.permutation(ndim))
    return program.apply(f"{x.name}.permute({order!r})", x.tensor.permute(order), np.transpose(x.array, order))


def with_size_one_dim(program: Program, x: Value) -> Value:
    """``x`` itself if it has a dim of size 1 (and fewer than 4 dims), else ``x`` reshaped with one inserted."""
    if 1 in x.shape:
        return x
    if x.array.ndim >= MAX_DIMS:
        return reshape_to(program, x, (*x.shape[:-2], x.shape[-2] * x.shape[-1], 1))
    position = int(program.rng.integers(x.array.ndim + 1))
    return reshape_to(program, x, (*x.shape[:position], 1, *x.shape[position:]))


def op_expand(program: Program, x: Value) -> Value:
    """Expand some size-1 dims (inserting one first when there is none) to sizes 2..4."""
    x = with_size_one_dim(program, x)
    shape = list(x.shape)
    ones = [axis for axis, size in enumerate(shape) if size == 1]
    for axis in program.rng.permutation(ones):
        size = int(program.rng.integers(2, 5))
        if math.prod(shape) * size <= MAX_ELEMENTS:
            shape[int(axis)] = size
    shape = tuple(shape)
    if shape == x.shape:
        return op_scalar(program, x)
    return program.apply(f"{x.name}.expand({shape!r})", x.tensor.expand(shape), np.broadcast_to(x.array, shape))


def pad_value(program: Program, x: Value, padding: list[tuple[int, int]], nonzero: float = 0.35) -> Value:
    """``x.pad(padding)``: pairs per dim (a negative amount crops), written as pairs or, now and then, torch-style
    flat from the last dim; the fill value is zero or, with probability ``nonzero``, a non-zero scalar."""
    rng = program.rng
    value = float(rng.choice(SCALARS)) if rng.random() < nonzero else 0.0
    shape = [size + before + after for size, (before, after) in zip(x.shape, padding, strict=True)]
    if min(shape) < 1 or math.prod(shape) > MAX_ELEMENTS or all(pair == (0, 0) for pair in padding):
        return op_flip(program, x)
    cropped = x.array[
        tuple(slice(max(0, -before), size - max(0, -after)) for size, (before, after) in zip(x.shape, padding))
    ]
    widths = [(max(0, before), max(0, after)) for before, after in padding]
    array = np.pad(cropped, widths, constant_values=np.float32(value))
    padded = tuple(padding)
    if rng.random() < 0.3:  # torch-style: (last_before, last_after, second_last_before, ...) over the last dims
        used = max([0] + [len(padding) - axis for axis, pair in enumerate(padding) if pair != (0, 0)])
        padded = tuple(amount for pair in padding[::-1][:used] for amount in pair)
    fill = f", value={value!r}" if value else ""
    return program.apply(f"{x.name}.pad({padded!r}{fill})", x.tensor.pad(padded, value=value), array)


def op_pad(program: Program, x: Value) -> Value:
    """Pad 0..3 elements before and after each dim (independently, so mostly asymmetric), sometimes cropping one
    side of a dim instead."""
    if x.array.ndim == 0:
        return op_reshape(program, x)
    rng = program.rng
    padding = []
    for size in x.shape:
        before, after = (int(amount) for amount in rng.integers(0, 4, size=2))
        if size > 1 and rng.random() < 0.15:
            crop = -int(rng.integers(1, size))
            before, after = (crop, after) if rng.random() < 0.5 else (before, crop)
        padding.append((before, after))
    return pad_value(program, x, padding)


def op_shrink(program: Program, x: Value) -> Value:
    """A random non-empty box of ``x``."""
    if x.array.ndim == 0 or x.array.size == 1:
        return op_reshape(program, x)
    rng = program.rng
    bounds = []
    for size in x.shape:
        start = int(rng.integers(size))
        bounds.append((start, int(rng.integers(start + 1, size + 1))))
    bounds = tuple(bounds)
    index = tuple(slice(start, end) for start, end in bounds)
    return program.apply(f"{x.name}.shrink({bounds!r})", x.tensor.shrink(bounds), x.array[index])


def op_flip(program: Program, x: Value) -> Value:
    """Flip one or several axes."""
    if x.array.ndim == 0:
        return op_reshape(program, x)
    axis = random_axes(program.rng, x.array.ndim)
    if axis is None:
        axis = tuple(range(x.array.ndim))
    return program.apply(f"{x.name}.flip({axis!r})", x.tensor.flip(axis), np.flip(x.array, axis))


def slice_text(part: slice) -> str:
    """``part`` written as it would be in an index expression, e.g. ``1:5:2``."""
    text = ":".join("" if bound is None else str(bound) for bound in (part.start, part.stop, part.step))
    return text.removesuffix(":")


def op_slice(program: Program, x: Value) -> Value:
    """Basic slicing with random starts, stops and (also negative) steps, never empty."""
    if x.array.ndim == 0:
        return op_reshape(program, x)
    rng = program.rng
    parts = []
    for size in x.shape[: int(rng.integers(1, x.array.ndim + 1))]:
        while True:
            step = int(rng.choice([1, 1, 2, 3, -1, -2]))
            start = None if rng.random() < 0.4 else int(rng.integers(-size, size))
            stop = None if rng.random() < 0.4 else int(rng.integers(-size - 1, size + 1))
            part = slice(start, stop, None if step == 1 and rng.random() < 0.5 else step)
            if len(range(*part.indices(size))):
                break
        parts.append(part)
    index = tuple(parts)
    code = f"{x.name}[{', '.join(slice_text(part) for part in parts)}]"
    return program.apply(code, x.tensor[index], x.array[index])


def op_realize(program: Program, x: Value) -> Value:
    """Realize a value in the middle of the graph; later ops then start from its buffer."""
    program.lines.append(f"{x.name}.realize()")
    x.tensor.realize()
    return x


OPS: list[tuple[Callable[[Program, Value], Value], float]] = [
    (op_neg, 0.5),
    (op_relu, 1.0),
    (op_exp, 1.0),
    (op_sin, 0.5),
    (op_sqrt, 0.5),
    (op_reciprocal, 0.5),
    (op_scalar, 1.0),
    (op_binary, 3.0),
    (op_where, 1.5),
    (op_reduce, 2.5),
    (op_reshape, 1.0),
    (op_permute, 1.0),
    (op_expand, 1.0),
    (op_pad, 1.5),
    (op_shrink, 1.0),
    (op_flip, 0.7),
    (op_slice, 1.0),
    (op_realize, 0.3),
]
OP_WEIGHTS = np.array([weight for _, weight in OPS]) / sum(weight for _, weight in OPS)


def random_op(program: Program, x: Value) -> Value:
    """Apply one random op to ``x``; binary ops may also pick up an earlier value, which makes the graph a DAG."""
    operation = OPS[int(program.rng.choice(len(OPS), p=OP_WEIGHTS))][0]
    return operation(program, x)
