"""Benchmark lazygrad against NumPy, PyTorch and tinygrad on core workloads and training targets.

Every number in the table is measured in the same run, so read the ratios, not the absolute
times: the machines this project runs on are shared and noisy.

The rows:

- expression rows (elementwise chain, sums, matmul, softmax): one expression, written once for every library
  and checked against NumPy.
- ``matmul 4096^3 fp32`` and ``fp16`` (256^3 with ``--quick``), and ``fp32 tf32`` with ``--tf32`` (lazygrad's
  ``Tensor.allow_tf32()``, torch's ``allow_tf32``): large square products, checked against NumPy's float32
  product but not timed in NumPy; their rates go below the table in TFLOP/s. On CUDA lazygrad runs the fp16
  product on tensor cores by itself. On a CPU device (LLVM, CPU, PYTHON) they are skipped, being slow there,
  unless ``--cpu-matmul`` asks for them.
- ``10,000 chained elementwise ops``: ``x = x * 0.999 + 0.001`` 5,000 times; its ``lg cold`` is the first
  realize with the disk compile cache off (``CACHELEVEL=0`` for lazygrad's calls of this row), so it covers
  scheduling, code generation and compiling a graph that long.
- ``mlp step jit``: one training step of a 784-512-512-10 MLP (batch 256, sparse cross-entropy, backward, SGD)
  wrapped in ``TinyJit``, beside the same model built with ``torch.nn``, ``cross_entropy`` and ``torch.optim.SGD``.
  Its kernels column is kernels per step; its check compares a step's loss with NumPy's cross-entropy of the
  weights that step started from.
- ``mlp step eager``: the same step written as in PyTorch, without ``TinyJit``: ``zero_grad()``, ``backward()``,
  ``step()``, then the loss read on the host (it is the loss of the weights the step started from, computed in
  the step's schedule). Every call schedules its graph again (from the plan cache).
- ``conv2d fwd+bwd``: ``x.conv2d(weight, bias, padding=1).sum()`` over a (batch, 3, 32, 32) input and 16 3x3
  filters, then backward; a call realizes the loss and the gradients of x, weight and bias, and the gradients
  are checked against NumPy.
- ``transformer step jit`` and ``resnet18 step jit``: a training step of extra/models.py's small transformer (Adam)
  and ResNet18 (batch norm in training mode, SGD with momentum) in ``TinyJit``, beside the same step in torch
  started from lazygrad's first weights. The check compares a step's loss with torch's loss for the weights that
  step started from; ``lg cold`` is the first step with the disk cache off (``CACHELEVEL=0``), so it generates
  and compiles every kernel. How long generating a kernel took (lowering, optimizing, linearizing and rendering
  it, on the main thread while the compiles run beside it) goes below the table: per kernel on average, and the
  slowest kernel's.
- ``transformer step eager`` and ``resnet18 step eager``: the same steps without ``TinyJit``, as a new user first
  writes them: each call builds the graph, differentiates it, schedules it (from the plan cache) and runs it.
- ``mlp step cold``: that MLP's first training step in a new Python process with ``CACHELEVEL=0`` (no disk
  compile cache), from building the model to the loss on the host; it is in the ``lg cold`` column. Each library's
  process loads that library alone (torch is not imported in lazygrad's, as in a new user's). The imports
  are timed apart and printed below the table, with PyTorch's first step in a new process. The check compares
  the loss with NumPy's for the same (seeded) first weights.
- ``dispatch``: ``(t + 1).realize()`` on a realized 1-element tensor, many times in a loop (``t + 1`` in torch);
  its times and kernels are per operation, and its times in microseconds are printed below the table.

Where lazygrad's device is an NVIDIA GPU (``CUDA=1`` with its driver, or ``GPU=1`` through NVIDIA's OpenCL) and
torch has CUDA, torch runs every row on that GPU (``cuda``), its inputs moved there once, untimed, and each timed
call ended by ``torch.cuda.synchronize()``; otherwise torch runs on the CPU. The setup line and the torch column's
header say which, and why.

Per row the table shows:

- lazygrad's warm time: the median of several calls (``f(inputs).realize()`` for an expression row), which
  covers building the lazy graph, scheduling, looking up (already compiled) kernels and running them. Expression
  rows read input tensors realized once, as PyTorch's and NumPy's calls read the same arrays every time (each
  call's result dies with the call, so every call computes: see the kernels column); conv2d calls get freshly
  realized inputs (see ``fresh_lazy_inputs``), whose gradients start from zero. Copying input data in is not
  timed.
- lazygrad's cold time: the first call of that case in this process, including compilation. The first
  case also pays one-time start-up costs (device and compiler initialization). A compiled-program
  cache on disk from an earlier run makes cold times shorter; run with ``CACHELEVEL=0`` to turn it off.
- the number of kernels lazygrad ran for one call of the case, and how many programs it compiled
  over all calls of the case (normally all in the cold call; 0 when the disk cache had them all).
- NumPy's, PyTorch's and tinygrad's warm medians (a column is left out when its library is missing; '-' where a
  row has no version for that library).
- the ratio lazygrad / torch (below 1 means lazygrad is faster).

Below the table, each lazygrad row's ``lazygrad_kernel_ms``: what one more call's kernels took by themselves (per
operation for dispatch), each timed as at ``DEBUG=2`` (with device events on a GPU). The warm time less that is
the host's: a row whose kernels take a small part of its time is bound by building, scheduling and launching.

Each lazygrad result is checked against NumPy once; a mismatch is printed loudly and makes the script
exit with status 1. Below the table, every row's target and whether this run met it: elementwise <= 0.5x
torch's time, 10,000 chained ops' first realize <= 1 s, sums <= 1.2x, matmul >= 0.8x torch's GFLOP/s, softmax <= 1.5x,
MLP step <= 1.2x and <= 26 kernels, conv2d <= 1.5x, transformer step <= 1.2x, ResNet18 step <= 1.5x and its first
step <= 10 s, their kernels' generation <= 20 ms per kernel and <= 100 ms for the slowest (with the
transformer's; the generating thread's CPU time: its wall time, also printed, grows with the cores the compile threads
beside it take), cold MLP step <= 0.7 s, dispatch <= 25 us per operation (the CPU targets the project set itself;
the large matmuls, where run on a CPU, >= 0.8x torch's GFLOP/s). On CUDA and GPU devices the targets are issue
13's for an H100 instead: elementwise <= 1.2x torch's time, sums and softmax <= 2x, conv2d <= 2x, MLP step <= 0.5 ms
(and <= 26 kernels), matmul 4096^3 fp32 >= 20 TFLOP/s and, on CUDA, fp16 >= 200 TFLOP/s; the other rows have no GPU
target. ``--json`` writes them too.

Usage::

    python extra/bench.py            # full sizes
    python extra/bench.py --quick    # small sizes, few repeats
    python extra/bench.py --json results.json
    python extra/bench.py --only resnet  # the rows whose name contains "resnet"
    python extra/bench.py --only sum --only softmax  # the rows whose name contains either
    CUDA=1 python extra/bench.py --tf32  # on an NVIDIA GPU, beside torch on the same GPU, with a TF32 row
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models

import lazygrad
import lazygrad.nn.state
from lazygrad import Device, Tensor
from lazygrad.device import DeviceUnavailable
from lazygrad.helpers import MOCKCUDA, Context, GlobalCounters

try:
    import torch
except ImportError:
    torch = None

try:
    import tinygrad
except ImportError:
    tinygrad = None


WARMUP_MIN_CALLS = 2
WARMUP_MAX_CALLS = 50
WARMUP_SECONDS = 0.2
NOISY_RATIO = 2.0  # a warm median this many times the fastest call gets a '*' in the table
MLP_SIZES = (784, 512, 512, 10)
MLP_BATCH = 256
MLP_LEARNING_RATE = 0.01
CONV_PADDING = 1  # with 3x3 filters: output as large as the input
COLD_CHILD_TIMEOUT_S = 300
GPU_DEVICES = ("CUDA", "GPU")  # lazygrad's devices with thread blocks: the rows and targets for GPUs apply
# where torch runs its side of every row: "cuda" when lazygrad's device is an NVIDIA GPU and torch has CUDA, so that
# both run on the same GPU; set by main (and by a cold-step process from its arguments)
TORCH_DEVICE = "cpu"
COLD_CHILD_IMPORTS = {"lazygrad": "lazygrad, lazygrad.nn.optim, lazygrad.nn.state", "torch": "torch"}
# the other libraries are kept out of each new process, as out of a new user's (a `None` in sys.modules makes their
# import fail, so this module runs without them): torch's shared libraries alone, loaded first, made opening
# lazygrad's LLVM device (loading llvmlite's) 0.1-0.2 s slower
COLD_CHILD_BLOCKED = {"lazygrad": ("torch", "tinygrad"), "torch": ("tinygrad",)}
COLD_CHILD_SCRIPT = """\
import sys, time
sys.path[:0] = {paths!r}
sys.modules.update(dict.fromkeys({blocked!r}))
start = time.perf_counter()
import {modules}
imported = time.perf_counter()
import {bench}
{bench}.cold_step_child({library!r}, imported - start, {seed}, {torch_device!r})
"""


@dataclass
class Case:
    """One expression: its inputs and the same computation written for every library."""

    name: str
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    tensor_fn: Callable[..., Any]  # works on lazygrad, tinygrad and torch tensors
    numpy_fn: Callable[..., np.ndarray]
    torch_fn: Callable[..., Any] | None = None  # defaults to tensor_fn
    flops: float | None = None  # floating-point operations per call, for GFLOP/s
    rate_unit: str = "GFLOP/s"  # or "TFLOP/s": how the rates are printed below the table
    rtol: float = 1e-3
    atol: float = 1e-4  # scaled by the largest magnitude of the expected result
    goals: tuple[Goal, ...] = ()
    disk_cache: bool = True  # False: lazygrad runs with CACHELEVEL=0, so its cold call compiles every kernel
    time_numpy: bool = True  # False: NumPy only checks lazygrad's answer (its call would take seconds)
    tf32: bool = False  # float32 products may run in TF32: lazygrad's Tensor.allow_tf32(), torch's allow_tf32
    slow_on_cpu: bool = False  # skipped on lazygrad's CPU devices unless --cpu-matmul asks for it

    def run(self, repeats: int, seed: int) -> CaseResult:
        """Measure every available library on this case."""
        return run_case(self, repeats, seed)


@dataclass
class Timing:
    """Warm median and first-call time of one library on one case, in milliseconds."""

    warm_ms: float | None = None
    cold_ms: float | None = None
    warm_min_ms: float | None = None  # the fastest warm call: less sensitive to a busy machine than the median
    error: str | None = None


@dataclass
class CaseResult:
    """Everything measured for one case; this is what ``--json`` writes."""

    name: str
    lazygrad: Timing = field(default_factory=Timing)
    numpy: Timing = field(default_factory=Timing)
    torch: Timing | None = None
    tinygrad: Timing | None = None
    kernel_count: int | None = None
    compile_count: int | None = None  # programs compiled in all calls of the case (the cold one, normally)
    matches_numpy: bool | None = None
    max_abs_error: float | None = None
    ratio_lazygrad_over_torch: float | None = None
    gflops: dict[str, float] = field(default_factory=dict)
    rate_unit: str = "GFLOP/s"  # how ``gflops`` is printed below the table ("TFLOP/s": divided by 1000)
    details: dict[str, float] = field(default_factory=dict)  # numbers only some rows have, printed below the table


@dataclass
class Target:
    """One goal checked against one row's measurements; ``--json`` writes these under "targets"."""

    case: str
    what: str
    value: float | None
    comparison: str  # "<=" or ">="
    limit: float
    unit: str
    met: bool | None  # None when the value could not be measured


@dataclass(frozen=True)
class Goal:
    """A target for one row: ``metric(result) <= limit``, or ``>= limit`` when ``at_least``."""

    what: str  # what the metric measures, e.g. "lazygrad/torch time"
    metric: Callable[[CaseResult], float | None]
    limit: float
    unit: str = "x"
    at_least: bool = False

    def check(self, result: CaseResult) -> Target:
        """This goal's verdict on one row."""
        value = self.metric(result)
        met = None
        if value is not None:
            met = value >= self.limit if self.at_least else value <= self.limit
        return Target(result.name, self.what, value, ">=" if self.at_least else "<=", self.limit, self.unit, met)


def time_ratio(result: CaseResult) -> float | None:
    """lazygrad's warm time over torch's."""
    return result.ratio_lazygrad_over_torch


def gflops_ratio(result: CaseResult) -> float | None:
    """lazygrad's GFLOP/s over torch's."""
    lazy, reference = result.gflops.get("lazygrad"), result.gflops.get("torch")
    return lazy / reference if lazy and reference else None


def cold_seconds(result: CaseResult) -> float | None:
    """lazygrad's first call, in seconds."""
    return None if result.lazygrad.cold_ms is None else result.lazygrad.cold_ms / 1e3


def lazygrad_tflops(result: CaseResult) -> float | None:
    """lazygrad's TFLOP/s."""
    rate = result.gflops.get("lazygrad")
    return None if rate is None else rate / 1e3


def warm_milliseconds(result: CaseResult) -> float | None:
    """lazygrad's warm median, in milliseconds."""
    return result.lazygrad.warm_ms


def warm_microseconds(result: CaseResult) -> float | None:
    """lazygrad's warm median, in microseconds."""
    return None if result.lazygrad.warm_ms is None else result.lazygrad.warm_ms * 1e3


def generation_per_kernel(result: CaseResult) -> float | None:
    """lazygrad's average time generating one kernel, in milliseconds (None where it generated none)."""
    return result.details.get("generation_ms_per_kernel")


def slowest_generation(result: CaseResult) -> float | None:
    """The longest lazygrad took to generate one kernel, in milliseconds."""
    return result.details.get("slowest_generation_ms")


def kernels_per_call(result: CaseResult) -> float | None:
    """The kernels lazygrad ran for one call."""
    return result.kernel_count


@dataclass
class Workload:
    """One library's version of a step row, set up and ready: ``call(prepare())`` is one call."""

    call: Callable[[Any], list[Any]]  # the timed work; returns the tensors that the check reads
    prepare: Callable[[], Any] = lambda: None  # untimed, before every call: e.g. fresh input tensors
    expected: Callable[[], list[np.ndarray]] | None = None  # NumPy's answer for the next call (lazy libraries only)


@dataclass
class StepCase:
    """A row whose work is more than one expression (a training step, forward and backward, a loop of small
    operations), so that each library gets its own set-up. These rows have no NumPy column."""

    name: str
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    lazy_workload: Callable[[Any, list[np.ndarray]], Workload]  # (lazygrad or tinygrad module, inputs)
    torch_workload: Callable[[list[np.ndarray]], Workload]
    ops_per_call: int = 1  # operations in one call: times and kernels are per operation
    rtol: float = 1e-3
    atol: float = 1e-4  # scaled by the largest magnitude of each expected array
    goals: tuple[Goal, ...] = ()
    disk_cache: bool = True  # False: lazygrad runs with CACHELEVEL=0, so its cold call generates every kernel

    def run(self, repeats: int, seed: int) -> CaseResult:
        """Measure lazygrad, torch and tinygrad (where installed) on this row."""
        arrays = self.make_inputs(np.random.default_rng(seed))
        result = CaseResult(self.name)
        measure_lazygrad(result, lambda: run_lazygrad_workload(self, arrays, repeats, result))
        if torch is not None:
            result.torch = measure(
                f"torch {self.name}",
                lambda: time_workload(self.torch_workload(arrays), repeats, self.ops_per_call, synchronize_torch),
            )
        if tinygrad is not None:
            result.tinygrad = measure(
                f"tinygrad {self.name}",
                lambda: time_workload(self.lazy_workload(tinygrad, arrays), repeats, self.ops_per_call),
            )
        set_ratio(result)
        if self.ops_per_call > 1:
            for library in ("lazygrad", "torch", "tinygrad"):
                timing = getattr(result, library)
                if timing is not None and timing.warm_ms is not None:
                    result.details[f"{library}_us_per_op"] = timing.warm_ms * 1e3
        return result


@dataclass
class ColdCase:
    """The MLP training step's first call in a new process with the disk compile cache off (``CACHELEVEL=0``), from
    building the model to the loss on the host; PyTorch's first step in a new process goes below the table."""

    name: str
    rtol: float = 1e-3
    atol: float = 1e-4
    goals: tuple[Goal, ...] = ()

    def run(self, repeats: int, seed: int) -> CaseResult:
        """Measure lazygrad (and torch) once each, in new processes; ``repeats`` does not apply."""
        result = CaseResult(self.name)
        measure_lazygrad(result, lambda: run_lazygrad_cold(self, seed, result))
        if torch is not None:
            result.torch = measure(f"torch {self.name}", lambda: run_torch_cold(seed, result))
        return result


def elementwise_chain(a, b, c):
    """The fused elementwise case; the same expression works on lazygrad, tinygrad and torch tensors."""
    return ((a * b + c).relu() * 0.5 + a.exp()).sqrt()


def elementwise_chain_numpy(a, b, c):
    """NumPy version of :func:`elementwise_chain`."""
    return np.sqrt(np.maximum(a * b + c, 0) * 0.5 + np.exp(a))


LONG_CHAIN_STEPS = 5000  # a multiply and an add each: 10,000 chained elementwise ops


def long_chain(x):
    """10,000 chained elementwise ops (a decaying affine map, so values stay in range); the same on every library.
    Its cold call measures scheduling and code generation on a long graph, and compiling what comes of it."""
    for _ in range(LONG_CHAIN_STEPS):
        x = x * 0.999 + 0.001
    return x


def long_chain_numpy(x):
    """NumPy version of :func:`long_chain`, with float32 constants as the tensors have."""
    scale, shift = np.float32(0.999), np.float32(0.001)
    for _ in range(LONG_CHAIN_STEPS):
        x = x * scale + shift
    return x


def softmax_numpy(x):
    """Numerically stable softmax over the last axis."""
    exponentials = np.exp(x - x.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def mlp_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """A batch of random images for the MLP and their labels."""
    images = rng.standard_normal((MLP_BATCH, MLP_SIZES[0]), dtype=np.float32)
    return [images, rng.integers(0, MLP_SIZES[-1], MLP_BATCH).astype(np.int32)]


def mlp_model(library: Any) -> list[Any]:
    """The MLP's Linear layers in lazygrad or tinygrad, from seed 0: the same first weights every time."""
    library.Tensor.manual_seed(0)
    return [library.nn.Linear(fan_in, fan_out) for fan_in, fan_out in pairwise(MLP_SIZES)]


def mlp_forward(layers: list[Any], x: Any) -> Any:
    """The MLP's logits: Linear layers with ReLU between them."""
    for layer in layers[:-1]:
        x = layer(x).relu()
    return layers[-1](x)


def mlp_loss_numpy(layers: list[Any], images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The cross-entropy of the layers' current weights on one batch, computed with NumPy in float64."""
    activations = images.astype(np.float64)
    for index, layer in enumerate(layers):
        if index:  # ReLU between layers
            activations = np.maximum(activations, 0)
        activations = activations @ layer.weight.numpy().T.astype(np.float64) + layer.bias.numpy()
    shifted = activations - activations.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return np.asarray(-log_probabilities[np.arange(len(labels)), labels].mean())


def training_mode(library: Any) -> contextlib.AbstractContextManager:
    """tinygrad's optimizers only step inside ``Context(TRAINING=1)``; lazygrad's have no such switch."""
    return library.Context(TRAINING=1) if library is tinygrad else contextlib.nullcontext()


def lazy_mlp_workload(library: Any, arrays: list[np.ndarray], jit: bool = True) -> Workload:
    """The MLP training step in ``TinyJit``, for lazygrad or tinygrad; a call is one step, up to the loss on the
    host. Without ``jit``, the step is written as in PyTorch: ``backward()``, ``step()``, then the loss read."""
    images, labels = arrays
    layers = mlp_model(library)
    optimizer = library.nn.optim.SGD(library.nn.state.get_parameters(layers), lr=MLP_LEARNING_RATE)

    def eager_step(x, y):
        with training_mode(library):
            optimizer.zero_grad()
            loss = mlp_forward(layers, x).sparse_categorical_crossentropy(y)
            loss.backward()
            optimizer.step()
            return loss

    @library.TinyJit
    def jit_step(x, y):
        with training_mode(library):
            optimizer.zero_grad()
            loss = mlp_forward(layers, x).sparse_categorical_crossentropy(y)
            loss.backward()
            return loss.realize(*optimizer.schedule_step())

    step = jit_step if jit else eager_step

    x, y = library.Tensor(images).realize(), library.Tensor(labels).realize()

    def call(_):
        loss = step(x, y)
        loss.numpy()
        return [loss]

    return Workload(call, expected=lambda: [mlp_loss_numpy(layers, images, labels)])


def torch_mlp_workload(arrays: list[np.ndarray]) -> Workload:
    """The same MLP training step with ``torch.nn``, ``cross_entropy`` and ``torch.optim.SGD``."""
    images, labels = arrays
    torch.manual_seed(0)
    modules = []
    for fan_in, fan_out in pairwise(MLP_SIZES):
        modules += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*modules[:-1])
    model.to(TORCH_DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=MLP_LEARNING_RATE)
    x, y = torch.from_numpy(images).to(TORCH_DEVICE), torch.from_numpy(labels.astype(np.int64)).to(TORCH_DEVICE)

    def call(_):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        return [loss]

    return Workload(call)


def conv_inputs(rng: np.random.Generator, batch: int) -> list[np.ndarray]:
    """An input of ``batch`` 3-channel 32x32 images, 16 3x3 filters and their biases."""
    shapes = [(batch, 3, 32, 32), (16, 3, 3, 3), (16,)]
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def conv_grads_numpy(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> list[np.ndarray]:
    """The gradients of ``conv2d(x, weight, bias, padding=1).sum()`` for 3x3 filters, in float64.

    Every output pixel's gradient is 1, so the weight's gradient sums the input windows (the same for every
    filter), the bias's counts the output pixels, and an input pixel's sums the filters' taps over the output
    pixels it reaches.
    """
    batch, _, height, width = x.shape
    kernel = weight.shape[2:]
    pads = ((0, 0), (0, 0), (CONV_PADDING, CONV_PADDING), (CONV_PADDING, CONV_PADDING))
    windows = sliding_window_view(np.pad(x.astype(np.float64), pads), kernel, axis=(2, 3))
    weight_grad = np.broadcast_to(windows.sum(axis=(0, 2, 3)), weight.shape)
    bias_grad = np.full(bias.shape, float(batch * height * width))
    reached = sliding_window_view(np.pad(np.ones((height, width)), CONV_PADDING), kernel)
    flipped = weight[:, :, ::-1, ::-1].astype(np.float64)
    x_grad = np.broadcast_to(np.einsum("ocij,hwij->chw", flipped, reached), x.shape)
    return [x_grad, weight_grad, bias_grad]


def lazy_conv_workload(library: Any, arrays: list[np.ndarray]) -> Workload:
    """conv2d forward and backward for lazygrad or tinygrad, on fresh inputs each call."""

    def call(inputs):
        x, weight, bias = inputs
        loss = x.conv2d(weight, bias, padding=CONV_PADDING).sum()
        loss.backward()
        loss.realize(x.grad, weight.grad, bias.grad)
        return [x.grad, weight.grad, bias.grad]

    def prepare():
        inputs = fresh_lazy_inputs(library.Tensor, arrays)
        for tensor in inputs:
            tensor.requires_grad = True  # set apart: tinygrad's Tensor() takes no requires_grad argument
        return inputs

    return Workload(call, prepare, expected=lambda: conv_grads_numpy(*arrays))


def torch_conv_workload(arrays: list[np.ndarray]) -> Workload:
    """The same conv2d forward and backward with ``torch.nn.functional.conv2d``."""

    def call(inputs):
        x, weight, bias = inputs
        loss = torch.nn.functional.conv2d(x, weight, bias, padding=CONV_PADDING).sum()
        loss.backward()
        return [x.grad, weight.grad, bias.grad]

    def prepare():
        return [torch.from_numpy(array).to(TORCH_DEVICE).requires_grad_() for array in arrays]

    return Workload(call, prepare)


def state_for_torch(model: Any, requires_grad: bool = False, device: str = "cpu") -> dict[str, Any]:
    """A lazygrad model's state dict as torch tensors on ``device`` (leaf tensors that want gradients, when
    asked)."""
    state = lazygrad.nn.state.get_state_dict(model)
    state = {name: torch.tensor(tensor.numpy(), device=device) for name, tensor in state.items()}
    return {name: tensor.requires_grad_(requires_grad and tensor.is_floating_point()) for name, tensor in state.items()}


def transformer_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """A batch of token sequences and the next-token labels to train on."""
    shape = (models.TRANSFORMER["batch"], models.TRANSFORMER["time"])
    return [rng.integers(0, models.TRANSFORMER["symbols"], shape).astype(np.int32) for _ in range(2)]


def resnet_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """A batch of 16 random 32x32 images and their classes."""
    return [rng.standard_normal((16, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, 16).astype(np.int32)]


def torch_loss(logits: Any, labels: Any) -> Any:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long())


def lazy_model_workload(library: Any, arrays: list[np.ndarray], model_name: str, jit: bool = True) -> Workload:
    """A training step of one of extra/models.py's models in ``TinyJit`` (Adam for the transformer, SGD with
    momentum for ResNet18), for lazygrad or tinygrad; its check is torch's loss for the weights the step starts
    from. Without ``jit``, the step runs as written, its graph built, differentiated and scheduled every call."""
    inputs, labels = arrays
    library.Tensor.manual_seed(0)
    model = models.Transformer(library) if model_name == "transformer" else models.ResNet18(library)
    parameters = library.nn.state.get_parameters(model)
    if model_name == "transformer":
        optimizer = library.nn.optim.Adam(parameters, lr=1e-3)
    else:
        optimizer = library.nn.optim.SGD(parameters, lr=0.01, momentum=0.9)

    def step(x, y):
        with library.Tensor.train():
            optimizer.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            return loss.realize(*optimizer.schedule_step())

    if jit:
        step = library.TinyJit(step)
    x, y = library.Tensor(inputs).realize(), library.Tensor(labels).realize()

    def call(_):
        loss = step(x, y)
        loss.numpy()
        return [loss]

    def expected():
        state = state_for_torch(model)
        torch_inputs, torch_labels = torch.from_numpy(inputs), torch.from_numpy(labels)
        if model_name == "transformer":
            logits = models.torch_transformer(state, torch_inputs.long())
        else:
            logits = models.torch_resnet18(state, torch_inputs, state)
        return [torch_loss(logits, torch_labels).detach().numpy()]

    return Workload(call, expected=expected if torch is not None else None)


def torch_model_workload(arrays: list[np.ndarray], model_name: str) -> Workload:
    """The same training step in torch, from lazygrad's first weights, with ``torch.optim``."""
    inputs, labels = arrays
    Tensor.manual_seed(0)
    lazy_model = models.Transformer(lazygrad) if model_name == "transformer" else models.ResNet18(lazygrad)
    state = state_for_torch(lazy_model, requires_grad=True, device=TORCH_DEVICE)
    buffers = {name: tensor.detach() for name, tensor in state.items() if "running" in name}
    parameters = [tensor for name, tensor in state.items() if "running" not in name and tensor.is_floating_point()]
    if model_name == "transformer":
        optimizer = torch.optim.Adam(parameters, lr=1e-3)
    else:
        optimizer = torch.optim.SGD(parameters, lr=0.01, momentum=0.9)
    x, y = torch.from_numpy(inputs).to(TORCH_DEVICE), torch.from_numpy(labels).to(TORCH_DEVICE)

    def call(_):
        optimizer.zero_grad()
        if model_name == "transformer":
            logits = models.torch_transformer(state, x.long())
        else:
            logits = models.torch_resnet18(state, x, buffers)
        loss = torch_loss(logits, y)
        loss.backward()
        optimizer.step()
        loss.item()
        return [loss]

    return Workload(call)


def lazy_dispatch_workload(library: Any, arrays: list[np.ndarray], ops: int) -> Workload:
    """``ops`` times ``(t + 1).realize()`` on a realized 1-element tensor, for lazygrad or tinygrad."""
    t = library.Tensor(arrays[0]).realize()

    def call(_):
        # no result stays alive into the next operation: a lazy library could answer the same graph from it
        for _ in range(ops - 1):
            (t + 1).realize()
        return [(t + 1).realize()]

    return Workload(call, expected=lambda: [arrays[0] + 1])


def torch_dispatch_workload(arrays: list[np.ndarray], ops: int) -> Workload:
    """``ops`` times ``t + 1`` on a 1-element torch tensor."""
    t = torch.from_numpy(arrays[0]).to(TORCH_DEVICE)

    def call(_):
        for _ in range(ops - 1):
            t + 1
        return [t + 1]

    return Workload(call)


def make_cases(quick: bool, device: str, tf32: bool = False) -> list[Case | StepCase | ColdCase]:
    """The benchmark rows, at full or ``--quick`` sizes, with the targets for lazygrad's ``device`` (a GPU's where
    it has thread blocks, else the CPU's); ``tf32`` adds a row of float32 products in TF32."""
    gpu = device in GPU_DEVICES
    vector_size = 1 << 20 if quick else 1 << 24
    square = 1024 if quick else 4096
    matmul_size = 256 if quick else 1024
    large_matmul_size = 256 if quick else 4096  # (mock CUDA emulates a 512^3 product for seconds a call)
    softmax_shape = (1024, 256) if quick else (4096, 1024)
    conv_batch = 8 if quick else 32
    dispatch_ops = 500 if quick else 2000
    long_chain_size = 1 << 12 if quick else 1 << 16

    def normal(*shape):
        return lambda rng: [rng.standard_normal(shape, dtype=np.float32) for _ in range(3)]

    def uniform(*shape):
        # sums of values in [0, 1) are well conditioned, so a loose tolerance still catches wrong answers
        return lambda rng: [rng.random(shape, dtype=np.float32)]

    def matmul_inputs(rng):
        return [rng.standard_normal((matmul_size, matmul_size), dtype=np.float32) for _ in range(2)]

    def time_goal(cpu_limit, gpu_limit=None):
        """lazygrad's time over torch's, at most the CPU's limit or the GPU's; no goal where there is no limit."""
        limit = gpu_limit if gpu else cpu_limit
        return () if limit is None else (Goal("lazygrad/torch time", time_ratio, limit),)

    def on_cpu(*goals):
        """Goals set for the CPU devices alone (issue 13's GPU targets have none for their row)."""
        return () if gpu else goals

    # kernel generation, measured on the models' first steps (on a CPU device, as the other targets of issue 14)
    generation_goals = on_cpu(
        Goal("generation per kernel", generation_per_kernel, 20.0, unit="ms"),
        Goal("slowest kernel's generation", slowest_generation, 100.0, unit="ms"),
    )

    def rate_goal(tflops):
        """At least ``tflops`` TFLOP/s on a GPU (none where ``tflops`` is None), at least 0.8x torch's on a CPU."""
        if not gpu:
            return (Goal("lazygrad/torch GFLOP/s", gflops_ratio, 0.8, at_least=True),)
        return () if tflops is None else (Goal("lazygrad TFLOP/s", lazygrad_tflops, tflops, "TFLOP/s", True),)

    def large_matmul(kind, dtype, goals, tf32=False):
        """A square product of ``large_matmul_size``; NumPy's float32 product of the same values checks it."""
        size = large_matmul_size
        return Case(
            f"matmul {size}^3 {kind}",
            lambda rng: [rng.standard_normal((size, size), dtype=np.float32).astype(dtype) for _ in range(2)],
            lambda a, b: a @ b,
            lambda a, b: a.astype(np.float32) @ b.astype(np.float32),
            flops=2.0 * size**3,
            rate_unit="TFLOP/s",
            # float16 results and TF32 inputs keep ~11 bits: within 1e-3 of the largest output
            atol=1e-4 if dtype == np.float32 and not tf32 else 1e-3,
            goals=goals,
            time_numpy=False,
            tf32=tf32,
            slow_on_cpu=True,
        )

    large_matmuls = [
        large_matmul("fp32", np.float32, rate_goal(20)),
        # tensor cores: lazygrad's CUDA device runs half products on them by itself
        large_matmul("fp16", np.float16, rate_goal(200 if device == "CUDA" else None)),
    ]
    if tf32:
        large_matmuls.append(large_matmul("fp32 tf32", np.float32, (), tf32=True))

    million = vector_size / (1 << 20)
    return [
        Case(
            f"elementwise chain {million:g}M",
            normal(vector_size),
            elementwise_chain,
            elementwise_chain_numpy,
            goals=time_goal(0.5, 1.2),
        ),
        Case(
            f"10,000 chained elementwise ops {long_chain_size >> 10}K (cold: no disk cache)",
            lambda rng: [rng.standard_normal(long_chain_size, dtype=np.float32)],
            long_chain,
            long_chain_numpy,
            goals=on_cpu(Goal("first realize", cold_seconds, 1.0, unit="s")),
            disk_cache=False,
        ),
        Case(f"sum {million:g}M", uniform(vector_size), lambda a: a.sum(), lambda a: a.sum(), goals=time_goal(1.2, 2)),
        Case(
            f"sum axis=1 {square}x{square}",
            uniform(square, square),
            lambda a: a.sum(axis=1),
            lambda a: a.sum(axis=1),
            torch_fn=lambda a: a.sum(dim=1),
            goals=time_goal(1.2, 2),
        ),
        Case(
            f"matmul {matmul_size}^3",
            matmul_inputs,
            lambda a, b: a @ b,
            lambda a, b: a @ b,
            flops=2.0 * matmul_size**3,
            goals=rate_goal(None),
        ),
        *large_matmuls,
        Case(
            f"softmax {softmax_shape[0]}x{softmax_shape[1]} axis=-1",
            lambda rng: [rng.standard_normal(softmax_shape, dtype=np.float32)],
            lambda x: x.softmax(-1),
            softmax_numpy,
            torch_fn=lambda x: torch.softmax(x, -1),
            goals=time_goal(1.5, 2),
        ),
        StepCase(
            f"mlp step jit {'-'.join(map(str, MLP_SIZES))} b{MLP_BATCH}",
            mlp_inputs,
            lazy_mlp_workload,
            torch_mlp_workload,
            goals=(
                *time_goal(1.2),
                *(() if not gpu else (Goal("lazygrad time", warm_milliseconds, 0.5, unit="ms"),)),
                Goal("kernels per step", kernels_per_call, 26, unit=""),
            ),
        ),
        StepCase(
            f"mlp step eager {'-'.join(map(str, MLP_SIZES))} b{MLP_BATCH} (no jit; loss read after opt.step())",
            mlp_inputs,
            partial(lazy_mlp_workload, jit=False),
            torch_mlp_workload,
        ),
        StepCase(
            f"conv2d fwd+bwd {conv_batch}x3x32x32 3->16 3x3 pad={CONV_PADDING}",
            partial(conv_inputs, batch=conv_batch),
            lazy_conv_workload,
            torch_conv_workload,
            goals=time_goal(1.5, 2),
        ),
        StepCase(
            "transformer step jit (2 blocks, width 128, b64 t6, Adam)",
            transformer_inputs,
            partial(lazy_model_workload, model_name="transformer"),
            partial(torch_model_workload, model_name="transformer"),
            goals=time_goal(1.2) + generation_goals,
            disk_cache=False,
        ),
        StepCase(
            "resnet18 step jit (b16 32x32, SGD momentum)",
            resnet_inputs,
            partial(lazy_model_workload, model_name="resnet18"),
            partial(torch_model_workload, model_name="resnet18"),
            goals=time_goal(1.5) + on_cpu(Goal("first step", cold_seconds, 10.0, unit="s")) + generation_goals,
            disk_cache=False,
        ),
        StepCase(
            "transformer step eager (no jit)",
            transformer_inputs,
            partial(lazy_model_workload, model_name="transformer", jit=False),
            partial(torch_model_workload, model_name="transformer"),
        ),
        StepCase(
            "resnet18 step eager (no jit)",
            resnet_inputs,
            partial(lazy_model_workload, model_name="resnet18", jit=False),
            partial(torch_model_workload, model_name="resnet18"),
        ),
        ColdCase(
            "mlp step cold (new process, CACHELEVEL=0)",
            goals=on_cpu(Goal("build + first step", cold_seconds, 0.7, unit="s")),
        ),
        StepCase(
            "dispatch (t+1).realize(), per op",
            lambda rng: [np.ones(1, dtype=np.float32)],
            partial(lazy_dispatch_workload, ops=dispatch_ops),
            partial(torch_dispatch_workload, ops=dispatch_ops),
            ops_per_call=dispatch_ops,
            goals=on_cpu(Goal("time per op", warm_microseconds, 25.0, unit="us")),
        ),
    ]


def synchronize_lazygrad() -> None:
    """Wait for queued lazygrad work where the device runs asynchronously (no-op otherwise)."""
    device = Device[Device.DEFAULT]
    if hasattr(device, "synchronize"):
        device.synchronize()


def kernel_milliseconds(call: Callable[[], Any]) -> float:
    """The milliseconds the kernels of one ``call()`` take by themselves, each timed as at DEBUG=2 (device events on
    a GPU: the kernel alone, not the host's work around it); the DEBUG output is dropped."""
    with Context(DEBUG=2), contextlib.redirect_stdout(io.StringIO()):
        GlobalCounters.reset()
        call()
        synchronize_lazygrad()
    return GlobalCounters.time_sum_s * 1e3


def time_calls(call: Callable[[Any], Any], repeats: int, prepare: Callable[[], Any] = lambda: None) -> Timing:
    """Time the first (cold) call, warm up, then report the median of ``repeats`` timed calls.

    Before every call ``prepare()`` runs untimed and its result is what ``call`` gets. Every library gets the
    same garbage collection: a full one before the first call and a young-generation one (cheap, and it does not
    flush the CPU caches as a full one does) before every call, so that collector pauses and the garbage of
    earlier calls stay out of the timed region.
    """
    gc.collect()

    def timed_call() -> float:
        gc.collect(1)
        prepared = prepare()
        start = time.perf_counter()
        call(prepared)
        return (time.perf_counter() - start) * 1e3

    cold_ms = timed_call()
    # some libraries need a few calls before they settle (torch's matmul takes several), so warm up for a while
    warmup_started = time.perf_counter()
    for count in range(WARMUP_MAX_CALLS):
        if count >= WARMUP_MIN_CALLS and time.perf_counter() - warmup_started > WARMUP_SECONDS:
            break
        timed_call()
    times = [timed_call() for _ in range(repeats)]
    return Timing(warm_ms=statistics.median(times), cold_ms=cold_ms, warm_min_ms=min(times))


def fresh_lazy_inputs(tensor_class: type, arrays: list[np.ndarray]) -> list[Any]:
    """New, realized input tensors."""
    return [tensor_class(array).realize() for array in arrays]


def run_lazygrad(case: Case, arrays: list[np.ndarray], repeats: int, result: CaseResult) -> None:
    """Time lazygrad on one case, count its kernels and check its answer against NumPy."""

    def call(inputs):
        # the kernels are chosen (TF32 allowed or not) when the result is realized
        with Tensor.allow_tf32() if case.tf32 else contextlib.nullcontext():
            output = case.tensor_fn(*inputs).realize()
        synchronize_lazygrad()
        return output

    inputs = fresh_lazy_inputs(Tensor, arrays)

    def prepare():
        return inputs

    GlobalCounters.reset()
    with Context(CACHELEVEL=1 if case.disk_cache else 0):
        result.lazygrad = time_calls(call, repeats, prepare)
    result.compile_count = getattr(GlobalCounters, "compile_count", None)
    result.details["lazygrad_kernel_ms"] = kernel_milliseconds(lambda: call(inputs))

    GlobalCounters.reset()
    output = call(inputs)
    result.kernel_count = GlobalCounters.kernel_count
    if result.kernel_count == 0:
        print(f"!!! WARNING [{case.name}]: a warm call ran 0 kernels -- was the result cached?", file=sys.stderr)
    check_outputs(result, [output.numpy()], [case.numpy_fn(*arrays)], case.rtol, case.atol)


def check_outputs(
    result: CaseResult, outputs: list[np.ndarray], expected: list[np.ndarray], rtol: float, atol: float
) -> None:
    """Compare lazygrad's outputs with NumPy's, pair by pair, into ``matches_numpy`` and ``max_abs_error``.

    ``atol`` is scaled by the largest magnitude of each expected array; a mismatch is printed loudly.
    """
    result.matches_numpy, result.max_abs_error = True, 0.0
    for got, want in zip(outputs, expected, strict=True):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            result.matches_numpy = False
            print(f"!!! MISMATCH [{result.name}]: shape {got.shape}, expected {want.shape}", file=sys.stderr)
            continue
        difference = np.abs(got.astype(np.float64) - want.astype(np.float64))
        error = float(np.nanmax(difference)) if difference.size else 0.0
        result.max_abs_error = max(result.max_abs_error, error)
        scaled_atol = atol * max(1.0, float(np.abs(want).max()))
        if not np.allclose(got, want, rtol=rtol, atol=scaled_atol):
            result.matches_numpy = False
            print(
                f"!!! MISMATCH [{result.name}]: lazygrad differs from NumPy, max abs error {error:.3g}\n"
                f"    got      {got.ravel()[:6]}\n    expected {want.ravel()[:6]}",
                file=sys.stderr,
            )


def time_workload(
    workload: Workload, repeats: int, ops_per_call: int, synchronize: Callable[[], None] = lambda: None
) -> Timing:
    """Time a workload as ``time_calls`` does, each call from the moment the device has finished its preparation
    to the moment it has finished the call (``synchronize``). With several operations per call the times are per
    operation, and the cold time, which would spread one compile over the whole call, is left out."""

    def call(prepared):
        workload.call(prepared)
        synchronize()

    def prepare():
        prepared = workload.prepare()
        synchronize()
        return prepared

    timing = time_calls(call, repeats, prepare)
    if ops_per_call == 1:
        return timing
    return Timing(warm_ms=timing.warm_ms / ops_per_call, warm_min_ms=timing.warm_min_ms / ops_per_call)


def run_lazygrad_workload(case: StepCase, arrays: list[np.ndarray], repeats: int, result: CaseResult) -> None:
    """Time lazygrad on a step row, count its kernels per operation and check one call against NumPy."""
    GlobalCounters.reset()
    workload = case.lazy_workload(lazygrad, arrays)
    with Context(CACHELEVEL=1 if case.disk_cache else 0):
        result.lazygrad = time_workload(workload, repeats, case.ops_per_call, synchronize_lazygrad)
    result.compile_count = GlobalCounters.compile_count
    if GlobalCounters.generate_count:
        result.details |= {
            "lazygrad_kernels_generated": GlobalCounters.generate_count,
            "generation_ms_per_kernel": GlobalCounters.generate_time_s / GlobalCounters.generate_count * 1e3,
            "slowest_generation_ms": GlobalCounters.generate_max_s * 1e3,
            "slowest_generation_wall_ms": GlobalCounters.generate_wall_max_s * 1e3,
        }

    kernel_ms = kernel_milliseconds(lambda: workload.call(workload.prepare()))
    result.details["lazygrad_kernel_ms"] = kernel_ms / case.ops_per_call
    # before the call: a training step changes the weights it starts from
    expected = workload.expected() if workload.expected is not None else None
    inputs = workload.prepare()
    GlobalCounters.reset()
    outputs = workload.call(inputs)
    synchronize_lazygrad()
    result.kernel_count = GlobalCounters.kernel_count // case.ops_per_call
    # every live buffer counts (weights, inputs, intermediates), at the call's fullest moment
    result.details["lazygrad_peak_memory_mb"] = GlobalCounters.memory_peak / 1e6
    if expected is not None:
        check_outputs(result, [output.numpy() for output in outputs], expected, case.rtol, case.atol)


def run_cold_child(library: str, seed: int) -> dict[str, Any]:
    """Run ``cold_step_child`` for ``library`` in a new Python process with ``CACHELEVEL=0``; return its report."""
    here = Path(__file__).resolve()
    script = COLD_CHILD_SCRIPT.format(
        paths=[str(here.parent.parent), str(here.parent)],
        modules=COLD_CHILD_IMPORTS[library],
        blocked=COLD_CHILD_BLOCKED[library],
        bench=here.stem,
        library=library,
        seed=seed,
        torch_device=TORCH_DEVICE,
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "CACHELEVEL": "0"},
        capture_output=True,
        text=True,
        timeout=COLD_CHILD_TIMEOUT_S,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{library} process exited with status {completed.returncode}:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.splitlines()[-1])


def cold_step_child(library: str, import_seconds: float, seed: int, torch_device: str) -> None:
    """The new process of ``ColdCase``: time building the MLP and its first training step (torch's on
    ``torch_device``, as in the parent), then print a JSON report as the last line (lazygrad's also gives its
    kernels, compiles and the loss beside NumPy's)."""
    global TORCH_DEVICE
    TORCH_DEVICE = torch_device
    arrays = mlp_inputs(np.random.default_rng(seed))
    GlobalCounters.reset()
    start = time.perf_counter()
    workload = lazy_mlp_workload(lazygrad, arrays) if library == "lazygrad" else torch_mlp_workload(arrays)
    (loss,) = workload.call(workload.prepare())
    report = {"import_s": import_seconds, "build_and_step_s": time.perf_counter() - start}
    if library == "lazygrad":
        report |= {
            "kernels": GlobalCounters.kernel_count,
            "compiles": GlobalCounters.compile_count,
            "loss": float(loss.numpy()),
            "expected_loss": float(mlp_loss_numpy(mlp_model(lazygrad), *arrays)),  # seeded: the same first weights
        }
    print(json.dumps(report))


def run_lazygrad_cold(case: ColdCase, seed: int, result: CaseResult) -> None:
    """lazygrad's first MLP step in a new process, its kernels and compiles, and its loss checked against NumPy."""
    report = run_cold_child("lazygrad", seed)
    result.lazygrad = Timing(cold_ms=report["build_and_step_s"] * 1e3)
    result.kernel_count, result.compile_count = report["kernels"], report["compiles"]
    result.details["lazygrad_import_s"] = report["import_s"]
    check_outputs(result, [report["loss"]], [report["expected_loss"]], case.rtol, case.atol)


def run_torch_cold(seed: int, result: CaseResult) -> Timing:
    """PyTorch's first MLP step in a new process, for reference beside lazygrad's."""
    report = run_cold_child("torch", seed)
    result.details |= {"torch_import_s": report["import_s"], "torch_build_and_step_s": report["build_and_step_s"]}
    return Timing(cold_ms=report["build_and_step_s"] * 1e3)


def synchronize_torch() -> None:
    """Wait for torch's queued GPU work (CUDA runs asynchronously); nothing to wait for on the CPU."""
    if TORCH_DEVICE == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def torch_tf32():
    """torch's float32 matrix products in TF32 on CUDA, as lazygrad's ``Tensor.allow_tf32()``; restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def run_torch(case: Case, arrays: list[np.ndarray], repeats: int) -> Timing:
    """Time PyTorch on one case, on ``TORCH_DEVICE``: the inputs are moved there once, untimed, and each timed call
    starts after earlier GPU work is done and ends when its own is."""
    inputs = [torch.from_numpy(array).to(TORCH_DEVICE) for array in arrays]
    function = case.torch_fn or case.tensor_fn

    def call(_):
        function(*inputs)
        synchronize_torch()

    with torch.no_grad(), torch_tf32() if case.tf32 else contextlib.nullcontext():
        return time_calls(call, repeats, synchronize_torch)


def run_tinygrad(case: Case, arrays: list[np.ndarray], repeats: int) -> Timing:
    """Time tinygrad on one case, the same way as lazygrad."""
    inputs = fresh_lazy_inputs(tinygrad.Tensor, arrays)
    return time_calls(lambda _: case.tensor_fn(*inputs).realize(), repeats)


def measure(label: str, function: Callable[[], Timing]) -> Timing:
    """Run one library's timing, turning an exception into a recorded error instead of a crash."""
    try:
        return function()
    except Exception as error:  # noqa: BLE001 -- one failing library must not stop the benchmark
        traceback.print_exc()
        print(f"!!! ERROR [{label}]: {type(error).__name__}: {error}", file=sys.stderr)
        return Timing(error=f"{type(error).__name__}: {error}")


def measure_lazygrad(result: CaseResult, function: Callable[[], None]) -> None:
    """Run lazygrad's part of a row, which fills ``result``; an exception is recorded there instead of raised."""
    try:
        function()
    except Exception as error:  # noqa: BLE001 -- report the error in the table and go on
        traceback.print_exc()
        print(f"!!! ERROR [lazygrad {result.name}]: {type(error).__name__}: {error}", file=sys.stderr)
        result.lazygrad.error = f"{type(error).__name__}: {error}"


def set_ratio(result: CaseResult) -> None:
    """Set lazygrad's warm time over torch's, where both were measured."""
    if result.torch and result.torch.warm_ms and result.lazygrad.warm_ms is not None:
        result.ratio_lazygrad_over_torch = result.lazygrad.warm_ms / result.torch.warm_ms


def run_case(case: Case, repeats: int, seed: int) -> CaseResult:
    """Measure every available library on one case."""
    arrays = case.make_inputs(np.random.default_rng(seed))
    result = CaseResult(case.name)

    measure_lazygrad(result, lambda: run_lazygrad(case, arrays, repeats, result))
    if case.time_numpy:
        result.numpy = measure(f"numpy {case.name}", lambda: time_calls(lambda _: case.numpy_fn(*arrays), repeats))
    if torch is not None:
        result.torch = measure(f"torch {case.name}", lambda: run_torch(case, arrays, repeats))
    if tinygrad is not None and not case.tf32:  # (tinygrad's switch for TF32 is not lazygrad's)
        result.tinygrad = measure(f"tinygrad {case.name}", lambda: run_tinygrad(case, arrays, repeats))

    set_ratio(result)
    if case.flops:
        result.rate_unit = case.rate_unit
        for library in ("lazygrad", "numpy", "torch", "tinygrad"):
            timing = getattr(result, library)
            if timing is not None and timing.warm_ms:
                result.gflops[library] = case.flops / (timing.warm_ms * 1e-3) / 1e9
    return result


def format_ms(value: float | None) -> str:
    """A time in milliseconds with three significant digits, or '-' when missing."""
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def format_warm(timing: Timing | None) -> str:
    """A warm median, marked with '*' when it is over twice the fastest call (a sign of a busy machine)."""
    if timing is None or timing.warm_ms is None:
        return "ERROR" if timing is not None and timing.error else "-"
    noisy = timing.warm_min_ms is not None and timing.warm_ms > NOISY_RATIO * timing.warm_min_ms
    return format_ms(timing.warm_ms) + ("*" if noisy else "")


def format_table(results: list[CaseResult]) -> str:
    """The results as an aligned text table (times in ms)."""
    header = ["case", "lazygrad", "lg cold", "kernels", "compiles", "numpy"]
    if torch is not None:
        header.append(f"torch {TORCH_DEVICE}")
    if tinygrad is not None:
        header += ["tinygrad", "tg cold"]
    header += ["lg/torch", "check"]
    rows = [header]
    for result in results:
        lazygrad = result.lazygrad
        row = [
            result.name,
            format_warm(lazygrad),
            format_ms(lazygrad.cold_ms),
            "-" if result.kernel_count is None else str(result.kernel_count),
            "-" if result.compile_count is None else str(result.compile_count),
            format_warm(result.numpy),
        ]
        if torch is not None:
            row.append(format_warm(result.torch))
        if tinygrad is not None:
            row += [format_warm(result.tinygrad), format_ms(result.tinygrad.cold_ms if result.tinygrad else None)]
        ratio = result.ratio_lazygrad_over_torch
        row.append("-" if ratio is None else f"{ratio:.2f}x")
        row.append({True: "ok", False: "MISMATCH", None: "-"}[result.matches_numpy])
        rows.append(row)
    return align(rows)


def format_targets(targets: list[Target]) -> str:
    """Every row's targets, its value in this run and whether it met them, as an aligned table."""
    rows = [["case", "target", "value", "goal", "met"]]
    for target in targets:
        unit = f" {target.unit}" if len(target.unit) > 2 else target.unit  # (x, s, ms, us stick to their number)
        value = "-" if target.value is None else f"{target.value:.3g}{unit}"
        goal = f"{target.comparison} {target.limit:g}{unit}"
        rows.append([target.case, target.what, value, goal, {True: "yes", False: "NO", None: "-"}[target.met]])
    return align(rows, left_columns=2)


def align(rows: list[list[str]], left_columns: int = 1) -> str:
    """Rows of cells as text columns: the first ``left_columns`` left-aligned, the rest right-aligned, and a rule
    under the header (the first row)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.ljust(width) if column < left_columns else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def choose_torch_device(device: str) -> tuple[str, str]:
    """Where torch runs beside lazygrad's ``device``, and why: on the same GPU where lazygrad's device is an NVIDIA
    GPU (CUDA with its driver, or NVIDIA's OpenCL) and torch has CUDA, else on the CPU."""
    if device not in GPU_DEVICES:
        return "cpu", f"as lazygrad's {device}"
    if device == "CUDA" and MOCKCUDA:
        return "cpu", "lazygrad's CUDA is the mock (MOCKCUDA=1), which runs kernels on the CPU"
    if device == "GPU":
        try:
            vendor = Device["GPU"].device.vendor
        except DeviceUnavailable as error:
            return "cpu", f"lazygrad's GPU device is unavailable: {error}"
        if "NVIDIA" not in vendor.upper():
            return "cpu", f"lazygrad's OpenCL device is {vendor}'s, no NVIDIA GPU"
    if torch is None or not torch.cuda.is_available():
        return "cpu", "this torch has no CUDA"
    return "cuda", torch.cuda.get_device_name()


def describe_setup(torch_reason: str) -> str:
    """One line naming the devices (``torch_reason``: why torch runs on ``TORCH_DEVICE``) and library versions."""
    try:
        description = getattr(Device[Device.DEFAULT], "description", None)
    except DeviceUnavailable as error:
        description = f"unavailable: {error}"
    device = Device.DEFAULT + (f" ({description})" if description else "")
    parts = [f"lazygrad device {device}", f"numpy {np.__version__}"]
    if torch is not None:
        threads = f", {torch.get_num_threads()} threads" if TORCH_DEVICE == "cpu" else ""
        parts.append(f"torch {torch.__version__} on {TORCH_DEVICE} ({torch_reason}{threads})")
    else:
        parts.append("torch not installed")
    parts.append("tinygrad installed" if tinygrad is not None else "tinygrad not installed")
    if hasattr(os, "getloadavg"):  # a busy machine makes every column slower, the multithreaded ones most
        parts.append(f"load average {os.getloadavg()[0]:.2f}")
    return ", ".join(parts)


def main() -> int:
    """Parse flags, run every case, print the table and optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--repeats", type=int, help="warm calls per case (default 20, or 10 with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random inputs")
    parser.add_argument(
        "--only", metavar="TEXT", action="append", help="run only the rows whose name contains TEXT (repeatable: any)"
    )
    parser.add_argument(
        "--tf32", action="store_true", help="add a row of float32 products in TF32 (lazygrad's and torch's switch)"
    )
    parser.add_argument(
        "--cpu-matmul", action="store_true", help="run the large matmul rows on a CPU device too (slow there)"
    )
    args = parser.parse_args()
    repeats = args.repeats or (10 if args.quick else 20)

    global TORCH_DEVICE
    device = Device.DEFAULT
    TORCH_DEVICE, torch_reason = choose_torch_device(device)
    print(describe_setup(torch_reason))
    print(f"times in ms: median of {repeats} calls after warm-up; 'lg cold' = first call, including compile\n")
    cases = [
        case
        for case in make_cases(args.quick, device, args.tf32)
        if not args.only or any(text in case.name for text in args.only)
    ]
    skipped = []
    if device not in GPU_DEVICES and not args.cpu_matmul:
        skipped = [case.name for case in cases if getattr(case, "slow_on_cpu", False)]
        cases = [case for case in cases if case.name not in skipped]
    if skipped:
        print(f"skipped: {', '.join(skipped)} (slow on the CPU device {device}; --cpu-matmul runs them)")
    results, targets = [], []
    for case in cases:
        print(f"running {case.name} ...", file=sys.stderr, flush=True)
        result = case.run(repeats, args.seed)
        results.append(result)
        # each row as soon as it is measured, so that a run stopped part way still says what it measured
        torch_ms = f"{result.torch.warm_ms:.4g}" if result.torch and result.torch.warm_ms is not None else "-"
        lazygrad_ms = f"{result.lazygrad.warm_ms:.4g}" if result.lazygrad.warm_ms is not None else "-"
        print(f"  lazygrad {lazygrad_ms} ms, torch {torch_ms} ms", file=sys.stderr, flush=True)
        targets += [goal.check(result) for goal in case.goals]

    table = format_table(results)
    print(table)
    if "*" in table:
        print(f"* median > {NOISY_RATIO:g}x the fastest call: the machine was busy; see warm_min_ms in --json or rerun")
    for result in results:
        if result.gflops:
            scale = 1e3 if result.rate_unit == "TFLOP/s" else 1.0
            rates = ", ".join(f"{library} {rate / scale:.3g}" for library, rate in result.gflops.items())
            print(f"{result.name} {result.rate_unit}: {rates}")
        if result.details:
            print(f"{result.name}: " + ", ".join(f"{key} {value:.3g}" for key, value in result.details.items()))
    print(f"\ntargets ({sum(target.met is True for target in targets)} of {len(targets)} met):")
    if args.quick:
        print("(--quick sizes: the targets are set for the full sizes)")
    print(format_targets(targets))

    failed = [result.name for result in results if result.matches_numpy is False or result.lazygrad.error]
    if failed:
        print(f"\n!!! {len(failed)} case(s) failed or mismatched NumPy: {', '.join(failed)}")
    if args.json:
        report = {"setup": describe_setup(torch_reason), "quick": args.quick, "repeats": repeats}
        report |= {"torch_device": TORCH_DEVICE, "skipped": skipped}
        report["cases"] = [asdict(result) for result in results]
        report["targets"] = [asdict(target) for target in targets]
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
