"""Numerics on the selected device: NaN propagated as PyTorch propagates it, sin/cos/tan within a few ulp over the
whole float32 range, and integer ops defined for every input (wrap-around, division by zero and of the most negative
value by -1, out-of-range shifts, floor division of negative operands).

The same file runs on every device (chosen by environment variables, as for test_ops.py); tensors stay small, so it
is quick on the PYTHON emulator too. Values are checked against PyTorch (CPU) or NumPy. Two tests read generated
source: C kernels are compiled with the undefined-behaviour sanitizer and run on every hazard, and LLVM IR must carry
no wrap flags on arithmetic that can overflow.
"""

import ctypes
import math
import shutil
import subprocess
import warnings

import numpy as np
import pytest

from lazygrad import Tensor, dtypes
from lazygrad.codegen.linearize import linearize
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.renderer.cstyle import CStyleRenderer
from lazygrad.codegen.renderer.llvmir import LLVMRenderer
from lazygrad.uop.ops import Ops

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN = -(2**63)
INTEGER_DTYPES = {dtypes.int32: np.int32, dtypes.int64: np.int64}


def numpy_quietly(function, *arguments, **options):
    """A NumPy result computed without its warnings about overflow and division by zero (those are the cases)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return function(*arguments, **options)


# ---- NaN -----------------------------------------------------------------------------------------------------------

ROWS_WITH_NAN = np.array(
    [
        [1.0, NAN, 3.0, NAN],  # the first NaN, not the last, not the largest number
        [NAN, 5.0, 1.0, 0.0],
        [2.0, 5.0, 5.0, -INF],  # no NaN: the first of the tied maxima
        [NAN, NAN, NAN, NAN],
        [-INF, -INF, INF, NAN],
    ],
    dtype=np.float32,
)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_and_argmin_point_at_the_first_nan(name):
    rows = Tensor(ROWS_WITH_NAN)
    for axis in (1, 0, None):
        expected = getattr(torch.tensor(ROWS_WITH_NAN), name)(dim=axis).numpy()
        np.testing.assert_array_equal(getattr(rows, name)(axis).numpy(), expected, err_msg=f"{name} axis={axis}")
    np.testing.assert_array_equal(rows.argmax(1, keepdim=True).numpy(), [[1], [0], [1], [0], [3]])


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_reductions_propagate_nan(name):
    rows, reference = Tensor(ROWS_WITH_NAN), torch.tensor(ROWS_WITH_NAN)
    torch_name = {"max": "amax", "min": "amin"}[name]
    for axis in (1, 0):
        expected = getattr(reference, torch_name)(dim=axis).numpy()
        np.testing.assert_array_equal(getattr(rows, name)(axis).numpy(), expected, err_msg=f"{name} axis={axis}")
    assert np.isnan(getattr(rows, name)().numpy())


def test_maximum_and_minimum_propagate_nan():
    a = np.array([NAN, 1.0, NAN, -INF, 2.0, 0.0], dtype=np.float32)
    b = np.array([1.0, NAN, NAN, NAN, 3.0, -0.0], dtype=np.float32)
    for name in ("maximum", "minimum"):
        expected = getattr(torch, name)(torch.tensor(a), torch.tensor(b)).numpy()
        np.testing.assert_array_equal(getattr(Tensor(a), name)(Tensor(b)).numpy(), expected, err_msg=name)
        np.testing.assert_array_equal(getattr(Tensor(a), name)(2.0).numpy(), getattr(np, name)(a, 2.0))


def test_relu_passes_nan_and_its_gradient():
    values = np.array([NAN, -1.0, 0.0, 2.0, -INF, INF], dtype=np.float32)
    x, reference = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    x.relu().sum().backward()
    torch.relu(reference).sum().backward()
    np.testing.assert_array_equal(x.relu().numpy(), torch.relu(reference).detach().numpy())
    np.testing.assert_array_equal(x.grad.numpy(), reference.grad.numpy())
    np.testing.assert_array_equal(Tensor(values).relu6().numpy(), torch.nn.functional.relu6(torch.tensor(values)))


def test_max_gradients_split_ties_as_torch_does():
    values = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [-1.0, 0.0, -2.0, 0.0]], dtype=np.float32)
    other = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 4.0, 5.0], [-1.0, 0.0, -3.0, 1.0]], dtype=np.float32)
    for reduce, torch_reduce in ((Tensor.max, torch.amax), (Tensor.min, torch.amin)):
        x, reference = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
        (reduce(x, 1) * Tensor([1.0, 2.0, 3.0])).sum().backward()
        (torch_reduce(reference, 1) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), err_msg=torch_reduce.__name__)
    for name in ("maximum", "minimum"):
        x, y = Tensor(values, requires_grad=True), Tensor(other, requires_grad=True)
        reference_x, reference_y = torch.tensor(values, requires_grad=True), torch.tensor(other, requires_grad=True)
        getattr(x, name)(y).sum().backward()
        getattr(torch, name)(reference_x, reference_y).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), reference_x.grad.numpy(), err_msg=name)
        np.testing.assert_allclose(y.grad.numpy(), reference_y.grad.numpy(), err_msg=name)


# ---- sin, cos, tan -------------------------------------------------------------------------------------------------


def ulp_distance(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """How many representable values apart two float arrays of the same dtype are, elementwise (0 for equal values,
    NaN with NaN included, and for +0 with -0)."""
    bits = {np.dtype(np.float32): np.int32, np.dtype(np.float16): np.int16}[got.dtype]
    ordered = []
    for values in (got, expected):
        integers = values.view(bits).astype(np.int64)
        magnitude = integers & (np.iinfo(bits).max)
        ordered.append(np.where(integers < 0, -magnitude, magnitude))
    distance = np.abs(ordered[0] - ordered[1])
    both_nan = np.isnan(got) & np.isnan(expected)
    return np.where(both_nan, 0, np.where(np.isnan(got) | np.isnan(expected), np.iinfo(np.int64).max, distance))


def trigonometric_sweep() -> np.ndarray:
    """float32 values over the whole range: a log-spaced sweep from the smallest denormal to the largest float (both
    signs), multiples of π/2 (rounded, and their neighbours, where the result is smallest), and the edges."""
    magnitudes = np.logspace(np.log10(1.4e-45), np.log10(3.4028235e38), 240).astype(np.float32)
    multiples = (np.array([1, 2, 3, 4, 5, 7, 11, 100, 1000, 10**5, 10**6, 10**7]) * np.pi / 2).astype(np.float32)
    neighbours = np.concatenate([np.nextafter(multiples, np.float32(INF)), np.nextafter(multiples, np.float32(0))])
    # 16367173·2^72 is the float32 closest to a multiple of π/2, relatively: 2^-29.9 quarter turns from it
    edges = [3.4028235e38, 1.1754944e-38, 1e-40, 1.4e-45, 0.7853982, 2.0**-12, 2.0**-13, 1e5, 16367173 * 2.0**72]
    edges = np.array(edges, np.float32)
    positive = np.concatenate([magnitudes, multiples, neighbours, edges])
    return np.concatenate([positive, -positive, np.float32([0.0, -0.0])]).astype(np.float32)


# the bound on each function's distance from the rounded exact value, in ulps, and NumPy's float32 version's own: the
# polynomials are within 1 ulp for sin and cos and 3 for tan (sin times the reciprocal of cos); CUDA's sinf and cosf
# are documented within 2
TRIGONOMETRIC_ULPS = {"sin": (2, 1), "cos": (2, 1), "tan": (5, 3)}


@pytest.mark.parametrize("name", list(TRIGONOMETRIC_ULPS))
def test_trigonometric_functions_over_the_whole_float32_range(name):
    ulps, numpy_ulps = TRIGONOMETRIC_ULPS[name]
    x = trigonometric_sweep()
    got = getattr(Tensor(x), name)().numpy()
    exact = getattr(np, name)(x.astype(np.float64)).astype(np.float32)  # the float64 result, rounded once
    distance = ulp_distance(got, exact)
    worst = int(np.argmax(distance))
    assert distance.max() <= ulps, f"{name}({x[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}"
    assert ulp_distance(got, getattr(np, name)(x)).max() <= ulps + numpy_ulps


@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_trigonometric_functions_at_special_values(name):
    special = np.array([INF, -INF, NAN, 0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38], dtype=np.float32)
    got = getattr(Tensor(special), name)().numpy()
    expected = numpy_quietly(getattr(np, name), special)
    assert np.all(np.isnan(got[:3])), f"{name} of inf, -inf, nan: {got[:3]}"
    np.testing.assert_array_equal(got[3:], expected[3:])  # denormals: sin(x) = tan(x) = x, cos(x) = 1
    np.testing.assert_array_equal(np.signbit(got[3:]), np.signbit(expected[3:]))  # sin(-0) is -0


def test_trigonometric_gradients_at_large_arguments():
    values = np.array([1e20, -3.4e38, 123456.7, 1.5707964, 1e-30], dtype=np.float32)
    for name, derivative in (("sin", np.cos), ("cos", lambda v: -np.sin(v))):
        x = Tensor(values, requires_grad=True)
        getattr(x, name)().sum().backward()
        expected = derivative(values.astype(np.float64)).astype(np.float32)
        assert ulp_distance(x.grad.numpy(), expected).max() <= 2, f"d/dx {name}: {x.grad.numpy()} vs {expected}"


def test_half_precision_sin_and_cos():
    x = np.concatenate([np.linspace(-60000, 60000, 64), np.linspace(-7, 7, 64)]).astype(np.float16)
    for name in ("sin", "cos"):
        got = getattr(Tensor(x), name)().numpy()
        exact = getattr(np, name)(x.astype(np.float64)).astype(np.float16)
        assert got.dtype == np.float16 and ulp_distance(got, exact).max() <= 1, name


# ---- exp ------------------------------------------------------------------------------------------------------------


def test_exp_is_within_an_ulp_over_its_whole_range():
    # exp(x) was exp2 of the rounded product x·log2 e: 64 ulp off near x = 88 (and a half exp 10 ulp off at x = 10)
    x = np.concatenate([np.linspace(-104, 88.72, 4001), np.linspace(-1, 1, 801), [1e-30, -1e-30]]).astype(np.float32)
    got = Tensor(x).exp().numpy()
    exact = np.exp(x.astype(np.float64)).astype(np.float32)  # the float64 result, rounded once
    distance = ulp_distance(got, exact)
    worst = int(np.argmax(distance))
    assert distance.max() <= 1, f"exp({x[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}"
    special = np.array([INF, -INF, NAN, 0.0, -0.0, 88.73, 89.0, -104.0, -1e30, 1e30], np.float32)
    np.testing.assert_array_equal(Tensor(special).exp().numpy(), numpy_quietly(np.exp, special))
    half = np.linspace(-16, 11, 2001).astype(np.float16)
    got = Tensor(half).exp().numpy()
    assert got.dtype == np.float16
    assert ulp_distance(got, np.exp(half.astype(np.float64)).astype(np.float16)).max() <= 1


def test_float64_exp_is_within_an_ulp_over_its_whole_range():
    # exp2 of the rounded product x·log2 e in float64 was 393 ulp off near x = -507 (and sigmoid, sinh, pow with it)
    x = np.concatenate([np.linspace(-708, 709.7, 3001), np.linspace(-1, 1, 401), [-507.43102117282524, 1e-300]])
    got = Tensor(x).exp().numpy()
    exact = np.exp(x.astype(np.longdouble))  # (x86's 64-bit significand: 11 bits past float64's)
    ulps = np.abs(got - exact) / np.spacing(exact.astype(np.float64))
    worst = int(np.argmax(ulps))
    assert ulps.max() <= 1, f"exp({x[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}"
    special = np.array([INF, -INF, NAN, 0.0, -0.0, 709.79, -745.0, -745.2, -1e300, 1e300])
    np.testing.assert_array_equal(Tensor(special).exp().numpy(), numpy_quietly(np.exp, special))


# ---- integers ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.uint32])
def test_min_and_argmin_at_the_ends_of_the_integer_range(dtype):
    np_dtype = {dtypes.uint32: np.uint32, **INTEGER_DTYPES}[dtype]
    info = np.iinfo(np_dtype)
    values = np.array([[5, info.min, -3 if info.min else 3, info.max], [info.max, 7, info.min, 0]], dtype=np_dtype)
    x = Tensor(values, dtype=dtype)
    np.testing.assert_array_equal(x.min().numpy(), values.min())
    np.testing.assert_array_equal(x.min(1).numpy(), values.min(1))
    np.testing.assert_array_equal(x.argmin(1).numpy(), values.argmin(1))
    np.testing.assert_array_equal(x.argmin().numpy(), values.argmin())
    np.testing.assert_array_equal(x.max(0).numpy(), values.max(0))
    np.testing.assert_array_equal(x.argmax(0).numpy(), values.argmax(0))
    np.testing.assert_array_equal(x.minimum(x.flip(1)).numpy(), np.minimum(values, values[:, ::-1]))


@pytest.mark.parametrize("dtype", list(INTEGER_DTYPES))
def test_integer_arithmetic_wraps_around(dtype):
    np_dtype = INTEGER_DTYPES[dtype]
    info = np.iinfo(np_dtype)
    a = np.array([info.max, info.min, info.min, info.max, -1, 3, info.max // 2 + 7], dtype=np_dtype)
    b = np.array([1, -1, info.min, info.max, info.min, info.max, 3], dtype=np_dtype)
    x, y = Tensor(a, dtype=dtype), Tensor(b, dtype=dtype)
    for name, function in (("+", np.add), ("-", np.subtract), ("*", np.multiply)):
        got = {"+": x + y, "-": x - y, "*": x * y}[name].numpy()
        np.testing.assert_array_equal(got, numpy_quietly(function, a, b), err_msg=name)
    np.testing.assert_array_equal((-x).numpy(), numpy_quietly(np.negative, a))
    np.testing.assert_array_equal(x.sum().numpy(), numpy_quietly(np.sum, a, dtype=np_dtype))
    np.testing.assert_array_equal((x + 1).numpy(), numpy_quietly(np.add, a, np_dtype(1)))


def floor_division_cases(np_dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every sign combination, exact and inexact, the most negative value over -1 and 1, and zero divisors."""
    low = np.iinfo(np_dtype).min
    a = np.array([7, -7, 7, -7, 6, -6, 6, -6, 0, low, low, low, low + 1, 5, -5, 0, low], dtype=np_dtype)
    b = np.array([2, 2, -2, -2, 3, 3, -3, -3, -4, -1, 1, 7, -1, 0, 0, 0, 0], dtype=np_dtype)
    return a, b


@pytest.mark.parametrize("dtype", list(INTEGER_DTYPES))
def test_floor_division_and_modulo_match_torch(dtype):
    a, b = floor_division_cases(INTEGER_DTYPES[dtype])
    nonzero = b != 0
    x, y = Tensor(a, dtype=dtype), Tensor(b, dtype=dtype)
    quotient, remainder = (x // y).numpy(), (x % y).numpy()
    expected_quotient = torch.div(torch.tensor(a[nonzero]), torch.tensor(b[nonzero]), rounding_mode="floor")
    np.testing.assert_array_equal(quotient[nonzero], expected_quotient.numpy())
    np.testing.assert_array_equal(
        remainder[nonzero], torch.remainder(torch.tensor(a[nonzero]), torch.tensor(b[nonzero]))
    )
    # integer division by zero is 0, and so is the remainder (NumPy's choice; PyTorch raises)
    np.testing.assert_array_equal(quotient[~nonzero], 0)
    np.testing.assert_array_equal(remainder[~nonzero], 0)
    np.testing.assert_array_equal(quotient, numpy_quietly(np.floor_divide, a, b))
    np.testing.assert_array_equal(remainder, numpy_quietly(np.remainder, a, b))


def test_division_by_scalars_zero_and_minus_one():
    a = np.array([7, -7, 0, INT32_MIN, INT32_MAX], dtype=np.int32)
    x = Tensor(a)
    np.testing.assert_array_equal((x // 0).numpy(), np.zeros(5, np.int32))
    np.testing.assert_array_equal((x % 0).numpy(), np.zeros(5, np.int32))
    np.testing.assert_array_equal((x // -1).numpy(), numpy_quietly(np.floor_divide, a, np.int32(-1)))
    np.testing.assert_array_equal((x % -1).numpy(), np.zeros(5, np.int32))
    np.testing.assert_array_equal((5 // Tensor(np.array([0, 2, -2], np.int32))).numpy(), [0, 2, -3])
    # float division follows IEEE: x // 0.0 is ±inf (nan for 0), x % 0.0 is nan, as in torch
    floats = np.array([7.0, -7.0, 0.0], dtype=np.float32)
    np.testing.assert_array_equal((Tensor(floats) // 0.0).numpy(), (torch.tensor(floats) // 0.0).numpy())
    assert np.isnan((Tensor(floats) % 0.0).numpy()).all()


FLOAT_DTYPES = {dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}


def float_division_cases(np_dtype) -> tuple[np.ndarray, np.ndarray]:
    """Every sign combination, quotients far beyond the integers the dtype holds, zeros, infinities and NaN; 16 times
    over, so vector lanes compute them too."""
    big, inf, nan = float(np.finfo(np_dtype).max) / 4, np.inf, np.nan
    a = [7.5, -7.5, 7.5, -7.5, 6, -6, 6, -6, 0.5, -0.5, 0, big, -big, big, 1000, inf, -inf, 5, -5, 5, nan, 5, -5]
    b = [2, 2, -2, -2, 3, 3, -3, -3, -3, -3, -3, 3, 3, -0.1, 1e-3, 3, 3, inf, inf, -inf, 1, 0, 0]
    a, b = a + [-4.816965e08, 3e9 + 0.5], b + [49.037052, -1.5]  # (quotients near 2**23 and 2**31)
    return np.tile(numpy_quietly(np.array, a, np_dtype), 16), np.tile(numpy_quietly(np.array, b, np_dtype), 16)


@pytest.mark.parametrize("dtype", list(FLOAT_DTYPES))
def test_float_remainders_are_exact(dtype):
    """% (torch's remainder) and fmod of floats are exact however large the quotient (1e10 % 3.0 is 1.0), with
    Python's infinities and NaNs, as NumPy's are (torch's vectorized remainder and fmod are not: NaN for 8.5e37 % -0.1); //
    is exact while the quotient is an integer the dtype holds."""
    a, b = float_division_cases(FLOAT_DTYPES[dtype])
    x, y = Tensor(a, dtype=dtype), Tensor(b, dtype=dtype)
    np.testing.assert_array_equal((x % y).numpy(), numpy_quietly(np.remainder, a, b))
    np.testing.assert_array_equal(x.fmod(y).numpy(), numpy_quietly(np.fmod, a, b))
    quotient, expected = (x // y).numpy(), numpy_quietly(np.floor_divide, a, b)
    held = ~(np.abs(expected) >= 2.0 ** np.finfo(a.dtype).nmant)
    np.testing.assert_array_equal(quotient[held], expected[held])
    np.testing.assert_allclose(quotient[~held], expected[~held], rtol=4 * float(np.finfo(a.dtype).eps))
    # folded on constants in Python, the same values
    cases = len(a) // 16
    folded = [(Tensor.full((), float(p), dtype=dtype) % float(q)).item() for p, q in zip(a[:cases], b[:cases])]
    np.testing.assert_array_equal(np.array(folded, a.dtype), numpy_quietly(np.remainder, a[:cases], b[:cases]))
    # a Python infinity on either side (a double's constant was a float's in C: fmod was ambiguous)
    np.testing.assert_array_equal((x % math.inf).numpy(), numpy_quietly(np.remainder, a, np.inf).astype(a.dtype))
    np.testing.assert_array_equal((math.inf % y).numpy(), numpy_quietly(np.remainder, np.inf, b).astype(a.dtype))


@pytest.mark.parametrize("dtype", list(FLOAT_DTYPES))
def test_true_division_is_correctly_rounded(dtype):
    """x / y is the correctly rounded quotient, as NumPy's and torch's (x * (1/y) gave 21 / 7 = 3.0000002 and missed
    a quarter of all float32 quotients), with IEEE's zeros, infinities and NaN; by tensors, numbers either side,
    and constants folded in Python alike."""
    np_dtype = FLOAT_DTYPES[dtype]
    a, b = float_division_cases(np_dtype)
    random = np.random.default_rng(0)
    a = np.concatenate([a, random.standard_normal(4096).astype(np_dtype), np.arange(1, 65, dtype=np_dtype) * 7])
    b = np.concatenate([b, random.standard_normal(4096).astype(np_dtype), np.full(64, 7, np_dtype)])
    x, y = Tensor(a, dtype=dtype), Tensor(b, dtype=dtype)
    np.testing.assert_array_equal((x / y).numpy(), numpy_quietly(np.divide, a, b))
    # a number beside a half tensor divides in float32, rounded once, as torch's (0.1 is not rounded to half first)
    wide = np.float32 if np_dtype == np.float16 else np_dtype
    for number in (7, 0.1, 3.0, 0.0, -0.0):
        quotient = numpy_quietly(np.divide, a.astype(wide), wide(number)).astype(np_dtype)
        np.testing.assert_array_equal((x / number).numpy(), quotient)
        quotient = numpy_quietly(np.divide, wide(number), b.astype(wide)).astype(np_dtype)
        np.testing.assert_array_equal((number / y).numpy(), quotient)
    cases = len(float_division_cases(np_dtype)[0]) // 16
    folded = [(Tensor.full((), float(p), dtype=dtype) / float(q)).item() for p, q in zip(a[:cases], b[:cases])]
    np.testing.assert_array_equal(np.array(folded, np_dtype), numpy_quietly(np.divide, a[:cases], b[:cases]))


def test_integer_true_division_and_means_are_correctly_rounded():
    """Integers divide as floats, correctly rounded; a mean is the sum divided by the count, so the mean of equal
    values is that value (times 1/7 made the mean of seven 7s 7.0000005)."""
    a, b = np.arange(1, 2001, dtype=np.int32), np.arange(2000, 0, -1, dtype=np.int32)
    expected = torch.tensor(a * b) / torch.tensor(b)
    np.testing.assert_array_equal((Tensor(a * b) / Tensor(b)).numpy(), expected.numpy())
    for count in (3, 7, 49, 59):
        for value in (1.25, 3.0, 7.0):  # (sums exact in any order: the division alone rounds)
            rows = np.full((2, count), value, np.float32)
            np.testing.assert_array_equal(Tensor(rows).mean(1).numpy(), torch.tensor(rows).mean(1).numpy())
    assert Tensor([7.0] * 7).mean().item() == 7.0


def test_division_gradients_match_torch():
    a, b = np.random.default_rng(1).standard_normal((2, 257)).astype(np.float32)
    x, y = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    (x / y / 3).sum().backward()
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (tx / ty / 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-6)


def test_division_by_a_power_of_two_is_a_multiply():
    """x / 2**k is x · 2**-k, exactly, so it costs a multiply (where the dtype holds 2**-k: not 2**130 in float32)."""
    x = Tensor([3.0, -5.0])
    assert (x / 4).uop.op is Ops.MUL and (x / 3).uop.op is Ops.FDIV and (x / 2.0**-130).uop.op is Ops.FDIV
    np.testing.assert_array_equal((x / 4).numpy(), [0.75, -1.25])
    tiny = np.float32([3e-30, -5e-30])
    np.testing.assert_array_equal((Tensor(tiny) / 2.0**-130).numpy(), tiny / np.float32(2.0**-130))


def test_half_division_by_a_tiny_half_is_rounded_once():
    """In float32, rounded to half once, as torch: 1/y of a half below 2**-16 was inf, and so was x/y."""
    a, b = np.array([4.4e-4, -7.1e-5, 1.0], np.float16), np.array([-6e-8, 1.4e-5, 3.0], np.float16)
    expected = (torch.tensor(a) / torch.tensor(b)).numpy()
    np.testing.assert_array_equal((Tensor(a) / Tensor(b)).numpy(), expected)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
def test_float_floor_division_is_exact_where_the_quotient_is_an_integer_the_dtype_holds(dtype):
    """(x - fmod(x, y)) / y, rounded to the nearest integer: divided as x * (1/y) in the dtype itself, a sixth of
    float32 quotients near 2**23 were one off)"""
    rng = np.random.default_rng(3)
    np_dtype = FLOAT_DTYPES[dtype]
    b = (rng.uniform(1, 100, 4000) * rng.choice([-1, 1], 4000)).astype(np_dtype)
    limit = 2.0 ** (np.finfo(np_dtype).nmant - 1)
    a = (b.astype(np.float64) * rng.uniform(-limit, limit, 4000)).astype(np_dtype)
    np.testing.assert_array_equal((Tensor(a) // Tensor(b)).numpy(), np.floor_divide(a, b))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64])
def test_rounding_keeps_the_fractions_of_large_values(dtype):
    """float64 holds fractions up to 2**52 (floor went through int32: 3e9 + 0.5 came back unchanged)."""
    values = np.array([3e9 + 0.5, -3e9 - 0.5, 2.0**52 - 0.5, -(2.0**52) + 1.5, 2.5, -2.5, 1e300, np.nan, -np.inf])
    values = numpy_quietly(values.astype, FLOAT_DTYPES[dtype])
    x = Tensor(values, dtype=dtype)
    for name in ("floor", "ceil", "trunc", "round"):
        np.testing.assert_array_equal(getattr(x, name)().numpy(), getattr(np, name)(values), err_msg=name)


def test_float_remainder_gradients_match_torch():
    a = np.array([7.5, -7.5, 1e10, 3.0, -3.0, 0.25], np.float32)
    b = np.array([2.0, 2.0, 3.0, -2.0, 0.5, -1.0], np.float32)
    weights = np.arange(1, 7, dtype=np.float32)
    for name in ("remainder", "fmod"):
        x, y = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
        (getattr(x, name)(y) * Tensor(weights)).sum().backward()
        tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        (getattr(torch, name)(tx, ty) * torch.tensor(weights)).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy(), err_msg=name)
        np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-6, err_msg=name)


def test_constant_folding_agrees_with_kernels():
    """The simplifier folds ops on constants in Python; the same ops on loaded values run in kernels."""
    a, b = floor_division_cases(np.int32)
    for name, function in (("//", Tensor.__floordiv__), ("%", Tensor.__mod__), ("*", Tensor.__mul__)):
        constants = [Tensor.full((), int(left), dtype=dtypes.int32) for left in a]
        folded = Tensor.stack(*(function(left, int(right)) for left, right in zip(constants, b))).numpy()
        computed = function(Tensor(a), Tensor(b)).numpy()
        np.testing.assert_array_equal(folded, computed, err_msg=name)
        expected = {"//": np.floor_divide, "%": np.remainder, "*": np.multiply}[name]
        np.testing.assert_array_equal(folded, numpy_quietly(expected, a, b), err_msg=name)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32])
def test_shifts_by_any_amount_shift_every_bit_out_as_numpy_and_torch_do(dtype):
    np_dtype = {dtypes.int32: np.int32, dtypes.uint32: np.uint32}[dtype]
    values = np.array([1, 5, 2**31 - 1, 3, 7, 12345, 9, 1], dtype=np.int64)
    amounts = np.resize(np.array([0, 1, 31, 32, 33, 100, 4, 30]), len(values))
    if dtype == dtypes.int32:
        values, amounts = np.concatenate([values, -values, [INT32_MIN]]), np.resize(amounts, 2 * len(values) + 1)
        amounts[1::3] = -amounts[1::3] - 1  # negative amounts shift every bit out too
    a, s = values.astype(np_dtype), amounts.astype(np_dtype)
    x, amount = Tensor(a, dtype=dtype), Tensor(s, dtype=dtype)
    np.testing.assert_array_equal((x << amount).numpy(), np.left_shift(a, s))
    np.testing.assert_array_equal((x >> amount).numpy(), np.right_shift(a, s))
    if dtype == dtypes.int32:  # torch has no shifts of uint32
        np.testing.assert_array_equal((x << amount).numpy(), (torch.tensor(a) << torch.tensor(s)).numpy())
        np.testing.assert_array_equal((x >> amount).numpy(), (torch.tensor(a) >> torch.tensor(s)).numpy())


def test_the_simplifier_does_not_fold_through_overflow():
    unsigned = np.array([2**30 + 5, 3, 2**31, 2**32 - 1], dtype=np.uint32)
    x = Tensor(unsigned)
    np.testing.assert_array_equal(((x * 4) // 4).numpy(), numpy_quietly(lambda v: v * np.uint32(4) // 4, unsigned))
    np.testing.assert_array_equal(((x * 4) % 12).numpy(), numpy_quietly(lambda v: v * np.uint32(4) % 12, unsigned))
    signed = np.array([INT32_MAX, 5, INT32_MAX - 1, -7], dtype=np.int32)
    y = Tensor(signed)
    np.testing.assert_array_equal(((y + 1) < -5).numpy(), numpy_quietly(lambda v: (v + np.int32(1)) < -5, signed))
    np.testing.assert_array_equal(((y * 2) // 2).numpy(), numpy_quietly(lambda v: v * np.int32(2) // 2, signed))


# ---- generated source ----------------------------------------------------------------------------------------------


HAZARD_LEFT = np.array([INT32_MIN, INT32_MAX, -7, 7, 0, INT32_MIN, 5, -1], dtype=np.int32)
HAZARD_RIGHT = np.array([-1, 2, 0, -2, 0, 40, -1, 32], dtype=np.int32)
# int32 kernels over inputs where plain C or LLVM arithmetic would be undefined: overflow, division by 0 and of the
# most negative value by -1, shifts by negative amounts and by the bit width or more
HAZARD_KERNELS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "neg": lambda a, b: -a,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "shl": lambda a, b: a << b,
    "shr": lambda a, b: a >> b,
    "sum": lambda a, b: a.sum(),
    "min": lambda a, b: a.min(),
}


def hazard_kernel(name: str) -> tuple[list, list[np.ndarray], np.ndarray]:
    """One hazard kernel's linear program, the arrays bound to its input parameters (in order), and its output as
    the selected device computes it."""
    left, right = Tensor(HAZARD_LEFT), Tensor(HAZARD_RIGHT)
    result = HAZARD_KERNELS[name](left, right)
    (item,) = [item for item in result.schedule() if item.kind == "kernel"]
    arrays = {left.uop: HAZARD_LEFT, right.uop: HAZARD_RIGHT}
    return linearize(lower_kernel(item.ast)), [arrays[buffer] for buffer in item.buffers[1:]], result.numpy()


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (with the undefined-behaviour sanitizer)")
def test_generated_c_is_free_of_undefined_behaviour(tmp_path, capfd):
    """Every hazard kernel, as the C renderer writes it (C, CUDA and the scalar code of OpenCL share its templates),
    compiled with -fsanitize=undefined and without -fwrapv, runs without a report and computes what the device did."""
    for name in HAZARD_KERNELS:
        program, inputs, expected = hazard_kernel(name)
        source, library = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
        source.write_text(CStyleRenderer().render("kernel", program))
        flags = ["-O1", "-shared", "-fPIC", "-fsanitize=undefined", "-fno-sanitize-recover=undefined"]
        built = subprocess.run(["cc", *flags, str(source), "-o", str(library)], capture_output=True, text=True)
        if built.returncode != 0 and "sanitize" in built.stderr:
            pytest.skip(f"cc cannot build with -fsanitize=undefined: {built.stderr[:300]}")
        assert built.returncode == 0, built.stderr
        output = np.zeros(max(expected.size, 1), np.int32)
        buffers = [output, *(np.ascontiguousarray(array) for array in inputs)]
        kernel = ctypes.CDLL(str(library)).kernel
        # a C kernel takes the buffers' addresses as one array, then the range of its outer loop
        addresses = (ctypes.c_void_p * len(buffers))(*(buffer.ctypes.data for buffer in buffers))
        kernel.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
        kernel(addresses, 0, output.size)
        assert "runtime error" not in capfd.readouterr().err, name
        np.testing.assert_array_equal(output.reshape(expected.shape), expected, err_msg=name)


def test_llvm_ir_has_no_wrap_flags_and_guards_its_divisions():
    for name in HAZARD_KERNELS:
        program, _, _ = hazard_kernel(name)
        lines = LLVMRenderer().render("kernel", program).splitlines()
        flagged = [line for line in lines if " nsw " in line or " nuw " in line]
        # only a loop counter, which stops at its end, may promise not to wrap
        assert all(line.strip().startswith("%L") and line.endswith(", 1") for line in flagged), (name, flagged)
        divisions = [line for line in lines if " sdiv " in line or " srem " in line]
        assert all(line.endswith("_divisor") for line in divisions), (name, divisions)
        shifts = [line for line in lines if " shl " in line or " ashr " in line]
        assert all("_amount" in line or "_shifted" in line for line in shifts), (name, shifts)


def test_variance_of_data_far_from_zero_matches_torch():
    """The variance shifts the values by one of their own, then takes the corrected two-pass form: a float32 sum
    left the mean of 1e6 + noise off by 22 (by 40 for 200,000 values summed one by one), and the variance took its
    square in (477 for a variance of 1, or 0 once the correction's cancellation went below zero)."""
    noise = np.random.default_rng(3).standard_normal((3, 10000))
    for offset in (0.0, 1e4, 1e6):
        x = (offset + noise).astype(np.float32)
        expected = torch.tensor(x).var(1).numpy()
        np.testing.assert_allclose(Tensor(x).var(1).numpy(), expected, rtol=1e-3)
        np.testing.assert_allclose(Tensor(x.T).var(0).numpy(), expected, rtol=1e-3)
        np.testing.assert_allclose(
            Tensor(x).std(1, correction=0).numpy(), torch.tensor(x).std(1, correction=0), rtol=1e-3
        )
    long = (np.random.default_rng(7).standard_normal(200_000) + 1e6).astype(np.float32)
    np.testing.assert_allclose(Tensor(long).std().item(), torch.tensor(long).std().item(), rtol=1e-3)


def test_variance_gradient_is_unchanged_by_the_shift():
    values = (np.random.default_rng(4).standard_normal((3, 4, 5)) + 100).astype(np.float32)
    x, reference = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    x.var((0, 2)).sum().backward()
    reference.var((0, 2)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_mean_of_ints_is_their_exact_sum_divided_once():
    """Ints are summed in int64, as `sum` does, then divided as a float: cast to float32 first, the values' own
    rounding made the mean of [-2**31, 2**31 - 1, 5] 1.667, and 15 int64 values' mean differed between devices."""
    values = np.array([-(2**31), 2**31 - 1, 5], dtype=np.int32)
    assert Tensor(values).mean().item() == np.float32(4 / 3)
    wide = np.random.default_rng(5).integers(-(2**40), 2**40, size=(4, 15))
    np.testing.assert_allclose(Tensor(wide).mean(1).numpy(), wide.mean(1), rtol=1e-6)
    assert Tensor([True, False, True, True]).mean().item() == 0.75
