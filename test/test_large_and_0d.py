"""Indices past int32's range (argmax/argmin, advanced indexing) and the axis ops on 0-d tensors, against torch.

The small tests check the index dtype chosen for an axis longer than 2**31 from the lazy graph, allocating nothing.
The argmax tests past 2**31 run on lazy tensors (no buffer; ~2 s on LLVM). The indexing one over 2**31 elements
holds a 2 GB buffer and takes several seconds, so it runs only with LAZYGRAD_BIG_TESTS=1."""

import os

import numpy as np
import pytest
import torch

from lazygrad import Device, Tensor, dtypes
from lazygrad.uop.ops import Ops

BIG = 2**31 + 16  # an axis whose last indices do not fit int32
FAR = 2**31 + 3
# (the interpreting PYTHON device would take hours over 2**31 elements)
needs_fast_device = pytest.mark.skipif(Device.DEFAULT == "PYTHON", reason="2**31 elements on the PYTHON device")
big_tests = pytest.mark.skipif(
    not os.environ.get("LAZYGRAD_BIG_TESTS"), reason="2 GB and several seconds: set LAZYGRAD_BIG_TESTS=1"
)


@needs_fast_device
@big_tests
def test_the_mean_of_2_to_the_30_ones_is_one():
    """A sum no part count divides is padded and split: in one block of float32 accumulators each stopped at 2**24
    (the mean of 2**31 ones was 0.5). The parts' float32 sum rounds at the end only: within a few ulps."""
    ones = Tensor(np.ones(2**30 + 100, np.uint8))
    np.testing.assert_allclose(ones.mean().item(), 1.0, rtol=1e-6)


def compared_dtypes(tensor: Tensor) -> set:
    """The dtypes compared in the graph behind `tensor` (the one-hot index comparison of getitem)."""
    return {u.src[0].dtype for u in tensor.uop.toposort if u.op in (Ops.CMPNE, Ops.CMPLT)}


# ---- the index dtype, from the graph only --------------------------------------------------------------------------


def test_argmax_index_dtype_widens_past_int32():
    big = Tensor.zeros(BIG, dtype=dtypes.uint8)
    assert big._argmax_along(0, False, "argmax").dtype == dtypes.int64
    assert big.reshape(1, BIG)._argmax_along(1, False, "argmax").dtype == dtypes.int64
    # a short axis keeps int32 inside the kernel (kernels and speed unchanged); the result is int64 as in torch
    small = Tensor.zeros(2**31, dtype=dtypes.uint8)  # (indices up to 2**31 - 1 still fit)
    assert small._argmax_along(0, False, "argmax").dtype == dtypes.int32
    assert big.argmax().dtype == big.argmin().dtype == Tensor([1, 2]).argmax().dtype == dtypes.int64


def test_getitem_index_dtype_widens_past_int32():
    big = Tensor.zeros(BIG, dtype=dtypes.uint8)
    for index in (Tensor([1, FAR]), [1, FAR], np.array([1, FAR])):
        assert dtypes.int64 in compared_dtypes(big[index])
    assert dtypes.int64 in compared_dtypes(big.take(Tensor([FAR])))
    assert dtypes.int64 in compared_dtypes(big.index_select(0, Tensor([FAR])))
    # a short axis compares in int32, even for an int64 index
    small = Tensor.zeros(100, dtype=dtypes.uint8)
    assert compared_dtypes(small[Tensor(np.array([1, 3], np.int64))]) == {dtypes.int32}
    assert compared_dtypes(small[[1, -3]]) == {dtypes.int32}


def test_small_results_unchanged():
    x = np.array([[3, 9, 9, 1], [7, 2, 7, 0]], np.float32)
    np.testing.assert_equal(Tensor(x).argmax(1).numpy(), [1, 0])
    np.testing.assert_equal(Tensor(x).argmin().numpy(), 7)
    np.testing.assert_equal(Tensor(x)[Tensor([1, -2]), [0, 3]].numpy(), [7, 1])
    np.testing.assert_equal(Tensor(x).index_select(1, Tensor([3, 1])).numpy(), x[:, [3, 1]])


# ---- past 2**31 elements -------------------------------------------------------------------------------------------


@needs_fast_device
def test_argmax_argmin_past_int32_lazy():
    """On a lazy (never stored) tensor: one kernel, no 2 GB buffer."""
    hit = Tensor.arange(BIG) == FAR
    assert hit.argmax().item() == FAR
    assert (Tensor.arange(BIG) != FAR).argmin().item() == FAR
    assert (Tensor.arange(BIG).reshape(1, BIG) == FAR).argmax(1).numpy().tolist() == [FAR]


@needs_fast_device
@big_tests
def test_indexing_past_int32():
    values = (Tensor.arange(BIG) % 251).cast(dtypes.uint8)
    index = [5, 2**31 - 1, FAR, BIG - 1, -1]
    expected = [i % BIG % 251 for i in index]
    assert values[index].numpy().tolist() == expected
    assert values[Tensor(np.array(index, np.int64))].numpy().tolist() == expected
    assert values.take(Tensor(np.array(index, np.int64))).numpy().tolist() == expected
    assert values.index_select(0, Tensor(np.array(index[:4], np.int64))).numpy().tolist() == expected[:4]


# ---- 0-d tensors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    [
        lambda x, T: x.transpose(0, -1),
        lambda x, T: x.transpose(-1, -1),
        lambda x, T: x.swapaxes(0, 0),
        lambda x, T: x.swapdims(-1, 0),
        lambda x, T: x.movedim(0, 0),
        lambda x, T: x.movedim(-1, 0),
        lambda x, T: x.movedim((0,), (-1,)),
        lambda x, T: x.movedim((), ()),
        lambda x, T: x.moveaxis(0, -1),
        lambda x, T: x.unfold(0, 1, 1),
        lambda x, T: x.unfold(-1, 1, 5),
        lambda x, T: x.index_select(0, T.tensor(0) if T is torch else T(0)),
        lambda x, T: x.index_select(-1, T.tensor([0]) if T is torch else T([0])),
        lambda x, T: x.take_along_dim(T.tensor(0) if T is torch else T(0)),
        lambda x, T: T.einsum(",->", x, x),
        lambda x, T: T.einsum(",", x, x),
        lambda x, T: T.einsum("->", x),
        lambda x, T: T.einsum("...,...->", x, x),
        lambda x, T: T.einsum("i,->i", x + T.ones(3), x),
    ],
)
def test_0d_like_torch(op):
    got, want = op(Tensor(3.5), Tensor), op(torch.tensor(3.5), torch)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.numpy())


def test_0d_gradients():
    x = Tensor(3.0, requires_grad=True)
    (x.transpose(0, -1) * x.movedim(0, 0) + Tensor.einsum(",->", x, x) + x.unfold(0, 1, 1).sum()).backward()
    assert x.grad.item() == 2 * 3.0 + 2 * 3.0 + 1


@pytest.mark.parametrize(
    "op, error",
    [
        (lambda x: x.transpose(0, 1), IndexError),
        (lambda x: x.movedim(0, 1), IndexError),
        (lambda x: x.unfold(0, 2, 1), ValueError),
        (lambda x: x.unfold(1, 1, 1), IndexError),
        (lambda x: x.index_select(0, Tensor([0, 0])), ValueError),
        (lambda x: x.index_select(0, Tensor([1])), IndexError),
        (lambda x: x.split(1), IndexError),
        (lambda x: x.chunk(1), IndexError),
        (lambda x: x.unbind(0), IndexError),
        (lambda x: x.narrow(0, 0, 1), IndexError),
        (lambda x: x.roll(1, 0), IndexError),
        (lambda x: x.repeat_interleave(2, 0), IndexError),
    ],
)
def test_0d_errors_are_clear(op, error):
    """What torch refuses on a 0-d tensor is an error naming the op, not one from inside the library."""
    with pytest.raises(error) as caught:
        op(Tensor(3.5))
    assert str(caught.value).split(":")[0] in {
        "transpose",
        "movedim",
        "unfold",
        "index_select",
        "split",
        "chunk",
        "unbind",
        "narrow",
        "roll",
        "repeat_interleave",
    }


def test_0d_whole_tensor_forms_still_work():
    x = Tensor(3.5)
    assert x.roll(1).item() == 3.5  # (no dims: over the flattened tensor)
    assert x.repeat_interleave(2).numpy().tolist() == [3.5, 3.5]
