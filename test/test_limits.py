"""Limits: kernels with more inputs than one call can pass, Python numbers that do not fit a tensor's dtype, class
labels out of range and integer tensors asked for gradients. Every case either computes what NumPy or PyTorch
computes or raises an error that names the op, the value and the fix."""

import functools
import re

import numpy as np
import pytest
from support import available

from lazygrad import Device, Tensor, dtypes
from lazygrad.engine import kernel_work
from lazygrad.engine import schedule as scheduler

DEVICES = ["LLVM", "CPU", "GPU", "CUDA", "PYTHON"]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """A device's name, or a skip saying why it cannot run here."""
    return available(request.param)


# ---- kernels with many inputs -------------------------------------------------------------------------------------


def test_a_kernel_reads_more_buffers_than_a_call_can_pass(device, monkeypatch):
    # ctypes calls take at most 1024 arguments: host kernels take one array of addresses instead. (A sum of 1030
    # tensors is a chain long enough to be cut into several kernels: here it stays one, to read them all.)
    monkeypatch.setattr(kernel_work, "KERNEL_WORK_LIMIT", 1 << 20)
    monkeypatch.setattr(scheduler, "_plans", {})
    arrays = [np.arange(3, dtype=np.float32) * (number % 7) + number for number in range(1030)]
    total = functools.reduce(lambda x, y: x + y, [Tensor(array, device=device) for array in arrays])
    kernels = total.schedule()
    limit = Device[device].max_buffers
    if limit is None or limit > 1031:
        assert [len(kernel.buffers) for kernel in kernels] == [1031]
    else:  # the device limits a kernel's parameters (OpenCL's CL_DEVICE_MAX_PARAMETER_SIZE): kernels stay within it
        assert len(kernels) > 1 and max(len(kernel.buffers) for kernel in kernels) <= limit
    np.testing.assert_allclose(total.numpy(), np.sum(arrays, axis=0), rtol=1e-6)


@pytest.fixture
def limit_of_eight(monkeypatch):
    """The default device taking at most 8 buffers per kernel, with the schedules planned so far forgotten."""
    monkeypatch.setattr(Device[Device.DEFAULT], "max_buffers", 8)
    monkeypatch.setattr(scheduler, "_plans", {})


def test_the_scheduler_keeps_kernels_within_the_device_limit(limit_of_eight):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(16)]
    tensors = [Tensor(array) for array in arrays]
    added = functools.reduce(lambda x, y: x + y, tensors)
    # a reduce over a wide sum, a select of three wide operands, and a result read by two kernels
    reduced = (added * tensors[0]).sum(axis=1)
    chosen = (tensors[1] > 0).where(added, functools.reduce(lambda x, y: x * 0.5 + y, tensors[::-1]))
    kernels = Tensor.schedule(reduced, chosen)
    assert max(len(kernel.buffers) for kernel in kernels) <= 8
    total = np.sum(arrays, axis=0, dtype=np.float32)
    halved = functools.reduce(lambda x, y: x * np.float32(0.5) + y, arrays[::-1])
    np.testing.assert_allclose(reduced.numpy(), (total * arrays[0]).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chosen.numpy(), np.where(arrays[1] > 0, total, halved), rtol=1e-5, atol=1e-5)


def test_gradients_through_a_split_kernel(limit_of_eight):
    arrays = [np.full(3, number + 1, np.float32) for number in range(12)]
    tensors = [Tensor(array, requires_grad=True) for array in arrays]
    product = functools.reduce(lambda x, y: x * y, [t / (i + 1) for i, t in enumerate(tensors)])
    (product.sum() + functools.reduce(lambda x, y: x + y, tensors).sum()).backward()
    # every factor is 1, so d(product)/d(t_i) = 1/t_i = 1/(i+1), and the plain sum adds 1
    for number, tensor in enumerate(tensors):
        np.testing.assert_allclose(tensor.grad.numpy(), np.full(3, 1 + 1 / (number + 1), np.float32), rtol=1e-5)


# ---- Python numbers that do not fit the tensor's dtype ------------------------------------------------------------

BIG = 2**40
INT32 = "dtypes.int32 (which holds -2147483648..2147483647)"

# name: (lazy op, the same op in NumPy)
SCALAR_OPS = {
    "add": (lambda x, s: x + s, lambda a, s: a + s),
    "radd": (lambda x, s: s + x, lambda a, s: s + a),
    "sub": (lambda x, s: x - s, lambda a, s: a - s),
    "rsub": (lambda x, s: s - x, lambda a, s: s - a),
    "mul": (lambda x, s: x * s, lambda a, s: a * s),
    "floordiv": (lambda x, s: x // s, lambda a, s: a // s),
    "rfloordiv": (lambda x, s: s // x, lambda a, s: s // a),
    "mod": (lambda x, s: x % s, lambda a, s: a % s),
    "lt": (lambda x, s: x < s, lambda a, s: a < s),
    "gt": (lambda x, s: x > s, lambda a, s: a > s),
    "le": (lambda x, s: x <= s, lambda a, s: a <= s),
    "ge": (lambda x, s: x >= s, lambda a, s: a >= s),
    "eq": (lambda x, s: x == s, lambda a, s: a == s),
    "ne": (lambda x, s: x != s, lambda a, s: a != s),
    "maximum": (lambda x, s: x.maximum(s), lambda a, s: np.maximum(a, s)),
    "minimum": (lambda x, s: x.minimum(s), lambda a, s: np.minimum(a, s)),
    "where": (lambda x, s: (x > 0).where(s, x), lambda a, s: np.where(a > 0, s, a)),
    "where_other": (lambda x, s: (x > 0).where(x, s), lambda a, s: np.where(a > 0, a, s)),
    "clip_max": (lambda x, s: x.clip(-5, s), lambda a, s: np.clip(a, -5, s)),
    "clip_min": (lambda x, s: x.clip(s, None), lambda a, s: np.maximum(a, s)),
    "and": (lambda x, s: x & s, lambda a, s: a & s),
    "or": (lambda x, s: x | s, lambda a, s: a | s),
    "xor": (lambda x, s: x ^ s, lambda a, s: a ^ s),
}


@pytest.mark.parametrize("op", SCALAR_OPS)
@pytest.mark.parametrize("scalar", [BIG, -BIG, 2**31, -(2**31) - 1, 2**63 - 1])
def test_an_int_beyond_int32_widens_the_op_to_int64(op, scalar):
    lazy, reference = SCALAR_OPS[op]
    values = [3, -7, 11] if op == "rfloordiv" else [0, 3, -7, 11]  # (no division by zero)
    if scalar == 2**63 - 1 and op in ("add", "radd", "sub", "rsub", "mul"):
        values = [0]  # results beyond int64 would wrap around in any library
    result = lazy(Tensor(values), scalar)
    # the reference computes with Python ints, so a wrong (wrapped) result cannot match it
    expected = np.array(reference(np.array(values, dtype=object), scalar).tolist())
    assert result.dtype == (dtypes.bool if expected.dtype == np.bool_ else dtypes.int64)
    np.testing.assert_array_equal(result.numpy(), expected)


def test_an_int_that_fits_keeps_the_tensor_dtype():
    assert (Tensor([1, 2]) + (2**31 - 1)).dtype == dtypes.int32
    assert (Tensor([1, 2], dtype=dtypes.uint32) + (2**32 - 1)).dtype == dtypes.uint32
    assert (Tensor([True]) + 2).dtype == dtypes.int32
    assert (Tensor([1.0]) + BIG).dtype == dtypes.float32


def test_comparisons_with_ints_beyond_the_dtype_are_exact():
    assert (Tensor([1]) < BIG).tolist() == [True]
    assert (Tensor([1]) > -BIG).tolist() == [True]
    assert (Tensor([2**31 - 1]) == 2**31 - 1 + 2**32).tolist() == [False]  # equal only after wrapping around
    assert (Tensor([5], dtype=dtypes.uint32) > -1).tolist() == [True]


def test_unsigned_tensors_with_negative_ints():
    unsigned = Tensor([0, 5, 2**32 - 1], dtype=dtypes.uint32)
    np.testing.assert_array_equal((unsigned + (-1)).numpy(), np.array([-1, 4, 2**32 - 2], np.int64))
    # ~ flips the bits of the dtype itself, and stays unsigned
    inverted = ~unsigned
    assert inverted.dtype == dtypes.uint32
    np.testing.assert_array_equal(inverted.numpy(), ~np.array([0, 5, 2**32 - 1], np.uint32))


def test_bool_tensors_with_big_ints():
    np.testing.assert_array_equal((Tensor([True, False]) * BIG).numpy(), np.array([BIG, 0], np.int64))
    np.testing.assert_array_equal(Tensor([True, False]).where(BIG, -1).numpy(), np.array([BIG, -1], np.int64))


def test_an_int_beyond_int64_is_an_error():
    with pytest.raises(OverflowError) as error:
        Tensor([1, 2]) + 2**64
    assert str(error.value) == (
        "add: 18446744073709551616 does not fit in dtypes.int32, nor in int64, the widest integer; compute in floats: "
        "cast the tensor with .float() or pass the number as 1.8446744073709552e+19"
    )
    with pytest.raises(OverflowError, match=r"^<: -18446744073709551616 does not fit in dtypes.int64, nor in int64"):
        Tensor([1], dtype=dtypes.int64) < -(2**64)
    with pytest.raises(OverflowError, match=r"^where: 36893488147419103232 does not fit in dtypes.int64"):
        Tensor([True]).where(2**65, 0)


def test_floats_too_large_for_the_dtype_become_inf_as_in_torch(torch):
    half = Tensor([1.0, -2.0], dtype=dtypes.float16)
    expected = torch.tensor([1.0, -2.0], dtype=torch.float16) * 1e6
    np.testing.assert_array_equal((half * 1e6).numpy(), expected.numpy())
    np.testing.assert_array_equal((half + 70000).numpy(), (torch.tensor([1.0, -2.0], dtype=torch.float16) + 70000))
    np.testing.assert_array_equal((Tensor([1, 2]) * 1e300).numpy(), (torch.tensor([1, 2]) * 1e300).numpy())
    assert (Tensor([1, 2]) * 1e300).dtype == dtypes.float32


def test_data_takes_int64_where_int32_cannot_hold_it():
    assert Tensor([1, -2]).dtype == dtypes.int32
    for data in ([1, BIG], np.array([1, -BIG]), BIG, [[2**63 - 1], [-(2**63)]]):
        tensor = Tensor(data)
        assert tensor.dtype == dtypes.int64
        np.testing.assert_array_equal(tensor.numpy(), np.array(data, dtype=np.int64))


@pytest.mark.parametrize(
    "data,dtype,message",
    [
        ([2**64], None, "Tensor: 18446744073709551616 does not fit in dtypes.int64"),
        ([1, -(2**70)], None, "Tensor: -1180591620717411303424 does not fit in dtypes.int64"),
        ([BIG], dtypes.int32, f"Tensor: 1099511627776 does not fit in {INT32}; use dtype=dtypes.int64 or a float"),
        ([1.5, 3e9], dtypes.int32, f"Tensor: 3000000000.0 does not fit in {INT32}"),
        ([float("nan")], dtypes.int32, f"Tensor: nan does not fit in {INT32}"),
        ([float("-inf")], dtypes.int64, "Tensor: -inf does not fit in dtypes.int64"),
        ([3, -1], dtypes.uint32, "Tensor: -1 does not fit in dtypes.uint32 (which holds 0..4294967295)"),
    ],
)
def test_data_that_does_not_fit_the_dtype_is_an_error(data, dtype, message):
    with pytest.raises(OverflowError) as error:
        Tensor(data, dtype=dtype)
    assert str(error.value).startswith(message)


def test_float_data_too_large_becomes_inf_without_warnings(recwarn):
    np.testing.assert_array_equal(Tensor([1e300, -1e300]).numpy(), np.array([np.inf, -np.inf], np.float32))
    np.testing.assert_array_equal(Tensor([1e6], dtype=dtypes.float16).numpy(), np.array([np.inf], np.float16))
    assert not recwarn.list


def test_full_with_big_values():
    filled = Tensor.full((2, 2), BIG)
    assert filled.dtype == dtypes.int64
    np.testing.assert_array_equal(filled.numpy(), np.full((2, 2), BIG))
    np.testing.assert_array_equal(Tensor.full((2,), 1e6, dtype=dtypes.float16).numpy(), np.full(2, np.inf, np.float16))
    with pytest.raises(OverflowError, match=re.escape(f"full: 1099511627776 does not fit in {INT32}")):
        Tensor.full((2,), BIG, dtype=dtypes.int32)


def test_pad_with_a_big_value():
    padded = Tensor([1, 2]).pad(((1, 1),), value=BIG)
    np.testing.assert_array_equal(padded.numpy(), np.array([BIG, 1, 2, BIG]))


@pytest.mark.parametrize(
    "arguments,dtype",
    [
        ((2**31 + 5, 2**31 + 8), dtypes.int64),
        ((0, 2**40, 2**38), dtypes.int64),
        ((10, -(2**33), -(2**32)), dtypes.int64),
        ((-(2**31), 2**31, 2**30), dtypes.int32),  # every value fits int32
    ],
)
def test_arange_beyond_int32(torch, arguments, dtype):
    result = Tensor.arange(*arguments)
    assert result.dtype == dtype
    np.testing.assert_array_equal(result.numpy(), torch.arange(*arguments).numpy())


def test_arange_with_more_elements_than_int32_counts():
    # the counter is the loop index: past 2**31 it must not wrap around (only the last elements are computed)
    ints = Tensor.arange(3_000_000_000)
    assert ints.dtype == dtypes.int64 and ints.shape == (3_000_000_000,)
    np.testing.assert_array_equal(ints[2**31 - 2 : 2**31 + 2].numpy(), np.arange(2**31 - 2, 2**31 + 2))
    np.testing.assert_array_equal(ints[-2:].numpy(), [2_999_999_998, 2_999_999_999])
    floats = Tensor.arange(3e9)
    assert floats.dtype == dtypes.float32
    np.testing.assert_array_equal(floats[-3:].numpy(), np.arange(3e9 - 3, 3e9, dtype=np.float64).astype(np.float32))


def test_arange_and_linspace_values_that_do_not_fit_are_errors():
    with pytest.raises(OverflowError, match=re.escape(f"arange: 824633720832 does not fit in {INT32}")):
        Tensor.arange(0, 2**40, 2**38, dtype=dtypes.int32)
    with pytest.raises(OverflowError, match=r"^arange: 18446744073709551615 does not fit in dtypes.int64"):
        Tensor.arange(2**64)
    with pytest.raises(OverflowError, match=re.escape(f"linspace: 1099511627776 does not fit in {INT32}")):
        Tensor.linspace(0, BIG, 3, dtype=dtypes.int32)
    np.testing.assert_allclose(Tensor.linspace(0, BIG, 3).numpy(), np.linspace(0, BIG, 3, dtype=np.float32))


def test_a_device_without_int64_or_float64_says_so(monkeypatch):
    device = Device[Device.DEFAULT]
    monkeypatch.setattr(device, "unsupported_dtypes", {dtypes.int64: "no 64-bit ints", dtypes.float64: "no doubles"})
    with pytest.raises(TypeError) as error:
        Tensor([1, 2]) + BIG
    assert str(error.value) == (
        f"add: {Device.DEFAULT} cannot compute in dtypes.int64 (no 64-bit ints); cast to a narrower dtype or use "
        "another device"
    )
    with pytest.raises(TypeError, match=rf"^Tensor: {Device.DEFAULT} cannot compute in dtypes.float64 \(no doubles\)"):
        Tensor([1.5], dtype=dtypes.float64)
    with pytest.raises(TypeError) as error:
        Tensor(np.array([1.5]))
    assert str(error.value) == (
        f"Tensor: a dtypes.float64 NumPy array cannot live on {Device.DEFAULT} (no doubles); convert it first "
        "(array.astype(np.float32)) or pass dtype=dtypes.float32"
    )
    assert Tensor(np.array([1.5]), dtype=dtypes.float32).tolist() == [1.5]
    with pytest.raises(TypeError, match=rf"^cast: {Device.DEFAULT} cannot compute in dtypes.int64"):
        Tensor([1]).cast(dtypes.int64)
    assert (Tensor([1, 2]) + 5).tolist() == [6, 7]  # what fits needs no int64


# ---- gradients of integer tensors ---------------------------------------------------------------------------------

GRADIENT_MESSAGE = (
    "requires_grad=True needs a float tensor, but this one is {}: only floats have gradients; make it with a float "
    "dtype (dtype=dtypes.float32) or .float() it first"
)


@pytest.mark.parametrize(
    "make,dtype",
    [
        (lambda: Tensor([1, 2], requires_grad=True), dtypes.int32),
        (lambda: Tensor([True], requires_grad=True), dtypes.bool),
        (lambda: Tensor(np.array([1, 2], np.uint32), requires_grad=True), dtypes.uint32),
        (lambda: Tensor.zeros(2, dtype=dtypes.int32, requires_grad=True), dtypes.int32),
        (lambda: Tensor.ones(2, dtype=dtypes.bool, requires_grad=True), dtypes.bool),
        (lambda: Tensor.full((2,), 3, requires_grad=True), dtypes.int32),
        (lambda: Tensor.full((2,), BIG, requires_grad=True), dtypes.int64),
        (lambda: Tensor.arange(3, requires_grad=True), dtypes.int32),
        (lambda: Tensor([1.5]).zeros_like(dtype=dtypes.int32, requires_grad=True), dtypes.int32),
    ],
)
def test_requires_grad_on_an_integer_tensor_is_an_error(make, dtype):
    with pytest.raises(TypeError) as error:
        make()
    assert str(error.value) == GRADIENT_MESSAGE.format(dtype)


def test_setting_requires_grad_on_an_integer_tensor_is_an_error():
    tensor = Tensor([1, 2])
    with pytest.raises(TypeError) as error:
        tensor.requires_grad = True
    assert str(error.value) == GRADIENT_MESSAGE.format(dtypes.int32)
    assert tensor.requires_grad is None  # unchanged
    tensor.requires_grad = False
    assert tensor.requires_grad is False


def test_float_tensors_still_take_gradients():
    weight = Tensor([1.0, 2.0], requires_grad=True)
    other = Tensor([3.0, 4.0])
    other.requires_grad = True
    (weight * other).sum().backward()
    np.testing.assert_array_equal(weight.grad.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(other.grad.numpy(), [1.0, 2.0])


# ---- class labels -------------------------------------------------------------------------------------------------


def test_one_hot_matches_torch(torch):
    labels = np.array([[0, 3], [4, 1]])
    expected = torch.nn.functional.one_hot(torch.tensor(labels), 5).numpy()
    np.testing.assert_array_equal(Tensor(labels).one_hot(5).numpy(), expected)


@pytest.mark.parametrize(
    "labels,message",
    [
        (
            [0, 3],
            "one_hot: label 3 at index (1,) is not a class of 3 (allowed: 0..2); fix the labels or pass a larger num_classes",
        ),
        (
            [[0, 1], [-1, 2]],
            "one_hot: label -1 at index (1, 0) is not a class of 3 (allowed: 0..2); fix the labels or pass a larger num_classes",
        ),
    ],
)
def test_one_hot_labels_out_of_range(labels, message):
    with pytest.raises(ValueError) as error:
        Tensor(labels).one_hot(3)
    assert str(error.value) == message


def test_labels_computed_lazily_are_checked_too():
    with pytest.raises(ValueError, match=r"^one_hot: label 3 at index \(1,\) is not a class of 3"):
        (Tensor([1, 2]) + 1).one_hot(3)


LOSS_FIX = "fix the labels (the logits' class axis has 3 classes)"


@pytest.mark.parametrize(
    "labels,ignore_index,message",
    [
        ([0, 3], -1, f"label 3 at index (1,) is not a class of 3 (allowed: 0..2 or ignore_index=-1); {LOSS_FIX}"),
        ([-2, 0], -1, f"label -2 at index (0,) is not a class of 3 (allowed: 0..2 or ignore_index=-1); {LOSS_FIX}"),
        ([-1, 0], 5, f"label -1 at index (0,) is not a class of 3 (allowed: 0..2 or ignore_index=5); {LOSS_FIX}"),
    ],
)
def test_sparse_categorical_crossentropy_labels_out_of_range(labels, ignore_index, message):
    logits = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError) as error:
        logits.sparse_categorical_crossentropy(Tensor(labels), ignore_index=ignore_index)
    assert str(error.value) == f"sparse_categorical_crossentropy: {message}"


def test_cross_entropy_labels_out_of_range():
    logits = Tensor(np.zeros((2, 3, 4), np.float32))  # classes on axis 1, as in torch
    with pytest.raises(ValueError) as error:
        logits.cross_entropy(Tensor([[0, 1, 2, -100], [0, 3, 0, 0]]))
    assert str(error.value) == (
        f"cross_entropy: label 3 at index (1, 1) is not a class of 3 (allowed: 0..2 or ignore_index=-100); {LOSS_FIX}"
    )


@pytest.mark.parametrize("labels,ignore_index", [([0, 5, 2], 5), ([0, -7, 2], -7), ([1, -1, 2], -1)])
def test_an_ignored_label_may_be_out_of_range_as_in_torch(torch, labels, ignore_index):
    logits = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    loss = Tensor(logits).sparse_categorical_crossentropy(Tensor(labels), ignore_index=ignore_index)
    expected = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels), ignore_index=ignore_index)
    np.testing.assert_allclose(loss.numpy(), expected.numpy(), rtol=1e-6)


def test_a_jitted_step_checks_each_calls_labels():
    from lazygrad import TinyJit

    @TinyJit
    def loss_of(logits: Tensor, labels: Tensor) -> Tensor:
        return logits.sparse_categorical_crossentropy(labels).realize()

    logits = Tensor(np.zeros((2, 3), np.float32)).realize()
    for _ in range(3):  # run, capture, replay
        np.testing.assert_allclose(loss_of(logits, Tensor([0, 2]).realize()).numpy(), np.log(3), rtol=1e-6)
    with pytest.raises(ValueError, match=r"^sparse_categorical_crossentropy: label 3 at index \(1,\) is not a class"):
        loss_of(logits, Tensor([0, 3]).realize())


def test_embedding_indices_out_of_range():
    from lazygrad import nn

    embedding = nn.Embedding(4, 2)
    with pytest.raises(ValueError, match=r"^Embedding: label 4 at index \(0, 1\) is not a class of 4.*vocab_size 4"):
        embedding(Tensor([[1, 4]]))
