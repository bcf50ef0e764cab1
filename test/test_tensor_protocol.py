"""Python's protocols on tensors as PyTorch users expect them: in-place operators write into the tensor, deepcopy and
pickle copy the values, and comparing with None is Python's answer. Values are checked against NumPy and PyTorch."""

import copy
import operator
import pickle

import numpy as np
import pytest

from lazygrad import Tensor, dtypes, nn
from lazygrad.nn.optim import SGD
from lazygrad.nn.state import get_parameters

torch = pytest.importorskip("torch")

IN_PLACE = [
    (operator.iadd, np.add),
    (operator.isub, np.subtract),
    (operator.imul, np.multiply),
    (operator.itruediv, np.divide),
    (operator.ifloordiv, np.floor_divide),
    (operator.imod, np.mod),
    (operator.ipow, np.power),
]


@pytest.mark.parametrize("in_place, expected", IN_PLACE, ids=lambda f: getattr(f, "__name__", ""))
def test_in_place_operators_write_into_the_tensor_every_name_sees(in_place, expected):
    a = np.array([1.5, 2.0, -3.0, 4.0], np.float32)
    b = np.array([2.0, -1.5, 0.5, 3.0], np.float32)
    x = Tensor(a).realize()
    alias = x
    result = in_place(x, Tensor(b))
    assert result is x
    with np.errstate(invalid="ignore"):  # (a negative base to a fractional power is nan, in both)
        np.testing.assert_allclose(alias.numpy(), expected(a, b), rtol=1e-6)
    y = Tensor(a)  # (not realized yet: it becomes the value)
    in_place(y, 2)
    np.testing.assert_allclose(y.numpy(), expected(a, np.float32(2)), rtol=1e-6)


def test_bitwise_and_matmul_in_place():
    x = Tensor(np.array([6, 3, 12], np.int32)).realize()
    x &= 5
    x |= 8
    x ^= 1
    x <<= 1
    x >>= 1
    np.testing.assert_array_equal(x.numpy(), ((((np.array([6, 3, 12]) & 5) | 8) ^ 1) << 1) >> 1)
    m = np.arange(4, dtype=np.float32).reshape(2, 2)
    t = Tensor(m).realize()
    t @= Tensor(m)
    np.testing.assert_allclose(t.numpy(), m @ m)


def test_scaling_a_layer_in_place_reaches_the_optimizer():
    """`layer.weight *= 0` (under no_grad) changes the tensor the optimizer holds, as in torch: rebinding the name
    left the optimizer training a tensor the model no longer used."""
    layer = nn.Linear(2, 1)
    optimizer = SGD(get_parameters(layer), lr=1.0)
    with Tensor.test():
        layer.weight *= 0
    assert np.all(optimizer.params[0].numpy() == 0)
    with Tensor.train():
        optimizer.zero_grad()
        layer(Tensor([[1.0, 1.0]])).sum().backward()
        optimizer.step()
    np.testing.assert_allclose(layer.weight.numpy(), [[-1.0, -1.0]])


def test_manual_sgd_in_place_keeps_the_leaf_trainable():
    w = Tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        w.grad = None
        (w * w).sum().backward()
        with Tensor.test():
            w -= 0.25 * w.grad
    tw = torch.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        tw.grad = None
        (tw * tw).sum().backward()
        with torch.no_grad():
            tw -= 0.25 * tw.grad
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy())


def test_in_place_errors_name_the_operator_and_the_fix():
    leaf = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^\+=: .*requires grad.*Tensor.test\(\)"):
        leaf += 1
    ints = Tensor([1, 2])
    with pytest.raises(TypeError, match=r"^\*=: the result is dtypes.float32.*int32"):
        ints *= 1.5
    small = Tensor([1.0, 2.0]).realize()
    with pytest.raises(ValueError, match=r"^\+=: the result \(3, 2\) does not fit this \(2,\) tensor"):
        small += Tensor.ones(3, 2)
    grid = Tensor([[1.0, 2.0], [3.0, 4.0]]).realize()
    wide = grid.reshape(1, 4).expand(2, 4)
    with pytest.raises(RuntimeError, match=r"^\+=: .*expanded view.*\.contiguous\(\)"):
        wide += 10
    np.testing.assert_array_equal(grid.numpy(), [[1.0, 2.0], [3.0, 4.0]])
    # a float64 result stored into float32 is cast, as torch does
    x = Tensor([1.0, 2.0]).realize()
    x += Tensor([0.5, 0.5], dtype=dtypes.float64)
    assert x.dtype == dtypes.float32
    np.testing.assert_array_equal(x.numpy(), [1.5, 2.5])


def test_in_place_on_a_computed_tensor_keeps_its_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y += 1
    y.sum().backward()
    np.testing.assert_array_equal(y.numpy(), [4.0, 7.0])
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_deepcopy_is_a_snapshot_with_memory_of_its_own():
    layer = nn.Linear(2, 1)
    for parameter in get_parameters(layer):
        parameter.realize()
    snapshot = copy.deepcopy(layer)
    before = layer.weight.numpy().copy()
    optimizer = SGD(get_parameters(layer), lr=1.0)
    with Tensor.train():
        optimizer.zero_grad()
        layer(Tensor([[1.0, 1.0]])).sum().backward()
        optimizer.step()
    np.testing.assert_array_equal(snapshot.weight.numpy(), before)
    assert not np.array_equal(layer.weight.numpy(), before)
    w = Tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    copied = copy.deepcopy(w)
    assert copied.requires_grad and copied.grad is not None
    np.testing.assert_array_equal(copied.grad.numpy(), [2.0, 4.0])
    w.assign(Tensor([5.0, 5.0])).realize()
    np.testing.assert_array_equal(copied.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16, dtypes.int8, dtypes.bool, dtypes.float16])
def test_pickle_keeps_the_values_of_the_moment(dtype):
    values = np.array([[1.5, -2.0, 0.0], [3.0, 1.0, 0.5]])
    x = Tensor(values, dtype=dtype).realize()
    pickled = pickle.dumps(x)
    expected = x.numpy().copy()
    x.assign(Tensor(np.zeros((2, 3)), dtype=dtype)).realize()
    del x
    loaded = pickle.loads(pickled)
    assert loaded.dtype == dtype and loaded.shape == (2, 3)
    np.testing.assert_array_equal(loaded.numpy(), expected)
    assert pickle.loads(pickle.dumps(Tensor([1.0], requires_grad=True))).requires_grad


def test_comparing_with_none_is_pythons_answer():
    t = Tensor([1.0, 2.0])
    assert (t == None) is False and (t != None) is True  # noqa: E711 (the comparison is the test)
    assert t not in [None, "a"] and [None, t].index(t) == 1


def test_a_0d_bfloat16_tensor_is_an_array_for_numpy():
    value = Tensor(1.5, dtype=dtypes.bfloat16)
    assert isinstance(value.numpy(), np.ndarray) and np.asarray(value) == 1.5


def test_torch_spellings_of_small_conveniences():
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    t, reference = Tensor(m), torch.tensor(m)
    np.testing.assert_array_equal(t.t().numpy(), reference.t().numpy())
    np.testing.assert_array_equal(Tensor([1.0, 2.0]).t().numpy(), [1.0, 2.0])
    with pytest.raises(ValueError, match="^t: needs at most 2 dimensions"):
        Tensor.ones(2, 2, 2).t()
    for dim in (0, 1, -1):
        for ours, theirs in zip(t.unbind(dim), reference.unbind(dim), strict=True):
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert 4.0 in t and 7.0 not in t and (4.0 in reference) and (7.0 not in reference)
    np.testing.assert_array_equal((+t).numpy(), m)
    np.testing.assert_array_equal(round(Tensor([0.5, 1.5, 2.25])).numpy(), torch.round(torch.tensor([0.5, 1.5, 2.25])))
    halves = Tensor([1, 2], dtype=dtypes.float16)
    assert halves.new_zeros(2, 3).dtype == dtypes.float16 and halves.new_zeros((2, 3)).shape == (2, 3)
    np.testing.assert_array_equal(halves.new_ones(2).numpy(), [1, 1])
    np.testing.assert_array_equal(halves.new_full((2,), 7).numpy(), [7, 7])
    assert halves.new_tensor([3, 4]).dtype == dtypes.float16 and halves.new_empty(1).shape == (1,)
    np.testing.assert_array_equal(Tensor(range(3)).numpy(), [0, 1, 2])
    np.testing.assert_array_equal(Tensor(torch.tensor([1.5, 2.5])).numpy(), [1.5, 2.5])


def test_is_leaf_as_torch():
    w = Tensor([1.0, 2.0], requires_grad=True)
    y = w * 2
    assert w.is_leaf and not y.is_leaf and Tensor([1.0]).is_leaf
    y.realize()
    assert not y.is_leaf, "a computed tensor stays no leaf once realized"


def test_a_gradient_of_another_shape_is_refused_when_set():
    w = Tensor([1.0, 2.0], requires_grad=True)
    for wrong in (Tensor([1.0]), Tensor.ones(2, 2), np.ones(2)):
        with pytest.raises(ValueError, match=r"^grad: must be None or a tensor of this tensor's shape \(2,\)"):
            w.grad = wrong
    w.grad = Tensor([0.5, 0.5])
    (w * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.5, 4.5])


# ---- a second pass: NumPy scalars as sizes, modes as decorators, per-element reads ---------------------------------


def test_numpy_scalars_and_one_element_tensors_are_sizes_and_axes_as_in_torch():
    i = np.int64(1)
    assert Tensor.arange(np.int64(4)).tolist() == torch.arange(np.int64(4)).tolist()
    assert Tensor.arange(np.int64(4)).dtype == dtypes.int32  # (the default int, as for a Python int)
    np.testing.assert_allclose(Tensor.linspace(0, 1, np.int64(3)).numpy(), [0.0, 0.5, 1.0])
    assert Tensor.arange(Tensor(5)).tolist() == [0, 1, 2, 3, 4]
    x, theirs = Tensor.ones(2, 3), torch.ones(2, 3)
    assert x.size(i) == 3 and x.size(Tensor(1)) == 3
    for ours, expected in (
        (x.reshape(np.int64(6)), theirs.reshape(np.int64(6))),
        (x.permute(i, 0), theirs.permute(1, 0)),
        (x.sum(i), theirs.sum(1)),
        (x.softmax(i), theirs.softmax(1)),
        (x.cat(x, dim=i), torch.cat([theirs, theirs], 1)),
        (x.narrow(i, 0, np.int64(2)), theirs.narrow(1, 0, 2)),
        (x.roll(np.int64(1), i), theirs.roll(1, 1)),
        (x.pad((np.int64(1), 1)), torch.nn.functional.pad(theirs, (1, 1))),
        (Tensor.eye(np.int64(2)), torch.eye(2)),
        (Tensor.zeros(np.int64(2), 3), torch.zeros(2, 3)),
    ):
        np.testing.assert_array_equal(ours.numpy(), expected.numpy())
    assert [t.shape for t in x.split(np.int64(1), i)] == [(2, 1)] * 3
    assert Tensor([1, 2]).one_hot(num_classes=np.int64(4)).shape == (2, 4)
    with pytest.raises(TypeError, match="arange: expected a number, got str"):
        Tensor.arange("5")
    with pytest.raises(TypeError, match="size: dim must be an int, got 1.5"):
        x.size(1.5)


def test_train_and_test_work_as_bare_decorators_and_reusable_contexts():
    @Tensor.test
    def doubled(x):
        return x * 2

    result = doubled(Tensor([1.0], requires_grad=True))
    assert isinstance(result, Tensor) and result.tolist() == [2.0] and not result.requires_grad

    @Tensor.train
    def training():
        return Tensor.training

    before = Tensor.training
    assert training() is True and Tensor.training == before
    context = Tensor.test()
    with context:
        with context:  # (entered again, nested in itself, as torch's no_grad())
            assert Tensor.no_grad
        assert Tensor.no_grad
    with context:
        assert Tensor.no_grad
    assert not Tensor.no_grad
    with pytest.raises(TypeError, match="Tensor.train: mode must be True or False, got 'yes'"):
        Tensor.train("yes")


def test_reading_elements_one_by_one_compiles_no_kernels():
    from lazygrad.helpers import GlobalCounters

    values = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = Tensor(values).realize()
    before = GlobalCounters.kernel_count
    assert [float(v) for v in x.reshape(-1)[:50:7]] == values.reshape(-1)[:50:7].tolist()
    np.testing.assert_array_equal(x[:, 1:3, ::2].numpy(), values[:, 1:3, ::2])
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), values.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.reshape(6, 4)[::2].T.numpy(), values.reshape(6, 4)[::2].T)
    assert x[0, 2, 3].item() == 11.0 and x[:, :0].numpy().shape == (2, 0, 4)
    assert GlobalCounters.kernel_count == before  # (read in place from host memory)
    half = Tensor(values, dtype=dtypes.bfloat16).realize()
    np.testing.assert_array_equal(half[1, :, 1:3].numpy(), values[1, :, 1:3])


def test_lists_of_typed_items_keep_their_dtype_as_in_torch():
    wide = Tensor([Tensor(1e300, dtype=dtypes.float64), Tensor(0.1, dtype=dtypes.float64)])
    assert wide.dtype == dtypes.float64 and wide.tolist() == [1e300, 0.1]
    assert Tensor([np.float64(1e300)]).tolist() == [1e300]
    assert Tensor([Tensor(1, dtype=dtypes.uint8), Tensor(2, dtype=dtypes.uint8)]).dtype == dtypes.uint8
    assert Tensor([np.float32(1), np.int64(2)]).dtype == dtypes.float32  # (torch's promotion)
    assert Tensor([1.0, 2.0]).dtype == dtypes.float32 and Tensor([Tensor(1.0), 2.0]).dtype == dtypes.float32


def test_protocol_errors_name_what_went_wrong():
    t = Tensor([1.0, 2.0])
    for value in (None, "a"):
        with pytest.raises(TypeError, match="in: a Tensor can be searched for a number or a tensor"):
            value in t  # noqa: B015
    assert 2.0 in t and f"{Tensor(1.5):.2f}" == "1.50"
    with pytest.raises(TypeError, match=r"format: only a 0-d tensor takes a format spec \('.2f'\)"):
        f"{Tensor([1.5]):.2f}"
    written = Tensor([1.0, 2.0]).contiguous().realize()
    with pytest.raises(IndexError, match="setitem: index 5 is out of range"):
        written[5] = 1.0
    assert written.tolist() == [1.0, 2.0]
    assert t.to("CPU", non_blocking=True).device == "CPU" and t.to(copy=True) is not t


def test_setitem_drops_a_values_leading_axes_of_size_one_as_torch():
    ours, theirs = Tensor.zeros(3, 4, 5).contiguous(), torch.zeros(3, 4, 5)
    value = np.arange(20, dtype=np.float32).reshape(1, 1, 4, 5)
    ours[0] = Tensor(value)
    theirs[0] = torch.tensor(value)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    with pytest.raises(ValueError, match=r"setitem: value \(2, 4, 5\) does not broadcast to the selected shape"):
        ours[0] = Tensor.zeros(2, 4, 5)


def test_numpy_arrays_are_operands_as_in_torch():
    ours, array = Tensor([1.0, 2.0]), np.array([1.0, 3.0], dtype=np.float32)
    theirs = torch.tensor([1.0, 2.0])
    for op in (operator.add, operator.mul, operator.truediv, operator.eq, operator.lt):
        np.testing.assert_array_equal(op(ours, array).numpy(), op(theirs, torch.from_numpy(array)).numpy())
        np.testing.assert_array_equal(op(array, ours).numpy(), op(torch.from_numpy(array), theirs).numpy())
    assert (ours @ array).item() == (array @ ours).item() == 7.0
    assert (ours + np.array([1.0, 1.0])).dtype == dtypes.float64  # (the array's float64, promoted as torch does)
    assert (ours == [1.0, 3.0]) is False and (ours != [1.0]) is True  # (Python's answer, as torch's)
    with pytest.raises(TypeError, match="add: unsupported operand type list"):
        ours + [1.0]
