"""Random tensors: one value each, however many kernels read them; distinct draws from any thread; reproducible
seeds; JIT replays that draw anew."""

import threading

import numpy as np
import pytest
import torch

from lazygrad import Device, Tensor, dtypes, nn
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


# ---- dtypes, randint, randperm and multinomial, against NumPy and PyTorch -----------------------------------------


def _chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    """The chi-square statistic, to compare with its degrees of freedom k: it exceeds k + 8 * sqrt(2k) with odds far
    below 1e-6 when the counts follow `expected`."""
    return float(np.sum((counts - expected) ** 2 / expected))


def _assert_fits(counts: np.ndarray, probabilities: np.ndarray) -> None:
    keep = probabilities > 0
    assert np.all(counts[~keep] == 0), counts
    freedom = keep.sum() - 1
    statistic = _chi_square(counts[keep], counts.sum() * probabilities[keep])
    assert statistic < freedom + 8 * np.sqrt(2 * freedom), (statistic, counts, counts.sum() * probabilities)


@pytest.mark.parametrize(
    "name, torch_make",
    [
        ("rand", lambda dtype: torch.rand(4, dtype=dtype)),
        ("randn", lambda dtype: torch.randn(4, dtype=dtype)),
        ("uniform", lambda dtype: torch.empty(4, dtype=dtype).uniform_()),
        ("normal", lambda dtype: torch.empty(4, dtype=dtype).normal_()),
    ],
)
@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint8, dtypes.bool], ids=str)
def test_random_floats_need_a_float_dtype(name, torch_make, dtype):
    # rand(4, dtype=int32) was all zeros and randn(dtype=int32) truncated noise; torch refuses both
    with pytest.raises(TypeError, match=rf"^{name}: needs a float dtype, got {dtype}; use Tensor.randint"):
        getattr(Tensor, name)(4, dtype=dtype)
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch_make(getattr(torch, dtype.name if dtype != dtypes.bool else "bool"))


@pytest.mark.parametrize("name", ["rand", "randn", "uniform", "normal"])
def test_random_floats_take_size_and_refuse_unknown_keywords(name):
    assert getattr(Tensor, name)(size=(2, 3)).shape == (2, 3)  # was () for rand and randn
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'foo'"):
        getattr(Tensor, name)(2, foo=1)


@pytest.mark.parametrize(
    "low, high, dtype",
    [(0, 2**30 + 1, dtypes.int32), (-(2**31), 2**31 - 1, dtypes.int32), (-(2**40), 2**41 + 3, dtypes.int64)],
)
def test_randint_is_uniform_over_wide_ranges(low, high, dtype):
    # it was floor(rand() * (high - low)): 24 random bits, so above 2**24 only multiples of a power of two came out
    # (every value of randint(low=0, high=2**30 + 1) was a multiple of 64)
    Tensor.manual_seed(0)
    values = Tensor.randint(1 << 16, low=low, high=high, dtype=dtype).numpy().astype(np.int64)
    assert values.dtype == np.int64 and values.min() >= low and values.max() < high
    _assert_fits(np.bincount(values & 63, minlength=64), np.full(64, 1 / 64))  # the low bits
    _assert_fits(np.bincount((values - low) * 16 // (high - low), minlength=16), np.full(16, 1 / 16))  # the high ones
    assert len(np.unique(values)) > (1 << 16) - 10  # (NumPy's draws repeat about once in 2**32 / 2**16 pairs)


def test_randint_small_ranges_follow_numpy():
    Tensor.manual_seed(1)
    values = Tensor.randint(60000, low=-3, high=4).numpy()
    reference = np.random.default_rng(0).integers(-3, 4, size=60000)
    assert values.dtype == np.int32 and set(np.unique(values)) == set(np.unique(reference))
    _assert_fits(np.bincount(values + 3, minlength=7), np.bincount(reference + 3, minlength=7) / reference.size)


def test_randint_takes_torchs_forms():
    Tensor.manual_seed(2)
    for drawn, low, high, shape in [
        (Tensor.randint(5, size=(3, 4)), 0, 5, (3, 4)),
        (Tensor.randint(2, 7, size=(200,)), 2, 7, (200,)),
        (Tensor.randint(size=(50,), low=-2, high=2), -2, 2, (50,)),
        (Tensor.randint(2, 7, (200,)), 2, 7, (200,)),
    ]:
        values = drawn.numpy()
        assert drawn.shape == shape and values.min() >= low and values.max() < high
        assert set(np.unique(values)) == set(range(low, high)) or values.size < 20
    assert Tensor.randint(5, size=(3, 4)).shape == tuple(torch.randint(5, size=(3, 4)).shape)
    with pytest.raises(TypeError, match=r"randint: got the bounds \(5,\) and low=1, high=None"):
        Tensor.randint(5, size=(3,), low=1)
    with pytest.raises(TypeError, match=r"randint: low and high must be ints, got low=0, high=2.5"):
        Tensor.randint(3, high=2.5)
    with pytest.raises(TypeError, match=r"randint\(\) got an unexpected keyword argument 'foo'"):
        Tensor.randint(3, foo=1)


def test_randint_dtypes_match_torch():
    Tensor.manual_seed(3)
    flags = Tensor.randint(0, 2, (400,), dtype=dtypes.bool)  # was int32
    assert (
        flags.dtype == dtypes.bool and flags.numpy().dtype == torch.randint(0, 2, (4,), dtype=torch.bool).numpy().dtype
    )
    assert 100 < flags.numpy().sum() < 300
    floats = Tensor.randint(-4, 4, (400,), dtype=dtypes.float32)
    assert floats.numpy().dtype == torch.randint(-4, 4, (4,), dtype=torch.float32).numpy().dtype
    np.testing.assert_array_equal(np.unique(floats.numpy()), np.arange(-4, 4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"randint: dtype=dtypes.bool holds 0 and 1 only, got low=0, high=3"):
        Tensor.randint(0, 3, (4,), dtype=dtypes.bool)
    with pytest.raises(OverflowError, match=r"randint: 299 does not fit in dtypes.uint8"):
        Tensor.randint(0, 300, (4,), dtype=dtypes.uint8)
    with pytest.raises(RuntimeError):  # torch: "to - 1 is out of bounds for unsigned char"
        torch.randint(0, 300, (4,), dtype=torch.uint8)


def test_randint_on_a_device_without_64_bit_ints(monkeypatch):
    device = Device[Device.DEFAULT]
    monkeypatch.setattr(device, "unsupported_dtypes", {dtypes.int64: "no 64-bit ints", dtypes.uint64: "no 64-bit ints"})
    Tensor.manual_seed(4)
    values = Tensor.randint(4096, low=-5, high=5).numpy()
    assert values.min() == -5 and values.max() == 4


def test_randperm_is_a_permutation_like_torchs():
    Tensor.manual_seed(5)
    drawn = Tensor.randperm(50)
    assert drawn.dtype == dtypes.int64 and drawn.numpy().dtype == torch.randperm(50).numpy().dtype
    np.testing.assert_array_equal(np.sort(drawn.numpy()), np.arange(50))
    assert not np.array_equal(drawn.numpy(), Tensor.randperm(50).numpy())
    assert Tensor.randperm(0).numpy().shape == (0,) and Tensor.randperm(6, dtype=dtypes.int32).dtype == dtypes.int32
    with pytest.raises(ValueError, match=r"randperm: n must be a non-negative int, got -1"):
        Tensor.randperm(-1)


def test_randperm_orders_are_equally_likely():
    Tensor.manual_seed(6)
    # the position of 0 in 600 permutations of 4: a quarter each
    first = [int(np.argmax(Tensor.randperm(4).numpy() == 0)) for _ in range(600)]
    _assert_fits(np.bincount(first, minlength=4), np.full(4, 0.25))


def test_multinomial_with_replacement_follows_the_weights():
    Tensor.manual_seed(7)
    weights = np.array([[1.0, 0.0, 6.0, 3.0, 0.0], [0.0, 0.0, 0.0, 2.0, 2.0]], np.float32)
    drawn = Tensor(weights).multinomial(20000, replacement=True)
    want = torch.multinomial(torch.tensor(weights), 20000, replacement=True)
    assert drawn.shape == tuple(want.shape) and drawn.numpy().dtype == want.numpy().dtype
    for row, samples in zip(weights, drawn.numpy()):
        _assert_fits(np.bincount(samples, minlength=5), row / row.sum())  # zero weights are never drawn
    one = Tensor([0.2, 0.8]).multinomial()
    assert one.shape == tuple(torch.multinomial(torch.tensor([0.2, 0.8]), 1).shape)


def test_multinomial_without_replacement_draws_in_sequence():
    Tensor.manual_seed(8)
    weights = np.array([1.0, 2.0, 0.0, 5.0], np.float32)
    drawn = Tensor(np.tile(weights, (6000, 1))).multinomial(2)
    assert drawn.shape == (6000, 2) and drawn.numpy().dtype == np.int64
    pairs = drawn.numpy()
    assert np.all(pairs[:, 0] != pairs[:, 1])
    # the odds of (i, j): w_i / W * w_j / (W - w_i)
    total = weights.sum()
    odds = np.array(
        [
            [wi / total * wj / (total - wi) if i != j else 0.0 for j, wj in enumerate(weights)]
            for i, wi in enumerate(weights)
        ]
    )
    _assert_fits(np.bincount(pairs[:, 0] * 4 + pairs[:, 1], minlength=16), odds.reshape(-1))
    every = Tensor(weights).multinomial(3).numpy()
    np.testing.assert_array_equal(np.sort(every), [0, 1, 3])


def test_multinomial_errors_match_torchs():
    for make, torch_make, error, message in [
        (lambda t: t.multinomial(5), lambda t: torch.multinomial(t, 5), ValueError, "cannot draw 5 samples without"),
        (lambda t: t.multinomial(0), lambda t: torch.multinomial(t, 0), ValueError, "num_samples must be a positive"),
        (
            lambda t: t.reshape(1, 1, 4).multinomial(1),
            lambda t: torch.multinomial(t.reshape(1, 1, 4), 1),
            ValueError,
            "needs a 1-D or 2-D tensor",
        ),
        (lambda t: t.int().multinomial(1), lambda t: torch.multinomial(t.int(), 1), TypeError, "needs float weights"),
    ]:
        with pytest.raises(error, match=f"multinomial: {message}"):
            make(Tensor([1.0, 2.0, 3.0, 4.0]))
        with pytest.raises(RuntimeError):
            torch_make(torch.tensor([1.0, 2.0, 3.0, 4.0]))
