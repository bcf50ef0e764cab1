"""TinyJit replays that read state made before the capture: a tensor still lazy then (a new layer's weights, a
computed constant) is read from its buffer, so a later assign (load_state_dict) reaches the replays. Values are
compared with NumPy and with eager lazygrad."""

import numpy as np
import pytest

from lazygrad import Tensor, TinyJit, nn
from lazygrad.nn.state import load_state_dict


@pytest.fixture(autouse=True)
def _modes_restored():
    """Every test starts and ends in eval mode with gradients on, whatever it sets."""
    Tensor.training, Tensor.no_grad = False, False
    yield
    Tensor.training, Tensor.no_grad = False, False


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
