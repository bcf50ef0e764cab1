"""Device-specific tests for the C-style backends: CPU (C), GPU (OpenCL) and CUDA.

Each backend that can run here compiles and runs a few kernels (elementwise, reduce, matmul, half, bool, int) and
must match NumPy; a backend that cannot run is skipped with the reason its error gives. CUDA runs where a driver
exists or with `MOCKCUDA=1`. The rendered sources are checked without any device, and the disk cache is checked
across two processes.
"""

import ctypes
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from support import available

from lazygrad import Device, Tensor, dtypes
from lazygrad.codegen.heuristic import heuristic_opts
from lazygrad.codegen.linearize import linearize
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.opt import Opt, OptOp, apply_opts, prepare
from lazygrad.codegen.renderer import Target, kernel_name
from lazygrad.codegen.renderer.cstyle import CStyleRenderer, CUDARenderer, shuffle_mask
from lazygrad.codegen.renderer.opencl import OpenCLRenderer
from lazygrad.codegen.threads import kernel_launch, launch_size, map_threads
from lazygrad.device import Buffer, DeviceUnavailable
from lazygrad.helpers import DEVICE_ENV_VARS
from lazygrad.uop.ops import LoopKind, Ops, UOp

BACKENDS = ["CPU", "GPU", "CUDA"]
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=BACKENDS)
def device(request) -> str:
    """A backend's name, or a skip saying why it cannot run here."""
    return available(request.param)


def numbers(*shape, seed=0, low=-2.0, high=2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def integers(*shape, seed=0, low=-50, high=50) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(np.int32)


# ---- kernels run on each backend ---------------------------------------------------------------------------------


def test_elementwise(device):
    a, b = numbers(7, 33, seed=1), numbers(7, 33, seed=2)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    result = ((x * y + 1.5).exp2() - x.abs().sqrt()).numpy()
    expected = np.exp2(a * b + 1.5) - np.sqrt(np.abs(a))
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def test_reduce(device):
    a = numbers(13, 65, seed=3)
    x = Tensor(a, device=device)
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.max(axis=0).numpy(), a.max(axis=0))
    np.testing.assert_allclose(x.sum().numpy(), a.sum(), rtol=1e-5, atol=1e-4)


def test_matmul(device):
    a, b = numbers(17, 33, seed=4), numbers(33, 9, seed=5)
    result = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
    np.testing.assert_allclose(result, a @ b, rtol=1e-5, atol=1e-5)


def test_half(device):
    a, b = numbers(50, seed=6).astype(np.float16), numbers(50, seed=7).astype(np.float16)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    result = (x * y + x).numpy()
    assert result.dtype == np.float16
    np.testing.assert_allclose(result.astype(np.float32), (a * b + a).astype(np.float32), rtol=1e-3, atol=1e-3)
    # casts round to half: 1 + 2**-12 is not a half, and 70000 overflows
    wide = Tensor(np.array([1 + 2**-12, 70000.0, -3.25], dtype=np.float32), device=device)
    np.testing.assert_array_equal(wide.cast(dtypes.float16).numpy(), np.array([1.0, np.inf, -3.25], np.float16))
    assert Tensor(a, device=device).sum().numpy().dtype == np.float16


def test_bool(device):
    a, b = numbers(40, seed=8), numbers(40, seed=9)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    less = x < y
    np.testing.assert_array_equal(less.numpy(), a < b)
    np.testing.assert_array_equal((less & (x > 0)).numpy(), (a < b) & (a > 0))
    np.testing.assert_array_equal(less.where(x, y).numpy(), np.where(a < b, a, b))
    np.testing.assert_array_equal(Tensor(a > 0, device=device).cast(dtypes.float32).numpy(), (a > 0).astype(np.float32))


def test_int(device):
    a, b = integers(60, seed=10), integers(60, seed=11, low=1, high=9) * np.where(np.arange(60) % 2, 1, -1)
    b = b.astype(np.int32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    np.testing.assert_array_equal((x * y + 3).numpy(), a * b + 3)
    # the primitives truncate like C; floor division and modulo follow Python, built from them
    np.testing.assert_array_equal((x // y).numpy(), a // b)
    np.testing.assert_array_equal((x % y).numpy(), a % b)
    np.testing.assert_array_equal((x ^ y).numpy(), a ^ b)
    np.testing.assert_array_equal((x << 2).numpy(), a << 2)
    np.testing.assert_array_equal((x >> 1).numpy(), a >> 1)
    np.testing.assert_array_equal(x.max().numpy(), a.max())
    wrapped = Tensor(np.array([2**31 - 1], np.int32), device=device) + 1
    assert wrapped.numpy().tolist() == [-(2**31)]


def test_special_floats(device):
    a = np.array([1.0, np.nan, -np.inf, np.inf, -0.0, 2.5], dtype=np.float32)
    x = Tensor(a, device=device)
    np.testing.assert_array_equal(x.maximum(0.0).numpy(), np.maximum(a, 0.0))  # NaN propagates
    np.testing.assert_array_equal((x != x).numpy(), a != a)  # unordered not-equal
    np.testing.assert_array_equal(x.cast(dtypes.bool).numpy(), a.astype(bool))
    assert np.isnan(x.max().numpy())
    np.testing.assert_array_equal((x * 0.1).numpy(), a * np.float32(0.1))  # constants are exact


def test_shapes_the_opencl_renderer_vectorizes(device):
    """Innermost loops of a multiple of 8 iterations: OpenCL computes them in float8 lanes (contiguous, strided,
    reversed, broadcast and gated accesses); the other devices must agree."""
    a, b = numbers(16, 24, seed=13), numbers(24, 32, seed=14)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.sum(axis=0).numpy(), a.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(x.T.contiguous().numpy(), a.T)
    np.testing.assert_array_equal(x.flip(1).numpy(), a[:, ::-1])
    np.testing.assert_array_equal(x.pad(((0, 0), (3, 5))).numpy(), np.pad(a, ((0, 0), (3, 5))))
    np.testing.assert_array_equal((x[:, :8] + Tensor(a[0, :8], device=device)).numpy(), a[:, :8] + a[0, :8])
    np.testing.assert_array_equal((x > 0).where(x, -x).numpy(), np.abs(a))
    np.testing.assert_array_equal(((x > 0) != (x < 1)).numpy(), (a > 0) != (a < 1))
    halves = x.cast(dtypes.float16)
    np.testing.assert_array_equal((halves * 3).numpy(), a.astype(np.float16) * np.float16(3))
    i, j = integers(8, 16, seed=15), integers(8, 16, seed=16, low=-3, high=4)
    u, v = Tensor(i, device=device), Tensor(j, device=device)
    np.testing.assert_array_equal((u // v.maximum(1)).numpy(), i // np.maximum(j, 1))
    np.testing.assert_array_equal(u.cast(dtypes.float32).numpy(), i.astype(np.float32))
    np.testing.assert_array_equal((u < v).numpy(), i < j)
    np.testing.assert_array_equal((u > 0).sum(axis=0).numpy(), (i > 0).sum(axis=0))
    # full reductions: vector accumulators on OpenCL, a group reduction in shared memory on CUDA
    np.testing.assert_allclose(x.sum().numpy(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose((x * 2).mean().numpy(), (a * 2).mean(), rtol=1e-5)
    assert x.max().numpy() == a.max() and u.sum().numpy() == i.sum() and (u > 40).any().numpy() == (i > 40).any()
    np.testing.assert_allclose(halves.sum().numpy(), a.astype(np.float16).sum(dtype=np.float32), rtol=1e-2)


def run_linear_program(device_name: str, program: list[UOp], output: Buffer, *inputs: Buffer) -> np.ndarray:
    """Render, compile and run a hand-written linear program on a device; the output buffer's values."""
    device = Device[device_name]
    binary = device.compiler.compile_cached(device.renderer.render("probe", program))
    device.runtime("probe", binary, kernel_launch(program, device.renderer))(
        output.handle, *(buffer.handle for buffer in inputs)
    )
    return output.numpy()


@pytest.mark.skipif(not hasattr(Ops, "BITCAST") or not hasattr(dtypes, "float64"), reason="no BITCAST/float64 here")
@pytest.mark.parametrize("size", [16, 5])
def test_doubles_and_bitcasts_inside_kernels(device, size):
    """Kernels may compute in float64 and reinterpret bits, though tensors have neither (a loop VECTORIZE made: 5 is
    scalar code everywhere, 16 vector lanes on OpenCL, a plain loop on the other devices)."""
    values = numbers(size, seed=17, low=0.5, high=4.0)
    output, source = Buffer(device, size, dtypes.int32), Buffer(device, size, dtypes.float32).copyin(values)
    parameters = [
        UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), (0, size)),
        UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, size)),
    ]
    loop = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, size),), (0, LoopKind.VECTOR))
    loaded = UOp(Ops.LOAD, dtypes.float32, (parameters[1], loop))
    wide = UOp(Ops.CAST, dtypes.float64, (loaded,))
    root = UOp(Ops.SQRT, dtypes.float64, (UOp(Ops.MUL, dtypes.float64, (wide, UOp.const(dtypes.float64, 2.0))),))
    narrow = UOp(Ops.CAST, dtypes.float32, (root,))
    bits = UOp(Ops.BITCAST, dtypes.int32, (narrow,))
    store = UOp(Ops.STORE, dtypes.void, (parameters[0], loop, bits))
    program = [*parameters, loop, loaded, wide, root.src[0], root, narrow, bits, store, UOp(Ops.ENDRANGE, src=(loop,))]
    expected = np.sqrt(values.astype(np.float64) * 2).astype(np.float32).view(np.int32)
    np.testing.assert_array_equal(run_linear_program(device, program, output, source), expected)


# an OpenCL GPU as codegen sees it: no vectors, work-groups of up to 256 work-items
GPU_TARGET = Target(vector_width=1, max_threads=256, block_threads=64, shared_memory=1 << 15)


@pytest.mark.parametrize(
    "dtype, values",
    [
        (dtypes.float32, numbers(1000, seed=18)),
        (dtypes.float32, numbers(512, seed=22)),  # 64 work-items: their partials combined by a tree
        (dtypes.float32, np.where(np.arange(300) == 77, np.nan, numbers(300, seed=19))),
        (dtypes.int32, integers(999, seed=20)),
        (dtypes.bool, np.arange(100) == 63),
        (dtypes.float16, numbers(200, seed=21, low=0.0, high=1.0)),
    ],
)
def test_opencl_group_reductions_run_on_pocl(dtype, values):
    """The group reductions GPUs get (vector width 1), run on PoCL: every work-item of one group takes a share of
    the loop, and the partial results meet in local memory (a tree of rounds where the work-items are a power of
    two)."""
    try:
        device = Device["GPU"]
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    from lazygrad.runtime.ops_gpu import CLProgram

    values = values.astype(dtype.np)
    tensor = Tensor(values)
    reduced = tensor.max() if dtype == dtypes.bool or np.isnan(values).any() else tensor.sum()
    renderer = OpenCLRenderer(GPU_TARGET)
    (program,) = optimized_programs(reduced, GPU_TARGET)
    source = renderer.render("probe", program)
    assert "barrier(CLK_LOCAL_MEM_FENCE);" in source and "__local" in source
    built = device.cl.Program(device.context, [device.device], [device.compiler.compile(source)]).build()
    blocks, threads = launch_size(program, GPU_TARGET)
    assert blocks == 1 and threads > 1
    runner = CLProgram(device, device.cl.Kernel(built, "probe"), (blocks, threads))
    output, data = Buffer("GPU", 1, reduced.dtype), Buffer("GPU", values.size, dtype).copyin(values)
    runner(output.handle, data.handle)
    expected = reduced.numpy()  # (the default device's value)
    np.testing.assert_allclose(output.numpy().astype(np.float64), np.float64(expected), rtol=1e-3)


def test_an_opencl_kernel_in_work_groups_larger_than_the_driver_runs_is_refused():
    """A kernel's work-groups may not pass what the driver runs of that kernel (NVIDIA's lowers it for a kernel of
    many registers): the program says so when made, and BEAM passes over such a candidate."""
    device = Device[available("GPU")]
    from lazygrad.device import LaunchRefused
    from lazygrad.runtime.ops_gpu import CLProgram

    built = device.cl.Program(device.context, "__kernel void probe(__global float* x) {}").build()
    kernel = device.cl.Kernel(built, "probe")
    most = kernel.get_work_group_info(device.cl.kernel_work_group_info.WORK_GROUP_SIZE, device.device)
    assert CLProgram(device, kernel, (1, most)).local_size == most
    with pytest.raises(LaunchRefused, match=f"GPU: kernel probe cannot run in work-groups of {2 * most}: this device "):
        CLProgram(device, kernel, (1, 2 * most))


def test_beam_times_opencl_kernels_by_their_profiling_events(monkeypatch):
    """A candidate's timed runs are the device's own times of the kernel (its launch's profiling event), not the
    host's clock around the launch and the wait."""
    from lazygrad.engine import realize, search

    x = Tensor(numbers(4096, seed=31), device=available("GPU")).realize()
    (item,) = (x * 5).schedule()
    program = realize.get_kernel(item.device, item.ast).program  # (x * 5's: the cache holds other tests' too)
    times = []
    timed = type(program).timed
    monkeypatch.setattr(type(program), "timed", lambda self, *buffers: times.append(timed(self, *buffers)) or times[-1])
    seconds = search._time(program, [("GPU", 4096, dtypes.float32)] * 2)
    assert len(times) == search.TIMED_RUNS and seconds == min(times) and 0 < seconds < 1


def test_an_opencl_program_compiled_in_this_process_is_built_once(monkeypatch):
    """The program the compiler built from source is the one the device runs: built again from its binary, PoCL
    would generate its machine code a second time, taking as long again."""
    device = Device[available("GPU")]
    builds = []
    build = device.cl.Program.build
    monkeypatch.setattr(
        device.cl.Program,
        "build",
        lambda program, *args, **options: builds.append(program) or build(program, *args, **options),
    )
    x = numbers(37, seed=5)
    # (constants of no other test: this kernel is compiled here, not found in a cache)
    np.testing.assert_allclose((Tensor(x, device="GPU") * 3.2519 + 1.0173).numpy(), x * 3.2519 + 1.0173, rtol=1e-6)
    assert len(builds) == 1


@pytest.mark.parametrize("name", ["LLVM", *BACKENDS])
def test_tinyjit_replays_through_the_device_graph(name, monkeypatch, capsys):
    """Every device replays a captured step without a launch per kernel from the engine: GPU with prebuilt OpenCL
    argument lists, CUDA as a CUDA graph, LLVM and CPU with prebuilt arrays of buffer addresses. Values stay right
    as the inputs' buffers change."""
    from lazygrad import Context, TinyJit
    from lazygrad.engine import realize

    device = available(name)
    weights = numbers(6, 5, seed=40)
    weight = Tensor(weights, device=device).realize()
    step = TinyJit(lambda x: ((x @ weight).relu() * 0.5).sum(axis=1).realize())
    launches = []
    launch_kernel = realize.launch_kernel
    monkeypatch.setattr(realize, "launch_kernel", lambda *arguments: launches.append(launch_kernel(*arguments)))
    for call in range(4):
        data = numbers(4, 6, seed=41 + call)
        result = step(Tensor(data, device=device)).numpy()
        np.testing.assert_allclose(result, (np.maximum(data @ weights, 0) * 0.5).sum(axis=1), rtol=1e-5, atol=1e-6)
    kernels = len(step.launches)
    assert len(launches) == 2 * kernels  # the first two calls ran and captured; the two replays launched none
    with Context(DEBUG=2):
        step(Tensor(numbers(4, 6, seed=50), device=device)).numpy()
    assert f"graph of {kernels} kernels, one launch" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["LLVM", "CPU"])
def test_a_host_graph_runs_a_replay_in_one_call(name):
    """On LLVM and CPU a replay calls the device's kernel runner once, with a table of the kernels' functions and
    argument arrays; the values follow the inputs, and a kernel whose code was released stops a replay with a clear
    error instead of a call into freed memory."""
    from lazygrad import TinyJit
    from lazygrad.device import HostGraph

    device = available(name)
    # (constants of no other test: the kernels are this test's own, so releasing one touches no other test)
    step = TinyJit(lambda t: ((t * 2.0625 + 1.03125).realize(), (t.exp() - 1.0078125).realize(), t.sum().realize()))
    for call in range(4):
        data = numbers(64, seed=60 + call)
        scaled, shifted, total = step(Tensor(data, device=device))
        np.testing.assert_allclose(scaled.numpy(), data * 2.0625 + 1.03125, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(shifted.numpy(), np.exp(data) - 1.0078125, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(total.numpy(), data.sum(), rtol=1e-5, atol=1e-5)
    (graph,) = [graph for _, _, graph in step.plan if graph is not None]
    assert isinstance(graph, HostGraph) and not graph.shared  # (small kernels run whole on the caller's thread)
    graph.programs[1].release()
    with pytest.raises(RuntimeError, match="released"):
        step(Tensor(numbers(64, seed=70), device=device))


@pytest.mark.parametrize("name", ["LLVM", "CPU"])
def test_a_host_graph_shares_the_outer_loops_of_large_kernels_with_spinning_workers(name):
    """A replay's large kernels are shared with a worker per other core, which takes chunks of their outer loop
    while the runner takes the others: the values are the same. A worker that waits before the runner starts joins
    every shared kernel: each chunk then runs once, on one thread or the other (a kernel that counts its calls per
    chunk shows it), and the worker returns once told to stop."""
    import array
    import threading

    from lazygrad import TinyJit
    from lazygrad.device import CORES

    if CORES < 2:
        pytest.skip("one core: no worker to share with")
    device = available(name)
    step = TinyJit(lambda a, b: ((a @ b).relu().realize(), (a * 3.0625).sum(1).realize()))
    for call in range(4):
        a, b = numbers(256, 512, seed=80 + call), numbers(512, 256, seed=90 + call)
        product, sums = step(Tensor(a, device=device), Tensor(b, device=device))
        np.testing.assert_allclose(product.numpy(), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(sums.numpy(), (a * 3.0625).sum(1), rtol=1e-5, atol=1e-4)
    (graph,) = [graph for _, _, graph in step.plan if graph is not None]
    assert graph.shared and all(graph.table[3 :: graph.words])  # both kernels are shared, in chunks

    # the protocol on its own: a table of one "kernel", a Python callback that records the chunks it is given
    team, layout = graph.team, graph.team.layout
    chunks, threads = [], set()
    kernel_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)

    @kernel_type
    def record(buffers, start, end):
        chunks.append((start, end))
        threads.add(threading.get_ident())
        time.sleep(0.002)  # (long enough that the worker takes some)

    outer, chunk = 40, 3
    table = array.array("Q", [ctypes.cast(record, ctypes.c_void_p).value, 0, outer, chunk])
    words = array.array("q", [0]) * layout.words
    words[layout.state] = layout.closed
    address = words.buffer_info()[0]
    worker = threading.Thread(target=team.worker.function, args=(None, address, 0))
    worker.start()
    time.sleep(0.05)
    assert worker.is_alive()  # (no call has ended: it waits for a kernel however long)
    team.runner.function(table.buffer_info()[0], address, 1)
    words[layout.idle] = 1  # the call ended: it lingers a little, then returns
    worker.join(timeout=30)
    assert not worker.is_alive() and len(threads) == 2
    assert sorted(chunks) == [(start, min(start + chunk, outer)) for start in range(0, outer, chunk)]
    assert words[layout.state] == layout.epoch_unit + layout.closed  # one kernel shared, closed, nobody inside


def test_each_shared_call_wakes_the_same_worker_threads():
    """The team's workers are threads of its own that sleep between calls: a call wakes each (no thread pool's
    submit, ~10 us of Python), and every call that waits for them is shared by the same threads. After a call a
    worker lingers in native code a little, where the next call finds it awake, then sleeps."""
    import array
    import threading

    from lazygrad.device import CORES

    if CORES < 2:
        pytest.skip("one core: no worker to share with")
    team = Device[available("LLVM")].team()
    kernel_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    calls: list[set[int]] = []

    @kernel_type
    def record(buffers, start, end):
        calls[-1].add(threading.get_ident())
        time.sleep(0.002)  # (long enough that the worker wakes and takes some)

    outer = 200
    table = array.array("Q", [ctypes.cast(record, ctypes.c_void_p).value, 0, outer, 1])
    for _ in range(3):
        calls.append(set())
        team.run(table.buffer_info()[0], 1)
    assert all(len(threads) == CORES for threads in calls) and calls[0] == calls[1] == calls[2]
    workers = {thread.ident for thread in threading.enumerate() if thread.name.startswith("lazygrad-worker-")}
    assert calls[0] - {threading.get_ident()} <= workers
    assert all(team.inside)  # lingering, awake for a next call
    deadline = time.perf_counter() + 20
    while any(team.inside) and time.perf_counter() < deadline:
        time.sleep(0.001)
    assert not any(team.inside) and all(wake.locked() for wake in team.wakes)  # asleep until a call wakes it


@pytest.mark.parametrize("name", ["LLVM", "CPU"])
def test_a_large_kernel_outside_a_replay_is_shared_with_the_other_cores(name):
    """A kernel with enough work shares its outer loop with the worker threads it wakes (they join when they
    wake up): a large row sum's values are the same, whichever thread ran each chunk."""
    from lazygrad.device import CORES, HostProgram
    from lazygrad.engine.realize import get_kernel

    device = available(name)
    data = numbers(1024, 512, seed=33)
    x = Tensor(data, device=device).realize()
    rows = x.sum(1) * 1.5
    (item,) = rows.schedule()
    program = get_kernel(device, item.ast).program
    assert program.work >= HostProgram.PARALLEL_WORK and program.outer > 1 and CORES > 1
    for _ in range(3):  # (the first call's worker may join no chunk: it starts late)
        np.testing.assert_allclose((x.sum(1) * 1.5).numpy(), data.sum(1) * 1.5, rtol=1e-5, atol=1e-4)


def test_debug_2_can_be_turned_on_after_the_device_opened(device, capsys):
    """Kernel times come from the device's own events (OpenCL profiling, CUDA events) whenever DEBUG=2 is set."""
    from lazygrad import Context

    x = Tensor(numbers(1000, seed=42), device=device).realize()
    (x * 4).realize()
    with Context(DEBUG=2):
        np.testing.assert_allclose((x * 5).numpy(), numbers(1000, seed=42) * 5, rtol=1e-6)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"*** {device}"))
    assert float(line.split(" ms")[0].split()[-1]) > 0


# ---- rendered sources ----------------------------------------------------------------------------------------------


def linear_programs(tensor: Tensor) -> list[list]:
    """The unoptimized linear program of each kernel that realizing `tensor` would run: the loops are the tensor's
    axes, whatever the optimizer would choose (merging, upcasting, unrolling)."""
    return [linearize(lower_kernel(item.ast)) for item in tensor.schedule() if item.kind == "kernel"]


def render(renderer, tensor: Tensor) -> str:
    (program,) = linear_programs(tensor)
    return renderer.render(kernel_name(program), program)


def optimized_programs(tensor: Tensor, target: Target) -> list[list]:
    """The linear program of each kernel realizing `tensor` would run, with the actions the heuristic chooses for
    `target`, mapped onto its threads."""
    programs = []
    for item in tensor.schedule():
        if item.kind == "kernel":
            prepared = prepare(lower_kernel(item.ast))
            optimized = apply_opts(prepared, heuristic_opts(prepared, target), target)
            programs.append(linearize(map_threads(optimized, target)))
    return programs


def render_optimized(renderer, tensor: Tensor) -> tuple[str, tuple[int, int]]:
    """The source and launch size of the one kernel realizing `tensor` takes, as `renderer`'s device gets it."""
    (program,) = optimized_programs(tensor, renderer.target)
    return renderer.render(kernel_name(program), program), launch_size(program, renderer.target)


def test_gpu_sources_use_block_and_thread_indices():
    elementwise = Tensor(numbers(4, 8)) * 2
    (opencl, opencl_launch), (cuda, cuda_launch) = (
        render_optimized(renderer, elementwise) for renderer in (OpenCLRenderer(GPU_TARGET), CUDARenderer())
    )
    assert "get_local_id(0)" in opencl and "__kernel void" in opencl and opencl_launch == (1, 32)
    assert "threadIdx.x" in cuda and "__global__ void" in cuda and cuda_launch == (1, 32)
    assert "for (" not in cuda and "if (" not in cuda  # a thread per output: no loop, no bounds check
    wide, launch = render_optimized(CUDARenderer(), Tensor(numbers(64, 512)) * 2)
    assert "blockIdx.x" in wide and "threadIdx.x" in wide and launch == (128, 256)
    c_source = render(CStyleRenderer(), elementwise)
    assert "for (" in c_source and "get_local_id" not in c_source and "threadIdx" not in c_source


def test_opencl_vectorizes_a_loop_the_heuristic_cuts_to_vector_width():
    opencl, launch = render_optimized(OpenCLRenderer(), Tensor(numbers(4, 32)) * 2)
    assert "vload8(" in opencl and "vstore8(" in opencl and "float8" in opencl
    assert launch == (1, 16)  # 128 outputs: 16 work-items of 8 lanes each
    # a reduce inside each work-item: its loads are contiguous along it, so its accumulator holds 8 lanes
    assert "float8 acc0" in render_optimized(OpenCLRenderer(), Tensor(numbers(4, 8, 16)).sum(axis=2))[0]
    wide = OpenCLRenderer(Target(vector_width=16, max_threads=256, block_threads=64, shared_memory=1 << 15))
    assert wide.lanes_for(64) == 16 and wide.lanes_for(24) == 8 and wide.lanes_for(12) == 4 and wide.lanes_for(6) == 1
    assert "float16 acc0" in render_optimized(wide, Tensor(numbers(16, 32)).sum(axis=0))[0]
    assert "float4" not in render_optimized(OpenCLRenderer(GPU_TARGET), Tensor(numbers(4, 32)) * 2)[0]
    assert "float8" not in render_optimized(OpenCLRenderer(), Tensor(numbers(3, 5)) * 2)[0]  # 15: no multiple of 4


def test_opencl_computes_in_vectors_only_the_loop_an_action_vectorized():
    """Which loop is computed in vector lanes is the VECTORIZE action's choice, not the renderer's: the same kernel
    with that action left out is scalar code, and a reduce loop VECTORIZE took is computed in vector accumulators."""
    renderer = OpenCLRenderer()
    kernel = prepare(lower_kernel(next(iter((Tensor(numbers(4, 32)) * 2).schedule())).ast))
    opts = heuristic_opts(kernel, renderer.target)
    assert opts[2:4] == (Opt(OptOp.LOOP, 1), Opt(OptOp.VECTORIZE, 1))

    def source(opts: tuple[Opt, ...]) -> str:
        program = linearize(map_threads(apply_opts(kernel, opts, renderer.target), renderer.target))
        return renderer.render("probe", program)

    assert "vstore8(" in source(opts)
    scalar = source(opts[:3] + opts[4:])
    assert "float8" not in scalar and "for (" in scalar  # a loop of 8 in each work-item
    rows = prepare(lower_kernel(next(iter(Tensor(numbers(6, 16)).sum(axis=1).schedule())).ast))
    program = linearize(map_threads(apply_opts(rows, (Opt(OptOp.VECTORIZE, 1),), renderer.target), renderer.target))
    assert "float8 acc0" in renderer.render("probe", program)
    program = linearize(map_threads(rows, renderer.target))
    assert "float8" not in renderer.render("probe", program)


def test_full_reductions_render_group_and_vector_reductions():
    total = Tensor(numbers(1000)).sum()
    cuda, launch = render_optimized(CUDARenderer(), total)
    assert "__shared__ float shared0[250];" in cuda and "__syncthreads();" in cuda and launch == (1, 250)
    assert "if (v" in cuda  # one thread stores the result
    opencl_gpu, launch = render_optimized(OpenCLRenderer(GPU_TARGET), total)
    assert "__local float shared0[50];" in opencl_gpu and "barrier(CLK_LOCAL_MEM_FENCE);" in opencl_gpu
    assert launch == (1, 50)
    opencl_cpu, launch = render_optimized(OpenCLRenderer(), total)
    assert "float8 acc0" in opencl_cpu and "acc0.s7" in opencl_cpu and "__local" not in opencl_cpu
    assert launch == (1, 1)


def test_a_gpu_group_combines_each_warp_by_shuffles_where_the_device_has_them():
    """CUDA's threads read each other's values within a warp (`__shfl_sync`): a row of 32 threads combines with no
    shared memory or barrier (a butterfly of 5 shuffles, then the first thread's value); a block of 256 combines in
    each warp, then through one barrier, each thread reading the 8 warps' results. OpenCL has no shuffles: a tree
    in shared memory, a barrier a round."""
    rows = Tensor(numbers(64, 512)).sum(axis=1)
    cuda, launch = render_optimized(CUDARenderer(), rows)
    assert launch == (64, 32) and cuda.count("__shfl_sync(0xffffffffu, ") == 6
    assert "__syncthreads" not in cuda and "__shared__" not in cuda
    total = Tensor(numbers(64, 12)).sum()
    cuda, launch = render_optimized(CUDARenderer(), total)
    assert launch == (1, 256) and cuda.count("__shfl_sync(") == 5 and cuda.count("__syncthreads();") == 1
    assert "ridx32 < 8" in cuda and "shared0[v33]" in cuda  # (the warps' results, 32 threads apart)
    opencl, launch = render_optimized(OpenCLRenderer(GPU_TARGET), total)
    assert launch == (1, 64) and opencl.count("barrier(CLK_LOCAL_MEM_FENCE);") == 7 and "shfl" not in opencl
    # a block that ends inside a warp: its last warp's shuffles name only the lanes it has
    assert shuffle_mask(48) == "(threadIdx.x < 32 ? 0xffffffffu : 0xffffu)" and shuffle_mask(8) == "0xffu"


def test_gpu_sources_stage_a_matrix_product_in_shared_memory():
    """A 1024×64×512 product on a GPU: a block computes a block of outputs, each thread a register tile; per 16
    reduce iterations its threads copy what they read of both inputs into shared memory, between two barriers."""
    a, b = Tensor(numbers(1024, 64, seed=60)), Tensor(numbers(64, 512, seed=61))
    cuda, launch = render_optimized(CUDARenderer(), a @ b)
    assert launch == (128, 256)  # 16 × 16 threads of 4 × 4 outputs each
    assert cuda.count("__shared__ float") == 8 and cuda.count("__syncthreads();") == 2  # (4 rows and 4 columns)
    assert cuda.count("for (") == 2  # the reduce: 4 tiles of 16 iterations
    assert cuda.count("float acc") == 16  # one accumulator per output of the thread
    # per tile: the copy, a barrier, 16 iterations from shared memory, a barrier before the next copy
    tile = cuda[cuda.index("for (") :]
    copied, inner = tile.index("__syncthreads();"), tile.index("for (", 1)
    assert tile.index("shared0[") < copied < inner < tile.index("__syncthreads();", inner) < tile.index("data0[")
    opencl, launch = render_optimized(OpenCLRenderer(GPU_TARGET), a @ b)
    assert launch == (512, 64)  # 8 × 8 work-items of 4 × 4 outputs each: 32 × 32 outputs per work-group
    assert opencl.count("__local float") == 8 and opencl.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2
    assert "__local" not in render_optimized(OpenCLRenderer(), a @ b)[0]  # a CPU driver computes in vectors


@pytest.mark.parametrize("shape", [(64, 64, 64), (2, 32, 48, 16)], ids=str)
def test_opencl_tiled_products_run_on_pocl(shape):
    """The tiled products GPUs get (vector width 1), run on PoCL."""
    try:
        device = Device["GPU"]
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    from lazygrad.runtime.ops_gpu import CLProgram

    *batch, rows, depth, columns = shape
    x, y = numbers(*batch, rows, depth, seed=62), numbers(*batch, depth, columns, seed=63)
    (program,) = optimized_programs(Tensor(x) @ Tensor(y), GPU_TARGET)
    source = OpenCLRenderer(GPU_TARGET).render("probe", program)
    assert "__local" in source and "barrier(CLK_LOCAL_MEM_FENCE);" in source
    built = device.cl.Program(device.context, [device.device], [device.compiler.compile(source)]).build()
    runner = CLProgram(device, device.cl.Kernel(built, "probe"), launch_size(program, GPU_TARGET))
    output = Buffer("GPU", x.size // depth * columns, dtypes.float32)
    inputs = [Buffer("GPU", value.size, dtypes.float32).copyin(value) for value in (x, y)]  # (alive until it ran)
    runner(output.handle, *(buffer.handle for buffer in inputs))
    np.testing.assert_allclose(output.numpy().reshape(*batch, rows, columns), x @ y, rtol=1e-4, atol=1e-4)


def test_gpu_sources_keep_reduce_loops_inside_threads():
    opencl, launch = render_optimized(OpenCLRenderer(GPU_TARGET), Tensor(numbers(6, 10)).sum(axis=1))
    assert "get_local_id(0)" in opencl and "for (" in opencl and launch == (1, 6)
    # a softmax row shorter than a warp: its max and sum once per thread, the row's outputs a loop inside it
    cuda, launch = render_optimized(CUDARenderer(), Tensor(numbers(8, 16)).softmax(axis=1))
    assert cuda.count("for (") == 3 and launch == (1, 8)


def test_half_rendering():
    half_sum = Tensor(numbers(8).astype(np.float16)) + 1
    opencl, cuda, c_source = (
        render(renderer, half_sum) for renderer in (OpenCLRenderer(), CUDARenderer(), CStyleRenderer())
    )
    assert "vload_half" in opencl and "vstore_half" in opencl and "cl_khr_fp16" not in opencl
    assert "#include <cuda_fp16.h>" in cuda and "__float2half" in cuda
    assert "_Float16" in c_source


def test_float_constants_are_exact():
    renderer = CStyleRenderer()
    assert renderer.render_const(3.0, dtypes.float32) == "0x1.8p+1f"
    assert renderer.render_const(-0.1, dtypes.float32) == "(-0x1.99999ap-4f)"
    assert renderer.render_const(float("inf"), dtypes.float32) == "INFINITY"
    assert renderer.render_const(float("-inf"), dtypes.float32) == "(-INFINITY)"
    assert renderer.render_const(float("nan"), dtypes.float32) == "NAN"
    assert renderer.render_const(-(2**31), dtypes.int32) == "(-2147483647-1)"
    assert CUDARenderer().render_const(float("inf"), dtypes.float32) == "__int_as_float(0x7f800000)"


# ---- unavailable devices -----------------------------------------------------------------------------------------


def test_gpu_without_platform(monkeypatch):
    from lazygrad.runtime import ops_gpu

    class NoPlatforms:
        Error = RuntimeError

        @staticmethod
        def get_platforms():
            return []

    with pytest.raises(DeviceUnavailable) as error:
        ops_gpu.choose_device(NoPlatforms)
    assert str(error.value) == (
        "GPU: no OpenCL platform found (no driver is registered in /etc/OpenCL/vendors) — pip install "
        "'lazygrad[opencl]' for PoCL on the CPU; for an NVIDIA GPU register its driver: echo libnvidia-opencl.so.1 > "
        "/etc/OpenCL/vendors/nvidia.icd"
    )


def test_gpu_without_pyopencl(monkeypatch):
    from lazygrad.runtime import ops_gpu

    monkeypatch.setitem(sys.modules, "pyopencl", None)
    with pytest.raises(DeviceUnavailable, match=r"GPU: pyopencl is not installed — pip install 'lazygrad\[opencl\]'"):
        ops_gpu.open_device()


def test_cuda_without_driver(monkeypatch):
    from lazygrad.helpers import MOCKCUDA
    from lazygrad.runtime import cuda_driver, ops_cuda

    monkeypatch.setattr(cuda_driver, "LIBRARY", "libcuda-absent.so.1")
    monkeypatch.setattr(MOCKCUDA, "value", 0)
    message = (
        "CUDA: no NVIDIA driver (libcuda-absent.so.1: cannot open shared object file: No such file or directory) — "
        "install the NVIDIA driver, or set MOCKCUDA=1 to compile kernels with NVRTC and run them on the CPU"
    )
    with pytest.raises(DeviceUnavailable) as error:
        ops_cuda.open_device()
    assert str(error.value) == message


# ---- the CUDA shim ----------------------------------------------------------------------------------------------

BLOCK_SUM = """extern "C" __global__ void block_sum(float* __restrict__ data0, const float* __restrict__ data1) {
  __shared__ float partial[64];
  unsigned int thread = threadIdx.x;
  partial[thread] = data1[blockIdx.x * blockDim.x + thread];
  __syncthreads();
  for (unsigned int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (thread < stride) partial[thread] += partial[thread + stride];
    __syncthreads();
  }
  if (thread == 0) data0[blockIdx.x] = partial[0];
}
"""


def test_cuda_shim_runs_shared_memory_and_barriers():
    from lazygrad.runtime import cuda_compiler, cuda_mock, ops_cuda

    try:
        compiler = cuda_compiler.MockCUDACompiler()
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    driver = cuda_mock.MockDriver()
    driver.set_current_context(driver.primary_context(driver.device(0)))
    function = driver.module_function(driver.module_load(compiler.compile(BLOCK_SUM)), "block_sum")
    values = numbers(3 * 64, seed=12)
    out = np.zeros(3, dtype=np.float32)
    arguments, params = ops_cuda.argument_array(2)
    arguments[:] = [out.ctypes.data, values.ctypes.data]
    driver.launch(function, 3, 64, driver.stream_create(), params)
    np.testing.assert_allclose(out, values.reshape(3, 64).sum(axis=1), rtol=1e-5)


def test_cuda_compile_errors_show_source_and_log():
    from lazygrad.runtime import cuda_compiler

    try:
        compiler = cuda_compiler.NVRTCCompiler("compute_80")
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    broken = 'extern "C" __global__ void broken(float* data0) { data0[0] = undefined_name; }\n'
    with pytest.raises(RuntimeError, match=r"(?s)NVRTC failed to compile.*undefined_name.*identifier"):
        compiler.compile(broken)


# ---- the disk cache ----------------------------------------------------------------------------------------------

CACHE_SCRIPT = """
import json
import numpy as np
from lazygrad import Device, Tensor
from lazygrad.device import Buffer, DeviceUnavailable
from lazygrad.helpers import GlobalCounters
try:
    Device[Device.DEFAULT]
except DeviceUnavailable as error:
    print(json.dumps({"unavailable": str(error)}))
    raise SystemExit(0)
x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
assert ((x * 3 + 1).sum(axis=1).numpy() == (np.arange(24).reshape(4, 6) * 3 + 1).sum(axis=1)).all()
print(json.dumps({"compiles": GlobalCounters.compile_count, "hits": GlobalCounters.compile_cache_hits}))
"""


def run_on(device_name: str, cache: str) -> dict:
    """Run CACHE_SCRIPT in a new process on a device, with its own cache directory."""
    environment = {key: value for key, value in os.environ.items() if key not in DEVICE_ENV_VARS}
    environment.update({device_name: "1", "LAZYGRAD_CACHE": cache, "PYTHONPATH": REPOSITORY})
    if device_name == "CUDA":
        environment.setdefault("MOCKCUDA", "1")
    result = subprocess.run(
        [sys.executable, "-c", CACHE_SCRIPT], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("device_name", BACKENDS)
def test_disk_cache_is_reused_by_a_second_process(device_name, tmp_path):
    first = run_on(device_name, str(tmp_path))
    if "unavailable" in first:
        pytest.skip(first["unavailable"])
    assert first["compiles"] > 0
    second = run_on(device_name, str(tmp_path))
    assert second["compiles"] == 0 and second["hits"] > 0


# ---- selection -------------------------------------------------------------------------------------------------


def test_two_device_variables_are_an_error():
    environment = {key: value for key, value in os.environ.items() if key not in DEVICE_ENV_VARS}
    environment.update({"GPU": "1", "CUDA": "1", "PYTHONPATH": REPOSITORY})
    script = "from lazygrad import Device; Device.DEFAULT"
    result = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "GPU=1 and CUDA=1" in result.stderr and "pick one" in result.stderr


def test_ops_across_devices_name_both():
    a = Tensor([1.0, 2.0], device="PYTHON")
    b = Tensor([3.0, 4.0], device="LLVM")
    with pytest.raises(ValueError, match="PYTHON and LLVM"):
        a + b


def test_ops_of_tensors_on_two_devices_name_the_op_called():
    # not the elementwise step inside it (a matmul's mul, a cat's add)
    here, there = (
        Tensor(np.ones((2, 2), np.float32), device="LLVM"),
        Tensor(np.ones((2, 2), np.float32), device="PYTHON"),
    )
    index = Tensor(np.zeros((2, 2), np.int32), device="PYTHON")
    calls = {
        "matmul": lambda: here @ there,
        "cat": lambda: here.cat(there),
        "conv2d": lambda: here.reshape(1, 1, 2, 2).conv2d(there.reshape(1, 1, 2, 2)),
        "gather": lambda: here.gather(0, index),
        "einsum": lambda: Tensor.einsum("ij,jk->ik", here, there),
        "scaled_dot_product_attention": lambda: here.scaled_dot_product_attention(there, there),
        # (the condition's device was not checked: wrong kernel arguments, or a bare AttributeError)
        "where": lambda: (here > 0).where(there, 0.0),
        "masked_fill": lambda: here.masked_fill(there > 0, 0.0),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"^{name}: tensors are on different devices \(LLVM and PYTHON\)"):
            call()
    target = Tensor.zeros(2, 2).contiguous().realize()
    with pytest.raises(ValueError, match=r"^setitem: tensors are on different devices"):
        target[0] = there[0]


def test_to_copies_between_devices(device):
    source = numbers(6, seed=30)
    moved = Tensor(source, device="PYTHON").to(device)
    assert moved.device == device
    np.testing.assert_allclose((moved * 2).numpy(), source * 2)
    np.testing.assert_allclose((moved * 2).to("PYTHON").numpy(), source * 2)


def test_unknown_device_name():
    with pytest.raises(ValueError, match="unknown device"):
        Tensor([1.0], device="TPU")


def test_gradient_flows_back_across_a_copy():
    x = Tensor([1.0, 2.0], device="PYTHON")
    (x.to("LLVM") * 3).sum().backward()
    assert x.grad.device == "PYTHON"
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


# ---- C: a register block's accumulators as vectors ---------------------------------------------------------------

AVX2 = Target(vector_width=8, vector_registers=16)


@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((64, 96, 128), np.float32),
        ((36, 50, 40), np.float32),
        ((24, 40, 32), np.float64),
        ((256, 784, 512), np.float32),
    ],
)
def test_c_products_keep_register_blocks_in_vector_accumulators(shape, dtype):
    """gcc 12 leaves a register block of scalar accumulators scalar: the C renderer declares them as vectors of
    GCC's vector extensions (each lane updated exactly as its scalar was), and the values stay NumPy's."""
    rows, depth, columns = shape
    x = np.random.default_rng(1).uniform(-1, 1, (rows, depth)).astype(dtype)
    w = np.random.default_rng(2).uniform(-1, 1, (depth, columns)).astype(dtype)
    source, _ = render_optimized(CStyleRenderer(AVX2), Tensor(x) @ Tensor(w))
    lanes = 8 if dtype == np.float32 else 4
    assert "__attribute__((vector_size(32)))" in source and f"lg_{'float' if lanes == 8 else 'double'}{lanes}" in source
    assert "__builtin_memcpy(&vread" in source
    result = (Tensor(x, device=available("CPU")) @ Tensor(w, device="CPU")).numpy()
    np.testing.assert_allclose(result, x @ w, rtol=1e-4, atol=1e-4)


def test_c_sums_down_columns_add_whole_vectors():
    """A sum over the rows of a matrix (the bias gradient of a layer): each vector accumulator adds a row's vector of
    columns, with no product."""
    x = numbers(300, 64, seed=3)
    source, _ = render_optimized(CStyleRenderer(AVX2), Tensor(x).sum(0))
    assert "vector_size(32)" in source and " * " not in "".join(
        line for line in source.splitlines() if "+= vread" in line
    )
    np.testing.assert_allclose(Tensor(x, device=available("CPU")).sum(0).numpy(), x.sum(0), rtol=1e-5, atol=1e-4)


def test_c_reduce_loops_left_to_the_compiler_may_reassociate_their_sums():
    """A product whose inputs are contiguous along its reduce (x @ wᵀ) leaves that loop to gcc's vectorizer, which
    vectorizes no float sum unless told that it may reassociate it: the loop carries `#pragma omp simd` with its
    accumulators as reductions (an AVX-512 machine: 8.0 -> 1.1 ms for a 256x784 @ 784x512 product), a max reduce
    no pragma; values stay NumPy's."""
    x, w = numbers(64, 200, seed=23), numbers(96, 200, seed=24)
    source, _ = render_optimized(CStyleRenderer(AVX2), Tensor(x) @ Tensor(w).T)
    (pragma,) = [line.strip() for line in source.splitlines() if "#pragma" in line]
    assert pragma.startswith("#pragma omp simd reduction(+:acc0,acc1,")
    maximum, _ = render_optimized(CStyleRenderer(AVX2), Tensor(x).max(1))
    assert "#pragma" not in maximum
    product = (Tensor(x, device=available("CPU")) @ Tensor(w, device="CPU").T).numpy()
    np.testing.assert_allclose(product, x @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(Tensor(x, device="CPU").max(1).numpy(), x.max(1))


def test_c_gathers_the_pixels_a_convolution_block_shares():
    """A register block of a stride-2 convolution (ResNet's stem, its input padded) reads every other pixel of a
    row: the C renderer gathers them into one vector that every output channel of the block multiplies by its weight
    (a gated input made it gather the channels' weights instead: a Zen 5, 11 -> 0.8 ms, as LLVM's), values NumPy's.
    A gather that only one vector would read stays a loop gcc vectorizes along the reduce (x @ wᵀ)."""
    x, w = np.pad(numbers(4, 3, 16, 16, seed=40), ((0, 0), (0, 0), (3, 3), (3, 3))), numbers(32, 3, 7, 7, seed=41)
    source, _ = render_optimized(CStyleRenderer(AVX2), Tensor(x).conv2d(Tensor(w), stride=2))
    gathers = [line.split()[1] for line in source.splitlines() if line.strip().startswith("lg_float8 vread")]
    assert gathers and all(source.count(f"+= {gather} * ") > 1 for gather in gathers)
    assert "_at[2]" in source  # the next output column's pixel: a stride on
    result = Tensor(x, device=available("CPU")).conv2d(Tensor(w, device="CPU"), stride=2).numpy()
    windows = np.lib.stride_tricks.sliding_window_view(x, (7, 7), (2, 3))
    expected = np.einsum("ncyxhw,ochw->noyx", windows[:, :, ::2, ::2], w)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
    rows, weights = numbers(8, 600, seed=42), numbers(96, 600, seed=43)
    source, _ = render_optimized(CStyleRenderer(AVX2), Tensor(rows) @ Tensor(weights).T)
    assert "_at[" not in source and "#pragma omp simd" in source


def test_c_reads_a_load_once_per_stride_of_the_vectors_it_starts():
    """A register block of a 2x2 convolution (33 outputs along a row, 3 rows) has vectors of consecutive outputs
    and of every other one, and the same pixel starts one of each: the C renderer kept one read per first pixel and
    gave the every-other vector the consecutive read (wrong values); values NumPy's."""
    x, w = numbers(2, 8, 14, 32, seed=80), numbers(4, 8, 2, 2, seed=81)
    result = Tensor(x, device=available("CPU")).conv2d(Tensor(w, device="CPU"), padding=1).numpy()
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (2, 2), (2, 3))
    np.testing.assert_allclose(result, np.einsum("ncyxhw,ochw->noyx", windows, w), rtol=1e-4, atol=1e-4)


def test_c_collapses_a_short_reduce_loop_with_the_reduce_loops_around_it():
    """A convolution's weight gradient reduces over a window whose innermost loop is short: gcc adds the lanes of
    each vector of partial sums at every exit of the loop it vectorizes, so the pragma collapses the nest of reduce
    loops into one (ResNet18's stem, its input padded: 8.4 -> 5.3 ms on one core); values stay NumPy's. (Rows of
    12: a row of whole vectors runs in lanes instead, see test_opt)"""
    x = np.pad(numbers(4, 3, 24, 24, seed=60), ((0, 0), (0, 0), (3, 3), (3, 3)))
    w, g = numbers(8, 3, 7, 7, seed=61), numbers(4, 8, 12, 12, seed=62)

    def weight_gradient(device=None):
        weight = Tensor(w, device=device, requires_grad=True)
        (Tensor(x, device=device).conv2d(weight, stride=2) * Tensor(g, device=device)).sum().backward()
        return weight.grad

    source, _ = render_optimized(CStyleRenderer(AVX2), weight_gradient())
    assert "#pragma omp simd collapse(" in source
    windows = np.lib.stride_tricks.sliding_window_view(x, (7, 7), (2, 3))
    expected = np.einsum("ncyxhw,noyx->ochw", windows[:, :, ::2, ::2], g)
    np.testing.assert_allclose(weight_gradient(available("CPU")).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_c_names_in_each_loop_pragma_only_the_accumulators_that_loop_updates():
    """The same reduce loop can open twice in a kernel (once before the outputs' loops, for a padded row whose sum
    is the same everywhere, and again inside them): each opening's pragma names the accumulators updated there (the
    first named one not declared yet, and cc failed to compile); values stay NumPy's."""
    a = numbers(6, 9, 10, seed=70)  # (9 padded rows: more than TAP_LIMIT, so they stay a loop and not registers)
    padded = np.pad(1 / (a * a + 1), ((2, 1), (1, 0), (3, 3)))[:, :2]

    def rows(device=None):
        x = Tensor(a, device=device)
        return 2.0 - (1 / (x * x + 1)).pad(((2, 1), (1, -8), (3, 3))).sum(axis=2, keepdim=True)

    source, _ = render_optimized(CStyleRenderer(AVX2), rows())
    pragmas = [line.strip() for line in source.splitlines() if line.strip().startswith("#pragma omp simd")]
    assert len(pragmas) == 2 and pragmas[0] != pragmas[1]
    np.testing.assert_allclose(rows(available("CPU")).numpy(), 2.0 - padded.sum(axis=2, keepdims=True), rtol=1e-5)


def test_c_keeps_in_order_sums_that_read_several_elements_an_iteration_from_gccs_vectorizer():
    """A sum of a flipped (25, 6) array is one reduce loop over rows around a short one over the row, backwards. gcc
    12 unrolled the short loop and vectorized the rows' loop as an in-order sum, with the row's reads in the wrong
    order: some elements added twice (GCC bug 110381; 11295 instead of 11175 for 0..149). Such a loop says
    `#pragma omp simd if(0)`; a register block's loop (each accumulator updated once an iteration) does not. Sums of
    flipped, strided and permuted rows, float32 and float64, are NumPy's."""
    rows = Tensor(np.arange(150, dtype=np.float32)).reshape(25, 6).flip(1).sum()
    lines = [line.strip() for line in render_optimized(CStyleRenderer(AVX2), rows)[0].splitlines()]
    (at,) = [number for number, line in enumerate(lines) if line.startswith("#pragma")]
    assert lines[at] == "#pragma omp simd if(0)" and "< 25ll" in lines[at + 1]
    x, w = numbers(64, 200, seed=25), numbers(200, 96, seed=26)
    assert "if(0)" not in render_optimized(CStyleRenderer(AVX2), Tensor(x) @ Tensor(w))[0]
    cpu = available("CPU")
    for dtype in (np.float32, np.float64):
        a = np.arange(150, dtype=dtype).reshape(5, 5, 6)
        cases = {
            "flipped rows": (lambda t: t.reshape(25, 6).flip(1).sum(), lambda n: n.sum()),
            "flipped middle axis, times 3": (lambda t: (t.flip(1) * 3).sum(), lambda n: 3 * n.sum()),
            "every other element": (lambda t: t.reshape(25, 6)[:, ::2].sum(), lambda n: n.reshape(25, 6)[:, ::2].sum()),
            "rows of a transpose": (
                lambda t: t.permute(0, 2, 1).flip(2).sum(axis=(1, 2)),
                lambda n: n.sum(axis=(1, 2)),
            ),
        }
        for name, (lazy, reference) in cases.items():
            np.testing.assert_allclose(lazy(Tensor(a, device=cpu)).numpy(), reference(a), rtol=1e-6, err_msg=name)


def test_c_takes_float_maxima_without_branches_and_keeps_their_nans():
    """gcc compiled the max template `(a > b || a != a) ? a : b` to compares and jumps (a max-pool on CPU=1 took 1.4
    ms, 0.13 without them): the C device calls the preamble's lg_maxf / lg_max, which select a NaN with bit masks.
    A NaN in either operand is the result, as in NumPy; values stay NumPy's, for float32 and float64."""
    x = numbers(4, 8, 16, 16, seed=66)
    x[0, 0, 0, :3] = np.nan
    x[1, 2, 5, 7] = -np.inf
    source, _ = render_optimized(CStyleRenderer(AVX2), Tensor(x).max_pool2d(2))
    assert "lg_maxf(" in source and "||" not in source.split("E_")[-1]
    pooled = Tensor(x, device=available("CPU")).max_pool2d(2).numpy()
    np.testing.assert_array_equal(pooled, x.reshape(4, 8, 8, 2, 8, 2).max(axis=(3, 5)))
    wide = x.astype(np.float64)
    np.testing.assert_array_equal(Tensor(wide, device="CPU").max(axis=3).numpy(), wide.max(axis=3))
    pairs = np.array([np.nan, 1.0, -0.0, 0.0, -np.inf], np.float32)
    maxima = Tensor(pairs, device="CPU").maximum(Tensor(pairs[::-1].copy(), device="CPU")).numpy()
    np.testing.assert_array_equal(maxima, np.maximum(pairs, pairs[::-1]))


def test_llvm_leaves_no_loop_to_its_vectorizer_that_it_would_scatter_stores_along():
    """A copy of 3x3 windows into rows of 9 (ResNet18's E_16_8_8_64) stores 9 elements apart along its innermost
    loop: LLVM vectorized it with AVX-512 scatters and gathers, 5x slower than scalar code, so no loop of it is
    left to the vectorizer. A max-pool gradient's 2x2 blocks (stores 2 apart, at both offsets) are an interleaved
    group LLVM writes with shuffles: that loop stays; so does a plain elementwise loop. Values stay NumPy's."""
    from lazygrad.codegen.renderer.llvmir import vectorized_loops

    target = Target(vector_width=16, vector_registers=32)
    data = numbers(4, 64, 10, 10, seed=63)

    def windows(device=None):
        return Tensor(data, device=device)._pool((3, 3), (1, 1), (1, 1)).permute(0, 2, 3, 1, 4, 5).contiguous()

    (program,) = optimized_programs(windows(), target)
    assert sum(node.op is Ops.STORE for node in program) == 9 and not vectorized_loops(program)
    x = Tensor(numbers(16, 64, 16, 16, seed=64), requires_grad=True)
    (x.max_pool2d(3, 2, padding=1) * Tensor(numbers(16, 64, 8, 8, seed=65))).sum().backward()
    (blocks,) = [p for p in optimized_programs(x.grad, target) if sum(n.op is Ops.STORE for n in p) == 4]
    innermost = [node for node in blocks if node.op is Ops.RANGE][-1]
    assert innermost in vectorized_loops(blocks)
    assert vectorized_loops(optimized_programs(Tensor(data) * 2, target)[0])
    expected = np.lib.stride_tricks.sliding_window_view(data, (3, 3), (2, 3)).transpose(0, 2, 3, 1, 4, 5)
    np.testing.assert_allclose(windows("LLVM").numpy(), expected)


def test_llvm_keeps_register_blocks_in_vector_accumulators():
    """The LLVM renderer declares the same vectors: one vector load and one fused multiply-add a row of the block
    per iteration (as the scalar fma of each lane), not scalars left for LLVM's SLP pass to pack."""
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer

    x, w = numbers(64, 96, seed=6), numbers(96, 128, seed=7)
    (program,) = optimized_programs(Tensor(x) @ Tensor(w), AVX2)
    source = LLVMRenderer(AVX2).render(kernel_name(program), program)
    assert "alloca <8 x float>" in source and "@llvm.fma.v8f32" in source and "call float @llvm.fma.f32" not in source
    np.testing.assert_allclose((Tensor(x, device="LLVM") @ Tensor(w, device="LLVM")).numpy(), x @ w, 1e-4, 1e-4)


def test_multiply_adds_fuse_the_same_way_in_every_kernel():
    """A compiler left to contract multiply-adds fused `t * t + 0.5` in one kernel and not in another that
    recomputed it, so a max's gradient, which compares the recomputed value with the stored maximum, found no
    maximum (the gradient fuzzer's seed 4421 in test_gradient.py: 2.40 instead of 12.68). Every renderer writes each
    float multiply-add as a fused one, in scalar and in vector code, and lets the compiler contract nothing (the C
    device leaves its accumulator updates to gcc; CUDA compiles with --fmad=false)."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer
    from lazygrad.codegen.renderer.opencl import OpenCLRenderer

    t = Tensor(numbers(64, seed=8))
    (program,) = optimized_programs((t * t + 0.5).log(), AVX2)
    source = LLVMRenderer(AVX2).render(kernel_name(program), program)
    assert "contract" not in source and "call float @llvm.fma.f32(" in source
    squares = t * t + 0.5
    assert "lg_fmaf(" in render_optimized(CStyleRenderer(AVX2), squares)[0]
    assert "fmaf(" in render_optimized(CUDARenderer(), squares)[0]
    assert "fma(" in render_optimized(OpenCLRenderer(GPU_TARGET), 0.5 - t * t)[0]
    # a register block's outputs as vectors: a product of its lanes, and one the same in every lane (a scalar's)
    x, w, b, s = numbers(16, 32, seed=9), numbers(32, 8, seed=10), numbers(8, seed=11), numbers(1, seed=12)
    for output, expected in (
        (lambda: (Tensor(x) @ Tensor(w)) * 2 + Tensor(b), (x @ w) * 2 + b),
        (lambda: Tensor(x) @ Tensor(w) - Tensor(s) * Tensor(s), x @ w - s * s),
    ):
        (program,) = optimized_programs(output(), AVX2)
        llvm_lines = LLVMRenderer(AVX2).render(kernel_name(program), program).splitlines()
        assert any("call <8 x float> @llvm.fma.v8f32(" in line and "_new =" not in line for line in llvm_lines)
        assert re.search(r"vstore\d+ = lg_float8_fma\(", render_optimized(CStyleRenderer(AVX2), output())[0])
        np.testing.assert_allclose(output().numpy(), expected, rtol=1e-5, atol=1e-5)


def test_llvm_multiplies_then_adds_for_a_cpu_without_fma():
    """On a CPU without a fused multiply-add instruction (Sandy Bridge, x86-64), LLVM compiles llvm.fma to a call of
    libm's fma: a 512³ product took 112 ms instead of 2.7. There each multiply-add is a product then a sum, in scalar
    code, vectors and accumulators alike."""
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer

    no_fma = Target(vector_width=8, vector_registers=16, fma=False)
    t, x, w = Tensor(numbers(64, seed=8)), Tensor(numbers(16, 32, seed=9)), Tensor(numbers(32, 8, seed=10))
    for output in ((t * t + 0.5).log(), x @ w * 2 + 1):
        (program,) = optimized_programs(output, no_fma)
        source = LLVMRenderer(no_fma).render(kernel_name(program), program)
        assert "fma" not in source and "fmul" in source
        (program,) = optimized_programs(output, AVX2)
        assert "@llvm.fma." in LLVMRenderer(AVX2).render(kernel_name(program), program)


def test_llvm_keeps_a_sum_of_products_in_vector_accumulators():
    """A reduce that adds several products a step (the gradient of an input that several layers read: g1 @ w1 +
    g2 @ w2 summed before the reduce) keeps its register block in vector accumulators, each adding the lanes of the
    whole sum; values stay NumPy's."""
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer

    target = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    a, b, w1, w2 = numbers(384, 128, seed=18), numbers(384, 128, seed=19), numbers(128, 128, seed=20), numbers(128, 128)

    def summed(device=None):
        g1, g2 = Tensor(a, device=device).reshape(384, 128, 1), Tensor(b, device=device).reshape(384, 128, 1)
        return (g1 * Tensor(w1, device=device).reshape(1, 128, 128) + g2 * Tensor(w2, device=device)).sum(1)

    (program,) = optimized_programs(summed(), target)
    source = LLVMRenderer(target).render(kernel_name(program), program)
    assert "alloca <8 x float>" in source and "alloca float" not in source
    np.testing.assert_allclose(summed("LLVM").numpy(), a @ w1 + b @ w2, rtol=1e-4, atol=1e-4)


def test_c_keeps_a_sum_of_products_in_vector_accumulators():
    """The C renderer too adds the lanes of a whole sum of products to each vector accumulator (C's vector operators,
    the value every lane shares staying a scalar), leaving no scalar accumulator; values stay NumPy's."""
    a, b, w1, w2 = numbers(384, 128, seed=25), numbers(384, 128, seed=26), numbers(128, 128, seed=27), numbers(128, 128)

    def summed(device=None):
        g1, g2 = Tensor(a, device=device).reshape(384, 128, 1), Tensor(b, device=device).reshape(384, 128, 1)
        return (g1 * Tensor(w1, device=device).reshape(1, 128, 128) + g2 * Tensor(w2, device=device)).sum(1)

    source, _ = render_optimized(CStyleRenderer(AVX2), summed())
    updates = [line.strip() for line in source.splitlines() if line.strip().startswith("vacc")]
    # (a*b + c*d is one fused multiply-add of the second product with the first, as everywhere in C kernels)
    assert updates and all("_fma(" in line and " * " in line for line in updates) and "float acc" not in source
    np.testing.assert_allclose(summed(available("CPU")).numpy(), a @ w1 + b @ w2, rtol=1e-4, atol=1e-4)


def test_llvm_stores_register_blocks_and_copies_as_vectors():
    """After the reduce, a register block's outputs (with a bias and a relu) are computed and stored as vectors, as
    is the PACK's copy of the weights, and a weight updated in place from a product (`w - lr * xᵀ @ g`, each lane
    reading the element it writes): no scalar store is left. Values stay NumPy's."""
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer

    target = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)

    def scalar_stores(tensor: Tensor) -> list[str]:
        (program,) = optimized_programs(tensor, target)
        source = LLVMRenderer(target).render(kernel_name(program), program)
        assert "store <8 x float>" in source
        return [line for line in source.splitlines() if line.startswith("  store float")]

    x, w, b, g = (
        numbers(256, 784, seed=14),
        numbers(784, 512, seed=15),
        numbers(512, seed=16),
        numbers(256, 512, seed=17),
    )
    layer = (Tensor(x) @ Tensor(w) + Tensor(b)).relu()
    assert any(node.op is Ops.RANGE and node.arg[1] is LoopKind.PACK for node in optimized_programs(layer, target)[0])
    assert scalar_stores(layer) == []
    weight = Tensor(w, device="LLVM").realize()
    step = weight.assign(weight - 0.01 * (Tensor(x, device="LLVM").T @ Tensor(g, device="LLVM")))
    assert scalar_stores(step) == []
    result = (Tensor(x, device="LLVM") @ Tensor(w, device="LLVM") + Tensor(b, device="LLVM")).relu().numpy()
    np.testing.assert_allclose(result, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(step.numpy(), w - 0.01 * (x.T @ g), rtol=1e-4, atol=1e-4)


def test_c_stores_register_blocks_and_copies_as_vectors():
    """The C renderer too stores a register block's outputs (with a bias) and the PACK's copy of the weights as
    vectors, and a weight updated in place from a product: gcc stored each lane alone, taken out of its vector.
    No scalar store is left; values stay NumPy's."""
    target = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)

    def scalar_stores(tensor: Tensor) -> list[str]:
        source, _ = render_optimized(CStyleRenderer(target), tensor)
        assert "__builtin_memcpy(&data0[" in source
        return [line for line in source.splitlines() if line.strip().startswith(("data0[", "shared0["))]

    x, w, b, g = numbers(256, 784, seed=50), numbers(784, 512, seed=51), numbers(512, seed=52), numbers(256, 512)
    layer = Tensor(x) @ Tensor(w) + Tensor(b)
    assert "__builtin_memcpy(&shared0[" in render_optimized(CStyleRenderer(target), layer)[0]
    assert scalar_stores(layer) == []
    weight = Tensor(w, device=available("CPU")).realize()
    step = weight.assign(weight - 0.01 * (Tensor(x, device="CPU").T @ Tensor(g, device="CPU")))
    assert scalar_stores(step) == []
    result = (Tensor(x, device="CPU") @ Tensor(w, device="CPU") + Tensor(b, device="CPU")).numpy()
    np.testing.assert_allclose(result, x @ w + b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(step.numpy(), w - 0.01 * (x.T @ g), rtol=1e-4, atol=1e-4)


def test_llvm_stores_an_elementwise_kernel_upcast_along_memory_as_vectors():
    """An elementwise kernel whose innermost output loop is upcast by a vector's width (here a convolution over 3
    input channels, its taps unrolled) stores each run of lanes as one vector, and the loop around those stores is
    not left to LLVM's loop vectorizer (which vectorized across its iterations, each lane's stores apart: two times
    slower). Values stay NumPy's."""
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer
    from lazygrad.engine.buffers import buffer_of
    from lazygrad.engine.realize import build_candidate

    target = Target(vector_width=8, vector_registers=16)
    # (enough outputs that the loops run 16,384 times: LLVM's loop vectorizer would get them)
    x, w = numbers(8, 3, 66, 66, seed=21), numbers(16, 3, 3, 3, seed=22)
    conv = Tensor(x, device="LLVM").realize().conv2d(Tensor(w, device="LLVM").realize())
    (item,) = conv.schedule()
    kernel = prepare(lower_kernel(item.ast))
    unroll, upcast = OptOp.UNROLL, OptOp.UPCAST
    opts = (Opt(unroll, 4, 3), Opt(unroll, 5, 3), Opt(unroll, 6, 3), Opt(upcast, 3, 8), Opt(upcast, 1, 4))
    program = linearize(map_threads(apply_opts(kernel, opts, target), target))
    source = LLVMRenderer(target).render(kernel_name(program), program)
    assert source.count("store <8 x float>") == 4 and "  store float" not in source
    assert "!llvm.loop !0" in source  # (the loops around them: no loop vectorizing)
    device = Device["LLVM"]
    compiled, parameters = build_candidate(device, item.ast, kernel, opts)
    output = Buffer(*parameters[0])
    try:
        compiled(output.handle, *(buffer_of(node).handle for node in item.buffers[1:]))
        windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # (8, 3, 64, 64, 3, 3)
        expected = np.einsum("ncijkl,ockl->noij", windows, w)
        np.testing.assert_allclose(output.numpy().reshape(8, 16, 64, 64), expected, rtol=1e-5, atol=1e-5)
    finally:
        compiled.release()


def test_llvm_leaves_loops_that_run_few_times_to_scalar_code():
    """LLVM's loop vectorizer costs a compile tens of milliseconds: a loop that runs fewer than VECTORIZED_RUNS times
    in all (a bias of 512, a row of 64 summed 100 times) is marked not to be vectorized; a large one is not."""
    from lazygrad.codegen.renderer.llvmir import VECTORIZED_RUNS, LLVMRenderer

    def marked(tensor) -> bool:
        (program,) = optimized_programs(tensor, AVX2)
        return "!llvm.loop !0" in LLVMRenderer(AVX2).render(kernel_name(program), program)

    small, rows = numbers(512, seed=8), numbers(100, 64, seed=9)
    assert marked(Tensor(small) * 2 + 1) and marked(Tensor(rows).sum(1))
    assert not marked(Tensor(numbers(VECTORIZED_RUNS, seed=10)) * 2 + 1)
    np.testing.assert_allclose((Tensor(small, device="LLVM") * 2 + 1).numpy(), small * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(Tensor(rows, device="LLVM").sum(1).numpy(), rows.sum(1), rtol=1e-5, atol=1e-5)


def test_llvm_compiles_kernels_with_nothing_to_vectorize_with_cleanups_only():
    """A kernel that leaves nothing to LLVM's vectorizers (a register-blocked product with vector accumulators and the
    PACK copy, a small bias) is marked, and the LLVM device compiles it with a few cleanup passes instead of O3; a
    large elementwise kernel is not marked, nor is a register block of scalar accumulators (for a target of one
    lane), which the SLP pass packs. A module joined from kernels is marked only where all of them are. Values stay
    NumPy's either way."""
    from lazygrad.codegen.renderer.llvmir import NOTHING_TO_VECTORIZE, LLVMRenderer

    target = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    renderer, packs = LLVMRenderer(target), []

    def rendered(tensor) -> str:
        (program,) = optimized_programs(tensor, target)
        packs.append(any(node.op is Ops.RANGE and node.arg[1] is LoopKind.PACK for node in program))
        return renderer.render(kernel_name(program), program)

    x, w, small, large = numbers(256, 784, seed=11), numbers(784, 512, seed=12), numbers(512, seed=13), numbers(1 << 16)
    product, bias, chain = rendered(Tensor(x) @ Tensor(w)), rendered(Tensor(small) + 1), rendered(Tensor(large) * 3)
    assert packs == [True, False, False]
    assert product.startswith(NOTHING_TO_VECTORIZE) and bias.startswith(NOTHING_TO_VECTORIZE)
    assert not chain.startswith(NOTHING_TO_VECTORIZE) and NOTHING_TO_VECTORIZE not in chain
    assert renderer.join([product, bias]).startswith(NOTHING_TO_VECTORIZE)
    mixed = renderer.join([product, chain])
    assert NOTHING_TO_VECTORIZE not in mixed and mixed.count("define void @") == 2
    scalar = Target(vector_width=1, vector_registers=16)
    (program,) = optimized_programs(Tensor(x) @ Tensor(w), scalar)
    assert sum(node.op is Ops.DEFINE_ACC for node in program) > 1
    assert not LLVMRenderer(scalar).render(kernel_name(program), program).startswith(NOTHING_TO_VECTORIZE)
    np.testing.assert_allclose((Tensor(x, device="LLVM") @ Tensor(w, device="LLVM")).numpy(), x @ w, 1e-4, 1e-4)
    np.testing.assert_allclose((Tensor(large, device="LLVM") * 3).numpy(), large * 3, rtol=1e-6)


def test_c_renders_scalar_accumulators_where_no_vector_fits():
    """A product whose loops no register block divides (prime sizes) keeps scalar accumulators, as does every kernel
    for a target of one lane, and the GPU dialects."""
    x, w = numbers(37, 50, seed=4), numbers(50, 41, seed=5)
    for renderer in (CStyleRenderer(AVX2), CStyleRenderer(Target(vector_width=1)), CUDARenderer()):
        assert "vector_size" not in render_optimized(renderer, Tensor(x) @ Tensor(w))[0]
    np.testing.assert_allclose(
        (Tensor(x, device=available("CPU")) @ Tensor(w, device="CPU")).numpy(), x @ w, 1e-4, 1e-4
    )


def test_a_call_that_runs_alone_keeps_its_words_alive_until_it_returns(monkeypatch):
    """The runner writes a chunked kernel's progress into the words of its call: words made for a call that runs
    without the workers must outlive it (freed before the call, they were written after Python reused the memory, and
    a jitted step crashed)."""
    import array
    import weakref

    from lazygrad.device import Team

    team = Device[available("LLVM")].team()
    made: list[weakref.ref] = []
    closed_words = Team.closed_words

    def tracked(self):
        words = closed_words(self)
        made.append(weakref.ref(words))
        return words

    monkeypatch.setattr(Team, "closed_words", tracked)
    alive: list[bool] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    def record(buffers, start, end):
        alive.append(made[-1]() is not None)

    table = array.array("Q", [ctypes.cast(record, ctypes.c_void_p).value, 0, 4, 1])  # 4 iterations, chunks of 1
    team.run(table.buffer_info()[0], 1, shared=False)
    assert alive and all(alive)
