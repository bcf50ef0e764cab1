"""Creation against PyTorch: torch's keywords (`size=`, `end=`), float ranges computed in float64 and rounded once,
linspace's exact ends, and the *_like constructors."""

import numpy as np
import pytest
import torch

from lazygrad import Device, Tensor, dtypes

TORCH_DTYPES = {
    dtypes.float32: torch.float32,
    dtypes.float16: torch.float16,
    dtypes.bfloat16: torch.bfloat16,
    dtypes.float64: torch.float64,
    dtypes.int32: torch.int32,
}


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _needs(dtype) -> None:
    if dtype in Device[Device.DEFAULT].unsupported_dtypes:
        pytest.skip(f"{Device.DEFAULT} lacks {dtype}")


def _assert_rounded_once(got: np.ndarray, wide: torch.Tensor, dtype, scale: float) -> None:
    """`got` is torch's float64 values (`wide`) rounded once to `dtype`. A float64 value is a few ulps of the operands
    (`scale`) away, as devices fuse `start + i * step` or not and torch's vector lanes step on; that moves a rounded
    value only where the sum cancels to near zero (-3.7 + 10 * 0.37 is 0, or -2.2e-16 fused)."""
    values = wide.numpy()
    if dtype == dtypes.float64:
        np.testing.assert_allclose(got, values, rtol=0, atol=scale * 2**-50)
        return
    near_zero = np.abs(values) < scale * 2**-20
    np.testing.assert_array_equal(got[~near_zero], _numpy(wide.to(TORCH_DTYPES[dtype]))[~near_zero])
    np.testing.assert_allclose(got[near_zero], values[near_zero], rtol=0, atol=scale * 2**-50)


# ---- torch's keywords -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "rand", "randn"])
@pytest.mark.parametrize("size", [(2, 3), (4,), [5], ()])
def test_shape_as_size_keyword_matches_torch(name, size):
    got = getattr(Tensor, name)(size=size)
    want = getattr(torch, name)(size=size)
    assert got.shape == tuple(want.shape)
    if name in ("zeros", "ones"):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_size_keyword_of_full_uniform_and_normal():
    np.testing.assert_array_equal(
        Tensor.full(size=(2, 3), fill_value=7).numpy(), torch.full(size=(2, 3), fill_value=7).numpy()
    )
    assert Tensor.uniform(size=(3, 2), low=-1.0, high=1.0).shape == tuple(torch.empty(size=(3, 2)).uniform_().shape)
    assert Tensor.normal(size=5, mean=1.0, std=2.0).shape == tuple(torch.normal(1.0, 2.0, size=(5,)).shape)


@pytest.mark.parametrize(
    "name, make, torch_make",
    [
        ("rand", lambda: Tensor.rand(2, foo=1), lambda: torch.rand(2, foo=1)),
        ("randn", lambda: Tensor.randn(2, foo=1), lambda: torch.randn(2, foo=1)),
        ("uniform", lambda: Tensor.uniform(2, foo=1), None),
        ("normal", lambda: Tensor.normal(2, foo=1), None),
        ("zeros", lambda: Tensor.zeros(2, foo=1), lambda: torch.zeros(2, foo=1)),
        ("ones", lambda: Tensor.ones(2, foo=1), lambda: torch.ones(2, foo=1)),
        ("empty", lambda: Tensor.empty(2, foo=1), lambda: torch.empty(2, foo=1)),
        ("full", lambda: Tensor.full((2,), 1, foo=1), lambda: torch.full((2,), 1, foo=1)),
        ("arange", lambda: Tensor.arange(3, foo=1), lambda: torch.arange(3, foo=1)),
        ("linspace", lambda: Tensor.linspace(0, 1, 3, foo=1), lambda: torch.linspace(0, 1, 3, foo=1)),
        ("randint", lambda: Tensor.randint(3, foo=1), lambda: torch.randint(3, (3,), foo=1)),
        ("zeros_like", lambda: Tensor([1.0]).zeros_like(foo=1), lambda: torch.zeros_like(torch.ones(1), foo=1)),
    ],
)
def test_unknown_keywords_are_errors_naming_the_op(name, make, torch_make):
    # they were swallowed: Tensor.rand(2, foo=1) was a (2,) tensor, Tensor.rand(size=(2, 3)) a scalar
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'foo'"):
        make()
    if torch_make is not None:
        with pytest.raises(TypeError):
            torch_make()


@pytest.mark.parametrize("name", ["zeros", "rand", "randn", "uniform", "normal"])
def test_a_shape_given_twice_is_an_error(name):
    with pytest.raises(TypeError, match=rf"{name}: got the shape twice, as \(2,\) and as size=\(3,\)"):
        getattr(Tensor, name)(2, size=(3,))


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tensor.rand(3, requires_grad=True),
        lambda: Tensor.randn(3, requires_grad=True),
        lambda: Tensor.uniform(3, low=-1.0, high=1.0, requires_grad=True),
        lambda: Tensor.normal(3, requires_grad=True),
        lambda: Tensor.zeros(3, requires_grad=True),
        lambda: Tensor.arange(0.0, 1.5, 0.5, requires_grad=True),
        lambda: Tensor.linspace(0, 1, 3, requires_grad=True),
    ],
)
def test_requires_grad_is_kept_and_gradients_flow(make):
    x = make()
    assert x.requires_grad is True
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)


# ---- arange -----------------------------------------------------------------------------------------------------

ARANGE_CASES = [
    (1, -1, -0.3),
    (0, 1, 0.1),
    (0, 2, 0.5),
    (-3.7, 2.2, 0.37),
    (10, 0, -0.7),
    (-1e3, 1e3, 13.1),
    (0, 100, 0.01),
    (2.5, 3.5, 0.001),
    (22.97, -32.43, -2.712),
    (-37.57, 17.06, 3.081),
]


@pytest.mark.parametrize("start, stop, step", ARANGE_CASES)
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=str)
def test_arange_with_float_steps_matches_torch(start, stop, step, dtype):
    _needs(dtype)
    got = Tensor.arange(start, stop, step, dtype=dtype)
    assert got.dtype == dtype
    # torch computes start + i * step in double and rounds once (its vectorized lanes step on in the dtype, so the
    # double values are the reference); it gave 0.39999998 for 0.4 in arange(1, -1, -0.3)
    wide = torch.arange(start, stop, step, dtype=torch.float64)
    _assert_rounded_once(got.numpy(), wide, dtype, max(abs(start), abs(stop)))


def test_arange_values_of_the_report_are_torchs():
    np.testing.assert_array_equal(Tensor.arange(1, -1, -0.3).numpy(), torch.arange(1, -1, -0.3).numpy())
    np.testing.assert_array_equal(Tensor.arange(0, 1, 0.1).numpy(), torch.arange(0, 1, 0.1).numpy())
    assert Tensor.arange(0, 1, 0.1).numpy()[-1] == np.float32(0.9)


@pytest.mark.parametrize("start, stop, step", [(0, 2, 0.5), (0.5, 5, 1.5), (-2.5, 3, 1.5), (7.9, -3.2, -2.5)])
def test_arange_of_an_int_dtype_with_float_steps_matches_torch(start, stop, step):
    # torch counts with the floats and steps with start and step truncated to ints: arange(0, 2, 0.5) is four 0s
    got = Tensor.arange(start, stop, step, dtype=dtypes.int32)
    want = torch.arange(start, stop, step, dtype=torch.int32)
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize(
    "kwargs, dtype",
    [
        ({"end": 4}, dtypes.int32),
        ({"start": 1, "end": 4}, dtypes.int32),
        ({"start": 1, "end": 8, "step": 3}, dtypes.int32),
        ({"start": 0.5, "end": 2.0}, dtypes.float32),
    ],
)
def test_arange_takes_torchs_end_keyword(kwargs, dtype):
    # arange(end=4) failed, and arange(start=1, end=4) blamed Tensor.__init__
    got = Tensor.arange(**kwargs)
    assert got.dtype == dtype  # (Python ints give int32 here, int64 in torch: see the README's Dtypes)
    np.testing.assert_array_equal(got.numpy(), torch.arange(**kwargs).numpy())


def test_arange_keyword_errors_name_arange():
    with pytest.raises(TypeError, match=r"arange: got both stop=4 and end=5 \(end is PyTorch's name for stop\)"):
        Tensor.arange(0, 4, end=5)
    with pytest.raises(TypeError, match=r"arange: missing the end of the range"):
        Tensor.arange()
    with pytest.raises(TypeError, match=r"arange\(\) got an unexpected keyword argument 'stp'"):
        Tensor.arange(0, 4, stp=2)


# ---- linspace ---------------------------------------------------------------------------------------------------

LINSPACE_CASES = [
    (0, 3.3, 10),
    (0, 1, 7),
    (-2.5, 7.5, 11),
    (3, 1, 4),
    (0, 1, 100),
    (-1, 1, 5),
    (0.5, 3.7, 4),
    (-0.5, 3.7, 4),
    (1e-3, 1e3, 33),
    (-7.1, 7.1, 1000),
    (72.956, -88.107, 39),
    (-61.174, 5.204, 226),
    (2, 5, 2),
]


@pytest.mark.parametrize("start, stop, steps", LINSPACE_CASES)
@pytest.mark.parametrize(
    "dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int32], ids=str
)
def test_linspace_matches_torch(start, stop, steps, dtype):
    _needs(dtype)
    got = Tensor.linspace(start, stop, steps, dtype=dtype)
    assert got.dtype == dtype
    values, own = got.numpy(), _numpy(torch.linspace(start, stop, steps, dtype=TORCH_DTYPES[dtype]))
    # both ends are torch's own (exact: linspace(0, 3.3, 10) ended at 3.3000002)
    np.testing.assert_array_equal(values[[0, -1]], own[[0, -1]])
    if dtype.is_float:
        # torch's half and float32 values step on in their own precision; these are its float64 values rounded once
        # (a float64 request was float32 values widened)
        wide = torch.linspace(start, stop, steps, dtype=torch.float64)
        _assert_rounded_once(values, wide, dtype, max(abs(start), abs(stop)))
    else:
        np.testing.assert_array_equal(values, own)


def test_linspace_takes_torchs_end_keyword_and_checks_its_arguments():
    np.testing.assert_array_equal(
        Tensor.linspace(start=-1, end=1, steps=5).numpy(), torch.linspace(start=-1, end=1, steps=5).numpy()
    )
    with pytest.raises(TypeError, match=r"linspace: needs start, stop and steps, got stop=1 and steps=None"):
        Tensor.linspace(0, 1)
    with pytest.raises(ValueError, match=r"linspace: steps must be a non-negative int, got 2.5"):
        Tensor.linspace(0, 1, 2.5)


def test_ranges_on_a_device_without_float64(monkeypatch):
    # computed in float32 there: within float32's rounding of torch's values, linspace's ends still exact
    monkeypatch.setattr(Device[Device.DEFAULT], "unsupported_dtypes", {dtypes.float64: "no doubles"})
    got = Tensor.arange(1, -1, -0.3)
    assert got.dtype == dtypes.float32
    np.testing.assert_allclose(got.numpy(), torch.arange(1, -1, -0.3).numpy(), rtol=0, atol=2**-23)
    values = Tensor.linspace(0, 3.3, 10).numpy()
    np.testing.assert_allclose(values, torch.linspace(0, 3.3, 10).numpy(), rtol=0, atol=3.3 * 2**-23)
    assert values[-1] == np.float32(3.3)


# ---- the *_like constructors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [None, dtypes.int32, dtypes.float16], ids=str)
def test_empty_like_matches_torch(dtype):
    source = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    got = source.empty_like(dtype=dtype)
    want = torch.empty_like(torch.arange(6.0).reshape(2, 3), dtype=TORCH_DTYPES.get(dtype))
    assert got.shape == tuple(want.shape) and got.numpy().dtype == want.numpy().dtype
    np.testing.assert_array_equal(got.numpy(), np.zeros(want.shape, want.numpy().dtype))


def test_like_constructors_take_a_device():
    source = Tensor([1.0, 2.0])
    for made in (
        source.zeros_like(device="PYTHON"),
        source.empty_like(device="PYTHON"),
        source.rand_like(device="PYTHON"),
    ):
        assert made.device == "PYTHON" and made.shape == (2,)
