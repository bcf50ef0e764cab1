"""Argument checks of convolution, transposed convolution, pooling and interpolate (each wrong input a clear error
naming the op, never a wrong result or a read outside the input), and the pooling edge cases where lazygrad must
match torch: ceil_mode windows larger than the input, and return_indices over windows of -inf."""

import numpy as np
import pytest
from test_ops import assert_tensor

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional


def line(size: int) -> Tensor:
    return Tensor(np.arange(size, dtype=np.float32).reshape(1, 1, size))


# ---------------------------------------------------------------------------------------------------------------------
# argument checks

CONV_ERRORS = [
    # (call, the error's message)
    (lambda: line(6).conv1d(Tensor.ones(1, 1, 2), dilation=-2), r"conv1d: dilation must be positive .* got -2"),
    (lambda: line(5).conv1d(Tensor.ones(1, 1, 3), dilation=0), r"conv1d: dilation must be positive .* got 0"),
    (lambda: line(5).conv1d(Tensor.ones(1, 1, 3), stride=0), r"conv1d: stride must be positive .* got 0"),
    (lambda: line(5).conv1d(Tensor.ones(1, 1, 3), stride=-1), r"conv1d: stride must be positive .* got -1"),
    (lambda: line(5).conv1d(Tensor.ones(1, 1, 3), padding=-1), r"conv1d: padding must be non-negative, got -1"),
    (
        lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 2, 2), padding=(1, 0, -1, 0)),
        r"conv2d: padding must be non-negative, got \(1, 0, -1, 0\)",
    ),
    (
        lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 2, 2), stride=1.5),
        r"conv2d: stride needs one int or 2 ints \(one per spatial axis\), got 1.5",
    ),
    (
        lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 2, 2), padding=0.5),
        r"conv2d: padding needs an int or a tuple of ints, got 0.5",
    ),
    (lambda: line(5).conv1d(Tensor.ones(1, 1, 0)), r"conv1d: the weight \(1, 1, 0\) has an empty kernel"),
    (
        lambda: Tensor.ones(1, 3, 4, 4).conv2d(Tensor.ones(4, 3, 2, 2), Tensor.ones(3)),
        r"conv2d: bias must be 1-D with one value per output channel, shape \(4,\), got \(3,\)",
    ),
    (
        lambda: Tensor.ones(1, 3, 4, 4).conv2d(Tensor.ones(4, 3, 2, 2), Tensor.ones(4, 1)),
        r"conv2d: bias must be 1-D with one value per output channel, shape \(4,\), got \(4, 1\)",
    ),
    (lambda: line(5).conv1d(Tensor.ones(2, 1, 2), [1.0, 2.0]), r"conv1d: bias must be a Tensor, got list"),
    # transposed convolution
    (
        lambda: Tensor.ones(1, 1, 3).conv_transpose1d(Tensor.ones(1, 1, 3), stride=0),
        r"conv_transpose1d: stride must be positive .* got 0",
    ),
    (
        lambda: Tensor.ones(1, 1, 3).conv_transpose1d(Tensor.ones(1, 1, 3), dilation=-1),
        r"conv_transpose1d: dilation must be positive .* got -1",
    ),
    (
        lambda: Tensor.ones(1, 1, 3, 3).conv_transpose2d(Tensor.ones(1, 1, 2, 2), padding=-1),
        r"conv_transpose2d: padding must be non-negative, got \(-1, -1\)",
    ),
    (
        lambda: Tensor.ones(1, 1, 3).conv_transpose1d(Tensor.ones(1, 1, 2), stride=2, output_padding=-1),
        r"conv_transpose1d: output_padding \(-1,\) must be smaller than the stride \(2,\) .* and non-negative",
    ),
    (
        lambda: Tensor.ones(1, 1, 3).conv_transpose1d(Tensor.ones(1, 1, 2), stride=2, output_padding=2),
        r"conv_transpose1d: output_padding \(2,\) must be smaller than the stride \(2,\) or the dilation \(1,\)",
    ),
    (
        lambda: Tensor.ones(1, 2, 3).conv_transpose1d(Tensor.ones(2, 3, 2), Tensor.ones(2)),
        r"conv_transpose1d: bias must be 1-D with one value per output channel, shape \(3,\), got \(2,\)",
    ),
    (
        lambda: Tensor.ones(1, 2, 3).conv_transpose1d(Tensor.ones(2, 3, 2), Tensor.ones(2, 3), groups=2),
        r"conv_transpose1d: bias must be 1-D with one value per output channel, shape \(6,\), got \(2, 3\)",
    ),
    (
        lambda: Tensor.ones(1, 4, 2, 10).conv_transpose2d(Tensor.ones(4, 2, 3, 3), stride=2, padding=3),
        r"conv_transpose2d: the output would be empty: .* gives \(-1, 15\) for the input \(1, 4, 2, 10\)",
    ),
]

POOL_ERRORS = [
    (lambda: line(6).max_pool1d(2, stride=1, dilation=-1), r"max_pool1d: dilation must be positive .* got -1"),
    (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(2, dilation=0), r"max_pool2d: dilation must be positive .* got 0"),
    (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(0), r"max_pool2d: kernel_size must be positive .* got 0"),
    (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(-1), r"max_pool2d: kernel_size must be positive .* got -1"),
    (lambda: Tensor.ones(1, 1, 4, 4).avg_pool2d(0), r"avg_pool2d: kernel_size must be positive .* got 0"),
    (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(2, stride=0), r"max_pool2d: stride must be positive .* got 0"),
    (lambda: Tensor.ones(1, 1, 4, 4).avg_pool2d(2, stride=(1, -1)), r"avg_pool2d: stride must be .* got \(1, -1\)"),
    (lambda: line(5).max_pool1d(3, padding=-1), r"max_pool1d: padding must be non-negative, got -1"),
    (lambda: line(5).avg_pool1d(2.5), r"avg_pool1d: kernel_size needs one int or 1 ints .* got 2.5"),
    (
        lambda: line(6).max_pool1d(2, dilation=3, padding=2),
        r"max_pool1d: padding 2 must be at most half the kernel \(2,\)",
    ),
    (
        lambda: line(3).max_pool1d(4),
        r"max_pool1d: kernel \(4,\) \(dilation \(1,\)\) does not fit the input \(1, 1, 3\)",
    ),
    (lambda: line(3).max_unpool1d(Tensor([[[0, 1, 2]]]), 0), r"max_unpool1d: kernel_size must be positive"),
    (lambda: line(3).max_unpool1d(Tensor([[[0, 1, 2]]]), 2, padding=-1), r"max_unpool1d: padding must be non-neg"),
]

INTERPOLATE_ERRORS = [
    (lambda: line(3).interpolate(size=0), r"interpolate: input and output sizes must be positive, got output sizes"),
    (
        lambda: line(3).interpolate(scale_factor=0.0, mode="nearest"),
        r"interpolate: .* got output sizes \(0,\) \(from scale_factor 0.0\)",
    ),
    (lambda: line(3).interpolate(scale_factor=-2.0), r"interpolate: input and output sizes must be positive"),
    (lambda: line(3).interpolate(size=2.5), r"interpolate: size needs one int or 1 ints"),
]


@pytest.mark.parametrize("call, message", CONV_ERRORS + POOL_ERRORS + INTERPOLATE_ERRORS)
def test_argument_errors(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# ---------------------------------------------------------------------------------------------------------------------
# pooling edge cases, against torch


def test_ceil_mode_windows_larger_than_the_input():
    assert_tensor(Tensor([[[3.0]]]).max_pool1d(2, 2, ceil_mode=True), np.array([[[3.0]]], np.float32))
    x = np.arange(12.0, dtype=np.float32).reshape(1, 1, 2, 6)
    expected = F.avg_pool2d(torch.tensor(x), (3, 2), stride=(3, 2), ceil_mode=True).numpy()
    assert_tensor(Tensor(x).avg_pool2d((3, 2), stride=(3, 2), ceil_mode=True), expected)


def random_pool(rng):
    """A small random pooling: (op name, input shape, keyword arguments), valid for torch."""
    count = int(rng.integers(1, 3))
    kind = "max" if rng.random() < 0.5 else "avg"
    kernel = tuple(int(k) for k in rng.integers(1, 4, count))
    options = {
        "stride": tuple(int(s) for s in rng.integers(1, 4, count)),
        "padding": tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel),
        "ceil_mode": bool(rng.random() < 0.7),
    }
    if kind == "max":
        options["dilation"] = tuple(int(d) for d in rng.integers(1, 3, count))
    else:
        options["count_include_pad"] = bool(rng.random() < 0.5)
    shape = (1, 2, *(int(s) for s in rng.integers(1, 6, count)))
    return f"{kind}_pool{count}d", shape, kernel, options


def test_pooling_fuzz_against_torch():
    """Values and gradients (distinct values: no ties) of random small poolings, ceil_mode with windows that hang
    over the input or are larger than it, wherever torch has an output."""
    rng = np.random.default_rng(0)
    checked = 0
    while checked < 60:
        name, shape, kernel, options = random_pool(rng)
        x = (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.25 - 3).astype(np.float32)
        source = torch.tensor(x, requires_grad=True)
        try:
            expected = getattr(F, name)(source, kernel, **options)
        except RuntimeError:
            with pytest.raises(ValueError, match=f"{name}: kernel .* does not fit the input"):
                getattr(Tensor(x), name)(kernel, **options)
            continue
        if name.startswith("max") and np.isinf(expected.detach().numpy()).any():
            # a dilated window of padding alone: torch gives -inf (and an index outside the input), here an error
            with pytest.raises(ValueError, match=f"{name}: window .* holds only padding"):
                getattr(Tensor(x), name)(kernel, **options)
            continue
        seed = rng.standard_normal(expected.shape).astype(np.float32)
        expected.backward(torch.tensor(seed))
        ours = Tensor(x, requires_grad=True)
        result = getattr(ours, name)(kernel, **options)
        (result * Tensor(seed)).sum().backward()
        context = f"{name}{shape} kernel {kernel} {options}"
        np.testing.assert_allclose(result.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=context)
        np.testing.assert_allclose(ours.grad.numpy(), source.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=context)
        if name.startswith("max"):
            _, indices = getattr(Tensor(x), name)(kernel, **options, return_indices=True)
            expected_indices = getattr(F, name)(torch.tensor(x), kernel, **options, return_indices=True)[1]
            np.testing.assert_array_equal(indices.numpy(), expected_indices.numpy(), err_msg=context)
        checked += 1


def test_max_pool_indices_of_minus_infinity_skip_the_padding():
    x = np.full((1, 1, 3), -np.inf, np.float32)
    values, indices = Tensor(x).max_pool1d(2, stride=1, padding=1, return_indices=True)
    expected_values, expected_indices = F.max_pool1d(torch.tensor(x), 2, stride=1, padding=1, return_indices=True)
    assert_tensor(values, expected_values.numpy())
    assert_tensor(indices, expected_indices.numpy(), dtype=dtypes.int64)
    x = np.array([[[[-np.inf, 1.0], [np.nan, -np.inf]]]], np.float32)  # a NaN wins over the padding too
    _, indices = Tensor(x).max_pool2d(2, stride=1, padding=1, return_indices=True)
    expected = F.max_pool2d(torch.tensor(x), 2, stride=1, padding=1, return_indices=True)[1]
    assert_tensor(indices, expected.numpy(), dtype=dtypes.int64)


def max_pool_with_torch(x: np.ndarray, name: str, kernel, gradient: bool = True, **options):
    """Values, indices and (where `gradient`: no window ties) the input's gradient for a random seed, of lazygrad's
    and torch's max pooling. Tied maxima share the gradient here, as `max`'s do; torch gives it to the first."""
    seed_rng = np.random.default_rng(2)
    source = torch.tensor(x, requires_grad=True)
    expected, expected_indices = getattr(F, name)(source, kernel, **options, return_indices=True)
    seed = seed_rng.standard_normal(expected.shape).astype(np.float32)
    expected.backward(torch.tensor(seed))
    ours = Tensor(x, requires_grad=True)
    values, indices = getattr(ours, name)(kernel, **options, return_indices=True)
    (values * Tensor(seed)).sum().backward()
    assert_tensor(values, expected.detach().numpy())
    assert_tensor(indices, expected_indices.numpy(), dtype=dtypes.int64)
    if gradient:
        np.testing.assert_allclose(ours.grad.numpy(), source.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "shape, kernel, options",
    [
        ((1, 1, 2, 2), 2, {}),
        ((2, 3, 5, 6), 3, {"stride": 1, "padding": 1}),  # overlapping windows: one element wins several
        ((1, 2, 5, 7), (3, 2), {"stride": (2, 3), "padding": (1, 1), "ceil_mode": True}),
        ((1, 2, 9), 3, {"stride": 2, "dilation": 2, "ceil_mode": True}),
    ],
)
def test_max_pool_index_of_ties_is_the_first_maximum_and_they_share_the_gradient(shape, kernel, options):
    x = np.random.default_rng(1).integers(0, 3, shape).astype(np.float32)  # many ties
    max_pool_with_torch(x, f"max_pool{len(shape) - 2}d", kernel, gradient=False, **options)
    x = np.ones(shape, np.float32)
    ours = Tensor(x, requires_grad=True)
    values = getattr(ours, f"max_pool{len(shape) - 2}d")(kernel, **options)
    values.sum().backward()
    assert_tensor(values, getattr(F, f"max_pool{len(shape) - 2}d")(torch.tensor(x), kernel, **options).numpy())
    np.testing.assert_allclose(ours.grad.numpy().sum(), values.numel(), rtol=1e-6)
    if shape == (1, 1, 2, 2):
        assert_tensor(ours.grad, np.full(shape, 0.25, np.float32))


def test_max_pool_index_of_minus_infinity_and_nan_is_torchs():
    x = np.full((1, 1, 3, 4), -np.inf, np.float32)
    x[0, 0, 2, 1] = np.nan
    max_pool_with_torch(x, "max_pool2d", 2, gradient=False, stride=1, padding=1)
