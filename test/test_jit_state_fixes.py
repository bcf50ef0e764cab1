"""TinyJit replays that must follow what eager code does (new result containers each call, the train/eval and
gradients-off modes, gradients bound by backward, a TinyJit inside another, array arguments refused), and torch_load
on the values torch's weights_only loader takes and the dtypes lazygrad cannot hold. Values are compared with NumPy,
eager lazygrad and torch."""

import codecs
import collections
import pickle

import numpy as np
import pytest

from lazygrad import Tensor, TinyJit, dtypes, nn
from lazygrad.engine.jit import JitError
from lazygrad.nn.optim import SGD
from lazygrad.nn.state import torch_load

# ---- results: new containers each call ------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "double triple")


def test_jit_returns_a_new_dict_each_call_which_the_caller_may_change():
    """The logging idiom `out["loss"] = out["loss"].item()` changed the one dict every replay returned."""

    @TinyJit
    def step(x: Tensor) -> dict:
        return {"loss": (x * 2).sum().realize()}

    for i in range(6):
        out = step(Tensor([float(i), 1.0]))
        out["loss"] = out["loss"].item()  # (an AttributeError on the old code: a float has no .item())
        assert out["loss"] == (i + 1.0) * 2


def test_jit_rebuilds_nested_containers_of_their_own_types():
    @TinyJit
    def step(x: Tensor):
        double, triple = (x * 2).realize(), (x * 3).realize()
        return [{"pair": Pair(double, triple), "ordered": collections.OrderedDict(a=double)}, (triple,)]

    results = []
    for i in range(5):
        values = np.array([i, -i], np.float32)
        out = step(Tensor(values))
        results.append(out)
        assert isinstance(out[0]["pair"], Pair) and isinstance(out[0]["ordered"], collections.OrderedDict)
        np.testing.assert_array_equal(out[0]["pair"].double.numpy(), values * 2)
        np.testing.assert_array_equal(out[0]["pair"].triple.numpy(), values * 3)
        np.testing.assert_array_equal(out[0]["ordered"]["a"].numpy(), values * 2)
        np.testing.assert_array_equal(out[1][0].numpy(), values * 3)
        out[0]["pair"], out[0]["ordered"]["a"], out[1] = None, None, None  # the caller's to change
    assert all(a[0] is not b[0] and a[0]["ordered"] is not b[0]["ordered"] for a, b in zip(results, results[1:]))


# ---- modes: Tensor.training and Tensor.no_grad ----------------------------------------------------------------------


def test_jit_recaptures_when_training_changes():
    """Dropout captured in training kept dropping in eval; each mode now has its own capture."""
    calls = []

    @TinyJit
    def step(x: Tensor) -> Tensor:
        calls.append(Tensor.training)
        return x.dropout(0.5).realize()

    values = np.arange(1, 65, dtype=np.float32)
    for _ in range(3):
        with Tensor.train():
            dropped = step(Tensor(values)).numpy()
            assert 0 < (dropped == 0).sum() < 64
            np.testing.assert_array_equal(dropped[dropped != 0], values[dropped != 0] * 2)
        for _ in range(3):  # eval: dropout does nothing, as eagerly
            np.testing.assert_array_equal(step(Tensor(values)).numpy(), values)
    assert calls == [True, False, False, True], "each mode warms up and captures once, then replays"
    assert len(step.recordings) == 2


def test_jit_batchnorm_follows_the_mode_after_capture():
    norm = nn.BatchNorm(3)
    step = TinyJit(lambda x: norm(x).realize())
    rng = np.random.default_rng(0)
    batches = [rng.normal(2.0, 3.0, size=(4, 3)).astype(np.float32) for _ in range(8)]
    mean, var = np.zeros(3, np.float32), np.ones(3, np.float32)
    for number, batch in enumerate(batches):
        training = number % 4 < 2  # two training calls, two eval calls, and again: each mode is captured apart
        with Tensor.train(training):
            got = step(Tensor(batch)).numpy()
        if training:
            expected = (batch - batch.mean(0)) / np.sqrt(batch.var(0) + 1e-5)
            mean = 0.9 * mean + 0.1 * batch.mean(0)
            var = 0.9 * var + 0.1 * batch.var(0, ddof=1)
        else:
            expected = (batch - mean) / np.sqrt(var + 1e-5)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(norm.running_mean.numpy(), mean, rtol=1e-5)


def test_jit_recaptures_when_gradients_are_turned_off():
    """A step that branches on Tensor.no_grad (Tensor.test()) captured with gradients on kept computing them."""
    weight = Tensor([1.0, 2.0], requires_grad=True).realize()

    @TinyJit
    def step(x: Tensor):
        weight.grad = None
        loss = (weight * x).sum()
        if Tensor.no_grad:
            return loss.realize(), (weight * 0).realize()
        loss.backward()
        return loss.realize(), weight.grad.realize()

    for i in range(8):
        x = np.array([i, 1.0], np.float32)
        with Tensor.test(i % 4 >= 2):
            loss, grad = step(Tensor(x))
            np.testing.assert_allclose(loss.numpy(), x @ np.array([1.0, 2.0]))
            np.testing.assert_array_equal(grad.numpy(), np.zeros(2) if i % 4 >= 2 else x)


def test_jit_backward_under_test_mode_fails_as_eagerly():
    weight = Tensor([1.0, 2.0], requires_grad=True).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        weight.grad = None
        (weight * x).sum().backward()
        return weight.grad.realize()

    for _ in range(3):
        step(Tensor([1.0, 1.0]))
    with Tensor.test(), pytest.raises(RuntimeError, match="gradients are off"):
        step(Tensor([1.0, 1.0]))


def test_jit_keeps_at_most_one_capture_per_mode():
    calls = []

    @TinyJit
    def step(x: Tensor) -> Tensor:
        calls.append(1)
        return (x + 1).realize()

    for _ in range(5):
        for training in (False, True):
            for no_grad in (False, True):
                with Tensor.train(training), Tensor.test(no_grad):
                    np.testing.assert_array_equal(step(Tensor([1.0, 2.0])).numpy(), [2.0, 3.0])
    assert len(step.recordings) == 4 and len(calls) == 8


# ---- gradients ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [False, True], ids=["requires_grad", "nn.Linear"])
def test_jit_refuses_gradients_added_up_across_calls(layer):
    """backward without zero_grad in the step adds to the last call's .grad: a replay kept adding to the first's."""
    linear = nn.Linear(2, 1, bias=False)
    linear.weight = Tensor([[1.0, 2.0]]) if layer else Tensor([[1.0, 2.0]], requires_grad=True)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        linear(x).sum().backward()
        return linear.weight.grad.realize()

    np.testing.assert_array_equal(step(Tensor([[1.0, 3.0]])).numpy(), [[1.0, 3.0]])
    with pytest.raises(JitError, match=r"adds to the .grad of a \(1, 2\) float32 tensor.*zero_grad\(\)"):
        step(Tensor([[1.0, 3.0]]))


def test_jit_gradients_cleared_in_the_step_match_eager():
    def run(jit: bool):
        weight = Tensor([1.0, 2.0], requires_grad=True).realize()

        def step(x: Tensor) -> Tensor:
            weight.grad = None
            (weight * weight * x).sum().backward()
            return weight.grad.realize()

        step = TinyJit(step) if jit else step
        grads = [step(Tensor([float(i), 1.0])).numpy() for i in range(5)]
        return grads, weight.grad.numpy()

    (jit_grads, jit_last), (grads, last) = run(True), run(False)
    np.testing.assert_array_equal(jit_grads, grads)
    np.testing.assert_array_equal(jit_last, last)
    np.testing.assert_array_equal(last, [2.0 * 4, 4.0])


def test_jit_step_with_zero_grad_and_optimizer_outside_matches_eager():
    """Only backward in the TinyJit, zero_grad and the optimizer's step outside: a replay left .grad as zero_grad set
    it (None), so the optimizer skipped every replayed step."""

    def run(jit: bool):
        weight = Tensor([1.0, 2.0], requires_grad=True).realize()
        opt = SGD([weight], lr=0.1)

        def backward(x: Tensor) -> Tensor:
            loss = ((weight * x).sum() - 1.0).square()
            loss.backward()
            return loss.realize()

        backward = TinyJit(backward) if jit else backward
        losses = []
        for i in range(6):
            opt.zero_grad()
            losses.append(backward(Tensor([1.0, float(i)])).item())
            assert weight.grad is not None
            opt.step()
        return losses, weight.numpy()

    (jit_losses, jit_weight), (losses, weight) = run(True), run(False)
    np.testing.assert_allclose(jit_losses, losses, rtol=1e-6)
    np.testing.assert_allclose(jit_weight, weight, rtol=1e-6)
    expected = np.array([1.0, 2.0])
    for i in range(6):  # the same steps in NumPy
        x = np.array([1.0, i])
        expected = expected - 0.1 * 2 * (expected @ x - 1.0) * x
    np.testing.assert_allclose(weight, expected, rtol=1e-5)


def test_jit_refuses_a_replay_that_eager_code_would_add_to():
    weight = Tensor([1.0, 2.0], requires_grad=True).realize()

    @TinyJit
    def backward(x: Tensor) -> Tensor:
        (weight * x).sum().backward()
        return weight.grad.realize()

    for _ in range(3):
        weight.grad = None
        np.testing.assert_array_equal(backward(Tensor([3.0, 4.0])).numpy(), [3.0, 4.0])
    with pytest.raises(JitError, match=r"has a .grad from an earlier call.*zero_grad\(\)"):
        backward(Tensor([3.0, 4.0]))  # not cleared: eager code would give [6, 8]


# ---- a TinyJit inside another ---------------------------------------------------------------------------------------


def test_nested_jit_runs_inside_the_outer_capture():
    inner_calls = []

    def inner_function(x: Tensor) -> Tensor:
        inner_calls.append(1)
        return (x * 2).realize()

    inner = TinyJit(inner_function)
    outer = TinyJit(lambda x: (inner(x) + 1).realize())
    for i in range(6):
        np.testing.assert_array_equal(outer(Tensor([float(i), 2.0 * i])).numpy(), [2.0 * i + 1, 4.0 * i + 1])
    assert outer.launches and len(inner_calls) == 2  # the outer's warm-up and capture; its replays run no Python


def test_nested_jit_already_captured_on_its_own():
    inner = TinyJit(lambda x: (x * x).realize())
    for i in range(4):  # captured and replaying by itself first
        np.testing.assert_array_equal(inner(Tensor([float(i)])).numpy(), [i * i])
    outer = TinyJit(lambda x, y: (inner(x) - y).realize())
    for i in range(5):
        np.testing.assert_array_equal(outer(Tensor([float(i)]), Tensor([1.0])).numpy(), [i * i - 1.0])
    np.testing.assert_array_equal(inner(Tensor([7.0])).numpy(), [49.0])  # and it still replays by itself


# ---- array arguments ------------------------------------------------------------------------------------------------


def test_jit_refuses_a_numpy_array_argument():
    step = TinyJit(lambda x, *rest, **named: (x * 2).realize())
    with pytest.raises(JitError, match=r"argument 0 is a numpy.ndarray of shape \(2,\).*Tensor\(array\)"):
        step(np.array([1.0, 2.0], np.float32))
    with pytest.raises(JitError, match=r"argument 2\[0\] is a numpy.ndarray of shape \(1, 3\)"):
        step(Tensor([1.0]), 3, [np.zeros((1, 3))])
    with pytest.raises(JitError, match=r"keyword argument 'mask'\['a'\] is a numpy.ndarray"):
        step(Tensor([1.0]), mask={"a": np.ones(2)})
    # numbers stay plain arguments (compared each call), and a Tensor of the array replays
    for i in range(4):
        np.testing.assert_array_equal(step(Tensor(np.array([i, 1.0], np.float32)), 3).numpy(), [2.0 * i, 2.0])


def test_jit_refuses_a_torch_tensor_argument(torch):
    step = TinyJit(lambda x: (x * 2).realize())
    with pytest.raises(JitError, match=r"argument 0 is a torch.Tensor of shape \(2,\)"):
        step(torch.ones(2))


# ---- torch_load -----------------------------------------------------------------------------------------------------


def _saved(torch, tmp_path, value, **options) -> str:
    path = str(tmp_path / "checkpoint.pth")
    torch.save(value, path, **options)
    return path


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_torch_load_reads_unsigned_ints(torch, tmp_path, name):
    """torch writes these as untyped bytes with their dtype (_rebuild_tensor_v3), which was refused."""
    torch_dtype, dtype = getattr(torch, name), getattr(dtypes, name)
    top = np.iinfo(name).max
    values = torch.tensor(np.array([[0, 1, 2], [top, top - 7, 1000]], dtype=name))
    path = _saved(torch, tmp_path, {"w": values, "t": values.t(), "row": values[1], "other": torch.arange(3)})
    loaded = torch_load(path)
    for key in ("w", "t", "row"):
        expected = torch.load(path, weights_only=True)[key]
        assert loaded[key].dtype == dtype and expected.dtype == torch_dtype
        np.testing.assert_array_equal(loaded[key].numpy(), expected.numpy())
    np.testing.assert_array_equal(loaded["other"].numpy(), [0, 1, 2])


@pytest.mark.parametrize(
    "name, match",
    [
        ("complex64", "no complex numbers; save torch.view_as_real"),
        ("complex128", "no complex numbers"),
        ("complex32", "no complex numbers"),
        ("float8_e4m3fn", r"no 8- or 4-bit floats; save t.float\(\)"),
        ("float8_e5m2", "no 8- or 4-bit floats"),
    ],
)
def test_torch_load_names_a_dtype_lazygrad_cannot_hold(torch, tmp_path, name, match):
    values = torch.ones(2, 2).to(getattr(torch, name))
    path = _saved(torch, tmp_path, {"layer": {"weight": values}, "bias": torch.ones(2)})
    with pytest.raises(TypeError, match=rf"tensor at \['layer'\]\['weight'\] in .* is torch.{name}, .*{match}"):
        torch_load(path)


def test_torch_load_takes_what_weights_only_takes(torch, tmp_path):
    checkpoint = {
        "bytes": b"\x00\xffab",
        "bytearray": bytearray(b"\x01\x02"),
        "set": {1, 2, "three"},
        "size": torch.Size([2, 3]),
        "dtypes": [torch.float32, torch.long, torch.bfloat16, torch.complex64],
        "devices": (torch.device("cpu"), torch.device("cuda", 1), torch.device("meta")),
        "complex": 1 + 2j,
        "weight": torch.arange(4.0),
    }
    for protocol in (2, 4):  # (torch's default, 2, builds bytes, sets and sizes by calls; 4 has opcodes for some)
        path = _saved(torch, tmp_path, checkpoint, pickle_protocol=protocol)
        # what torch itself reads from the file (its weights_only reader takes no protocol 4 frames: our own file)
        theirs = torch.load(path, weights_only=protocol == 2)
        ours = torch_load(path)
        for key in ("bytes", "bytearray", "set", "complex"):
            assert ours[key] == theirs[key] and type(ours[key]) is type(theirs[key]), key
        assert ours["size"] == tuple(theirs["size"]) == (2, 3) and type(ours["size"]) is tuple
        assert ours["dtypes"] == [str(dtype) for dtype in theirs["dtypes"]]
        assert ours["dtypes"] == ["torch.float32", "torch.int64", "torch.bfloat16", "torch.complex64"]
        assert ours["devices"] == tuple(str(device) for device in theirs["devices"]) == ("cpu", "cuda:1", "meta")
        np.testing.assert_array_equal(ours["weight"].numpy(), theirs["weight"].numpy())


def test_torch_load_still_refuses_code(torch, tmp_path):
    class Rot13:
        def __reduce__(self):
            return codecs.encode, ("text", "rot13")  # _codecs.encode, but not the form that makes bytes

    path = _saved(torch, tmp_path, {"weight": torch.ones(1), "evil": Rot13()})
    with pytest.raises(pickle.UnpicklingError, match="_codecs.encode is loaded only for bytes"):
        torch_load(path)
    with pytest.raises(pickle.UnpicklingError, match=r"torch\.nn\.modules\.linear\.Linear.*Save a state_dict"):
        torch_load(_saved(torch, tmp_path, torch.nn.Linear(2, 2)))


def test_a_value_built_before_a_replay_keeps_what_the_replay_overwrites():
    """`snap = w * 1` before a replayed step that writes w is w's value then: the replay computes it first, as the
    function's own schedules compute what reads a buffer they overwrite (it gave the stepped weights from call 3)."""
    weights = Tensor([1.0, 2.0]).contiguous().realize()

    @TinyJit
    def step(x):
        weights.assign(weights + x).realize()
        return weights

    for _ in range(5):
        before = weights.numpy().copy()
        snapshot = weights * 1
        step(Tensor([1.0, 1.0]))
        np.testing.assert_array_equal(snapshot.numpy(), before)


def test_a_pending_write_that_a_schedule_runs_first_keeps_its_readers_values():
    """A write pending on `stat` reads `w`; overwriting w runs it first, and a value read from stat before that
    write (`snap`) is computed before it too (it showed the written contents)."""
    stat = Tensor([0.0, 0.0]).contiguous().realize()
    w = Tensor([1.0, 2.0]).contiguous().realize()
    snap = stat * 1
    stat.assign(stat + w)
    w.assign(w * 2).realize()
    assert snap.tolist() == [0.0, 0.0] and stat.tolist() == [1.0, 2.0] and w.tolist() == [2.0, 4.0]
