"""Tensor cores (the TC action): matrix products of half, bfloat16 and (where allowed) TF32 inputs on the warp-level
matrix operations of CUDA, emulated by the mock CUDA shim and by the PYTHON device, checked against NumPy; the
refusals; what the heuristic picks. Real tensor cores are checked only where a GPU is (CUDA=1 without MOCKCUDA)."""

import base64
import pickle
import re
from types import SimpleNamespace

import numpy as np
import pytest
from support import available
from test_cuda_runtime import run_on_the_mock
from test_opt import kernel_of, run_with

from lazygrad import Device, Tensor, dtypes
from lazygrad.codegen.heuristic import candidate_opts, heuristic_opts
from lazygrad.codegen.opt import KernelOptError, Opt, OptOp, apply_opts, loops_by_axis
from lazygrad.codegen.renderer import Target
from lazygrad.codegen.renderer.cstyle import CUDARenderer, reusable_shared
from lazygrad.codegen.tensor_cores import pipelines
from lazygrad.device import DeviceUnavailable
from lazygrad.engine.realize import render_kernel
from lazygrad.helpers import MOCKCUDA
from lazygrad.runtime.cuda_compiler import has_matrix_headers, kernel_resources, load_nvrtc
from lazygrad.runtime.ops_python import PythonProgram, tf32
from lazygrad.uop.ops import LoopKind, Ops, UOp

TC, L = OptOp.TC, OptOp.LOCAL
rng = np.random.default_rng(0)


@pytest.fixture(params=["PYTHON", "CUDA"])
def device(request) -> str:
    return available(request.param)


def reduce_axis(kernel) -> int:
    (loop,) = [loop for loop in loops_by_axis(kernel).values() if loop.arg[1] is LoopKind.REDUCE]
    return loop.arg[0]


def operands(device: str, shapes, dtype) -> tuple[Tensor, Tensor, np.ndarray, np.ndarray]:
    """Two realized tensors of `dtype` and their exact values as float64."""
    tensors = [Tensor(rng.standard_normal(shape).astype(np.float32), device=device).cast(dtype) for shape in shapes]
    tensors = [tensor.realize() for tensor in tensors]
    return (*tensors, *(tensor.cast(dtypes.float32).numpy().astype(np.float64) for tensor in tensors))


PRODUCTS = {
    "x @ w": (((32, 48), (48, 16)), lambda x, y: x @ y, lambda a, b: a @ b),
    "x @ w.T": (((16, 32), (48, 32)), lambda x, y: x @ y.T, lambda a, b: a @ b.T),
    "batched": (((2, 16, 32), (2, 32, 32)), lambda x, y: x @ y, lambda a, b: a @ b),
    "x.T @ w": (((32, 16), (32, 16)), lambda x, y: x.T @ y, lambda a, b: a.T @ b),
}


@pytest.mark.parametrize("product", PRODUCTS)
@pytest.mark.parametrize("dtype, tolerance", [(dtypes.float16, 2e-3), (dtypes.bfloat16, 1e-2)], ids=["half", "bf16"])
def test_products_on_tensor_cores(device, product, dtype, tolerance):
    """The exact products summed in float32, then rounded to the inputs' type once: within that rounding (and
    float32's) of the exact result."""
    shapes, compute, expect = PRODUCTS[product]
    x, y, a, b = operands(device, shapes, dtype)
    result = compute(x, y)
    opts = (Opt(TC, reduce_axis(kernel_of(result))),)
    values = run_with(result.cast(dtypes.float32), opts)  # (the rounding to `dtype` and back: one epilogue)
    expected = expect(a, b)
    np.testing.assert_allclose(values.astype(np.float64), expected, rtol=tolerance, atol=tolerance * 4)


@pytest.mark.parametrize("seed", range(6))
def test_random_products_of_slices_run_on_tensor_cores_and_match_numpy(device, seed):
    """Half and bfloat16 products of random sizes (multiples of 16), batched or not, each operand a slice at a random
    offset along the reduce and perhaps transposed, some with a prologue or an epilogue: the heuristic puts each on
    tensor cores, within the inputs' rounding of float64 NumPy (copies landing at their waits, tiles aligned)."""
    r = np.random.default_rng(seed)
    dtype, tolerance = ((dtypes.float16, 4e-3), (dtypes.bfloat16, 2e-2))[seed % 2]
    batch, m, n, k = (
        int(r.integers(1, 3)),
        16 * int(r.integers(1, 5)),
        16 * int(r.integers(1, 5)),
        16 * int(r.integers(1, 9)),
    )
    shift_a, shift_b = (int(r.choice([0, 1, 2, 4, 8, 16])) for _ in range(2))
    flip_a, flip_b = (bool(r.random() < 0.4) for _ in range(2))
    x, y, a, b = operands(
        device,
        (
            (batch, k + shift_a, m) if flip_a else (batch, m, k + shift_a),
            (batch, n, k + shift_b) if flip_b else (batch, k + shift_b, n),
        ),
        dtype,
    )
    x, a = (
        (x[:, shift_a:].transpose(1, 2), a[:, shift_a:].transpose(0, 2, 1))
        if flip_a
        else (x[..., shift_a:], a[..., shift_a:])
    )
    y, b = (
        (y[..., shift_b:].transpose(1, 2), b[..., shift_b:].transpose(0, 2, 1))
        if flip_b
        else (y[:, shift_b:], b[:, shift_b:])
    )
    if seed % 3 == 0:  # (a prologue: the copies are of computed values)
        x, a = x * 2, a * 2
    result, expected = (x @ y).cast(dtypes.float32), a @ b
    if seed % 3 == 1:  # (an epilogue after the accumulators)
        result, expected = result.relu(), np.maximum(expected, 0)
    assert len(result.schedule()) == 1
    assert heuristic_opts(kernel_of(result), Device[device].renderer.target)[-1].op is TC
    np.testing.assert_allclose(result.numpy(), expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())


def test_the_heuristic_runs_half_products_on_tensor_cores_with_their_epilogue(device):
    """A product with a bias and a relu fused after it is still one kernel; its epilogue reads the accumulator."""
    x, y, a, b = operands(device, ((32, 64), (64, 32)), dtypes.float16)
    bias_data = rng.standard_normal(32).astype(np.float16)
    bias = Tensor(bias_data, device=device).realize()
    result = ((x @ y) + bias).relu()
    assert len(result.schedule()) == 1
    kernel = kernel_of(result)
    assert heuristic_opts(kernel, Device[device].renderer.target) == (Opt(TC, reduce_axis(kernel)),)
    expected = np.maximum(a @ b + bias_data.astype(np.float64), 0)
    np.testing.assert_allclose(result.numpy().astype(np.float64), expected, rtol=2e-3, atol=8e-3)


def test_tf32_only_where_allowed(device):
    """float32 products stay float32 unless TF32 is allowed; then their inputs are rounded to TF32 (10 mantissa
    bits) and the exact products summed in float32."""
    x_data, w_data = rng.standard_normal((32, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    x, w = Tensor(x_data, device=device).realize(), Tensor(w_data, device=device).realize()
    target = Device[device].renderer.target
    axis = reduce_axis(kernel_of(x @ w))
    assert Opt(TC, axis) not in heuristic_opts(kernel_of(x @ w), target)
    assert not any(Opt(TC, axis) in opts for opts in candidate_opts(kernel_of(x @ w), target))
    with pytest.raises(KernelOptError, match="in TF32 only where allowed"):
        apply_opts(kernel_of(x @ w), (Opt(TC, axis),), target)
    exact = x_data.astype(np.float64) @ w_data
    np.testing.assert_allclose((x @ w).numpy(), exact, rtol=1e-5, atol=1e-5)
    with Tensor.allow_tf32():
        assert heuristic_opts(kernel_of(x @ w), target) == (Opt(TC, axis),)
        rounded = tf32(x_data).astype(np.float64) @ tf32(w_data)
        values = (x @ w + 0).numpy()  # (another kernel: the one above stays in the program cache as it was)
        tf32_values = run_with(x @ w, (Opt(TC, axis),))
    np.testing.assert_allclose(tf32_values, rounded, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values, rounded, rtol=1e-5, atol=1e-5)
    assert np.abs(tf32_values - exact).max() > 1e-4  # (the rounding shows: this is no float32 product)


def test_the_rounding_to_tf32():
    values = np.array([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 1 + 2**-12, np.inf, np.nan], np.float32)
    rounded = tf32(values)
    np.testing.assert_array_equal(rounded[:4], [1 + 2**-10, 1 + 2 * 2**-10, -(1 + 2**-10), 1.0])  # ties away
    assert np.isinf(rounded[4]) and np.isnan(rounded[5])


def test_the_cuda_source_holds_the_warp_matrix_operations():
    """On CUDA the product's source includes mma.h and spells fragments, their loads, the multiply-accumulate and
    the store (of bfloat16 tiles through __nv_bfloat16, of TF32 ones converted by __float_to_tf32; these two load
    their tiles by PTX's load from shared memory), and asks NVRTC to unroll the loop over tensor-core steps."""
    try:
        cuda = Device["CUDA"]
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    for dtype, element in [(dtypes.float16, "half"), (dtypes.bfloat16, "__nv_bfloat16"), (dtypes.float32, "tf32")]:
        x, y, _, _ = operands("CUDA", ((16, 32), (32, 16)), dtype)
        (item,) = (x @ y).schedule()
        kernel = kernel_of(x @ y)
        opts = (Opt(TC, reduce_axis(kernel)),)
        with Tensor.allow_tf32():
            source = render_kernel(cuda, item.ast, apply_opts(kernel, opts, cuda.renderer.target), opts).source
        assert source.startswith("#include <mma.h>")
        for call in ("fill_fragment", "mma_sync", "store_matrix_sync", "__align__(32)", element):
            assert call in source, (dtype, call)
        assert ("__float_to_tf32" in source) == (dtype == dtypes.float32)
        load = {dtypes.float16: "load_matrix_sync(", dtypes.bfloat16: "LAZYGRAD_LOAD_MATRIX(a, row, m16n16k16, bf16, "}
        assert load.get(dtype, "LAZYGRAD_LOAD_MATRIX(a, row, m16n16k8, tf32, ") in source, dtype
        assert "#pragma unroll\n    for (int ridx" in source, dtype


def test_python_and_mock_cuda_agree_exactly():
    """The PYTHON device and the CUDA shim emulate the tensor core the same way: equal bits."""
    if not MOCKCUDA:
        pytest.skip("a real GPU's tensor cores add in their own order; the other tests check them against NumPy")
    try:
        Device["CUDA"]
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    data = [rng.standard_normal(shape).astype(np.float32) for shape in ((2, 32, 48), (2, 48, 32))]
    results = []
    for device in ("PYTHON", "CUDA"):
        x, y = (Tensor(value, device=device).half().realize() for value in data)
        results.append(run_with(x @ y, (Opt(TC, reduce_axis(kernel_of(x @ y))),)))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize(
    "shapes, dtype, opts, message",
    [
        (((24, 32), (32, 16)), dtypes.float16, (Opt(TC, 2),), "a block takes 16 rows at a time; loop 0 has 24"),
        (((16, 32), (32, 8)), dtypes.float16, (Opt(TC, 2),), "a block takes 16 columns at a time; loop 1 has 8"),
        (((16, 40), (40, 16)), dtypes.float16, (Opt(TC, 2),), "a block takes 16 reduce at a time; loop 2 has 40"),
        (((16, 16), (16, 16)), dtypes.int32, (Opt(TC, 2),), "no tensor core multiplies int32 into int32"),
        (((16, 16), (16, 16)), dtypes.float64, (Opt(TC, 2),), "no tensor core multiplies float64 into float64"),
        (((16, 16), (16, 16)), dtypes.float16, (Opt(TC, 1),), "loop 1 is a global loop, not a reduce loop"),
        (
            ((16, 16), (16, 16)),
            dtypes.float16,
            (Opt(TC, 2, 16),),
            "1, 2, 4 or 8 tensor-core tiles along each side, not 16",
        ),
        (((16, 16), (16, 16)), dtypes.float16, (Opt(L, 1, 8), Opt(TC, 3)), "TC comes before any thread action"),
        (((16, 16), (16, 16)), dtypes.float16, (Opt(TC, 2), Opt(TC, 2)), "share memory already"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_what_does_not_fit_tensor_cores_is_refused(shapes, dtype, opts, message):
    x, y, _, _ = operands("PYTHON", shapes, dtype)
    with pytest.raises(KernelOptError, match=message):
        apply_opts(kernel_of(x @ y), opts, Device["PYTHON"].renderer.target)


def test_kernels_that_are_no_matrix_product_are_refused():
    x, y, _, _ = operands("PYTHON", ((16, 16), (16, 16)), dtypes.float16)
    target = Device["PYTHON"].renderer.target
    with pytest.raises(KernelOptError, match="not a sum of products"):
        apply_opts(kernel_of(x.float().sum(axis=1)), (Opt(TC, 1),), target)
    with pytest.raises(KernelOptError, match="not a matrix product"):
        apply_opts(kernel_of((x * y).float().sum(axis=1)), (Opt(TC, 1),), target)


def test_targets_without_tensor_cores_refuse_them():
    x, y, _, _ = operands("PYTHON", ((16, 16), (16, 16)), dtypes.bfloat16)
    kernel = kernel_of(x @ y)
    for target in (None, Target(), Target(vector_width=8, max_threads=256, block_threads=64)):
        with pytest.raises(KernelOptError, match="the device has no tensor cores"):
            apply_opts(kernel, (Opt(TC, 2),), target)
        assert Opt(TC, 2) not in heuristic_opts(kernel, target or Target())
    # tensor cores by compute capability: half from 7.0, bfloat16 and TF32 from 8.0, none without mma.h (0)
    volta = CUDARenderer.for_architecture(75).target
    assert [core.input for core in volta.tensor_cores] == [dtypes.float16]
    with pytest.raises(KernelOptError, match="no tensor core multiplies bfloat16 into float32"):
        apply_opts(kernel, (Opt(TC, 2),), volta)
    assert CUDARenderer.for_architecture(0).target.tensor_cores == ()
    assert len(CUDARenderer.for_architecture(90).target.tensor_cores) == 3


def test_tc_round_trips_through_json_and_shapes_the_kernel():
    assert Opt.from_json(Opt(TC, 2).to_json()) == Opt(TC, 2) and str(Opt(TC, 2)) == "TC(2)"
    x, y, _, _ = operands("PYTHON", ((32, 32), (32, 48)), dtypes.float16)
    kernel = apply_opts(kernel_of(x @ y), (Opt(TC, 2),), Device["PYTHON"].renderer.target)
    loops = {loop.arg[0]: (loop.src[0].arg, loop.arg[1]) for loop in loops_by_axis(kernel).values()}
    # tiles of 16 × 16 outputs by blocks, a warp of 2 × 16 threads, the reduce's 32 copied at once (one copy)
    # for two tensor-core steps of 16
    assert loops == {
        0: (2, LoopKind.GLOBAL),
        1: (3, LoopKind.GLOBAL),
        2: (1, LoopKind.REDUCE),
        3: (2, LoopKind.LOCAL),
        4: (16, LoopKind.LOCAL),
        5: (2, LoopKind.REDUCE),
    }
    nodes = kernel.toposort
    assert sum(node.op is Ops.WMMA for node in nodes) == 1
    # the input tiles: 16 lines of 32 + 8 elements and 32 lines of 16 + 8; the accumulator's read-back 16 × 16
    assert sorted(node.arg[1] for node in nodes if node.op is Ops.DEFINE_LOCAL) == [256, 640, 768]


def test_the_counted_flops_of_a_tensor_core_product(device):
    """DEBUG=2's GFLOP/s counts a warp's WMMA once for the warp (2·m·n·k), not once for each of its threads: the
    kernel's ops are the product's 2·M·N·K and its epilogue's few per output."""
    (m, k), (_, n) = shapes = ((32, 64), (64, 48))
    x, y, _, _ = operands(device, shapes, dtypes.float16)
    (item,) = (x @ y).schedule()
    kernel = kernel_of(x @ y)
    opts = (Opt(TC, reduce_axis(kernel)),)
    runtime = Device[device]
    ops = render_kernel(runtime, item.ast, apply_opts(kernel, opts, runtime.renderer.target), opts).ops
    assert 2 * m * n * k <= ops <= 2 * m * n * k + 4 * m * n


TILED_PRODUCTS = {
    "x @ w": (((64, 32), (32, 64)), lambda x, y: x @ y, lambda a, b: a @ b),
    "x @ w.T": (((64, 32), (64, 32)), lambda x, y: x @ y.T, lambda a, b: a @ b.T),
    "x.T @ w": (((32, 64), (32, 64)), lambda x, y: x.T @ y, lambda a, b: a.T @ b),
    # an epilogue reading the accumulators back (a column bias, a relu), a reduce of 48 (three steps per copy)
    "relu(x @ w + b)": (
        ((64, 48), (48, 64)),
        lambda x, y: (x @ y + y[:1].reshape(64)).relu(),
        lambda a, b: np.maximum(a @ b + b[0], 0),
    ),
}


@pytest.mark.parametrize("tiles", [2, 4])
@pytest.mark.parametrize("product", TILED_PRODUCTS)
def test_blocks_of_several_tensor_core_tiles(device, product, tiles):
    """A block of tiles × tiles tensor-core tiles (four warps sharing the block's copies of the inputs on CUDA, one
    warp holding them all on the PYTHON device's small blocks) computes the product, whatever the operands' layout."""
    shapes, compute, expect = TILED_PRODUCTS[product]
    x, y, a, b = operands(device, shapes, dtypes.float16)
    result = compute(x, y).cast(dtypes.float32)
    values = run_with(result, (Opt(TC, reduce_axis(kernel_of(result)), tiles),))
    np.testing.assert_allclose(values.astype(np.float64), expect(a, b), rtol=2e-3, atol=8e-3)


def test_blocks_past_the_static_shared_memory_take_it_dynamically():
    """Eight tiles along each side (a 128 × 128 block) need more shared memory than a CUDA kernel may declare: the
    kernel takes it as one dynamic array, the launch asks for its size, and the product is right."""
    runtime = Device[available("CUDA")]
    x, y, a, b = operands(runtime.name, ((256, 64), (64, 128)), dtypes.float16)
    result = (x @ y).cast(dtypes.float32)
    opts = (Opt(TC, reduce_axis(kernel_of(result)), 8),)
    (item,) = result.schedule()
    kernel = render_kernel(runtime, item.ast, apply_opts(kernel_of(result), opts, runtime.renderer.target), opts)
    blocks, threads, shared = kernel.launch
    assert (blocks, threads) == (2, 128) and shared > 48 * 1024
    assert (
        f"LAZYGRAD_DYNAMIC_SHARED({shared});" in kernel.source and "__shared__ __align__(32) half" not in kernel.source
    )
    values = run_with(result, opts)
    np.testing.assert_allclose(values.astype(np.float64), a @ b, rtol=2e-3, atol=8e-3)


def test_the_heuristic_gives_large_products_blocks_of_several_tiles():
    """Four tiles along each side of a block where that leaves at least BUSY_BLOCKS blocks, fewer where it would not,
    one for a product too small for two; the choices BEAM times include every number of tiles that fits."""
    target = CUDARenderer.for_architecture(90).target
    chosen = {}
    for size in (1024, 512, 32):
        x, y, _, _ = operands("PYTHON", ((size, 64), (64, size)), dtypes.float16)
        kernel = kernel_of(x @ y)
        (opt,) = heuristic_opts(kernel, target)
        chosen[size] = opt.amount
        offered = {opts[-1] for opts in candidate_opts(kernel, target) if opts and opts[-1].op is TC}
        assert {opt.amount for opt in offered} >= {0, *(t for t in (2, 4) if size % (16 * t) == 0)}
    assert chosen == {1024: 4, 512: 2, 32: 0}
    # with the shared memory an H100's block may opt into, eight tiles where that still leaves BUSY_BLOCKS blocks
    large = CUDARenderer.for_architecture(90, 132, 227 * 1024).target
    for size, tiles in ((2048, 8), (1024, 4)):
        x, y, _, _ = operands("PYTHON", ((size, 64), (64, size)), dtypes.float16)
        assert heuristic_opts(kernel_of(x @ y), large) == (Opt(TC, reduce_axis(kernel_of(x @ y)), tiles),)


def test_what_does_not_fit_a_block_of_tensor_core_tiles_is_refused():
    x, y, _, _ = operands("PYTHON", ((128, 32), (32, 128)), dtypes.float16)
    kernel, axis = kernel_of(x @ y), reduce_axis(kernel_of(x @ y))
    with pytest.raises(KernelOptError, match="1, 2, 4 or 8 tensor-core tiles along each side, not 3"):
        apply_opts(kernel, (Opt(TC, axis, 3),), Device["PYTHON"].renderer.target)
    with pytest.raises(KernelOptError, match="the tiles need 76032 bytes of shared memory, the device has 49152"):
        apply_opts(kernel, (Opt(TC, axis, 8),), CUDARenderer.for_architecture(90).target)
    assert str(Opt(TC, axis, 4)) == f"TC({axis}, 4)" and Opt.from_json(Opt(TC, axis, 4).to_json()) == Opt(TC, axis, 4)


def test_inputs_straight_from_aligned_memory_are_copied_sixteen_bytes_at_a_time(device):
    """A tile of an input read as it lies in memory goes to shared memory in 16-byte pieces (a WIDE_COPY per thread
    and piece); an input with a prologue (x * 2), or a view whose pieces would start off 16-byte boundaries (a
    column slice from 1), element by element. Every way computes the product."""
    x, y, a, b = operands(device, ((32, 40), (32, 32)), dtypes.float16)
    runtime = Device[device]
    cases = {
        "plain": (x[:, :32] @ y, a[:, :32] @ b, 2),
        "prologue": ((x[:, :32] * 2) @ y, 2 * a[:, :32] @ b, 1),  # (y's tile still in pieces)
        "unaligned": (x[:, 1:33] @ y, a[:, 1:33] @ b, 1),
    }
    for name, (result, expected, wide_inputs) in cases.items():
        result = result.cast(dtypes.float32)
        kernel = kernel_of(result)
        opts = (Opt(TC, reduce_axis(kernel), 2),)
        graph = apply_opts(kernel, opts, runtime.renderer.target)
        copies = [node for node in graph.toposort if node.op is Ops.WIDE_COPY]
        assert len({node.src[2] for node in copies}) == wide_inputs, name
        assert all(node.arg in (2, 4, 8) for node in copies)  # (16 bytes, or less for small tiles on large blocks)
        values = run_with(result, opts)
        np.testing.assert_allclose(values.astype(np.float64), expected, rtol=2e-3, atol=8e-3, err_msg=name)


def test_a_warp_loads_each_tile_of_a_step_once():
    """With 2 × 2 tensor-core tiles per warp, a step's four WMMAs load two A tiles and two B tiles, not one of each
    per WMMA: the renderer uses a tile the warp loaded since the last barrier again."""
    try:
        cuda = Device["CUDA"]
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    x, y, _, _ = operands("CUDA", ((64, 32), (32, 64)), dtypes.float16)
    (item,) = (x @ y).schedule()
    kernel = kernel_of(x @ y)
    opts = (Opt(TC, reduce_axis(kernel), 4),)
    source = render_kernel(cuda, item.ast, apply_opts(kernel, opts, cuda.renderer.target), opts).source
    assert source.count("mma_sync(") == 4 and source.count("load_matrix_sync(") == 4


def test_input_tiles_copy_asynchronously_into_two_tiles_and_the_accumulators_reuse_their_memory():
    """From compute capability 8.0 a thread's 16-byte copies into shared memory go on without it (cp.async): each
    input gets two tiles, the next copy going into one (gated off after the last) while the warps compute on the
    other, one barrier an iteration, where each thread first waits for its copies. Below 8.0 they are loads and
    stores into one tile each. Either way the accumulators are read back through the memory of the tiles, past the
    last barrier of the loop over the copies: a 128 × 128 block asks for 70 KiB (two tiles of each input) or 64 KiB
    (the accumulators' floats), not both, so three such blocks fit an H100's multiprocessor."""
    runtime = Device[available("CUDA")]
    x, y, a, b = operands(runtime.name, ((256, 128), (128, 128)), dtypes.float16)
    result = (x @ y).cast(dtypes.float32)
    opts = (Opt(TC, reduce_axis(kernel_of(result)), 8),)
    (item,) = result.schedule()
    tiles = 128 * 72 * 2 + 64 * 136 * 2  # (one tile of each input, their lines padded)
    for architecture, copy, shared, barriers in (
        (80, "LAZYGRAD_COPY_ASYNC(cg, ", 2 * tiles, ["LAZYGRAD_WAIT_COPIES(); __syncthreads();"] * 3),
        (75, "*(uint4*)(shared", 128 * 128 * 4, ["__syncthreads();"] * 3),
    ):
        renderer = CUDARenderer.for_architecture(architecture, 132, 227 * 1024)
        device = SimpleNamespace(name=runtime.name, renderer=renderer)
        kernel = render_kernel(device, item.ast, apply_opts(kernel_of(result), opts, renderer.target), opts)
        assert kernel.launch[2] == shared, architecture
        pipelined = architecture >= 80
        assert kernel.source.count(copy) == (32 if pipelined else 16), architecture
        assert kernel.source.count("if (") == (16 if pipelined else 0), architecture  # (the copies ahead)
        assert [line.strip() for line in kernel.source.splitlines() if "__syncthreads" in line] == barriers
    values = run_with(result, opts)
    np.testing.assert_allclose(values.astype(np.float64), a @ b, rtol=2e-3, atol=8e-3)
    # a reduce of one copy has no loop, so no barrier between the tiles' last reads and the accumulators' stores:
    # its block keeps the tiles' memory apart
    short = (x[:, :64] @ y[:64]).cast(dtypes.float32)
    (item,) = short.schedule()
    kernel = render_kernel(runtime, item.ast, apply_opts(kernel_of(short), opts, runtime.renderer.target), opts)
    assert kernel.launch[2] == 128 * 128 * 4 + tiles
    values = run_with(short, opts)
    np.testing.assert_allclose(values.astype(np.float64), a[:, :64] @ b[:64], rtol=2e-3, atol=8e-3)


DOUBLE_BUFFERED_PRODUCTS = {  # (shapes for a reduce of `length`, the product, its float64 reference)
    "x @ w": (lambda length: ((32, length), (length, 32)), lambda x, y: x @ y, lambda a, b: a @ b),
    "x @ w.T": (lambda length: ((32, length), (32, length)), lambda x, y: x @ y.T, lambda a, b: a @ b.T),
    "x.T @ w": (lambda length: ((length, 32), (length, 32)), lambda x, y: x.T @ y, lambda a, b: a.T @ b),
    "batched": (lambda length: ((2, 32, length), (2, length, 32)), lambda x, y: x @ y, lambda a, b: a @ b),
}


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("length", [80, 192])
@pytest.mark.parametrize("product", DOUBLE_BUFFERED_PRODUCTS)
def test_double_buffered_tiles_compute_the_product(device, product, length, tiles):
    """Over several copies along the reduce (five of one tensor-core step, or three of four steps: each tile takes
    the next copy in turn, the last copy ahead gated off), with 16-byte copies and element copies (an input with a
    prologue), whatever the operands' layout, the product is right."""
    shapes, compute, expect = DOUBLE_BUFFERED_PRODUCTS[product]
    x, y, a, b = operands(device, shapes(length), dtypes.float16)
    for name, result, expected in (
        ("plain", compute(x, y), expect(a, b)),
        ("prologue", compute(x * 2, y), expect(2 * a, b)),
    ):
        result = result.cast(dtypes.float32)
        opts = (Opt(TC, reduce_axis(kernel_of(result)), tiles),)
        graph = apply_opts(kernel_of(result), opts, Device[device].renderer.target)
        assert any(node.op is Ops.PREFETCH for node in graph.toposort), name
        values = run_with(result, opts)
        np.testing.assert_allclose(values.astype(np.float64), expected, rtol=2e-3, atol=8e-3, err_msg=name)


@pytest.mark.parametrize("product", ["x @ w", "x.T @ w"])
def test_every_way_of_copying_the_inputs_computes_the_product(device, product):
    """TC(axis, tiles, steps, stages), for every (steps per copy, tiles per input) `pipelines` offers (a reduce of
    twelve tensor-core steps: copies of 4, 3, 2 and 1 steps, one or two tiles each), computes the product; BEAM
    offers each after the default list."""
    shapes, compute, expect = DOUBLE_BUFFERED_PRODUCTS[product]
    x, y, a, b = operands(device, shapes(192), dtypes.float16)
    result = (compute(x, y) * 2).cast(dtypes.float32)  # (an epilogue after the accumulators' read back)
    kernel, target = kernel_of(result), Device[device].renderer.target
    axis = reduce_axis(kernel)
    ways = pipelines(kernel, loops_by_axis(kernel)[axis], target, False, 2)
    assert ways == [(4, 2), (4, 1), (3, 2), (3, 1), (2, 2), (2, 1), (1, 2), (1, 1)]
    graphs = set()
    for way in ways:
        opts = (Opt(TC, axis, 2, way),)
        graph = apply_opts(kernel, opts, target)
        assert any(node.op is Ops.PREFETCH for node in graph.toposort) == (way[1] == 2), way
        graphs.add(graph)
        values = run_with(result, opts)
        np.testing.assert_allclose(values.astype(np.float64), 2 * expect(a, b), rtol=2e-3, atol=2e-2, err_msg=way)
    assert len(graphs) == len(ways)
    # the action without them takes the first; BEAM offers the others, each once
    assert apply_opts(kernel, (Opt(TC, axis, 2),), target) is apply_opts(kernel, (Opt(TC, axis, 2, ways[0]),), target)
    default = heuristic_opts(kernel, target)
    assert default[-1].op is TC and not default[-1].more
    offered = candidate_opts(kernel, target)
    tiles = default[-1].amount or 1
    variants = [
        (*default[:-1], Opt(TC, axis, tiles, way))
        for way in pipelines(kernel, loops_by_axis(kernel)[axis], target, False, tiles)[1:]
    ]
    assert offered[: 1 + len(variants)] == [default, *variants]


def double_buffered_kernel(device: str):
    """The double-buffered product `x @ w` of a reduce of 192 (two tiles per input) as generated for `device`, with
    its arguments (an output of zeros and its inputs, flat) and the product in float64."""
    shapes, compute, expect = DOUBLE_BUFFERED_PRODUCTS["x @ w"]
    x, y, a, b = operands(device, shapes(192), dtypes.float16)
    result = compute(x, y).cast(dtypes.float32)
    kernel = kernel_of(result)
    opts = (Opt(TC, reduce_axis(kernel), 2),)
    (item,) = result.schedule()
    generated = render_kernel(Device[device], item.ast, apply_opts(kernel, opts, Device[device].renderer.target), opts)
    arguments = [np.zeros(result.numel(), np.float32), x.numpy().ravel(), y.numpy().ravel()]
    return generated, arguments, expect(a, b)


def test_the_mock_lands_a_copy_only_at_its_wait():
    """On the mock a thread's copy into shared memory (cp.async) lands at its next wait, as late as a GPU may land
    it, and its destination holds NaNs until then. So the double-buffered product computes its values, and the same
    source without its waits (which would race on a GPU, and passed on the mock while copies landed at once)
    computes NaNs."""
    if not MOCKCUDA:
        pytest.skip("the mock's copies, not a GPU's")
    generated, arguments, expected = double_buffered_kernel(available("CUDA"))
    wait = "LAZYGRAD_WAIT_COPIES(); "
    assert "LAZYGRAD_COPY_ASYNC(" in generated.source and wait in generated.source
    blocks, threads, _ = generated.launch
    waited = run_on_the_mock(generated.source, generated.name, arguments, blocks, threads)[0]
    np.testing.assert_allclose(waited.reshape(expected.shape), expected, rtol=2e-3, atol=8e-3)
    unwaited = run_on_the_mock(generated.source.replace(wait, ""), generated.name, arguments, blocks, threads)[0]
    assert np.isnan(unwaited).any()


def test_the_python_device_lands_a_copy_only_at_the_next_barrier():
    """The PYTHON device's copies into shared memory land at the thread's next barrier, where a CUDA kernel waits
    for them, their destination NaN until then: the double-buffered program computes the product, and the same
    program without its barriers computes NaNs."""
    generated, arguments, expected = double_buffered_kernel("PYTHON")
    program = pickle.loads(base64.b64decode(generated.source))
    assert any(node.op is Ops.WIDE_COPY for node in program)
    for nodes in (program, [node for node in program if node.op is not Ops.BARRIER]):
        output = np.zeros_like(arguments[0])
        binary = base64.b64encode(pickle.dumps(nodes))
        PythonProgram(generated.name, binary, generated.launch)(output, *arguments[1:])
        if nodes is program:
            np.testing.assert_allclose(output.reshape(expected.shape), expected, rtol=2e-3, atol=8e-3)
        else:
            assert np.isnan(output).any()


def test_a_way_of_copying_that_does_not_fit_is_refused_with_those_that_do():
    x, y, _, _ = operands("PYTHON", ((32, 48), (48, 32)), dtypes.float16)
    kernel = kernel_of(x @ y)
    axis = reduce_axis(kernel)
    turing = CUDARenderer.for_architecture(75, 40, 64 * 1024).target  # (no asynchronous copies: one tile each)
    assert pipelines(kernel, loops_by_axis(kernel)[axis], turing, False, 2) == [(3, 1), (1, 1)]
    with pytest.raises(KernelOptError, match=r"copies \(3, 2\) .* those that do: \(3, 1\), \(1, 1\)"):
        apply_opts(kernel, (Opt(TC, axis, 2, (3, 2)),), turing)
    with pytest.raises(KernelOptError, match=r"copies \(2, 1\)"):  # (two steps do not divide the three)
        apply_opts(kernel, (Opt(TC, axis, 2, (2, 1)),), turing)
    with pytest.raises(KernelOptError, match="LOCAL takes an axis and at most an amount"):
        apply_opts(kernel, (Opt(L, 0, 2, (1,)),), turing)
    opt = Opt(TC, axis, 2, (3, 1))
    assert str(opt) == f"TC({axis}, 2, 3, 1)" and Opt.from_json(opt.to_json()) == opt
    for bad in (["TC", axis, 2, []], ["TC", axis, 2, [3, -1]], ["TC", axis, 2, 3], ["TC", axis, 2, [3], 1]):
        with pytest.raises(ValueError, match="not an optimization action"):
            Opt.from_json(bad)


def ptxas_usage(source: str, target: str) -> tuple[int, int]:
    """(registers a thread, bytes spilled) that ptxas reports for the kernel in `source` compiled for `target`."""
    _, log = load_nvrtc().build(source, target, ("-Xptxas=-v",))
    spilled = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return kernel_resources(log)[0], int(spilled.group(1)) + int(spilled.group(2))


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_a_large_product_fits_three_blocks_on_an_h100_multiprocessor(dtype):
    """The 4096³ product's kernel for an H100 (sm_90, its shared memory opted into), as NVRTC compiles it: the
    tensor-core steps unrolled, the tiles loaded from shared memory's own addresses; no spills, and registers and
    shared memory for three of its 128-thread blocks on a multiprocessor (65,536 registers, in
    steps of 8 a thread; 228 KiB of shared memory, 1 KiB of it the system's per block), so that while one block
    waits on its copies others keep the tensor cores busy."""
    try:
        load_nvrtc()
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    if not has_matrix_headers(load_nvrtc().include_directory):
        pytest.skip("NVRTC has no mma.h headers here")
    x, y = (Tensor.empty(4096, 4096, dtype=dtype, device="PYTHON").realize() for _ in range(2))
    (item,) = (x @ y).schedule()
    renderer = CUDARenderer.for_architecture(90, 132, 227 * 1024)
    kernel = kernel_of(x @ y)
    opts = heuristic_opts(kernel, renderer.target)
    assert opts == (Opt(TC, reduce_axis(kernel), 8),)
    device = SimpleNamespace(name="CUDA", renderer=renderer)
    generated = render_kernel(device, item.ast, apply_opts(kernel, opts, renderer.target), opts)
    blocks, threads, shared = generated.launch
    registers, spilled = ptxas_usage(generated.source, "sm_90")
    assert (blocks, threads, spilled) == (1024, 128, 0)
    # each warp's 16 fragments over a copy's four tensor-core steps, unrolled, its tiles loaded from shared memory
    ptx = load_nvrtc().compile(generated.source, "compute_90").decode()
    loads = re.findall(r"wmma\.load\.[ab]\.\S+", ptx)
    assert ptx.count("wmma.mma.sync") == 64 and len(loads) == 32 and all(".shared." in load for load in loads)
    assert 3 * threads * -(-registers // 8) * 8 <= 65536 and 3 * (shared + 1024) <= 228 * 1024, (registers, shared)


def test_shared_memory_is_reused_only_past_a_barrier_that_runs_after_its_last_use():
    """Two buffers of shared memory may share bytes only where all of one's uses come before all of the other's
    (a use in a loop spans the loop) and a barrier between them runs wherever the first's last use does."""
    first, second = (UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (number, 16)) for number in range(2))
    thread = UOp(Ops.SPECIAL, dtypes.int32, (), ("thread", 16))
    loop = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 2),), (0, LoopKind.REDUCE))
    one = UOp.const(dtypes.float32, 1.0)

    def store(memory):
        return UOp(Ops.STORE, src=(memory, thread, one))

    barrier, end = UOp(Ops.BARRIER), UOp(Ops.ENDRANGE, src=(loop,))
    cases = {
        "a barrier between them": ([store(first), barrier, store(second)], True),
        "no barrier": ([store(first), store(second)], False),
        "a barrier in a loop the first's use is not in (it may run no iteration)": (
            [store(first), loop, barrier, end, store(second)],
            False,
        ),
        "a barrier ending the loop of the first's uses": ([loop, store(first), barrier, end, store(second)], True),
        "the second used in the same loop": ([loop, store(first), barrier, store(second), end], False),
    }
    for name, (body, reused) in cases.items():
        program = [first, second, thread, *body]
        assert (frozenset((first, second)) in reusable_shared(program)) == reused, name
