"""Fixes from a gradient hunt against torch.autograd: rounding's slope for large values, maximum's and abs's under an
infinite gradient, float64 atan/asin/acos, copysign at 0, and second derivatives of prod, cumprod and pow at 0.

Every shape is small: the file runs on any device, including the slow PYTHON emulator.
"""

import numpy as np
import pytest

from lazygrad import Tensor

INF = float("inf")


def gradients(function, *values, dtype=np.float32, upstream=None):
    """The gradient of sum(function(*inputs) * upstream) in each input."""
    inputs = [Tensor(np.array(value, dtype), requires_grad=True) for value in values]
    out = function(*inputs)
    (out if upstream is None else out * Tensor(np.array(upstream, dtype))).sum().backward()
    return [tensor.grad.numpy() for tensor in inputs]


def torch_gradients(torch, function, *values, dtype=np.float32, upstream=None):
    inputs = [torch.tensor(np.array(value, dtype), requires_grad=True) for value in values]
    out = function(*inputs)
    (out if upstream is None else out * torch.tensor(np.array(upstream, dtype))).sum().backward()
    return [tensor.grad.numpy() for tensor in inputs]


def second_derivative(function, values):
    """d/dx of sum(d/dx sum(function(x))), through `Tensor.gradient` twice."""
    x = Tensor(np.array(values, np.float32), requires_grad=True)
    (first,) = function(x).sum().gradient(x)
    (second,) = first.sum().gradient(x)
    return second.numpy()


def torch_second_derivative(torch, function, values):
    x = torch.tensor(np.array(values, np.float32), requires_grad=True)
    (first,) = torch.autograd.grad(function(x).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), x)
    return second.numpy()


def assert_same(ours, theirs, rtol=1e-6):
    for got, expected in zip(ours, theirs):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=0)


# ---- 1. rounding: slope 0 for values past the integer range too -----------------------------------------------------


@pytest.mark.parametrize("name", ["floor", "ceil", "round", "trunc"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rounding_slope_is_zero_for_large_values(torch, name, dtype):
    """Values of 2**31 (float64: 2**52) and more are their own rounding; their slope was 1 rather than 0."""
    values = [3e9, -3e9, 1e20, 2.0**53, 2.5, -INF]
    ours = gradients(lambda x: getattr(x, name)(), values, dtype=dtype, upstream=[INF] * 6)
    assert_same(ours, torch_gradients(torch, lambda x: getattr(x, name)(), values, dtype=dtype))


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_rounded_division_has_no_slope_for_large_quotients(torch, mode):
    """A quotient of 2**31 or more passed about -q/y to the divisor (-1.1e19 for 1e20 / 3)."""
    values = ([1e20, 7.0, -1e10], [3.0, 2.0, 0.5])
    ours = gradients(lambda x, y: x.div(y, rounding_mode=mode), *values)
    assert_same(ours, torch_gradients(torch, lambda x, y: x.div(y, rounding_mode=mode), *values))
    # (torch has no derivative for floor_divide; `//` is floor division, so its slopes are 0 as well)
    for grad in gradients(lambda x, y: x // y, *values):
        np.testing.assert_array_equal(grad, 0.0)


# ---- 2. maximum, minimum and abs under an infinite gradient ----------------------------------------------------------


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_binary_max_gives_the_loser_zero_of_an_infinite_gradient(torch, name):
    """The loser's share was the gradient times 0, nan for an infinite gradient; a tie still splits it in halves,
    and beside a nan both get the gradient, as in torch."""
    values = ([1.0, 0.1, 0.5, 2.0, float("nan")], [0.5, 0.5, 0.5, 3.0, 1.0])
    upstream = [INF, -INF, INF, 1.0, 2.0]
    ours = gradients(lambda x, y: getattr(x, name)(y), *values, upstream=upstream)
    assert_same(ours, torch_gradients(torch, lambda x, y: getattr(torch, name)(x, y), *values, upstream=upstream))


def test_abs_and_pow_pass_infinite_slopes(torch):
    """abs is max(x, -x), so an infinite slope through it was nan: |x|**-2, and pow (whose log takes |x|) at 1e-20."""
    tiny = [1e-30, -1e-30, 2.0]
    assert_same(gradients(lambda x: x.abs() ** -2, tiny), torch_gradients(torch, lambda x: x.abs() ** -2, tiny))
    assert_same(
        gradients(lambda x: (x.abs() - 1e-30).sqrt(), [1e-30, 2.0]),
        torch_gradients(torch, lambda x: (x.abs() - 1e-30).sqrt(), [1e-30, 2.0]),
    )
    exponent = np.array([-1.0, -2.0, -1.5], np.float32)
    ours = gradients(lambda x: x ** Tensor(exponent), [1e-20] * 3)
    assert_same(ours, torch_gradients(torch, lambda x: x ** torch.tensor(exponent), [1e-20] * 3))


# ---- 3. float64 atan, asin and acos ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["atan", "asin", "acos"])
def test_float64_inverse_trigonometry_is_float64_accurate(torch, name):
    """pi/4 and pi/2 were float32 constants and the series a float32 fit: 4e-8 off rather than 1e-16."""
    values = [0.1, 0.5, 0.9, 1.0, -0.3] + ([3.0, -40.0] if name == "atan" else [])
    x = Tensor(np.array(values), requires_grad=True)
    out = getattr(x, name)()
    out.sum().backward()
    reference = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    expected = getattr(reference, name)()
    expected.sum().backward()
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-15, atol=0)
    finite = np.isfinite(reference.grad.numpy())
    np.testing.assert_allclose(x.grad.numpy()[finite], reference.grad.numpy()[finite], rtol=1e-13, atol=0)


# ---- 4. copysign at 0 ---------------------------------------------------------------------------------------------


def test_copysign_slope_at_zero_is_zero(torch):
    """torch's slope of copysign at +-0 is 0 (it was +-1); the result keeps the sign of the second operand."""
    values = ([0.0, -0.0, 1.0, -2.0], [-1.0, 1.0, -1.0, 3.0])
    x = Tensor(np.array(values[0], np.float32))
    result = x.copysign(Tensor(np.array(values[1], np.float32))).numpy()
    np.testing.assert_array_equal(np.signbit(result), np.signbit(np.copysign(values[0], values[1])))
    sign = np.array(values[1], np.float32)
    ours = gradients(lambda x: x.copysign(Tensor(sign)), values[0], upstream=[INF, 1.0, 2.0, 3.0])
    theirs = torch_gradients(torch, lambda x: torch.copysign(x, torch.tensor(sign)), values[0], upstream=[1, 1, 2, 3])
    assert_same(ours, theirs)


# ---- 5. second derivatives with a zero -------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[2.0, 0.0, 3.0], [2.0, 3.0, 4.0], [1e30, 1e30, 0.0]])
def test_prod_second_derivative_with_one_zero(torch, values):
    """With one zero, the others' shares (0) were constants, so their slope in the zero (the product of the rest) was
    lost; the first derivative stays finite where the product of the rest overflows."""
    x = Tensor(np.array(values, np.float32), requires_grad=True)
    (first,) = x.prod().gradient(x)
    reference = torch.tensor(values, requires_grad=True)
    (expected,) = torch.autograd.grad(reference.prod(), reference, create_graph=True)
    np.testing.assert_allclose(first.numpy(), expected.detach().numpy(), rtol=1e-6)
    if max(values) < 1e10:
        ours, theirs = second_derivative(lambda x: x.prod(), values), torch_second_derivative(torch, torch.prod, values)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_cumprod_second_derivative_with_one_zero(torch):
    values = [2.0, 0.0, 3.0, 4.0]
    ours = second_derivative(lambda x: x.cumprod(0), values)
    np.testing.assert_allclose(ours, torch_second_derivative(torch, lambda x: x.cumprod(0), values), rtol=1e-6)


def test_square_by_tensor_exponent_second_derivative_at_zero(torch):
    """x ** y for a tensor y = 2 at x = 0: the second derivative is 2 (it was 0); odd and larger powers keep 0."""
    exponent = np.array([2.0, 2.0, 2.0, 3.0, 4.0], np.float32)
    values = [0.0, -0.0, 1.5, 0.0, 0.0]
    ours = second_derivative(lambda x: x ** Tensor(exponent), values)
    theirs = torch_second_derivative(torch, lambda x: x ** torch.tensor(exponent), values)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
