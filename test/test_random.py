"""Random tensors: one value each, however many kernels read them; distinct draws from any thread; reproducible
seeds; JIT replays that draw anew."""

import threading

import numpy as np
import pytest

from lazygrad import Tensor, nn
from lazygrad.engine.jit import TinyJit

LEAF_MAKERS = [
    lambda shape: Tensor.rand(*shape),
    lambda shape: Tensor.randn(*shape),
    lambda shape: Tensor.uniform(*shape, low=-3.0, high=2.0),
    lambda shape: Tensor.normal(*shape, mean=1.0, std=0.5),
    lambda shape: Tensor.randn(*shape) * 0.1 + Tensor.rand(*shape),
    lambda shape: nn.Linear(shape[1], shape[0]).weight,
]


def _program(rng: np.random.Generator, leaves: list[Tensor]) -> list[Tensor]:
    """Outputs that read the leaves in several kernels and through several views: matmuls (a leaf inside a reduce),
    broadcasts, elementwise chains, reductions, transposes."""
    a, b, c = leaves
    outputs = [
        a @ b.T,
        (a * 2 + c).relu().sum(axis=1),
        (a.T @ c).exp().mean(),
        (a[:, :1] * b).max(axis=0),
        (b - a).abs().sqrt() + c.T.sum(axis=0, keepdim=True).T,
        a.reshape(-1)[: a.shape[1]] * c.reshape(-1)[: a.shape[1]],
        (a @ c.T).softmax(axis=-1),
    ]
    picked = rng.choice(len(outputs), size=int(rng.integers(2, 5)), replace=False)
    return [outputs[index] for index in picked]


@pytest.mark.parametrize("seed", range(24))
def test_unrealized_random_leaves_equal_realized_ones(seed):
    rng = np.random.default_rng(seed)
    Tensor.manual_seed(seed)
    rows, cols = int(rng.integers(2, 9)), int(rng.integers(2, 9))
    makers = [LEAF_MAKERS[index] for index in rng.integers(0, len(LEAF_MAKERS), size=3)]
    leaves = [maker((rows, cols)) for maker in makers]
    outputs = _program(np.random.default_rng(seed), leaves)
    # some outputs alone, then the rest together: the leaves are read by several schedules and kernels
    first = [output.numpy() for output in outputs[:1]]
    Tensor.realize_all(*outputs[1:])
    lazy = first + [output.numpy() for output in outputs[1:]]
    stored = [Tensor(leaf.numpy()) for leaf in leaves]
    expected = [output.numpy() for output in _program(np.random.default_rng(seed), stored)]
    for got, want in zip(lazy, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_random_tensor_has_one_value_across_kernels():
    Tensor.manual_seed(3)
    noise = Tensor.randn(16, 16)
    x = Tensor(np.eye(16, dtype=np.float32))
    through_matmul = (x @ noise).numpy()  # read inside a reduce: realized once
    doubled = (noise * 2).numpy()
    np.testing.assert_array_equal(through_matmul, noise.numpy())
    np.testing.assert_array_equal(doubled, noise.numpy() * 2)


def test_same_seed_same_numbers_and_draws_differ():
    Tensor.manual_seed(7)
    first = [Tensor.rand(5).numpy(), Tensor.randn(3, 2).numpy()]
    Tensor.manual_seed(7)
    second = [Tensor.rand(5).numpy(), Tensor.randn(3, 2).numpy()]
    for one, two in zip(first, second):
        np.testing.assert_array_equal(one, two)
    Tensor.manual_seed(8)
    assert not np.array_equal(Tensor.rand(5).numpy(), first[0])
    assert not np.array_equal(Tensor.rand(5).numpy(), Tensor.rand(5).numpy())


def test_threads_draw_distinct_numbers_and_realize_correctly():
    values, errors = [], []

    def work(offset: float) -> None:
        try:
            for step in range(50):
                values.append(float(Tensor.rand(1).numpy()[0]))
                x = Tensor(np.arange(64, dtype=np.float32) + offset)
                assert float(((x * 2 + step).sum()).item()) == float(np.sum(np.arange(64) + offset) * 2 + 64 * step)
        except Exception as error:  # noqa: BLE001 -- reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(float(number),)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(values) == 200 and len(set(values)) == 200
    assert all(0.0 <= value < 1.0 for value in values)


def test_jit_captures_only_its_own_thread():
    def launches_captured(busy: bool) -> int:
        weight = Tensor(np.ones((8, 8), np.float32))
        step = TinyJit(lambda x: ((x @ weight).relu() + 1).realize())
        stop = threading.Event()

        def other_work() -> None:
            while not stop.is_set():
                (Tensor(np.ones(32, np.float32)) * 3).sum().realize()

        worker = threading.Thread(target=other_work)
        if busy:
            worker.start()
        try:
            for _ in range(3):
                out = step(Tensor(np.ones((4, 8), np.float32)))
        finally:
            stop.set()
            if busy:
                worker.join()
        np.testing.assert_allclose(out.numpy(), np.full((4, 8), 9.0))
        return len(step.launches)

    assert launches_captured(busy=True) == launches_captured(busy=False)


def test_jit_redraws_only_what_the_step_draws():
    fixed = Tensor.rand(8)  # drawn before the step: a constant the step reads, never redrawn
    step = TinyJit(lambda x: (x + fixed + Tensor.rand(8) * 0).realize())
    noisy = TinyJit(lambda x: (x + Tensor.rand(8)).realize())
    x = Tensor(np.zeros(8, np.float32))
    constant = [step(x).numpy() for _ in range(4)]
    for values in constant:
        np.testing.assert_allclose(values, fixed.numpy(), rtol=1e-6)
    draws = [noisy(x).numpy() for _ in range(4)]
    assert len({values.tobytes() for values in draws}) == 4
