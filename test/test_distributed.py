"""Tests of lazygrad.distributed (data-parallel training over MPI).

Most tests run as ranks of one job and skip in a plain pytest run:

    mpirun --allow-run-as-root --oversubscribe -n 2 python -m pytest -q test/test_distributed.py

They check every collective against NumPy (each rank regenerates every rank's input), on every device that runs
here, inside TinyJit and with bad input; and that 2 ranks sharing a global batch reproduce one process's training
of the digits MLP. The tests that start mpirun themselves (a rank killed, raising or hung; extra/train_digits.py)
and those that need no MPI job run in a plain pytest run and skip under mpirun.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from lazygrad import Device, Tensor, TinyJit, distributed, dtypes, nn
from lazygrad.device import DeviceUnavailable
from lazygrad.nn import optim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
MPIRUN = shutil.which("mpirun")
UNDER_MPIRUN = distributed.launched_by_mpirun()

under_mpirun = pytest.mark.skipif(
    not (HAVE_MPI4PY and UNDER_MPIRUN),
    reason="runs as ranks of an MPI job: mpirun -n 2 python -m pytest test/test_distributed.py (needs mpi4py)",
)
spawns_mpirun = pytest.mark.skipif(
    not HAVE_MPI4PY or MPIRUN is None or UNDER_MPIRUN,
    reason="starts mpirun itself: needs mpi4py and mpirun (pip install 'lazygrad[distributed]'), not under mpirun",
)


@pytest.fixture(scope="module")
def world() -> tuple[int, int]:
    """(rank, world size) of the job, initialized once for the module."""
    distributed.init(seed=0, timeout=60)
    return distributed.rank(), distributed.world_size()


def rank_data(rank: int, shape: tuple, dtype: str) -> np.ndarray:
    """Rank `rank`'s input: every rank can compute every other rank's."""
    generator = np.random.default_rng(100 + rank)
    if dtype == "bool":
        return generator.random(shape) < 0.5
    if dtype in ("int32", "int64", "uint32"):
        return generator.integers(0, 1000, shape).astype(dtype)
    return (generator.standard_normal(shape) * 10).astype(dtype)


def all_ranks(size: int, shape: tuple, dtype: str) -> np.ndarray:
    return np.stack([rank_data(r, shape, dtype) for r in range(size)])


# ---- collectives against NumPy ---------------------------------------------------------------------------------

REDUCTIONS = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}
CASES = [
    *((op, "float32") for op in REDUCTIONS),
    *((op, "float16") for op in REDUCTIONS),
    *((op, "int32") for op in ("sum", "max", "min")),
    ("sum", "int64"),
    ("max", "uint32"),
    ("max", "bool"),
    ("min", "bool"),
]


@under_mpirun
@pytest.mark.parametrize("op, dtype", CASES)
def test_all_reduce_matches_numpy(world, op, dtype):
    rank, size = world
    inputs = all_ranks(size, (3, 5), dtype)
    result = distributed.all_reduce(Tensor(inputs[rank], dtype=dtype), op)
    # float16 travels as float32 (MPI has no half type): the reduction is rounded to half once, at the end
    wide = inputs.astype(np.float32) if dtype == "float16" else inputs
    expected = REDUCTIONS[op](wide, axis=0).astype(dtype)
    assert result.shape == (3, 5) and result.dtype == dtypes.from_numpy(np.dtype(dtype))
    if dtype.startswith("float"):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-3 if dtype == "float16" else 1e-6)
    else:
        np.testing.assert_array_equal(result.numpy(), expected)


@under_mpirun
def test_all_reduce_of_a_lazy_view_and_of_edge_shapes(world):
    rank, size = world
    inputs = all_ranks(size, (4, 6), "float32")
    view = (Tensor(inputs[rank]) * 2).T[1:3]  # computed and laid out before it is sent
    np.testing.assert_allclose(distributed.all_reduce(view).numpy(), (inputs * 2).sum(0).T[1:3], rtol=1e-6)
    scalar = distributed.all_reduce(Tensor(float(rank + 1)), "max")
    assert scalar.shape == () and scalar.item() == size
    empty = distributed.all_reduce(Tensor.zeros(0, 3))
    assert empty.shape == (0, 3) and empty.numpy().size == 0


@under_mpirun
def test_broadcast_matches_numpy(world):
    rank, size = world
    for src in range(size):
        inputs = all_ranks(size, (2, 7), "float32")
        result = distributed.broadcast(Tensor(inputs[rank]), src=src)
        np.testing.assert_array_equal(result.numpy(), inputs[src])
    ints = all_ranks(size, (5,), "int64")
    np.testing.assert_array_equal(distributed.broadcast(Tensor(ints[rank], dtype="int64")).numpy(), ints[0])


@under_mpirun
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
def test_all_gather_matches_numpy(world, dtype):
    rank, size = world
    inputs = all_ranks(size, (3, 2), dtype)
    result = distributed.all_gather(Tensor(inputs[rank], dtype=dtype))
    assert result.shape == (size, 3, 2)
    np.testing.assert_array_equal(result.numpy(), inputs)


@under_mpirun
@pytest.mark.parametrize("device", ["LLVM", "CPU", "GPU", "CUDA", "PYTHON"])
def test_collectives_on_every_device(world, device):
    """Host devices hand MPI their own memory; the others (OpenCL, a real GPU) go through host staging."""
    rank, size = world
    try:
        Device[device]
    except (DeviceUnavailable, ImportError) as error:  # the same on every rank, so they all skip
        pytest.skip(str(error))
    inputs = all_ranks(size, (4, 3), "float32")
    tensor = Tensor(inputs[rank], device=device)
    reduced = distributed.all_reduce(tensor, "mean")
    gathered = distributed.all_gather(tensor)
    broadcast = distributed.broadcast(tensor + 1, src=size - 1)
    assert {reduced.device, gathered.device, broadcast.device} == {device}
    np.testing.assert_allclose(reduced.numpy(), inputs.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(gathered.numpy(), inputs)
    np.testing.assert_array_equal(broadcast.numpy(), inputs[size - 1] + 1)


@under_mpirun
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_all_reduce_max_and_min_are_nan_where_any_rank_has_nan(world, op, dtype):
    rank, size = world
    inputs = all_ranks(size, (size + 1, 3), "float32")
    for r in range(size):
        inputs[r, r, 0] = np.nan  # row r: NaN on rank r only (MPI's MAX and MIN kept it on one side only)
    inputs[:, size, 1] = np.nan  # NaN on every rank
    inputs[0, size, 2] = np.inf if op == "max" else -np.inf  # an infinity is a number
    result = distributed.all_reduce(Tensor(inputs[rank], dtype=dtype), op)
    expected = REDUCTIONS[op](inputs, axis=0).astype(dtype)  # NumPy's, like Tensor.max: NaN wins
    assert result.dtype == dtypes.from_numpy(np.dtype(dtype))
    np.testing.assert_array_equal(np.isnan(result.numpy()), np.isnan(expected))
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-3 if dtype == "float16" else 1e-6)


class RecordingComm:
    """The job's communicator, noting each MPI collective it makes in `log`."""

    def __init__(self, comm, log: list):
        self.comm, self.log = comm, log

    def __getattr__(self, name: str):
        attribute = getattr(self.comm, name)
        if name not in ("Allreduce", "Allgather", "Bcast"):
            return attribute

        def collective(*args, **kwargs):
            self.log.append(name)
            return attribute(*args, **kwargs)

        return collective


@under_mpirun
def test_gpu_memory_goes_to_mpi_only_after_the_device_synchronizes(world, monkeypatch):
    """With a CUDA-aware MPI, GPU memory goes to MPI by its address, while the kernels that write it may still be
    queued (CUDA launches return at once): the device must synchronize first. Here the default device poses as
    such a GPU: no host memory of its own, an address for MPI, and a synchronize that is logged."""
    rank, size = world
    device, log = Device[Device.DEFAULT], []
    monkeypatch.setattr(distributed, "_mpi_moves_gpu_memory", lambda: True)
    monkeypatch.setattr(distributed, "_host_bytes", lambda buffer: None)
    monkeypatch.setattr(device.allocator, "gpu_address", lambda handle: handle.address)
    monkeypatch.setattr(device, "synchronize", lambda: log.append("synchronize"), raising=False)
    monkeypatch.setattr(distributed._world, "comm", RecordingComm(distributed._world.comm, log))
    inputs = all_ranks(size, (4, 3), "float32")
    reduced = distributed.all_reduce(Tensor(inputs[rank]) * 2)
    gathered = distributed.all_gather(Tensor(inputs[rank]) + 1)
    assert log.count("Allreduce") == log.count("Allgather") == 1, log
    assert all(log[i - 1] == "synchronize" for i, event in enumerate(log) if event != "synchronize"), log
    np.testing.assert_allclose(reduced.numpy(), (inputs * 2).sum(0), rtol=1e-6)
    np.testing.assert_array_equal(gathered.numpy(), inputs + 1)


@under_mpirun
def test_barrier_waits_for_every_rank(world):
    rank, size = world
    if rank == size - 1:
        time.sleep(0.5)
    entered = time.time()
    distributed.barrier()
    left = time.time()
    times = distributed.all_gather(Tensor([entered, left], dtype=dtypes.float64)).numpy()
    assert times[:, 1].min() >= times[:, 0].max(), (
        f"a rank went past the barrier before the last one reached it: {times}"
    )


@under_mpirun
def test_jit_replays_collectives_between_kernels(world):
    rank, size = world

    @TinyJit
    def step(x: Tensor) -> tuple[Tensor, Tensor]:
        total = distributed.all_reduce(x * 2)  # a kernel, the all-reduce, then kernels reading its result
        return (total + 1).realize(), distributed.broadcast(total - x, src=0).realize()

    for call in range(5):
        inputs = all_ranks(size, (6,), "float32") + call
        first, second = step(Tensor(inputs[rank]))
        total = (inputs * 2).sum(0)
        np.testing.assert_allclose(first.numpy(), total + 1, rtol=1e-6)
        np.testing.assert_allclose(second.numpy(), total - inputs[0], rtol=1e-6)
    assert sum(launch.host is not None for launch in step.launches) == 2, "both collectives are in the capture"


@under_mpirun
def test_jit_replays_a_barrier(world):
    rank, size = world

    @TinyJit
    def step(x: Tensor) -> Tensor:
        distributed.barrier()
        return (x + 1).realize()

    for call in range(4):
        if rank == size - 1:
            time.sleep(0.3)
        # (the ranks share the machine's clock: no rank leaves a call before the last one entered it, however long a
        # busy machine holds a rank between calls, which a threshold on one rank's wait did not tell apart)
        entered = time.time()
        np.testing.assert_allclose(step(Tensor([float(call)])).numpy(), [call + 1.0])
        left = time.time()
        times = distributed.all_gather(Tensor([entered, left], dtype=dtypes.float64)).numpy()
        assert times[:, 1].min() >= times[:, 0].max(), f"call {call}: a rank went past the barrier alone: {times}"
    assert sum(launch.host is not None for launch in step.launches) == 1, "the barrier is in the capture"


# ---- errors ----------------------------------------------------------------------------------------------------


@under_mpirun
def test_ranks_with_different_shapes_raise_naming_both(world):
    rank, size = world
    with pytest.raises(distributed.DistributedError) as error:
        distributed.all_reduce(Tensor.ones(3, 4) if rank == 0 else Tensor.ones(4, 3))
    message = str(error.value)
    assert "rank 0" in message and "rank 1" in message
    assert "float32 (3, 4)" in message and "float32 (4, 3)" in message
    # every rank raised at the same collective, so the job goes on in step
    assert distributed.all_reduce(Tensor([1.0])).item() == size


@under_mpirun
def test_ranks_with_different_dtypes_or_collectives_raise_naming_both(world):
    rank, size = world
    with pytest.raises(distributed.DistributedError, match=r"rank 0 .*float32 \(5,\).*rank 1 .*int32 \(5,\)"):
        distributed.all_gather(Tensor.ones(5) if rank == 0 else Tensor.ones(5, dtype="int32"))
    with pytest.raises(distributed.DistributedError, match=r"rank 0 calls all_reduce.*rank 1 calls broadcast"):
        x = Tensor.ones(2)
        distributed.all_reduce(x) if rank == 0 else distributed.broadcast(x)
    assert distributed.all_reduce(Tensor([2])).item() == 2 * size


@under_mpirun
def test_bad_arguments_say_what_to_do(world):
    x = Tensor.ones(3)
    with pytest.raises(ValueError, match="op must be one of 'sum', 'mean', 'max', 'min', got 'avg'"):
        distributed.all_reduce(x, "avg")
    with pytest.raises(TypeError, match=r"op='mean' needs a float tensor, got dtypes.int32; cast it with .float\(\)"):
        distributed.all_reduce(x.int(), "mean")
    with pytest.raises(TypeError, match="op='sum' of a bool tensor: cast it to int32 to count"):
        distributed.all_reduce(x > 0)
    with pytest.raises(ValueError, match=rf"src=7 is not a rank of this job \(ranks 0..{world[1] - 1}\)"):
        distributed.broadcast(x, src=7)
    with pytest.raises(TypeError, match="expected a Tensor, got list"):
        distributed.all_gather([1.0, 2.0])
    with pytest.raises(ValueError, match="the global batch of 5 does not split evenly over 2 ranks"):
        distributed.ShardedSampler(100, 5, rank=0, world_size=2)


@under_mpirun
def test_a_bad_argument_on_one_rank_raises_on_every_rank(world):
    """A call only one rank's own checks refuse (a dtype, an op, a src) raises DistributedError naming both sides
    on every rank, at once: the other ranks' collective would otherwise wait for it until the timeout."""
    rank, size = world
    x = Tensor.ones(2)
    calls = {
        r"rank 0 calls all_reduce\(float32 \(2,\), op='mean'\).*rank 1 calls all_reduce\(int32 \(2,\), op='mean'\)": (
            lambda: distributed.all_reduce(x if rank == 0 else x.int(), "mean")
        ),
        r"rank 0 calls all_reduce\(float32 \(2,\), op='sum'\).*rank 1 calls all_reduce\(float32 \(2,\), op='avg'\)": (
            lambda: distributed.all_reduce(x, "sum" if rank == 0 else "avg")
        ),
        r"rank 0 calls broadcast\(float32 \(2,\), src=0\).*rank 1 calls broadcast\(float32 \(2,\), src=7\)": (
            lambda: distributed.broadcast(x, src=0 if rank == 0 else 7)
        ),
        r"rank 0 calls all_gather\(float32 \(2,\)\).*rank 1 calls all_gather\(list\)": (
            lambda: distributed.all_gather(x if rank == 0 else [1.0, 1.0])
        ),
    }
    for message, call in calls.items():
        start = time.monotonic()
        with pytest.raises(distributed.DistributedError, match=message) as error:
            call()
        assert time.monotonic() - start < 10, "every rank raised at once"
        assert ("on this rank: distributed." in str(error.value)) == (rank != 0), "the refusing ranks say why"
    assert distributed.all_reduce(Tensor([1.0])).item() == size


def test_collectives_before_init_say_so(monkeypatch):
    monkeypatch.setattr(distributed, "_world", None)
    for call in (
        lambda: distributed.all_reduce(Tensor.ones(2)),
        lambda: distributed.broadcast(Tensor.ones(2)),
        lambda: distributed.all_gather(Tensor.ones(2)),
        distributed.barrier,
        distributed.rank,
        lambda: distributed.sync_gradients([Tensor.ones(2)]),
    ):
        with pytest.raises(distributed.DistributedError, match=r"call distributed.init\(\) first"):
            call()


def test_init_without_mpi4py_says_how_to_install(monkeypatch):
    monkeypatch.setattr(distributed, "_world", None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # what `import mpi4py` sees when it is not installed
    with pytest.raises(ImportError, match=r"pip install 'lazygrad\[distributed\]'"):
        distributed.init()


def test_lazygrad_imports_without_mpi4py():
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"
        "from lazygrad import Tensor, distributed\n"
        "print((Tensor([1.0, 2.0]) * 3).tolist(), distributed.launched_by_mpirun())"
    )
    # (the project first, and what the caller's path holds after it: where pyopencl is, for GPU=1)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    for variable in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        environment.pop(variable, None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[3.0, 6.0] False"


# ---- data-parallel training --------------------------------------------------------------------------------------


class DigitsMLP:
    """64 → 32 → 10 on scikit-learn's 8×8 digits."""

    def __init__(self):
        self.hidden, self.out = nn.Linear(64, 32), nn.Linear(32, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.out(self.hidden(x).relu())


def digits() -> tuple[np.ndarray, np.ndarray]:
    datasets = pytest.importorskip("sklearn.datasets", reason="the digits come with scikit-learn")
    data = datasets.load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int32)


def train(make_optimizer, steps: int, rank: int, size: int, parallel: bool, jit: bool, bucket_bytes=None):
    """Train the digits MLP with global batches of 64 (this rank's share of each); the loss of each step over the
    whole global batch, and the final parameters."""
    images, labels = digits()
    if parallel:
        distributed.init(seed=0, timeout=60)  # rank 0 draws what a single process would, the others differ
        model = distributed.DataParallel(DigitsMLP(), **({"bucket_bytes": bucket_bytes} if bucket_bytes else {}))
        params = model.parameters
    else:
        Tensor.manual_seed(0)
        model = DigitsMLP()
        params = nn.state.get_parameters(model)
    optimizer = make_optimizer(params)

    def step(x: Tensor, y: Tensor) -> Tensor:
        optimizer.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        if parallel:
            model.sync_gradients()
            loss = distributed.all_reduce(loss, "mean")  # the shards are equal, so this is the global batch's
        Tensor.realize_all(loss, *optimizer.schedule_step())
        return loss

    step = TinyJit(step) if jit else step
    sampler = distributed.ShardedSampler(len(images), 64, rank if parallel else 0, size if parallel else 1)
    losses = []
    while len(losses) < steps:
        for batch in sampler:
            losses.append(step(Tensor(images[batch]), Tensor(labels[batch])).item())
            if len(losses) == steps:
                break
    return np.array(losses), [param.numpy() for param in params]


@under_mpirun
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "TinyJit"])
def test_two_ranks_reproduce_one_process_digits_training(world, jit):
    rank, size = world
    reference, reference_params = train(lambda p: optim.Adam(p, lr=1e-2), 50, rank, size, False, jit)
    losses, params = train(lambda p: optim.Adam(p, lr=1e-2), 50, rank, size, True, jit)
    assert reference[-1] < 0.5 * reference[0], "the reference run learns"
    np.testing.assert_allclose(losses, reference, atol=1e-4, rtol=0)
    for ours, theirs in zip(params, reference_params):
        np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
    # and every rank holds the same weights
    gathered = distributed.all_gather(Tensor(params[0])).numpy()
    assert all(np.array_equal(gathered[0], gathered[r]) for r in range(size))


OPTIMIZERS = {
    "SGD": lambda p: optim.SGD(p, lr=0.1),
    "SGD-momentum-nesterov-decay": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "Adam": lambda p: optim.Adam(p, lr=1e-2),
    "AdamW": lambda p: optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "LAMB": lambda p: optim.LAMB(p, lr=1e-2, weight_decay=0.01),
}


@under_mpirun
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_trains_as_one_process(world, name):
    rank, size = world
    reference, reference_params = train(OPTIMIZERS[name], 6, rank, size, False, jit=True)
    # 1 KiB buckets: the MLP's gradients travel in several messages
    losses, params = train(OPTIMIZERS[name], 6, rank, size, True, jit=True, bucket_bytes=1024)
    np.testing.assert_allclose(losses, reference, atol=1e-5, rtol=0)
    for ours, theirs in zip(params, reference_params):
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@under_mpirun
def test_sync_gradients_averages_in_buckets(world):
    rank, size = world
    shapes = [(3, 4), (7,), (2, 2, 2), (5,)]
    params = [Tensor.zeros(*shape, requires_grad=True) for shape in shapes]
    halves = [Tensor.zeros(3, dtype="float16", requires_grad=True)]
    for param in params + halves:
        param.grad = Tensor(rank_data(rank, param.shape, "float32")).cast(param.dtype)
    # 64-byte buckets: (3, 4) alone, then (7,) + (2, 2, 2)... and the float16 gradient in a bucket of its own
    buckets = list(distributed._buckets([param.grad for param in params + halves], 64))
    assert buckets == [[0], [1, 2], [3], [4]]
    distributed.sync_gradients(params + halves, bucket_bytes=64)
    for param in params + halves:
        inputs = all_ranks(size, param.shape, "float32").astype(param.dtype.np)
        assert param.grad.dtype == param.dtype
        np.testing.assert_allclose(param.grad.numpy(), inputs.astype(np.float32).mean(0), rtol=1e-3)


@under_mpirun
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "TinyJit"])
def test_sync_gradients_counts_a_gradient_missing_on_some_ranks_as_zero(world, jit):
    """Rank r uses expert r % 2 only, and no rank expert 2: the experts have one shape, so only their positions tell
    their gradients apart (averaging expert 0's with expert 1's went unnoticed)."""
    rank, size = world
    experts = [Tensor.zeros(2, 3, requires_grad=True) for _ in range(3)]
    shared = Tensor.zeros(4, requires_grad=True)
    params = [*experts, shared]

    def step(x: Tensor, y: Tensor) -> None:
        for param in params:
            param.grad = None
        ((experts[rank % 2] * x).sum() + (shared * y).sum()).backward()
        distributed.sync_gradients(params)
        Tensor.realize_all(*(param.grad for param in params if param.grad is not None))

    step = TinyJit(step) if jit else step
    for call in range(4):
        xs, ys = all_ranks(size, (2, 3), "float32") + call, all_ranks(size, (4,), "float32") - call
        step(Tensor(xs[rank]), Tensor(ys[rank]))
        for expert in (0, 1):  # zeros from the ranks that did not use it, as PyTorch's DDP (find_unused_parameters)
            users = np.array([r % 2 == expert for r in range(size)])
            np.testing.assert_allclose(experts[expert].grad.numpy(), xs[users].sum(0) / size, rtol=1e-6)
        assert experts[2].grad is None, "no rank has a gradient for it"
        np.testing.assert_allclose(shared.grad.numpy(), ys.mean(0), rtol=1e-6)


@under_mpirun
def test_sync_gradients_of_different_parameter_lists_raise_naming_both(world):
    rank, size = world
    params = [Tensor.zeros(2, requires_grad=True) for _ in range(3 if rank == 0 else 2)]
    for param in params:
        param.grad = Tensor.ones(2)
    with pytest.raises(
        distributed.DistributedError,
        match=r"rank 0 calls sync_gradients\(3 parameters\).*rank 1 calls sync_gradients\(2 parameters\)",
    ):
        distributed.sync_gradients(params)
    assert distributed.all_reduce(Tensor([1.0])).item() == size


@under_mpirun
def test_uneven_batches_give_the_whole_batch_gradient_once_the_loss_is_scaled(world):
    """The mean over ranks of each rank's mean-loss gradient (as PyTorch's DDP): with uneven local batches, the
    README's fix (scale the loss by local_count * world_size / total_count) gives the whole batch's gradient."""
    rank, size = world
    counts = [5, 3, *([4] * (size - 2))]
    data = np.arange(sum(counts), dtype=np.float32)
    parts = np.split(data, np.cumsum(counts)[:-1])
    w = Tensor([1.0], requires_grad=True)
    (Tensor(parts[rank]) * w).mean().backward()
    distributed.sync_gradients([w])
    np.testing.assert_allclose(w.grad.numpy(), [np.mean([part.mean() for part in parts])], rtol=1e-6)
    total = distributed.all_reduce(Tensor([counts[rank]])).item()
    w.grad = None
    ((Tensor(parts[rank]) * w).mean() * (counts[rank] * size / total)).backward()
    distributed.sync_gradients([w])
    np.testing.assert_allclose(w.grad.numpy(), [data.mean()], rtol=1e-6)


class NormedLinear:
    """A linear layer and batch norm: running statistics that each rank's forward updates."""

    def __init__(self):
        self.linear, self.norm = nn.Linear(3, 4), nn.BatchNorm(4)

    def __call__(self, x: Tensor) -> Tensor:
        return self.norm(self.linear(x))


@under_mpirun
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "TinyJit"])
def test_data_parallel_gives_every_rank_rank_0_running_statistics(world, jit):
    rank, size = world
    model = distributed.DataParallel(NormedLinear())
    optimizer = optim.SGD([param for param in model.parameters if param.requires_grad is not False], lr=0.1)

    def step(x: Tensor) -> None:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        model.sync_gradients()
        Tensor.realize_all(*optimizer.schedule_step())

    step = TinyJit(step) if jit else step
    mean, var, norm = np.zeros(4), np.ones(4), model.model.norm
    for call in range(4):
        batches = [
            np.random.default_rng(10 * call + r).standard_normal((6, 3)).astype(np.float32) + r for r in range(size)
        ]
        # every rank keeps the statistics of rank 0's batch (PyTorch's DDP broadcasts rank 0's buffers)
        hidden = batches[0] @ model.model.linear.weight.numpy().T + model.model.linear.bias.numpy()
        mean, var = 0.9 * mean + 0.1 * hidden.mean(0), 0.9 * var + 0.1 * hidden.var(0, ddof=1)
        with Tensor.train():
            step(Tensor(batches[rank]))
        np.testing.assert_allclose(norm.running_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(norm.running_var.numpy(), var, rtol=1e-5, atol=1e-6)
        assert norm.num_batches_tracked.numpy().tolist() == [call + 1]
    weights = distributed.all_gather(model.model.linear.weight).numpy()
    assert all(np.array_equal(weights[0], weights[r]) for r in range(size))


@under_mpirun
def test_data_parallel_state_dict_is_the_models(world):
    rank, size = world
    model = DigitsMLP()
    parallel = distributed.DataParallel(model)
    state = nn.state.get_state_dict(parallel)
    assert list(state) == ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    assert all(state[name] is tensor for name, tensor in nn.state.get_state_dict(model).items())
    bare = DigitsMLP()
    nn.state.load_state_dict(bare, state)  # strict: no key missing or left over
    for name, tensor in nn.state.get_state_dict(bare).items():
        np.testing.assert_array_equal(tensor.numpy(), state[name].numpy())


@under_mpirun
def test_numpy_integers_are_ranks_and_seeds(world):
    rank, size = world
    inputs = all_ranks(size, (3,), "float32")
    result = distributed.broadcast(Tensor(inputs[rank]), src=np.int64(size - 1))
    np.testing.assert_array_equal(result.numpy(), inputs[size - 1])
    params = [Tensor(inputs[rank])]
    distributed.broadcast_parameters(params, src=np.int32(size - 1))
    np.testing.assert_array_equal(params[0].numpy(), inputs[size - 1])
    distributed.init(seed=np.int64(3), timeout=60)
    drawn = Tensor.rand(4).numpy()
    distributed.init(seed=3, timeout=60)
    np.testing.assert_array_equal(Tensor.rand(4).numpy(), drawn)


@under_mpirun
def test_data_parallel_starts_every_rank_from_rank_0_parameters(world):
    rank, size = world
    Tensor.manual_seed(5)
    single = DigitsMLP()  # what one process seeded with 5 draws
    distributed.init(seed=5, timeout=60)
    model = DigitsMLP()
    drawn = distributed.all_gather(model.hidden.weight).numpy()
    assert len({row.tobytes() for row in drawn}) == size, "each rank draws from its own random stream"
    parallel = distributed.DataParallel(model)
    assert parallel.model is model and parallel(Tensor.ones(1, 64)).shape == (1, 10)
    for ours, theirs in zip(parallel.parameters, nn.state.get_parameters(single)):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@under_mpirun
def test_rank_random_streams_are_reproducible(world):
    rank, size = world
    Tensor.manual_seed(3)
    single = Tensor.rand(8).numpy()
    distributed.init(seed=3, timeout=60)
    first = Tensor.rand(8).numpy()
    distributed.init(seed=3, timeout=60)
    again = Tensor.rand(8).numpy()
    np.testing.assert_array_equal(first, again)
    gathered = distributed.all_gather(Tensor(first)).numpy()
    np.testing.assert_array_equal(gathered[0], single)
    assert len({row.tobytes() for row in gathered}) == size, "every rank draws different numbers"


def test_sharded_sampler_splits_each_global_batch():
    size, batch = 103, 12
    single = distributed.ShardedSampler(size, batch, seed=4)
    expected = np.random.default_rng(4)
    for _ in range(2):  # one process: the batches of one shuffle per epoch, in order
        order = expected.permutation(size)
        np.testing.assert_array_equal(np.concatenate(list(single)), order[: len(single) * batch])
    for ranks in (2, 3, 4):
        samplers = [distributed.ShardedSampler(size, batch, rank, ranks, seed=4) for rank in range(ranks)]
        reference = distributed.ShardedSampler(size, batch, seed=4)
        for _ in range(2):
            for global_batch, *shards in zip(reference, *samplers):
                assert all(len(shard) == batch // ranks for shard in shards)
                np.testing.assert_array_equal(np.concatenate(shards), global_batch)
                assert len(set(np.concatenate(shards))) == batch, "the ranks' shards are disjoint"


# ---- faults: tests that start mpirun themselves ------------------------------------------------------------------

FAULT_SCRIPT = """
import os, signal, sys, time
from lazygrad import Tensor, distributed
def mark(event):  # a file per rank and event: the ranks' printed lines can interleave mid-line
    with open(os.path.join({folder!r}, "rank" + os.environ["OMPI_COMM_WORLD_RANK"] + "." + event), "w") as file:
        file.write(repr(time.time()))
mark("starts")
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
    {before_init}
distributed.init(timeout={timeout})
assert distributed.all_reduce(Tensor([1.0])).item() == 2
if distributed.rank() == 1:
    {fault}
mark("enters")
distributed.all_reduce(Tensor([2.0])).numpy()
print("rank", distributed.rank(), "came back", flush=True)
"""


def run_job(tmp_path, fault: str, timeout: float, before_init: str = "pass") -> tuple[int, str, float]:
    """Run FAULT_SCRIPT on 2 ranks; its exit code, its output, and the seconds from rank 0 entering the collective
    to the job's end."""
    script = tmp_path / "job.py"
    script.write_text(FAULT_SCRIPT.format(timeout=timeout, fault=fault, before_init=before_init, folder=str(tmp_path)))
    command = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, str(script)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    job = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment, timeout=240
    )
    entered = next(
        (tmp_path / f"rank0.{event}" for event in ("enters", "starts") if (tmp_path / f"rank0.{event}").exists()), None
    )
    assert entered is not None, job.stdout
    return job.returncode, job.stdout, time.time() - float(entered.read_text())


@spawns_mpirun
def test_killed_rank_ends_the_job_within_the_timeout(tmp_path):
    code, output, seconds = run_job(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)", timeout=20)
    assert code != 0 and "came back" not in output
    assert re.search(r"process rank 1 .* exited on signal 9", output), output
    assert seconds < 20, f"rank 0 waited {seconds:.1f} s"


@spawns_mpirun
def test_raising_rank_ends_the_job_at_once(tmp_path):
    code, output, seconds = run_job(tmp_path, "raise ValueError('rank 1 fails on purpose')", timeout=20)
    assert code != 0 and "came back" not in output
    assert "ValueError: rank 1 fails on purpose" in output
    assert "lazygrad.distributed: rank 1 of 2: raised ValueError (traceback above); aborting every rank" in output
    assert seconds < 20, f"rank 0 waited {seconds:.1f} s"


@spawns_mpirun
def test_hung_rank_is_named_after_the_timeout(tmp_path):
    code, output, seconds = run_job(tmp_path, "time.sleep(1000)", timeout=3)
    assert code != 0 and "came back" not in output
    assert (
        "lazygrad.distributed: rank 0 of 2: all_reduce(float32 (1,), op='sum'), collective #3, timed out after 3 s: "
        "rank 1 did not reach it" in output
    ), output
    assert 3 <= seconds < 30, f"the job ended {seconds:.1f} s after rank 0 entered the collective"


@spawns_mpirun
def test_rank_that_never_calls_init_ends_the_job_after_the_timeout(tmp_path):
    code, output, seconds = run_job(tmp_path, "pass", timeout=3, before_init="time.sleep(1000)")
    assert code != 0 and "came back" not in output
    assert re.search(r"Timeout \(0:00:03\)!.*line \d+ in _start_mpi.*line \d+ in init", output, re.DOTALL), output
    assert 3 <= seconds < 30, f"the job ended {seconds:.1f} s after rank 0 started"


@spawns_mpirun
def test_train_digits_under_mpirun_prints_one_accuracy(tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("tqdm")
    weights = tmp_path / "digits.safetensors"
    command = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable]
    command += [os.path.join(ROOT, "extra", "train_digits.py"), "--epochs", "2", "--out", str(weights)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    accuracies = re.findall(r"test accuracy: ([\d.]+)%", result.stdout)
    assert len(accuracies) == 1, result.stdout
    assert float(accuracies[0]) > 70, result.stdout  # two epochs: well above chance (10%)
    assert weights.exists()
