"""Train a small CNN on real handwritten digits on the default device.

By default it uses scikit-learn's bundled digits set (1,797 8×8 images, no download); pass `--mnist DIR` with the
four MNIST IDX files to train on MNIST instead. Prints `test accuracy: NN.N%` on the held-out split at the end
and saves the weights with safe_save.

    python extra/train_digits.py [--epochs N] [--mnist DIR] [--out weights.safetensors]

Under mpirun it trains data-parallel: each rank takes its slice of every global batch (`--batch` stays the global
batch) and the gradients are averaged across ranks; rank 0 alone prints and saves.

    mpirun -n 2 python extra/train_digits.py
"""

from __future__ import annotations

import argparse
import gzip
import os
import struct
import time

import numpy as np
from tqdm import trange

from lazygrad import Tensor, TinyJit, distributed, nn
from lazygrad.helpers import GlobalCounters
from lazygrad.nn.optim import Adam
from lazygrad.nn.state import get_parameters, get_state_dict, safe_save


def load_digits(test_fraction: float = 0.2, seed: int = 0):
    """scikit-learn's 8×8 digits, scaled to [0, 1], split into train and held-out test sets."""
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(len(images) * (1 - test_fraction))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as file:
        raw = file.read()
    _, kind, dims = struct.unpack(">HBB", raw[:4])
    shape = struct.unpack(">" + "I" * dims, raw[4 : 4 + 4 * dims])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_mnist(directory: str):
    """MNIST from its IDX files (gzipped or not) in `directory`."""

    def find(stem: str) -> str:
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(directory, name)):
                return os.path.join(directory, name)
        raise FileNotFoundError(f"{stem}(.gz) not found in {directory}")

    train_x = read_idx(find("train-images-idx3-ubyte")).astype(np.float32)[:, None] / 255.0
    train_y = read_idx(find("train-labels-idx1-ubyte")).astype(np.int32)
    test_x = read_idx(find("t10k-images-idx3-ubyte")).astype(np.float32)[:, None] / 255.0
    test_y = read_idx(find("t10k-labels-idx1-ubyte")).astype(np.int32)
    return train_x, train_y, test_x, test_y


class DigitNet:
    """conv(16) → relu → maxpool → conv(32) → relu → maxpool → linear(10)."""

    def __init__(self, image_size: int):
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * (image_size // 4) ** 2, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.conv1(x).relu().max_pool2d()
        x = self.conv2(x).relu().max_pool2d()
        return self.fc(x.flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--mnist", help="directory with the MNIST IDX files")
    parser.add_argument("--out", default="digits.safetensors")
    args = parser.parse_args()

    start = time.perf_counter()
    train_x, train_y, test_x, test_y = load_mnist(args.mnist) if args.mnist else load_digits()
    parallel = distributed.launched_by_mpirun()
    if parallel:
        distributed.init(seed=0)  # rank 0 draws the weights a single process would, and sends them to the others
        rank, ranks = distributed.rank(), distributed.world_size()
    else:
        Tensor.manual_seed(0)
        rank, ranks = 0, 1
    model = DigitNet(train_x.shape[-1])
    if parallel:
        distributed.broadcast_parameters(get_parameters(model))
    optimizer = Adam(get_parameters(model), lr=args.lr)

    @TinyJit
    def train_step(images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        Tensor.training = True
        optimizer.zero_grad()
        logits = model(images)
        loss = logits.sparse_categorical_crossentropy(labels)
        loss.backward()
        accuracy = (logits.argmax(-1) == labels).mean()
        if parallel:
            # the forward and backward in one schedule, then every rank applies the mean of the ranks' gradients
            Tensor.realize_all(loss, accuracy, *(param.grad for param in optimizer.params))
            distributed.sync_gradients(optimizer.params)
        # one schedule: the loss and accuracy read the weights before the update
        Tensor.realize_all(loss, accuracy, *optimizer.schedule_step())
        Tensor.training = False
        return loss, accuracy

    # one shuffle per epoch, the same on every rank; each rank takes its slice of every global batch
    sampler = distributed.ShardedSampler(len(train_x), args.batch, rank, ranks, seed=0)
    batches = (batch for _ in range(args.epochs) for batch in sampler)
    kernels_per_step = 0
    with trange(args.epochs * len(sampler), desc="training", disable=rank != 0) as progress:
        for step, batch in zip(progress, batches):
            GlobalCounters.reset()
            loss, accuracy = train_step(Tensor(train_x[batch]), Tensor(train_y[batch]))
            kernels_per_step = GlobalCounters.kernel_count
            if step % 10 == 0:
                progress.set_postfix(loss=f"{loss.item():.3f}", acc=f"{accuracy.item():.2f}")

    if rank != 0:  # the ranks hold the same weights: rank 0 evaluates, saves and prints
        return
    correct = 0
    for first in range(0, len(test_x), 500):
        logits = model(Tensor(test_x[first : first + 500]))
        correct += int((logits.argmax(-1).numpy() == test_y[first : first + 500]).sum())
    safe_save(get_state_dict(model), args.out)
    print(
        f"kernels per training step: {kernels_per_step}, wall time {time.perf_counter() - start:.1f} s, weights in {args.out}"
    )
    print(f"test accuracy: {100 * correct / len(test_x):.1f}%")


if __name__ == "__main__":
    main()
