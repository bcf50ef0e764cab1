"""Forward tests of every Tensor op against NumPy.

The same file runs on every device: the device is chosen by environment variables (`PYTHON=1`, `GPU=1`, ...), so
nothing here names one. The PYTHON device emulates kernels one scalar at a time, so every tensor is small (a few
hundred elements at most; the random-number statistics use 2048).

Each op is checked for values, shape and dtype kind (bool / int / float) on ordinary, 0-d, size-1 and empty shapes,
on non-contiguous views, with broadcasting and negative axes, and for float32, float16 (loose tolerance), int32 and
bool where the op applies. Bad inputs must raise ValueError, TypeError or IndexError (never AssertionError) when the
op is built, with a message naming the offending shapes or axes, and must leave their inputs intact. A few tests
check laziness: building ops runs no kernel; realizing runs them once.
"""

import re

import numpy as np
import pytest

from lazygrad import Device, Tensor, dtypes
from lazygrad.helpers import GlobalCounters

# ---------------------------------------------------------------------------------------------------------------------
# helpers

FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
FLOAT16_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}
NUMPY_DTYPES = {
    dtypes.float32: np.float32,
    dtypes.float16: np.float16,
    dtypes.int32: np.int32,
    dtypes.int64: np.int64,
    dtypes.bool: np.bool_,
}
KIND = {"b": "bool", "i": "int", "u": "int", "f": "float"}


def data(*shape, dtype=np.float32, low=-2.0, high=2.0, seed=0, nonzero=False, integral=False) -> np.ndarray:
    """A small random NumPy array: uniform in [low, high) (ints: [low, high)); bools are fair coin flips.

    `integral` rounds floats to whole numbers so that comparisons see ties; `nonzero` replaces values within 0.5 of
    zero (ints: zero) by +-1.
    """
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind == "i":
        values = rng.integers(int(low), int(high), size=shape)
        if nonzero:
            values = np.where(values == 0, 1, values)
        return np.asarray(values, dtype=dtype)
    values = rng.uniform(low, high, size=shape)
    if integral:
        values = np.round(values)
    if nonzero:
        values = np.where(np.abs(values) < 0.5, np.where(np.signbit(values), -1.0, 1.0), values)
    return np.asarray(values, dtype=dtype)


def assert_tensor(result, expected, rtol=None, atol=None, dtype=None) -> None:
    """Check a Tensor against a NumPy result: shape, dtype kind (and `dtype` if given), then values.

    Floats compare with `assert_allclose` (default tolerance from the result's dtype), ints and bools exactly.
    """
    expected = np.asarray(expected)
    assert isinstance(result, Tensor), f"expected a Tensor, got {type(result).__name__}"
    assert tuple(result.shape) == expected.shape, f"shape {result.shape} != expected {expected.shape}"
    if dtype is not None:
        assert result.dtype == dtype, f"dtype {result.dtype} != expected {dtype}"
    got = result.numpy()
    assert isinstance(got, np.ndarray), f"numpy() returned {type(got).__name__}"
    assert got.shape == expected.shape, f"numpy() shape {got.shape} != expected {expected.shape}"
    assert got.dtype == NUMPY_DTYPES.get(result.dtype, got.dtype), f"numpy() dtype {got.dtype} for {result.dtype}"
    assert KIND[got.dtype.kind] == KIND[expected.dtype.kind], f"got {got.dtype} values, expected {expected.dtype}"
    if got.dtype.kind == "f":
        tolerance = dict(FLOAT16_TOLERANCE if got.dtype == np.float16 else FLOAT32_TOLERANCE)
        tolerance.update({key: value for key, value in {"rtol": rtol, "atol": atol}.items() if value is not None})
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), **tolerance)
    else:
        np.testing.assert_array_equal(got, expected)


def check(lazy_fn, numpy_fn, *arrays, rtol=None, atol=None, dtype=None) -> None:
    """Apply `lazy_fn` to Tensors made from `arrays` and `numpy_fn` to the arrays themselves; compare the results."""
    result = lazy_fn(*[Tensor(array) for array in arrays])
    assert_tensor(result, numpy_fn(*arrays), rtol=rtol, atol=atol, dtype=dtype)


def numbers_in(message: str) -> list[int]:
    return [int(number) for number in re.findall(r"-?\d+", message)]


def assert_mentions(message: str, *items) -> None:
    """Each item must appear in an error message: a shape as its numbers in order (any brackets), an int as a number."""
    numbers = numbers_in(message)
    for item in items:
        if isinstance(item, tuple):
            found = any(tuple(numbers[i : i + len(item)]) == item for i in range(len(numbers) - len(item) + 1))
            assert found, f"error message does not mention shape {item}: {message!r}"
        else:
            assert item in numbers, f"error message does not mention {item}: {message!r}"


# ---------------------------------------------------------------------------------------------------------------------
# creation and conversion


@pytest.mark.parametrize(
    "value, shape, dtype",
    [
        ([1, 2, 3], (3,), dtypes.int32),
        ([[1.0, 2.0], [3.0, 4.0]], (2, 2), dtypes.float32),
        ((1.5, 2.5), (2,), dtypes.float32),
        ([1, 2.5], (2,), dtypes.float32),
        ([True, False], (2,), dtypes.bool),
        ([[True], [False]], (2, 1), dtypes.bool),
        (3, (), dtypes.int32),
        (2.5, (), dtypes.float32),
        (True, (), dtypes.bool),
        ([], (0,), dtypes.float32),
        ([[]], (1, 0), dtypes.float32),
        ([[[7]]], (1, 1, 1), dtypes.int32),
    ],
)
def test_tensor_from_python(value, shape, dtype):
    tensor = Tensor(value)
    assert tensor.shape == shape
    assert tensor.dtype == dtype
    assert tensor.ndim == len(shape)
    assert tensor.numel() == int(np.prod(shape))
    assert_tensor(tensor, np.array(value, dtype=NUMPY_DTYPES[dtype]).reshape(shape))


@pytest.mark.parametrize(
    "array, dtype",
    [
        (np.arange(6, dtype=np.float32).reshape(2, 3), dtypes.float32),
        (np.arange(6, dtype=np.int32).reshape(3, 2), dtypes.int32),
        (np.array([0.5, -1.25, 3.0], dtype=np.float16), dtypes.float16),
        (np.array([[True, False, True]]), dtypes.bool),
        (np.array(4.5, dtype=np.float32), dtypes.float32),
        (np.zeros((0, 3), dtype=np.float32), dtypes.float32),
        (np.arange(24, dtype=np.float32).reshape(4, 6)[::2, 1::2], dtypes.float32),  # a non-contiguous view
        (np.arange(12, dtype=np.int32).reshape(3, 4).T, dtypes.int32),  # a transposed view
    ],
)
def test_tensor_from_numpy(array, dtype):
    tensor = Tensor(array)
    assert tensor.dtype == dtype
    assert_tensor(tensor, array)


def test_tensor_from_numpy_other_widths():
    """float64 and int64 arrays keep their dtype and values."""
    assert_tensor(Tensor(np.array([1.5, -2.25])), np.array([1.5, -2.25]), dtype=dtypes.float64)
    assert_tensor(Tensor(np.array([3, -4], dtype=np.int64)), np.array([3, -4]))


def test_tensor_copies_numpy_input():
    """A Tensor made from an array holds the values it had then, even if the array changes before realization."""
    array = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    tensor = Tensor(array) * 2
    array[:] = 100.0
    assert_tensor(tensor, [2.0, 4.0, 6.0])


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.bool])
def test_tensor_explicit_dtype(dtype):
    tensor = Tensor([0, 1, 2], dtype=dtype)
    assert tensor.dtype == dtype
    assert_tensor(tensor, np.array([0, 1, 2]).astype(NUMPY_DTYPES[dtype]))


def test_tensor_device_and_requires_grad_arguments():
    tensor = Tensor([1.0, 2.0], requires_grad=True)
    assert tensor.requires_grad is True
    assert isinstance(tensor.device, str)
    same_device = Tensor([3.0, 4.0], device=tensor.device)
    assert same_device.device == tensor.device
    assert_tensor(tensor + same_device, [4.0, 6.0])


def test_tensor_properties():
    tensor = Tensor(data(2, 3, 4))
    assert tensor.shape == (2, 3, 4)
    assert tensor.ndim == 3
    assert tensor.numel() == 24
    assert len(tensor) == 2
    assert "Tensor" in repr(tensor)
    scalar = Tensor(1.0)
    assert scalar.shape == () and scalar.ndim == 0 and scalar.numel() == 1
    assert Tensor.zeros(0, 5).numel() == 0 and len(Tensor.zeros(0, 5)) == 0


def test_iterating_goes_along_the_first_axis_and_not_over_a_0d_tensor():
    assert [t.tolist() for t in Tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]] and list(Tensor.zeros(0, 3)) == []
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        list(Tensor(5))  # (it was an empty list)


def test_one_element_tensors_are_python_numbers_and_tensors_numpy_arrays():
    # as torch's: float(loss), f"{loss:.3f}", a list indexed by an int tensor, np.asarray(t)
    t = Tensor(2.5)
    assert float(t) == 2.5 and int(t) == 2 and f"{t:.3f}" == "2.500" and [10, 20, 30, 40][Tensor(3)] == 40
    assert abs(Tensor([-1.0, 2.0])).tolist() == [1.0, 2.0]
    with pytest.raises(TypeError, match="only integer tensors can be used as an index"):
        [1, 2][t]
    with pytest.raises(ValueError, match="only one-element tensors"):
        float(Tensor([1.0, 2.0]))
    np.testing.assert_array_equal(np.asarray(Tensor([[1, 2], [3, 4]])), [[1, 2], [3, 4]])
    assert np.asarray(Tensor([1.0]), dtype=np.float64).dtype == np.float64
    # NumPy's scalars leave the product a tensor, its gradient flowing, rather than converting the tensor
    x = Tensor([1.0, 2.0], requires_grad=True)
    product = np.float32(3.0) * x
    assert isinstance(product, Tensor)
    product.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_numpy_integers_index_as_ints():
    a = Tensor([[1, 2, 3], [4, 5, 6]])
    assert a[np.int64(1)].tolist() == [4, 5, 6] and a[np.int32(1), np.int64(2)].item() == 6
    b = Tensor.zeros(3).contiguous()
    b[np.int64(1)] = 5
    assert b.tolist() == [0.0, 5.0, 0.0]


def test_len_of_0d_tensor_is_type_error():
    with pytest.raises(TypeError):
        len(Tensor(1.0))


def test_bool_tensors_neither_subtract_nor_negate():
    masks = Tensor([True, False]), Tensor([False, False])
    with pytest.raises(TypeError, match=r"sub: cannot subtract bool tensors; use \^"):
        masks[0] - masks[1]
    with pytest.raises(TypeError, match="neg: cannot negate a bool tensor; use ~"):
        -masks[0]
    np.testing.assert_array_equal((masks[0] ^ masks[1]).numpy(), [True, False])  # what the message offers
    np.testing.assert_array_equal((masks[0].int() - masks[1]).numpy(), [1, 0])  # an int beside a bool subtracts


@pytest.mark.parametrize(
    "lazy_fn, expected, dtype",
    [
        (lambda: Tensor.zeros(2, 3), np.zeros((2, 3)), dtypes.float32),
        (lambda: Tensor.zeros((2, 3)), np.zeros((2, 3)), dtypes.float32),
        (lambda: Tensor.zeros(4, dtype=dtypes.int32), np.zeros(4, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.zeros(), np.zeros(()), dtypes.float32),
        (lambda: Tensor.zeros(0, 3), np.zeros((0, 3)), dtypes.float32),
        (lambda: Tensor.ones(3, 1), np.ones((3, 1)), dtypes.float32),
        (lambda: Tensor.ones(2, dtype=dtypes.float16), np.ones(2, dtype=np.float16), dtypes.float16),
        (lambda: Tensor.ones(2, 2, dtype=dtypes.bool), np.ones((2, 2), dtype=bool), dtypes.bool),
        (lambda: Tensor.full((2, 3), 7), np.full((2, 3), 7, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.full((2,), 1.5), np.full(2, 1.5), dtypes.float32),
        (lambda: Tensor.full((3,), True), np.full(3, True), dtypes.bool),
        (lambda: Tensor.full((), -2.0), np.full((), -2.0), dtypes.float32),
        (lambda: Tensor.full((2, 2), 3, dtype=dtypes.float32), np.full((2, 2), 3.0), dtypes.float32),
        (lambda: Tensor.arange(5), np.arange(5, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.arange(2, 8), np.arange(2, 8, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.arange(8, 2, -2), np.arange(8, 2, -2, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.arange(1, 10, 3), np.arange(1, 10, 3, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.arange(0, 1, 0.25), np.arange(0, 1, 0.25), dtypes.float32),
        (lambda: Tensor.arange(-1.5, 1.0), np.arange(-1.5, 1.0), dtypes.float32),
        (lambda: Tensor.arange(0), np.arange(0, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.arange(5, 5), np.arange(5, 5, dtype=np.int32), dtypes.int32),
        (lambda: Tensor.linspace(0, 1, 5), np.linspace(0, 1, 5), dtypes.float32),
        (lambda: Tensor.linspace(-2.5, 7.5, 11), np.linspace(-2.5, 7.5, 11), dtypes.float32),
        (lambda: Tensor.linspace(3, 1, 4), np.linspace(3, 1, 4), dtypes.float32),
        (lambda: Tensor.linspace(2, 5, 1), np.linspace(2, 5, 1), dtypes.float32),
        (lambda: Tensor.eye(3), np.eye(3), dtypes.float32),
        (lambda: Tensor.eye(2, 4), np.eye(2, 4), dtypes.float32),
        (lambda: Tensor.eye(4, 2), np.eye(4, 2), dtypes.float32),
        (lambda: Tensor.eye(1), np.eye(1), dtypes.float32),
    ],
)
def test_creation(lazy_fn, expected, dtype):
    assert_tensor(lazy_fn(), expected, dtype=dtype)


def test_empty():
    tensor = Tensor.empty(2, 3)
    assert tensor.shape == (2, 3) and tensor.dtype == dtypes.float32
    assert tensor.realize().numpy().shape == (2, 3)
    assert Tensor.empty(4, dtype=dtypes.int32).numpy().dtype == np.int32


@pytest.mark.parametrize(
    "fn, value",
    [(lambda t: t.zeros_like(), 0), (lambda t: t.ones_like(), 1), (lambda t: t.full_like(3), 3)],
    ids=["zeros_like", "ones_like", "full_like"],
)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.int32])
def test_like_constructors(fn, value, dtype):
    source = Tensor(data(2, 3, dtype=NUMPY_DTYPES[dtype], low=0, high=5))[:, ::2]
    assert_tensor(fn(source), np.full((2, 2), value, dtype=NUMPY_DTYPES[dtype]), dtype=dtype)


def test_like_constructors_with_dtype():
    source = Tensor([1, 2, 3])
    assert_tensor(source.zeros_like(dtype=dtypes.float32), np.zeros(3), dtype=dtypes.float32)
    assert_tensor(Tensor.ones_like(Tensor([True]), dtype=dtypes.int32), np.ones(1, dtype=np.int32), dtype=dtypes.int32)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: Tensor(3.5), 3.5),
        (lambda: Tensor(-2), -2),
        (lambda: Tensor(True), True),
        (lambda: Tensor([[7.25]]), 7.25),
        (lambda: Tensor([1.0, 2.0, 3.0]).sum(), 6.0),
    ],
    ids=["float", "int", "bool", "one_element", "reduced"],
)
def test_item(make, expected):
    value = make().item()
    assert type(value) is type(expected)
    assert value == expected


@pytest.mark.parametrize(
    "array", [data(2, 3), data(4, dtype=np.int32, low=-5, high=5), data(2, 2, dtype=np.bool_), np.array(1.5)]
)
def test_tolist(array):
    assert Tensor(array).tolist() == array.tolist()


def test_contiguous_detach_realize():
    array = data(3, 4)
    view = Tensor(array).T
    assert_tensor(view.contiguous(), array.T)
    assert_tensor(view.detach(), array.T)
    realized = (view * 2).realize()
    assert isinstance(realized, Tensor)
    assert_tensor(realized, array.T * 2)
    tensor = Tensor(array) + 1
    assert tensor.realize() is tensor


# ---------------------------------------------------------------------------------------------------------------------
# random numbers

RANDOM_SIZE = 2048


def test_manual_seed_reproducible():
    Tensor.manual_seed(1234)
    first = [Tensor.rand(8, 4).numpy(), Tensor.randn(16).numpy(), Tensor.randint(10, low=0, high=100).numpy()]
    Tensor.manual_seed(1234)
    second = [Tensor.rand(8, 4).numpy(), Tensor.randn(16).numpy(), Tensor.randint(10, low=0, high=100).numpy()]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    Tensor.manual_seed(4321)
    assert not np.array_equal(Tensor.rand(8, 4).numpy(), first[0])


def test_consecutive_random_tensors_differ():
    Tensor.manual_seed(0)
    a, b = Tensor.rand(64), Tensor.rand(64)
    assert not np.array_equal(a.numpy(), b.numpy())


def test_rand():
    Tensor.manual_seed(0)
    tensor = Tensor.rand(RANDOM_SIZE // 64, 64)
    assert tensor.shape == (32, 64) and tensor.dtype == dtypes.float32
    values = tensor.numpy()
    assert values.min() >= 0.0 and values.max() < 1.0
    assert abs(values.mean() - 0.5) < 0.03
    assert abs(values.std() - np.sqrt(1 / 12)) < 0.03
    assert len(np.unique(values)) > 0.95 * RANDOM_SIZE


def test_randn():
    Tensor.manual_seed(1)
    tensor = Tensor.randn(RANDOM_SIZE)
    assert tensor.shape == (RANDOM_SIZE,) and tensor.dtype == dtypes.float32
    values = tensor.numpy()
    assert np.all(np.isfinite(values))
    assert abs(values.mean()) < 0.1
    assert abs(values.std() - 1.0) < 0.1
    assert abs(np.mean(np.abs(values) < 1.0) - 0.6827) < 0.05


def test_randint():
    Tensor.manual_seed(2)
    tensor = Tensor.randint(RANDOM_SIZE, low=3, high=7)
    assert tensor.dtype == dtypes.int32
    values = tensor.numpy()
    assert set(np.unique(values).tolist()) == {3, 4, 5, 6}
    assert abs(values.mean() - 4.5) < 0.15
    default = Tensor.randint(4, 8).numpy()
    assert default.shape == (4, 8) and default.min() >= 0 and default.max() < 10


def test_uniform():
    Tensor.manual_seed(3)
    values = Tensor.uniform(RANDOM_SIZE, low=-2.0, high=3.0).numpy()
    assert values.min() >= -2.0 and values.max() < 3.0
    assert abs(values.mean() - 0.5) < 0.15


def test_normal():
    Tensor.manual_seed(4)
    values = Tensor.normal(RANDOM_SIZE, mean=3.0, std=0.5).numpy()
    assert abs(values.mean() - 3.0) < 0.05
    assert abs(values.std() - 0.5) < 0.05


@pytest.mark.parametrize("name", ["rand", "randn"])
def test_random_degenerate_shapes(name):
    make = getattr(Tensor, name)
    assert make().shape == ()
    assert make(0, 3).numpy().shape == (0, 3)
    assert make(1).numpy().shape == (1,)


# ---------------------------------------------------------------------------------------------------------------------
# unary elementwise


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


# name: (lazy op, NumPy op on float64, low, high)
UNARY_OPS = {
    "neg": (lambda t: -t, np.negative, -3, 3),
    "neg_method": (lambda t: t.neg(), np.negative, -3, 3),
    "exp": (lambda t: t.exp(), np.exp, -3, 3),
    "exp2": (lambda t: t.exp2(), np.exp2, -4, 4),
    "log": (lambda t: t.log(), np.log, 0.1, 5),
    "log2": (lambda t: t.log2(), np.log2, 0.1, 8),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, 0, 5),
    "rsqrt": (lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), 0.1, 5),
    "sin": (lambda t: t.sin(), np.sin, -6.5, 6.5),
    "cos": (lambda t: t.cos(), np.cos, -6.5, 6.5),
    "abs": (lambda t: t.abs(), np.abs, -3, 3),
    "sign": (lambda t: t.sign(), np.sign, -3, 3),
    "reciprocal": (lambda t: t.reciprocal(), np.reciprocal, 0.25, 4),
    "reciprocal_negative": (lambda t: (-t).reciprocal(), lambda x: 1 / -x, 0.25, 4),
    "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0), -3, 3),
    "leaky_relu": (lambda t: t.leaky_relu(), lambda x: np.where(x > 0, x, 0.01 * x), -3, 3),
    "leaky_relu_slope": (lambda t: t.leaky_relu(0.2), lambda x: np.where(x > 0, x, 0.2 * x), -3, 3),
    "sigmoid": (lambda t: t.sigmoid(), sigmoid, -6, 6),
    "tanh": (lambda t: t.tanh(), np.tanh, -4, 4),
    "gelu": (lambda t: t.gelu(), gelu, -4, 4),
    "silu": (lambda t: t.silu(), lambda x: x * sigmoid(x), -5, 5),
    "softplus": (lambda t: t.softplus(), lambda x: np.logaddexp(0, x), -5, 5),
    "elu": (lambda t: t.elu(), lambda x: np.where(x > 0, x, np.expm1(x)), -3, 3),
    "clip": (lambda t: t.clip(-1, 0.5), lambda x: np.clip(x, -1, 0.5), -2, 2),
}


@pytest.mark.parametrize("name", UNARY_OPS)
@pytest.mark.parametrize("shape", [(4, 5), (), (1,), (0, 3)])
def test_unary(name, shape):
    lazy_fn, numpy_fn, low, high = UNARY_OPS[name]
    array = data(*shape, low=low, high=high)
    assert_tensor(lazy_fn(Tensor(array)), numpy_fn(array.astype(np.float64)), dtype=dtypes.float32)


@pytest.mark.parametrize("name", UNARY_OPS)
def test_unary_float16(name):
    lazy_fn, numpy_fn, low, high = UNARY_OPS[name]
    array = data(3, 4, low=low, high=high, dtype=np.float16)
    assert_tensor(lazy_fn(Tensor(array)), numpy_fn(array.astype(np.float64)), dtype=dtypes.float16)


SPECIAL_VALUES = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 10.0], dtype=np.float32)


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn, array",
    [
        (lambda t: t.sign(), np.sign, SPECIAL_VALUES),
        (lambda t: t.abs(), np.abs, SPECIAL_VALUES),
        (lambda t: t.relu(), lambda x: np.maximum(x, 0), SPECIAL_VALUES),
        (lambda t: t.sqrt(), np.sqrt, np.abs(SPECIAL_VALUES)),
        (lambda t: t.exp(), np.exp, SPECIAL_VALUES),
        (lambda t: t.clip(-1, 1), lambda x: np.clip(x, -1, 1), SPECIAL_VALUES),
    ],
    ids=["sign", "abs", "relu", "sqrt", "exp", "clip"],
)
def test_unary_special_values(lazy_fn, numpy_fn, array):
    """Exact zeros, boundaries and larger magnitudes."""
    check(lazy_fn, numpy_fn, array)


def test_unary_extremes():
    """Saturating activations stay finite and exact at large magnitudes; exp and log reach inf and -inf."""
    array = np.array([-100.0, -30.0, 30.0, 100.0], dtype=np.float32)
    assert_tensor(Tensor(array).sigmoid(), sigmoid(array.astype(np.float64)))
    assert_tensor(Tensor(array).tanh(), np.tanh(array))
    assert_tensor(Tensor(array).softplus(), np.logaddexp(0, array.astype(np.float64)), rtol=1e-5)
    assert_tensor(Tensor([0.0, 1.0]).log(), [-np.inf, 0.0])
    assert_tensor(Tensor([200.0]).exp(), [np.inf])


def test_ieee_special_values():
    """NaN propagates through arithmetic and compares false; division by signed zero gives signed infinity."""
    nan, inf = float("nan"), float("inf")
    assert_tensor(Tensor(np.array([nan, 1.0], dtype=np.float32)) + 1, [np.nan, 2.0])
    assert_tensor(Tensor(np.array([inf, 0.0], dtype=np.float32)) * Tensor(np.array([0.0, inf])), [np.nan, np.nan])
    assert_tensor(Tensor(np.array([inf], dtype=np.float32)) - inf, [np.nan])
    assert_tensor(Tensor([-1.0]).sqrt(), [np.nan])
    assert_tensor(Tensor([-1.0]).log(), [np.nan])
    assert_tensor(1 / Tensor(np.array([-0.0, 0.0], dtype=np.float32)), [-np.inf, np.inf])
    nans = Tensor(np.array([nan, nan], dtype=np.float32))
    assert_tensor(nans == nans, [False, False])
    assert_tensor(nans != nans, [True, True])
    assert_tensor(nans < 1, [False, False])
    assert_tensor(Tensor(np.array([inf, -inf], dtype=np.float32)).sigmoid(), [1.0, 0.0])


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos_large_arguments(name):
    """Range reduction stays accurate for large float32 arguments (NumPy is accurate to ~1e-7 here)."""
    large = np.array([100.0, -1000.0, 12345.0, -30000.5], dtype=np.float32)
    check(lambda t: getattr(t, name)(), lambda x: getattr(np, name)(x.astype(np.float64)), large, atol=1e-5)


def test_exp_log_limits():
    """exp and log near the float32 limits: tiny, huge, underflow to zero, exact powers of two."""
    tiny_and_huge = np.array([1e-30, 1.5e-38, 1e30], dtype=np.float32)
    assert_tensor(Tensor(tiny_and_huge).log(), np.log(tiny_and_huge.astype(np.float64)))
    assert_tensor(Tensor([-100.0, -90.0]).exp(), np.exp([-100.0, -90.0]), atol=1e-30)
    assert_tensor(Tensor([0.0, 1.0, 10.0, -10.0, 127.0]).exp2(), np.exp2([0.0, 1.0, 10.0, -10.0, 127.0]))


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn",
    [
        (lambda t: -t, np.negative),
        (lambda t: t.abs(), np.abs),
        (lambda t: t.sign(), np.sign),
        (lambda t: t.relu(), lambda x: np.maximum(x, 0)),
        (lambda t: t.clip(-2, 3), lambda x: np.clip(x, -2, 3)),
        (lambda t: t.maximum(0), lambda x: np.maximum(x, 0)),
    ],
    ids=["neg", "abs", "sign", "relu", "clip", "maximum"],
)
def test_unary_int32(lazy_fn, numpy_fn):
    check(lazy_fn, numpy_fn, data(3, 5, dtype=np.int32, low=-5, high=6), dtype=dtypes.int32)


def test_int32_large_values():
    big = np.array([2**30, -(2**30), 2**31 - 1], dtype=np.int32)
    check(lambda t: t - 5, lambda x: x - 5, big)
    check(lambda t: t.max(), lambda x: x.max(), big)
    check(lambda t: t.min(), lambda x: x.min(), big)
    floats = np.array([1e9, -1e9, 123456.7], dtype=np.float32)
    check(lambda t: t.int(), lambda x: x.astype(np.int32), floats)


def test_clip_one_sided():
    array = data(10)
    check(lambda t: t.clip(-0.5, None), lambda x: np.clip(x, -0.5, None), array)
    check(lambda t: t.clip(None, 0.5), lambda x: np.clip(x, None, 0.5), array)


# ---------------------------------------------------------------------------------------------------------------------
# binary elementwise

# name: (lazy op, NumPy op, compare ints-valued data so that ties occur)
BINARY_OPS = {
    "add": (lambda a, b: a + b, np.add, False),
    "sub": (lambda a, b: a - b, np.subtract, False),
    "mul": (lambda a, b: a * b, np.multiply, False),
    "div": (lambda a, b: a / b, np.true_divide, False),
    "maximum": (lambda a, b: a.maximum(b), np.maximum, True),
    "minimum": (lambda a, b: a.minimum(b), np.minimum, True),
    "lt": (lambda a, b: a < b, np.less, True),
    "le": (lambda a, b: a <= b, np.less_equal, True),
    "gt": (lambda a, b: a > b, np.greater, True),
    "ge": (lambda a, b: a >= b, np.greater_equal, True),
    "eq": (lambda a, b: a == b, np.equal, True),
    "ne": (lambda a, b: a != b, np.not_equal, True),
}

BROADCAST_SHAPES = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((2, 1, 4), (3, 1)),
    ((4,), (2, 3, 4)),
    ((), (2, 3)),
    ((2, 3), ()),
    ((), ()),
    ((1,), (5,)),
    ((0,), (1,)),
    ((2, 0), (2, 1)),
    ((0, 3), (3,)),
]


def binary_inputs(name, shape_a, shape_b, dtype):
    integral = BINARY_OPS[name][2]
    a = data(*shape_a, dtype=dtype, low=-3, high=3, integral=integral)
    b = data(*shape_b, dtype=dtype, low=-3, high=3, seed=1, integral=integral, nonzero=name == "div")
    return a, b


@pytest.mark.parametrize("name", BINARY_OPS)
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
def test_binary(name, shapes):
    lazy_fn, numpy_fn, _ = BINARY_OPS[name]
    check(lazy_fn, numpy_fn, *binary_inputs(name, *shapes, np.float32))


@pytest.mark.parametrize("name", BINARY_OPS)
@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((), (3,))], ids=str)
@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_binary_dtypes(name, shapes, dtype):
    lazy_fn, numpy_fn, _ = BINARY_OPS[name]
    check(lazy_fn, numpy_fn, *binary_inputs(name, *shapes, dtype))


def test_comparisons_return_bool():
    a, b = Tensor([1.0, 2.0, 3.0]), Tensor([3.0, 2.0, 1.0])
    for result in (a < b, a <= b, a > b, a >= b, a == b, a != b, a < 2, 2 < a):
        assert result.dtype == dtypes.bool


def test_comparisons_on_bool():
    a, b = data(6, dtype=np.bool_), data(6, dtype=np.bool_, seed=1)
    check(lambda x, y: x == y, np.equal, a, b)
    check(lambda x, y: x != y, np.not_equal, a, b)
    check(lambda x, y: x < y, np.less, a, b)


# name: (lazy op, NumPy op)
SCALAR_OPS = {
    "add": (lambda t: t + 2, lambda x: x + 2),
    "radd": (lambda t: 2 + t, lambda x: 2 + x),
    "sub": (lambda t: t - 2, lambda x: x - 2),
    "rsub": (lambda t: 2 - t, lambda x: 2 - x),
    "mul": (lambda t: t * 3, lambda x: x * 3),
    "rmul": (lambda t: 3 * t, lambda x: 3 * x),
    "div": (lambda t: t / 4, lambda x: x / 4),
    "rdiv": (lambda t: 4 / t, lambda x: 4 / x),
    "div_negative": (lambda t: t / -3, lambda x: x / -3),
    "pow": (lambda t: t**2, lambda x: x**2),
    "rpow": (lambda t: 2**t, lambda x: 2.0**x),
    "add_float": (lambda t: t + 1.5, lambda x: x + 1.5),
    "rsub_float": (lambda t: 0.5 - t, lambda x: 0.5 - x),
    "mul_float": (lambda t: t * 0.5, lambda x: x * 0.5),
    "lt": (lambda t: t < 2, lambda x: x < 2),
    "rlt": (lambda t: 2 < t, lambda x: 2 < x),
    "le": (lambda t: t <= 2, lambda x: x <= 2),
    "ge": (lambda t: t >= 2, lambda x: x >= 2),
    "eq": (lambda t: t == 2, lambda x: x == 2),
    "ne": (lambda t: t != 2, lambda x: x != 2),
    "maximum": (lambda t: t.maximum(2), lambda x: np.maximum(x, 2)),
    "minimum": (lambda t: t.minimum(2), lambda x: np.minimum(x, 2)),
    "where_scalars": (lambda t: (t > 2).where(1.0, -1.0), lambda x: np.where(x > 2, 1.0, -1.0)),
}


@pytest.mark.parametrize("name", SCALAR_OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_scalar_operands(name, dtype):
    lazy_fn, numpy_fn = SCALAR_OPS[name]
    if dtype == np.int32:  # positive, so that int results of rpow stay integral as in NumPy
        array = data(3, 4, dtype=dtype, low=1, high=5)
    else:
        array = data(3, 4, dtype=dtype, low=-3, high=3, nonzero=True, integral=True)
    # rpow on int gives an int in NumPy; keep the reference in the input's dtype family
    numpy_fn_typed = (lambda x: 2**x) if (name == "rpow" and dtype == np.int32) else numpy_fn
    check(lazy_fn, numpy_fn_typed, array)


def test_scalar_operand_on_0d_and_empty():
    check(lambda t: 1 - t * 2, lambda x: 1 - x * 2, np.array(3.0, dtype=np.float32))
    check(lambda t: 1 - t * 2, lambda x: 1 - x * 2, np.zeros((0, 2), dtype=np.float32))


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn, base_range, exponent_range",
    [
        (lambda a, b: a**b, np.power, (0.25, 3), (-2, 2)),
        (lambda a, b: a.pow(b), np.power, (0.25, 3), (-2, 2)),
        (lambda a, _: a**0.5, lambda a, _: a**0.5, (0, 4), (0, 1)),
        (lambda a, _: a**-1.5, lambda a, _: a**-1.5, (0.25, 4), (0, 1)),
        (lambda a, _: a**3, lambda a, _: a**3, (-3, 3), (0, 1)),
        (lambda a, _: a**2, lambda a, _: a**2, (-3, 3), (0, 1)),
        (lambda a, _: a**0, lambda a, _: a**0, (-3, 3), (0, 1)),
        (lambda a, _: a**-1, lambda a, _: a**-1.0, (0.5, 3), (0, 1)),
        (lambda _, b: 2**b, lambda _, b: 2.0**b, (0, 1), (-3, 3)),
        (lambda _, b: 0.5**b, lambda _, b: 0.5**b, (0, 1), (-3, 3)),
    ],
    ids=[
        "tensor_tensor",
        "pow_method",
        "sqrt",
        "negative_fraction",
        "cube",
        "square",
        "zero",
        "inverse",
        "rpow",
        "rpow_half",
    ],
)
def test_pow(lazy_fn, numpy_fn, base_range, exponent_range):
    base = data(3, 4, low=base_range[0], high=base_range[1])
    exponent = data(4, low=exponent_range[0], high=exponent_range[1], seed=1)
    check(lazy_fn, numpy_fn, base, exponent)


def test_pow_int_and_half():
    check(lambda t: t**2, lambda x: x**2, data(5, dtype=np.int32, low=-4, high=5), dtype=dtypes.int32)
    check(lambda t: t**2, lambda x: x**2, data(5, dtype=np.float16, low=-3, high=3), dtype=dtypes.float16)


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint32])
def test_integer_pow_is_exact_and_wraps(dtype):
    # through float32, 3**19 was 1162260608 and 4097**2 16785402; torch multiplies in the integer dtype
    bits, signed = 8 * dtype.itemsize, not dtype.name.startswith("uint")

    def wrapped(value: int) -> int:
        value %= 1 << bits
        return value - (1 << bits) if signed and value >= 1 << (bits - 1) else value

    bases = [0, 1, 2, 3, 7, 4097 % (1 << bits)] + ([-1, -2, -5] if signed else [255])
    for exponent in [0, 1, 2, 5, 19, 39, 64, 100, min((1 << (bits - 2)) + 77, (1 << (bits - 1)) - 1)]:  # (that fit)
        assert (Tensor(bases, dtype=dtype) ** exponent).tolist() == [
            wrapped(pow(b, exponent, 1 << bits)) for b in bases
        ]
    exponents = [0, 1, 2, 5, 19, 39, (1 << (bits - 1)) - 1] + ([-1, -2, -3] if signed else [(1 << bits) - 1])
    for exponent in exponents:
        # a negative exponent truncates 1 / base**|e|, as torch: 0 but for bases 1 and -1
        want = [
            wrapped(pow(b, exponent, 1 << bits)) if exponent >= 0 else int(1 / b**-exponent) if b else 0 for b in bases
        ]
        assert (Tensor(bases, dtype=dtype) ** Tensor([exponent] * len(bases), dtype=dtype)).tolist() == want
    assert (2 ** Tensor([3, 10, 30], dtype=dtype)).tolist() == [wrapped(8), wrapped(1024), wrapped(1 << 30)]


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn",
    [
        (lambda a, b: a // b, np.floor_divide),
        (lambda a, _: a // 3, lambda a, _: a // 3),
        (lambda _, b: 17 // b, lambda _, b: 17 // b),
    ],
    ids=["tensor", "scalar", "reverse"],
)
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_floordiv_non_negative(lazy_fn, numpy_fn, dtype):
    """Floor division on non-negative operands.

    Negative operands are left out on purpose: current tinygrad floors like Python, older tinygrad truncated toward
    zero, and the brief leaves that choice to the implementation.
    """
    a = data(3, 4, dtype=dtype, low=0, high=20)
    b = data(4, dtype=dtype, low=1, high=6, seed=1)
    check(lazy_fn, numpy_fn, a, b)


def test_int_true_division_gives_float():
    a, b = np.array([7, 8, 9, 0], dtype=np.int32), np.array([2, 4, 5, 3], dtype=np.int32)
    check(lambda x, y: x / y, np.true_divide, a, b, dtype=dtypes.float32)
    check(lambda x, _: x / 2, lambda x, _: x / 2, a, b, dtype=dtypes.float32)


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn",
    [
        (lambda a, b: ~a, lambda a, b: ~a),
        (lambda a, b: a & b, np.logical_and),
        (lambda a, b: a | b, np.logical_or),
        (lambda a, b: a ^ b, np.logical_xor),
        (lambda a, b: a & True, lambda a, b: a & True),
        (lambda a, b: a | False, lambda a, b: a | False),
        (lambda a, b: ~(a & b) | (a ^ b), lambda a, b: ~(a & b) | (a ^ b)),
    ],
    ids=["invert", "and", "or", "xor", "and_scalar", "or_scalar", "combined"],
)
def test_logical_bool(lazy_fn, numpy_fn):
    a, b = data(3, 4, dtype=np.bool_), data(4, dtype=np.bool_, seed=1)
    check(lazy_fn, numpy_fn, a, b, dtype=dtypes.bool)


@pytest.mark.parametrize("np_dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_integers_cast_to_bool_are_true_where_nonzero(np_dtype):
    # a cast's bounds made any int that could be negative "always true", and selects and ands folded to constants
    a, b = np.array([0, 0, 2, 3, 0, 1], np_dtype), np.array([0, 1, 0, 4, 0, 0], np_dtype)
    check(lambda x, y: x.bool() & y.bool(), lambda x, y: x.astype(bool) & y.astype(bool), a, b, dtype=dtypes.bool)
    check(lambda x: x.bool().where(1, 2), lambda x: np.where(x, 1, 2), a)
    check(lambda x: (x.bool() == False) | (x.bool() != True), lambda x: ~x.astype(bool), a)  # noqa: E712
    np.testing.assert_array_equal((Tensor.arange(-2, 2) % 3).bool().where(1, 0).numpy(), [1, 1, 0, 1])


def test_logical_on_comparisons():
    a = data(12)
    check(lambda t: (t > -1) & (t < 1) | (t == 0), lambda x: (x > -1) & (x < 1) | (x == 0), a)
    check(lambda t: ~(t > 0), lambda x: ~(x > 0), a)


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn",
    [
        (lambda a, b: a & b, np.bitwise_and),
        (lambda a, b: a | b, np.bitwise_or),
        (lambda a, b: a ^ b, np.bitwise_xor),
        (lambda a, b: a & 6, lambda a, b: a & 6),
        (lambda a, b: 6 | a, lambda a, b: 6 | a),
        (lambda a, b: a << 3, lambda a, b: a << 3),
        (lambda a, b: a >> 2, lambda a, b: a >> 2),
        (lambda a, b: (a << 1) >> 1, lambda a, b: (a << 1) >> 1),
    ],
    ids=["and", "or", "xor", "and_scalar", "ror_scalar", "lshift", "rshift", "shift_roundtrip"],
)
def test_bitwise_int32(lazy_fn, numpy_fn):
    a, b = data(3, 4, dtype=np.int32, low=0, high=1000), data(4, dtype=np.int32, low=0, high=64, seed=1)
    check(lazy_fn, numpy_fn, a, b, dtype=dtypes.int32)


def test_bitwise_negative_int32():
    a, b = data(8, dtype=np.int32, low=-50, high=50), data(8, dtype=np.int32, low=-50, high=50, seed=1)
    check(lambda x, y: (x & y) ^ (x | 5), lambda x, y: (x & y) ^ (x | 5), a, b)


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn",
    [
        (lambda c, a, b: Tensor.where(c, a, b), np.where),
        (lambda c, a, b: c.where(a, b), np.where),
        (lambda c, a, b: c.where(a, 0.0), lambda c, a, b: np.where(c, a, 0.0)),
        (lambda c, a, b: c.where(-1.5, b), lambda c, a, b: np.where(c, -1.5, b)),
        (lambda c, a, b: (a > b).where(a, b), lambda c, a, b: np.where(a > b, a, b)),
        (lambda c, a, b: c.where(a.T, b[::-1]), lambda c, a, b: np.where(c, a.T, b[::-1])),
    ],
    ids=["static", "method", "scalar_else", "scalar_then", "from_comparison", "views"],
)
def test_where(lazy_fn, numpy_fn):
    condition = data(4, 4, dtype=np.bool_)
    check(lazy_fn, numpy_fn, condition, data(4, 4, seed=1), data(4, seed=2))


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.bool_])
def test_where_dtypes(dtype):
    condition = data(2, 3, dtype=np.bool_)
    check(Tensor.where, np.where, condition, data(2, 3, dtype=dtype, low=-9, high=9, seed=1), data(3, dtype=dtype))


def test_where_broadcast_condition_and_shapes():
    check(Tensor.where, np.where, data(3, 1, dtype=np.bool_), data(1, 4, seed=1), np.array(7.0, dtype=np.float32))
    check(Tensor.where, np.where, np.array(True), data(2, 2, seed=1), data(2, 2, seed=2))
    check(Tensor.where, np.where, data(0, 3, dtype=np.bool_), data(3, seed=1), data(1, seed=2))
    check(lambda c: c.where(1, 0), lambda c: np.where(c, 1, 0), data(5, dtype=np.bool_))


# ---------------------------------------------------------------------------------------------------------------------
# casts and dtype promotion

CAST_CASES = [
    (np.array([-2.7, -1.5, -0.2, 0.0, 0.2, 1.5, 2.7], dtype=np.float32), dtypes.int32),
    (np.array([0.0, 0.5, -1.0, 0.0, 3.0], dtype=np.float32), dtypes.bool),
    (np.array([0.1, 1 / 3, 1000.7, -2.5e-3, 65504.0], dtype=np.float32), dtypes.float16),
    (np.array([0.1, -7.5, 1024.0], dtype=np.float16), dtypes.float32),
    (np.array([-2.5, 0.0, 7.75], dtype=np.float16), dtypes.int32),
    (np.array([-5, 0, 7, 123456], dtype=np.int32), dtypes.float32),
    (np.array([-5, 0, 7, 2048], dtype=np.int32), dtypes.float16),
    (np.array([-5, 0, 7, 0], dtype=np.int32), dtypes.bool),
    (np.array([True, False, True]), dtypes.int32),
    (np.array([True, False, True]), dtypes.float32),
    (np.array([True, False, True]), dtypes.float16),
    (np.array([1.25, -3.0], dtype=np.float32), dtypes.float32),
    (np.array(3.9, dtype=np.float32), dtypes.int32),
    (np.zeros((0, 2), dtype=np.int32), dtypes.float32),
]


@pytest.mark.parametrize("array, dtype", CAST_CASES, ids=lambda x: getattr(x, "name", None))
def test_cast(array, dtype):
    """Float to int truncates toward zero, nonzero becomes True, float32 to float16 rounds to nearest even."""
    check(lambda t: t.cast(dtype), lambda x: x.astype(NUMPY_DTYPES[dtype]), array, dtype=dtype, rtol=0, atol=0)


@pytest.mark.parametrize(
    "method, dtype", [("float", dtypes.float32), ("half", dtypes.float16), ("int", dtypes.int32), ("bool", dtypes.bool)]
)
def test_cast_methods(method, dtype):
    array = np.array([[-1.75, 0.0], [2.5, 100.25]], dtype=np.float32)
    expected = array.astype(NUMPY_DTYPES[dtype])
    assert_tensor(getattr(Tensor(array), method)(), expected, dtype=dtype, rtol=0, atol=0)
    assert_tensor(getattr(Tensor(array).T, method)(), expected.T, dtype=dtype, rtol=0, atol=0)


def test_cast_accepts_dtype_names():
    assert_tensor(Tensor([1.5, -2.5]).cast("int32"), np.array([1, -2], dtype=np.int32), dtype=dtypes.int32)


@pytest.mark.parametrize(
    "lazy_fn, dtype",
    [
        (lambda: Tensor([1, 2]) + Tensor([0.5, 1.0]), dtypes.float32),
        (lambda: Tensor([1.0], dtype=dtypes.float16) + Tensor([1.0]), dtypes.float32),
        (lambda: Tensor([1, 2]) + 1, dtypes.int32),
        (lambda: Tensor([1, 2]) + 1.5, dtypes.float32),
        (lambda: Tensor([1, 2]) * True, dtypes.int32),
        (lambda: Tensor([1.0], dtype=dtypes.float16) * 2.0, dtypes.float16),
        (lambda: Tensor([1.0], dtype=dtypes.float16) * 2, dtypes.float16),
        (lambda: Tensor([True, False]) + 1, dtypes.int32),
        (lambda: Tensor([True, False]) + Tensor([1, 2]), dtypes.int32),
        (lambda: Tensor([True, False]) * 0.5, dtypes.float32),
        (lambda: Tensor([4, 6]) / Tensor([2, 4]), dtypes.float32),
        (lambda: Tensor([1, 2]).sum(), dtypes.int64),
        (lambda: Tensor([True, True, False]).sum(), dtypes.int64),
        (lambda: Tensor([1, 2]).mean(), dtypes.float32),
        (lambda: Tensor([1, 2]).max(), dtypes.int32),
        (lambda: Tensor([1.0, 2.0]).argmax(), dtypes.int64),
        (lambda: Tensor([1, 2]).exp(), dtypes.float32),
        (lambda: Tensor([1, 2]).sqrt(), dtypes.float32),
        (lambda: Tensor.where(Tensor([True]), Tensor([1]), 2.5), dtypes.float32),
        (lambda: Tensor([1, 2]) @ Tensor([3, 4]), dtypes.int32),
    ],
)
def test_dtype_promotion(lazy_fn, dtype):
    result = lazy_fn()
    assert result.dtype == dtype
    assert result.numpy().dtype == NUMPY_DTYPES[dtype]


def test_promoted_values():
    assert_tensor(Tensor([True, False]) + Tensor([1, 2]), [2, 2])
    assert_tensor(Tensor([1, 2]) + 1.5, [2.5, 3.5])
    assert_tensor(Tensor([True, True, False]).sum(), 2)
    assert_tensor(Tensor([1, 2]).mean(), 1.5)
    assert_tensor(Tensor([1, 4]).sqrt(), [1.0, 2.0])


# ---------------------------------------------------------------------------------------------------------------------
# reductions

# name: (lazy op, NumPy op); both take (x, axis, keepdim)
REDUCE_OPS = {
    "sum": (lambda t, a, k: t.sum(axis=a, keepdim=k), lambda x, a, k: np.sum(x, axis=a, keepdims=k)),
    "prod": (lambda t, a, k: t.prod(axis=a, keepdim=k), lambda x, a, k: np.prod(x, axis=a, keepdims=k)),
    "max": (lambda t, a, k: t.max(axis=a, keepdim=k), lambda x, a, k: np.max(x, axis=a, keepdims=k)),
    "min": (lambda t, a, k: t.min(axis=a, keepdim=k), lambda x, a, k: np.min(x, axis=a, keepdims=k)),
    "mean": (lambda t, a, k: t.mean(axis=a, keepdim=k), lambda x, a, k: np.mean(x, axis=a, keepdims=k)),
    "var": (lambda t, a, k: t.var(axis=a, keepdim=k), lambda x, a, k: np.var(x, axis=a, keepdims=k, ddof=1)),
    "std": (lambda t, a, k: t.std(axis=a, keepdim=k), lambda x, a, k: np.std(x, axis=a, keepdims=k, ddof=1)),
    "logsumexp": (
        lambda t, a, k: t.logsumexp(axis=a, keepdim=k),
        lambda x, a, k: np.log(np.sum(np.exp(x.astype(np.float64)), axis=a, keepdims=k)),
    ),
}


def reduce_input(name, *shape, dtype=np.float32):
    """Products stay in range with factors near 1 (floats) or in [-2, 2] (ints)."""
    if name == "prod":
        return data(*shape, dtype=dtype, low=0.5 if dtype != np.int32 else -2, high=1.5 if dtype != np.int32 else 3)
    return data(*shape, dtype=dtype, low=-3, high=3)


@pytest.mark.parametrize("name", REDUCE_OPS)
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (-1, -3), (2, 0, 1)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce(name, axis, keepdim):
    lazy_fn, numpy_fn = REDUCE_OPS[name]
    array = reduce_input(name, 2, 3, 4)
    assert_tensor(lazy_fn(Tensor(array), axis, keepdim), numpy_fn(array.astype(np.float64), axis, keepdim))


@pytest.mark.parametrize("name", REDUCE_OPS)
@pytest.mark.parametrize("shape, axis", [((), None), ((1,), 0), ((1, 1), -1), ((7,), None), ((5, 1), 1)], ids=str)
def test_reduce_small_shapes(name, shape, axis):
    lazy_fn, numpy_fn = REDUCE_OPS[name]
    reduced_count = int(np.prod(shape)) if axis is None else shape[axis]
    if name in ("var", "std") and reduced_count == 1:
        pytest.skip("var/std with correction=1 of one element divides by zero")
    array = reduce_input(name, *shape)
    assert_tensor(lazy_fn(Tensor(array), axis, False), numpy_fn(array.astype(np.float64), axis, False))


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("axis", [None, 1, (0, 1)], ids=str)
def test_reduce_int32(name, axis):
    lazy_fn, numpy_fn = REDUCE_OPS[name]
    array = reduce_input(name, 3, 4, dtype=np.int32)
    # sum and prod of ints are int64, as in PyTorch; max and min keep the dtype
    widened = dtypes.int64 if name in ("sum", "prod") else dtypes.int32
    assert_tensor(lazy_fn(Tensor(array), axis, False), numpy_fn(array, axis, False), dtype=widened)


def test_reduce_int32_mean_and_bool_sum():
    array = data(3, 4, dtype=np.int32, low=-5, high=5)
    assert_tensor(Tensor(array).mean(axis=1), array.mean(axis=1), dtype=dtypes.float32)
    flags = data(3, 4, dtype=np.bool_)
    assert_tensor(Tensor(flags).sum(axis=0), flags.sum(axis=0))
    assert_tensor(Tensor(flags).sum(), flags.sum())


@pytest.mark.parametrize("name", ["sum", "max", "min", "mean", "var", "std", "logsumexp"])
def test_reduce_float16(name):
    lazy_fn, numpy_fn = REDUCE_OPS[name]
    array = data(4, 6, dtype=np.float16)
    result = lazy_fn(Tensor(array), 1, False)
    assert result.dtype == dtypes.float16
    assert_tensor(result, numpy_fn(array.astype(np.float64), 1, False))


@pytest.mark.parametrize(
    "lazy_fn, expected",
    [
        (lambda: Tensor.zeros(0).sum(), np.float32(0)),
        (lambda: Tensor.zeros(0).prod(), np.float32(1)),
        (lambda: Tensor.zeros(0, 3).sum(axis=0), np.zeros(3)),
        (lambda: Tensor.zeros(0, 3).sum(axis=1), np.zeros(0)),
        (lambda: Tensor.zeros(2, 0).sum(axis=1, keepdim=True), np.zeros((2, 1))),
        (lambda: Tensor.zeros(2, 0).prod(axis=1), np.ones(2)),
        (lambda: Tensor.zeros(0, 3).max(axis=1), np.zeros(0)),
        (lambda: Tensor.zeros(0, 3).mean(axis=1), np.zeros(0)),
        (lambda: Tensor.zeros(0, dtype=dtypes.int32).sum(), np.int32(0)),
    ],
)
def test_reduce_empty(lazy_fn, expected):
    assert_tensor(lazy_fn(), expected)


def test_max_min_with_infinities():
    array = np.array([[-np.inf, 1.0, np.inf], [-np.inf, -np.inf, -3.0]], dtype=np.float32)
    check(lambda t: t.max(axis=1), lambda x: x.max(axis=1), array)
    check(lambda t: t.min(axis=1), lambda x: x.min(axis=1), array)


@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std_correction(correction):
    array = data(3, 5)
    check(lambda t: t.var(axis=1, correction=correction), lambda x: np.var(x, axis=1, ddof=correction), array)
    check(lambda t: t.std(axis=0, correction=correction), lambda x: np.std(x, axis=0, ddof=correction), array)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis, keepdim", [(None, False), (0, False), (1, True), (-1, False), (-3, True)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_argmax_argmin(name, axis, keepdim, dtype):
    """Ties resolve to the first index, as in NumPy."""
    array = data(2, 3, 4, dtype=dtype, low=-2, high=3, integral=True)
    numpy_fn = np.argmax if name == "argmax" else np.argmin
    result = getattr(Tensor(array), name)(axis=axis, keepdim=keepdim)
    assert_tensor(result, numpy_fn(array, axis=axis, keepdims=keepdim), dtype=dtypes.int64)


def test_argmax_ties_and_views():
    assert Tensor([1.0, 3.0, 3.0, 2.0]).argmax().item() == 1
    assert Tensor([2.0, 0.0, 5.0, 0.0]).argmin().item() == 1
    assert Tensor([[7.0]]).argmax().item() == 0
    array = data(4, 5, integral=True)
    check(lambda t: t.T.argmax(axis=1), lambda x: x.T.argmax(axis=1), array)
    check(lambda t: t.flip(1).argmin(axis=1), lambda x: np.flip(x, 1).argmin(axis=1), array)


def softmax(x, axis):
    exp = np.exp(x - x.max(axis=axis, keepdims=True))
    return exp / exp.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize(
    "shape, axis", [((3, 5), None), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -2), ((6,), None), ((1, 1), None)]
)
def test_softmax_log_softmax(shape, axis):
    array = data(*shape, low=-4, high=4).astype(np.float32)
    reference = softmax(array.astype(np.float64), -1 if axis is None else axis)
    if axis is None:  # the default axis is -1
        assert_tensor(Tensor(array).softmax(), reference)
        assert_tensor(Tensor(array).log_softmax(), np.log(reference))
    else:
        assert_tensor(Tensor(array).softmax(axis), reference)
        assert_tensor(Tensor(array).log_softmax(axis=axis), np.log(reference))


def test_softmax_float16_and_views():
    array = data(3, 5, dtype=np.float16)
    result = Tensor(array).softmax()
    assert result.dtype == dtypes.float16
    assert_tensor(result, softmax(array.astype(np.float64), -1))
    check(lambda t: t.T.softmax(), lambda x: softmax(x.T, -1), data(4, 3))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.float16], ids=["f32", "f64", "f16"])
def test_products_and_softmaxes_built_on_nodes_are_the_composed_graphs(dtype):
    """matmul, softmax and log_softmax build their nodes directly (graph building is Python on every call): the
    very nodes their compositions of tensor ops make, so kernels and gradients are theirs (a float16 tensor's in
    float32, rounded once; a float16 product's inputs cast to float32 before they multiply)."""
    for shape, axis in (((4, 8), -1), ((2, 3, 5), 1), ((2, 3, 5), (0, 2)), ((3, 1), 1)):
        x = Tensor(data(*shape)).cast(dtype)
        wide = x.float() if dtype == dtypes.float16 else x
        exponent = (wide - wide.max(axis, keepdim=True)).exp()
        softmax = (exponent * exponent.sum(axis, keepdim=True).reciprocal()).cast(dtype)
        assert x.softmax(axis).uop is softmax.uop
        shifted = wide - wide.max(axis, keepdim=True)
        assert x.log_softmax(axis).uop is (shifted - shifted.exp().sum(axis, keepdim=True).log()).cast(dtype).uop
    for a_shape, b_shape in (((4, 8), (8, 3)), ((2, 4, 8), (8, 3)), ((4, 8), (2, 8, 3))):
        a, b = Tensor(data(*a_shape)).cast(dtype), Tensor(data(*b_shape)).cast(dtype)
        x, w = a.reshape(*a.shape[:-1], 1, a.shape[-1]), b.reshape(*b.shape[:-2], 1, *b.shape[-2:]).transpose(-1, -2)
        assert (a @ b).uop is x._sum_of_products(w, -1).uop


def test_softmax_logsumexp_numerically_stable():
    array = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]], dtype=np.float32)
    assert_tensor(Tensor(array).softmax(), softmax(array.astype(np.float64), -1))
    assert_tensor(Tensor(array).log_softmax(), np.log(softmax(array.astype(np.float64), -1)), atol=1e-5)
    expected = np.array([1001.0 + np.log(1 + np.exp(-1) + np.exp(-2)), -1000.0 + np.log(3)])
    assert_tensor(Tensor(array).logsumexp(axis=1), expected)


def test_reduce_of_views():
    array = data(4, 6)
    check(lambda t: t.T.sum(axis=1), lambda x: x.T.sum(axis=1), array)
    check(lambda t: t[::2, ::-3].max(axis=0), lambda x: x[::2, ::-3].max(axis=0), array)
    check(
        lambda t: t[:, None].expand(4, 3, 6).sum(axis=1), lambda x: np.broadcast_to(x[:, None], (4, 3, 6)).sum(1), array
    )
    check(lambda t: (t * 2).sum(axis=0) + t.max(axis=0), lambda x: (x * 2).sum(axis=0) + x.max(axis=0), array)


# ---------------------------------------------------------------------------------------------------------------------
# movement


def chunk_reference(x, chunks, dim):
    """torch.chunk: pieces of ceil(n / chunks), the last one smaller, possibly fewer than `chunks` pieces."""
    step = -(-x.shape[dim] // chunks)
    return np.split(x, list(range(step, x.shape[dim], step)), axis=dim)


# name: (input shape, lazy op, NumPy op)
MOVEMENT_OPS = {
    "reshape": ((2, 3, 4), lambda t: t.reshape(4, 6), lambda x: x.reshape(4, 6)),
    "reshape_tuple": ((2, 3, 4), lambda t: t.reshape((6, 4)), lambda x: x.reshape(6, 4)),
    "reshape_minus_one": ((2, 3, 4), lambda t: t.reshape(-1, 2), lambda x: x.reshape(-1, 2)),
    "reshape_flat": ((2, 3, 4), lambda t: t.reshape(-1), lambda x: x.reshape(-1)),
    "reshape_to_0d": ((1, 1), lambda t: t.reshape(()), lambda x: x.reshape(())),
    "reshape_from_0d": ((), lambda t: t.reshape(1, 1, 1), lambda x: x.reshape(1, 1, 1)),
    "reshape_empty": ((0, 4), lambda t: t.reshape(2, 0, 2), lambda x: x.reshape(2, 0, 2)),
    "view": ((2, 6), lambda t: t.view(3, 4), lambda x: x.reshape(3, 4)),
    "permute": ((2, 3, 4), lambda t: t.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1)),
    "permute_tuple": ((2, 3, 4), lambda t: t.permute((1, 2, 0)), lambda x: x.transpose(1, 2, 0)),
    "permute_negative": ((2, 3, 4), lambda t: t.permute(-1, 0, -2), lambda x: x.transpose(2, 0, 1)),
    "transpose": ((3, 4), lambda t: t.transpose(), lambda x: x.T),
    "transpose_dims": ((2, 3, 4), lambda t: t.transpose(0, 2), lambda x: x.swapaxes(0, 2)),
    "transpose_negative": ((2, 3, 4), lambda t: t.transpose(-1, -2), lambda x: x.swapaxes(-1, -2)),
    "T": ((3, 5), lambda t: t.T, lambda x: x.T),
    "flatten": ((2, 3, 4), lambda t: t.flatten(), lambda x: x.reshape(-1)),
    "flatten_start": ((2, 3, 4), lambda t: t.flatten(1), lambda x: x.reshape(2, 12)),
    "flatten_range": ((2, 3, 4), lambda t: t.flatten(0, 1), lambda x: x.reshape(6, 4)),
    "flatten_negative": ((2, 3, 4), lambda t: t.flatten(-2, -1), lambda x: x.reshape(2, 12)),
    "flatten_0d": ((), lambda t: t.flatten(), lambda x: x.reshape(1)),
    "unflatten": ((2, 12), lambda t: t.unflatten(1, (3, 4)), lambda x: x.reshape(2, 3, 4)),
    "unflatten_negative": ((12, 2), lambda t: t.unflatten(-2, (2, -1)), lambda x: x.reshape(2, 6, 2)),
    "squeeze": ((1, 3, 1), lambda t: t.squeeze(), lambda x: x.squeeze()),
    "squeeze_dim": ((1, 3, 1), lambda t: t.squeeze(0), lambda x: x.squeeze(0)),
    "squeeze_negative": ((1, 3, 1), lambda t: t.squeeze(-1), lambda x: x.squeeze(-1)),
    "squeeze_not_one": ((1, 3, 1), lambda t: t.squeeze(1), lambda x: x),
    "unsqueeze": ((3, 4), lambda t: t.unsqueeze(0), lambda x: x[None]),
    "unsqueeze_middle": ((3, 4), lambda t: t.unsqueeze(1), lambda x: x[:, None]),
    "unsqueeze_negative": ((3, 4), lambda t: t.unsqueeze(-1), lambda x: x[..., None]),
    "unsqueeze_0d": ((), lambda t: t.unsqueeze(0), lambda x: x[None]),
    "expand": ((3, 1), lambda t: t.expand(3, 4), lambda x: np.broadcast_to(x, (3, 4))),
    "expand_tuple": ((1, 4), lambda t: t.expand((2, 4)), lambda x: np.broadcast_to(x, (2, 4))),
    "expand_minus_one": ((3, 1), lambda t: t.expand(-1, 5), lambda x: np.broadcast_to(x, (3, 5))),
    "expand_new_dims": ((3,), lambda t: t.expand(2, 2, 3), lambda x: np.broadcast_to(x, (2, 2, 3))),
    "expand_0d": ((), lambda t: t.expand(2, 3), lambda x: np.broadcast_to(x, (2, 3))),
    "expand_to_empty": ((1, 3), lambda t: t.expand(0, 3), lambda x: np.broadcast_to(x, (0, 3))),
    "pad": ((2, 3), lambda t: t.pad(((1, 2), (0, 1))), lambda x: np.pad(x, ((1, 2), (0, 1)))),
    "pad_one_side": ((2, 3), lambda t: t.pad(((0, 0), (3, 0))), lambda x: np.pad(x, ((0, 0), (3, 0)))),
    "pad_empty": ((0, 2), lambda t: t.pad(((1, 1), (0, 0))), lambda x: np.pad(x, ((1, 1), (0, 0)))),
    "shrink": ((4, 5), lambda t: t.shrink(((1, 3), (0, 2))), lambda x: x[1:3, 0:2]),
    "shrink_to_empty": ((4, 5), lambda t: t.shrink(((1, 1), (0, 5))), lambda x: x[1:1, :]),
    "shrink_whole": ((4, 5), lambda t: t.shrink(((0, 4), (0, 5))), lambda x: x),
    "flip": ((3, 4), lambda t: t.flip(0), lambda x: np.flip(x, 0)),
    "flip_negative": ((3, 4), lambda t: t.flip(-1), lambda x: np.flip(x, -1)),
    "flip_tuple": ((2, 3, 4), lambda t: t.flip((0, 2)), lambda x: np.flip(x, (0, 2))),
    "repeat": ((2, 3), lambda t: t.repeat(2, 3), lambda x: np.tile(x, (2, 3))),
    "repeat_new_dim": ((2, 3), lambda t: t.repeat(2, 1, 2), lambda x: np.tile(x, (2, 1, 2))),
    "repeat_tuple": ((3,), lambda t: t.repeat((3,)), lambda x: np.tile(x, 3)),
    "repeat_zero": ((2, 3), lambda t: t.repeat(0, 1), lambda x: np.tile(x, (0, 1))),
    "permute_then_reshape": ((3, 4), lambda t: t.permute(1, 0).reshape(2, 6), lambda x: x.T.reshape(2, 6)),
    "flip_slice_reshape": ((4, 6), lambda t: t.flip(0)[::2].reshape(-1), lambda x: np.flip(x, 0)[::2].reshape(-1)),
    "pad_permute_shrink": (
        (2, 3),
        lambda t: t.pad(((1, 1), (2, 0))).permute(1, 0).shrink(((1, 4), (0, 3))),
        lambda x: np.pad(x, ((1, 1), (2, 0))).T[1:4, 0:3],
    ),
    "expand_reshape": (
        (3, 1),
        lambda t: t.expand(3, 4).reshape(2, 6),
        lambda x: np.broadcast_to(x, (3, 4)).reshape(2, 6),
    ),
}


@pytest.mark.parametrize("name", MOVEMENT_OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, np.float16])
def test_movement(name, dtype):
    shape, lazy_fn, numpy_fn = MOVEMENT_OPS[name]
    array = data(*shape, dtype=dtype, low=-9, high=9)
    check(lazy_fn, numpy_fn, array, rtol=0, atol=0)


@pytest.mark.parametrize(
    "array, value",
    [(data(2, 3), -1.5), (data(2, 3, dtype=np.int32, low=0, high=9), 7), (data(2, 3, dtype=np.bool_), True)],
    ids=["float32", "int32", "bool"],
)
def test_pad_value(array, value):
    check(
        lambda t: t.pad(((1, 0), (1, 2)), value=value),
        lambda x: np.pad(x, ((1, 0), (1, 2)), constant_values=value),
        array,
    )


def test_pad_value_inf():
    check(lambda t: t.pad(((1, 1),), value=-np.inf).max(), lambda x: x.max(), data(4))


def test_pad_with_negative_zero_keeps_its_sign():
    # (a select of -0.0 with a load was taken for the load's own zero: the pad held +0.0)
    padded = Tensor([1.0, 2.0, 3.0]).pad(((1, 2),), value=-0.0).numpy()
    np.testing.assert_array_equal(np.signbit(padded), [True, False, False, False, True, True])


# one shape, many indices; each applied to a Tensor and to a NumPy array
GETITEM_INDICES = [
    np.s_[1],
    np.s_[-1],
    np.s_[0, 2],
    np.s_[1, -2, 3],
    np.s_[1:3],
    np.s_[:, 1:3],
    np.s_[::2],
    np.s_[::-1],
    np.s_[:, ::-2],
    np.s_[2:0:-1, 3:0:-2],
    np.s_[-2:],
    np.s_[:-1, -3:-1],
    np.s_[-10:10],
    np.s_[2:1],
    np.s_[None],
    np.s_[:, None],
    np.s_[None, 1, ..., None],
    np.s_[...],
    np.s_[..., -1],
    np.s_[..., 1:3, None],
    np.s_[1, ..., ::-1],
    np.s_[None, ::2, None, 2, 1:],
    np.s_[0, None, :, 4],
]


@pytest.mark.parametrize("index", GETITEM_INDICES, ids=str)
def test_getitem(index):
    array = data(3, 4, 5)
    check(lambda t: t[index], lambda x: x[index], array, rtol=0, atol=0)


@pytest.mark.parametrize("index", [np.s_[1], np.s_[::-1, 1:], np.s_[None, -1]], ids=str)
@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.float16])
def test_getitem_dtypes(index, dtype):
    check(lambda t: t[index], lambda x: x[index], data(3, 4, dtype=dtype, low=-9, high=9))


def test_getitem_0d_and_views():
    check(lambda t: t[None], lambda x: x[None], data())
    check(lambda t: t[...], lambda x: x[...], data())
    check(lambda t: t.T[1:, ::-1][0], lambda x: x.T[1:, ::-1][0], data(3, 4))
    check(lambda t: t[::2][1][::-1], lambda x: x[::2][1][::-1], data(5, 4))
    check(lambda t: t.expand(3, 4)[1:, 2], lambda x: np.broadcast_to(x, (3, 4))[1:, 2], data(1, 4))


def test_iterate_over_first_dim():
    array = data(3, 2)
    rows = list(Tensor(array))
    assert len(rows) == 3
    for row, expected in zip(rows, array):
        assert_tensor(row, expected)


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn, shapes",
    [
        (lambda a, b: Tensor.cat(a, b), lambda a, b: np.concatenate([a, b]), [(2, 3), (4, 3)]),
        (lambda a, b: a.cat(b, dim=1), lambda a, b: np.concatenate([a, b], 1), [(2, 3), (2, 1)]),
        (lambda a, b: Tensor.cat(a, b, dim=-1), lambda a, b: np.concatenate([a, b], -1), [(2, 2, 1), (2, 2, 3)]),
        (lambda a, b: Tensor.cat(a, b, a, dim=0), lambda a, b: np.concatenate([a, b, a]), [(2,), (5,)]),
        (lambda a, b: Tensor.cat(a, b), lambda a, b: np.concatenate([a, b]), [(0, 3), (2, 3)]),
        (lambda a, b: Tensor.cat(a), lambda a, b: a, [(2, 3), (1,)]),
        (lambda a, b: Tensor.cat(a.T, b[::-1], dim=0), lambda a, b: np.concatenate([a.T, b[::-1]]), [(3, 2), (4, 3)]),
        (lambda a, b: Tensor.stack(a, b), lambda a, b: np.stack([a, b]), [(2, 3), (2, 3)]),
        (lambda a, b: a.stack(b, dim=1), lambda a, b: np.stack([a, b], 1), [(2, 3), (2, 3)]),
        (lambda a, b: Tensor.stack(a, b, a, dim=-1), lambda a, b: np.stack([a, b, a], -1), [(4,), (4,)]),
        (lambda a, b: Tensor.stack(a, b), lambda a, b: np.stack([a, b]), [(), ()]),
        (lambda a, b: Tensor.stack(a), lambda a, b: np.stack([a]), [(3,), (1,)]),
    ],
    ids=["cat", "cat_method_dim1", "cat_negative", "cat_three", "cat_empty", "cat_one", "cat_views"]
    + ["stack", "stack_method_dim1", "stack_negative", "stack_0d", "stack_one"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_cat_stack(lazy_fn, numpy_fn, shapes, dtype):
    arrays = [data(*shape, dtype=dtype, low=-9, high=9, seed=i) for i, shape in enumerate(shapes)]
    check(lazy_fn, numpy_fn, *arrays)


@pytest.mark.parametrize(
    "shape, sizes, dim, expected_sizes",
    [
        ((5, 2), 2, 0, [2, 2, 1]),
        ((5, 2), [1, 3, 1], 0, [1, 3, 1]),
        ((2, 6), 3, 1, [3, 3]),
        ((2, 6), [4, 2], -1, [4, 2]),
        ((4,), 4, 0, [4]),
        ((4,), 10, 0, [4]),
        ((3, 4), [0, 3], 0, [0, 3]),
    ],
)
def test_split(shape, sizes, dim, expected_sizes):
    array = data(*shape)
    pieces = Tensor(array).split(sizes, dim=dim)
    expected = np.split(array, np.cumsum(expected_sizes)[:-1], axis=dim)
    assert len(pieces) == len(expected)
    for piece, reference in zip(pieces, expected):
        assert_tensor(piece, reference)


@pytest.mark.parametrize(
    "shape, chunks, dim", [((6, 2), 3, 0), ((5, 2), 3, 0), ((6,), 4, 0), ((2, 7), 2, -1), ((3,), 5, 0)]
)
def test_chunk(shape, chunks, dim):
    array = data(*shape)
    pieces = Tensor(array).chunk(chunks, dim=dim)
    expected = chunk_reference(array, chunks, dim)
    assert [piece.shape for piece in pieces] == [reference.shape for reference in expected]
    for piece, reference in zip(pieces, expected):
        assert_tensor(piece, reference)


# ---------------------------------------------------------------------------------------------------------------------
# larger sizes: loop unrolling, vectorization and their remainders

# name: (lazy op, NumPy op, input dtype)
SIZED_OPS = {
    "add": (lambda t: t + t.flip(0), lambda x: x + x[::-1], np.float32),
    "exp": (lambda t: t.exp(), lambda x: np.exp(x.astype(np.float64)), np.float32),
    "sum": (lambda t: t.sum(), lambda x: x.astype(np.float64).sum(), np.float32),
    "max": (lambda t: t.max(), lambda x: x.max(), np.float32),
    "argmax": (lambda t: t.argmax(), lambda x: x.argmax(), np.float32),
    "half_axpy": (lambda t: t * 2 + 1, lambda x: x.astype(np.float64) * 2 + 1, np.float16),
    "int_sum": (lambda t: t.sum(), lambda x: x.sum(), np.int32),
    "int_affine": (lambda t: t * 3 - 7, lambda x: x * 3 - 7, np.int32),
    "bool_count": (lambda t: (~t).sum(), lambda x: (~x).sum(), np.bool_),
}


@pytest.mark.parametrize("name", SIZED_OPS)
@pytest.mark.parametrize("size", [7, 16, 17, 33, 129, 500])
def test_sizes_around_vector_widths(name, size):
    lazy_fn, numpy_fn, dtype = SIZED_OPS[name]
    check(
        lazy_fn,
        numpy_fn,
        data(size, dtype=dtype, low=-100 if dtype == np.int32 else -2, high=100 if dtype == np.int32 else 2),
    )


@pytest.mark.parametrize("shape", [(16, 16), (4, 125), (125, 4), (3, 67), (1, 500), (500, 1)], ids=str)
@pytest.mark.parametrize("axis", [None, 0, 1], ids=str)
def test_reduce_larger(shape, axis):
    array = data(*shape)
    check(lambda t: t.sum(axis=axis), lambda x: x.astype(np.float64).sum(axis=axis), array, atol=1e-5)
    check(lambda t: t.T.max(axis=axis), lambda x: x.T.max(axis=axis), array)


def test_float16_sum_accumulates_accurately():
    """Summing 500 halves of 0.1 must not lose precision in a float16 accumulator (naive half sums drift)."""
    array = np.full(500, 0.1, dtype=np.float16)
    assert_tensor(Tensor(array).sum(), array.astype(np.float64).sum(), rtol=1e-2)
    assert_tensor(Tensor(array).mean(), array.astype(np.float64).mean(), rtol=1e-2)


def test_long_elementwise_chain():
    array = data(50)

    def run(x, relu):
        for _ in range(60):
            x = relu(x * 1.01 + 0.001) + x * 0.0
        return x

    assert_tensor(
        run(Tensor(array), lambda t: t.relu()), run(array.astype(np.float64), lambda x: np.maximum(x, 0)), rtol=1e-4
    )


# ---------------------------------------------------------------------------------------------------------------------
# matmul

MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((1, 1), (1, 1)),
    ((5, 2, 3), (3, 4)),
    ((3, 4), (2, 4, 2)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
    ((2, 0), (0, 3)),
    ((0, 3), (3, 2)),
    ((2, 3), (3, 0)),
    ((8, 32), (32, 8)),
    ((17, 13), (13, 19)),
    ((2, 8, 16), (16, 8)),
    ((32,), (32, 16)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_matmul(shapes, dtype):
    a, b = data(*shapes[0], dtype=dtype, low=-3, high=3), data(*shapes[1], dtype=dtype, low=-3, high=3, seed=1)
    check(lambda x, y: x @ y, np.matmul, a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "lazy_fn",
    [lambda x, y: x.matmul(y), lambda x, y: x.dot(y), lambda x, y: Tensor.matmul(x, y)],
    ids=["matmul", "dot", "static"],
)
def test_matmul_spellings(lazy_fn):
    check(lazy_fn, np.matmul, data(2, 3), data(3, 4, seed=1), atol=1e-5)


@pytest.mark.parametrize("shapes", [s for s in MATMUL_SHAPES if len(s[0]) > 1 and len(s[1]) > 1], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_of_float_matrices_builds_the_graph_of_its_steps(shapes, dtype):
    # `dot` builds a float product's nodes directly: they are the very nodes its steps through tensors make
    a, b = Tensor(data(*shapes[0], dtype=dtype)), Tensor(data(*shapes[1], dtype=dtype, seed=1))
    x = a.reshape(*a.shape[:-1], 1, a.shape[-1])
    w = b.reshape(*b.shape[:-2], 1, *b.shape[-2:]).transpose(-1, -2)
    assert (a @ b).uop is (x * w).sum(-1).uop


def test_matmul_float16():
    a, b = data(3, 8, dtype=np.float16), data(8, 2, dtype=np.float16, seed=1)
    result = Tensor(a) @ Tensor(b)
    assert result.dtype == dtypes.float16
    assert_tensor(result, a.astype(np.float64) @ b.astype(np.float64), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "lazy_fn, numpy_fn",
    [
        (lambda a, b: a.T @ b, lambda a, b: a.T @ b),
        (lambda a, b: a @ b.T.T, lambda a, b: a @ b),
        (lambda a, b: a[::-1] @ b[:, ::2], lambda a, b: a[::-1] @ b[:, ::2]),
        (lambda a, b: a.flip(1) @ b.expand(2, 4, 6)[1], lambda a, b: np.flip(a, 1) @ b),
        (lambda a, b: (a + 1) @ (b * 2), lambda a, b: (a + 1) @ (b * 2)),
        (lambda a, b: a @ b @ b.T, lambda a, b: a @ b @ b.T),
        (lambda a, b: (a @ b).sum(axis=0), lambda a, b: (a @ b).sum(axis=0)),
    ],
    ids=["transposed", "double_transposed", "sliced", "flipped_expanded", "fused_elementwise", "chained", "reduced"],
)
def test_matmul_views(lazy_fn, numpy_fn):
    check(lazy_fn, numpy_fn, data(4, 4), data(4, 6, seed=1), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# non-contiguous inputs: every view shape is (3, 4)

# name: (base shape, lazy view, NumPy view)
VIEWS = {
    "transposed": ((4, 3), lambda t: t.permute(1, 0), lambda x: x.T),
    "sliced": ((6, 5), lambda t: t[::2, 1:], lambda x: x[::2, 1:]),
    "negative_step": ((3, 8), lambda t: t[:, ::-2], lambda x: x[:, ::-2]),
    "flipped": ((3, 4), lambda t: t.flip((0, 1)), lambda x: np.flip(x, (0, 1))),
    "expanded_row": ((1, 4), lambda t: t.expand(3, 4), lambda x: np.broadcast_to(x, (3, 4))),
    "expanded_column": ((3, 1), lambda t: t.expand(-1, 4), lambda x: np.broadcast_to(x, (3, 4))),
    "padded": ((1, 2), lambda t: t.pad(((1, 1), (1, 1))), lambda x: np.pad(x, ((1, 1), (1, 1)))),
    "shrunk": ((5, 6), lambda t: t.shrink(((1, 4), (2, 6))), lambda x: x[1:4, 2:6]),
    "permuted_reshaped": ((4, 3), lambda t: t.permute(1, 0).reshape(3, 4), lambda x: x.T.reshape(3, 4)),
    "broadcast_reshaped": (
        (3, 2),
        lambda t: t[:, None, :].expand(3, 2, 2).reshape(3, 4),
        lambda x: np.broadcast_to(x[:, None, :], (3, 2, 2)).reshape(3, 4),
    ),
}

# name: (lazy op, NumPy op) on a (3, 4) view
VIEW_OPS = {
    "neg_exp": (lambda v: (-v).exp(), lambda x: np.exp(-x)),
    "add_arange": (lambda v: v + Tensor.arange(12).reshape(3, 4), lambda x: x + np.arange(12).reshape(3, 4)),
    "mul_flipped_self": (lambda v: v * v.flip(1), lambda x: x * np.flip(x, 1)),
    "sum_axis0": (lambda v: v.sum(axis=0), lambda x: x.sum(axis=0)),
    "max_axis1": (lambda v: v.max(axis=1, keepdim=True), lambda x: x.max(axis=1, keepdims=True)),
    "sum_all": (lambda v: v.sum(), lambda x: x.sum()),
    "matmul_self_transposed": (lambda v: v @ v.T, lambda x: x @ x.T),
    "contiguous": (lambda v: v.contiguous(), lambda x: x),
    "reshape": (lambda v: v.reshape(4, 3), lambda x: x.reshape(4, 3)),
    "getitem": (lambda v: v[1:, ::-1], lambda x: x[1:, ::-1]),
    "cast_int": (lambda v: v.int(), lambda x: x.astype(np.int32)),
    "where_relu": (lambda v: (v > 0).where(v, 0.0), lambda x: np.where(x > 0, x, 0.0)),
    "softmax": (lambda v: v.softmax(axis=0), lambda x: softmax(x, 0)),
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("op", VIEW_OPS)
def test_ops_on_views(view, op):
    shape, lazy_view, numpy_view = VIEWS[view]
    lazy_op, numpy_op = VIEW_OPS[op]
    array = data(*shape, low=-3, high=3)
    result = lazy_op(lazy_view(Tensor(array)))
    assert_tensor(result, numpy_op(numpy_view(array).astype(np.float64)), atol=1e-5)


def test_view_then_original_still_valid():
    """Views share nothing mutable: using the base after its views gives the original values."""
    array = data(3, 4)
    base = Tensor(array)
    _ = [base.T.numpy(), base[::-1].numpy(), base.reshape(12).numpy(), (base.flip(0) + 1).numpy()]
    assert_tensor(base, array)
    assert_tensor(base.T, array.T)


@pytest.mark.parametrize(
    "lazy_view, numpy_view",
    [
        (lambda t: t.shrink(((1, 1), (1, 2), (0, 0))), lambda x: x[1:1, 1:2, 0:0]),
        (lambda t: t[:, 2:2], lambda x: x[:, 2:2]),
        (lambda t: t[None, 1:, 0:2:-1], lambda x: x[None, 1:, 0:2:-1]),
        (lambda t: t.permute(2, 0, 1)[:, :, 4:], lambda x: x.transpose(2, 0, 1)[:, :, 4:]),
        (lambda t: t[:1, :1, :1].expand(0, 1, 1), lambda x: np.broadcast_to(x[:1, :1, :1], (0, 1, 1))),
    ],
    ids=["shrink", "slice_middle", "negative_step", "permuted", "expanded"],
)
@pytest.mark.parametrize(
    "lazy_op, numpy_op",
    [
        (lambda v: v, lambda x: x),
        (lambda v: v * 2 + 1, lambda x: x * 2 + 1),
        (lambda v: v.contiguous().flip(0), lambda x: np.flip(x, 0)),
        (lambda v: v.sum(axis=-1), lambda x: x.sum(axis=-1)),
        (lambda v: v * v.flip(-1), lambda x: x * np.flip(x, -1)),
    ],
    ids=["numpy", "elementwise", "contiguous_flip", "sum", "mul_flipped"],
)
def test_empty_views(lazy_view, numpy_view, lazy_op, numpy_op):
    """Size-0 views with a zero-length dimension anywhere, fed to elementwise, copy and reduce kernels."""
    array = data(2, 4, 3)
    check(lambda t: lazy_op(lazy_view(t)), lambda x: numpy_op(numpy_view(x)), array)


# ---------------------------------------------------------------------------------------------------------------------
# bad inputs: errors are raised when the op is built, are ValueError / TypeError / IndexError, name what is wrong,
# and leave their inputs intact

SHAPE_ERRORS = (ValueError,)
AXIS_ERRORS = (IndexError, ValueError)
TYPE_ERRORS = (TypeError, ValueError)
f32 = data


def bools(*shape):
    return data(*shape, dtype=np.bool_)


# name: (input arrays, op on their Tensors, accepted errors, things the message must mention)
BAD_INPUTS = {
    "add_broadcast": ([f32(3), f32(4)], lambda a, b: a + b, SHAPE_ERRORS, [(3,), (4,)]),
    "mul_broadcast_2d": ([f32(2, 3), f32(3, 2)], lambda a, b: a * b, SHAPE_ERRORS, [(2, 3), (3, 2)]),
    "compare_broadcast": ([f32(2, 3), f32(2)], lambda a, b: a < b, SHAPE_ERRORS, [(2, 3)]),
    "where_broadcast": ([bools(3), f32(4), f32(3)], lambda c, a, b: c.where(a, b), SHAPE_ERRORS, [(3,), (4,)]),
    "maximum_broadcast": ([f32(5), f32(2)], lambda a, b: a.maximum(b), SHAPE_ERRORS, [(5,), (2,)]),
    "reshape_size": ([f32(2, 3)], lambda t: t.reshape(4, 2), SHAPE_ERRORS, [(2, 3), (4, 2)]),
    "reshape_two_minus_ones": ([f32(2, 3)], lambda t: t.reshape(-1, -1), SHAPE_ERRORS, []),
    "reshape_minus_one_indivisible": ([f32(2, 3)], lambda t: t.reshape(-1, 4), SHAPE_ERRORS, [4]),
    "view_size": ([f32(6)], lambda t: t.view(7), SHAPE_ERRORS, [(6,), (7,)]),
    "expand_incompatible": ([f32(3)], lambda t: t.expand(4), SHAPE_ERRORS, [(3,), (4,)]),
    "expand_fewer_dims": ([f32(2, 3)], lambda t: t.expand(3), SHAPE_ERRORS, [(2, 3)]),
    "sum_axis": ([f32(2, 3)], lambda t: t.sum(axis=2), AXIS_ERRORS, [2]),
    "max_negative_axis": ([f32(2, 3)], lambda t: t.max(axis=-3), AXIS_ERRORS, [-3]),
    "mean_axis_tuple": ([f32(2, 3)], lambda t: t.mean(axis=(0, 5)), AXIS_ERRORS, [5]),
    "argmax_axis": ([f32(2, 3)], lambda t: t.argmax(axis=2), AXIS_ERRORS, [2]),
    "softmax_axis": ([f32(2, 3)], lambda t: t.softmax(axis=3), AXIS_ERRORS, [3]),
    "sum_axis_0d": ([f32()], lambda t: t.sum(axis=1), AXIS_ERRORS, [1]),
    "permute_too_few": ([f32(2, 3)], lambda t: t.permute(0), AXIS_ERRORS, []),
    "permute_repeated": ([f32(2, 3)], lambda t: t.permute(0, 0), AXIS_ERRORS, []),
    "permute_out_of_range": ([f32(2, 3)], lambda t: t.permute(0, 2), AXIS_ERRORS, [2]),
    "transpose_axis": ([f32(2, 3)], lambda t: t.transpose(0, 2), AXIS_ERRORS, [2]),
    "flip_axis": ([f32(2, 3)], lambda t: t.flip(2), AXIS_ERRORS, [2]),
    "squeeze_axis": ([f32(1, 3)], lambda t: t.squeeze(3), AXIS_ERRORS, [3]),
    "unsqueeze_axis": ([f32(2, 3)], lambda t: t.unsqueeze(4), AXIS_ERRORS, [4]),
    "flatten_axis": ([f32(2, 3)], lambda t: t.flatten(3), AXIS_ERRORS, [3]),
    "flatten_start_after_end": ([f32(2, 3)], lambda t: t.flatten(1, 0), AXIS_ERRORS, []),
    "flip_repeated_axis": ([f32(2, 3)], lambda t: t.flip((0, 0)), AXIS_ERRORS, [0]),
    "cat_axis": ([f32(2, 3), f32(2, 3)], lambda a, b: a.cat(b, dim=2), AXIS_ERRORS, [2]),
    "cat_shapes": ([f32(2, 3), f32(2, 4)], lambda a, b: a.cat(b, dim=0), SHAPE_ERRORS, [(2, 3), (2, 4)]),
    "cat_ndim": ([f32(2, 3), f32(3)], lambda a, b: a.cat(b), SHAPE_ERRORS, [(2, 3), (3,)]),
    "stack_shapes": ([f32(2, 3), f32(3, 2)], lambda a, b: a.stack(b), SHAPE_ERRORS, [(2, 3), (3, 2)]),
    "pad_too_many_dims": ([f32(2, 3)], lambda t: t.pad(((1, 1), (1, 1), (1, 1))), SHAPE_ERRORS, []),
    "pad_malformed_pair": ([f32(2, 3)], lambda t: t.pad(((1,), (0, 0))), TYPE_ERRORS, []),
    "shrink_out_of_bounds": ([f32(3)], lambda t: t.shrink(((0, 5),)), SHAPE_ERRORS, [5]),
    "split_sizes": ([f32(5)], lambda t: t.split([2, 2]), SHAPE_ERRORS, [5]),
    "matmul_inner": ([f32(2, 3), f32(4, 5)], lambda a, b: a @ b, SHAPE_ERRORS, [(2, 3), (4, 5)]),
    "matmul_vectors": ([f32(3), f32(4)], lambda a, b: a @ b, SHAPE_ERRORS, [(3,), (4,)]),
    "matmul_batch": ([f32(2, 2, 3), f32(3, 3, 4)], lambda a, b: a @ b, SHAPE_ERRORS, [(2, 2, 3), (3, 3, 4)]),
    "matmul_0d": ([f32(), f32(3)], lambda a, b: a @ b, TYPE_ERRORS, []),
    "dot_inner": ([f32(2, 3), f32(2, 3)], lambda a, b: a.dot(b), SHAPE_ERRORS, [(2, 3)]),
    "item_non_scalar": ([f32(2)], lambda t: t.item(), TYPE_ERRORS, [(2,)]),
    "getitem_int": ([f32(3)], lambda t: t[3], (IndexError,), [3]),
    "getitem_negative": ([f32(3)], lambda t: t[-4], (IndexError,), [-4]),
    "getitem_second_dim": ([f32(2, 3)], lambda t: t[0, 3], (IndexError,), [3]),
    "getitem_too_many": ([f32(2, 3)], lambda t: t[0, 0, 0], (IndexError,), []),
    "getitem_0d": ([f32()], lambda t: t[0], (IndexError,), []),
    "getitem_two_ellipses": ([f32(2, 3)], lambda t: t[..., 0, ...], (IndexError,), []),
    "bitwise_float": ([f32(2), f32(2)], lambda a, b: a & b, TYPE_ERRORS, []),
    "invert_float": ([f32(2)], lambda t: ~t, TYPE_ERRORS, []),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input(name):
    arrays, op, errors, mentions = BAD_INPUTS[name]
    tensors = [Tensor(array) for array in arrays]
    with pytest.raises(errors) as info:
        op(*tensors)
    assert str(info.value), "the error has no message"
    assert_mentions(str(info.value), *mentions)
    for tensor, array in zip(tensors, arrays):  # no state is corrupted
        assert_tensor(tensor, array)
        assert_tensor(tensor.cast(dtypes.float32) * 2, array.astype(np.float32) * 2)


@pytest.mark.parametrize(
    "make, errors",
    [
        (lambda: Tensor([[1, 2], [3]]), (ValueError,)),
        (lambda: Tensor([1, [2, 3]]), (ValueError,)),
        (lambda: Tensor([[1.0], [2.0, 3.0], []]), (ValueError,)),
        (lambda: Tensor([1], dtype="complex64"), TYPE_ERRORS),
        (lambda: Tensor(np.array([1 + 2j, 3j])), TYPE_ERRORS),
        (lambda: Tensor(np.array(["a", "b"])), TYPE_ERRORS),
        (lambda: Tensor("abc"), TYPE_ERRORS),
        (lambda: Tensor([1.0]).cast("complex64"), TYPE_ERRORS),
        (lambda: Tensor.zeros(2, -1), (ValueError,)),
        (lambda: Tensor.arange(0, 5, 0), (ValueError,)),
        (lambda: Tensor.eye(-1), (ValueError,)),
    ],
    ids=["ragged", "ragged_scalar", "ragged_3", "dtype_name", "numpy_complex", "numpy_str", "str", "cast_complex"]
    + ["negative_shape", "arange_zero_step", "eye_negative"],
)
def test_bad_construction(make, errors):
    with pytest.raises(errors) as info:
        make()
    assert str(info.value), "the error has no message"


def test_bad_dtype_message_names_dtype():
    with pytest.raises(TYPE_ERRORS) as info:
        Tensor([1], dtype="complex64")
    assert "complex" in str(info.value)


def test_failed_op_leaves_graph_usable():
    """A failed op in the middle of a lazy graph does not break the graph built so far."""
    a = Tensor(data(2, 3))
    partial = (a * 3).exp()
    with pytest.raises(SHAPE_ERRORS):
        partial + Tensor(data(4))
    assert_tensor(partial.sum(axis=1), np.exp(data(2, 3).astype(np.float64) * 3).sum(axis=1))


# ---------------------------------------------------------------------------------------------------------------------
# laziness


def realized_inputs():
    a, b = Tensor(data(4, 5)), Tensor(data(4, 5, seed=1))
    a.realize()
    b.realize()
    return a, b


def test_building_ops_runs_no_kernels():
    a, b = realized_inputs()
    GlobalCounters.reset()
    result = ((a + b).exp() * 2).sum(axis=1).reshape(2, 2).T @ Tensor.ones(2, 3)
    _ = (result.shape, result.dtype, result.ndim, result.numel(), len(result))
    assert GlobalCounters.kernel_count == 0
    result.numpy()
    assert GlobalCounters.kernel_count > 0


def test_realize_runs_kernels_once():
    a, b = realized_inputs()
    result = (a * b + 1).relu()
    GlobalCounters.reset()
    result.realize()
    kernels = GlobalCounters.kernel_count
    assert kernels > 0
    first = result.numpy()
    np.testing.assert_array_equal(result.numpy(), first)
    assert GlobalCounters.kernel_count == kernels, "realized tensor was computed again"


def test_schedule_is_lazy_and_counts_kernels():
    a, b = realized_inputs()
    result = ((a + b) * 2 - a).exp()
    GlobalCounters.reset()
    schedule = result.schedule()
    assert GlobalCounters.kernel_count == 0
    assert len(schedule) == 1, "an elementwise chain on realized inputs is one kernel"
    result.realize()
    assert len(result.schedule()) == 0
    assert_tensor(result, np.exp((data(4, 5) + data(4, 5, seed=1)) * 2 - data(4, 5)))


def test_shared_subexpression_not_recomputed():
    a, b = realized_inputs()
    shared = (a + b).exp()
    shared.realize()
    GlobalCounters.reset()
    dependent = shared * 2
    dependent.realize()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(dependent.numpy(), shared.numpy() * 2, rtol=1e-6)


# =====================================================================================================================
# The PyTorch op surface: math, reductions and scans, model-writing helpers, edge cases (each against torch, values
# and gradients). The tests of this section are named test_api_*, so `-k api_` runs just them.


def test_api_mixins_never_import_tensor_module_at_run_time():
    """The Tensor mixins build results through `type(self)` and `self`, so imports run one way: tensor.py imports
    them, and they import lazygrad.tensor for type annotations only."""
    import ast
    import pathlib

    import lazygrad

    for path in sorted(pathlib.Path(lazygrad.__file__).parent.glob("tensor_*.py")):
        tree = ast.parse(path.read_text())
        type_only = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
            for node in ast.walk(block)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "lazygrad.tensor":
                assert id(node) in type_only, f"{path.name}:{node.lineno} imports lazygrad.tensor at run time"


try:
    import torch
except ImportError:  # the comparisons below skip without torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def against_torch(lazy_fn, torch_fn, *arrays, grad=True, rtol=1e-5, atol=1e-6, grad_rtol=1e-4, grad_atol=1e-5):
    """Apply `lazy_fn` to Tensors and `torch_fn` to torch tensors made from `arrays`; compare the outputs (shape,
    dtype kind, values, NaN where torch has NaN) and, with `grad`, every float input's gradient of
    (out * upstream).sum() for a fixed random upstream. A function may return a tuple of outputs."""
    lazy_inputs = [Tensor(a) for a in arrays]
    torch_inputs = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    lazy_outputs, torch_outputs = lazy_fn(*lazy_inputs), torch_fn(*torch_inputs)
    if not isinstance(lazy_outputs, tuple):
        lazy_outputs, torch_outputs = (lazy_outputs,), (torch_outputs,)
    for lazy, reference in zip(lazy_outputs, torch_outputs):
        assert lazy.dtype.name == str(reference.dtype).removeprefix("torch."), (
            f"dtype {lazy.dtype} != {reference.dtype}"
        )
        assert_tensor(lazy, reference.detach().numpy(), rtol=rtol, atol=atol)
    if not grad:
        return
    rng = np.random.default_rng(1)
    lazy_total, torch_total = 0, 0
    for lazy, reference in zip(lazy_outputs, torch_outputs):
        if reference.dtype.is_floating_point:
            upstream = rng.standard_normal(tuple(reference.shape)).astype(np.float32)
            lazy_total = lazy_total + (lazy * Tensor(upstream)).sum()
            torch_total = torch_total + (reference * torch.tensor(upstream)).sum()
    if isinstance(torch_total, int) or not torch_total.requires_grad:
        return  # no float output, or none that depends on a float input: nothing to differentiate
    torch_total.backward()
    lazy_grads = lazy_total.gradient(*[t for t, a in zip(lazy_inputs, arrays) if a.dtype.kind == "f"])
    torch_grads = [t.grad for t, a in zip(torch_inputs, arrays) if a.dtype.kind == "f"]
    for lazy, reference in zip(lazy_grads, torch_grads):
        expected = np.zeros(lazy.shape, np.float32) if reference is None else reference.numpy()
        np.testing.assert_allclose(lazy.numpy(), expected, rtol=grad_rtol, atol=grad_atol, err_msg="gradient")


API_ANY = np.array([-5.0, -2.7, -1.3, -0.6, -0.1, 0.0, 0.05, 0.4, 1.1, 2.2, 3.9, 7.5], np.float32)
API_UNIT = np.array([-0.99, -0.7, -0.3, -0.01, 0.0, 0.2, 0.5, 0.9, 0.995], np.float32)
API_ABOVE_ONE = np.array([1.001, 1.2, 1.5, 3.0, 10.0, 1000.0], np.float32)

TF = torch.nn.functional if torch else None

# name: (lazygrad function, torch function, inputs): compared in values and gradients
API_UNARY = {
    "sinh": (lambda x: x.sinh(), lambda x: x.sinh(), API_ANY),
    "cosh": (lambda x: x.cosh(), lambda x: x.cosh(), API_ANY),
    "atan": (lambda x: x.atan(), lambda x: x.atan(), np.concatenate([API_ANY, [-300.0, 0.3, 0.45, 2.3, 2.5, 1e4]])),
    "asin": (lambda x: x.asin(), lambda x: x.asin(), API_UNIT),
    "acos": (lambda x: x.acos(), lambda x: x.acos(), API_UNIT),
    "asinh": (lambda x: x.asinh(), lambda x: x.asinh(), np.concatenate([API_ANY, [-1e3, 1e5]])),
    "acosh": (lambda x: x.acosh(), lambda x: x.acosh(), API_ABOVE_ONE),
    "atanh": (lambda x: x.atanh(), lambda x: x.atanh(), API_UNIT),
    "erf": (lambda x: x.erf(), lambda x: x.erf(), np.concatenate([API_ANY, [-0.45, 0.9, 1.7, -3.3]])),
    "softsign": (lambda x: x.softsign(), lambda x: TF.softsign(x), API_ANY),
    "selu": (lambda x: x.selu(), lambda x: TF.selu(x), API_ANY),
    "celu": (lambda x: x.celu(), lambda x: TF.celu(x), API_ANY),
    "celu_alpha": (lambda x: x.celu(0.5), lambda x: TF.celu(x, 0.5), API_ANY),
    "mish": (lambda x: x.mish(), lambda x: TF.mish(x), np.concatenate([API_ANY, [-30.0, 25.0]])),
    "hardswish": (lambda x: x.hardswish(), lambda x: TF.hardswish(x), API_ANY),
    "hardsigmoid": (lambda x: x.hardsigmoid(), lambda x: TF.hardsigmoid(x), API_ANY),
    "logsigmoid": (lambda x: x.logsigmoid(), lambda x: TF.logsigmoid(x), np.concatenate([API_ANY, [-90.0, 90.0]])),
    "softplus": (lambda x: x.softplus(), lambda x: TF.softplus(x), np.concatenate([API_ANY, [-90.0, 19.0, 21.0]])),
    "softplus_beta": (
        lambda x: x.softplus(beta=2.0, threshold=5.0),
        lambda x: TF.softplus(x, beta=2.0, threshold=5.0),
        API_ANY,
    ),
    "hardsigmoid_line": (lambda x: x.hardsigmoid(0.2, 0.4), lambda x: (0.2 * x + 0.4).clamp(0, 1), API_ANY),
    "selu_constants": (lambda x: x.selu(1.5, 2.0), lambda x: 2.0 * TF.elu(x, 1.5), API_ANY),
    "sigmoid": (lambda x: x.sigmoid(), lambda x: x.sigmoid(), np.concatenate([API_ANY, [-300.0, 300.0]])),
    "tanh": (lambda x: x.tanh(), lambda x: x.tanh(), np.concatenate([API_ANY, [-300.0, 300.0]])),
}


@needs_torch
@pytest.mark.parametrize("name", list(API_UNARY))
def test_api_unary_against_torch(name):
    lazy_fn, torch_fn, values = API_UNARY[name]
    against_torch(lazy_fn, torch_fn, np.asarray(values, np.float32), atol=2e-6)


@needs_torch
@pytest.mark.parametrize("name", list(API_UNARY))
def test_api_unary_float16(name):
    lazy_fn, torch_fn, values = API_UNARY[name]
    values = np.asarray(values)[np.abs(values) < 1000].astype(np.float16)
    result = lazy_fn(Tensor(values))
    assert result.dtype == dtypes.float16, f"{name} of float16 gave {result.dtype}"
    expected = torch_fn(torch.tensor(values, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(result.numpy().astype(np.float32), expected, rtol=1e-2, atol=2e-3)


@needs_torch
@pytest.mark.parametrize(
    "name, values",
    [
        ("atan", [-np.inf, np.inf, np.nan, 1e30, -1e-30]),
        ("asin", [-1.0, 1.0, 1.5, np.nan]),
        ("acos", [-1.0, 1.0, -1.5, np.nan]),
        ("asinh", [-np.inf, np.inf, 3e38, -1e-20]),
        ("acosh", [1.0, 0.5, np.inf, 3e38]),
        ("atanh", [-1.0, 1.0, 2.0, np.nan]),
        ("erf", [-np.inf, np.inf, np.nan, 12.0]),
        ("sinh", [89.0, -89.0, np.inf, 1e-3]),
        ("cosh", [89.0, -89.0, -np.inf, 0.0]),
        ("softsign", [np.inf, -np.inf, 1e30, 0.0]),
        ("mish", [np.inf, -np.inf, 100.0, -100.0]),
    ],
)
def test_api_unary_special_values(name, values):
    lazy_fn, torch_fn, _ = API_UNARY[name]
    against_torch(lazy_fn, torch_fn, np.asarray(values, np.float32), grad=False)


@needs_torch
def test_api_lerp_copysign():
    a, b, w = data(3, 4), data(3, 4, seed=1), data(3, 4, seed=2, low=0.0, high=1.0)
    against_torch(lambda a, b, w: a.lerp(b, w), torch.lerp, a, b, w)
    against_torch(lambda a, b: a.lerp(b, 0.25), lambda a, b: torch.lerp(a, b, 0.25), a, b)
    against_torch(lambda a, b: a.lerp(b[0], 0.7), lambda a, b: torch.lerp(a, b[0], 0.7), a, b)
    column, row = data(3, 1, seed=3), data(4, seed=4)
    against_torch(lambda a, c, r: a[0].lerp(c, r), lambda a, c, r: torch.lerp(a[0], c, r), a, column, row)
    with pytest.raises(ValueError, match=r"lerp: shapes \(3, 4\) and \(2,\)"):
        Tensor(a).lerp(Tensor([1.0, 2.0]), 0.5)
    signs = np.array([[1.0, -1.0, 0.5, -0.1], [-2.0, 3.0, -7.0, 0.5], [1e9, -1e-9, 1.0, -1.0]], np.float32)
    against_torch(lambda a, s: a.copysign(s), torch.copysign, a, signs)
    # torch's gradient is 0 or nan at a zero or infinite sign: compare values only
    special = np.array([[0.0, -0.0, np.inf, -np.inf], [np.nan, 2.0, -0.0, 0.0], [1.0, -1.0, 0.0, -0.0]], np.float32)
    against_torch(lambda a, s: a.copysign(s), torch.copysign, np.abs(a) * np.sign(signs), special, grad=False)
    against_torch(lambda a: a.copysign(-1.0), lambda a: torch.copysign(a, torch.tensor(-1.0)), a)
    against_torch(lambda s: s.copysign(2), lambda s: torch.copysign(s, torch.tensor(2.0)), signs)
    against_torch(lambda i: i.copysign(-1), lambda i: torch.copysign(i, torch.tensor(-1)), data(5, dtype=np.int32))


@needs_torch
def test_api_isclose_isnan_isinf_isfinite():
    special = np.array([0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-9, 1.00001, 3.0], np.float32)
    other = np.array([1e-9, 1.0 + 1e-6, -1.1, np.inf, np.inf, np.nan, 0.0, 1.0, np.nan], np.float32)
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 0.2, "atol": 0.0}, {"rtol": 0.0, "atol": 1e-3}):
        against_torch(lambda a, b: a.isclose(b, **kwargs), lambda a, b: torch.isclose(a, b, **kwargs), special, other)
    for name in ("isnan", "isinf", "isfinite"):
        against_torch(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x), special, grad=False)
        against_torch(lambda x: getattr(x, name)(), lambda x: getattr(torch, name)(x), data(4, dtype=np.int32))
    assert_tensor(Tensor(special).isinf(detect_negative=False), np.isposinf(special))
    assert_tensor(Tensor(special).isinf(detect_positive=False), np.isneginf(special))
    with pytest.raises(ValueError, match="isclose.*rtol"):
        Tensor(special).isclose(Tensor(other), rtol=-1)


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_api_div_rounding_modes_and_idiv(dtype):
    a = np.array([7, -7, 7, -7, 0, 5, -9, 3], dtype) * (1.5 if dtype == np.float32 else 1)
    b = np.array([2, 2, -2, -2, 3, 5, 4, -7], dtype)
    for mode in ("trunc", "floor"):
        lazy, reference = (
            Tensor(a).div(Tensor(b), rounding_mode=mode),
            torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode),
        )
        assert_tensor(lazy, reference.numpy(), dtype=Tensor(a).dtype)
        scalar = torch.div(torch.tensor(a), 3, rounding_mode=mode).numpy()
        assert_tensor(Tensor(a).div(3, rounding_mode=mode), scalar)
        reverse = torch.div(torch.tensor(100, dtype=torch.tensor(b).dtype), torch.tensor(b), rounding_mode=mode)
        assert_tensor(Tensor(b).div(100, reverse=True, rounding_mode=mode), reverse.numpy())
    assert_tensor(Tensor(a) // Tensor(b), torch.tensor(a) // torch.tensor(b))
    if dtype == np.int32:
        assert_tensor(Tensor(a).idiv(Tensor(b)), torch.div(torch.tensor(a), torch.tensor(b), rounding_mode="trunc"))
        assert_tensor(Tensor(a).idiv(3), np.trunc(a / 3).astype(np.int32))
    else:
        with pytest.raises(TypeError, match="idiv.*float32.*rounding_mode='trunc'"):
            Tensor(a).idiv(Tensor(b))
    with pytest.raises(ValueError, match="div.*rounding_mode.*'round'"):
        Tensor(a).div(Tensor(b), rounding_mode="round")


@needs_torch
def test_api_bitwise_and_shifts():
    a, b = data(3, 5, dtype=np.int32, low=-100, high=100), data(3, 5, dtype=np.int32, low=-100, high=100, seed=1)
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        against_torch(lambda a, b: getattr(a, name)(b), lambda a, b: getattr(torch, name)(a, b), a, b)
        against_torch(lambda a: getattr(a, name)(6), lambda a: getattr(torch, name)(a, 6), a)
    against_torch(lambda a: a.bitwise_not(), torch.bitwise_not, a)
    for lazy_fn, torch_fn in [
        (lambda a, b: a & b, lambda a, b: a & b),
        (lambda a, b: a | b, lambda a, b: a | b),
        (lambda a, b: a ^ b, lambda a, b: a ^ b),
        (lambda a, b: ~a, lambda a, b: ~a),
        (lambda a, b: 5 & a, lambda a, b: 5 & a),
    ]:
        against_torch(lazy_fn, torch_fn, a, b)
    flags = data(2, 4, dtype=np.bool_), data(2, 4, dtype=np.bool_, seed=1)
    against_torch(lambda a, b: a.bitwise_xor(b) | ~a, lambda a, b: a.bitwise_xor(b) | ~a, *flags)
    amounts = np.array([[0, 1, 3, 7, 30], [2, 4, 5, 9, 1], [1, 1, 0, 2, 3]], np.int32)
    against_torch(lambda a, s: a << s, lambda a, s: a << s, a, amounts)
    against_torch(lambda a, s: a >> s, lambda a, s: a >> s, a, amounts)
    against_torch(lambda a: (a.lshift(2), a.rshift(3)), lambda a: (a << 2, a >> 3), a)
    against_torch(lambda s: (1 << s, 1024 >> s), lambda s: (1 << s, 1024 >> s), amounts)
    for bad in (lambda: Tensor([1.5]) & 1, lambda: Tensor([1.5]).bitwise_or(Tensor([1])), lambda: ~Tensor([1.0])):
        with pytest.raises(TypeError, match="float32"):
            bad()
    with pytest.raises(TypeError, match="cast to an int dtype"):
        Tensor([1.5]) << 1
    # a number of bits past the dtype's shifts every bit out, as torch (it was an error)
    assert (Tensor([1]) << 32).tolist() == [0] and (Tensor([-8]) >> 40).tolist() == [-1]


def test_api_bitcast():
    values = np.array([1.0, -2.5, 0.0, np.inf, 3.3e38, -1e-40], np.float32)
    assert_tensor(Tensor(values).bitcast(dtypes.int32), values.view(np.int32), dtype=dtypes.int32)
    assert_tensor(
        Tensor(values).bitcast("uint32").cast(dtypes.int64) >> 31, (values.view(np.uint32) >> 31).astype(np.int64)
    )
    bits = values.view(np.int32)
    assert_tensor(Tensor(bits).bitcast(dtypes.float32), values)
    # the sign bit cleared through the integers is |x|
    assert_tensor((Tensor(values).bitcast(dtypes.int32) & 0x7FFFFFFF).bitcast(dtypes.float32), np.abs(values))
    assert_tensor(Tensor(np.array([1, 2], np.float16)).bitcast(dtypes.float16), np.array([1, 2], np.float16))
    with pytest.raises(TypeError, match="bitcast.*float32.*4 bytes.*float16.*2 bytes.*cast"):
        Tensor(values).bitcast(dtypes.float16)
    with pytest.raises(TypeError, match="bitcast.*bool"):
        Tensor([1, 2]).bitcast(dtypes.bool)


@needs_torch
@pytest.mark.parametrize("shape, axis", [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -2), ((), 0), ((4, 0), 1)])
def test_api_scans_against_torch(shape, axis):
    x = data(*shape, low=-1.5, high=1.5)
    against_torch(lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), x)
    against_torch(lambda x: x.cumprod(axis), lambda x: x.cumprod(axis), x)
    against_torch(lambda x: x.logcumsumexp(axis), lambda x: x.logcumsumexp(axis), x)
    against_torch(lambda x: x.cummax(axis), lambda x: tuple(torch.cummax(x, axis)), x)


LONG_SCANS = [((1100, 2, 4), 0), ((40000,), 0), ((3, 1500), 1), ((2100,), 0)]


@needs_torch
# (the blocks are the same on every device: the devices that compile each kernel in a process of their own run the
# first two, a scan along an outer axis and one of two levels of blocks)
@pytest.mark.parametrize("shape, axis", LONG_SCANS if Device.DEFAULT == "LLVM" else LONG_SCANS[:2])
def test_api_long_scans_go_by_blocks_against_torch(shape, axis):
    # rows whose prefixes are more than DIRECT_SCAN_WORK values: blocks' prefixes, then the blocks' running totals
    # (40,000: the totals of 2,500 blocks go by blocks again)
    x = data(*shape, low=-1.5, high=1.5)
    # (the gradient, a reverse cumsum of 40,000 normal values, reaches 370, where float32's spacing is 3e-5)
    against_torch(lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), x, rtol=1e-4, atol=1e-4, grad_atol=1e-4)
    against_torch(lambda x: (x * 0.001 + 1).cumprod(axis), lambda x: (x * 0.001 + 1).cumprod(axis), x, rtol=1e-4)
    against_torch(lambda x: x.logcumsumexp(axis), lambda x: x.logcumsumexp(axis), x, rtol=1e-5, atol=1e-5)
    ints = data(*shape, dtype=np.int32, low=-3, high=4)
    assert_tensor(Tensor(ints).cumsum(axis), torch.tensor(ints).cumsum(axis).numpy(), dtype=dtypes.int64)
    # running extremes by blocks too (their indices are a running maximum of where each element equalled the
    # maximum so far): ties take the latest index, a NaN the latest NaN from it on
    ties = data(*shape, low=-3, high=3, integral=True)
    ties.reshape(-1)[ties.size // 3] = np.nan
    against_torch(lambda x: x.cummax(axis), lambda x: tuple(torch.cummax(x, axis)), ties)
    against_torch(lambda x: x.cummin(axis), lambda x: tuple(torch.cummin(x, axis)), ties)


@needs_torch
def test_api_scans_edge_values():
    special = np.array([1.0, 3.0, 3.0, 2.0, -np.inf, 5.0, 5.0, 0.0], np.float32)
    against_torch(lambda x: x.cummax(0), lambda x: tuple(torch.cummax(x, 0)), special, grad=False)
    # ties: the gradient goes to the element at the reported index, as in torch (not split between equal ones)
    ties = np.array([[1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 0.0], [2.0, 2.0, 2.0, -1.0, 2.0, 4.0, 4.0]], np.float32)
    against_torch(lambda x: x.cummax(1), lambda x: tuple(torch.cummax(x, 1)), ties)
    with_nan = np.array([1.0, np.nan, 3.0, np.nan, 0.0], np.float32)
    against_torch(lambda x: x.cummax(0), lambda x: tuple(torch.cummax(x, 0)), with_nan, grad=False)
    # an infinity in the input stays where it is: no inf * 0 from the prefix mask
    against_torch(lambda x: x.cumsum(0), lambda x: x.cumsum(0), np.array([1.0, np.inf, 2.0], np.float32), grad=False)
    # log-sum-exp of each prefix is shifted by that prefix's own maximum
    wide = np.array([-100.0, 0.0, -200.0, 50.0, -np.inf], np.float32)
    against_torch(lambda x: x.logcumsumexp(0), lambda x: x.logcumsumexp(0), wide, grad=False)
    # zeros in cumprod: the gradient of the elements before a zero still flows
    zeros = np.array([[2.0, 0.0, 3.0, -1.0], [0.0, 0.0, 1.5, 2.0]], np.float32)
    against_torch(lambda x: x.cumprod(1), lambda x: x.cumprod(1), zeros)
    ints = data(3, 4, dtype=np.int32, low=-3, high=4)
    for name in ("cumsum", "cumprod"):
        lazy, reference = getattr(Tensor(ints), name)(1), getattr(torch.tensor(ints), name)(1)
        assert_tensor(lazy, reference.numpy(), dtype=dtypes.int64)
    assert_tensor(Tensor(ints).cummax(1)[0], torch.cummax(torch.tensor(ints), 1).values.numpy())
    assert_tensor(Tensor(ints).cummax(1)[1], torch.cummax(torch.tensor(ints), 1).indices.numpy(), dtype=dtypes.int64)
    with pytest.raises(IndexError, match="cumprod.*axis 2.*2 dimensions"):
        Tensor(ints).cumprod(2)


@needs_torch
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape, dim", [((9,), 0), ((3, 6), 1), ((3, 6), 0), ((2, 3, 4), -2), ((), 0), ((3, 0), 1)])
def test_api_sort_argsort_against_torch(shape, dim, descending):
    x = data(*shape, integral=True)  # whole numbers: ties, which stable sorting orders by position
    against_torch(
        lambda x: x.sort(dim, descending=descending),
        lambda x: tuple(torch.sort(x, dim=dim, descending=descending, stable=True)),
        x,
    )
    against_torch(
        lambda x: x.argsort(dim, descending=descending),
        lambda x: torch.sort(x, dim=dim, descending=descending, stable=True).indices,
        x,
    )


@needs_torch
def test_api_sort_special_values_and_dtypes():
    special = np.array([2.0, np.nan, -np.inf, 1.0, np.inf, np.nan, -0.0, 0.0, 1.0], np.float32)
    for descending in (False, True):
        against_torch(
            lambda x: x.sort(descending=descending),
            lambda x: tuple(torch.sort(x, descending=descending, stable=True)),
            special,
            grad=False,
        )
    ints = data(4, 6, dtype=np.int32, low=-3, high=3)
    against_torch(lambda x: x.sort(1), lambda x: tuple(torch.sort(x, dim=1, stable=True)), ints)
    flags = data(10, dtype=np.bool_)
    against_torch(lambda x: x.argsort(), lambda x: torch.sort(x, stable=True).indices, flags)
    assert Tensor(ints).argsort().dtype == dtypes.int64


@needs_torch
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(
    "shape, k, dim", [((8,), 3, 0), ((3, 6), 6, 1), ((5, 4), 2, 0), ((2, 3, 5), 1, -1), ((4,), 0, 0)]
)
def test_api_topk_against_torch(shape, k, dim, largest):
    rng = np.random.default_rng(3)
    x = (
        rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32) * 0.25
    )  # distinct: torch orders ties freely
    against_torch(lambda x: x.topk(k, dim, largest), lambda x: tuple(torch.topk(x, k, dim, largest)), x)


def test_api_topk_errors():
    with pytest.raises(ValueError, match=r"topk: k must be an int in 0\.\.4.*\(3, 4\).*5"):
        Tensor.ones(3, 4).topk(5)
    with pytest.raises(IndexError, match="sort.*axis 2"):
        Tensor.ones(3, 4).sort(2)


@needs_torch
@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize(
    "shape, axis, keepdim",
    [((4, 5), 1, False), ((4, 5), None, False), ((3, 1, 4), 1, True), ((2, 3, 4), (0, 2), False)],
)
def test_api_var_std_mean_against_torch(shape, axis, keepdim, correction):
    x = data(*shape)
    count = int(np.prod([shape[a] for a in ((axis,) if isinstance(axis, int) else axis or range(len(shape)))]))
    for name in ("var_mean", "std_mean"):
        against_torch(
            lambda x: getattr(x, name)(axis, keepdim=keepdim, correction=correction),
            lambda x: tuple(getattr(torch, name)(x, dim=axis, keepdim=keepdim, correction=correction)),
            x,
            grad=correction < count,  # torch's gradient of a nan variance (no degrees of freedom left) is arbitrary
            grad_rtol=1e-3,
        )


@needs_torch
@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
def test_api_var_std_over_size_one_axes():
    x = data(3, 1)
    for correction in (0, 1):
        against_torch(
            lambda x: x.var(1, correction=correction), lambda x: x.var(1, correction=correction), x, grad=False
        )
        against_torch(
            lambda x: x.std(1, correction=correction), lambda x: x.std(1, correction=correction), x, grad=False
        )
    against_torch(lambda x: x.var(correction=0), lambda x: x.var(correction=0), data(1))
    assert np.isnan(Tensor(2.0).var().numpy())
    # no degrees of freedom left: the sum of squares over zero, inf (nan where the values are equal), as torch
    rows = np.array([[1.0, 2.0, 4.0, 5.0], [3.0, 3.0, 3.0, 3.0]], np.float32)  # (means exact in float32)
    for correction in (4, 5):
        for name in ("var", "std"):
            ours = getattr(Tensor(rows), name)(1, correction=correction).numpy()
            np.testing.assert_array_equal(ours, getattr(torch.tensor(rows), name)(1, correction=correction).numpy())


@needs_torch
def test_api_reductions_with_dtype():
    ints, floats = data(3, 4, dtype=np.int32, low=-5, high=5), data(3, 4)
    assert_tensor(
        Tensor(ints).sum(1, dtype=dtypes.float32),
        torch.tensor(ints).sum(1, dtype=torch.float32).numpy(),
        dtype=dtypes.float32,
    )
    assert_tensor(
        Tensor(floats).sum(dtype="int32"), torch.tensor(floats).sum(dtype=torch.int32).numpy(), dtype=dtypes.int32
    )
    assert_tensor(
        Tensor(ints).prod(0, dtype=dtypes.float32),
        torch.tensor(ints).prod(0, dtype=torch.float32).numpy(),
        dtype=dtypes.float32,
    )
    assert_tensor(
        Tensor(ints).mean(1, dtype=dtypes.float32),
        torch.tensor(ints).mean(1, dtype=torch.float32).numpy(),
        dtype=dtypes.float32,
    )
    assert_tensor(
        Tensor(floats).mean(0, dtype=dtypes.float16),
        torch.tensor(floats).mean(0, dtype=torch.float16).numpy(),
        dtype=dtypes.float16,
    )
    against_torch(lambda x: x.sum(0, dtype=dtypes.float32), lambda x: x.sum(0, dtype=torch.float32), floats)
    with pytest.raises(TypeError, match="mean: dtype must be a float dtype.*int32"):
        Tensor(floats).mean(dtype=dtypes.int32)


@needs_torch
def test_api_linear_and_sequential():
    x, w, b = data(4, 3), data(5, 3, seed=1), data(5, seed=2)
    # tinygrad's weight layout is (in, out): the transpose of torch's
    against_torch(lambda x, w, b: x.linear(w.T, b), lambda x, w, b: TF.linear(x, w, b), x, w, b)
    against_torch(lambda x, w: x.linear(w.T), lambda x, w: TF.linear(x, w), x, w)
    against_torch(lambda x, w: x.linear(w[0, :]), lambda x, w: x * w[0, :], x, w)
    against_torch(lambda x, w, b: x[0].linear(w.T, b), lambda x, w, b: TF.linear(x[0], w, b), x, w, b)
    with pytest.raises(ValueError, match=r"linear: input \(4, 3\).*5 features.*\(5, 3\).*transpose"):
        Tensor(x).linear(Tensor(w))
    layers = [lambda t: t.linear(Tensor(w).T, Tensor(b)), Tensor.relu, lambda t: t.sum(1)]
    expected = TF.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b)).relu().sum(1)
    assert_tensor(Tensor(x).sequential(layers), expected.numpy())
    assert Tensor(x).sequential([]).shape == (4, 3)
    with pytest.raises(TypeError, match="sequential: layer 1 is a int, not callable"):
        Tensor(x).sequential([Tensor.relu, 3])


def test_api_train_and_test_modes():
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(False):
            assert Tensor.training is False
            assert_tensor(Tensor.ones(8).dropout(0.5), np.ones(8, np.float32))
        dropped = Tensor.ones(64).dropout(0.5).numpy()
        assert set(np.unique(dropped)) <= {0.0, 2.0} and 0 < dropped.sum() < 128
    assert Tensor.training is False

    @Tensor.train()
    def step():
        return Tensor.training

    assert step() is True and Tensor.training is False
    with pytest.raises(KeyError):
        with Tensor.train():
            raise KeyError("the mode is restored on errors too")
    assert Tensor.training is False
    x = Tensor([1.0, 2.0], requires_grad=True)
    with Tensor.test():
        assert Tensor.no_grad is True
        y = (x * 2).sum()
    assert Tensor.no_grad is False
    with pytest.raises(RuntimeError, match="no_grad"):
        with Tensor.test():
            y.backward()


def test_api_batchnorm_follows_training_mode():
    from lazygrad import nn

    norm, x = nn.BatchNorm(3), Tensor(data(4, 3, 2))
    assert_tensor(norm(x), data(4, 3, 2) / np.sqrt(1 + 1e-5), rtol=1e-5)  # eval: running statistics (0 and 1)
    with Tensor.train():
        normalized = norm(x).numpy()
    np.testing.assert_allclose(normalized.mean((0, 2)), 0, atol=1e-5)  # training: batch statistics
    assert not np.allclose(norm.running_mean.numpy(), 0)


def test_api_movement_keyword_forms():
    x = Tensor(data(2, 3))
    assert_tensor(x.reshape(shape=(3, 2)), data(2, 3).reshape(3, 2))
    assert_tensor(x.reshape(shape=(-1,)), data(2, 3).reshape(-1))
    assert_tensor(x[:1].expand(shape=(4, 3)), np.broadcast_to(data(2, 3)[:1], (4, 3)))
    assert_tensor(x.permute(order=(1, 0)), data(2, 3).T)
    assert_tensor(
        x.reshape((3, 2)).permute(1, 0).expand((2, 2, 3)), np.broadcast_to(data(2, 3).reshape(3, 2).T, (2, 2, 3))
    )
    with pytest.raises(TypeError, match="reshape: sizes must be ints"):
        x.reshape(shape=(3, 2.0))
    with pytest.raises(ValueError, match=r"permute.*\(0, 0\).*2 axes"):
        x.permute(order=(0, 0))


@needs_torch
def test_api_softmax_family_of_0d_tensors():
    x = np.array(1.5, np.float32)
    for axis in (0, -1):
        against_torch(lambda x: x.softmax(axis), lambda x: x.softmax(axis), x)
        against_torch(lambda x: x.log_softmax(axis), lambda x: x.log_softmax(axis), x)
        against_torch(lambda x: x.logsumexp(axis), lambda x: x.logsumexp(axis), x)
        against_torch(lambda x: x.logsumexp(axis, keepdim=True), lambda x: x.logsumexp(axis, keepdim=True), x)
    against_torch(lambda x: (x.sum(0), x.max(-1), x.mean(0)), lambda x: (x.sum(0), x.amax(-1), x.mean(0)), x)
    with pytest.raises(IndexError, match="softmax.*axis 1.*0 dimensions"):
        Tensor(x).softmax(1)


@needs_torch
@pytest.mark.parametrize("scale", [1.0, 10.0, 40.0])
def test_api_softmax_backward_precision(scale):
    # float32 gradients within a few roundings of torch's own float32 ones, for flat and for peaked rows
    x = data(6, 40, seed=4) * scale
    against_torch(lambda x: x.softmax(-1), lambda x: x.softmax(-1), x, atol=1e-7, grad_rtol=1e-5, grad_atol=3e-7)
    against_torch(lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1), x, grad_rtol=1e-5, grad_atol=2e-6)


@needs_torch
def test_api_sigmoid_gradient_at_large_magnitudes():
    x = np.array([-300.0, -100.0, -88.0, -20.0, 0.0, 20.0, 88.0, 100.0, 300.0], np.float32)
    for name in ("sigmoid", "tanh", "silu", "logsigmoid"):
        lazy_fn, torch_fn = (
            (lambda x: getattr(x, name)()),
            (lambda x: getattr(TF, name)(x) if name != "tanh" else x.tanh()),
        )
        against_torch(lazy_fn, torch_fn, x)
        assert np.isfinite(getattr(Tensor(x, requires_grad=True), name)().sum().gradient(Tensor(x))[0].numpy()).all()


@needs_torch
@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, 0.5, 1.5, 2.5, -0.5, 1 / 3])
def test_api_pow_gradient_at_zero_and_negative_bases(exponent):
    bases = np.array([0.0, -0.0, -2.0, -1.5, -0.5, 0.5, 2.0, 3.0], np.float32)
    if not float(exponent).is_integer():
        bases = np.delete(bases, 1)  # -0.0: torch's slope there is -inf for 0.5 (its sqrt) but +inf for 1/3
    against_torch(lambda x: x**exponent, lambda x: x**exponent, bases)
    against_torch(lambda x: x.pow(exponent), lambda x: x.pow(exponent), np.array([0.0, 1.0, 2.0], np.float32))


@needs_torch
def test_api_pow_tensor_exponent_gradients():
    # both gradients match torch's for every finite base and exponent: y * x**(y-1) for the base (0 where y == 0),
    # x**y * ln(x) for the exponent, so nan at a negative base even for an integer power, 0 at a zero base for
    # y >= 0 and -x**y * inf for y < 0; +0 and -0 differ where the power's slope or sign does
    zeros = [0.0, -0.0]
    powers = [2.0, 3.0, 1.0, 0.0, 0.5, 1.5, 2.5, -1.0, -2.0, -0.5, -1.5, -3.0]
    pairs = [(b, y) for b in zeros for y in powers]
    pairs += [(b, y) for b in (-2.0, -1.5, -0.5) for y in (2.0, 3.0, 0.0, -1.0, -2.0, 0.5, -2.5)]
    pairs += [(b, y) for b in (0.5, 2.0, 3.0) for y in (2.0, 0.0, -1.0, 0.5, 1.7, -0.5)]
    bases, exponents = (np.array(values, np.float32) for values in zip(*pairs))
    against_torch(lambda x, y: x**y, lambda x, y: x**y, bases, exponents)
    against_torch(lambda x, y: x.pow(y), lambda x, y: x.pow(y), bases, exponents)
    y = Tensor(exponents)
    (grad_y,) = (Tensor(bases) ** y).sum().gradient(y)
    assert (
        np.isnan(grad_y.numpy()[bases < 0]).all()
        and np.isneginf(grad_y.numpy()[(bases == 0) & (exponents == -2)]).all()
    )
    # C's pow at infinities and NaN (x**0 and 1**y are 1, (-1)**inf is 1), and torch's gradients there, except the
    # exponent's slope at an infinite exponent (nan or inf in torch, which no finite value here can carry)
    inf, nan = np.inf, np.nan
    special = [(nan, 0.0), (inf, 0.0), (-inf, 0.0), (1.0, nan), (1.0, inf), (1.0, -inf), (-1.0, nan), (2.0, nan)]
    special += [(inf, -1.0), (-inf, -1.0), (nan, 2.0), (-1.0, 2.0)]
    bases, exponents = (np.array(values, np.float32) for values in zip(*special))
    against_torch(lambda x, y: x**y, lambda x, y: x**y, bases, exponents)
    edges = np.array(
        [
            (-1.0, inf),
            (-1.0, -inf),
            (0.0, inf),
            (-inf, 3.0),
            (inf, 2.0),
            (3.0, inf),
            (0.5, -inf),
            (-inf, 0.5),
            (-inf, -2.5),
        ],
        np.float32,
    ).T
    against_torch(lambda x, y: x**y, lambda x, y: x**y, *edges, grad=False)


@needs_torch
@pytest.mark.parametrize("name", ["atan", "asin", "asinh", "erf", "mish", "softsign", "logsigmoid", "sinh", "celu"])
def test_api_second_derivatives_against_torch(name):
    # the compositions differentiate twice like any graph (no op here has a rule of its own)
    lazy_fn, torch_fn, values = API_UNARY[name]
    values = np.asarray(values, np.float32)[np.abs(values) < 10]
    if name == "celu":
        values = values[values != 0]  # the second derivative jumps at 0 (torch takes the right side, we the left)
    x, tx = Tensor(values), torch.tensor(values, requires_grad=True)
    (first,) = lazy_fn(x).sum().gradient(x)
    (torch_first,) = torch.autograd.grad(torch_fn(tx).sum(), tx, create_graph=True)
    (second,) = first.sum().gradient(x)
    (torch_second,) = torch.autograd.grad(torch_first.sum(), tx)
    # erf is a fitted series: its second derivative is within 1e-4 of the true one
    np.testing.assert_allclose(second.numpy(), torch_second.numpy(), rtol=2e-4, atol=1e-4 if name == "erf" else 5e-5)


@needs_torch
def test_api_sign_of_infinities_and_nan():
    values = np.array([-np.inf, -2.0, -0.0, 0.0, 3.0, np.inf, np.nan], np.float32)
    against_torch(lambda x: x.sign(), lambda x: x.sign(), values)


@needs_torch
def test_api_unsigned_and_wide_ints_in_float_results():
    # logsumexp shifts by the maximum in floats: an unsigned difference below 0 wrapped (inf)
    for dtype in (np.uint8, np.uint16, np.uint32):
        values = np.array([[0, 3], [250, 3]], dtype)
        expected = torch.tensor(values.astype(np.float32)).logsumexp(1).numpy()
        np.testing.assert_allclose(Tensor(values).logsumexp(1).numpy(), expected, rtol=1e-6)
    # the mean of 64-bit ints sums in float64, as NumPy (their int64 sum wrapped negative near 2^62)
    for values in (np.array([2**62, 2**62], np.int64), np.array([2**63, 5], np.uint64)):
        np.testing.assert_allclose(Tensor(values).mean().numpy(), values.mean(), rtol=1e-7)
    # losses of two int tensors are computed in floats (an unsigned difference wrapped)
    a, b = np.array([1, 0], np.uint8), np.array([3, 255], np.uint8)
    fa, fb = torch.tensor(a.astype(np.float32)), torch.tensor(b.astype(np.float32))
    for ours, theirs in (
        (Tensor(a).l1_loss(Tensor(b)), torch.nn.functional.l1_loss(fa, fb)),
        (Tensor(a).mse(Tensor(b)), torch.nn.functional.mse_loss(fa, fb)),
        (Tensor(a).smooth_l1_loss(Tensor(b)), torch.nn.functional.smooth_l1_loss(fa, fb)),
        (Tensor(a).huber_loss(Tensor(b)), torch.nn.functional.huber_loss(fa, fb)),
    ):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


def test_api_cat_and_stack_take_torchs_positional_dim():
    a, b = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(Tensor.cat([Tensor(a), Tensor(b)], 1).numpy(), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(Tensor.stack([Tensor(a), Tensor(b)], 1).numpy(), np.stack([a, b], 1))
    np.testing.assert_array_equal(Tensor(a).cat(Tensor(b), np.int64(1)).numpy(), np.concatenate([a, b], 1))
    with pytest.raises(TypeError, match="cat: expected tensors to join, got str 'x'; pass the axis as dim="):
        Tensor(a).cat(Tensor(b), "x")
    with pytest.raises(TypeError, match="stack: expected tensors to join, got int 1"):
        Tensor(a).stack(Tensor(b), 1, dim=1)


@needs_torch
def test_api_pow_keeps_the_sign_of_zero_as_torch():
    bases = np.array([-0.0, -0.0, -0.0, -0.0, 0.0, -0.0, -0.0], np.float32)
    exponents = np.array([2.0, 3.0, 1.5, np.inf, 2.0, 1.0, 4.5], np.float32)
    ours = (Tensor(bases) ** Tensor(exponents)).numpy()
    theirs = (torch.tensor(bases) ** torch.tensor(exponents)).numpy()
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))
    np.testing.assert_array_equal(ours, theirs)


def test_a_product_of_two_transposes_is_computed_in_order():
    # aᵀ @ bᵀ is (b @ a)ᵀ: the product in order, then a transposed copy (2 kernels); in place it read both inputs
    # apart along every loop, one output at a time (1024²: 220 ms against torch's 7)
    x, y = data(33, 17), data(9, 33, seed=1)
    against_torch(lambda a, b: a.T @ b.T, lambda a, b: a.T @ b.T, x, y)
    product = Tensor(x).T @ Tensor(y).T
    assert len(product.schedule()) == 2
    product[0] = 1.0  # (a value of its own, as torch's: written into, not refused as a view)
    expected = x.T @ y.T
    expected[0] = 1.0
    assert_tensor(product, expected)
