"""Random-graph fuzzer: build the same random tensor program in lazygrad and NumPy and compare the results.

One seed fixes everything: the leaves (NumPy arrays, ``Tensor.rand``/``randn`` and ``Tensor.arange``, with random
shapes) and a short sequence (about 3 to 8 ops) of elementwise ops (add, sub, mul, maximum, neg, relu, exp and sin
of bounded values, sqrt, reciprocal, ``where`` with a comparison), reductions (sum and max over random axes, with
and without keepdim) and movement ops (reshape, permute, expand of size-1 dims, pad with asymmetric, cropping and
non-zero-valued pads, shrink, flip, slicing with steps); extra/fuzz_ops.py defines them. Every seed also gets one of
these motifs, in turn, which are hard for a scheduler or code generator to get right:

- a reduce followed by elementwise ops that broadcast it back;
- a reduce of an expanded tensor;
- two reduces in a chain;
- a select on loaded values combined with a second array, read as rows of 1 to 4 elements through a pad of every
  dim: codegen repeats the small row loop in registers, and the outer pad gates every copy's loads (every fourth
  seed, since the kernels it stands for are the narrowest class);
- a matrix product with a new array, 2-D or batched, either operand possibly transposed (register blocks);
- a 2-D convolution with a new weight: kernel sides up to 3, stride, padding, dilation and groups.

The lazygrad side stays lazy until the end (apart from an occasional ``realize()`` in the middle);
then the final value and often one intermediate value (sometimes realized together in one schedule) are
compared with ``np.allclose``. The device is the one selected as always (``CPU=1``, ``GPU=1``, ...).

Use ``run_seed(seed)`` from tests, or run many seeds from the command line::

    python extra/fuzz.py --seeds 10000 --start 0
    python extra/fuzz.py --show 1234     # print a runnable reproducer for one seed
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_ops import (
    Program,
    Value,
    array_leaf,
    op_binary,
    op_exp,
    op_expand,
    op_realize,
    op_reduce,
    op_relu,
    op_scalar,
    op_where,
    pad_value,
    random_factorization,
    random_op,
    random_real_axes,
    random_shape,
    reduce_value,
    reshape_to,
    with_size_one_dim,
)

RTOL = 1e-3
ATOL = 1e-3


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


def motif_padded_rows(program: Program, x: Value) -> Value:
    """Rows of 1 to 4 elements padded on every dim: a select on loaded values (relu or where), a binary op with a
    second operand (mostly a fresh array of the same shape), a reshape to (rows, width) and a pad, the rows' own pad
    often small enough that codegen repeats the row loop in registers, with each copy's loads gated by the outer
    pad; often realized on its own, so that is the whole kernel."""
    rng = program.rng
    if rng.random() < 0.85:  # fresh arrays, read contiguously
        width = int(rng.choice([1, 2, 2, 2, 2, 3, 4]))
        x = program.add_input(random_factorization(rng, width * int(rng.integers(2, 41))), array_leaf)
    x = op_relu(program, x) if rng.random() < 0.7 else op_where(program, x)
    x = op_binary(program, x, program.add_input(x.shape, array_leaf) if rng.random() < 0.85 else None)
    if rng.random() < 0.3:
        x = op_binary(program, x, x)
    size = x.array.size
    widths = [width for width in (2, 3, 4) if size % width == 0] or [1]
    width = 2 if 2 in widths and rng.random() < 0.7 else int(rng.choice(widths))
    rows = (size // width,)
    if rows[0] % 2 == 0 and rows[0] > 2 and rng.random() < 0.3:
        rows = (2, rows[0] // 2)
    x = reshape_to(program, x, (*rows, width))
    padding = [(int(rng.integers(0, 4)), int(rng.integers(0, 4))) for _ in rows]
    if all(pair == (0, 0) for pair in padding):
        padding[-1] = (int(rng.integers(1, 4)), 0)
    padding.append((int(rng.choice([0, 1, 1, 2])), int(rng.choice([0, 0, 1, 2]))))
    padded = pad_value(program, x, padding, nonzero=0.2)
    return op_realize(program, padded) if rng.random() < 0.6 else padded


def motif_product(program: Program, x: Value) -> Value:
    """A matrix product of the value with a new array: 2-D or with a batch axis (the second operand batched too, or
    broadcast), either operand possibly read transposed (x @ wᵀ, attention's products), inner length up to 64 —
    the register-blocked kernels of matrix products."""
    rng = program.rng
    size = x.array.size
    inner = int(rng.choice([d for d in range(1, min(size, 64) + 1) if size % d == 0]))
    rows = size // inner
    batch = int(rng.choice([d for d in range(1, min(rows, 4) + 1) if rows % d == 0])) if rng.random() < 0.4 else 1
    lead = (batch,) if batch > 1 else ()
    if rng.random() < 0.3:  # the left operand stored inner-major
        x = reshape_to(program, x, (*lead, inner, rows // batch))
        x = program.apply(f"{x.name}.transpose(-1, -2)", x.tensor.transpose(-1, -2), np.swapaxes(x.array, -1, -2))
    else:
        x = reshape_to(program, x, (*lead, rows // batch, inner))
    columns = int(rng.integers(1, 25))
    weight_lead = lead if lead and rng.random() < 0.5 else ()
    if rng.random() < 0.4:  # the right operand stored column-major (x @ wᵀ)
        w = program.add_input((*weight_lead, columns, inner))
        w = program.apply(f"{w.name}.transpose(-1, -2)", w.tensor.transpose(-1, -2), np.swapaxes(w.array, -1, -2))
    else:
        w = program.add_input((*weight_lead, inner, columns))
    product = np.matmul(x.array.astype(np.float64), w.array.astype(np.float64)).astype(np.float32)
    return program.apply(f"{x.name} @ {w.name}", x.tensor @ w.tensor, product)


def motif_convolution(program: Program, x: Value) -> Value:
    """A 2-D convolution of the value, as (batch, channels, height, width), with a new weight: kernel sides 1 to 3,
    stride 1 or 2, padding 0 to 2, dilation 1 or 2, sometimes in groups — the forward kernels of a CNN."""
    rng = program.rng
    size = x.array.size
    channels = int(rng.choice([d for d in (1, 2, 3, 4, 6) if size % d == 0]))
    batch = 2 if (size // channels) % 2 == 0 and size // channels >= 8 and rng.random() < 0.4 else 1
    height, width = random_two_dims(rng, size // channels // batch)
    x = reshape_to(program, x, (batch, channels, height, width))
    groups = channels if channels > 1 and rng.random() < 0.25 else 1
    out_channels = groups * int(rng.integers(1, 4))
    dilation = 2 if rng.random() < 0.2 else 1
    padding = int(rng.integers(0, 3))
    sides = [int(rng.integers(1, 4)) for _ in range(2)]
    # a kernel side fits in its padded image
    sides = [min(side, (extent + 2 * padding - 1) // dilation + 1) for side, extent in zip(sides, (height, width))]
    stride = int(rng.choice([1, 1, 2]))
    w = program.add_input((out_channels, channels // groups, *sides))
    padded = np.pad(x.array.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    spans = [dilation * (side - 1) + 1 for side in sides]
    windows = np.lib.stride_tricks.sliding_window_view(padded, spans, axis=(2, 3))[..., ::dilation, ::dilation]
    windows = windows[:, :, ::stride, ::stride]  # (batch, channels, rows, columns, kh, kw)
    by_group = windows.reshape(batch, groups, channels // groups, *windows.shape[2:])
    weights = w.array.astype(np.float64).reshape(groups, out_channels // groups, channels // groups, *sides)
    result = np.einsum("ngcyxhw,gochw->ngoyx", by_group, weights).reshape(batch, out_channels, *windows.shape[2:4])
    code = f"{x.name}.conv2d({w.name}, groups={groups}, stride={stride}, dilation={dilation}, padding={padding})"
    tensor = x.tensor.conv2d(w.tensor, groups=groups, stride=stride, dilation=dilation, padding=padding)
    return program.apply(code, tensor, result.astype(np.float32))


def random_two_dims(rng: np.random.Generator, size: int) -> tuple[int, ...]:
    """A two-dim shape with ``size`` elements (``(size, 1)`` when size is prime)."""
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    first = int(rng.choice(divisors))
    return (first, size // first)


# seeds take the motifs in turn; the padded rows come twice
MOTIFS: list[Callable[[Program, Value], Value] | None] = [
    None,
    motif_padded_rows,
    motif_reduce_then_elementwise,
    motif_reduce_of_expanded,
    motif_padded_rows,
    motif_reduce_chain,
    motif_product,
    motif_convolution,
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
    intermediate = [value for value in program.values[:-1] if value.name not in program.leaves]
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
