"""The Tensor API at its edges, as torch behaves: writes into a leaf that requires grad, `x[i] += v`, tensors made from
torch tensors, and device names with an index. Values are compared with NumPy and torch."""

import re

import numpy as np
import pytest

from lazygrad import Device, Tensor, dtypes


@pytest.fixture(autouse=True)
def _modes_restored():
    """Every test starts and ends with gradients on, whatever it sets."""
    Tensor.no_grad = False
    yield
    Tensor.no_grad = False


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


# ---- writes into a leaf that requires grad --------------------------------------------------------------------------


def test_setitem_into_a_leaf_that_requires_grad_is_refused_as_torch_refuses(torch):
    """It was accepted, and a graph read from the tensor before the write then got no gradient (x.grad None)."""
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(
        RuntimeError, match=r"setitem: this \(3,\) tensor requires grad .*\(a leaf\).*Tensor\.test\(\).*x\.clone\(\)"
    ):
        x[0] = 5.0
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0, 3.0])  # (unchanged)
    theirs = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        theirs[0] = 5.0


def test_setitem_into_a_leaf_that_requires_grad_works_with_gradients_off(torch):
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    with Tensor.test():
        x[0] = 5.0
    theirs = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with torch.no_grad():
        theirs[0] = 5.0
    np.testing.assert_array_equal(x.numpy(), theirs.detach().numpy())
    (x * x).sum().backward()
    (theirs * theirs).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), theirs.grad.numpy())


def test_setitem_into_a_copy_of_a_leaf_passes_the_gradient_back_as_torch(torch):
    """The idiom the error suggests."""
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x.clone()
    y[0] = 5.0
    (y * y).sum().backward()
    theirs = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    copied = theirs.clone()
    copied[0] = 5.0
    (copied * copied).sum().backward()
    np.testing.assert_array_equal(y.numpy(), copied.detach().numpy())
    np.testing.assert_array_equal(x.grad.numpy(), theirs.grad.numpy())


def test_setitem_into_tensors_that_take_no_gradient_still_writes():
    x = Tensor([1.0, 2.0, 3.0])
    x[1] = 7.0
    frozen = Tensor([1.0, 2.0, 3.0], requires_grad=False)
    frozen[2] = 9.0
    np.testing.assert_array_equal(x.numpy(), [1.0, 7.0, 3.0])
    np.testing.assert_array_equal(frozen.numpy(), [1.0, 2.0, 9.0])


# ---- x[i] += v ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("operator", ["+", "*"])
def test_an_in_place_op_on_an_index_says_how_to_write_it(operator):
    """Python runs `t[1] += 1` as `y = t[1]; y += 1; t[1] = y`: the message told the user to index the original,
    which they had done."""
    t = Tensor([1.0, 2.0, 3.0]).realize()
    expected = f"x[i] = x[i] {operator} v rather than x[i] {operator}= v"
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        exec(f"t[1] {operator}= 2", {"t": t})
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])  # (unchanged)
    exec(f"t[1] = t[1] {operator} 2", {"t": t})
    values = np.array([1.0, 2.0, 3.0], np.float32)
    exec(f"values[1] {operator}= 2", {"values": values})
    np.testing.assert_array_equal(t.numpy(), values)


# ---- Tensor(torch tensor) -------------------------------------------------------------------------------------------


def test_a_torch_tensor_that_requires_grad_gives_its_values(torch):
    """NumPy refuses such a tensor ("Can't call numpy() on Tensor that requires grad"): any nn.Parameter."""
    values = torch.tensor([1.5, -2.0], requires_grad=True)
    np.testing.assert_array_equal(Tensor(values).numpy(), values.detach().numpy())
    parameter = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    made = Tensor(parameter)
    assert made.dtype == dtypes.float32 and made.shape == (2, 3)
    np.testing.assert_array_equal(made.numpy(), parameter.detach().numpy())


def test_a_torch_bfloat16_tensor_gives_a_bfloat16_tensor_with_its_exact_bits(torch):
    """NumPy has no bfloat16 ("Got unsupported ScalarType BFloat16")."""
    values = torch.tensor([1.0, 3.3, -0.0, float("inf"), float("nan"), 1e-40, -65504.0], dtype=torch.bfloat16)
    made = Tensor(values)
    assert made.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(made.bitcast(dtypes.int16).numpy(), values.view(torch.int16).numpy())
    parameter = torch.nn.Parameter(torch.tensor([[0.1, 2.5]], dtype=torch.bfloat16))
    np.testing.assert_array_equal(Tensor(parameter).numpy(), parameter.detach().float().numpy())
    as_float = Tensor(values, dtype=dtypes.float32)  # (a dtype given is kept)
    assert as_float.dtype == dtypes.float32
    np.testing.assert_array_equal(as_float.numpy(), values.float().numpy())


@pytest.mark.parametrize(
    "make, dtype",
    [
        (lambda torch: torch.tensor([1.5, -2.25, 65504.0], dtype=torch.float16), dtypes.float16),
        (lambda torch: torch.tensor([2**40, -3]), dtypes.int64),
        (lambda torch: torch.tensor([True, False]), dtypes.bool),
        (lambda torch: torch.tensor(3.5), dtypes.float32),
        (lambda torch: torch.tensor(7, dtype=torch.int32), dtypes.int32),
        (lambda torch: torch.arange(6, dtype=torch.float32).reshape(2, 3).T, dtypes.float32),  # (not contiguous)
        (lambda torch: torch.arange(12).reshape(3, 4)[:, ::2], dtypes.int64),
    ],
)
def test_torch_tensors_give_their_exact_values_and_dtypes(torch, make, dtype):
    values = make(torch)
    made = Tensor(values)
    assert made.dtype == dtype and made.shape == tuple(values.shape)
    np.testing.assert_array_equal(made.numpy(), values.numpy())


# ---- device names ---------------------------------------------------------------------------------------------------


def test_a_device_index_other_than_0_is_an_error():
    """ "cuda:1" gave a tensor on the one CUDA device, silently."""
    x = Tensor([1.0, 2.0])
    with pytest.raises(
        ValueError, match=re.escape("CUDA:1: lazygrad uses one device of each kind; use 'CUDA' or 'CUDA:0'")
    ):
        x.to("cuda:1")
    default = Device.DEFAULT
    with pytest.raises(ValueError, match=re.escape(f"{default}:2: lazygrad uses one device of each kind")):
        Tensor([1.0], device=f"{default.lower()}:2")
    with pytest.raises(ValueError, match="unknown device"):
        x.to(f"{default}:first")


def test_device_index_0_and_the_other_spellings_name_the_one_device():
    default = Device.DEFAULT
    x = Tensor([1.0, 2.0])
    for name in (default, default.lower(), f"{default}:0", f"{default.lower()}:0"):
        assert x.to(name).device == default
        assert Tensor([1.0], device=name).device == default
        assert Device[name] is Device[default]
    assert Device.canonicalize("clang") == Device.canonicalize("CPU:0") == "CPU"
    np.testing.assert_array_equal(x.to(f"{default}:0").numpy(), [1.0, 2.0])


@pytest.mark.parametrize("device", [0, 1.0, None])
def test_a_device_that_is_not_a_string_is_a_type_error(device):
    """`x.to(0)` failed inside the registry: "'int' object has no attribute 'upper'"."""
    expected = f"device must be a string, got {type(device).__name__} {device!r}: name it as 'LLVM'"
    if device is not None:  # (x.to(None) is x, as a cast to no dtype)
        with pytest.raises(TypeError, match=re.escape(expected)):
            Tensor([1.0]).to(device)
    with pytest.raises(TypeError, match=re.escape(expected)):
        Tensor([1.0], device=device) if device is not None else Device.canonicalize(device)
    with pytest.raises(TypeError, match=re.escape(expected)):
        Device[device]
