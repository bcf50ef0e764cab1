"""pow's result dtype for int and bool tensors, cumsum/cumprod with dtype=, and cummin, against PyTorch.

The same file runs on every device; tensors stay small (the PYTHON device emulates kernels one scalar at a time)."""

import numpy as np
import pytest
from test_ops import against_torch, assert_tensor, data

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")

INT_BASES = [dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64]


def torch_dtype(dtype):
    return getattr(torch, dtype.name)


# ---- pow ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", INT_BASES, ids=str)
@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 8.0, 9.0, 2.5])
def test_int_tensor_to_a_python_float_is_float32_as_torch(dtype, exponent):
    """(an integer-valued float stayed in the int dtype and wrapped: uint8 20 ** 2.0 was 144)"""
    values = [20, 3, 1, 0, 7] if dtype == dtypes.uint8 else [20, -3, 1, 0, 7]
    got = Tensor(values, dtype=dtype) ** exponent
    expected = torch.tensor(values, dtype=torch_dtype(dtype)) ** exponent
    assert expected.dtype == torch.float32 and got.dtype == dtypes.float32
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", INT_BASES, ids=str)
@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 5, 8, 9])
def test_int_tensor_to_a_python_int_stays_int_and_wraps_as_torch(dtype, exponent):
    values = [20, 3, 1, 0, 7] if dtype == dtypes.uint8 else [20, -3, 1, 0, 7]
    got = Tensor(values, dtype=dtype) ** exponent
    expected = torch.tensor(values, dtype=torch_dtype(dtype)) ** exponent
    assert got.dtype == dtype and expected.dtype == torch_dtype(dtype)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("dtype", [dtypes.bool, *INT_BASES], ids=str)
@pytest.mark.parametrize("exponent", [-1, -2, -9, np.int64(-1)])
def test_int_tensor_to_a_negative_python_int_is_an_error_as_torch(dtype, exponent):
    values = [2, 3] if dtype != dtypes.bool else [True, False]
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        torch.tensor(values, dtype=torch_dtype(dtype)) ** int(exponent)
    with pytest.raises(
        ValueError,
        match=rf"^pow: an integer tensor \({dtype}, shape \(2,\)\) to a negative.*"
        rf"\({exponent}\).*x \*\* {float(exponent)}.*x.float\(\) \*\* {exponent}",
    ):
        Tensor(values, dtype=dtype) ** exponent


def test_negative_exponents_of_int_tensors_follow_the_readme():
    """A negative exponent *tensor* truncates, as torch (0 but for bases 1 and -1); a float exponent gives the real
    power; a float base is untouched by the int rules."""
    base = [2, 3, 1, -1]
    got = Tensor(base) ** Tensor([-1, -1, -3, -3])
    np.testing.assert_array_equal(got.numpy(), (torch.tensor(base) ** torch.tensor([-1, -1, -3, -3])).numpy())
    assert got.dtype == dtypes.int32
    np.testing.assert_allclose((Tensor(base) ** -1.0).numpy(), np.array(base, np.float32) ** -1.0, rtol=1e-6)
    np.testing.assert_allclose((Tensor([2.0, 4.0]) ** -1).numpy(), [0.5, 0.25])
    # NumPy's scalars follow the Python numbers' rules
    assert (Tensor([2, 3]) ** np.float32(2.0)).dtype == dtypes.float32
    assert (Tensor([2, 3], dtype=dtypes.int16) ** np.int64(2)).dtype == dtypes.int16


@pytest.mark.parametrize("exponent", [0, 1, 2, 9, 0.0, 2.0, 2.5, True, False])
def test_bool_tensor_powers_take_torchs_kind_with_int32_as_the_default_int(exponent):
    """(a bool tensor ** 2 stayed bool; ** True gave float32.) torch's bool ** int is its default int, int64;
    lazygrad's default int is int32 (README, Dtypes)."""
    values = [True, False, True]
    got, expected = Tensor(values) ** exponent, torch.tensor(values) ** exponent
    wanted = {torch.int64: dtypes.int32, torch.float32: dtypes.float32, torch.bool: dtypes.bool}[expected.dtype]
    assert got.dtype == wanted, (got.dtype, expected.dtype)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_bool_tensor_to_a_bool_tensor_stays_bool():
    base, exponent = [True, True, False, False], [True, False, True, False]
    got = Tensor(base) ** Tensor(exponent)
    assert got.dtype == dtypes.bool and got.tolist() == [b or not e for b, e in zip(base, exponent)]


# ---- cumsum and cumprod with dtype= ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32], ids=str)
@pytest.mark.parametrize("length", [5, 2100])  # (the long one goes by blocks)
def test_int_scans_with_dtype_wrap_in_that_dtype_as_torch(name, dtype, length):
    """(dtype= was cast to, then the scan widened it back to int64: int8 cumsum of 100s was [100, 200, 300])"""
    values = np.where(np.arange(length) % 3 == 0, 100, np.arange(length) % 7 - 3).astype(np.int32)
    got = getattr(Tensor(values), name)(0, dtype=dtype)
    expected = getattr(torch.tensor(values), name)(0, dtype=torch_dtype(dtype))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_the_reported_int8_cumsum_and_int32_wrap():
    got = Tensor([100, 100, 100], dtype=dtypes.int8).cumsum(0, dtype=dtypes.int8)
    assert got.dtype == dtypes.int8 and got.tolist() == [100, -56, 44]
    wide = Tensor([2**30] * 3).cumsum(0, dtype=dtypes.int32)
    assert wide.tolist() == torch.tensor([2**30] * 3).cumsum(0, dtype=torch.int32).tolist()


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int32], ids=str)
def test_int_scans_without_dtype_widen_to_int64_as_torch(name, dtype):
    values = [True, True, False, True] if dtype == dtypes.bool else [100, 100, 3, 100]
    got = getattr(Tensor(values, dtype=dtype), name)(0)
    expected = getattr(torch.tensor(values, dtype=torch_dtype(dtype)), name)(0)
    assert got.dtype == dtypes.int64 and expected.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_float_scans_with_dtype_and_bool_scans_as_numpy():
    x = np.array([1.5, 2.25, 3.0, -3.0, 7.0], np.float32)
    for dtype in (dtypes.float16, dtypes.float64):
        for name in ("cumsum", "cumprod"):
            got = getattr(Tensor(x), name)(0, dtype=dtype)
            assert got.dtype == dtype
            np.testing.assert_allclose(got.numpy(), getattr(torch.tensor(x), name)(0, dtype=torch_dtype(dtype)))
    # torch has no bool cumsum; NumPy's is a running "or" (and cumprod a running "and")
    flags = np.array([False, True, False, True])
    assert Tensor(flags).cumsum(0, dtype=dtypes.bool).tolist() == np.cumsum(flags, dtype=bool).tolist()
    assert Tensor(~flags).cumprod(0, dtype=dtypes.bool).tolist() == np.cumprod(~flags, dtype=bool).tolist()


# ---- cummin ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, axis", [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -2), ((), 0), ((4, 0), 1)])
def test_cummin_against_torch(shape, axis):
    x = data(*shape, low=-1.5, high=1.5)
    against_torch(lambda x: x.cummin(axis), lambda x: tuple(torch.cummin(x, axis)), x)
    against_torch(lambda x: x.cummin(dim=axis), lambda x: tuple(torch.cummin(x, dim=axis)), x, grad=False)


def test_cummin_ties_nan_and_ints_as_torch():
    # ties: the latest index, and the gradient goes to the element there
    ties = np.array([[3.0, 1.0, 1.0, 2.0, -5.0, -5.0, 0.0], [2.0, 2.0, 2.0, 4.0, 2.0, -1.0, -1.0]], np.float32)
    against_torch(lambda x: x.cummin(1), lambda x: tuple(torch.cummin(x, 1)), ties)
    with_nan = np.array([3.0, np.nan, 1.0, np.nan, 0.0, -np.inf], np.float32)
    against_torch(lambda x: x.cummin(0), lambda x: tuple(torch.cummin(x, 0)), with_nan, grad=False)
    for dtype in (np.int8, np.uint8, np.int32, np.int64, np.bool_):
        values = data(
            3, 6, dtype=np.int64, low=0 if dtype in (np.uint8, np.bool_) else -128, high=2 if dtype == np.bool_ else 128
        ).astype(dtype)
        got, expected = Tensor(values).cummin(1), torch.cummin(torch.tensor(values), 1)
        assert_tensor(got[0], expected.values.numpy(), dtype=dtypes.from_numpy(np.dtype(dtype)))
        assert_tensor(got[1], expected.indices.numpy(), dtype=dtypes.int64)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_half_scans_round_once_whatever_the_batch(dtype):
    # 8 rows of 1000 take the blocked scan: its blocks' prefixes and totals were rounded to the narrow dtype before
    # they were added (61 of 1000 float16 sums 1 ulp off, 299 of 1000 bfloat16 ones), while 1 row was right
    torch = pytest.importorskip("torch")
    row = np.random.default_rng(5).integers(-100, 100, 1000).astype(np.float32)
    torch_dtype = {dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}[dtype]
    expected = torch.tensor(row).to(torch_dtype).cumsum(0).float().numpy()
    for rows in (1, 8):
        batch = Tensor(np.repeat(row[None], rows, 0)).cast(dtype)
        result = batch.cumsum(-1)
        assert result.dtype == dtype
        np.testing.assert_array_equal(result.float().numpy()[0], expected)
