"""TinyJit replays that read state made before the capture: a tensor still lazy then (a new layer's weights, a
computed constant) is read from its buffer, so a later assign (load_state_dict) reaches the replays. Values are
compared with NumPy and with eager lazygrad. Also: how a call's inputs reach the capture (keyword arguments, views),
threads, and jitted methods."""

import copy
import gc
import re
import sys
import threading
import weakref

import numpy as np
import pytest

from lazygrad import Tensor, TinyJit, dtypes, nn
from lazygrad.engine.jit import JitError
from lazygrad.nn.state import load_state_dict


def test_a_replay_reads_what_an_assign_wrote_into_a_tensor_lazy_at_the_capture():
    """The capture inlined the lazy tensor's graph into its kernels, and the assign (into no buffer) only rebound its
    node: the replays kept adding [3, 6]."""
    offset = Tensor([1.0, 2.0]) * 3  # (lazy: not realized yet)

    @TinyJit
    def add(x):
        return (x + offset).realize()

    for _ in range(3):
        np.testing.assert_array_equal(add(Tensor.zeros(2)).numpy(), [3.0, 6.0])
    offset.assign(Tensor([10.0, 20.0])).realize()
    np.testing.assert_array_equal(offset.numpy(), [10.0, 20.0])
    np.testing.assert_array_equal(add(Tensor([1.0, 1.0])).numpy(), [11.0, 21.0])


def test_a_replay_reads_a_lazy_constant_assigned_after_the_capture():
    scale = Tensor.ones(3)  # (a constant: no buffer of its own until realized)

    @TinyJit
    def scaled(x):
        return (x * scale).realize()

    x = Tensor([1.0, 2.0, 3.0])
    for _ in range(3):
        scaled(x)
    scale.assign(Tensor([2.0, 3.0, 4.0])).realize()
    np.testing.assert_array_equal(scaled(x).numpy(), [2.0, 6.0, 12.0])


def test_a_jitted_predict_follows_load_state_dict():
    """A bias initialised to zeros is a lazy constant: the replays kept adding zeros after new weights were loaded."""
    layer = nn.Linear(3, 2)
    layer.bias = Tensor.zeros(2)  # (as torch's nn.init.zeros_(layer.bias))
    predict = TinyJit(lambda x: layer(x).realize())
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    for _ in range(3):
        predict(x)
    weight = np.array([[1.0, 2.0, 3.0], [4.0, -5.0, 6.0]], np.float32)
    bias = np.array([0.5, -1.0], np.float32)
    load_state_dict(layer, {"weight": Tensor(weight), "bias": Tensor(bias)})
    replayed = predict(x).numpy()
    np.testing.assert_allclose(replayed, x.numpy() @ weight.T + bias, rtol=1e-6)
    np.testing.assert_allclose(replayed, layer(x).numpy(), rtol=1e-6)  # (eager)
    assert predict.calls == 4  # (replayed, not captured again)


# ---- inputs: keyword arguments, views --------------------------------------------------------------------------------


def test_keyword_arguments_in_another_order_are_bound_by_name():
    """The inputs were taken in the call's order and the signature in sorted order: f(b=..., a=...) after a capture
    with f(a=..., b=...) replayed a - b as b - a."""

    @TinyJit
    def difference(a, b):
        return (a - b).realize()

    for n in range(3):
        np.testing.assert_array_equal(difference(a=Tensor([1.0, 1.0]), b=Tensor([0.0, float(n)])).numpy(), [1, 1 - n])
    np.testing.assert_array_equal(difference(b=Tensor([0.0, 1.0]), a=Tensor([5.0, 5.0])).numpy(), [5.0, 4.0])
    np.testing.assert_array_equal(difference(b=Tensor([3.0, 1.0]), a=Tensor([2.0, 2.0])).numpy(), [-1.0, 1.0])
    assert difference.calls == 5  # (replayed, not captured again)


def test_a_view_passed_in_stays_the_callers_view(torch):
    """The JIT replaced the caller's view with a contiguous copy for good: it no longer followed its buffer, and its
    gradient no longer reached the tensor it was sliced from."""
    doubled = TinyJit(lambda x: (x * 2).realize())
    parameter = Tensor([0.0, 1.0, 2.0, 3.0], requires_grad=True)
    view = parameter[1:3]
    np.testing.assert_array_equal(doubled(view).numpy(), [2.0, 4.0])
    (view * view).sum().backward()
    theirs = torch.tensor([0.0, 1.0, 2.0, 3.0], requires_grad=True)
    (theirs[1:3] * theirs[1:3]).sum().backward()
    np.testing.assert_array_equal(parameter.grad.numpy(), theirs.grad.numpy())

    base = Tensor(np.arange(10.0, dtype=np.float32)).realize()
    view = base[2:5]
    TinyJit(lambda x: (x * 2).realize())(view)
    base.assign(Tensor(np.arange(10.0, dtype=np.float32) * 10)).realize()
    np.testing.assert_array_equal(view.numpy(), [20.0, 30.0, 40.0])


def test_replays_read_each_calls_views():
    @TinyJit
    def combine(x, y):
        return (x * 10 + y).realize()

    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    base = Tensor(data).realize()
    for call in range(5):
        x, y = base[call % 4, 1:4], base.T[call % 6, :3]  # (a slice and a strided column of a transpose)
        np.testing.assert_array_equal(combine(x, y).numpy(), data[call % 4, 1:4] * 10 + data.T[call % 6, :3])
        np.testing.assert_array_equal(x.numpy(), data[call % 4, 1:4])  # (still the view)
    assert combine.calls == 5


# ---- threads ---------------------------------------------------------------------------------------------------------


def _in_threads(work, count: int = 4) -> list:
    """Run work(number) on `count` threads started together; the errors they met."""
    errors, start = [], threading.Barrier(count)

    def run(number):
        try:
            start.wait()
            work(number)
        except Exception as error:  # noqa: BLE001 (reported by the test)
            errors.append(f"thread {number}: {error!r}")

    threads = [threading.Thread(target=run, args=(number,)) for number in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_threads_calling_their_own_jits_get_their_values():
    """A capture realized every lazy tensor first, another thread's half-built step too (that thread's capture then
    "launched no kernels", or replayed kernels without its step's), and making tensors on several threads could
    fail in the registry of live tensors ("dictionary changed size during iteration")."""
    switches = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # (threads take turns often: each step's graph is built over many of them)
    try:
        for _ in range(3):

            def work(number):
                weight = Tensor(np.full((4,), number + 1, np.float32)).realize()

                def step(x):
                    for _ in range(30):
                        x = x * weight + 1
                    return x.realize()

                jitted = TinyJit(step)
                for call in range(4):
                    expected = np.full(4, 0.5 * call, np.float32)
                    for _ in range(30):
                        expected = expected * (number + 1) + 1
                    np.testing.assert_allclose(jitted(Tensor.full((4,), 0.5 * call)).numpy(), expected, rtol=1e-5)

            assert _in_threads(work) == []
    finally:
        sys.setswitchinterval(switches)


def test_threads_sharing_one_jit_take_turns():
    """The call counter and the capture were shared unlocked: threads got None, captured nothing, or replayed another
    thread's half-made capture. A replay's outputs are one set of buffers, which the next call overwrites, so what
    a thread reads is some call's output."""
    step = TinyJit(lambda x: (x * 2 + x.sum()).realize())
    inputs = {(number, call): float(number * 100 + call) for number in range(4) for call in range(8)}
    outputs = {value * 2 + value * 4 for value in inputs.values()}

    def work(number):
        for call in range(8):
            result = step(Tensor.full((4,), inputs[number, call]))
            assert result is not None
            values = result.numpy()
            assert set(values.tolist()) <= outputs, values

    assert _in_threads(work) == []
    assert step.calls == 32


# ---- methods ---------------------------------------------------------------------------------------------------------


class _Scaler:
    def __init__(self, scale: float):
        self.weight = Tensor([scale, scale]).realize()

    @TinyJit
    def forward(self, x):
        return (x * self.weight).realize()


def test_a_jitted_method_captures_for_each_instance():
    """TinyJit had no __get__: `instance.forward(x)` called the function without `self` (TypeError)."""
    twice, thrice = _Scaler(2.0), _Scaler(3.0)
    for call in range(4):
        x = Tensor([1.0, float(call)])
        np.testing.assert_array_equal(twice.forward(x).numpy(), [2.0, 2.0 * call])
        np.testing.assert_array_equal(thrice.forward(x).numpy(), [3.0, 3.0 * call])
    assert twice.forward is twice.forward and twice.forward is not thrice.forward
    assert twice.forward.calls == thrice.forward.calls == 4
    assert _Scaler.forward.__name__ == "forward"


def test_a_jitted_methods_capture_goes_with_its_instance():
    scaler = _Scaler(2.0)
    for _ in range(3):
        scaler.forward(Tensor([1.0, 1.0]))
    reference = weakref.ref(scaler)
    del scaler
    gc.collect()
    assert reference() is None  # (the capture holds the instance weakly)
    assert not _Scaler.forward._bound


def test_a_jitted_method_of_a_class_without_weak_references_says_what_to_do():
    class Slotted:
        __slots__ = ()

        @TinyJit
        def forward(self, x):
            return (x * 2).realize()

    with pytest.raises(TypeError, match=re.escape("TinyJit(forward): a method of a Slotted instance, which cannot")):
        Slotted().forward(Tensor([1.0]))


def test_a_deep_copied_model_steps_on_its_own_tensors():
    """A copy of a model holding a captured TinyJit failed ("ctypes objects containing pointers cannot be pickled");
    the copy's TinyJit captures again, on the copy's tensors."""

    class Model:
        def __init__(self):
            self.weight = Tensor([1.0, 2.0]).realize()
            self.step = TinyJit(self._step)

        def _step(self, x):
            return (x * self.weight).realize()

    model = Model()
    for _ in range(3):
        model.step(Tensor([1.0, 1.0]))
    copied = copy.deepcopy(model)
    copied.weight.assign(Tensor([5.0, 6.0])).realize()
    for _ in range(3):
        np.testing.assert_array_equal(copied.step(Tensor([1.0, 2.0])).numpy(), [5.0, 12.0])
        np.testing.assert_array_equal(model.step(Tensor([1.0, 2.0])).numpy(), [1.0, 4.0])


def test_an_assign_reaches_the_replays_when_another_tensor_shares_the_node():
    """`keep = w.detach()` is w's very node: assign gave w a new buffer (so keep kept the old values), and the
    replays, which read the old buffer, never saw the new weights. Now keep gets a copy and w keeps its buffer."""
    w = Tensor([1.0, 1.0]).realize()
    keep = w.detach()

    @TinyJit
    def shifted(x):
        return (x + w).realize()

    for _ in range(3):
        shifted(Tensor([0.0, 0.0]))
    w.assign(Tensor([7.0, 7.0])).realize()
    np.testing.assert_array_equal(shifted(Tensor([0.0, 0.0])).numpy(), [7.0, 7.0])
    np.testing.assert_array_equal(keep.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(w.numpy(), [7.0, 7.0])


def _write(cache, index, value):
    cache[index] = value


@pytest.mark.parametrize(
    "name, op",
    [
        ("setitem with a tensor index", lambda cache, i, m: _write(cache, i, 1.0)),
        ("setitem with a tensor index", lambda cache, i, m: _write(cache, m, 1.0)),
        ("index_fill", lambda cache, i, m: cache.index_fill(0, i, 1.0)),
        ("index_put", lambda cache, i, m: cache.index_put((i,), Tensor([1.0]))),
        ("getitem with a bool mask", lambda cache, i, m: cache[m]),
        ("masked_select", lambda cache, i, m: cache.masked_select(m)),
        ("nonzero", lambda cache, i, m: m.nonzero()),
        ("one_hot without num_classes", lambda cache, i, m: i.one_hot()),
    ],
)
def test_ops_that_build_from_their_indices_are_refused_in_a_capture(name, op):
    """These ops read their indices on the host and build a graph from the values: a replay ran the kernels built
    from the capture's values, so `cache[pos] = v` went on writing where the capture wrote (a KV cache filled one
    step at a time held [1, 4, 0, ...])."""
    cache = Tensor.zeros(6).contiguous().realize()

    @TinyJit
    def step(i, m):
        result = op(cache, i, m)
        return (cache if result is None else result).realize()

    with pytest.raises(JitError, match=f"{name}.*computed from the function's inputs"):
        for position in range(3):
            step(Tensor([position]), Tensor([k == position for k in range(6)]))


def test_a_write_by_index_copy_follows_each_calls_index():
    """What the refusal suggests for a KV cache: index_copy (a scatter in the graph) writes where each call says."""
    cache = Tensor.zeros(6).contiguous().realize()

    @TinyJit
    def step(position, value):
        cache.assign(cache.index_copy(0, position, value))
        return cache.realize()

    for position in range(4):
        step(Tensor([position]), Tensor([float(position + 1)]))
    np.testing.assert_array_equal(cache.numpy(), [1, 2, 3, 4, 0, 0])


def test_a_tensor_index_made_outside_the_function_is_no_input():
    """An index tensor the function closes over is the same each call: its places may be found on the host."""
    cache, places = Tensor.zeros(4).contiguous().realize(), Tensor([1, 3])

    @TinyJit
    def step(value):
        cache[places] = value
        return cache.realize()

    for k in range(3):
        step(Tensor([float(k), float(k)]))
    np.testing.assert_array_equal(cache.numpy(), [0, 2, 0, 2])


@pytest.mark.parametrize(
    "op, bad",
    [
        (lambda x, i: x[i], [7, 0]),
        (lambda x, i: x[i], [2**32 + 1, 0]),  # (an int64 index the int32 compare would wrap to row 1)
        (lambda x, i: x.gather(0, i.reshape(2, 1).expand(2, 2)), [-1, 0]),
        (lambda x, i: x.index_select(0, i), [3, 0]),
    ],
)
def test_a_replay_checks_each_calls_indices(op, bad):
    """Indices are checked as a host step, as labels are: a replay with an index out of range raises as the eager op
    does (it gave zeros, or the row of a wrapped int64 index)."""
    x = Tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]).realize()
    step = TinyJit(lambda i: op(x, i).realize())
    for _ in range(3):
        np.testing.assert_array_equal(step(Tensor([1, 0], dtype=dtypes.int64)).numpy(), [[2, 2], [1, 1]])
    with pytest.raises(IndexError, match="out of range"):
        step(Tensor(bad, dtype=dtypes.int64))


@pytest.mark.parametrize("frozen_first", [False, True])
def test_a_parameter_frozen_or_unfrozen_between_calls_is_captured_again(frozen_first):
    """Freezing (or unfreezing) a parameter changes what a training step computes: the step is captured again, and
    trains as eager code does (the replay kept updating a frozen weight, and never trained an unfrozen one)."""
    from lazygrad.nn.state import get_parameters

    rng = np.random.default_rng(5)
    inputs = rng.standard_normal((16, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 16)
    weights = [rng.standard_normal(shape).astype(np.float32) * 0.3 for shape in ((16, 8), (4, 16))]
    results = []
    for jit in (False, True):
        first, second = nn.Linear(8, 16, bias=False), nn.Linear(16, 4, bias=False)
        first.weight.assign(Tensor(weights[0])).realize()
        second.weight.assign(Tensor(weights[1])).realize()
        first.weight.requires_grad = not frozen_first
        opt = nn.optim.SGD(get_parameters([first, second]), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = second(first(x).relu()).cross_entropy(y)
            loss.backward()
            opt.step()
            return loss.realize()

        step = TinyJit(step) if jit else step
        for _ in range(4):
            step(Tensor(inputs), Tensor(labels))
        first.weight.requires_grad = frozen_first
        before = first.weight.numpy().copy()
        for _ in range(4):
            step(Tensor(inputs), Tensor(labels))
        assert (np.abs(first.weight.numpy() - before).max() > 0) == frozen_first
        results.append((first.weight.numpy(), second.weight.numpy()))
    for eager, jitted in zip(*results):
        np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-7)
