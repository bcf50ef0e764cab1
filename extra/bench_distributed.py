"""All-reduce cost on 2 ranks of this machine, and a projection of data-parallel step times to many hosts.

Measured here, on 2 ranks (mpirun on one machine, so messages go through shared memory):

- the time of one all-reduce (sum of float32) for messages of 8 B … 64 MB: MPI itself (mpi4py on NumPy arrays),
  lazygrad's `distributed.all_reduce` (a realized tensor; with the handshake and the result's new buffer) and,
  when torch is installed, `torch.distributed.all_reduce` over gloo;
- a fit of each to the ring all-reduce cost on p = 2 ranks, t(n) = 2(p−1)·α + 2(p−1)/p · n·β = 2α + n·β, giving
  the latency α and the inverse bandwidth β;
- the compute time of one training step (forward, backward, Adam; TinyJit) of two models on one rank while the
  other waits: the digits MLP (64-32-10, batch 64) and a 25M-parameter MLP (1024-4096-4096-1024-10, batch 64);
- the same steps data-parallel on the 2 ranks (both ranks share this machine's cores).

Projected: the step time on p = 2 … 64 hosts joined by 10 and 100 Gb/s links, each host keeping the batch above
(weak scaling): compute (measured) + all-reduce of the gradients, with the ring cost per bucket of at most 25 MB,
buckets · 2(p−1)·α + 2(p−1)/p · n/B, plus lazygrad's per-bucket handshake, whose cost measured on 2 ranks is
taken (p−1) times (rank 0 exchanges a message with every other rank). α is the MPI latency measured here unless
`--alpha-us` gives a network's; nothing overlaps communication with compute.

    mpirun -n 2 python extra/bench_distributed.py [--quick] [--alpha-us 5]
    python extra/bench_distributed.py            # starts mpirun -n 2 itself
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lazygrad import Tensor, TinyJit, distributed, nn  # noqa: E402
from lazygrad.nn.optim import Adam  # noqa: E402
from lazygrad.nn.state import get_parameters  # noqa: E402

HOSTS = (2, 4, 8, 16, 32, 64)
LINKS_GBIT = (10, 100)


class MLP:
    """Linear layers with ReLU between them."""

    def __init__(self, *sizes: int):
        self.layers = [nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


MODELS = {"digits MLP 64-32-10": (64, 32, 10), "25M MLP 1024-4096-4096-1024-10": (1024, 4096, 4096, 1024, 10)}
BATCH = 64


def message_sizes(quick: bool) -> list[int]:
    sizes = [8 * 4**k for k in range(12)] + [64 * 2**20]  # 8 B, 32 B, ... 32 MB, 64 MB
    return sizes[::3] if quick else sizes


def measure(comm, calls: list, rounds: int, batch_seconds: float) -> list[float]:
    """Seconds per call of each of `calls`, on the slower rank. Each is timed in batches of about `batch_seconds`,
    going `rounds` times over the whole list, and keeps its fastest batch: the machine is shared, and interleaving
    the cases spreads a disturbance over all of them rather than spoiling one."""
    repeats = []
    for call in calls:
        call()  # warm: first-use costs (buffers, connections, compiles)
        comm.Barrier()
        start = time.perf_counter()
        call()
        once = time.perf_counter() - start
        repeats.append(comm.bcast(max(1, min(1000, int(batch_seconds / max(once, 1e-7)))), root=0))
    fastest = [math.inf] * len(calls)
    for _ in range(rounds):
        for number, (call, count) in enumerate(zip(calls, repeats)):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(count):
                call()
            fastest[number] = min(fastest[number], (time.perf_counter() - start) / count)
    return [max(times) for times in zip(*comm.allgather(fastest))]


def fit(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(α, β) of t(n) = 2α + n·β on 2 ranks, fitted to relative error (small and large messages count alike)."""
    times = np.array(seconds)
    rows = np.stack([np.ones_like(times), np.array(sizes, dtype=np.float64)], axis=1) / times[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(rows, np.ones_like(times), rcond=None)
    return max(intercept, 0.0) / 2, slope


def torch_group(comm):
    """torch.distributed over gloo on the same ranks, or None without torch."""
    try:
        import torch.distributed
    except ImportError:
        return None
    import socket

    port = None
    if comm.rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size
    )
    return torch.distributed


def step_function(model: MLP, parallel: bool):
    """One jitted training step: forward, cross-entropy, backward, (gradient averaging,) Adam."""
    if parallel:
        model = distributed.DataParallel(model)
    optimizer = Adam(get_parameters(model), lr=1e-3)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        optimizer.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        if parallel:
            Tensor.realize_all(loss, *(param.grad for param in optimizer.params))
            model.sync_gradients()
        Tensor.realize_all(loss, *optimizer.schedule_step())
        return loss

    return step


def step_seconds(sizes: tuple[int, ...], parallel: bool, steps: int) -> float:
    """Seconds of the fastest of `steps` training steps of the MLP, after three warm-up steps."""
    model = MLP(*sizes)
    step = step_function(model, parallel)
    generator = np.random.default_rng(0)
    x = Tensor(generator.standard_normal((BATCH, sizes[0])).astype(np.float32))
    y = Tensor(generator.integers(0, sizes[-1], BATCH).astype(np.int32))
    times = []
    for number in range(steps + 3):
        start = time.perf_counter()
        step(x, y).item()
        if number >= 3:
            times.append(time.perf_counter() - start)
    return min(times)


def ring_seconds(nbytes: int, hosts: int, alpha: float, bandwidth: float, handshake: float) -> float:
    """All-reduce of `nbytes` of gradients on `hosts` hosts, in buckets of at most 25 MB."""
    buckets = max(1, math.ceil(nbytes / distributed.BUCKET_BYTES))
    latency = buckets * 2 * (hosts - 1) * alpha
    transfer = 2 * (hosts - 1) / hosts * nbytes / bandwidth
    return latency + transfer + buckets * (hosts - 1) * handshake


def milliseconds(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def human_bytes(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    raise AssertionError


def all_reduce_times(comm, quick: bool) -> tuple[list[int], dict[str, list[float]]]:
    """The message sizes, and the seconds of one all-reduce of each size, per library."""
    torch_distributed = torch_group(comm)
    sizes = message_sizes(quick)
    libraries: dict[str, list] = {"MPI (mpi4py)": [], "lazygrad": []} | (
        {"torch gloo": []} if torch_distributed else {}
    )
    for nbytes in sizes:
        array = np.full(nbytes // 4, 1.0 + comm.rank, dtype=np.float32)
        tensor = Tensor(array).realize()
        assert distributed.all_reduce(tensor).numpy()[0] == 3.0
        libraries["MPI (mpi4py)"].append(functools.partial(comm.Allreduce, array, np.empty_like(array)))
        libraries["lazygrad"].append(functools.partial(distributed.all_reduce, tensor))
        if torch_distributed:
            import torch

            libraries["torch gloo"].append(functools.partial(torch_distributed.all_reduce, torch.tensor(array)))
    calls = [call for library in libraries.values() for call in library]
    rounds, batch_seconds = (3, 0.02) if quick else (9, 0.05)
    seconds = measure(comm, calls, rounds, batch_seconds)
    return sizes, {name: seconds[i * len(sizes) : (i + 1) * len(sizes)] for i, name in enumerate(libraries)}


def step_times(comm, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per model: a training step on one rank (while the other waits), and data-parallel on the 2 ranks."""
    computes, parallels = {}, {}
    for name, layer_sizes in MODELS.items():
        # the other rank waits in the barrier's handshake, asleep mostly, so the computing rank has the cores
        if comm.rank == 0:
            Tensor.manual_seed(0)
            computes[name] = step_seconds(layer_sizes, False, steps)
        distributed.barrier()
        distributed.init(seed=0, timeout=600)
        parallels[name] = max(comm.allgather(step_seconds(layer_sizes, True, steps)))
    return comm.bcast(computes, root=0), parallels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer message sizes and steps")
    parser.add_argument("--alpha-us", type=float, help="project with this network latency α (µs) instead")
    args = parser.parse_args()
    if not distributed.launched_by_mpirun():
        launcher = shutil.which("mpirun")
        if launcher is None:
            sys.exit("bench_distributed: needs mpirun (apt-get install openmpi-bin libopenmpi-dev)")
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        command = [launcher, *root, "--oversubscribe", "-n", "2", sys.executable, *sys.argv]
        sys.exit(subprocess.call(command))

    distributed.init(seed=0, timeout=600)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size != 2:
        sys.exit("bench_distributed: run it on 2 ranks (mpirun -n 2): the fit assumes p = 2")
    say = print if comm.rank == 0 else (lambda *_, **__: None)

    sizes, times = all_reduce_times(comm, args.quick)
    say("all-reduce (sum of float32) on 2 ranks of this machine, per call (each size's fastest batch):\n")
    say("| message | " + " | ".join(times) + " |")
    say("|---:|" + "---:|" * len(times))
    for number, nbytes in enumerate(sizes):
        cells = " | ".join(f"{seconds[number] * 1e6:,.1f} µs" for seconds in times.values())
        say(f"| {human_bytes(nbytes)} | {cells} |")
    mpi_alpha, mpi_beta = fit(sizes, times["MPI (mpi4py)"])
    lazygrad_alpha, lazygrad_beta = fit(sizes, times["lazygrad"])
    # lazygrad's own cost per collective (its handshake through rank 0, the result's new buffer): the difference of
    # the fitted fixed costs 2α
    handshake = max(0.0, 2 * (lazygrad_alpha - mpi_alpha))
    say(
        f"\nfit t(n) = 2α + n·β: MPI α = {mpi_alpha * 1e6:.2f} µs, 1/β = {1 / mpi_beta / 1e9:.2f} GB/s; "
        f"lazygrad α = {lazygrad_alpha * 1e6:.2f} µs, 1/β = {1 / lazygrad_beta / 1e9:.2f} GB/s "
        f"(its handshake and bookkeeping: {handshake * 1e6:.1f} µs per collective)"
    )

    computes, parallels = step_times(comm, 5 if args.quick else 10)
    alpha = args.alpha_us * 1e-6 if args.alpha_us is not None else mpi_alpha
    say(
        f"\nprojected step time (ms) and scaling efficiency (compute / step) on p hosts, each with batch {BATCH}; "
        f"α = {alpha * 1e6:.2f} µs{' (given)' if args.alpha_us is not None else ' (measured here)'}, "
        f"handshake {handshake * 1e6:.1f} µs × (p−1) per bucket, no overlap of communication and compute:\n"
    )
    say("| model | gradients | compute, 1 rank | 2 ranks here | link | " + " | ".join(f"p = {p}" for p in HOSTS) + " |")
    say("|---|---:|---:|---:|---|" + "---:|" * len(HOSTS))
    for name, layer_sizes in MODELS.items():
        parameters = sum(a * b + b for a, b in zip(layer_sizes, layer_sizes[1:]))
        nbytes = 4 * parameters
        for link in LINKS_GBIT:
            cells = []
            for hosts in HOSTS:
                step = computes[name] + ring_seconds(nbytes, hosts, alpha, link * 1e9 / 8, handshake)
                cells.append(f"{milliseconds(step)} ({100 * computes[name] / step:.0f}%)")
            say(
                f"| {name} | {parameters:,}, {human_bytes(nbytes)} | {milliseconds(computes[name])} ms | "
                f"{milliseconds(parallels[name])} ms | {link} Gb/s | " + " | ".join(cells) + " |"
            )


if __name__ == "__main__":
    main()
