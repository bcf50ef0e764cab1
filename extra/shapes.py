"""lazygrad beside PyTorch on shapes off the ones extra/bench.py tunes for: odd and prime sizes, batched small
products, transposes and permutes, reductions over leading axes, long scans and sorts, convolutions of other sizes,
lookups by index in large tables.

Each row is one expression, written once for both libraries (where their spellings differ, twice), timed as warm
calls (median) on realized inputs and checked against PyTorch. lazygrad's rows all run before PyTorch's first op:
PyTorch's threads keep spinning on the cores for a while after each op, and would take them from lazygrad's
workers. Read the ratios, not the times: the machines this project runs on are shared and noisy.

    python extra/shapes.py [--only TEXT] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lazygrad import Tensor  # noqa: E402


def conv(x, w, **options):
    """x.conv2d(w) in lazygrad, F.conv2d in PyTorch."""
    if isinstance(x, Tensor):
        return x.conv2d(w, **options)
    import torch.nn.functional as F

    return F.conv2d(x, w, **options)


def row_max(x):
    return x.max(1) if isinstance(x, Tensor) else x.max(1).values


def layer_norm(x):
    centered = x - x.mean(-1, keepdim=True)
    return centered / ((centered * centered).mean(-1, keepdim=True) + 1e-5).sqrt()


def embedding_gradient(upstream, tokens):
    """The gradient of a lookup in a table of 32,000 rows: each token's upstream row added into its row."""
    zeros = Tensor.zeros if isinstance(upstream, Tensor) else __import__("torch").zeros
    return zeros(32000, upstream.shape[-1]).index_add(0, tokens.reshape(-1), upstream.reshape(-1, upstream.shape[-1]))


class Indices(tuple):
    """An input of random int64 indices below `high` (a shape's place in a case), not of normal floats."""

    def __new__(cls, high: int, *shape: int):
        instance = super().__new__(cls, shape)
        instance.high = high
        return instance


# name: (function, input shapes)
CASES = {
    "matmul 1000^3": (lambda a, b: a @ b, [(1000, 1000), (1000, 1000)]),
    "matmul 127x511 @ 511x255 (primes)": (lambda a, b: a @ b, [(127, 511), (511, 255)]),
    "vector @ matrix 4096x4096": (lambda a, b: a @ b, [(1, 4096), (4096, 4096)]),
    "matrix @ vector 4096x4096": (lambda a, b: a @ b, [(4096, 4096), (4096, 1)]),
    "matmul 64x768 @ 768x3072": (lambda a, b: a @ b, [(64, 768), (768, 3072)]),
    "matmul a.T @ b 512": (lambda a, b: a.T @ b, [(512, 512), (512, 512)]),
    "batched matmul 32x 64x64": (lambda a, b: a @ b, [(32, 64, 64), (32, 64, 64)]),
    "batched matmul 256x 16x16": (lambda a, b: a @ b, [(256, 16, 16), (256, 16, 16)]),
    "sum over axis 0 of 4096x4096": (lambda a: a.sum(0), [(4096, 4096)]),
    "sum over axis 1 of 1000x1000": (lambda a: a.sum(1), [(1000, 1000)]),
    "max over axis 1 of 4096x1024": (row_max, [(4096, 1024)]),
    "mean over (0, 2) of 64x256x256": (lambda a: a.mean((0, 2)), [(64, 256, 256)]),
    "transpose copy 4096x4096": (lambda a: a.T + 0, [(4096, 4096)]),
    "transpose copy 3000x5000": (lambda a: a.T + 0, [(3000, 5000)]),
    "permute NCHW -> NHWC 64x128x32x32": (lambda a: a.permute(0, 2, 3, 1) * 1, [(64, 128, 32, 32)]),
    "broadcast add 4096x1 + 1x4096": (lambda a, b: a + b, [(4096, 1), (1, 4096)]),
    "softmax 1000x1000": (lambda a: a.softmax(-1), [(1000, 1000)]),
    "softmax over axis 0 of 1024x4096": (lambda a: a.softmax(0), [(1024, 4096)]),
    "layer norm 8192x768": (layer_norm, [(8192, 768)]),
    "conv 3x3 16x64x56x56 -> 64": (lambda x, w: conv(x, w, padding=1), [(16, 64, 56, 56), (64, 64, 3, 3)]),
    "conv 7x7/2 8x3x224x224 -> 64": (lambda x, w: conv(x, w, stride=2, padding=3), [(8, 3, 224, 224), (64, 3, 7, 7)]),
    "conv 3x3/2 16x64x32x32 -> 128": (
        lambda x, w: conv(x, w, stride=2, padding=1),
        [(16, 64, 32, 32), (128, 64, 3, 3)],
    ),
    "conv 1x1 32x256x14x14 -> 512": (conv, [(32, 256, 14, 14), (512, 256, 1, 1)]),
    "depthwise conv 3x3 16x128x32x32": (
        lambda x, w: conv(x, w, padding=1, groups=128),
        [(16, 128, 32, 32), (128, 1, 3, 3)],
    ),
    "cumsum 1024x1024": (lambda a: a.cumsum(1), [(1024, 1024)]),
    "cumsum 1x1000000": (lambda a: a.cumsum(1), [(1, 1000000)]),
    "argmax over axis 1 of 4096x1024": (lambda a: a.argmax(1), [(4096, 1024)]),
    "sort 64x1000": (lambda a: a.sort(-1)[0], [(64, 1000)]),
    "top-50 of 1x50257 (sampling)": (lambda a: a.topk(50)[0], [(1, 50257)]),
    "cummax 1x100000": (lambda a: a.cummax(1)[0], [(1, 100000)]),
    "embedding lookup 32000x512, 4x128 tokens": (lambda table, idx: table[idx], [(32000, 512), Indices(32000, 4, 128)]),
    "embedding gradient 32000x512, 4x128 tokens": (embedding_gradient, [(4, 128, 512), Indices(32000, 4, 128)]),
    "gather along axis 1 of 4096x1024": (lambda a, idx: a.gather(1, idx), [(4096, 1024), Indices(1024, 4096, 8)]),
}


def median_ms(call, repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run only the rows whose name contains TEXT")
    parser.add_argument("--repeats", type=int, default=15, help="warm calls per row (default 15)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cases = {name: case for name, case in CASES.items() if args.only in name}
    inputs = {
        name: [
            rng.integers(0, shape.high, shape) if isinstance(shape, Indices) else rng.standard_normal(shape, np.float32)
            for shape in shapes
        ]
        for name, (_, shapes) in cases.items()
    }
    lazy_ms, outputs = {}, {}
    for name, (function, _) in cases.items():
        tensors = [Tensor(array).realize() for array in inputs[name]]
        outputs[name] = function(*tensors).numpy()
        lazy_ms[name] = median_ms(lambda: function(*tensors).realize(), args.repeats)
    import torch

    print(f"{'case':40s} {'lazygrad ms':>12s} {'torch ms':>10s} {'ratio':>7s}  check")
    for name, (function, _) in cases.items():
        arrays = [torch.from_numpy(array) for array in inputs[name]]
        expected = function(*arrays).numpy()
        torch_ms = median_ms(lambda: function(*arrays), args.repeats)
        same = outputs[name].shape == expected.shape and np.allclose(outputs[name], expected, rtol=1e-3, atol=1e-3)
        print(
            f"{name:40s} {lazy_ms[name]:12.3f} {torch_ms:10.3f} {lazy_ms[name] / torch_ms:6.2f}x  {'ok' if same else 'WRONG'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
