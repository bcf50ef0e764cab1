"""The 784-512-512-10 MLP training step (batch 256, cross-entropy, backward, SGD) with TinyJit, timed beside the
same step in PyTorch (CPU) when it is installed.

    python extra/mlp_step.py [--steps N]

Prints the first (cold) step's time, the warm median, kernels per step, and PyTorch's warm median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from lazygrad import GlobalCounters, Tensor, TinyJit, nn
from lazygrad.nn.optim import SGD
from lazygrad.nn.state import get_parameters


def lazygrad_step(images: np.ndarray, labels: np.ndarray, steps: int) -> tuple[float, float, int]:
    Tensor.manual_seed(0)
    layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]
    optimizer = SGD(get_parameters(layers), lr=0.01)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        optimizer.zero_grad()
        loss = layers[2](layers[1](layers[0](x).relu()).relu()).sparse_categorical_crossentropy(y)
        loss.backward()
        Tensor.realize_all(loss, *optimizer.schedule_step())
        return loss

    x, y = Tensor(images).realize(), Tensor(labels).realize()
    times, kernels = [], 0
    for _ in range(steps):
        GlobalCounters.reset()
        start = time.perf_counter()
        step(x, y).numpy()
        times.append(time.perf_counter() - start)
        kernels = GlobalCounters.kernel_count
    return times[0], statistics.median(times[3:]), kernels


def torch_step(images: np.ndarray, labels: np.ndarray, steps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((256, 784)).astype(np.float32)
    labels = rng.integers(0, 10, 256).astype(np.int32)
    cold, warm, kernels = lazygrad_step(images, labels, args.steps)
    print(f"lazygrad: first step {cold * 1e3:.1f} ms, warm median {warm * 1e3:.2f} ms, {kernels} kernels per step")
    reference = torch_step(images, labels, args.steps)
    if reference is not None:
        print(f"torch:    warm median {reference * 1e3:.2f} ms  (lazygrad/torch {warm / reference:.2f}x)")


if __name__ == "__main__":
    main()
