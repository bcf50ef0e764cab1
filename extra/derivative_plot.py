"""Plot f(x) = x³ + x and its derivative on 200 points, computed in one batched graph, and draw f's forward and
backward graph.

    python extra/derivative_plot.py [--out derivative.png]

Writes the plot (PNG) and derivative_graph.dot (plus .svg when graphviz's `dot` is installed).
"""

from __future__ import annotations

import argparse

import numpy as np

from lazygrad import Tensor
from lazygrad.helpers import GlobalCounters
from lazygrad.viz import save_graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="derivative.png")
    args = parser.parse_args()

    x = Tensor.linspace(-2, 2, 200).contiguous().realize()
    f = x * x * x + x
    # one backward over the sum gives f'(x) at every point at once: the points do not interact
    f.sum().backward()
    GlobalCounters.reset()
    values, slopes = f.numpy(), x.grad.numpy()
    print(f"f and f' at 200 points: {GlobalCounters.kernel_count} kernels")
    assert np.allclose(slopes, 3 * x.numpy() ** 2 + 1, rtol=1e-5)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(x.numpy(), values, label="f(x) = x³ + x")
    axes.plot(x.numpy(), slopes, label="f′(x) (lazygrad backward)")
    axes.legend()
    axes.grid(True, alpha=0.3)
    figure.savefig(args.out, dpi=120)
    print(f"plot in {args.out}")

    try:
        print(f"graph in {save_graph(f.sum(), 'derivative_graph.svg')}")
    except RuntimeError as error:
        print(error)


if __name__ == "__main__":
    main()
