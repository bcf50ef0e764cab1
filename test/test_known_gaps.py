"""Known small gaps against torch, closed: inverse trigonometric and hyperbolic slopes at the ends of their domains,
a constant power's slope where the power overflows, the mode decorators on generators, frac(-0.0), uint8 linear
interpolation, BatchNorm's int64 counter, searchsorted by halving, and float64 erf.

Tensors stay small, so the file runs on any device."""

import math

import numpy as np
import pytest

import lazygrad.tensor_extra as tensor_extra
from lazygrad import Tensor, dtypes, nn
from lazygrad.codegen.lower import lower_kernel
from lazygrad.nn.state import get_state_dict, load_state_dict
from lazygrad.uop.ops import Ops

torch = pytest.importorskip("torch")
INF, NAN = float("inf"), float("nan")


def gradient(name: str, values, dtype) -> np.ndarray:
    x = Tensor(np.array(values, dtype), requires_grad=True)
    getattr(x, name)().sum().backward()
    return x.grad.numpy()


def torch_gradient(name: str, values, dtype) -> np.ndarray:
    x = torch.tensor(np.array(values, dtype), requires_grad=True)
    getattr(x, name)().sum().backward()
    return x.grad.numpy()


# ---- 1. asin, acos, atanh and acosh at the ends of their domains ----------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "name, values",
    [
        ("asin", [-1.0, 1.0, 0.0, 0.5, -0.999]),
        ("acos", [-1.0, 1.0, 0.0, 0.5, -0.999]),
        ("atanh", [-1.0, 1.0, 0.0, 0.5, -0.999]),
        ("acosh", [1.0, 1.5, 1e10]),
    ],
)
def test_inverse_functions_have_infinite_slopes_at_their_ends(name, values, dtype):
    """The slopes at +-1 (acosh: at 1) were nan where torch's are +-inf; the values there stay torch's."""
    ours, theirs = gradient(name, values, dtype), torch_gradient(name, values, dtype)
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5 if dtype == np.float32 else 1e-12)
    ends = np.array(values[:2], dtype)
    np.testing.assert_array_equal(getattr(Tensor(ends), name)().numpy(), getattr(torch.tensor(ends), name)().numpy())


# ---- 2. a constant power's slope where the power overflows or underflows --------------------------------------------


@pytest.mark.parametrize(
    "dtype, exponent, values",
    [
        (np.float32, 2.5, [1e20, 3e38, 9.08e-19, 2.0]),  # 1e50 overflows, 8e-46 is subnormal
        (np.float32, 1.5, [1e30, 1e-30, 7.0]),
        (np.float64, 11.0, [1e30, 1e-30, -1e30, 3.0]),
        (np.float64, 2.5, [1e130, 1e-130, 0.5]),
    ],
)
def test_constant_power_slope_is_n_x_to_the_n_minus_1(dtype, exponent, values):
    """It was read through the power: inf where x**n overflows (float32 1e20 ** 2.5; torch's slope is 2.5e30), and
    digits lost where it is subnormal."""
    x = Tensor(np.array(values, dtype), requires_grad=True)
    (x**exponent).sum().backward()
    reference = torch.tensor(np.array(values, dtype), requires_grad=True)
    (reference**exponent).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-5 if dtype == np.float32 else 1e-13)
    # inside the range the second derivative is still n (n-1) x**(n-2)
    inside = Tensor(np.array([0.5, 2.0, 3.0], dtype), requires_grad=True)
    (first,) = (inside**exponent).sum().gradient(inside)
    (second,) = first.sum().gradient(inside)
    expected = exponent * (exponent - 1) * np.array([0.5, 2.0, 3.0]) ** (exponent - 2)
    np.testing.assert_allclose(second.numpy(), expected, rtol=1e-5 if dtype == np.float32 else 1e-13)


# ---- 3. Tensor.test and Tensor.train on generator functions ---------------------------------------------------------


def test_mode_decorators_hold_while_a_generator_runs():
    """As torch.no_grad: the mode holds in the generator's body at every step, not in the caller's between them."""

    @Tensor.test
    def without_gradients():
        received = yield Tensor.no_grad
        yield Tensor.no_grad, received
        return "done"

    steps = without_gradients()
    assert next(steps) is True and Tensor.no_grad is False
    assert steps.send("sent") == (True, "sent") and Tensor.no_grad is False
    with pytest.raises(StopIteration) as stop:
        next(steps)
    assert stop.value.value == "done"

    @Tensor.train()
    def training():
        try:
            yield Tensor.training
        except KeyError:
            yield ("thrown", Tensor.training)

    steps = training()
    assert next(steps) is True and Tensor.training is False
    assert steps.throw(KeyError("x")) == ("thrown", True)
    steps.close()
    assert Tensor.training is False


# ---- 4. frac(-0.0) ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_frac_and_rounding_keep_torchs_signed_zeros(dtype):
    """frac(-0.0) was -0.0 (torch: +0.0): floor made -0.0 +0.0, so trunc did, and frac's x - trunc(x) was -0 - +0."""
    values = np.array([-0.0, 0.0, -0.5, -3.0, 3.0, 2.5, -1e30 if dtype != np.float16 else -6e4], dtype)
    for name in ("frac", "floor", "ceil", "trunc"):
        ours, theirs = getattr(Tensor(values), name)().numpy(), getattr(torch.tensor(values), name)().numpy()
        np.testing.assert_array_equal(ours, theirs, err_msg=name)
        np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs), err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", ["asin", "atan", "tanh", "asinh", "atanh", "erf", "expm1", "log1p", "sinh"])
def test_odd_functions_keep_the_sign_of_zero(name, dtype):
    """f(-0.0) is -0.0 for these odd functions, as torch's (their formulas added a constant or terms of both signs:
    +0.0), and the slope at either zero is still f'(0)."""
    values = np.array([-0.0, 0.0, 0.25, -0.25], dtype)
    ours, theirs = getattr(Tensor(values), name)().numpy(), getattr(torch.tensor(values), name)().numpy()
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))
    if dtype != np.float16:
        np.testing.assert_allclose(gradient(name, values, dtype), torch_gradient(name, values, dtype), rtol=1e-6)


def test_atan2_slopes_at_signed_zeros_and_logsumexp_at_its_maximum():
    # atan2's magnitudes took +y at y = -0.0 where its sign took -: the slope's sign was wrong there (and at x = -0.0)
    y, x = Tensor([-0.0, 0.0, 1.0], requires_grad=True), Tensor([1.0, 1.0, -0.0], requires_grad=True)
    y.atan2(x).sum().backward()
    ty, tx = torch.tensor([-0.0, 0.0, 1.0], requires_grad=True), torch.tensor([1.0, 1.0, -0.0], requires_grad=True)
    torch.atan2(ty, tx).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), ty.grad.numpy())
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    # logsumexp's shift took a gradient through the max: the row's rounding of 1 - sum(softmax) went to its argmax
    values = np.random.default_rng(0).random(1 << 17).astype(np.float32)
    v = Tensor(values, requires_grad=True)
    v.logsumexp(0).backward()
    expected = np.exp(values.astype(np.float64) - np.log(np.exp(values.astype(np.float64)).sum()))
    np.testing.assert_allclose(v.grad.numpy(), expected, rtol=1e-5)


# ---- 5. uint8 linear interpolation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, keywords",
    [
        ((2, 3, 5, 7), {"size": (9, 4)}),
        ((1, 5, 16, 16), {"size": (31, 9), "align_corners": True}),
        ((1, 1, 20, 17), {"scale_factor": 1.5}),
        ((1, 4, 12, 10), {"scale_factor": (0.5, 1.01)}),  # (an axis of unchanged size is left as it is)
        ((2, 1, 16, 16), {"size": (32, 32)}),  # (its two passes in one kernel: the scheduler had looped for ever)
    ],
)
def test_uint8_bilinear_is_torchs_uint8(shape, keywords):
    """It was float32; torch gives uint8, from int16 weights and a uint8 rounding after each axis: the same values."""
    image = np.random.default_rng(sum(shape)).integers(0, 256, shape).astype(np.uint8)
    ours = Tensor(image).interpolate(mode="bilinear", **keywords)
    theirs = torch.nn.functional.interpolate(torch.tensor(image), mode="bilinear", **keywords)
    assert ours.dtype == dtypes.uint8
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_other_ints_are_refused_by_linear_interpolation():
    with pytest.raises(TypeError, match=r"interpolate: mode 'bilinear' takes float or uint8 tensors.*int32"):
        Tensor.zeros(1, 1, 4, 4, dtype=dtypes.int32).interpolate((8, 8), mode="bilinear")
    assert Tensor.zeros(1, 1, 4, 4, dtype=dtypes.int32).interpolate((8, 8)).dtype == dtypes.int32  # nearest


# ---- 6. BatchNorm's counter --------------------------------------------------------------------------------------


def test_batchnorm_counter_is_int64_and_state_dicts_round_trip_with_torch():
    ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    assert ours.num_batches_tracked.dtype == dtypes.int64
    assert (
        get_state_dict(ours)["num_batches_tracked"].numpy().dtype
        == theirs.state_dict()["num_batches_tracked"].numpy().dtype
    )
    batch = np.random.default_rng(0).standard_normal((4, 3, 5, 5)).astype(np.float32)
    theirs.train()
    for _ in range(2):
        theirs(torch.tensor(batch))
    load_state_dict(ours, {key: value.numpy() for key, value in theirs.state_dict().items()})
    with Tensor.train():
        ours(Tensor(batch)).realize()
    back = torch.nn.BatchNorm2d(3)
    back.load_state_dict({key: torch.from_numpy(value.numpy()) for key, value in get_state_dict(ours).items()})
    assert back.num_batches_tracked.dtype == torch.int64 and back.num_batches_tracked.item() == 3


# ---- 7. searchsorted by halving ----------------------------------------------------------------------------------


def reduce_loops(tensor: Tensor) -> int:
    return sum(node.op is Ops.RANGE_REDUCE for item in tensor.schedule() for node in lower_kernel(item.ast).toposort)


def test_long_searchsorted_halves_in_one_kernel_without_a_loop_over_the_boundaries():
    """It compared each value with every boundary: a sum over all of them per value."""
    rng = np.random.default_rng(0)
    boundaries = Tensor(np.sort(rng.random(1000)).astype(np.float32)).realize()
    values = Tensor(rng.random(40_000).astype(np.float32)).realize()
    found = boundaries.searchsorted(values)
    assert len(found.schedule()) == 1 and reduce_loops(found) == 0
    np.testing.assert_array_equal(found.numpy(), np.searchsorted(boundaries.numpy(), values.numpy()))


@pytest.mark.parametrize("halving", [False, True])
def test_searchsorted_and_bucketize_match_torch_both_ways(monkeypatch, halving):
    """Counting (short sequences) and halving (long ones, forced here for every length) give torch's answers."""
    monkeypatch.setattr(tensor_extra, "SEARCH_LENGTH", 0 if halving else 1 << 30)
    monkeypatch.setattr(tensor_extra, "SEARCH_WORK", 0)
    rng = np.random.default_rng(1)
    for length in (1, 2, 7, 100):
        # ties, infinities, and values on the boundaries
        sequence = np.sort(np.concatenate([rng.choice([-1.0, 0.0, 2.0], length // 2), rng.standard_normal(length)]))
        sequence[[0, -1]] = -INF, INF
        sequence = sequence.astype(np.float32)
        values = np.concatenate([rng.standard_normal(12), sequence[:3], [INF, -INF, 0.0]]).astype(np.float32)
        for right in (False, True):
            for out_int32 in (False, True):
                ours = Tensor(sequence).searchsorted(Tensor(values), right=right, out_int32=out_int32)
                theirs = torch.searchsorted(
                    torch.tensor(sequence), torch.tensor(values), right=right, out_int32=out_int32
                )
                assert ours.dtype == (dtypes.int32 if out_int32 else dtypes.int64)
                np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
            ours = Tensor(values).bucketize(Tensor(sequence), right=right)
            np.testing.assert_array_equal(
                ours.numpy(), torch.bucketize(torch.tensor(values), torch.tensor(sequence), right=right).numpy()
            )
        side = Tensor(sequence).searchsorted(Tensor(values), side="right").numpy()
        np.testing.assert_array_equal(
            side, torch.searchsorted(torch.tensor(sequence), torch.tensor(values), side="right").numpy()
        )
        # one sorted row per row of values
        rows = np.sort(rng.standard_normal((3, length)), -1).astype(np.float32)
        row_values = rng.standard_normal((3, 5)).astype(np.float32)
        ours = Tensor(rows).searchsorted(Tensor(row_values), right=True).numpy()
        np.testing.assert_array_equal(
            ours, torch.searchsorted(torch.tensor(rows), torch.tensor(row_values), right=True).numpy()
        )
        # NaN: a NaN value goes last; a NaN boundary (sorted last) is above every value, as NumPy orders them
        with_nan = np.concatenate([sequence, [NAN]]).astype(np.float32)
        probes = np.array([NAN, 0.5, INF], np.float32)
        expected = np.searchsorted(with_nan, probes)
        expected[0] = len(with_nan)
        np.testing.assert_array_equal(Tensor(with_nan).searchsorted(Tensor(probes)).numpy(), expected)


# ---- 8. float64 erf ---------------------------------------------------------------------------------------------------


def test_float64_erf_is_float64_accurate():
    """The fit beyond 0.75 was float32's (3e-8 relative), so erf was ~1e-9 off in float64."""
    values = np.concatenate(
        [np.linspace(-7, 7, 2801), 10.0 ** np.linspace(-300, 1.4, 300), np.linspace(0.99, 1.01, 41)]
    )
    values = np.concatenate([values, -values])
    expected = np.array([math.erf(value) for value in values])
    x = Tensor(values, requires_grad=True)
    result = x.erf()
    np.testing.assert_allclose(result.numpy(), expected, rtol=4.5e-16, atol=0)
    result.sum().backward()
    # (exp(-x^2) carries the rounding of x^2 along, as torch's and NumPy's: x^2 ulp)
    slope = 2 / math.sqrt(math.pi) * np.exp(-values * values)
    error = np.abs(x.grad.numpy() - slope) / slope
    assert (error <= 2e-16 * np.maximum(values * values, 8)).all(), values[np.argmax(error)]


def test_float64_erf_edges_and_second_derivative():
    edges = np.array([0.0, -0.0, INF, -INF, NAN, 30.0])
    x = Tensor(edges, requires_grad=True)
    result = x.erf()
    result.sum().backward()
    reference = torch.tensor(edges, requires_grad=True)
    expected = reference.erf()
    expected.sum().backward()
    np.testing.assert_array_equal(result.numpy(), expected.detach().numpy())
    assert np.signbit(result.numpy()[1])
    np.testing.assert_array_equal(x.grad.numpy(), reference.grad.numpy())
    points = np.array([-2.0, -0.5, 0.3, 1.5, 3.0])
    x = Tensor(points, requires_grad=True)
    (first,) = x.erf().sum().gradient(x)
    (second,) = first.sum().gradient(x)
    np.testing.assert_allclose(
        second.numpy(), -2 * points * 2 / math.sqrt(math.pi) * np.exp(-points * points), rtol=1e-13
    )


def test_round_keeps_the_sign_of_a_zero():
    values = [-0.4, -0.5, -0.6, -1.5, 0.4, 0.5, -0.0, 0.0, 2.5, -2.5, -1e-30, float("inf"), float("-inf")]
    ours, theirs = Tensor(values).round().numpy(), torch.tensor(values).round().numpy()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))
