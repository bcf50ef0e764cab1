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
    row = grid[0]
    with pytest.raises(RuntimeError, match=r"^\+=: .*view"):
        row += 10
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
