"""Accuracy of the composed elementwise math on the selected device, in ulp of the result's dtype against float64
references (NumPy, Python's math) or PyTorch (CPU): the hyperbolic functions and erf near 0, where their textbook
forms cancel, asinh and acosh of large float16, acosh below 1, gelu's left tail, float64 tanh, and the sign of abs at
zero. Gradients are compared with torch's, and each function's kernels are counted, forward and backward.

The same file runs on every device (chosen by environment variables, as test_ops.py); tensors stay small, so it is
quick on the PYTHON emulator too.
"""

import math

import numpy as np
import pytest

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")


def ulps(result, expected, dtype) -> np.ndarray:
    """|result - expected| in units of the last place of `expected` rounded to `dtype` (a NumPy float type)."""
    expected = np.asarray(expected, np.float64)
    spacing = np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
    return np.abs(np.asarray(result, np.float64) - expected) / spacing


def assert_ulps(result, expected, dtype, most, inputs) -> None:
    """Every result within `most` ulp (a number, or one for each input) of its expected value."""
    error = ulps(result, expected, dtype)
    worst = int(np.argmax(error - most))
    assert (error <= most).all(), (
        f"{error.flat[worst]:.3g} ulp at x = {np.asarray(inputs).flat[worst]!r}: got {np.asarray(result).flat[worst]!r}, "
        f"expected {np.asarray(expected).flat[worst]!r}"
    )


def magnitudes(low: float, high: float, count: int = 200) -> np.ndarray:
    """Values spread over [low, high] by their logarithm, both signs."""
    values = np.logspace(math.log10(low), math.log10(high), count)
    return np.concatenate([values, -values])


# ---- 1. asinh and acosh of large float16 (and bfloat16) -------------------------------------------------------------


def test_asinh_acosh_of_large_half_are_finite():
    # x * x + 1 in float16 overflowed from 256 on: asinh(300) and asinh(65504) were inf (torch: 6.398, 11.78)
    values = np.array([255.0, 256.0, 300.0, 1000.0, 30000.0, 65504.0, 2.0, 0.5, 1e-3], np.float16)
    signed = np.concatenate([values, -values])
    expected = torch.tensor(signed).float().asinh().half().numpy()
    result = Tensor(signed).asinh()
    assert result.dtype == dtypes.float16
    assert_ulps(result.numpy(), expected, np.float16, 1, signed)
    above_one = values[values >= 1]
    expected = torch.tensor(above_one).float().acosh().half().numpy()
    assert_ulps(Tensor(above_one).acosh().numpy(), expected, np.float16, 1, above_one)


def test_asinh_acosh_of_every_half_are_torchs():
    # computed in float32 and rounded once, as torch: every finite float16 at most 1 ulp from torch's result
    halves = np.arange(0x7C00, dtype=np.uint16).view(np.float16)[::7]
    for name, inputs in (("asinh", np.concatenate([halves, -halves])), ("acosh", halves[halves >= 1])):
        expected = getattr(torch.tensor(inputs).float(), name)().half().numpy()
        assert_ulps(getattr(Tensor(inputs), name)().numpy(), expected, np.float16, 1, inputs)


def test_asinh_acosh_of_large_bfloat16():
    values = np.array([300.0, 65504.0, 1e20, 3e38, 1.5], np.float32)
    for name in ("asinh", "acosh"):
        result = getattr(Tensor(values).cast(dtypes.bfloat16), name)()
        assert result.dtype == dtypes.bfloat16
        expected = getattr(torch.tensor(values).bfloat16(), name)().float().numpy()
        # one bfloat16 ulp is 2^-7 of the value's binade
        np.testing.assert_allclose(result.numpy(), expected, rtol=2**-7)


# ---- 2. acosh below 1 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_acosh_below_one_is_nan(dtype):
    # log(x + sqrt(x^2 - 1)) of x <= -1 was -inf or inf (-1e6, -3e38), not torch's nan
    large = [-1e6, -3e38] if dtype != np.float16 else [-6e4, -300.0]
    values = np.array([*large, -1.0, -0.5, 0.0, 0.5, 0.999, -INF, NAN], dtype)
    edges = np.array([1.0, INF], dtype)
    result = Tensor(np.concatenate([values, edges])).acosh().numpy()
    assert np.isnan(result[: len(values)]).all(), result
    np.testing.assert_array_equal(result[len(values) :], [0.0, INF])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_acosh_near_one(dtype):
    # log of 1 + a small number lost its digits: acosh(1 + 2^-23) was 1000 ulp off in float32
    steps = np.unique(np.round(np.logspace(0, 7, 120)))
    values = (1 + steps * np.finfo(dtype).eps).astype(dtype)
    values = np.concatenate([values, np.array([1.5, 2.0, 10.0, 1e4, 6.7e7, 1e20], dtype)])
    expected = np.arccosh(values.astype(np.float64)) if dtype == np.float32 else np.arccosh(values)
    assert_ulps(Tensor(values).acosh().numpy(), expected, dtype, 4, values)


# ---- 3. erf near 0, and gelu's tail -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_near_zero(dtype):
    # 1 - erfc(x) cancelled: float32 erf(0) was -1.19e-7, erf(1e-6) 8.3e-7 (1.128e-6), float64 erf(0) -2.4e-8
    zero = Tensor(np.array([0.0], dtype)).erf().numpy()
    assert zero[0] == 0 and not np.signbit(zero[0])
    values = magnitudes(1e-30, 0.7499, 150).astype(dtype)
    expected = np.array([math.erf(v) for v in values.astype(np.float64)])
    # float64 keeps Taylor's series to x^21 below 0.75: 2e-12 of the sum at the end, to the ulp near 0
    most = 2 if dtype == np.float32 else 40_000
    assert_ulps(Tensor(values).erf().numpy(), expected, dtype, most, values)
    tiny = np.array([1e-6, -1e-3, 1e-10], dtype)
    expected = np.array([math.erf(v) for v in tiny.astype(np.float64)])
    assert_ulps(Tensor(tiny).erf().numpy(), expected, dtype, 2, tiny)


def test_erf_float32_everywhere():
    # the series and 1 - erfc meet at 0.75 without a step: within 2 ulp on both sides and beyond
    values = np.concatenate([np.linspace(0, 6, 601), [0.7499999, 0.75, 0.7500001]]).astype(np.float32)
    values = np.concatenate([values, -values])
    expected = np.array([math.erf(v) for v in values.astype(np.float64)])
    assert_ulps(Tensor(values).erf().numpy(), expected, np.float32, 2, values)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 3e-5), (np.float64, 1e-7)])
def test_gelu_exact_left_tail(dtype, rtol):
    # 0.5 x (1 + erf(x / sqrt(2))) cancelled for negative x: gelu(-4) was 2.7e-4 off, gelu(-6) 0 (-5.9e-9). (float32
    # loses |x|^2/2 ulp to the rounding of exp's argument; float64 keeps the erfc fit's 3e-8 relative)
    values = np.concatenate([-np.linspace(0.1, 9, 90), np.linspace(0.1, 9, 30)]).astype(dtype)
    expected = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in values.astype(np.float64)])
    np.testing.assert_allclose(Tensor(values).gelu(approximate="none").numpy(), expected, rtol=rtol, atol=0)


# ---- 4. sinh, asinh, atanh of small arguments ---------------------------------------------------------------------


SMALL = {"sinh": np.sinh, "asinh": np.arcsinh, "atanh": np.arctanh}


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hyperbolic_small_arguments(name, dtype):
    # exp(x) - exp(-x), log(x + sqrt(x^2 + 1)) and log((1 + x) / (1 - x)) lost a small x's digits: at float32 1e-6
    # they gave 1.0431e-6, 9.537e-7 and 1.0133e-6; sinh(1e-8) and asinh(6.8e-21) were 0
    values = np.concatenate([magnitudes(1e-30, 0.999, 150), [1e-6, 1e-8, 6.8e-21, -8.2e-4, 0.5, -1 / 3]])
    if name != "atanh":
        values = np.concatenate([values, magnitudes(1, 60, 20)])
    values = values.astype(dtype)
    expected = SMALL[name](values.astype(np.float64))
    # (sinh keeps exp's error beyond 1: exp(x - ln 2) rounds x - ln 2, |x| ulp off)
    most = 4 if name != "sinh" else np.where(np.abs(values) < 1, 1, np.maximum(4, 1.2 * np.abs(values)))
    assert_ulps(getattr(Tensor(values), name)().numpy(), expected, dtype, most, values)
    zero = getattr(Tensor(np.array([0.0], dtype)), name)().numpy()
    assert zero[0] == 0


@pytest.mark.parametrize("name", list(SMALL))
def test_hyperbolic_half(name):
    # in float16, sinh(-8.2e-4) was 49% off; all are computed in float32 and rounded once, as torch
    values = np.array([-8.2e-4, 1e-3, 6e-8, -0.01, 0.3, -0.9, 0.99], np.float16)
    expected = getattr(torch.tensor(values).float(), name)().half().numpy()
    result = getattr(Tensor(values), name)()
    assert result.dtype == dtypes.float16
    assert_ulps(result.numpy(), expected, np.float16, 1, values)


# ---- 5. abs of zero ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, "bfloat16"])
def test_abs_of_zero_is_plus_zero(dtype):
    # max(x, -x) took the second operand on the tie in C, OpenCL, CUDA and the emulator: abs(+0.0) was -0.0, and
    # 1 / abs(0.0) -inf
    values = np.array([0.0, -0.0, NAN, INF, -INF, -2.5, 3.0] * 5, np.float32)
    x = Tensor(values) if dtype == "bfloat16" else Tensor(values.astype(dtype))
    x = x.cast(dtypes.bfloat16) if dtype == "bfloat16" else x
    result = x.abs().numpy().astype(np.float64)
    np.testing.assert_array_equal(result, np.abs(values.astype(np.float64)))
    assert not np.signbit(result).any()
    np.testing.assert_array_equal((1 / x.abs()).numpy()[:2], [INF, INF])


def test_abs_gradient_and_integers():
    # the slope stays torch's: 0 at both zeros (the tie splits it), the sign elsewhere
    values = np.array([0.0, -0.0, 1.5, -2.0, 1e-30, -1e-30], np.float32)
    x = Tensor(values)
    (grad,) = x.abs().sum().gradient(x)
    reference = torch.tensor(values, requires_grad=True)
    reference.abs().sum().backward()
    np.testing.assert_array_equal(grad.numpy(), reference.grad.numpy())
    integers = np.array([0, -3, 7, -(2**31)], np.int32)
    np.testing.assert_array_equal(Tensor(integers).abs().numpy(), np.abs(integers))


# ---- 6. float64 tanh --------------------------------------------------------------------------------------------------


def test_tanh_float64():
    # float64 used float32's series below 0.625: tanh(0.3) was 4.4e-9 off
    values = np.concatenate([magnitudes(1e-300, 30, 200), np.linspace(-1, 1, 101), [0.3, 0.4999999, 0.5, 0.625]])
    assert_ulps(Tensor(values).tanh().numpy(), np.tanh(values), np.float64, 4, values)


def test_tanh_float32_unchanged():
    values = np.concatenate([magnitudes(1e-30, 30, 200), np.linspace(-1, 1, 101)]).astype(np.float32)
    assert_ulps(Tensor(values).tanh().numpy(), np.tanh(values.astype(np.float64)), np.float32, 2, values)


# ---- gradients and kernels ----------------------------------------------------------------------------------------

GRADIENTS = {
    "sinh": (lambda x: x.sinh(), lambda x: x.sinh(), [-5, -1.0, -0.999, -1e-6, 0, 1e-3, 0.5, 1.0, 1.001, 8]),
    "asinh": (lambda x: x.asinh(), lambda x: x.asinh(), [-1e8, -50, -1, -1e-6, 0, 1e-3, 0.7, 3, 1e5]),
    "acosh": (lambda x: x.acosh(), lambda x: x.acosh(), [1.0001, 1.001, 1.2, 1.5, 3, 10, 1e5, 1e8]),
    "atanh": (lambda x: x.atanh(), lambda x: x.atanh(), [-0.999, -0.5, -1 / 3, -1e-6, 0, 1e-3, 0.3, 0.9]),
    "erf": (lambda x: x.erf(), lambda x: x.erf(), [-5, -0.76, -0.75, -1e-6, 0, 1e-3, 0.5, 0.7499, 1.2, 3.3]),
    "gelu": (
        lambda x: x.gelu(approximate="none"),
        lambda x: torch.nn.functional.gelu(x),
        [-3, -1, -1e-6, 0, 1e-3, 0.5, 2, 6],
    ),
    "tanh": (lambda x: x.tanh(), lambda x: x.tanh(), [-30, -0.7, -0.5, -1e-6, 0, 1e-3, 0.3, 0.4999, 0.6, 4]),
    "abs": (lambda x: x.abs(), lambda x: x.abs(), [-3, -1e-6, 0, 1e-3, 2]),
}


@pytest.mark.parametrize("name", list(GRADIENTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradients_match_torch(name, dtype):
    lazy_fn, torch_fn, values = GRADIENTS[name]
    values = np.array(values, dtype)
    x = Tensor(values)
    (grad,) = lazy_fn(x).sum().gradient(x)
    # torch's slopes in float64 at the same inputs: its float32 ones cancel (acosh'(1.0001) from x^2 - 1 is 2.5e-5
    # off, tanh'(4) from 1 - tanh^2 4e-5)
    reference = torch.tensor(values.astype(np.float64), requires_grad=True)
    torch_fn(reference).sum().backward()
    # (erf's slope beyond 0.75 and gelu's are the erfc fit's, within 3e-8 in float64 too; float32's exp(-x^2) takes
    # the rounding of x^2 along: x^2 ulp off)
    fitted = name in ("erf", "gelu")
    rtol = (1e-5 if fitted else 1e-6) if dtype == np.float32 else (1e-7 if fitted else 1e-12)
    np.testing.assert_allclose(grad.numpy(), reference.grad.numpy(), rtol=rtol, atol=1e-20)


# forward-with-backward kernels of a 1024x1024 float32 and float16 tensor (the scheduler stores a costly value that
# both the forward and the backward kernel would compute: Horner's partial sums were such values), none more than
# before these fixes (tanh had 6 and 7, atanh 2 and 3, erf 12 and 14)
KERNELS = {
    "abs": (lambda x: x.abs(), 2, 2),
    "sinh": (lambda x: x.sinh(), 2, 2),
    "asinh": (lambda x: x.asinh(), 4, 4),
    "acosh": (lambda x: x.acosh(), 3, 3),
    "acosh_above_one": (lambda x: (x.abs() + 1).acosh(), 4, 4),
    # (float16: x * 0.1 is computed in float32 and rounded once, as torch does, no longer in half with 0.1 rounded to
    # half first; the casts around it make the value of atanh's quotient costly enough for a buffer of its own)
    "atanh": (lambda x: (x * 0.1).atanh(), 2, 3),
    "erf": (lambda x: x.erf(), 12, 13),
    "gelu": (lambda x: x.gelu(approximate="none"), 13, 15),
    "tanh": (lambda x: x.tanh(), 3, 4),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_counts(name):
    function, *most = KERNELS[name]
    rng = np.random.default_rng(0)
    for dtype, kernels in zip((np.float32, np.float16), most):
        x = Tensor(rng.standard_normal((1024, 1024)).astype(dtype))
        assert len(function(x).schedule()) == 1
        y = function(x)
        (grad,) = y.sum().gradient(x)
        assert len(y.schedule(grad)) <= kernels, f"{np.dtype(dtype).name}: {len(y.schedule(grad))} kernels"


def test_atan2_matches_torch_with_signed_zeros_infinities_and_gradients():
    import itertools

    values = [0.0, -0.0, 1.0, -1.0, 2.5, -3.0, np.inf, -np.inf, np.nan, 1e-30, -1e30, 0.5]
    ys, xs = (np.array(column, np.float32) for column in zip(*itertools.product(values, values)))
    got = Tensor(ys).atan2(Tensor(xs)).numpy()
    expected = torch.atan2(torch.tensor(ys), torch.tensor(xs)).numpy()
    np.testing.assert_allclose(got, expected, rtol=3e-7)
    assert (np.signbit(got) == np.signbit(expected))[~np.isnan(expected)].all()  # atan2(-0, 1) is -0, (0, -1) pi
    rng = np.random.default_rng(0)
    y, x = (rng.standard_normal(200).astype(np.float32) * 10 for _ in range(2))
    y[:3], x[:3] = [1.0, -2.0, 0.0], [1.0, -2.0, 3.0]  # diagonals (equal magnitudes) and the axis
    ty, tx = Tensor(y, requires_grad=True), Tensor(x, requires_grad=True)
    ty.atan2(tx).sum().backward()
    ry, rx = torch.tensor(y, requires_grad=True), torch.tensor(x, requires_grad=True)
    torch.atan2(ry, rx).sum().backward()
    np.testing.assert_allclose(ty.grad.numpy(), ry.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-5, atol=1e-7)


HALF_POSITIVE = np.arange(0x0001, 0x7C00, dtype=np.uint16).view(np.float16)  # every positive finite float16
HALF_SYMMETRIC = np.concatenate([HALF_POSITIVE[HALF_POSITIVE < 12], -HALF_POSITIVE[HALF_POSITIVE < 12]])


def half_ulps(got: np.ndarray, exact: np.ndarray) -> float:
    """The largest error of float16 results, in units in the last place of the exact values (normal ones)."""
    normal = np.isfinite(exact) & (np.abs(exact) > 6.2e-5)
    ulp = np.spacing(np.abs(exact[normal]).astype(np.float16)).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64)[normal] - exact[normal]) / ulp))


@pytest.mark.parametrize(
    "name, values",
    [("log", HALF_POSITIVE), ("rsqrt", HALF_POSITIVE), ("sigmoid", HALF_SYMMETRIC), ("tanh", HALF_SYMMETRIC)],
)
def test_float16_functions_round_once(name, values):
    # computed in float32 and rounded once, as torch's: log rounded log2, then its product by ln 2 (1.2 ulp off),
    # rsqrt a square root, then its reciprocal (1.3 ulp)
    exact = getattr(torch, name)(torch.tensor(values.astype(np.float64))).numpy()
    assert half_ulps(getattr(Tensor(values), name)().numpy(), exact) <= 0.51


def test_float16_softmax_rounds_once():
    rows = (np.random.default_rng(0).standard_normal((256, 64)) * 4).astype(np.float16)
    for name in ("softmax", "log_softmax"):
        exact = getattr(torch.tensor(rows.astype(np.float64)), name)(-1).numpy()
        got = getattr(Tensor(rows), name)(-1)
        assert got.dtype == dtypes.float16 and half_ulps(got.numpy(), exact) <= 0.51, name  # (softmax: 8.9 ulp)
