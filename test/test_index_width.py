"""32-bit index arithmetic on devices with threads (codegen/index_width.py), and the integer bounds it relies on."""

import itertools

import numpy as np
import pytest
from support import available
from test_opt import kernel_of

from lazygrad import Device, Tensor, dtypes
from lazygrad.codegen.heuristic import heuristic_opts
from lazygrad.codegen.index_width import narrow_indices
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.opt import apply_opts, prepare
from lazygrad.codegen.threads import map_threads
from lazygrad.engine.realize import render_kernel
from lazygrad.uop.alu import exec_alu
from lazygrad.uop.ops import LoopKind, Ops, UOp

I32, I64 = dtypes.int32, dtypes.int64
rng = np.random.default_rng(0)


def ranged(size: int, offset: int, axis: int) -> UOp:
    """A value taking every integer of [offset, offset + size) (a loop's index moved by a constant)."""
    loop = UOp(Ops.RANGE, I64, (UOp.const(I64, size),), (axis, LoopKind.GLOBAL))
    return loop + UOp.const(I64, offset)


@pytest.mark.parametrize(
    "op", [Ops.ADD, Ops.MUL, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.NEG, Ops.CMPLT, Ops.CMPNE, Ops.IDIV, Ops.MOD]
)
def test_integer_bounds_hold_every_value(op):
    """Every value an op gives over its operands' ranges lies within its bounds, and the bounds are reached where
    they are exact (ADD, MAX, NEG, the comparisons)."""
    for _ in range(40):
        a_size, b_size = (int(n) for n in rng.integers(1, 9, 2))
        a_low, b_low = (int(n) for n in rng.integers(-12, 12, 2))
        if op in (Ops.AND, Ops.OR, Ops.XOR):  # (their bounds are for operands that are never negative)
            a_low, b_low = abs(a_low), abs(b_low)
        if op in (Ops.IDIV, Ops.MOD):  # (the bounds of a division by one positive constant)
            b_size, b_low = 1, int(rng.integers(1, 7))
        a, b = ranged(a_size, a_low, 0), ranged(b_size, b_low, 1)
        node = UOp(op, dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else I64, (a,) if op is Ops.NEG else (a, b))
        values = {
            exec_alu(op, node.dtype, [x] if op is Ops.NEG else [x, y])
            for x, y in itertools.product(range(a_low, a_low + a_size), range(b_low, b_low + b_size))
        }
        low, high = node.bounds
        assert low <= min(values) and max(values) <= high, (op, a.bounds, b.bounds, node.bounds, sorted(values))
        if op in (Ops.ADD, Ops.MAX, Ops.NEG, Ops.CMPLT, Ops.CMPNE):
            assert (low, high) == (min(values), max(values)), (op, a.bounds, b.bounds)


def thread_kernel(tensor: Tensor) -> UOp:
    """The last kernel computing `tensor` on PYTHON, optimized by the heuristic and mapped onto its threads."""
    target = Device["PYTHON"].renderer.target
    kernel = prepare(lower_kernel(tensor.schedule()[-1].ast))
    return map_threads(apply_opts(kernel, heuristic_opts(kernel, target), target), target)


def index_dtypes(sink: UOp) -> set:
    return {node.dtype for node in sink.toposort if node.dtype in (I32, I64)}


def test_a_convolutions_indices_are_computed_in_int32():
    """The windows of a padded convolution divide and take remainders of their indices: all of it fits in int32."""
    x = Tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32), device="PYTHON").realize()
    w = Tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), device="PYTHON").realize()
    sink = thread_kernel(x.conv2d(w, padding=1).contiguous())
    assert index_dtypes(sink) == {I64} and index_dtypes(narrow_indices(sink)) == {I32}
    divisions = [node for node in narrow_indices(sink).toposort if node.op in (Ops.IDIV, Ops.MOD)]
    assert divisions and all(node.dtype == I32 for node in divisions)


@pytest.mark.parametrize(
    "make",
    [
        # more than 2**31 elements: an index past int32
        lambda: Tensor.empty(3, 1 << 30, device="PYTHON") + 1,
        # int64 values read from memory: their bounds are int64's
        lambda: Tensor.empty(40, dtype=dtypes.int64, device="PYTHON") + 1,
        # int64 values written to memory
        lambda: Tensor.arange(40, device="PYTHON").cast(dtypes.int64) * 3,
    ],
    ids=["past-int32", "int64-read", "int64-written"],
)
def test_kernels_whose_int64_values_may_not_fit_keep_them(make):
    sink = thread_kernel(make())
    assert narrow_indices(sink) is sink and I64 in index_dtypes(sink)


def test_a_bitcast_of_an_int64_value_keeps_its_64_bits():
    """`arange(...).bitcast(float64)`: the values fit in int32, but the bitcast reads all 64 bits of each."""
    result = Tensor.arange(6, dtype=dtypes.int64, device="PYTHON").bitcast(dtypes.float64)
    sink = thread_kernel(result)
    assert narrow_indices(sink) is sink
    np.testing.assert_array_equal(result.numpy(), np.arange(6, dtype=np.int64).view(np.float64))


@pytest.mark.parametrize("device", ["PYTHON", "CUDA", "GPU"])
def test_thread_devices_run_int32_indices(device):
    """A convolution's forward and backward passes, a permuted gather and a reduce over rows run with 32-bit
    indices on each device with threads, with NumPy's values; on CUDA and OpenCL the source declares no 64-bit
    index."""
    device = available(device)
    a = rng.standard_normal((2, 3, 10, 7)).astype(np.float32)
    b = rng.standard_normal((5, 3, 3, 2)).astype(np.float32)
    x, w = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    out = x.conv2d(w, padding=(1, 0), stride=(2, 1))
    out.square().sum().backward()
    torch = pytest.importorskip("torch")
    tx, tw = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    tout = torch.nn.functional.conv2d(tx, tw, padding=(1, 0), stride=(2, 1))
    tout.square().sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)

    def permuted():
        return Tensor(a, device=device).permute(3, 1, 0, 2)[:, ::2].sum(axis=3)

    np.testing.assert_allclose(permuted().numpy(), a.transpose(3, 1, 0, 2)[:, ::2].sum(axis=3), rtol=1e-5, atol=1e-5)
    if device != "PYTHON":
        runtime = Device[device]
        (item,) = permuted().schedule()
        kernel = kernel_of(permuted())
        opts = heuristic_opts(kernel, runtime.renderer.target)
        source = render_kernel(runtime, item.ast, apply_opts(kernel, opts, runtime.renderer.target), opts).source
        assert "long" not in source, source
