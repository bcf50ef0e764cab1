"""Every dtype on the selected device: creation from NumPy and lists, `.numpy()` dtypes, integer arithmetic that wraps
at each width, bfloat16 rounded after every op, casts between every pair (out-of-range float to int included),
comparisons, reductions, promotion against `torch.result_type`, and safetensors round trips.

The same file runs on every device (chosen by environment variables, as for test_ops.py); tensors stay small, and
each test builds few kernels, so it is quick on the PYTHON emulator and on slow compilers too.
"""

import math
import warnings

import numpy as np
import pytest

from lazygrad import Tensor, dtypes
from lazygrad.dtype import bfloat16_bits, bfloat16_to_float32, least_upper_dtype
from lazygrad.nn.state import safe_load, safe_save

torch = pytest.importorskip("torch")

SMALL_INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16]
INTS = [*SMALL_INTS, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
ALL = [dtypes.bool, *INTS, *FLOATS]
TORCH = {d: getattr(torch, d.name) for d in ALL}


def quietly(function, *arguments):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return function(*arguments)


def limits(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype.np)
    return int(info.min), int(info.max)


def int_values(dtype, count: int = 16, seed: int = 0) -> np.ndarray:
    """The extremes of an int dtype and random values across its whole range."""
    low, high = limits(dtype)
    rng = np.random.default_rng(seed)
    extremes = [low, high, 0, 1, low + 1, high - 1]
    random = rng.integers(low, high, size=count - len(extremes), dtype=dtype.np, endpoint=True)
    return np.concatenate([np.array(extremes, dtype=dtype.np), random])


# ---- creation and .numpy() -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [dtypes.bool, *INTS, dtypes.float16, dtypes.float32], ids=str)
def test_numpy_arrays_keep_their_dtype_and_numpy_returns_it(dtype):
    if dtype.is_float:
        array = np.array([1.5, -2.25, 0.0, 65504.0], dtype=dtype.np)
    else:
        array = np.array([0, 1, 1, 0], dtype=bool) if dtype == dtypes.bool else int_values(dtype, 8)
    tensor = Tensor(array)
    assert tensor.dtype == dtype
    result = tensor.numpy()
    assert result.dtype == dtype.np
    np.testing.assert_array_equal(result, array)
    # a kernel reads and writes the dtype too
    copied = (tensor.flip(0) | False) if dtype == dtypes.bool else (tensor.flip(0) + 0)
    assert copied.dtype == dtype
    np.testing.assert_array_equal(copied.numpy(), (array[::-1] | False) if dtype == dtypes.bool else array[::-1])


def test_numpy_arrays_keep_their_dtype_and_lists_take_the_defaults():
    # as torch.tensor does: a float64 array (or NumPy scalar) stays float64, Python floats become float32
    for data in (np.array([1.5, 1 + 2**-40]), np.float64(1 + 2**-40)):
        tensor = Tensor(data)
        assert tensor.dtype == dtypes.float64 and torch.tensor(data).dtype == torch.float64
        assert tensor.numpy().dtype == np.float64 and (tensor * 2).numpy().tolist() == (data * 2).tolist()
    assert Tensor([1.5]).dtype == Tensor(1.5).dtype == dtypes.float32
    assert Tensor(np.array([1.5]), dtype=dtypes.float32).dtype == dtypes.float32
    assert Tensor([1, 2]).dtype == dtypes.int32
    assert Tensor([2**40]).dtype == dtypes.int64
    assert Tensor(np.array([1, 2], np.int64)).dtype == dtypes.int64
    assert Tensor(np.uint8(7)).dtype == dtypes.uint8
    assert Tensor([1, 2], dtype=dtypes.uint8).numpy().dtype == np.uint8


@pytest.mark.parametrize("dtype", SMALL_INTS + [dtypes.uint64], ids=str)
def test_values_a_dtype_cannot_hold_are_an_error_naming_the_dtype(dtype):
    low, high = limits(dtype)
    with pytest.raises(OverflowError, match=dtype.name):
        Tensor([high + 1], dtype=dtype)
    with pytest.raises(OverflowError, match=dtype.name):
        Tensor([low - 1], dtype=dtype)


def test_lists_of_ints_beyond_int64_keep_every_bit_or_are_an_error():
    # NumPy reads [2**63 + 1, 0] as float64, which rounds the first value
    assert Tensor([2**63 + 1, 0], dtype=dtypes.uint64).tolist() == [2**63 + 1, 0]
    assert Tensor([[2**64 - 1], [7]], dtype=dtypes.uint64).tolist() == [[2**64 - 1], [7]]
    with pytest.raises(OverflowError, match=r"9223372036854775809 does not fit in dtypes.int64.*dtypes.uint64"):
        Tensor([2**63 + 1, 0])
    with pytest.raises(OverflowError, match="does not fit in dtypes.uint64"):
        Tensor([-1, 2**63], dtype=dtypes.uint64)


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_python_number_makes_a_0d_tensor_of_every_float_dtype(dtype):
    assert Tensor(1.5, dtype=dtype).shape == () and Tensor(1.5, dtype=dtype).tolist() == 1.5  # (bfloat16's was 1-d)


def test_bfloat16_memory_holds_rounded_bits_and_numpy_gives_float32():
    values = [1.0, 3.14159, 1e-3, -65504.0, 1e38, 3.5e38, float("nan"), float("inf"), 1.00390625, 1.01171875]
    expected = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)
    tensor = Tensor(values, dtype=dtypes.bfloat16)
    result = tensor.numpy()
    assert tensor.dtype == dtypes.bfloat16 and result.dtype == np.float32
    np.testing.assert_array_equal(result, expected.float().numpy())
    numbers = ~np.isnan(result)  # torch's NaN bits differ (any NaN will do)
    theirs = expected.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bfloat16_bits(result)[numbers], theirs[numbers])
    assert Tensor(2.5).bfloat16().item() == 2.5 and Tensor([1.0]).to(dtypes.bfloat16).dtype == dtypes.bfloat16


# ---- integer arithmetic wraps at each width ------------------------------------------------------------------------

BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "floordiv": (lambda a, b: a // b, lambda a, b: a // b),
    "mod": (lambda a, b: a % b, lambda a, b: a % b),
    "max": (lambda a, b: a.maximum(b), np.maximum),
    "min": (lambda a, b: a.minimum(b), np.minimum),
    "and": (lambda a, b: a & b, lambda a, b: a & b),
    "or": (lambda a, b: a | b, lambda a, b: a | b),
    "xor": (lambda a, b: a ^ b, lambda a, b: a ^ b),
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "eq": (lambda a, b: a == b, lambda a, b: a == b),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b),
}


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_ops_wrap_like_numpy(dtype):
    a, b = int_values(dtype, 16, seed=1), int_values(dtype, 16, seed=2)[::-1].copy()
    b[3] = 0  # division by zero gives 0, as in NumPy
    x, y = Tensor(a), Tensor(b)
    for name, (ours, theirs) in BINARY.items():
        expected = quietly(theirs, a, b)
        if name in ("floordiv", "mod"):
            expected = np.where(b == 0, 0, expected).astype(dtype.np)
        got = ours(x, y).numpy()
        assert got.dtype == expected.dtype, name
        np.testing.assert_array_equal(got, expected, err_msg=f"{dtype} {name}")
    np.testing.assert_array_equal((-x).numpy(), quietly(np.negative, a), err_msg="neg")
    np.testing.assert_array_equal(x.abs().numpy(), quietly(np.abs, a), err_msg="abs")
    amounts = (np.arange(16) % dtype.bits).astype(dtype.np)
    np.testing.assert_array_equal((x << Tensor(amounts)).numpy(), quietly(np.left_shift, a, amounts))
    np.testing.assert_array_equal((x >> Tensor(amounts)).numpy(), quietly(np.right_shift, a, amounts))


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16], ids=str)
def test_integer_ops_match_torch(dtype):
    a, b = int_values(dtype, 16, seed=3), int_values(dtype, 16, seed=4)
    b[b == 0] = 1  # torch raises on integer division by zero
    x, y, tx, ty = Tensor(a), Tensor(b), torch.tensor(a), torch.tensor(b)
    for name in ("add", "sub", "mul", "floordiv", "mod", "max"):
        got = BINARY[name][0](x, y).numpy()
        expected = {"max": torch.maximum}.get(name, BINARY[name][1])(tx, ty).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=f"{dtype} {name}")
    # python scalars keep the tensor's dtype; a float scalar or true division gives float32
    np.testing.assert_array_equal((x + 1).numpy(), (tx + 1).numpy())
    np.testing.assert_array_equal((x * 3).numpy(), (tx * 3).numpy())
    assert (x * 1.5).dtype == dtypes.float32 and (x / y).dtype == dtypes.float32
    np.testing.assert_allclose((x / y).numpy(), (tx / ty).numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_means_and_deviations_of_halves_are_summed_in_float32(dtype):
    # 5,000 values of ~50 sum past a half's largest value (65,504): torch sums them in float32, and so must we
    values = np.linspace(0, 100, 5000, dtype=np.float32).reshape(1, 1, 50, 100)
    ours, theirs = Tensor(values).cast(dtype), torch.tensor(values).to(getattr(torch, str(dtype).split(".")[-1]))
    cases = {
        "mean": (lambda x: x.mean(), lambda x: x.mean()),
        "std": (lambda x: x.std(), lambda x: x.std()),
        "var over an axis": (lambda x: x.var(3), lambda x: x.var(3)),
        "layernorm": (lambda x: x.layernorm(axis=(2, 3)), lambda x: torch.nn.functional.layer_norm(x, (50, 100))),
        "avg_pool2d": (lambda x: x.avg_pool2d((50, 100)), lambda x: torch.nn.functional.avg_pool2d(x, (50, 100))),
    }
    for name, (op, reference) in cases.items():
        got, expected = op(ours), reference(theirs)
        assert got.dtype == dtype, name
        np.testing.assert_allclose(got.float().numpy(), expected.float().numpy(), rtol=2e-2, atol=2e-2, err_msg=name)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16, np.bool_], ids=str)
def test_matrix_products_of_narrow_ints_keep_their_dtype_and_wrap_once(dtype):
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 100, (3, 40)).astype(dtype), rng.integers(0, 100, (40, 4)).astype(dtype)
    expected = a @ b if dtype is np.bool_ else (a.astype(np.int64) @ b.astype(np.int64)).astype(dtype)
    got = (Tensor(a) @ Tensor(b)).numpy()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_powers_of_halves_stay_halves(dtype):
    values = np.array([4.0, 0.25, 0.0, 2.5], np.float32)
    ours, theirs = Tensor(values).cast(dtype), torch.tensor(values).to(getattr(torch, str(dtype).split(".")[-1]))
    cases = {
        "x ** 0.5": lambda x: x**0.5,
        "x ** x": lambda x: x**x,
        "2 ** x": lambda x: 2**x,
        "x ** -1.5": lambda x: x**-1.5,
    }
    for name, power in cases.items():
        got = power(ours)
        assert got.dtype == dtype, name
        np.testing.assert_allclose(got.float().numpy(), power(theirs).float().numpy(), rtol=1e-2, err_msg=name)


def test_half_multiply_adds_in_a_backward_pass_match_torch():
    # a half FMA (here: the sums a gradient accumulates) was left to LLVM, which computed it in double and rounded it
    # with a runtime-library call the JIT does not link: the kernel crashed the process
    values = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float16)
    ours, theirs = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    (ours.sum(1, keepdim=True) * ours * ours + ours.layernorm() * ours).sum().backward()
    (
        theirs.sum(1, keepdim=True) * theirs * theirs + torch.nn.functional.layer_norm(theirs, (64,)) * theirs
    ).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy().astype(np.float32), theirs.grad.float().numpy(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_nan_to_num_matches_torch_in_every_dtype(dtype):
    """inf becomes the dtype's own largest finite value (65504 in half, 3.39e38 in bfloat16); ints and bools have
    no NaN or inf and come back unchanged."""
    if dtype.is_float:
        values = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0, 7.0], np.float32)
    else:
        values = np.array([0, 1, 1, 0]) if dtype == dtypes.bool else int_values(dtype, 6, seed=4)
    ours = Tensor(values).cast(dtype) if dtype.is_float else Tensor(values.astype(dtype.np))
    theirs = torch.tensor(values).to(TORCH[dtype])
    for options in ({}, {"nan": 1.0, "posinf": 1e10, "neginf": -2}, {"neginf": 3.0}):
        got, expected = ours.nan_to_num(**options), torch.nan_to_num(theirs, **options)
        assert got.dtype == dtype, options
        np.testing.assert_array_equal(
            got.float().numpy() if dtype.is_float else got.numpy(),
            expected.float().numpy() if dtype.is_float else expected.numpy(),
            options,
        )
    if dtype.is_float:
        signs = np.signbit(ours.nan_to_num().float().numpy())
        np.testing.assert_array_equal(signs, np.signbit(torch.nan_to_num(theirs).float().numpy()))
    with pytest.raises(TypeError, match="^nan_to_num: posinf must be a number or None, got str"):
        ours.nan_to_num(posinf="big")


def test_nan_to_num_gradient_is_zero_where_replaced_as_torch():
    values = np.array([np.nan, np.inf, -np.inf, 1.5, -2.0], np.float32)
    ours, theirs = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    (ours.nan_to_num() * 3).sum().backward()
    (theirs.nan_to_num() * 3).sum().backward()
    np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())


def test_uint8_image_over_255_is_float32():
    image = np.arange(0, 256, 17, dtype=np.uint8)
    result = Tensor(image) / 255
    assert result.dtype == dtypes.float32
    np.testing.assert_allclose(result.numpy(), (torch.tensor(image) / 255).numpy(), rtol=1e-7)


# ---- bfloat16 arithmetic: float32 rounded after every op -----------------------------------------------------------


def test_bfloat16_ops_match_torch():
    rng = np.random.default_rng(5)
    a = bfloat16_to_float32(bfloat16_bits(rng.standard_normal(32).astype(np.float32) * 10))
    b = bfloat16_to_float32(bfloat16_bits(rng.uniform(0.5, 4, 32).astype(np.float32)))
    x, y = Tensor(a, dtype=dtypes.bfloat16), Tensor(b, dtype=dtypes.bfloat16)
    tx, ty = torch.tensor(a).bfloat16(), torch.tensor(b).bfloat16()
    exact = {
        "add": (x + y, tx + ty),
        "sub": (x - y, tx - ty),
        "mul": (x * y, tx * ty),
        "scalar": (x * 3 + 1, tx * 3 + 1),
        "neg_max": ((-x).maximum(y), torch.maximum(-tx, ty)),
        "relu": (x.relu(), tx.relu()),
    }
    for name, (ours, theirs) in exact.items():
        assert ours.dtype == dtypes.bfloat16, name
        np.testing.assert_array_equal(ours.numpy(), theirs.float().numpy(), err_msg=name)
    for name, (ours, theirs) in {"lt": (x < y, tx < ty), "ne": (x != y, tx != ty)}.items():
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=name)
    # composed ops (a divide is a reciprocal times) and float32 accumulations may differ by a bfloat16 ulp
    close = {
        "div": (x / y, tx / ty),
        "sqrt": (y.sqrt(), ty.sqrt()),
        "exp": ((x / 10).exp(), (tx / 10).exp()),
        "sum": (x.reshape(4, 8).sum(1), tx.reshape(4, 8).sum(1)),
        "mean": (x.mean(), tx.mean()),
        "max": (x.reshape(4, 8).max(1), tx.reshape(4, 8).max(1).values),
    }
    for name, (ours, theirs) in close.items():
        assert ours.dtype == dtypes.bfloat16, name
        np.testing.assert_allclose(ours.numpy(), theirs.float().numpy(), rtol=2**-7, atol=1e-30, err_msg=name)
    # every result lies on the bfloat16 grid
    for ours, _ in [*exact.values(), *close.values()]:
        values = ours.numpy()
        np.testing.assert_array_equal(values, bfloat16_to_float32(bfloat16_bits(values)))


def test_bfloat16_bits_round_trip_through_bitcast():
    bits = np.array([0x3F80, 0xC049, 0x7F80, 0x0001, 0x8000], np.uint16)
    tensor = Tensor(bits).bitcast(dtypes.bfloat16)
    np.testing.assert_array_equal(tensor.numpy(), bfloat16_to_float32(bits))
    np.testing.assert_array_equal((tensor * 1).bitcast(dtypes.uint16).numpy(), bits)
    np.testing.assert_array_equal((tensor * 1).bitcast(dtypes.int16).numpy(), bits.view(np.int16))
    halves = np.array([1.5, -2.0, 65504.0], np.float16)
    through = Tensor(halves).bitcast(dtypes.bfloat16)
    np.testing.assert_array_equal(through.numpy(), bfloat16_to_float32(halves.view(np.uint16)))
    np.testing.assert_array_equal((through * 1).bitcast(dtypes.float16).numpy(), halves)


def test_float16_bitcasts_keep_every_bit_pattern():
    patterns = np.array(
        [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x3C00, 0xC000, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x1234]
    )
    bits = patterns.astype(np.uint16)
    halves = Tensor(bits).bitcast(dtypes.float16)
    got = halves.numpy()
    numbers = ~np.isnan(bits.view(np.float16))
    np.testing.assert_array_equal(got[numbers], bits.view(np.float16)[numbers])
    assert np.isnan(got[~numbers]).all()
    np.testing.assert_array_equal((halves * 1).bitcast(dtypes.int16).numpy()[numbers], bits.view(np.int16)[numbers])


# ---- casts ---------------------------------------------------------------------------------------------------------


def source_values(dtype) -> np.ndarray:
    """Values every dtype holds (0..127 and a few negatives for signed sources), so a cast to any dtype is exact
    except for the negatives into unsigned ints, which wrap."""
    if dtype == dtypes.bool:
        return np.array([True, False, True, True])
    values = np.array([0, 1, 7, 100, 127, 42, 3, 64])
    if not dtype.is_unsigned:
        values = np.concatenate([values, [-1, -128, -5, -100]])
    if dtype.is_float:
        values = np.concatenate([values, [2.75, -3.5, 0.5, 126.9]])
    return values


@pytest.mark.parametrize("source", ALL, ids=str)
def test_casts_between_every_pair_match_torch(source):
    values = source_values(source)
    tensor = Tensor(values, dtype=source)
    expected_source = torch.tensor(values).to(TORCH[source])
    # one kernel per kind of target: each cast read back exactly, as int64 or float64
    int_targets = [d for d in ALL if not d.is_float]
    float_targets = [d for d in FLOATS if d != dtypes.float64]
    ints = Tensor.stack(*[tensor.cast(d).cast(dtypes.int64) for d in int_targets]).numpy()
    floats = Tensor.stack(*[tensor.cast(d).cast(dtypes.float32) for d in float_targets]).numpy()
    for row, target in zip(ints, int_targets):
        if target == dtypes.uint64:
            expected = expected_source.to(torch.int64).numpy()  # torch's uint64 casts of negatives vary: the bits
        elif target in (dtypes.uint16, dtypes.uint32) and source.is_float:
            expected = expected_source.to(torch.int64).to(TORCH[target]).to(torch.int64).numpy()
        else:
            expected = expected_source.to(TORCH[target]).to(torch.int64).numpy()
        np.testing.assert_array_equal(row, expected, err_msg=f"{source} -> {target}")
    for row, target in zip(floats, float_targets):
        expected = expected_source.to(TORCH[target]).float().numpy()
        np.testing.assert_array_equal(row, expected, err_msg=f"{source} -> {target}")
    assert tensor.cast(dtypes.float64).numpy().dtype == np.float64


def wrapped(value: float, dtype) -> int:
    """What lazygrad defines for a float cast to an int: truncated toward zero into int64 (values int64 cannot
    hold, NaN and infinities, become int64's most negative value), then wrapped to the dtype's width."""
    if dtype == dtypes.uint64 and not value < 2.0**63:
        return (wrapped(value - 2.0**63, dtypes.int64) + 2**63) % 2**64
    whole = math.trunc(value) if math.isfinite(value) and -(2**63) <= math.trunc(value) < 2**63 else -(2**63)
    whole %= 2**dtype.bits
    signed = not dtype.is_unsigned and whole >= 2 ** (dtype.bits - 1)
    return whole - 2**dtype.bits if signed else whole


def test_out_of_range_float_to_int_casts_wrap_the_same_on_every_device():
    values = [300.7, -129.5, 70000.0, -1e10, 3e9, float("nan"), float("inf"), -float("inf"), 1e20, 1.5e19, -0.9]
    tensor = Tensor(values)
    targets = INTS
    got = Tensor.stack(*[tensor.cast(d).cast(dtypes.int64) for d in targets]).numpy()
    for row, target in zip(got, targets):
        expected = [wrapped(float(np.float32(v)), target) for v in values]
        expected = np.array(expected, dtype=np.uint64 if target == dtypes.uint64 else np.int64).view(np.int64)
        np.testing.assert_array_equal(row, expected, err_msg=str(target))
    # within int32's range this is NumPy's astype on x86 too
    in_range = np.array([300.7, -129.5, 70000.0, -1.9], np.float32)
    for target in SMALL_INTS:
        np.testing.assert_array_equal(
            Tensor(in_range).cast(target).numpy(), in_range.astype(np.int64).astype(target.np)
        )


@pytest.mark.parametrize("dtype", [*SMALL_INTS, dtypes.bfloat16], ids=str)
def test_padded_and_gathered_rows_of_narrow_dtypes(dtype):
    # rows of 8 take vector loads where a device has them: OpenCL's masked ones selected 8- and 16-bit lanes with an
    # int condition, which did not compile (cat, pad, tril and roll of uint8 .. uint16 and bfloat16)
    a = (np.arange(64) % 7).reshape(8, 8).astype(np.float32 if dtype == dtypes.bfloat16 else dtype.np)
    x = Tensor(a, dtype=dtype)
    for got, expected in (
        (Tensor.cat(x, x, dim=1), np.concatenate([a, a], 1)),
        (x.pad(((0, 0), (3, 5))), np.pad(a, ((0, 0), (3, 5)))),
        (x.tril(), np.tril(a)),
        (x.roll(3, 1), np.roll(a, 3, 1)),
        (x.cumsum(1), np.cumsum(a, 1).astype(np.float32 if dtype == dtypes.bfloat16 else np.int64)),
    ):
        np.testing.assert_array_equal(got.numpy(), expected)


# ---- reductions ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", SMALL_INTS, ids=str)
def test_reductions_of_narrow_ints(dtype):
    a = int_values(dtype, 24, seed=6).reshape(4, 6)
    x = Tensor(a)
    total = x.sum(1)
    assert total.dtype == dtypes.int64  # as in PyTorch
    np.testing.assert_array_equal(total.numpy(), a.astype(np.int64).sum(1))
    np.testing.assert_array_equal(x.max(1).numpy(), a.max(1))
    np.testing.assert_array_equal(x.min(0).numpy(), a.min(0))
    assert x.max().dtype == dtype
    np.testing.assert_allclose(x.float().mean().numpy(), a.mean(), rtol=1e-6)
    np.testing.assert_array_equal(x.sum(1, dtype=dtype).numpy(), a.sum(1, dtype=dtype.np))


@pytest.mark.parametrize("dtype", [dtypes.bool, *INTS], ids=str)
def test_sums_and_products_of_ints_are_int64_like_torch(dtype):
    # PyTorch widens bools and every int to int64 for sum, prod, cumsum and cumprod unless dtype= says otherwise
    a = (int_values(dtype, 12, seed=2) if dtype != dtypes.bool else np.arange(12) % 3 == 0).reshape(3, 4)
    small = a if dtype == dtypes.bool else (a % 5).astype(dtype.np)  # products that fit int64
    if dtype == dtypes.uint64:
        a = a % (1 << 40)  # torch sums uint64 as int64: keep the values where both agree
    for name, values in (("sum", a), ("cumsum", a), ("prod", small), ("cumprod", small)):
        x, reference = Tensor(values), torch.from_numpy(np.ascontiguousarray(values))
        got, expected = getattr(x, name)(1), getattr(reference, name)(1)
        assert got.dtype == dtypes.int64 and expected.dtype == torch.int64, (name, got.dtype, expected.dtype)
        np.testing.assert_array_equal(got.numpy(), expected.numpy(), err_msg=name)
    x = Tensor(a)
    assert x.sum(dtype=dtypes.int32).dtype == dtypes.int32 and x.prod(0, dtype=dtypes.int16).dtype == dtypes.int16
    assert x.sum().dtype == dtypes.int64 and torch.from_numpy(np.ascontiguousarray(a)).sum().dtype == torch.int64


# ---- promotion -----------------------------------------------------------------------------------------------------


def test_promotion_matches_torch_result_type():
    for a in ALL:
        for b in ALL:
            try:
                expected = torch.result_type(torch.zeros(1, dtype=TORCH[a]), torch.zeros(1, dtype=TORCH[b]))
            except RuntimeError:  # torch does not promote uint16/32/64 beside other ints: lazygrad does as NumPy
                if (
                    a == dtypes.uint64
                    and b.is_int
                    and not b.is_unsigned
                    or b == dtypes.uint64
                    and a.is_int
                    and not a.is_unsigned
                ):
                    with pytest.raises(TypeError, match="uint64"):
                        least_upper_dtype(a, b)
                else:
                    assert least_upper_dtype(a, b).np == np.promote_types(a.np, b.np), (a, b)
                continue
            assert least_upper_dtype(a, b) == getattr(dtypes, str(expected).split(".")[1]), (a, b)


def test_mixed_dtypes_promote_in_tensor_ops():
    x, y = Tensor(np.array([100, -100], np.int8)), Tensor(np.array([200, 7], np.uint8))
    result = x + y
    assert result.dtype == dtypes.int16
    np.testing.assert_array_equal(
        result.numpy(),
        (torch.tensor([100, -100], dtype=torch.int8) + torch.tensor([200, 7], dtype=torch.uint8)).numpy(),
    )
    assert (Tensor(np.array([1], np.int16)) * Tensor(np.array([2], np.int8))).dtype == dtypes.int16
    assert (Tensor([1.0], dtype=dtypes.float16) + Tensor([1.0], dtype=dtypes.bfloat16)).dtype == dtypes.float32
    assert (Tensor(np.array([1], np.uint8)) + 300).dtype == dtypes.int32  # a number it cannot hold widens it
    with pytest.raises(TypeError, match=r"uint64.*int8|int8.*uint64"):
        Tensor(np.array([1], np.uint64)) + Tensor(np.array([1], np.int8))


# ---- safetensors ---------------------------------------------------------------------------------------------------


def test_safetensors_round_trips_every_dtype(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    tensors = {d.name: Tensor(source_values(d)[:4], dtype=d) for d in ALL if d != dtypes.float64}
    path = str(tmp_path / "all.safetensors")
    safe_save(tensors, path)
    theirs = safetensors.load_file(path)
    loaded = safe_load(path)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype, name
        np.testing.assert_array_equal(loaded[name].numpy(), tensor.numpy(), err_msg=name)
        assert theirs[name].dtype == TORCH[tensor.dtype], name
        np.testing.assert_array_equal(
            theirs[name].to(torch.float32 if name == "bfloat16" else theirs[name].dtype).numpy(), tensor.numpy()
        )
    # and files torch writes load with their dtypes
    safetensors.save_file(
        {"b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "u": torch.tensor([255], dtype=torch.uint8)}, path
    )
    loaded = safe_load(path)
    assert loaded["b"].dtype == dtypes.bfloat16 and loaded["u"].dtype == dtypes.uint8
    np.testing.assert_array_equal(loaded["b"].numpy(), [1.5, -2.0])
    np.testing.assert_array_equal((loaded["u"] + 1).numpy(), [0])


def test_a_bfloat16_value_on_its_grid_is_stored_without_rounding_again():
    """An op's bfloat16 result is rounded once, and its store takes the rounded value's bits as they are (a value
    loaded from bfloat16 memory too): one rounding in the kernel, not two; every bit pattern kept."""
    from lazygrad.codegen.lower import lower_kernel
    from lazygrad.codegen.narrow_dtypes import lower_narrow_dtypes
    from lazygrad.uop.ops import Ops

    bits = np.array([0x3F80, 0xC049, 0x7F80, 0xFF80, 0x0001, 0x8000, 0x7FC0, 0x4049], np.uint16)
    values = Tensor(bits).bitcast(dtypes.bfloat16).realize()
    tripled = (torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16) * 3).view(torch.int16).numpy().view(np.uint16)
    transposed = values.reshape(2, 4).T.contiguous().reshape(8)
    cases = [(values * 3, 1, tripled), ((values.float() * 3).cast(dtypes.bfloat16), 1, tripled)]
    cases.append((transposed, 0, bits.reshape(2, 4).T.reshape(8)))
    for result, roundings, expected in cases:
        kernels = [lower_narrow_dtypes(lower_kernel(item.ast)).toposort for item in result.schedule()]
        rounding = [n for nodes in kernels for n in nodes if n.op is Ops.ADD and n.src[1].op is Ops.CONST]
        assert sum(n.src[1].arg == 0x7FFF for n in rounding) == roundings
        got = result.bitcast(dtypes.uint16).numpy()
        numbers = ~np.isnan(bfloat16_to_float32(expected))  # (NaN: any quiet NaN)
        np.testing.assert_array_equal(got[numbers], expected[numbers])


@pytest.mark.parametrize("size", [8, 16, 64])
def test_casts_through_64_bits_in_vector_loops(size):
    # loops of 8 or 16 iterations are computed in vectors on an OpenCL CPU driver: pip's PoCL on a Zen 4/5 CPU
    # reported 16-float vectors but built for AVX2, and its conversions of long8 gave garbage (floor was 0 for 1.25)
    x = (np.random.default_rng(size).standard_normal(size) * 100).astype(np.float32)
    np.testing.assert_array_equal(Tensor(x).int().numpy(), x.astype(np.int32))
    np.testing.assert_array_equal(Tensor(x).floor().numpy(), np.floor(x))
    np.testing.assert_array_equal(Tensor(x).cast(dtypes.int64).numpy(), x.astype(np.int64))
    np.testing.assert_array_equal(Tensor(x).cast(dtypes.float64).numpy(), x.astype(np.float64))
    whole = x.astype(np.int64)
    np.testing.assert_array_equal(Tensor(whole).float().numpy(), whole.astype(np.float32))
