"""Indexing and layout ops against PyTorch and NumPy: gather, scatter, scatter_reduce, masks, advanced getitem and
setitem, diag/diagonal, roll, repeat_interleave, meshgrid, unfold and einsum; values, gradients and errors.

The same file runs on every device; tensors stay small (the PYTHON device emulates kernels one scalar at a time)."""

import numpy as np
import pytest
from test_ops import assert_tensor, data
from test_ops_backward import compare_backward

from lazygrad import Tensor, dtypes

torch = pytest.importorskip("torch")

INDEX = np.array([[[0, 3, 1, 1, 2], [2, 2, 0, 3, 3]], [[1, 0, 0, 2, 3], [3, 1, 2, 0, 0]]])  # (2, 2, 5) into size 4
# distinct per column along dim 1, so scatter's result does not depend on which writer wins
UNIQUE = np.array([[[0, 3, 1, 2, 2], [2, 1, 0, 3, 0]], [[1, 0, 3, 2, 3], [3, 1, 2, 0, 0]]])


def grad_check(function, *arrays, torch_function=None, tolerance=None):
    """Values and gradients of every float input against torch."""
    compare_backward(
        list(arrays),
        function,
        torch_function or function,
        tolerance or {"rtol": 1e-4, "atol": 1e-5},
        np.random.default_rng(1),
    )


# ---------------------------------------------------------------------------------------------------------------------
# gather and scatter


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    x = data(3, 4, 5)
    index = np.random.default_rng(dim + 5).integers(0, x.shape[dim], size=(2, 3, 4))
    expected = torch.gather(torch.tensor(x), dim, torch.tensor(index)).numpy()
    assert_tensor(Tensor(x).gather(dim, Tensor(index)), expected)
    grad_check(lambda t: t.gather(dim, Tensor(index)), x, torch_function=lambda t: t.gather(dim, torch.tensor(index)))


def test_gather_int_and_bool():
    x = data(3, 4, dtype=np.int32, low=-50, high=50)
    index = np.array([[3, 0], [1, 1], [2, 0]])
    assert_tensor(Tensor(x).gather(1, Tensor(index)), np.take_along_axis(x, index, 1), dtype=dtypes.int32)
    mask = x > 0
    assert_tensor(Tensor(mask).gather(1, Tensor(index)), np.take_along_axis(mask, index, 1), dtype=dtypes.bool)


def test_gather_errors():
    x = Tensor(data(3, 4))
    with pytest.raises(IndexError, match=r"gather: index 4 is out of range for axis 1 of size 4"):
        x.gather(1, Tensor([[4]]))
    with pytest.raises(IndexError, match=r"gather: index -1"):
        x.gather(1, Tensor([[-1]]))
    with pytest.raises(TypeError, match="gather: index must be an integer Tensor"):
        x.gather(1, Tensor([[1.0]]))
    with pytest.raises(ValueError, match=r"gather: index \(2,\) must have as many dimensions as the input \(3, 4\)"):
        x.gather(1, Tensor([1, 2]))
    with pytest.raises(ValueError, match=r"larger than the input \(3, 4\) in dimension 0"):
        x.gather(1, Tensor(np.zeros((5, 1), np.int32)))


@pytest.mark.parametrize("dim", [1, -2])
def test_scatter(dim):
    x, src = data(2, 4, 5), data(2, 3, 6, seed=1)
    expected = torch.tensor(x).scatter(dim, torch.tensor(UNIQUE), torch.tensor(src)).numpy()
    assert_tensor(Tensor(x).scatter(dim, Tensor(UNIQUE), Tensor(src)), expected)
    src = src[:, :2, :5]  # (torch's backward needs src the index's shape)
    grad_check(
        lambda a, b: a.scatter(dim, Tensor(UNIQUE), b),
        x,
        src,
        torch_function=lambda a, b: a.scatter(dim, torch.tensor(UNIQUE), b),
    )
    expected = torch.tensor(x).scatter(dim, torch.tensor(UNIQUE), 2.5).numpy()
    assert_tensor(Tensor(x).scatter(dim, Tensor(UNIQUE), 2.5), expected)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_duplicates_last_wins_and_reduce_arguments():
    x = np.zeros(3, np.float32)
    assert_tensor(Tensor(x).scatter(0, Tensor([1, 1, 0]), Tensor([5.0, 6.0, 7.0])), np.array([7.0, 6.0, 0.0]))
    x, src = data(2, 4, 5), data(2, 2, 5, seed=2)
    for reduce in ("add", "multiply"):
        expected = torch.tensor(x).scatter(1, torch.tensor(INDEX), torch.tensor(src), reduce=reduce).numpy()
        assert_tensor(Tensor(x).scatter(1, Tensor(INDEX), Tensor(src), reduce=reduce), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="scatter: reduce must be None, 'add' or 'multiply'"):
        Tensor(x).scatter(1, Tensor(INDEX), Tensor(src), reduce="max")


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x, src = data(2, 4, 5), data(2, 2, 5, seed=3)
    index = torch.tensor(INDEX)

    def torch_fn(a, b):
        return a.scatter_reduce(1, index, b, reduce, include_self=include_self)

    expected = torch_fn(torch.tensor(x), torch.tensor(src)).numpy()
    assert_tensor(Tensor(x).scatter_reduce(1, Tensor(INDEX), Tensor(src), reduce, include_self), expected)
    grad_check(
        lambda a, b: a.scatter_reduce(1, Tensor(INDEX), b, reduce, include_self), x, src, torch_function=torch_fn
    )


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_int(reduce):
    x, src = data(2, 4, 5, dtype=np.int32, low=-9, high=9), data(2, 2, 5, dtype=np.int32, low=-9, high=9, seed=4)
    for include_self in (True, False):
        expected = (
            torch.tensor(x)
            .scatter_reduce(1, torch.tensor(INDEX), torch.tensor(src), reduce, include_self=include_self)
            .numpy()
        )
        result = Tensor(x).scatter_reduce(1, Tensor(INDEX), Tensor(src), reduce, include_self)
        assert_tensor(result, expected, dtype=dtypes.int32)


def test_scatter_errors():
    x = Tensor(data(2, 4, 5))
    with pytest.raises(ValueError, match="scatter_reduce: reduce must be one of sum, prod, mean, amax, amin"):
        x.scatter_reduce(1, Tensor(INDEX), Tensor(data(2, 2, 5)), "max")
    with pytest.raises(ValueError, match=r"larger than src \(2, 1, 5\) in dimension 1"):
        x.scatter(1, Tensor(INDEX), Tensor(data(2, 1, 5)))
    with pytest.raises(IndexError, match="scatter: index 4 is out of range for axis 1 of size 4"):
        x.scatter(1, Tensor(INDEX + 4), 1.0)


# ---------------------------------------------------------------------------------------------------------------------
# masks


def test_masked_fill_and_select():
    x = data(3, 4)
    mask = data(3, 1, dtype=np.bool_, seed=2) | (x > 1)
    assert_tensor(Tensor(x).masked_fill(Tensor(mask), -9.0), np.where(mask, -9.0, x).astype(np.float32))
    grad_check(
        lambda t: t.masked_fill(Tensor(mask), 0.5),
        x,
        torch_function=lambda t: t.masked_fill(torch.tensor(mask), 0.5),
    )
    assert_tensor(Tensor(x).masked_select(Tensor(mask)), np.broadcast_to(x, mask.shape)[mask])
    grad_check(
        lambda t: t.masked_select(Tensor(mask)),
        x,
        torch_function=lambda t: t.masked_select(torch.tensor(mask)),
    )
    ints = data(3, 4, dtype=np.int32, low=0, high=9)
    assert_tensor(Tensor(ints).masked_fill(Tensor(mask), 7), np.where(mask, 7, ints), dtype=dtypes.int32)


def test_mask_errors():
    x = Tensor(data(3, 4))
    with pytest.raises(TypeError, match="masked_fill: mask must be a bool Tensor, got dtypes.int32"):
        x.masked_fill(Tensor([[1, 0, 1, 0]]), 1.0)
    with pytest.raises(ValueError, match=r"masked_fill: mask \(2, 3, 4\) does not broadcast to the input's shape"):
        x.masked_fill(Tensor(np.ones((2, 3, 4), bool)), 1.0)
    with pytest.raises(TypeError, match="masked_select: mask must be a bool Tensor"):
        x.masked_select(np.ones((3, 4), bool))


# ---------------------------------------------------------------------------------------------------------------------
# advanced indexing

A = data(3, 4, 5)
ADVANCED_INDICES = [
    ([0, 2],),
    ([0, 2], slice(None), [1, 3]),
    (slice(None), [0, 2], [1, 3]),
    (1, slice(None), [1, 3]),
    (None, [[0], [2]], slice(1, 3), [1, -1]),
    (Ellipsis, [1, -1]),
    (slice(None, None, -1), np.array([[1, 2], [0, 3]])),
    (A > 0,),
    (A[:, :, 0] > 0, slice(1, 4)),
    (slice(None), [True, False, True, True]),
    ([],),
]


@pytest.mark.parametrize("index", ADVANCED_INDICES, ids=range(len(ADVANCED_INDICES)))
def test_getitem_advanced(index):
    # torch's rules (NumPy's, except that an int selects first and never separates advanced indices)
    torch_index = tuple(torch.tensor(item) if isinstance(item, np.ndarray) else item for item in index)
    reversed_slice = any(isinstance(i, slice) and i.step == -1 for i in index)  # torch has no negative steps
    assert_tensor(Tensor(A)[index], A[index] if reversed_slice else torch.tensor(A)[torch_index].numpy())
    if not reversed_slice and Ellipsis not in [i for i in index if not isinstance(i, np.ndarray)]:
        grad_check(lambda t: t[index], A, torch_function=lambda t: t[torch_index])


def test_getitem_tensor_indices():
    rows, cols = Tensor([[0], [2]]), Tensor([3, 0, -1])
    assert_tensor(Tensor(A)[rows, 1, cols], A[[[0], [2]], 1, [3, 0, -1]])
    assert_tensor(Tensor(A)[Tensor(A) > 0], A[A > 0])
    assert_tensor(Tensor(A.astype(np.int32))[:, Tensor([1, 1])], A.astype(np.int32)[:, [1, 1]], dtype=dtypes.int32)
    grad_check(
        lambda t: t[Tensor([[0], [2]]), 1, Tensor([3, 0, -1])],
        A,
        torch_function=lambda t: t[torch.tensor([[0], [2]]), 1, torch.tensor([3, 0, -1])],
    )


def test_getitem_advanced_errors():
    x = Tensor(A)
    with pytest.raises(IndexError, match="getitem: index 3 is out of range for axis 0 of size 3"):
        x[[0, 3]]
    with pytest.raises(IndexError, match=r"getitem: index -5 is out of range for axis 1 of size 4 \(allowed: -4..3\)"):
        x[:, Tensor([-5])]
    with pytest.raises(IndexError, match=r"index shapes \(2,\) and \(3,\) cannot be broadcast together"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(TypeError, match="getitem: indices must be integers"):
        x[[0.5]]
    with pytest.raises(TypeError, match=r"getitem: unsupported index 1.5; use ints, slices, None, \.\.\., lists"):
        x[0, 1.5]
    with pytest.raises(TypeError, match="getitem: unsupported index True"):
        x[True]
    with pytest.raises(IndexError, match=r"too many indices \(4\) for a tensor of shape \(3, 4, 5\)"):
        x[[0], 0, 0, 0]


SETITEM_CASES = [
    ((0, slice(1, 3)), 7.0),
    ((slice(None), slice(None, None, 2), -1), np.arange(6, dtype=np.float32).reshape(3, 2)),
    (([0, 2], slice(None), 1), np.ones((2, 4), np.float32)),
    ((A > 0,), 0.0),
    (([0, 0], [1, 1]), np.arange(10, dtype=np.float32).reshape(2, 5)),
    ((Ellipsis, [4, 0]), np.array([1.0, 2.0], np.float32)),
]


@pytest.mark.parametrize("index, value", SETITEM_CASES, ids=range(len(SETITEM_CASES)))
def test_setitem(index, value):
    tensor, expected = Tensor(A.copy()), A.copy()
    tensor[index] = Tensor(value) if isinstance(value, np.ndarray) else value
    expected[index] = value
    assert_tensor(tensor, expected)


@pytest.mark.parametrize(
    "index",
    [(0, slice(None), [0, 3]), (0, slice(None), [[0, 1], [2, 3]]), ([0, 2], slice(None), 1), (slice(None), 1, [0, 2])],
)
def test_setitem_places_values_in_getitems_order(index):
    # an int beside a list across a slice: torch (and getitem) select the int's axis first, so x[0, :, [0, 3]] is
    # (4, 2) where NumPy's is (2, 4); the value goes where getitem would read it back
    torch = pytest.importorskip("torch")
    tensor, expected = Tensor(A.copy()), torch.tensor(A)
    value = np.arange(np.prod(expected[index].shape), dtype=np.float32).reshape(expected[index].shape)
    tensor[index] = Tensor(value)
    expected[index] = torch.tensor(value)
    assert_tensor(tensor, expected.numpy())
    assert_tensor(tensor[index], value)


def test_setitem_tensor_index_on_lazy_tensor_and_gradient():
    x = Tensor(A)
    y = x * 2
    y[Tensor([1]), 0] = Tensor(np.full(5, 3.0, np.float32))
    expected = A * 2
    expected[[1], 0] = 3.0
    assert_tensor(y, expected)
    x, value = Tensor(A, requires_grad=True), Tensor(np.ones(5, np.float32), requires_grad=True)
    y = x * 1
    y[0, 1] = value * 3
    y.sum().backward()
    expected_grad = np.ones_like(A)
    expected_grad[0, 1] = 0
    assert_tensor(x.grad, expected_grad)
    assert_tensor(value.grad, np.full(5, 3.0, np.float32))


def test_setitem_errors():
    x = Tensor(A.copy())
    with pytest.raises(ValueError, match=r"setitem: value \(3,\) does not broadcast to the selected shape \(4, 5\)"):
        x[0] = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError, match="out of range"):
        x[[5]] = 1.0
    assert_tensor(x, A)
    counts = Tensor.zeros(3, dtype=dtypes.int32).contiguous().realize()
    with pytest.raises(OverflowError, match=r"setitem: 1099511627776 does not fit in dtypes.int32"):
        counts[0] = 2**40


# ---------------------------------------------------------------------------------------------------------------------
# layout


@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (1, 1, 2), (-2, 2, 1), (3, 0, 2), (-5, 1, 2)])
def test_diagonal(offset, dim1, dim2):
    assert_tensor(Tensor(A).diagonal(offset, dim1, dim2), np.diagonal(A, offset, dim1, dim2))
    grad_check(lambda t: t.diagonal(offset, dim1, dim2), A)


@pytest.mark.parametrize("offset", [0, 2, -1])
def test_diag(offset):
    vector, matrix = data(4), data(3, 5)
    assert_tensor(Tensor(vector).diag(offset), np.diag(vector, offset))
    assert_tensor(Tensor(matrix).diag(offset), np.diag(matrix, offset))
    grad_check(lambda t: t.diag(offset), vector)
    grad_check(lambda t: t.diag(offset), matrix)
    with pytest.raises(ValueError, match=r"diag: needs a 1-D or 2-D tensor, got shape \(3, 4, 5\)"):
        Tensor(A).diag()
    with pytest.raises(ValueError, match="diagonal: dim1 and dim2 name the same axis 1"):
        Tensor(A).diagonal(0, 1, -2)


@pytest.mark.parametrize("shifts, dims", [(1, 0), (-2, 1), ((2, -1), (1, 2)), (7, None), (0, 2)])
def test_roll(shifts, dims):
    assert_tensor(Tensor(A).roll(shifts, dims), np.roll(A, shifts, dims))
    grad_check(lambda t: t.roll(shifts, dims), A)
    with pytest.raises(ValueError, match="roll: 2 shifts for 1 dims"):
        Tensor(A).roll((1, 2), 0)
    with pytest.raises(TypeError, match=r"roll: shifts must be ints, got \(1.5,\)"):
        Tensor(A).roll(1.5, 0)


@pytest.mark.parametrize("repeats, dim", [(2, 1), (3, None), ([1, 0, 2], 0), (0, -1)])
def test_repeat_interleave(repeats, dim):
    assert_tensor(Tensor(A).repeat_interleave(repeats, dim), np.repeat(A, repeats, dim))
    torch_repeats = torch.tensor(repeats) if isinstance(repeats, list) else repeats
    grad_check(
        lambda t: t.repeat_interleave(repeats, dim),
        A,
        torch_function=lambda t: t.repeat_interleave(torch_repeats, dim),
    )
    with pytest.raises(ValueError, match=r"repeat_interleave: repeats must be 3 non-negative counts"):
        Tensor(A).repeat_interleave([1, 2], 0)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing):
    x, y, z = np.arange(3), np.arange(2) * 2.0, np.arange(4)
    grids = Tensor.meshgrid(Tensor(x), Tensor(y), Tensor(z), indexing=indexing)
    for grid, expected in zip(grids, np.meshgrid(x, y, z, indexing=indexing)):
        assert_tensor(grid, expected)
    # as a method of the first tensor (it dropped that tensor), and with a list
    for grids in (
        Tensor(x).meshgrid(Tensor(y), Tensor(z), indexing=indexing),
        Tensor.meshgrid([Tensor(x), Tensor(y), Tensor(z)], indexing=indexing),
    ):
        for grid, expected in zip(grids, np.meshgrid(x, y, z, indexing=indexing), strict=True):
            assert_tensor(grid, expected)
    with pytest.raises(ValueError, match="meshgrid: indexing must be 'ij' or 'xy'"):
        Tensor.meshgrid(Tensor(x), indexing="ji")


@pytest.mark.parametrize("dimension, size, step", [(2, 2, 2), (1, 3, 1), (0, 1, 2), (-1, 5, 1), (2, 2, 3)])
def test_unfold(dimension, size, step):
    expected = torch.tensor(A).unfold(dimension, size, step).numpy()
    assert_tensor(Tensor(A).unfold(dimension, size, step), expected)
    grad_check(lambda t: t.unfold(dimension, size, step), A)
    with pytest.raises(ValueError, match=r"unfold: size 6 exceeds dimension 2 of \(3, 4, 5\)"):
        Tensor(A).unfold(2, 6, 1)


EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk", [(2, 3, 4), (4, 2)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ijk->", [(2, 3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
]


@pytest.mark.parametrize("formula, shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum(formula, shapes):
    arrays = [data(*shape, seed=n) for n, shape in enumerate(shapes)]
    assert_tensor(Tensor.einsum(formula, *[Tensor(a) for a in arrays]), np.einsum(formula, *arrays), rtol=1e-5)
    grad_check(
        lambda *ts: Tensor.einsum(formula, *ts),
        *arrays,
        torch_function=lambda *ts: torch.einsum(formula, *ts),
    )


def test_einsum_errors():
    a, b = Tensor(data(3, 4)), Tensor(data(5, 2))
    with pytest.raises(ValueError, match=r"einsum: 'j' has size 4 in one operand and 5 in another"):
        Tensor.einsum("ij,jk->ik", a, b)
    with pytest.raises(ValueError, match="einsum: 'ij,jk->ik' names 2 operands, but 1 were given"):
        Tensor.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match=r"subscript 'ijk' has 3 letters but its operand has shape \(3, 4\)"):
        Tensor.einsum("ijk->i", a)
    with pytest.raises(ValueError, match="output subscript 'z'"):
        Tensor.einsum("ij->z", a)
    with pytest.raises(ValueError, match="einsum: output subscripts of 'ij->ii' repeat a letter"):
        Tensor.einsum("ij->ii", a)


def test_ndim():
    assert Tensor(A).ndim == 3 and Tensor(1.0).ndim == 0


def test_setitem_writes_through_reshapes_and_refuses_strided_views():
    base = Tensor(A.copy()).realize()
    flat = base.reshape(60)
    flat[0] = 100.0
    base[2, 3] = Tensor(np.full(5, -1.0, np.float32))
    expected = A.copy()
    expected.reshape(60)[0] = 100.0
    expected[2, 3] = -1.0
    assert_tensor(base, expected)
    assert_tensor(flat, expected.reshape(60))
    zeros = Tensor.zeros(2, 3)
    zeros[1] = 4.0
    assert_tensor(zeros, np.array([[0, 0, 0], [4, 4, 4]], np.float32))
    copy = base[0].contiguous()
    copy[1] = 5.0
    assert_tensor(base, expected)
    assert_tensor(copy[1], np.full(5, 5.0, np.float32))
    row = base[0]  # a slice is written through to the tensor sliced, as torch's
    row[1] = 5.0
    expected[0, 1] = 5.0
    assert_tensor(base, expected)
    assert_tensor(row, expected[0])


def test_scatter_value_keyword():
    x = np.zeros((2, 3), np.float32)
    index = np.array([[2], [0]])
    expected = torch.tensor(x).scatter(1, torch.tensor(index), value=1.5).numpy()
    assert_tensor(Tensor(x).scatter(1, Tensor(index), value=1.5), expected)
    with pytest.raises(TypeError, match="scatter: pass exactly one of src"):
        Tensor(x).scatter(1, Tensor(index), 1.0, value=2.0)


def test_operand_type_errors():
    with pytest.raises(TypeError, match="einsum: operands must be Tensors, got ndarray"):
        Tensor.einsum("ij->ji", data(2, 3))
    with pytest.raises(TypeError, match="meshgrid: expects Tensors, got list"):
        Tensor.meshgrid([1, 2], [3])
    with pytest.raises(ValueError, match="unfold: size and step must be positive, got size=0"):
        Tensor(A).unfold(0, 0, 1)


def test_tensor_index_stays_in_the_graph_under_jit():
    from lazygrad import TinyJit

    table = Tensor(np.arange(20, dtype=np.float32).reshape(10, 2)).realize()

    @TinyJit
    def lookup(index: Tensor) -> Tensor:
        return (table[index] * 1).realize()

    for step in range(4):
        index = [step, 9 - step, -1]
        assert_tensor(lookup(Tensor(index).realize()), np.arange(20, dtype=np.float32).reshape(10, 2)[index])


def test_take_along_dim_and_index_select():
    x = data(3, 4, 5)
    indices = np.random.default_rng(0).integers(0, 4, size=(1, 2, 5))
    against = torch.take_along_dim(torch.tensor(x), torch.tensor(indices), 1).numpy()
    assert_tensor(Tensor(x).take_along_dim(Tensor(indices), 1), against)
    flat = np.array([0, 59, 7])
    assert_tensor(Tensor(x).take_along_dim(Tensor(flat)), x.reshape(-1)[flat])
    grad_check(
        lambda t: t.take_along_dim(Tensor(indices), 1),
        x,
        torch_function=lambda t: torch.take_along_dim(t, torch.tensor(indices), 1),
    )
    index = np.array([4, 0, 4])
    assert_tensor(
        Tensor(x).index_select(2, Tensor(index)), torch.tensor(x).index_select(2, torch.tensor(index)).numpy()
    )
    grad_check(
        lambda t: t.index_select(-1, Tensor(index)),
        x,
        torch_function=lambda t: t.index_select(-1, torch.tensor(index)),
    )
    with pytest.raises(TypeError, match="index_select: index must be a 0-d or 1-D integer Tensor"):
        Tensor(x).index_select(0, Tensor([[0]]))
    with pytest.raises(ValueError, match=r"take_along_dim: indices must be a Tensor with the input's 3 dimensions"):
        Tensor(x).take_along_dim(Tensor([0]), 1)


def test_a_0d_tensor_has_one_axis_for_argmax_gather_and_scatter_as_in_torch():
    """(a bare IndexError before)"""
    x, tx = Tensor(2.5), torch.tensor(2.5)
    for name in ("argmax", "argmin"):
        assert getattr(x, name)(0).item() == getattr(tx, name)(0).item() == 0
        assert getattr(x, name)(-1, keepdim=True).shape == getattr(tx, name)(-1, keepdim=True).shape == ()
    assert x.gather(0, Tensor(0)).item() == tx.gather(0, torch.tensor(0)).item() == 2.5
    assert x.scatter(0, Tensor(0), Tensor(1.0)).item() == 1.0 and x.scatter(0, Tensor(0), 4.0).item() == 4.0
    expected = tx.scatter_reduce(0, torch.tensor(0), torch.tensor(1.0), "sum").item()
    assert x.scatter_reduce(0, Tensor(0), Tensor(1.0), "sum").item() == expected == 3.5
    with pytest.raises(IndexError, match="argmax: axis 1 is out of range"):
        x.argmax(1)


def test_masked_fill_of_a_number_the_dtype_cannot_hold_says_to_widen_the_tensor():
    with pytest.raises(OverflowError, match=r"^masked_fill: 300 does not fit in dtypes.uint8 .* cast the tensor"):
        Tensor(np.array([1, 2], np.uint8)).masked_fill(Tensor([True, False]), 300)


# ---------------------------------------------------------------------------------------------------------------------
# bug hunt 1: setitem values, reshapes of unrealized tensors, index_select, scatter_add, count_nonzero, ranges


@pytest.mark.parametrize(
    "dtype, value",
    [
        (np.float32, [5.0, 6.0]),
        (np.float32, np.array([5.0, 6.0])),  # (float64: NumPy casts it to the target's dtype)
        (np.float32, (5.5, -1.0)),
        (np.int32, [5, 6]),
        (np.int32, np.array([5.9, -6.9])),  # floats truncate, as NumPy's cast
        (np.uint8, [[7, 8]]),  # broadcast over the rows
        (np.uint8, np.int64(9)),
        (np.bool_, [1, 0]),
    ],
    ids=range(8),
)
def test_setitem_takes_lists_and_numpy_values_as_numpy_does(dtype, value):
    """(a list value failed with "'<=' not supported between 'float' and 'list'", an array with "the truth value of
    an array is ambiguous")"""
    array = np.arange(6).reshape(3, 2).astype(dtype)
    tensor, expected = Tensor(array.copy()), array.copy()
    tensor[1:, :] = value
    expected[1:, :] = value
    assert_tensor(tensor, expected, dtype=dtypes.from_numpy(np.dtype(dtype)))


def test_setitem_value_errors_name_the_op_and_the_fix():
    small = Tensor(np.array([1, 2, 3], np.uint8))
    with pytest.raises(OverflowError, match=r"^setitem: 300 does not fit in dtypes.uint8 .* cast the tensor"):
        small[0:2] = [300, 1]
    with pytest.raises(OverflowError, match=r"^setitem: 300 does not fit in dtypes.uint8"):
        small[0:2] = np.array([300, 1])
    with pytest.raises(ValueError, match=r"^setitem: the value must be rectangular"):
        small[0:2] = [[1], [1, 2]]
    with pytest.raises(TypeError, match=r"^setitem: the value must hold numbers .* got list of <U1"):
        small[0:2] = ["a", "b"]
    with pytest.raises(ValueError, match=r"^setitem: value \(3,\) does not broadcast to the selected shape \(2,\)"):
        small[0:2] = [1, 2, 3]
    assert small.tolist() == [1, 2, 3]


def test_setitem_writes_through_a_reshape_of_an_unrealized_tensor():
    """(it raised "this (12,) tensor is a view (a slice, transpose, flip or pad)" unless `a` was realized first)"""
    a = Tensor.zeros(3, 4).contiguous()
    a.reshape(12)[5] = 1.0
    a.reshape(2, 6).reshape(4, 3)[0] = 7.0
    reference = torch.zeros(3, 4)
    reference.reshape(12)[5] = 1.0
    reference.reshape(2, 6).reshape(4, 3)[0] = 7.0
    assert_tensor(a, reference.numpy())
    # a computation, and a reshape nothing else holds
    base = Tensor(A.copy()).realize()
    doubled = base * 2
    doubled.reshape(60)[[0, 59]] = Tensor([-1.0, -2.0])
    expected = A * 2
    expected.reshape(60)[[0, 59]] = [-1.0, -2.0]
    assert_tensor(doubled, expected)
    assert_tensor(base, A)
    alone = (base + 1).reshape(60)
    alone[3] = 0.0
    assert alone.numpy()[3] == 0.0 and alone.numpy()[4] == A.reshape(60)[4] + 1


def test_setitem_through_a_reshape_of_a_shared_computation_is_an_error():
    # equal computations are one node until computed: writing through would change both
    base = Tensor(A.copy()).realize()
    first, second = base + 1, base + 1
    with pytest.raises(RuntimeError, match=r"setitem: this \(60,\) tensor is a reshape of a \(3, 4, 5\) computation.*"):
        first.reshape(60)[0] = 9.0
    assert_tensor(first, A + 1)
    assert_tensor(second, A + 1)
    # a reshape of a slice is written through to the tensor sliced
    base[1:].reshape(40)[0] = 1.0
    expected = A.copy()
    expected[1, 0, 0] = 1.0
    assert_tensor(base, expected)


def test_index_select_errors_name_it_and_refuse_negative_indices_as_torch():
    """(they said getitem, and [-1] picked the last element where torch raises)"""
    x = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError):
        torch.tensor([1.0, 2.0, 3.0]).index_select(0, torch.tensor([-1]))
    with pytest.raises(IndexError, match=r"^index_select: index -1 is out of range .* add the size \(-1 \+ 3\)"):
        x.index_select(0, Tensor([-1]))
    with pytest.raises(
        IndexError, match=r"^index_select: index 4 is out of range for axis 0 of size 3 \(allowed: 0..2\)$"
    ):
        x.index_select(0, Tensor([0, 4]))
    assert_tensor(x.index_select(0, Tensor([2, 0])), np.array([3.0, 1.0], np.float32))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add_against_torch(dim):
    x = data(3, 4, 5)
    index = np.random.default_rng(dim + 2).integers(0, x.shape[dim], size=(2, 3, 4))  # with repeats: they add up
    src = data(2, 3, 4, seed=3)
    expected = torch.tensor(x).scatter_add(dim, torch.tensor(index), torch.tensor(src)).numpy()
    assert_tensor(Tensor(x).scatter_add(dim, Tensor(index), Tensor(src)), expected)
    grad_check(
        lambda t, s: t.scatter_add(dim, Tensor(index), s),
        x,
        src,
        torch_function=lambda t, s: t.scatter_add(dim, torch.tensor(index), s),
    )
    ints = (x * 10).astype(np.int32)
    expected = torch.tensor(ints).scatter_add(dim, torch.tensor(index), torch.tensor(ints[:2, :3, :4])).numpy()
    assert_tensor(Tensor(ints).scatter_add(dim, Tensor(index), Tensor(ints[:2, :3, :4])), expected)


def test_scatter_add_errors_name_it():
    x, index = Tensor(A), Tensor(np.zeros((1, 4, 5), np.int64))
    with pytest.raises(TypeError, match="^scatter_add: src must be a Tensor, got float"):
        x.scatter_add(0, index, 1.0)
    with pytest.raises(IndexError, match="^scatter_add: index 3 is out of range for axis 0"):
        x.scatter_add(0, index + 3, Tensor(A))
    with pytest.raises(IndexError, match="^scatter: index 3 is out of range"):
        x.scatter(0, index + 3, Tensor(A), reduce="add")


@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 1)])
def test_count_nonzero_against_torch(dim):
    x = np.array([[0.0, 1.5, 0.0, -0.0], [np.nan, 0.0, np.inf, 2.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    expected = torch.tensor(x).count_nonzero(dim)
    got = Tensor(x).count_nonzero(dim)
    assert got.dtype == dtypes.int64 and expected.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    flags = data(3, 4, dtype=np.bool_)
    np.testing.assert_array_equal(
        Tensor(flags).count_nonzero(dim=dim).numpy(), torch.tensor(flags).count_nonzero(dim).numpy()
    )
    with pytest.raises(IndexError, match="^count_nonzero: axis 2 is out of range"):
        Tensor(x).count_nonzero(2)


def test_range_indices_are_lists_as_in_numpy():
    """(x[range(2)] was "unsupported index")"""
    for index in (range(2), range(2, -1, -2), (range(2), slice(1, 3)), (Ellipsis, range(4, 0, -1)), range(0)):
        assert_tensor(Tensor(A)[index], A[index])
    tensor, expected = Tensor(A.copy()), A.copy()
    tensor[range(1, 3)] = 0.0
    expected[range(1, 3)] = 0.0
    assert_tensor(tensor, expected)
    with pytest.raises(IndexError, match="^getitem: index 3 is out of range for axis 0 of size 3"):
        Tensor(A)[range(4)]
