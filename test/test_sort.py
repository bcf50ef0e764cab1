"""Sorting through the bitonic network (tensor_scan's `_network_order`), which long rows take: the same stable order
as torch's stable sort, for every dtype and the special float values, on every device. The network is forced on small
rows by lowering the threshold; the threshold itself is checked by the kernels a sort schedules."""

import numpy as np
import pytest
import torch
from support import available

import lazygrad.tensor_scan as tensor_scan
from lazygrad import Tensor, dtypes

DEVICES = ["LLVM", "CPU", "GPU", "CUDA", "PYTHON"]
rng = np.random.default_rng(0)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return available(request.param)


@pytest.fixture
def network(monkeypatch):
    """Every sort goes through the network."""
    monkeypatch.setattr(tensor_scan, "NETWORK_SORT_WORK", -1)


def special_floats(*shape: int) -> np.ndarray:
    """Whole numbers (ties) mixed with NaN, infinities and both zeros."""
    values = rng.integers(-3, 4, shape).astype(np.float32)
    flat = values.reshape(-1)
    for offset, special in enumerate([np.nan, np.inf, -np.inf, -0.0, 0.0, np.nan]):
        flat[offset::7] = special
    return values


def expected_order(values: np.ndarray, descending: bool) -> np.ndarray:
    """The stable sort's indices along the last axis (NumPy's for the unsigned types torch cannot sort)."""
    if values.dtype in (np.uint32, np.uint64):
        keys = np.iinfo(values.dtype).max - values if descending else values
        return np.argsort(keys, axis=-1, kind="stable")
    return torch.sort(torch.tensor(values), dim=-1, descending=descending, stable=True).indices.numpy()


@pytest.mark.usefixtures("network")
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("shape", [(1,), (6,), (3, 13), (2, 32)])
def test_network_sorts_special_floats_as_torch(device, shape, descending):
    values = special_floats(*shape)
    got_values, got_order = Tensor(values, device=device).sort(descending=descending)
    order = expected_order(values, descending)
    np.testing.assert_array_equal(got_order.numpy(), order)
    assert got_order.dtype == dtypes.int64
    want = np.take_along_axis(values, order, -1)
    np.testing.assert_array_equal(got_values.numpy(), want)
    np.testing.assert_array_equal(np.signbit(got_values.numpy()), np.signbit(want))  # (-0.0 stays -0.0)


@pytest.mark.usefixtures("network")
@pytest.mark.parametrize(
    "dtype", ["float16", "bfloat16", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64", "bool"]
)
def test_network_sorts_every_dtype(dtype):
    if dtype == "bool":
        values = rng.integers(0, 2, (3, 11)).astype(np.bool_)
    elif dtype in ("float16", "bfloat16", "float64"):
        values = special_floats(3, 11).astype(np.float64)
    else:
        info = np.iinfo(dtype)
        # the extremes among small values: ties, and the top bit of unsigned types set
        values = rng.choice(np.array([info.min, info.max, info.max - 1, 0, 1, 2], dtype), (3, 11))
    for descending in (False, True):
        got = Tensor(values, dtype=dtype).argsort(descending=descending).numpy()
        rounded = values.astype(np.float32) if dtype in ("float16", "bfloat16") else values  # (whole numbers: exact)
        np.testing.assert_array_equal(got, expected_order(rounded, descending), err_msg=f"{dtype} {descending}")


@pytest.mark.usefixtures("network")
def test_network_sorts_along_any_axis_and_keeps_gradients():
    values = rng.standard_normal((5, 4, 3)).astype(np.float32)
    x, reference = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    got, want = x.sort(dim=0, descending=True), torch.sort(reference, dim=0, descending=True, stable=True)
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    upstream = rng.standard_normal((5, 4, 3)).astype(np.float32)
    (got.values * Tensor(upstream)).sum().backward()
    (want.values * torch.tensor(upstream)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), reference.grad.numpy())
    top = x.detach().topk(2, dim=1, largest=False)
    expected = torch.topk(torch.tensor(values), 2, dim=1, largest=False)
    np.testing.assert_array_equal(top.values.numpy(), expected.values.numpy())
    np.testing.assert_array_equal(top.indices.numpy(), expected.indices.numpy())


def test_long_rows_take_the_network():
    # rows * n^2 comparisons above NETWORK_SORT_WORK: one kernel per step of the network (120 for 2^15 elements)
    # instead of the direct sort's few
    limit = tensor_scan.NETWORK_SORT_WORK
    longest_direct = int(limit**0.5)
    assert len(Tensor.zeros(1, longest_direct).argsort().schedule()) <= 3
    assert len(Tensor.zeros(1, longest_direct + 1).argsort().schedule()) >= 120


@pytest.mark.parametrize("op", ["median", "nanmedian"])
def test_medians_as_torch(op):
    nan = np.nan
    rows = np.array([[3, nan, 1, 2, nan], [4, 1.5, 1, 2, 5], [nan, 7, nan, nan, 6], [2, -1, 0.5, 3, -0.0]], np.float32)
    for keepdim in (False, True):
        for dim in (1, 0):
            got = getattr(Tensor(rows), op)(dim, keepdim)
            want = getattr(torch, op)(torch.tensor(rows), dim, keepdim)
            np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
            np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(getattr(Tensor(rows), op)().numpy(), getattr(torch, op)(torch.tensor(rows)).numpy())
    ints = np.array([[1, 3, 2, 9], [5, 7, 1, 0]], np.int32)
    got, want = getattr(Tensor(ints), op)(1), getattr(torch, op)(torch.tensor(ints), 1)
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    x, reference = (
        Tensor([3.0, 1.0, 2.0, 5.0], requires_grad=True),
        torch.tensor([3.0, 1.0, 2.0, 5.0], requires_grad=True),
    )
    getattr(x, op)().backward()
    getattr(torch, op)(reference).backward()
    np.testing.assert_array_equal(x.grad.numpy(), reference.grad.numpy())
    assert getattr(Tensor(5.0), op)(0).values.item() == 5.0
    assert np.isnan(getattr(Tensor.zeros(0), op)().item())
    with pytest.raises(ValueError, match=f"{op}: dim 1 of \\(2, 0\\) is empty"):
        getattr(Tensor.zeros(2, 0), op)(1)


def test_kthvalue_and_msort_as_torch():
    values = rng.permutation(24).reshape(4, 6).astype(np.float32)  # distinct: torch picks among ties freely
    values[1, 2] = np.nan
    for k in (1, 3, 4):
        for dim, keepdim in ((1, False), (0, True)):
            got = Tensor(values).kthvalue(k, dim, keepdim)
            want = torch.kthvalue(torch.tensor(values), k, dim, keepdim)
            np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
            np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    np.testing.assert_array_equal(Tensor(values).msort().numpy(), torch.msort(torch.tensor(values)).numpy())
    with pytest.raises(ValueError, match=r"kthvalue: k must be an int in 1\.\.6.*got 0"):
        Tensor(values).kthvalue(0)


def test_topk_takes_numpy_ints_and_refuses_bools():
    x = Tensor([1.0, 3.0, 2.0])
    assert x.topk(np.int64(2)).indices.tolist() == [1, 2]
    for bad in (True, 2.0, 4):
        with pytest.raises(ValueError, match=r"topk: k must be an int in 0\.\.3"):
            x.topk(bad)


@pytest.mark.usefixtures("network")
@pytest.mark.parametrize("largest", [True, False])
def test_topk_of_long_rows_picks_maxima_in_rounds_as_the_stable_sort(device, largest):
    """A small k of long rows takes one maximum a round (`_picked_in_rounds`); the values and indices are the
    stable sort's first k, NaN, ties and both zeros included."""
    values = special_floats(3, 13)
    got = Tensor(values, device=device).topk(5, largest=largest)
    order = expected_order(values, largest)[:, :5]
    np.testing.assert_array_equal(got.indices.numpy(), order)
    np.testing.assert_array_equal(got.values.numpy(), np.take_along_axis(values, order, -1))
    for dtype in ("int8", "uint32", "bool", "float16"):
        small = rng.integers(0, 3, (2, 9)).astype(dtype if dtype != "float16" else np.float32)
        picked = Tensor(small, dtype=dtype, device=device).topk(4, dim=1, largest=largest).indices
        np.testing.assert_array_equal(picked.numpy(), expected_order(small, largest)[:, :4], err_msg=dtype)


def test_topk_gradient_through_rounds(network):
    values = rng.standard_normal((2, 40)).astype(np.float32)
    x, reference = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    x.topk(3).values.sum().backward()
    torch.topk(reference, 3).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), reference.grad.numpy())


@pytest.mark.parametrize("dim, largest", [(-1, True), (0, False)])
def test_topk_of_mid_sized_rows_takes_rounds_and_keeps_ties_in_order(dim, largest):
    # rows a direct sort would compare in more than 2^20 comparisons, with k at most an eighth of them, find their k
    # values one maximum at a time (topk(5) of 256 x 1000 sorted whole rows: 30 ms, now ~1.5)
    values = np.random.default_rng(7).integers(0, 50, (256, 400)).astype(np.float32)  # (many ties)
    ours = Tensor(values).topk(5, dim, largest=largest)
    theirs = torch.from_numpy(values).topk(5, dim, largest=largest)
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    stable = torch.from_numpy(values).sort(dim=dim, descending=largest, stable=True).indices
    np.testing.assert_array_equal(ours.indices.numpy(), stable.narrow(dim % 2, 0, 5).numpy())
