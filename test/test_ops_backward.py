"""Backward of every differentiable Tensor op against PyTorch (CPU).

Each case applies an op to seeded random float32 inputs in lazygrad and in torch, backpropagates
`(out * upstream).sum()` with a fixed random `upstream` of the output's shape, and compares the output's shape and
every input's gradient. Inputs are drawn from the op's domain: positive bases for powers and logs, values away from
zero where the derivative jumps there (abs, prod, division), and distinct values for max and min (torch's `max(dim)`
picks one element of a tie while lazygrad splits it; test_gradient.py checks ties).

Sections: arithmetic, unary math and activations, reductions, movement / indexing / joining, matmul, the neural-network
functions (conv, pooling, normalization, attention, losses), and last a few fixed inputs at the edges of
an op's domain. Most ops have the same spelling in both libraries, so one function serves both; where they
differ a case gives a separate torch function.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from lazygrad import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
LOOSE = {"rtol": 1e-3, "atol": 1e-4}  # transcendental compositions (precision varies by device) and float16


@dataclass(frozen=True)
class Domain:
    """Where a case's inputs are drawn from."""

    low: float = -2.0
    high: float = 2.0
    away_from_zero: bool = False  # values within 0.25 of zero move to +-(0.25..0.5)
    distinct: bool = False  # every value of an input differs from the others by at least 0.05


ANY = Domain()
POSITIVE = Domain(0.5, 2.0)
NONZERO = Domain(away_from_zero=True)
DISTINCT = Domain(distinct=True)
SMALL = Domain(-1.0, 1.0)


def make_input(shape: tuple[int, ...], domain: Domain, rng: np.random.Generator) -> np.ndarray:
    size = int(np.prod(shape))
    if domain.distinct:
        values = rng.permutation(size) * 0.1 - size * 0.05 + rng.uniform(0, 0.05, size)
    else:
        values = rng.uniform(domain.low, domain.high, size)
    if domain.away_from_zero:
        values = np.where(np.abs(values) < 0.25, np.sign(values + 1e-9) * (0.25 + np.abs(values)), values)
    return values.reshape(shape).astype(np.float32)


def case(
    name: str, shapes, function: Callable, torch_function: Callable | None = None, domain=ANY, tolerance=None, marks=()
):
    """One parametrized case: `function` runs on lazygrad Tensors (and on torch tensors unless `torch_function`)."""
    arguments = (shapes, function, torch_function or function, domain, tolerance or TOLERANCE)
    return pytest.param(*arguments, id=name, marks=marks)


def run_backward(shapes, function, torch_function, domain: Domain, tolerance: dict, seed: int = 0) -> None:
    """Random inputs of `shapes` from `domain`, then `compare_backward`."""
    rng = np.random.default_rng(seed)
    compare_backward([make_input(shape, domain, rng) for shape in shapes], function, torch_function, tolerance, rng)


def compare_backward(arrays, function, torch_function, tolerance: dict, rng: np.random.Generator) -> None:
    """Forward values, output shape and every input's gradient of (out * upstream).sum(), lazygrad against torch."""
    lazy_inputs = [Tensor(array) for array in arrays]
    torch_inputs = [torch.tensor(array, requires_grad=True) for array in arrays]

    lazy_out = function(*lazy_inputs)
    torch_out = torch_function(*torch_inputs)
    assert tuple(lazy_out.shape) == tuple(torch_out.shape), f"shape {lazy_out.shape} != torch {torch_out.shape}"
    upstream = rng.standard_normal(tuple(torch_out.shape)).astype(np.float32)
    np.testing.assert_allclose(lazy_out.numpy(), torch_out.detach().numpy(), **tolerance, err_msg="forward")

    (lazy_out * Tensor(upstream)).sum().backward()
    (torch_out * torch.tensor(upstream)).sum().backward()
    for number, (lazy_input, torch_input) in enumerate(zip(lazy_inputs, torch_inputs)):
        expected = torch_input.grad.numpy() if torch_input.grad is not None else np.zeros(torch_input.shape)
        assert lazy_input.grad is not None, f"input {number} got no gradient"
        got = lazy_input.grad.numpy()
        assert got.shape == expected.shape, f"input {number}: grad shape {got.shape} != {expected.shape}"
        np.testing.assert_allclose(got, expected, **tolerance, err_msg=f"gradient of input {number}")


# ---------------------------------------------------------------------------------------------------------------------
# elementwise arithmetic

ARITHMETIC = [
    case("add", [(3, 4), (3, 4)], lambda x, y: x + y),
    case("add_broadcast", [(2, 3, 4), (3, 1)], lambda x, y: x + y),
    case("add_scalar", [(3, 4)], lambda x: x + 2.5),
    case("radd_scalar", [(3, 4)], lambda x: 2.5 + x),
    case("sub", [(3, 4), (3, 4)], lambda x, y: x - y),
    case("sub_broadcast", [(4,), (3, 1)], lambda x, y: x - y),
    case("rsub_scalar", [(3, 4)], lambda x: 2.0 - x),
    case("mul", [(3, 4), (3, 4)], lambda x, y: x * y),
    case("mul_broadcast", [(2, 1, 4), (3, 1)], lambda x, y: x * y),
    case("mul_scalar", [(3, 4)], lambda x: x * -1.5),
    case("mul_self", [(3, 4)], lambda x: x * x),
    case("div", [(3, 4), (3, 4)], lambda x, y: x / y, domain=NONZERO),
    case("div_broadcast", [(3, 4), (4,)], lambda x, y: x / y, domain=NONZERO),
    case("div_scalar", [(3, 4)], lambda x: x / 3.0),
    case("rdiv_scalar", [(3, 4)], lambda x: 3.0 / x, domain=NONZERO),
    case("pow_tensor", [(3, 4), (3, 4)], lambda x, y: x**y, domain=POSITIVE, tolerance=LOOSE),
    case("pow_broadcast", [(3, 4), (1, 4)], lambda x, y: x**y, domain=POSITIVE, tolerance=LOOSE),
    case("pow_2", [(3, 4)], lambda x: x**2),
    case("pow_3", [(3, 4)], lambda x: x**3),
    case("pow_0", [(3, 4)], lambda x: x**0 + x),
    case("pow_minus_2", [(3, 4)], lambda x: x**-2, domain=POSITIVE),
    case("pow_half", [(3, 4)], lambda x: x**0.5, domain=POSITIVE, tolerance=LOOSE),
    case("pow_2_5", [(3, 4)], lambda x: x**2.5, domain=POSITIVE, tolerance=LOOSE),
    case("pow_minus_1_5", [(3, 4)], lambda x: x**-1.5, domain=POSITIVE, tolerance=LOOSE),
    case("rpow_scalar", [(3, 4)], lambda x: 2.0**x, tolerance=LOOSE),
    case("neg", [(3, 4)], lambda x: -x),
    case("square", [(3, 4)], lambda x: x.square()),
    case("reciprocal", [(3, 4)], lambda x: x.reciprocal(), domain=NONZERO),
    case("maximum", [(3, 4), (3, 4)], lambda x, y: x.maximum(y)),
    case("maximum_broadcast", [(3, 4), (4,)], lambda x, y: x.maximum(y)),
    case("maximum_scalar", [(3, 4)], lambda x: x.maximum(0.3), lambda x: x.maximum(torch.tensor(0.3))),
    case("minimum", [(3, 4), (3, 4)], lambda x, y: x.minimum(y)),
    case("minimum_scalar", [(3, 4)], lambda x: x.minimum(-0.3), lambda x: x.minimum(torch.tensor(-0.3))),
    case("where", [(3, 4), (3, 4)], lambda x, y: (x > y).where(x, y * 2), lambda x, y: torch.where(x > y, x, y * 2)),
    case(
        "where_broadcast",
        [(3, 4), (4,)],
        lambda x, y: (x < 0).where(y, x),
        lambda x, y: torch.where(x < 0, y, x),
    ),
    case("where_scalar", [(3, 4)], lambda x: (x < 0.5).where(x * 3, 1.0), lambda x: torch.where(x < 0.5, x * 3, 1.0)),
]

# ---------------------------------------------------------------------------------------------------------------------
# unary math and activations

UNARY = [
    case("exp", [(3, 4)], lambda x: x.exp()),
    case("exp2", [(3, 4)], lambda x: x.exp2()),
    case("log", [(3, 4)], lambda x: x.log(), domain=POSITIVE),
    case("log2", [(3, 4)], lambda x: x.log2(), domain=POSITIVE),
    case("sqrt", [(3, 4)], lambda x: x.sqrt(), domain=POSITIVE),
    case("rsqrt", [(3, 4)], lambda x: x.rsqrt(), domain=POSITIVE),
    case("sin", [(3, 4)], lambda x: x.sin()),
    case("sin_large", [(3, 4)], lambda x: (x * 20).sin(), tolerance=LOOSE),
    case("cos", [(3, 4)], lambda x: x.cos()),
    case("tan", [(3, 4)], lambda x: x.tan(), domain=SMALL),
    case("abs", [(3, 4)], lambda x: x.abs(), domain=NONZERO),
    case("sign", [(3, 4)], lambda x: x.sign(), domain=NONZERO),
    case("relu", [(3, 4)], lambda x: x.relu(), domain=NONZERO),
    case("leaky_relu", [(3, 4)], lambda x: x.leaky_relu(), lambda x: F.leaky_relu(x, 0.01), domain=NONZERO),
    case("leaky_relu_slope", [(3, 4)], lambda x: x.leaky_relu(0.2), lambda x: F.leaky_relu(x, 0.2), domain=NONZERO),
    case("relu6", [(3, 4)], lambda x: (x * 4).relu6(), lambda x: F.relu6(x * 4), domain=NONZERO),
    case("hardtanh", [(3, 4)], lambda x: x.hardtanh(), lambda x: F.hardtanh(x), domain=NONZERO),
    case("sigmoid", [(3, 4)], lambda x: x.sigmoid()),
    case("tanh", [(3, 4)], lambda x: x.tanh()),
    case("gelu", [(3, 4)], lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh")),
    case("quick_gelu", [(3, 4)], lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(x * 1.702)),
    case("silu", [(3, 4)], lambda x: x.silu(), lambda x: F.silu(x)),
    case("swish", [(3, 4)], lambda x: x.swish(), lambda x: F.silu(x)),
    case("softplus", [(3, 4)], lambda x: x.softplus(), lambda x: F.softplus(x)),
    case("softplus_beta", [(3, 4)], lambda x: x.softplus(2.0), lambda x: F.softplus(x, beta=2.0)),
    case("elu", [(3, 4)], lambda x: x.elu(), lambda x: F.elu(x), domain=NONZERO),
    case("elu_alpha", [(3, 4)], lambda x: x.elu(0.5), lambda x: F.elu(x, alpha=0.5), domain=NONZERO),
    case("clip", [(3, 4)], lambda x: x.clip(-0.5, 0.7)),
    case("clip_min_only", [(3, 4)], lambda x: x.clip(-0.5), lambda x: x.clip(min=-0.5)),
    case("clamp", [(3, 4)], lambda x: x.clamp(None, 0.7), lambda x: x.clamp(max=0.7)),
    case("half_roundtrip", [(3, 4)], lambda x: x.half().float(), tolerance=LOOSE),
    case("cast_to_int_blocks", [(3, 4)], lambda x: x.int().float() + x * 2),
    case("contiguous", [(3, 4)], lambda x: x.T.contiguous() * 2),
]

# ---------------------------------------------------------------------------------------------------------------------
# reductions


def amax(dim=None, keepdim=False):
    return lambda x: torch.amax(x, dim if dim is not None else tuple(range(x.ndim)), keepdim=keepdim)


def amin(dim=None, keepdim=False):
    return lambda x: torch.amin(x, dim if dim is not None else tuple(range(x.ndim)), keepdim=keepdim)


REDUCE = [
    case("sum", [(3, 4)], lambda x: x.sum()),
    case("sum_axis", [(3, 4)], lambda x: x.sum(1)),
    case("sum_negative_axis_keepdim", [(2, 3, 4)], lambda x: x.sum(-2, keepdim=True)),
    case("sum_axes", [(2, 3, 4)], lambda x: x.sum((0, 2))),
    case("sum_0d", [()], lambda x: x.sum()),
    case("prod", [(2, 3)], lambda x: x.prod(), domain=NONZERO),
    case("prod_axis", [(3, 4)], lambda x: x.prod(1), domain=NONZERO),
    case("prod_axis_keepdim", [(3, 4)], lambda x: x.prod(0, keepdim=True), domain=NONZERO),
    case("max", [(3, 4)], lambda x: x.max(), amax(), domain=DISTINCT),
    case("max_axis", [(3, 4)], lambda x: x.max(1), amax(1), domain=DISTINCT),
    case("max_axes_keepdim", [(2, 3, 4)], lambda x: x.max((0, 2), keepdim=True), amax((0, 2), True), domain=DISTINCT),
    case("min", [(3, 4)], lambda x: x.min(), amin(), domain=DISTINCT),
    case("min_axis", [(3, 4)], lambda x: x.min(0), amin(0), domain=DISTINCT),
    case("min_axis_keepdim", [(2, 3, 4)], lambda x: x.min(-1, keepdim=True), amin(-1, True), domain=DISTINCT),
    case("mean", [(3, 4)], lambda x: x.mean()),
    case("mean_axis", [(3, 4)], lambda x: x.mean(0)),
    case("mean_axes_keepdim", [(2, 3, 4)], lambda x: x.mean((1, 2), keepdim=True)),
    case("var", [(3, 4)], lambda x: x.var()),
    case("var_axis", [(3, 4)], lambda x: x.var(1)),
    case("var_correction_0", [(2, 3, 4)], lambda x: x.var((0, 2), correction=0), lambda x: x.var((0, 2), correction=0)),
    case("std", [(3, 4)], lambda x: x.std()),
    case("std_axis_keepdim", [(3, 4)], lambda x: x.std(0, keepdim=True)),
    case("std_correction_0", [(3, 4)], lambda x: x.std(1, correction=0)),
    case("softmax", [(3, 4)], lambda x: x.softmax(), lambda x: x.softmax(-1)),
    case("softmax_axis_0", [(3, 4)], lambda x: x.softmax(0)),
    case("softmax_3d", [(2, 3, 4)], lambda x: (x * 3).softmax(1)),
    case("log_softmax", [(3, 4)], lambda x: x.log_softmax(), lambda x: x.log_softmax(-1)),
    case("log_softmax_axis_0", [(3, 4)], lambda x: x.log_softmax(0)),
    case("logsumexp", [(3, 4)], lambda x: x.logsumexp(), lambda x: x.logsumexp((0, 1))),
    case("logsumexp_axis", [(3, 4)], lambda x: x.logsumexp(1)),
    case("logsumexp_axis_keepdim", [(2, 3, 4)], lambda x: x.logsumexp(0, keepdim=True)),
    case("cumsum", [(3, 4)], lambda x: x.cumsum(1)),
    case("cumsum_axis_0", [(3, 4)], lambda x: x.cumsum(0)),
]

# ---------------------------------------------------------------------------------------------------------------------
# movement, indexing and joining

MOVEMENT = [
    case("reshape", [(3, 4)], lambda x: x.reshape(2, 6)),
    case("reshape_infer", [(3, 4)], lambda x: x.reshape(-1, 2)),
    case("reshape_to_0d", [(1, 1)], lambda x: x.reshape(())),
    case("view", [(2, 3, 4)], lambda x: x.view(6, 4)),
    case("permute", [(2, 3, 4)], lambda x: x.permute(2, 0, 1)),
    case("transpose", [(2, 3, 4)], lambda x: x.transpose(0, 2)),
    case("transpose_negative", [(2, 3, 4)], lambda x: x.transpose(-1, -2)),
    case("T", [(3, 4)], lambda x: x.T),
    case("flatten", [(2, 3, 4)], lambda x: x.flatten()),
    case("flatten_range", [(2, 3, 4, 2)], lambda x: x.flatten(1, 2)),
    case("unflatten", [(2, 12)], lambda x: x.unflatten(1, (3, 4))),
    case("squeeze", [(3, 1, 4, 1)], lambda x: x.squeeze()),
    case("squeeze_dim", [(3, 1, 4)], lambda x: x.squeeze(1)),
    case("unsqueeze", [(3, 4)], lambda x: x.unsqueeze(1)),
    case("unsqueeze_negative", [(3, 4)], lambda x: x.unsqueeze(-1)),
    case("expand", [(3, 1)], lambda x: x.expand(3, 4)),
    case("expand_new_axis", [(1, 4)], lambda x: x.expand(2, 3, 4)),
    case("pad_pairs", [(3, 4)], lambda x: x.pad(((1, 2), (0, 1))), lambda x: F.pad(x, (0, 1, 1, 2))),
    case("pad_flat", [(2, 3, 4)], lambda x: x.pad((1, 1, 2, 0)), lambda x: F.pad(x, (1, 1, 2, 0))),
    case("pad_value", [(3, 4)], lambda x: x.pad((2, 1, 1, 1), value=1.5), lambda x: F.pad(x, (2, 1, 1, 1), value=1.5)),
    case("pad_negative", [(3, 4)], lambda x: x.pad((-1, 2, 1, -1)), lambda x: F.pad(x, (-1, 2, 1, -1))),
    case("pad_none", [(3, 4)], lambda x: x.pad((None, (1, 1))), lambda x: F.pad(x, (1, 1))),
    case("shrink", [(3, 4)], lambda x: x.shrink(((1, 3), (0, 2))), lambda x: x[1:3, 0:2]),
    case("shrink_none", [(3, 4)], lambda x: x.shrink((None, (1, 4))), lambda x: x[:, 1:4]),
    case("flip", [(3, 4)], lambda x: x.flip(0)),
    case("flip_axes", [(2, 3, 4)], lambda x: x.flip((0, 2))),
    case("flip_negative_axis", [(3, 4)], lambda x: x.flip(-1), lambda x: x.flip(1)),
    case("repeat", [(2, 3)], lambda x: x.repeat(2, 1)),
    case("repeat_new_axes", [(2, 3)], lambda x: x.repeat(2, 3, 2)),
    case("cat", [(2, 3), (4, 3)], lambda x, y: x.cat(y), lambda x, y: torch.cat((x, y))),
    case(
        "cat_dim_1_three",
        [(2, 3), (2, 1), (2, 2)],
        lambda x, y, z: Tensor.cat(x, y, z, dim=1),
        lambda x, y, z: torch.cat((x, y, z), 1),
    ),
    case("cat_negative_dim", [(2, 3), (2, 2)], lambda x, y: x.cat(y, dim=-1), lambda x, y: torch.cat((x, y), -1)),
    case("stack", [(2, 3), (2, 3)], lambda x, y: x.stack(y), lambda x, y: torch.stack((x, y))),
    case(
        "stack_dim_last",
        [(2, 3), (2, 3), (2, 3)],
        lambda x, y, z: Tensor.stack(x, y, z, dim=-1),
        lambda x, y, z: torch.stack((x, y, z), -1),
    ),
    case("split", [(5, 3)], lambda x: sum((p * (i + 1)).sum() for i, p in enumerate(x.split(2)))),
    case("split_sizes", [(2, 6)], lambda x: sum((p * (i + 1)).sum() for i, p in enumerate(x.split([1, 3, 2], 1)))),
    case("split_piece", [(5, 3)], lambda x: x.split([2, 3])[1]),
    case("chunk", [(7, 2)], lambda x: sum((p * (i + 1)).sum() for i, p in enumerate(x.chunk(3)))),
    case("chunk_dim_1", [(2, 6)], lambda x: x.chunk(2, 1)[1] * 2 + x.chunk(2, 1)[0]),
]


GETITEM = [
    case("int", [(3, 4)], lambda x: x[1]),
    case("negative_int", [(3, 4)], lambda x: x[-1]),
    case("two_ints", [(3, 4)], lambda x: x[2, -2]),
    case("slice", [(3, 4)], lambda x: x[:, 1:3]),
    case("slice_negative_bounds", [(5, 4)], lambda x: x[1:-1, -3:]),
    case("slice_step", [(5, 6)], lambda x: x[::2, 1::3]),
    case("slice_step_uneven", [(7, 5)], lambda x: x[1:6:2, ::4]),
    # torch has no negative slice steps: its versions flip instead
    case("negative_step", [(5, 4)], lambda x: x[::-1], lambda x: x.flip(0)),
    case("negative_step_2", [(5, 4)], lambda x: x[::-2], lambda x: x.flip(0)[::2]),
    case("negative_step_bounds", [(5, 4)], lambda x: x[3:0:-1, ::-3], lambda x: x[1:4].flip(0).flip(1)[:, ::3]),
    case("none", [(3, 4)], lambda x: x[None]),
    case("none_middle", [(3, 4)], lambda x: x[:, None, 1:]),
    case("ellipsis", [(2, 3, 4)], lambda x: x[..., 1]),
    case("ellipsis_none", [(2, 3, 4)], lambda x: x[0, ..., None, ::2]),
    case("int_slice_none_ellipsis", [(2, 3, 4, 2)], lambda x: x[-1, None, ..., 1:, 0]),
]

# ---------------------------------------------------------------------------------------------------------------------
# matrix multiplication

MATMUL = [
    case("matmul_2d", [(3, 4), (4, 5)], lambda x, y: x @ y),
    case("matmul_batched", [(2, 3, 4), (2, 4, 5)], lambda x, y: x @ y),
    case("matmul_broadcast_left", [(3, 4), (2, 4, 5)], lambda x, y: x @ y),
    case("matmul_broadcast_batch", [(2, 1, 3, 4), (3, 4, 2)], lambda x, y: x @ y),
    case("matmul_vector_matrix", [(4,), (4, 5)], lambda x, y: x @ y),
    case("matmul_matrix_vector", [(3, 4), (4,)], lambda x, y: x @ y),
    case("matmul_vector_vector", [(4,), (4,)], lambda x, y: x @ y),
    case("matmul_batched_vector", [(2, 3, 4), (4,)], lambda x, y: x.matmul(y)),
    case("matmul_same_input", [(4, 4)], lambda x: x @ x),
    case("dot", [(3, 4), (4, 2)], lambda x, y: x.dot(y), lambda x, y: x @ y),
    case("linear_layer", [(2, 4), (3, 4), (3,)], lambda x, w, b: (x @ w.T + b).relu()),
]


# ---------------------------------------------------------------------------------------------------------------------
# neural-network functions

LABELS = np.array([2, 0, 3], dtype=np.int32)
LABELS_IGNORED = np.array([1, -100, 3], dtype=np.int32)
TARGETS = np.array([[0.1, 0.9, 0.5, 0.0], [1.0, 0.3, 0.7, 0.2], [0.6, 0.4, 0.0, 1.0]], dtype=np.float32)


def labels(values: np.ndarray):
    """The same labels for both libraries: lazygrad int32, torch int64."""
    return Tensor(values), torch.tensor(values.astype(np.int64))


def torch_batchnorm(x, weight, bias, mean, invstd):
    shape = (1, -1, 1, 1)
    return (x - mean.reshape(shape)) * invstd.reshape(shape) * weight.reshape(shape) + bias.reshape(shape)


def torch_cross_entropy_probabilities(x):
    return F.cross_entropy(x, torch.tensor(TARGETS).softmax(-1))


NN = [
    case("conv2d", [(2, 2, 5, 5), (3, 2, 3, 3)], lambda x, w: x.conv2d(w), lambda x, w: F.conv2d(x, w)),
    case(
        "conv2d_bias_stride_padding",
        [(2, 2, 5, 5), (3, 2, 3, 3), (3,)],
        lambda x, w, b: x.conv2d(w, b, stride=2, padding=1),
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
    ),
    case(
        "conv2d_dilation_rectangular",
        [(1, 2, 6, 5), (2, 2, 2, 3)],
        lambda x, w: x.conv2d(w, dilation=2, padding=(1, 0)),
        lambda x, w: F.conv2d(x, w, dilation=2, padding=(1, 0)),
    ),
    case(
        "conv2d_groups",
        [(1, 4, 4, 4), (6, 2, 3, 3)],
        lambda x, w: x.conv2d(w, groups=2),
        lambda x, w: F.conv2d(x, w, groups=2),
    ),
    case("max_pool2d", [(1, 2, 4, 6)], lambda x: x.max_pool2d(), lambda x: F.max_pool2d(x, 2), domain=DISTINCT),
    case(
        "max_pool2d_overlapping_padded",
        [(1, 2, 5, 5)],
        lambda x: x.max_pool2d(3, stride=2, padding=1),
        lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
        domain=DISTINCT,
    ),
    case("avg_pool2d", [(2, 2, 4, 6)], lambda x: x.avg_pool2d(), lambda x: F.avg_pool2d(x, 2)),
    case(
        "avg_pool2d_stride_padding",
        [(1, 2, 5, 5)],
        lambda x: x.avg_pool2d(3, stride=2, padding=1),
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    ),
    case("layernorm", [(3, 5)], lambda x: x.layernorm(), lambda x: F.layer_norm(x, (5,))),
    case(
        "layernorm_axis_0",
        [(4, 3)],
        lambda x: x.layernorm(0),
        lambda x: F.layer_norm(x.T, (4,)).T,
    ),
    case(
        "batchnorm",
        [(2, 3, 2, 2), (3,), (3,), (3,), (3,)],
        lambda x, weight, bias, mean, invstd: x.batchnorm(weight, bias, mean, invstd),
        torch_batchnorm,
    ),
    case(
        "scaled_dot_product_attention",
        [(2, 3, 4), (2, 5, 4), (2, 5, 3)],
        lambda q, k, v: q.scaled_dot_product_attention(k, v),
        F.scaled_dot_product_attention,
    ),
    case(
        "scaled_dot_product_attention_causal",
        [(1, 4, 4), (1, 4, 4), (1, 4, 2)],
        lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    ),
    case(
        "scaled_dot_product_attention_bool_mask",
        [(1, 4, 4), (1, 4, 4), (1, 4, 2)],
        lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(np.tril(np.ones((4, 4), dtype=bool)))),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(np.tril(np.ones((4, 4), bool)))),
    ),
    case("tril", [(3, 4)], lambda x: x.tril()),
    case("triu_diagonal", [(2, 3, 4)], lambda x: x.triu(1)),
    case("dropout_eval", [(3, 4)], lambda x: x.dropout(0.5), lambda x: F.dropout(x, 0.5, training=False)),
    case(
        "cross_entropy",
        [(3, 4)],
        lambda x: x.cross_entropy(labels(LABELS)[0]),
        lambda x: F.cross_entropy(x, labels(LABELS)[1]),
    ),
    case(
        "cross_entropy_sum_smoothing",
        [(3, 4)],
        lambda x: x.cross_entropy(labels(LABELS)[0], reduction="sum", label_smoothing=0.2),
        lambda x: F.cross_entropy(x, labels(LABELS)[1], reduction="sum", label_smoothing=0.2),
    ),
    case(
        "cross_entropy_ignored_label",
        [(3, 4)],
        lambda x: x.cross_entropy(labels(LABELS_IGNORED)[0]),
        lambda x: F.cross_entropy(x, labels(LABELS_IGNORED)[1]),
    ),
    case(
        "cross_entropy_spatial_none",
        [(2, 4, 3)],
        lambda x: x.cross_entropy(Tensor(LABELS[None].repeat(2, 0)), reduction="none"),
        lambda x: F.cross_entropy(x, torch.tensor(LABELS[None].repeat(2, 0).astype(np.int64)), reduction="none"),
    ),
    case(
        "cross_entropy_probabilities",
        [(3, 4)],
        lambda x: x.cross_entropy(Tensor(TARGETS).softmax(-1)),
        torch_cross_entropy_probabilities,
    ),
    case(
        "sparse_categorical_crossentropy",
        [(3, 4)],
        lambda x: x.sparse_categorical_crossentropy(labels(LABELS)[0]),
        lambda x: F.cross_entropy(x, labels(LABELS)[1]),
    ),
    case(
        "binary_crossentropy",
        [(3, 4)],
        lambda x: x.sigmoid().binary_crossentropy(Tensor(TARGETS)),
        lambda x: F.binary_cross_entropy(x.sigmoid(), torch.tensor(TARGETS)),
    ),
    case(
        "binary_crossentropy_logits",
        [(3, 4)],
        lambda x: x.binary_crossentropy_logits(Tensor(TARGETS), reduction="sum"),
        lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(TARGETS), reduction="sum"),
        domain=NONZERO,
    ),
    case("mse", [(3, 4), (3, 4)], lambda x, y: x.mse(y), lambda x, y: F.mse_loss(x, y)),
]


def test_dropout_training_backward():
    """In training the gradient is the kept mask scaled by 1/(1-p): it equals out/x for inputs away from zero."""
    values = np.random.default_rng(0).uniform(0.5, 2.0, (8, 16)).astype(np.float32)
    x = Tensor(values)
    Tensor.training = True
    try:
        out = x.dropout(0.25)
    finally:
        Tensor.training = False
    out.sum().backward()
    kept = out.numpy() / values
    assert np.all(np.isclose(kept, 0.0) | np.isclose(kept, 1 / 0.75))
    assert 0 < np.count_nonzero(kept) < kept.size
    np.testing.assert_allclose(x.grad.numpy(), kept, **TOLERANCE)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", ARITHMETIC)
def test_arithmetic_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", UNARY)
def test_unary_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", REDUCE)
def test_reduce_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", MOVEMENT)
def test_movement_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", GETITEM)
def test_getitem_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", MATMUL)
def test_matmul_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


@pytest.mark.parametrize("shapes, function, torch_function, domain, tolerance", NN)
def test_nn_backward(shapes, function, torch_function, domain, tolerance):
    run_backward(shapes, function, torch_function, domain, tolerance)


def test_chain_of_ops_backward():
    """Several ops composed: the gradient passes through each rule in turn."""
    run_backward(
        [(2, 3, 4), (4, 5)],
        lambda x, w: ((x.permute(1, 0, 2) @ w).relu().max(-1) + x[:, :, :2].sum(0)).softmax(-1).log(),
        lambda x, w: (torch.amax((x.permute(1, 0, 2) @ w).relu(), -1) + x[:, :, :2].sum(0)).softmax(-1).log(),
        DISTINCT,
        TOLERANCE,
    )


# ---------------------------------------------------------------------------------------------------------------------
# fixed inputs at the edges of an op's domain, where a naive formula gives nan (0 * inf, 0 / 0)


def edge_case(name: str, values, function: Callable, torch_function: Callable | None = None):
    arrays = [np.array(v, dtype=np.float32) for v in values]
    return pytest.param(arrays, function, torch_function or function, id=name)


EDGE_CASES = [
    edge_case(
        "prod_with_a_zero",
        [[0.0, 2.0, 3.0]],
        lambda x: x.prod(),
    ),
    edge_case(
        "pow_fractional_at_zero",
        [[0.0, 1.0, 2.0]],
        lambda x: x**2.5,
    ),
    edge_case(
        "pow_tensor_at_zero_base",
        [[0.0, 1.0], [2.0, 3.0]],
        lambda x, y: x**y,
    ),
    edge_case(
        "sigmoid_saturated",
        [[-100.0, -90.0, 100.0]],
        lambda x: x.sigmoid(),
    ),
    edge_case(
        "tanh_saturated",
        [[-50.0, 50.0]],
        lambda x: x.tanh(),
    ),
    edge_case(
        "elu_at_zero",
        [[0.0, 1.0]],
        lambda x: x.elu(),
        F.elu,
    ),
]


@pytest.mark.parametrize("arrays, function, torch_function", EDGE_CASES)
def test_gradient_edge_cases(arrays, function, torch_function):
    compare_backward(arrays, function, torch_function, TOLERANCE, np.random.default_rng(0))
