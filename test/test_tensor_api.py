"""The Tensor API at its edges, as torch behaves: writes into a leaf that requires grad, `x[i] += v`, tensors made from
torch tensors, device names with an index, `y.gradient([x, w])`, in-place writes into a computed tensor, and the
backward graph's dump. Values are compared with NumPy and torch."""

import gc
import re
import weakref

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
def test_an_in_place_op_on_an_index_writes_into_the_tensor(operator):
    """Python runs `t[1] += 1` as `y = t[1]; y += 1; t[1] = y`: the write into the view y reaches t, as NumPy's and
    torch's (it was refused, with a message telling the user to write `t[1] = t[1] + 1`)."""
    t = Tensor([1.0, 2.0, 3.0]).realize()
    exec(f"t[1] {operator}= 2", {"t": t})
    exec(f"t[0:2] {operator}= 3", {"t": t})
    values = np.array([1.0, 2.0, 3.0], np.float32)
    exec(f"values[1] {operator}= 2", {"values": values})
    exec(f"values[0:2] {operator}= 3", {"values": values})
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


# ---- y.gradient([x, w]) ---------------------------------------------------------------------------------------------


def test_gradient_takes_its_targets_as_one_list_or_tuple_as_torch_autograd_grad(torch):
    """`y.gradient((x,))` failed inside: "'tuple' object has no attribute 'uop'"."""
    x, w = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, -4.0], requires_grad=True)
    tx, tw = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, -4.0], requires_grad=True)
    y, ty = (x * x * w).sum(), (tx * tx * tw).sum()
    expected = [g.numpy() for g in torch.autograd.grad(ty, [tx, tw])]
    for targets in ([x, w], (x, w)):
        gradients = y.gradient(targets)
        assert isinstance(gradients, list) and len(gradients) == 2
        for gradient, theirs in zip(gradients, expected):
            np.testing.assert_array_equal(gradient.numpy(), theirs)
    (alone,) = y.gradient((x,))
    np.testing.assert_array_equal(alone.numpy(), expected[0])
    np.testing.assert_array_equal(y.gradient(x, w)[1].numpy(), expected[1])  # (one by one, as before)


def test_gradient_of_something_not_a_tensor_says_how_to_pass_targets():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    expected = "gradient: target 1 is a float, not a Tensor; pass the tensors to differentiate by, one by one or as"
    with pytest.raises(TypeError, match=re.escape(expected)):
        y.gradient([x, 1.0])
    with pytest.raises(TypeError, match=re.escape("gradient: target 0 is a list, not a Tensor")):
        y.gradient([x], [x])


# ---- in-place writes into a realized computation ----------------------------------------------------------------------


def _in_place_cases(torch):
    """(lazygrad's, torch's) versions of in-place writes into a computed tensor; each returns the loss, and the
    tensors it must keep alive (a realized tensor keeps the history its gradient flows through)."""

    def plus(x, w, realize):
        y = x * 2
        if realize:
            y.realize()
        y += 1
        return (y * y).sum(), y

    def times_then_plus(x, w, realize):
        y = x * 2
        if realize:
            y.realize()
        y *= w
        y -= x
        return (y * y).sum(), y

    def setitem(x, w, realize):
        y = x * 2
        if realize:
            y.realize()
        y[1] = w[0] * 3
        y[2:] = 7.0
        return (y * y).sum(), y

    def a_reshape_sees_it(x, w, realize):
        y = x * w
        if realize:
            y.realize()
        grid = y.reshape(2, 2)
        y += 1
        return (grid * grid).sum() + y.sum(), y

    # (the last only realized: a reshape of a tensor still lazy is a value of its own, not a view)
    return [plus, times_then_plus, setitem, a_reshape_sees_it]


@pytest.mark.parametrize("case, realize", [(case, True) for case in range(4)] + [(case, False) for case in range(3)])
def test_in_place_writes_into_a_computed_tensor_keep_its_gradient_as_torch(torch, case, realize):
    """Into a realized computation they wrote an assign, which has no derivative: x.grad was None (y += 1), or
    lacked the part through the write."""
    x, w = Tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True), Tensor([0.5, -1.0, 2.0, 3.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    tw = torch.tensor([0.5, -1.0, 2.0, 3.0], requires_grad=True)
    write = _in_place_cases(torch)[case]
    loss, kept = write(x, w, realize)
    theirs, their_kept = write(tx, tw, False)
    loss.backward()
    theirs.backward()
    np.testing.assert_allclose(loss.numpy(), theirs.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(kept.numpy(), their_kept.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
    if tw.grad is None:
        assert w.grad is None
    else:
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)
    assert not kept.is_leaf


def test_in_place_writes_with_gradients_off_stay_plain_writes():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * 2).realize()
    with Tensor.test():
        y += 1
    np.testing.assert_array_equal(y.numpy(), [3.0, 5.0])
    (y * x).sum().backward()  # (y's values no longer come from x: only the direct product's gradient)
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 5.0])


def test_an_in_place_update_of_randomly_initialised_weights_keeps_no_graph():
    """Weights drawn at random are realized with their drawing as history; an update written `w -= lr * w.grad`
    must not make each step's gradient graph part of the weights' history (kept alive for ever)."""
    w = Tensor.uniform(2, 3, requires_grad=True).realize()
    first = w.numpy()
    x = Tensor([[1.0, 2.0, 3.0]])
    graphs = []
    for _ in range(3):
        w.grad = None
        (x * w).sum().backward()
        graphs.append(weakref.ref(w.grad.uop))
        w -= 0.5 * w.grad
    (x * w).sum().numpy()
    w.grad = None
    gc.collect()
    assert [graph() for graph in graphs] == [None, None, None]
    np.testing.assert_allclose(w.numpy(), first - 1.5 * np.array([[1.0, 2.0, 3.0]] * 2), rtol=1e-6)


# ---- the backward graph's dump ---------------------------------------------------------------------------------------


def test_the_backward_graph_dump_goes_through_realized_tensors(tmp_path):
    """It drew the roots' graphs as they stand, which stop at a realized tensor (its buffer), where backward goes on
    through the computation behind it: the square root's gradient was missing."""
    from lazygrad import autograd

    x = Tensor([1.0, 4.0], requires_grad=True)
    root = x.sqrt().realize()
    autograd.backward([(root * root).sum()], dump_backward_graph_path=str(tmp_path))
    text = (tmp_path / "backward_graph.txt").read_text()
    assert "gradient of SQRT (2,)" in text, text
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0], rtol=1e-6)


def test_training_and_no_grad_are_each_threads_own():
    """`with Tensor.test():` in one thread turned off another thread's gradients, and threads entering and leaving
    such blocks at once left both modes stuck on (each restored the value another had set)."""
    import threading
    import time

    from lazygrad import Tensor as T

    start, errors = threading.Barrier(4), []

    def flip(context, name):
        start.wait()
        for _ in range(50):
            with context():
                if not getattr(T, name):
                    errors.append(f"{name} off inside its block")
                time.sleep(0.0005)

    def differentiate():
        start.wait()
        for _ in range(50):
            x = T([1.0, 2.0], requires_grad=True)
            (x * x).sum().backward()
            if x.grad is None or x.grad.tolist() != [2.0, 4.0]:
                errors.append("a gradient was off in a thread outside any block")

    threads = [
        threading.Thread(target=flip, args=(T.test, "no_grad")),
        threading.Thread(target=flip, args=(T.test, "no_grad")),
        threading.Thread(target=flip, args=(T.train, "training")),
        threading.Thread(target=differentiate),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and T.no_grad is False and T.training is False
    # assigning sets the mode for the process: a thread that never entered a block sees it
    seen = []
    T.training = True
    try:
        thread = threading.Thread(target=lambda: seen.append(T.training))
        thread.start()
        thread.join()
    finally:
        T.training = False
    assert seen == [True] and T.training is False


def test_torch_order_where_is_an_error_naming_both_orders():
    """torch's `x.where(cond, y)` read in this (tinygrad's) order, `cond.where(x, y)`, silently selected between
    the mask and y wherever x was nonzero."""
    x = Tensor([0.5, 1.0, 1.5, 4.0])
    with pytest.raises(TypeError, match=r"where: .*torch's `x.where\(cond, y\)` order.*`cond.where\(x, y\)`"):
        x.where(x > 1, 0.0)
    with pytest.raises(TypeError, match="torch's"):
        x.where(x > 1, x * 2)
    assert Tensor.where(x > 1, x, 0.0).tolist() == [0.0, 0.0, 1.5, 4.0]
    assert (x > 1).where(x, 0.0).tolist() == [0.0, 0.0, 1.5, 4.0]
    # a number condition and bool values stay tinygrad's select
    assert Tensor([1, 0]).where(Tensor([True, True]), Tensor([False, False])).tolist() == [True, False]


def test_torch_keywords_of_std_split_and_view_as_a_dtype():
    """`std(unbiased=)`, `split(split_size=)` and `view(dtype)` are torch's (they raised an unexpected keyword, or
    blamed reshape)."""
    import torch

    values = [1.0, 2.0, 3.5, 4.0]
    x, t = Tensor(values), torch.tensor(values)
    for unbiased in (True, False):
        np.testing.assert_allclose(x.std(0, unbiased=unbiased).item(), t.std(0, unbiased=unbiased).item(), rtol=1e-6)
        np.testing.assert_allclose(x.var(unbiased=unbiased).item(), t.var(unbiased=unbiased).item(), rtol=1e-6)
    with pytest.raises(TypeError, match="both correction= and unbiased="):
        x.std(unbiased=True, correction=0)
    assert [p.tolist() for p in x.split(split_size=3)] == [p.tolist() for p in t.split(split_size=3)]
    assert [p.tolist() for p in x.split(split_size_or_sections=[1, 3])] == [[1.0], [2.0, 3.5, 4.0]]
    assert x.view(dtypes.int32).tolist() == t.view(torch.int32).tolist()
    assert x.reshape(2, 2).tile(dims=(2, 1)).tolist() == t.reshape(2, 2).tile(dims=(2, 1)).tolist()
    with pytest.raises(TypeError, match="tile: takes the counts as arguments or as dims="):
        x.tile(reps=2)
