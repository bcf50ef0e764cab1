"""Random-graph fuzzer: build the same random tensor program in lazygrad and NumPy and compare the results.

One seed fixes everything: the input shapes and values and a short sequence (about 3 to 8 ops) of
elementwise ops (add, sub, mul, maximum, neg, relu, exp and sin of bounded values, sqrt, reciprocal,
``where`` with a comparison), reductions (sum and max over random axes, with and without keepdim) and
movement ops (reshape, permute, expand of size-1 dims, pad, shrink, flip, slicing with steps). Every
seed also gets one of three motifs that are hard for a scheduler to fuse correctly, in turn:
a reduce followed by elementwise ops that broadcast it back, a reduce of an expanded tensor, and two
reduces in a chain.

The lazygrad side stays lazy until the end (apart from an occasional ``realize()`` in the middle);
then the final value and often one intermediate value (sometimes realized together in one schedule) are
compared with ``np.allclose``. Values are kept
small (rescaled by a power of two when they grow) and comparisons keep a margin from every element,
so float32 rounding differences never flip a branch.

Use ``run_seed(seed)`` from tests, or run many seeds from the command line::

    python extra/fuzz.py --seeds 10000 --start 0
    python extra/fuzz.py --show 1234     # print a runnable reproducer for one seed
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
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
RTOL = 1e-3
ATOL = 1e-3
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
    """A program under construction: every value so far, the lines that built them and the inputs."""

    seed: int
    rng: np.random.Generator
    values: list[Value] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    motif: str = "none"

    def add_input(self, shape: tuple[int, ...]) -> Value:
        """A new random float32 input of the given shape."""
        array = self.rng.standard_normal(shape).astype(np.float32)
        name = f"v{len(self.values)}"
        self.inputs[name] = array
        self.lines.append(f"{name} = Tensor(inputs[{name!r}])  # shape {shape}")
        return self._keep(Value(name, Tensor(array), array))

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
        """A standalone script that rebuilds the program and prints every non-input value beside NumPy's."""
        parts = ["import numpy as np", "from lazygrad import Tensor", "", "inputs = {"]
        parts += [
            f"    {name!r}: np.array({array.tolist()!r}, dtype=np.float32)," for name, array in self.inputs.items()
        ]
        parts += ["}", *self.lines, ""]
        for value in self.values:
            if value.name not in self.inputs:
                parts.append(f"print({value.name!r}, {value.name}.numpy().tolist())")
                parts.append(f"#   numpy: {value.array.tolist()}")
        return "\n".join(parts)


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
    """A second operand that broadcasts with ``value``: an earlier value or a new (maybe size-1-dim) input."""
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


def op_binary(program: Program, x: Value) -> Value:
    """Add, sub, mul or maximum of ``x`` and a broadcastable partner, in either order."""
    y = partner(program, x)
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


def op_pad(program: Program, x: Value) -> Value:
    """Zero padding of 0..2 elements on each side of every dim."""
    if x.array.ndim == 0:
        return op_reshape(program, x)
    rng = program.rng
    padding = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in x.shape)
    padded = math.prod(size + before + after for size, (before, after) in zip(x.shape, padding, strict=True))
    if padded > MAX_ELEMENTS or padded == x.array.size:
        return op_flip(program, x)
    return program.apply(f"{x.name}.pad({padding!r})", x.tensor.pad(padding), np.pad(x.array, padding))


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
    (op_pad, 1.0),
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


# ---------------------------------------------------------------------------------------------------------
# motifs: patterns every scheduler must fuse (or split) correctly


def motif_reduce_then_elementwise(program: Program, x: Value) -> Value:
    """A reduce whose result feeds elementwise ops, usually broadcast back against its own input."""
    rng = program.rng
    if x.array.ndim == 0:
        x = reshape_to(program, x, (1,))
    kind = "max" if rng.random() < 0.5 else "sum"
    if rng.random() < 0.7:
        reduced = reduce_value(program, x, kind, random_real_axes(rng, x.shape), True)
        centered = program.apply(f"{x.name} - {reduced.name}", x.tensor - reduced.tensor, x.array - reduced.array)
        return op_exp(program, centered) if rng.random() < 0.5 else op_binary(program, centered)
    reduced = reduce_value(program, x, kind, random_real_axes(rng, x.shape), False)
    return op_scalar(program, op_relu(program, reduced)) if rng.random() < 0.5 else op_exp(program, reduced)


def motif_reduce_of_expanded(program: Program, x: Value) -> Value:
    """Expand a size-1 dim, then reduce over axes that include the expanded one."""
    rng = program.rng
    before = with_size_one_dim(program, x)
    expanded = op_expand(program, before)
    grown = [axis for axis, size in enumerate(expanded.shape) if before.shape[axis] == 1 and size > 1]
    if not grown or expanded.array.ndim != before.array.ndim:
        return op_reduce(program, expanded)
    axes = {int(rng.choice(grown))} | {axis for axis in range(expanded.array.ndim) if rng.random() < 0.3}
    axis = tuple(sorted(axes)) if len(axes) > 1 else axes.pop()
    kind = "sum" if rng.random() < 0.6 else "max"
    return reduce_value(program, expanded, kind, axis, bool(rng.random() < 0.5))


def motif_reduce_chain(program: Program, x: Value) -> Value:
    """Two reduces in a row over different axes (the second possibly over everything)."""
    rng = program.rng
    if x.array.ndim < 2:
        x = reshape_to(program, x, (1, x.array.size) if rng.random() < 0.3 else random_two_dims(rng, x.array.size))
    real = [axis for axis, size in enumerate(x.shape) if size > 1] or list(range(x.array.ndim))
    first_axis = int(rng.choice(real))
    keepdim = bool(rng.random() < 0.5)
    first = reduce_value(program, x, "sum" if rng.random() < 0.5 else "max", first_axis, keepdim)
    if first.array.ndim == 0:
        return reduce_value(program, first, "sum", None, False)
    second_axis = random_real_axes(rng, first.shape)
    return reduce_value(program, first, "sum" if rng.random() < 0.5 else "max", second_axis, bool(rng.random() < 0.5))


def random_two_dims(rng: np.random.Generator, size: int) -> tuple[int, ...]:
    """A two-dim shape with ``size`` elements (``(size, 1)`` when size is prime)."""
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    first = int(rng.choice(divisors))
    return (first, size // first)


MOTIFS: list[Callable[[Program, Value], Value] | None] = [
    None,
    motif_reduce_then_elementwise,
    motif_reduce_of_expanded,
    motif_reduce_chain,
]


# ---------------------------------------------------------------------------------------------------------
# running a seed


def build_program(program: Program) -> Value:
    """Generate the program for ``program.seed`` (building both sides eagerly); return its output value."""
    rng = program.rng
    motif = MOTIFS[program.seed % len(MOTIFS)]
    program.motif = "none" if motif is None else motif.__name__
    x = program.add_input(random_shape(rng))
    if motif is None:
        for _ in range(int(rng.integers(3, 9))):
            x = random_op(program, x)
    else:
        for _ in range(int(rng.integers(0, 3))):
            x = random_op(program, x)
        x = motif(program, x)
        for _ in range(int(rng.integers(1, 4))):
            x = random_op(program, x)
    return x


def new_program(seed: int) -> Program:
    """An empty program whose random choices all come from ``seed``."""
    return Program(seed, np.random.default_rng(seed))


def compare(program: Program, value: Value) -> None:
    """Realize ``value`` in lazygrad and check shape, dtype and contents against NumPy."""
    got = value.tensor.numpy()
    expected = value.array
    problem = None
    if got.shape != expected.shape:
        problem = f"shape {got.shape}, expected {expected.shape}"
    elif got.dtype != np.float32:
        problem = f"dtype {got.dtype}, expected float32"
    elif not np.allclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True):
        error = np.abs(got.astype(np.float64) - expected)
        problem = (
            f"max abs error {np.nanmax(error):.4g}\n  lazygrad: {got.ravel()[:8]}\n  numpy:    {expected.ravel()[:8]}"
        )
    if problem:
        raise AssertionError(
            f"fuzz seed {program.seed} (motif {program.motif}): {value.name} differs from NumPy: {problem}\n"
            f"program:\n{program.listing()}\nreproduce: python extra/fuzz.py --show {program.seed}"
        )


def build_and_realize(program: Program) -> list[Value]:
    """Build the program, pick the values to check and realize them; returns the values to compare."""
    output = build_program(program)
    checked = [output]
    intermediate = [value for value in program.values[:-1] if value.name not in program.inputs]
    if intermediate and program.rng.random() < 0.5:
        checked.append(intermediate[int(program.rng.integers(len(intermediate)))])
        if program.rng.random() < 0.5:  # both outputs in one schedule
            program.lines.append(f"{checked[0].name}.realize({checked[1].name})")
            checked[0].tensor.realize(checked[1].tensor)
    return checked


def run_seed(seed: int) -> None:
    """Build, run and check the program for ``seed``; raise AssertionError naming the seed and ops on failure."""
    program = new_program(seed)
    try:
        for value in build_and_realize(program):
            compare(program, value)
    except AssertionError:
        raise
    except Exception as error:
        raise AssertionError(
            f"fuzz seed {seed} (motif {program.motif}): {type(error).__name__}: {error}\n"
            f"program so far:\n{program.listing()}\nreproduce: python extra/fuzz.py --show {seed}"
        ) from error


def show(seed: int) -> None:
    """Print a runnable reproducer for ``seed`` (as far as the program could be built)."""
    program = new_program(seed)
    try:
        build_and_realize(program)
    except Exception as error:  # noqa: BLE001 -- the reproducer is most useful exactly when building fails
        program.lines.append(f"# building stopped here: {type(error).__name__}: {error}")
    print(f"# fuzz seed {seed}, motif {program.motif}\n{program.reproducer()}")


def main() -> int:
    """Run a range of seeds and print a summary of the failures; or show one seed's program."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failing seed")
    parser.add_argument("--show", type=int, metavar="SEED", help="print a runnable reproducer for SEED and exit")
    args = parser.parse_args()

    if args.show is not None:
        show(args.show)
        return 0

    failures: list[tuple[int, str]] = []
    started = time.perf_counter()
    for seed in range(args.start, args.start + args.seeds):
        try:
            run_seed(seed)
        except AssertionError as error:
            failures.append((seed, str(error)))
            print(f"FAIL seed {seed}: {str(error).splitlines()[0]}", flush=True)
            if args.stop_on_failure:
                traceback.print_exc()
                break
        done = seed - args.start + 1
        if done % 500 == 0:
            elapsed = time.perf_counter() - started
            print(f"{done} seeds, {len(failures)} failures, {elapsed:.1f} s", file=sys.stderr, flush=True)

    print(f"\n{len(failures)} of {args.seeds} seeds failed ({time.perf_counter() - started:.1f} s)")
    for _, message in failures[:5]:
        print(f"\n{message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
