"""Optimization actions: each keeps a kernel's values, an action that does not fit raises, and lists round-trip."""

from dataclasses import replace
from math import prod

import numpy as np
import pytest
from support import available

from lazygrad import Device, Tensor, dtypes
from lazygrad.codegen.heuristic import candidate_opts, heuristic_opts, thread_opts
from lazygrad.codegen.linearize import linearize
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.opt import (
    KernelOptError,
    Opt,
    OptOp,
    adds_divisions,
    apply_opts,
    count_divmod,
    kernel_nodes,
    loops_by_axis,
    loops_of_kind,
    output_loops,
    prepare,
    replace_ranges,
)
from lazygrad.device import Buffer
from lazygrad.engine.buffers import buffer_of
from lazygrad.engine.realize import build_candidate
from lazygrad.uop.ops import LoopKind, Ops, UOp

U, R, M, V, S, D = OptOp.UPCAST, OptOp.UNROLL, OptOp.MERGE, OptOp.VECTORIZE, OptOp.SPLIT, OptOp.PAD
LANES = OptOp.LANES
rng = np.random.default_rng(0)


def realized(*shape: int) -> tuple[Tensor, np.ndarray]:
    data = rng.standard_normal(shape).astype(np.float32)
    return Tensor(data).realize(), data


def run_with(tensor: Tensor, opts: tuple[Opt, ...]) -> np.ndarray:
    """The one kernel computing `tensor`, compiled with exactly `opts` and run on its (realized) inputs."""
    (item,) = tensor.schedule()
    device = Device[item.device]
    kernel = prepare(lower_kernel(item.ast))
    program, parameters = build_candidate(device, item.ast, kernel, opts)
    output = Buffer(*parameters[0])
    try:
        program(output.handle, *(buffer_of(node).handle for node in item.buffers[1:]))
        getattr(device, "synchronize", lambda: None)()
        return output.numpy().reshape(tensor.shape)
    finally:  # a program outside the program cache frees its code itself
        getattr(program, "release", lambda: None)()


def kernel_of(tensor: Tensor):
    (item,) = tensor.schedule()
    return prepare(lower_kernel(item.ast))


def test_product_loops_are_numbered_in_order():
    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    loops = loops_by_axis(kernel_of(a @ b))
    assert [(axis, loop.src[0].arg, loop.arg[1]) for axis, loop in sorted(loops.items())] == [
        (0, 8, LoopKind.GLOBAL),
        (1, 16, LoopKind.GLOBAL),
        (2, 12, LoopKind.REDUCE),
    ]


@pytest.mark.parametrize(
    "opts",
    [
        (),
        (Opt(U, 1, 4),),
        (Opt(U, 1, 16), Opt(U, 0, 2)),
        (Opt(U, 0, 8),),
        (Opt(R, 2, 3),),
        (Opt(R, 2, 12),),
        (Opt(V, 2), Opt(U, 0, 4), Opt(R, 2, 2)),
        (Opt(U, 1, 2), Opt(U, 1, 2), Opt(U, 1, 2)),
        (Opt(S, 2, 4),),
        (Opt(S, 1, 4), Opt(U, 2, 4), Opt(S, 0, 2), Opt(R, 4, 3)),
        (Opt(S, 2, 3), Opt(V, 3), Opt(R, 2, 4)),
        (Opt(S, 2, 4), Opt(LANES, 3), Opt(U, 1, 4)),
        (Opt(U, 0, 2), Opt(LANES, 2)),
    ],
    ids=lambda opts: " ".join(map(str, opts)) or "none",
)
def test_each_action_keeps_the_product(opts):
    a, x = realized(8, 12)
    b, y = realized(12, 16)
    np.testing.assert_allclose(run_with(a @ b, opts), x @ y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "opts",
    [(), (Opt(M, 0),), (Opt(M, 0), Opt(U, 0, 12)), (Opt(U, 1, 3), Opt(U, 0, 5))],
    ids=lambda opts: " ".join(map(str, opts)) or "none",
)
def test_actions_on_an_elementwise_kernel(opts):
    a, x = realized(10, 6)
    b, y = realized(10, 6)
    np.testing.assert_allclose(run_with(a * b + 1, opts), x * y + 1, rtol=1e-6, atol=1e-6)  # (FMA)


def test_merged_loops_run_as_one():
    a, x = realized(10, 6)
    kernel = apply_opts(kernel_of(a + 1), (Opt(M, 0),))
    assert [loop.src[0].arg for loop in loops_by_axis(kernel).values()] == [60]
    assert not any(node.op in (Ops.IDIV, Ops.MOD) for node in kernel.toposort)


def test_partial_unroll_of_a_max_reduce():
    a, x = realized(6, 20)
    np.testing.assert_allclose(run_with(a.max(1), (Opt(R, 1, 5), Opt(U, 0, 3))), x.max(1))


@pytest.mark.parametrize(
    "opt, message",
    [
        (Opt(U, 7, 2), "has no loop 7"),
        (Opt(U, 2, 4), "reduce loop: UNROLL it instead"),
        (Opt(R, 0, 2), "output loop: UPCAST it instead"),
        (Opt(U, 1, 5), "must be at least 2 and divide the loop's 16 iterations"),
        (Opt(U, 1, 1), "must be at least 2"),
        (Opt(V, 1), "an output loop is computed in vector types only on a device with threads"),
        (Opt(M, 2), "no loop inside it of its kind"),
        (Opt(S, 2, 12), "must be less than the loop's 12 iterations"),
        (Opt(S, 0, 3), "must be at least 2 and divide the loop's 8 iterations"),
        (Opt(LANES, 0), "takes a reduce loop and no amount"),
        (Opt(LANES, 2, 4), "takes a reduce loop and no amount"),
        (Opt(OptOp.SCATTER, 0), "does not select its values by loop 0"),
        (Opt(OptOp.SCATTER, 2), "a reduce loop, not an output loop"),
    ],
    ids=str,
)
def test_an_action_that_does_not_fit_is_an_error(opt, message):
    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    with pytest.raises(KernelOptError, match=message):
        apply_opts(kernel_of(a @ b), (opt,))


def test_a_merge_that_adds_divisions_is_refused():
    a, _ = realized(6, 10)
    with pytest.raises(KernelOptError, match="would add divisions"):
        apply_opts(kernel_of(a.T + 1), (Opt(M, 0),))


def test_opts_round_trip_through_json_and_reject_anything_else():
    opts = (Opt(M, 0), Opt(U, 1, 16), Opt(V, 3), Opt(R, 4, 4), Opt(S, 2, 8))
    assert tuple(Opt.from_json(opt.to_json()) for opt in opts) == opts
    assert str(Opt(U, 1, 16)) == "UPCAST(1, 16)" and str(Opt(V, 3)) == "VECTORIZE(3)"
    for bad in [[-1, 4], ["UPCAST", -1, 2], ["SHUFFLE", 0, 2], ["UPCAST", 0], ["UPCAST", 0, 2.0], "UPCAST"]:
        with pytest.raises(ValueError, match="not an optimization action"):
            Opt.from_json(bad)


def test_the_heuristic_blocks_a_product_and_its_list_is_printed_at_debug_3(capfd):
    from lazygrad.codegen.renderer import Target
    from lazygrad.helpers import Context

    a, x = realized(32, 64)
    b, y = realized(64, 32)
    # 8 accumulators (enough to keep the FMA units busy): 2 vectors across by 4 rows
    assert heuristic_opts(kernel_of(a @ b), Target()) == (Opt(U, 1, 32), Opt(U, 0, 4))
    opts = heuristic_opts(kernel_of(a @ b), Device[Device.DEFAULT].renderer.target)  # (LAZYGRAD_CPU may differ)
    with Context(DEBUG=3):
        np.testing.assert_allclose((a @ b + 2).numpy(), x @ y + 2, rtol=1e-5, atol=1e-5)
    assert " ".join(map(str, opts)) in capfd.readouterr().out


@pytest.mark.parametrize("longest", [False, True])
def test_the_taps_of_a_window_stacked_from_slices_are_unrolled(longest):
    # a window of up to STACKED_TAPS taps (STACKED_STRIDED_TAPS with a stride) is built from shifted slices, each
    # under a gate that only folds away where the tap loops are unrolled whole: the heuristic must unroll loops that
    # short (here in the product itself, which reads the few channels' windows in place)
    from lazygrad.codegen.renderer import Target
    from lazygrad.tensor_conv import STACKED_STRIDED_TAPS, STACKED_TAPS

    taps = STACKED_TAPS if longest else STACKED_STRIDED_TAPS
    x, _ = realized(1, 2, 11, 11)
    w, _ = realized(3, 2, taps, taps)
    kernel = kernel_of(x.conv2d(w))
    loops = [axis for axis, loop in loops_by_axis(kernel).items() if loop.src[0].arg == taps]
    unrolled = {opt.axis for opt in heuristic_opts(kernel, Target()) if opt.op is R and opt.amount == taps}
    assert len(loops) == 2 and unrolled == set(loops)


def test_an_output_loop_of_prime_length_read_every_other_element_gets_a_scalar_block():
    # a max over padded rows of two, each read every other element along 31 output rows: no vector width divides
    # 31, so the block is a scalar one (the heuristic asked for an upcast by 1, an error)
    a, data = realized(30, 2)
    out = a.pad((1, 2, 1, 0), value=2.0).sin().max(axis=1, keepdim=True)
    expected = np.sin(np.pad(data, ((1, 0), (1, 2)), constant_values=2.0)).max(axis=1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_the_register_block_follows_the_target():
    from lazygrad.codegen.renderer import Target

    a, _ = realized(1024, 1024)
    kernel = kernel_of(a @ a)
    assert heuristic_opts(kernel, Target(vector_width=16, vector_registers=32)) == (Opt(U, 1, 32), Opt(U, 0, 8))
    assert heuristic_opts(kernel, Target(vector_width=8, vector_registers=16)) == (Opt(U, 1, 16), Opt(U, 0, 4))


def test_a_product_along_a_contiguous_reduce_blocks_a_few_rows_in_fours():
    # 16 rows through a wide layer (ResNet18's 16 x 4608 @ 4608 x 512): the 16 rows taken whole would be read
    # again from L2 for every output column (0.63 ms); 4 by 4 blocks read them a quarter as often (0.32 ms)
    from lazygrad.codegen.renderer import Target

    x, a = realized(16, 4608)
    w, b = realized(512, 4608)
    opts = heuristic_opts(kernel_of(x @ w.T), Target(vector_width=16, vector_registers=32))
    assert opts == (Opt(V, 2), Opt(U, 1, 4), Opt(U, 0, 4))
    np.testing.assert_allclose(run_with(x @ w.T, opts), a @ b.T, rtol=1e-4, atol=1e-3)


def test_a_row_that_vectors_do_not_cover_is_blocked_in_parts():
    # a weight gradient's 27 taps (3 channels of 3x3) as the last axis of a product: 27 outputs by 4 rows (it got
    # no block at all before, 66x slower); 147 taps (a 7x7 filter) in parts of 21
    from lazygrad.codegen.renderer import Target

    for columns, block in ((27, (Opt(U, 1, 27), Opt(U, 0, 4))), (147, (Opt(U, 1, 21), Opt(U, 0, 6)))):
        a, x = realized(48, 128)
        b, y = realized(128, columns)
        opts = heuristic_opts(kernel_of(a @ b), Target(vector_width=16, vector_registers=32))
        assert opts == block
        np.testing.assert_allclose(run_with(a @ b, opts), x @ y, rtol=1e-4, atol=1e-4)


def test_a_stride_2_convolution_vectorizes_along_its_every_other_element():
    # a 7x7 stride-2 stem: the forward product in vectors of 16 output columns (each loads every other input
    # element) by 16 output channels sharing them; the 3 input channels stay a loop (a block this large is not
    # unrolled). The weight's gradient reduces over those 16 columns inside the loops over images and rows: in lanes
    # (a vector of partial sums), by 7 taps (sharing the output gradient's vector) and 4 output channels.
    # (Its input padded beforehand, as the scheduler realizes a pad such windows read: see test_schedule)
    torch = pytest.importorskip("torch")
    from lazygrad.codegen.renderer import Target

    target = Target(vector_width=16, vector_registers=32)
    x, x_data = realized(2, 3, 38, 38)
    w, w_data = realized(32, 3, 7, 7)
    g, g_data = realized(2, 32, 16, 16)
    forward = x.conv2d(w, stride=2)
    opts = heuristic_opts(kernel_of(forward), target)
    assert opts == (Opt(U, 3, 16), Opt(U, 1, 16))
    expected = torch.nn.functional.conv2d(torch.from_numpy(x_data), torch.from_numpy(w_data), stride=2)
    np.testing.assert_allclose(run_with(forward, opts), expected.numpy(), rtol=1e-4, atol=1e-4)

    (weight_gradient,) = (forward * g).sum().gradient(w)
    opts = heuristic_opts(kernel_of(weight_gradient), target)
    assert opts[:3] == (Opt(U, 3, 7), Opt(U, 0, 4), Opt(LANES, 6))
    torch_w = torch.from_numpy(w_data).requires_grad_()
    torch.nn.functional.conv2d(torch.from_numpy(x_data), torch_w, stride=2).backward(torch.from_numpy(g_data))
    np.testing.assert_allclose(run_with(weight_gradient, opts), torch_w.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_a_stride_2_convolutions_stacked_taps_unroll_into_vectors_of_every_other_element():
    # a 3x3 convolution stacks its taps, each read under a gate that picks it; rolled, every tap's value was a sum
    # of three gated loads. Its tap loops unroll even where the block (16 columns by 16 channels) is full, and LLVM
    # reads a tap's every other pixel as one load of the span they cover and a shuffle
    torch = pytest.importorskip("torch")
    from lazygrad.codegen.renderer import Target
    from lazygrad.engine.realize import render_kernel

    x, x_data = realized(2, 8, 33, 33)
    w, w_data = realized(16, 8, 3, 3)
    forward = x.conv2d(w, stride=2)
    assert heuristic_opts(kernel_of(forward), Target(vector_width=16, vector_registers=32)) == (
        Opt(U, 3, 16),
        Opt(U, 1, 16),
        Opt(R, 5, 3),
        Opt(R, 6, 3),
    )
    llvm = Device["LLVM"]
    (item,) = forward.schedule()
    opts = heuristic_opts(kernel_of(forward), llvm.renderer.target)
    source = render_kernel(llvm, item.ast, apply_opts(kernel_of(forward), opts, llvm.renderer.target), opts).source
    assert "_span = load" in source and "shufflevector" in source
    expected = torch.nn.functional.conv2d(torch.from_numpy(x_data), torch.from_numpy(w_data), stride=2)
    np.testing.assert_allclose(run_with(forward, opts), expected.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["LLVM", "CPU"])
def test_a_short_reduce_loop_inside_others_runs_in_lanes_of_vectors(device):
    # a sum over images, rows and a row of 16 (a convolution's weight gradient): the heuristic makes the row's
    # iterations lanes, so each output keeps a vector of partial sums across the whole reduce (a compiler that
    # vectorizes the row adds the lanes up at every exit from it), and the renderers keep them in vector registers
    from lazygrad.codegen.renderer import Target
    from lazygrad.engine.realize import render_kernel

    device = available(device)
    data = [rng.standard_normal(shape).astype(np.float32) for shape in ((8, 5, 16), (8, 12, 5, 34))]
    a, b = (Tensor(d, device=device).realize() for d in data)
    # 12 outputs, each over 8 x 5 x 16; the second input read every other element (a stride-2 convolution's input)
    product = (a[:, None] * b[:, :, :, :32:2]).sum((0, 2, 3))
    kernel = kernel_of(product)
    assert Opt(LANES, 3) in heuristic_opts(kernel, Target(vector_width=16, vector_registers=32))
    narrow = heuristic_opts(kernel, Target(vector_width=8, vector_registers=16))  # (two vectors of 8 lanes)
    assert [opt for opt in narrow if opt.op in (S, LANES)] == [Opt(S, 3, 8), Opt(LANES, 4)]
    host = Device[device]
    opts = heuristic_opts(kernel, host.renderer.target)
    (item,) = product.schedule()
    source = render_kernel(host, item.ast, apply_opts(kernel, opts, host.renderer.target), opts).source
    assert "vacc" in source
    expected = np.einsum("btk,bjtk->j", data[0], data[1][:, :, :, :32:2])
    np.testing.assert_allclose(run_with(product, opts), expected, rtol=1e-4, atol=1e-4)
    # read contiguously, the product has register blocks for BEAM to time: the list in lanes comes first
    contiguous = kernel_of((a[:, None] * b[:, :, :, :16]).sum((0, 2, 3)))
    offered = candidate_opts(contiguous, Target(vector_width=16, vector_registers=32))
    assert len(offered) > 1 and Opt(LANES, 3) in offered[0]


def test_loops_choosing_between_loads_are_upcast_within_a_budget_of_copies():
    # the input gradient of a 3x3 convolution with stride 2 sums shifted copies of its windows' gradient, each read
    # under a gate: four small output loops choose between those reads (the position within a stride and which
    # windows reach it, down and across). Upcast whole, each copy keeps the read it needs; all four would copy the
    # kernel's body 64 times, so the last is left a loop
    from lazygrad.codegen.heuristic import SELECTING_NODES
    from lazygrad.codegen.renderer import Target

    x, _ = realized(2, 4, 8, 8)
    g, g_data = realized(2, 4, 4, 4, 3, 3)
    windows = x.pad(((0, 0), (0, 0), (1, 1), (1, 1)))._pool((3, 3), (2, 2), (1, 1))
    (gradient,) = (windows * g).sum().gradient(x)
    kernel = kernel_of(gradient)
    opts = heuristic_opts(kernel, Target(vector_width=8, vector_registers=16))
    copies = int(np.prod([opt.amount for opt in opts if opt.op is U]))
    assert copies == 16 and len(kernel_nodes(kernel)) * copies <= SELECTING_NODES
    expected = np.zeros((2, 4, 10, 10), np.float32)
    for row, column, tap_row, tap_column in np.ndindex(4, 4, 3, 3):
        expected[:, :, 2 * row + tap_row, 2 * column + tap_column] += g_data[:, :, row, column, tap_row, tap_column]
    np.testing.assert_allclose(run_with(gradient, opts), expected[:, :, 1:9, 1:9], rtol=1e-5, atol=1e-5)


def test_a_reduce_the_same_for_every_output_channel_runs_once_before_their_loop():
    # with a .sum() loss, a convolution's weight gradient does not depend on the output channel: that loop stays a
    # loop and opens after the reduce has run (16 registers upcast only 2 of its 16 iterations: the other 8 would
    # each run the whole reduce again), while the input channels' loop stays split across cores
    from lazygrad.codegen.renderer import Target

    x, x_data = realized(4, 3, 8, 8)
    weight = Tensor(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), requires_grad=True)
    (gradient,) = x.conv2d(weight).sum().gradient(weight)
    kernel = kernel_of(gradient)
    opts = heuristic_opts(kernel, Target(vector_width=8, vector_registers=16))
    assert Opt(OptOp.LOOP, 0) in opts
    program = linearize(apply_opts(kernel, opts))
    opened = [node.arg for node in program if node.op is Ops.RANGE]
    assert opened[0][1] is LoopKind.GLOBAL and opened[-1] == (0, LoopKind.LOOP)
    assert sum(node.op is Ops.DEFINE_ACC for node in program) == 9  # one per tap, not per tap and channel
    taps = np.stack([x_data[:, :, i : i + 6, j : j + 6].sum((0, 2, 3)) for i in range(3) for j in range(3)], -1)
    expected = np.broadcast_to(taps.reshape(1, 3, 3, 3), (16, 3, 3, 3))
    np.testing.assert_allclose(run_with(gradient, opts), expected, rtol=1e-5, atol=1e-4)


def test_a_reduce_loop_opened_again_computes_its_indices_again():
    # two upcast copies of a max over the same loop: one runs before the output loop (its row is padding), the other
    # inside it, opening the loop again; what was computed from the loop's index the first time lived in that loop
    # (LLVM: "Instruction does not dominate all uses!", C: an undeclared variable)
    values = np.arange(-4.0, 1.25, 0.03125, dtype=np.float32).reshape(7, 6, 4)
    other = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 1, 4)
    rows = Tensor.arange(-4.0, 1.25, 0.03125).reshape(7, 6, 4).max(axis=1, keepdim=True)[-5:-1:3]
    chosen = (rows > -0.703125).where(Tensor([[[0.5]]]), 3.0)
    out = (Tensor(other) + chosen).reshape(4, 2).pad(((3, 1), (1, 0)), value=-0.75)
    picked = np.where(values.max(axis=1, keepdims=True)[-5:-1:3] > -0.703125, 0.5, 3.0)
    expected = np.pad((other + picked).reshape(4, 2), ((3, 1), (1, 0)), constant_values=-0.75)
    np.testing.assert_allclose(out.numpy(), expected)


def test_a_split_numbers_the_inner_loop_next_and_moves_the_others_up():
    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    loops = loops_by_axis(apply_opts(kernel_of(a @ b), (Opt(S, 1, 4),)))
    assert [(axis, loop.src[0].arg, loop.arg[1]) for axis, loop in sorted(loops.items())] == [
        (0, 8, LoopKind.GLOBAL),
        (1, 4, LoopKind.GLOBAL),
        (2, 4, LoopKind.GLOBAL),
        (3, 12, LoopKind.REDUCE),
    ]


def test_heads_merged_by_a_reshape_are_split_apart_again():
    # attention's output, (batch, heads, time, head size) read as (batch, time, features): its product with a
    # weight reduces over heads * head size, which the heuristic splits back so the loads need no divisions
    heads, x = realized(2, 4, 3, 8)
    w, y = realized(32, 16)
    merged = heads.transpose(1, 2).reshape(2, 3, 32)
    kernel = kernel_of(merged @ w)
    target = Device[Device.DEFAULT].renderer.target
    opts = heuristic_opts(kernel, target)
    assert Opt(S, 3, 8) in opts
    assert not any(node.op in (Ops.IDIV, Ops.MOD) for node in apply_opts(kernel, opts, target).toposort)
    expected = x.transpose(0, 2, 1, 3).reshape(2, 3, 32) @ y
    np.testing.assert_allclose(run_with(merged @ w, opts), expected, rtol=1e-5, atol=1e-5)


# ---- thread actions: devices with threads (the PYTHON emulator runs the same programs GPUs get) --------------------

L, P, G, T = OptOp.LOCAL, OptOp.LOOP, OptOp.GROUP, OptOp.TILE


@pytest.fixture(params=["PYTHON", "GPU", "CUDA"])
def threaded(request) -> str:
    return available(request.param)


@pytest.mark.parametrize(
    "opts",
    [
        (),
        (Opt(L, 1, 16),),
        (Opt(L, 1, 8), Opt(L, 0, 2)),
        (Opt(P, 0), Opt(L, 1, 4)),
        (Opt(U, 1, 2), Opt(L, 1, 4)),
        (Opt(G, 2, 4),),
        (Opt(L, 1, 4), Opt(G, 3, 3)),  # shared memory indexed by both thread loops
        (Opt(L, 1, 4), Opt(G, 3, 4)),  # (with shuffles: within a warp, lanes 4 apart)
        (Opt(L, 1, 16), Opt(G, 2, 4)),  # (with shuffles: lanes 16 apart, 2 in a warp, then the 2 warps)
        (Opt(P, 0), Opt(U, 0, 2), Opt(L, 1, 8)),
        (Opt(L, 1, 4), Opt(U, 1, 4)),  # a register tile: a thread's outputs a block's threads apart
        (Opt(L, 1, 4), Opt(T, 3, 3)),  # the inputs staged 3 of the 12 reduce iterations at a time
        (Opt(L, 0, 2), Opt(L, 2, 4), Opt(U, 0, 4), Opt(U, 2, 4), Opt(T, 4, 4)),
        (Opt(L, 0, 4), Opt(L, 2, 8), Opt(T, 4, 6)),  # more elements than threads: the last copy is gated
        (Opt(L, 1, 16), Opt(L, 0, 4), Opt(T, 3, 2)),  # fewer elements than threads: one gated copy
        (Opt(P, 0), Opt(L, 1, 8), Opt(T, 3, 4)),  # a tile inside a loop of the thread
    ],
    ids=str,
)
def test_thread_actions_keep_the_product(threaded, opts):
    a_data, b_data = rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal((12, 16)).astype(np.float32)
    a, b = Tensor(a_data, device=threaded).realize(), Tensor(b_data, device=threaded).realize()
    np.testing.assert_allclose(run_with(a @ b, opts), a_data @ b_data, rtol=1e-4, atol=1e-5)


def test_a_block_of_1024_threads_launches_however_many_registers_its_threads_would_hold():
    """A CUDA block of more than 256 threads is told to ptxas (`__launch_bounds__`), which then gives a thread at most
    the 64 registers a block of 1,024 can have: a thread's 64 accumulators (96 registers unbounded: the block would
    not launch) spill instead, and the product runs on the mock, which checks an A100's registers at each launch."""
    device = available("CUDA")
    a_data, b_data = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    a, b = (Tensor(data, device=device).realize() for data in (a_data, b_data))
    opts = (Opt(L, 0, 32), Opt(L, 2, 32), Opt(U, 0, 8), Opt(U, 2, 8))
    np.testing.assert_allclose(run_with(a @ b, opts), a_data @ b_data, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("reduce", ["sum", "max", "any"])
def test_a_group_reduction_of_every_kind(threaded, reduce):
    # (data of its own: drawn from the shared generator, it depended on the tests run before it in the same process,
    # and a sum that nearly cancels is further from NumPy's than rtol allows)
    data = np.random.default_rng(96).standard_normal(96).astype(np.float32)
    data[17] = np.nan if reduce == "max" else data[17]
    x = Tensor(data, device=threaded).realize()
    tensor = {"sum": lambda: x.sum(), "max": lambda: x.max(), "any": lambda: (x > 2.0).any()}[reduce]()
    expected = {"sum": data.sum(), "max": np.nan, "any": (data > 2.0).any()}[reduce]
    np.testing.assert_allclose(run_with(tensor, (Opt(G, 0, 32),)), expected, rtol=1e-5)


@pytest.mark.parametrize("reduce", ["sum", "max", "prod", "expsum", "rows"])
def test_a_padded_group_reduction_takes_the_identity_past_the_end(threaded, reduce):
    # 97 values (a prime: no block of threads divides it) padded to 128 for 32 threads; the padding must not count:
    # a max of negative values is not 0, a product not 0, a sum of exps not 31 more
    data = -np.abs(rng.standard_normal((3, 97))).astype(np.float32) - 0.5
    x = Tensor(data, device=threaded).realize()
    tensor, expected, axis = {
        "sum": (x[0].sum(), data[0].sum(), 0),
        "max": (x[0].max(), data[0].max(), 0),
        "prod": ((x[0] * 0.01 + 1).prod(), np.prod(data[0] * 0.01 + 1), 0),
        "expsum": (x[0].exp().sum(), np.exp(data[0]).sum(), 0),
        "rows": (x.max(1), data.max(1), 1),
    }[reduce]
    np.testing.assert_allclose(run_with(tensor, (Opt(D, axis, 32), Opt(G, axis, 32))), expected, rtol=1e-5)


def test_the_heuristic_pads_a_long_reduce_few_threads_divide():
    python = Device["PYTHON"].renderer.target  # (blocks of 8 threads)
    assert thread_opts(kernel_of(realized(131)[0].max()), python) == (Opt(D, 0, 8), Opt(G, 0, 8))
    # ... not where padding would add more than an eighth of the iterations
    assert Opt(D, 0, 8) not in thread_opts(kernel_of(realized(41)[0].max()), python)


@pytest.mark.parametrize(
    "opt, message",
    [
        (Opt(L, 2, 4), "is a reduce loop, not an output loop"),
        (Opt(G, 0, 2), "is a global loop, not a reduce loop"),
        (Opt(S, 2, 12), "must be less than the loop"),
        (Opt(P, 2), "is a reduce loop, not an output loop"),
    ],
    ids=str,
)
def test_thread_actions_that_do_not_fit_are_errors(opt, message):
    a, _ = realized(8, 12)
    b, _ = realized(12, 32)
    kernel = kernel_of(a @ b)
    python = Device["PYTHON"].renderer.target
    with pytest.raises(KernelOptError, match=message):
        apply_opts(kernel, (opt,), python)
    with pytest.raises(KernelOptError, match="the device has no threads"):
        apply_opts(kernel, (Opt(L, 1, 4),))  # no target: a CPU's
    with pytest.raises(KernelOptError, match="more than the device's 64 threads"):
        apply_opts(kernel, (Opt(L, 1, 16), Opt(L, 0, 8)), python)
    with pytest.raises(KernelOptError, match="share memory already"):
        apply_opts(kernel, (Opt(G, 2, 4), Opt(U, 1, 2)), python)
    # a barrier inside a loop would need another to keep the next iteration from overwriting the partials
    with pytest.raises(KernelOptError, match="the reduce also runs inside loop 0"):
        apply_opts(kernel, (Opt(P, 0), Opt(G, 2, 6)), python)
    # a second GROUP over threads of its own would repeat the first one's combine through shared memory in each of
    # them, racing (a combine by shuffles writes no memory: see below)
    total = kernel_of(realized(3, 4, 8)[0].sum())
    with pytest.raises(KernelOptError, match="a later one must share its threads"):
        apply_opts(total, (Opt(G, 2, 8), Opt(G, 1, 4)), replace(python, shuffle_lanes=0))


def test_a_group_after_one_that_combined_by_shuffles_may_take_threads_of_its_own():
    """A combine by shuffles writes no memory, so a second GROUP's new threads may each repeat it."""
    data = rng.standard_normal((3, 4, 8)).astype(np.float32)
    total = Tensor(data, device=available("PYTHON")).realize().sum()
    np.testing.assert_allclose(run_with(total, (Opt(G, 2, 8), Opt(G, 1, 4))), data.sum(), rtol=1e-5)


def test_the_thread_heuristic_spreads_outputs_and_groups_full_reductions():
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    a, _ = realized(64, 12)
    b, _ = realized(12, 512)
    assert thread_opts(kernel_of(a @ b), target, tiles=False) == (Opt(L, 1, 256),)
    assert heuristic_opts(kernel_of(a * 2), target) == (Opt(M, 0), Opt(L, 0, 256))
    assert heuristic_opts(kernel_of(a.sum()), target) == (Opt(M, 0), Opt(G, 0, 256))
    # a row's max and sum do not depend on the row's outputs: those stay a loop inside the thread of the row
    assert heuristic_opts(kernel_of(a.softmax(axis=1)), target) == (Opt(P, 1), Opt(L, 0, 64))


def test_a_group_reduction_shares_the_loop_along_which_the_threads_read_neighbouring_memory(threaded):
    """A convolution's weight gradient reduces over the batch and the image's rows and columns, 32 each: on a GPU
    the threads of a block share the columns (neighbouring threads read neighbouring pixels), not the batch (an
    image apart), and, the kernel having few blocks, the rows too: 8 rows of 32 columns a block."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    data = np.random.default_rng(7)
    x_data = data.standard_normal((32, 3, 32, 32)).astype(np.float32)
    x = Tensor(x_data, device=threaded, requires_grad=True)
    w = Tensor(data.standard_normal((4, 3, 3, 3)).astype(np.float32), device=threaded, requires_grad=True)
    x.conv2d(w, padding=1).sum().backward()
    item = [item for item in w.grad.schedule() if item.kind == "kernel"][-1]
    kernel = prepare(lower_kernel(item.ast))
    reduce_loops = sorted(axis for axis, loop in loops_by_axis(kernel).items() if loop.arg[1] is LoopKind.REDUCE)
    assert [loops_by_axis(kernel)[axis].src[0].arg for axis in reduce_loops] == [32, 32, 32]
    (group,) = [opt for opt in thread_opts(kernel, CUDARenderer.target) if opt.op is G]
    assert group == Opt(G, reduce_loops[-1], 256)  # (the columns, the innermost reduce loop, and 8 rows)
    padded = np.pad(x_data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3)).sum(
        axis=(0, 2, 3), dtype=np.float64
    )
    # (each a float32 sum of 32,768 normal values, some near 0: a tolerance for the sum's size, not the result's)
    np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(windows, (4, 3, 3, 3)), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_a_group_of_more_threads_than_a_loop_has_iterations_shares_the_loop_outside_it_too(threaded, op):
    """GROUP(3, 32) on a reduce over loops of 12, 8 and 16: thread t takes column t % 16 and rows 2 * r + t // 16,
    one combine over all 32 threads (24 threads: a combine that is not a tree); 48 threads (3 of the 8 rows) or more
    threads than the reduce's outermost loop has iterations are refused, saying why."""
    data = rng.standard_normal((12, 3, 8, 16)).astype(np.float32)
    x = Tensor(data, device=threaded).realize()
    y = getattr(x, op)((0, 2, 3))
    kernel, target = kernel_of(y), Device[threaded].renderer.target
    assert [loop.src[0].arg for _, loop in sorted(loops_by_axis(kernel).items())] == [3, 12, 8, 16]
    for opts in [(Opt(G, 3, 32),), (Opt(G, 2, 16),), (Opt(L, 0, 3), Opt(G, 2, 16)), (Opt(G, 2, 24),)]:
        grouped = apply_opts(kernel, opts, target)
        threads = [loop.src[0].arg for loop in loops_by_axis(grouped).values() if loop.arg[1] is LoopKind.LOCAL]
        assert prod(threads) == prod(opt.amount for opt in opts)
        np.testing.assert_allclose(run_with(y, opts), getattr(data, op)((0, 2, 3)), rtol=1e-5, atol=1e-4)
    with pytest.raises(KernelOptError, match=r"its 3 threads along loop 2 must divide that loop's 8 iterations"):
        apply_opts(kernel, (Opt(G, 3, 48),), target)
    with pytest.raises(KernelOptError, match=r"more than loop 1's 12 iterations.*use an amount that divides 12"):
        apply_opts(kernel, (Opt(G, 1, 24),), target)
    with pytest.raises(KernelOptError, match=r"divide the loop's 16 iterations \(or, for a GROUP, be a multiple"):
        apply_opts(kernel, (Opt(G, 3, 40),), target)


def test_the_threads_of_a_row_share_its_outputs_and_each_of_its_reduces(threaded):
    """A softmax row per block: its threads store the row's outputs, and its max and sum share the same threads
    (a second GROUP finds the threads of the first), so the block has 8 threads, not 64."""
    data = rng.standard_normal((3, 64)).astype(np.float32)
    x = Tensor(data, device=threaded).realize()
    opts = (Opt(P, 1), Opt(L, 1, 8), Opt(G, 3, 8), Opt(G, 4, 8))
    kernel = apply_opts(kernel_of(x.softmax(axis=1)), opts, Device[threaded].renderer.target)
    assert [loop.src[0].arg for loop in loops_by_axis(kernel).values() if loop.arg[1] is LoopKind.LOCAL] == [8]
    expected = np.exp(data - data.max(axis=1, keepdims=True))
    np.testing.assert_allclose(run_with(x.softmax(axis=1), opts), expected / expected.sum(1, keepdims=True), rtol=1e-5)


def test_a_block_that_ends_inside_a_warp_shuffles_among_the_lanes_it_has(threaded):
    """Softmax rows of 64, 8 threads each, 6 rows a block: 48 threads, the second warp half full."""
    data = rng.standard_normal((6, 64)).astype(np.float32)
    x = Tensor(data, device=threaded).realize()
    opts = (Opt(L, 0, 6), Opt(P, 1), Opt(L, 1, 8), Opt(G, 3, 8), Opt(G, 4, 8))
    expected = np.exp(data - data.max(axis=1, keepdims=True))
    np.testing.assert_allclose(run_with(x.softmax(axis=1), opts), expected / expected.sum(1, keepdims=True), rtol=1e-5)


def test_the_thread_heuristic_gives_few_long_rows_a_block_each():
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    rows, _ = realized(4, 2048)
    # (a thread's four neighbouring outputs and reads at a time: float4 accesses)
    assert heuristic_opts(kernel_of(rows.softmax(axis=1)), target) == (
        Opt(P, 1),
        Opt(U, 1, 4),
        Opt(L, 1, 256),
        Opt(R, 3, 4),
        Opt(R, 4, 4),
        Opt(G, 3, 256),
        Opt(G, 4, 256),
    )
    # (each thread reads whole vectors of four: float4 loads)
    assert heuristic_opts(kernel_of(rows.sum(axis=1)), target) == (Opt(R, 1, 4), Opt(G, 1, 256))


def test_short_rows_read_in_order_get_a_warp_each_and_matrix_products_do_not(threaded):
    """Rows of 128, a thread each, would be read one value after another by each thread (its warp's neighbours a row
    apart) on few blocks: a layer norm's statistics and a softmax get a warp per row instead. A matrix product of
    many outputs, whose rows and columns some outputs share, does not; nor do rows shorter than a warp."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    data = rng.standard_normal((48, 128)).astype(np.float32)
    x = Tensor(data, device=threaded).realize()
    assert heuristic_opts(kernel_of(x.sum(axis=1)), target) == (Opt(R, 1, 4), Opt(G, 1, 32))
    # BEAM also times a thread per row
    assert (Opt(L, 0, 48),) in candidate_opts(kernel_of(x.sum(axis=1)), target)
    assert heuristic_opts(kernel_of(x.softmax(axis=1)), target) == (
        Opt(P, 1),
        Opt(U, 1, 4),
        Opt(L, 1, 32),
        Opt(R, 2, 4),
        Opt(R, 3, 4),
        Opt(G, 2, 32),
        Opt(G, 3, 32),
    )
    many = Tensor(rng.standard_normal((128, 128)).astype(np.float32), device=threaded).realize()
    assert not any(opt.op is G for opt in heuristic_opts(kernel_of(many @ many.T), target))
    assert not any(opt.op is G for opt in heuristic_opts(kernel_of(x[:, :16].softmax(axis=1)), target))
    expected = np.exp(data - data.max(axis=1, keepdims=True))
    np.testing.assert_allclose(x.softmax(axis=1).numpy(), expected / expected.sum(1, keepdims=True), rtol=1e-5)
    centered = data - data.mean(axis=1, keepdims=True)
    normed = centered / np.sqrt((centered**2).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(x.layernorm().numpy(), normed, rtol=1e-4, atol=1e-5)


def test_a_product_of_few_outputs_read_in_order_gets_a_warp_per_output(threaded):
    """A classifier's 16 x 10 outputs from 512 features (x @ w.T, both read along the features) are too few for tiles
    to fill a GPU: a warp per output shares its 512 products; a product of many outputs keeps its tiles, and one of
    a short reduce a thread per output."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    x_data, w_data = (
        rng.standard_normal((16, 512)).astype(np.float32),
        rng.standard_normal((10, 512)).astype(np.float32),
    )
    x, w = Tensor(x_data, device=threaded).realize(), Tensor(w_data, device=threaded).realize()
    assert [opt.op for opt in heuristic_opts(kernel_of(x @ w.T), target)] == [R, G]
    np.testing.assert_allclose((x @ w.T).numpy(), x_data @ w_data.T, rtol=1e-4, atol=1e-4)
    # 96 features, 3 a thread, do not pay for a warp's combine: a thread per output
    assert G not in [opt.op for opt in heuristic_opts(kernel_of(x[:, :96] @ w[:, :96].T), target)]
    many = Tensor(rng.standard_normal((128, 512)).astype(np.float32), device=threaded).realize()
    assert OptOp.TILE in [opt.op for opt in heuristic_opts(kernel_of(many @ many.T), target)]


def test_few_outputs_that_each_sum_a_column_share_it_among_a_block_whose_warps_read_along_rows(threaded):
    """A bias gradient, 128 features summed over 384 rows, a thread each, is one block whose threads each read 384
    values down a column: instead a warp takes 32 neighbouring features and 8 warps share the rows (and so for the
    channels of batch-norm statistics over small images)."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    data = rng.standard_normal((384, 128)).astype(np.float32)
    x = Tensor(data, device=threaded).realize()
    opts = heuristic_opts(kernel_of(x.sum(axis=0)), target)
    assert [(opt.op, opt.amount) for opt in opts] == [(L, 32), (G, 8)]
    # the group's threads move slowest through the thread index: a warp's 32 threads read 32 neighbouring values
    threads = loops_of_kind(apply_opts(kernel_of(x.sum(axis=0)), opts, target), LoopKind.LOCAL)
    assert [thread.src[0].arg for thread in threads] == [8, 32]
    np.testing.assert_allclose(x.sum(axis=0).numpy(), data.sum(axis=0), rtol=1e-5, atol=1e-4)
    # long columns too: a block per column would read it with threads a row apart
    tall = Tensor(data.reshape(1536, 32), device=threaded).realize()
    opts = heuristic_opts(kernel_of(tall.sum(axis=0)), target)
    assert [(opt.op, opt.amount) for opt in opts] == [(L, 32), (G, 8)]
    np.testing.assert_allclose(tall.sum(axis=0).numpy(), data.reshape(1536, 32).sum(axis=0), rtol=1e-5, atol=1e-3)
    # ten outputs (a classifier's bias): all ten are a block's neighbouring threads, 16 groups of them share the rows
    classes = Tensor(data[:, :10], device=threaded).realize()
    opts = heuristic_opts(kernel_of(classes.sum(axis=0)), target)
    assert [(opt.op, opt.amount) for opt in opts] == [(L, 10), (G, 16)]
    np.testing.assert_allclose(classes.sum(axis=0).numpy(), data[:, :10].sum(axis=0), rtol=1e-5, atol=1e-4)
    # a prime number of outputs more than a warp has no neighbours to give a warp: a thread per output
    primes = Tensor(data[:, :37], device=threaded).realize()
    assert heuristic_opts(kernel_of(primes.sum(axis=0)), target) == (Opt(L, 0, 37),)
    np.testing.assert_allclose(primes.sum(axis=0).numpy(), data[:, :37].sum(axis=0), rtol=1e-5, atol=1e-4)
    # batch-norm statistics of 2x2 images: each channel's 192 values lie in 48 pieces of 4, 4 channels apart
    images = Tensor(data.reshape(48, 256, 2, 2), device=threaded).realize()
    opts = heuristic_opts(kernel_of(images.sum(axis=(0, 2, 3))), target)
    assert [(opt.op, opt.amount) for opt in opts if opt.op in (L, G)] == [(L, 32), (G, 8)]
    expected = data.reshape(48, 256, 2, 2).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(images.sum(axis=(0, 2, 3)).numpy(), expected, rtol=1e-5, atol=1e-4)
    # rows plus a vector every batch shares (a position embedding): rows still; a batched product of many outputs
    # (256 x 6 x 6 from 128 features): no GROUP
    positions = Tensor(data[:6], device=threaded).realize()
    rows = x.reshape(64, 6, 128) + positions
    assert heuristic_opts(kernel_of(rows.sum(axis=2)), target) == (Opt(R, 2, 4), Opt(G, 2, 32))
    np.testing.assert_allclose(
        rows.sum(axis=2).numpy(), (data.reshape(64, 6, 128) + data[:6]).sum(2), rtol=1e-4, atol=1e-4
    )
    batch = Tensor(rng.standard_normal((256, 6, 128)).astype(np.float32), device=threaded).realize()
    products = batch @ batch.transpose(1, 2)
    assert not any(opt.op is G for opt in heuristic_opts(kernel_of(products), target))


def test_streaming_kernels_read_and_write_memory_sixteen_bytes_at_a_time(threaded):
    """On a GPU a thread reads and writes four consecutive floats at once (a float4: one instruction, not four): an
    elementwise kernel of many outputs computes four neighbouring outputs a thread, and a long sum reads four values
    a thread each step. A kernel of few outputs keeps a thread each; one that reads across
    its rows (a transpose) or reads halves keeps its scalar accesses."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    # (data of its own: a sum of the shared generator's draws depended on the tests before it, and may nearly cancel)
    data = np.random.default_rng(16).standard_normal(1 << 17).astype(np.float32)
    x = Tensor(data, device=threaded).realize()
    assert heuristic_opts(kernel_of(x * 2 + 1), target) == (Opt(U, 0, 4), Opt(L, 0, 256))
    np.testing.assert_allclose((x * 2 + 1).numpy(), data * 2 + 1, rtol=1e-6)
    first = prepare(lower_kernel(x.sum().schedule()[0].ast))  # (the parts' kernel, where the device splits it)
    assert [(opt.op, opt.amount) for opt in heuristic_opts(first, target)] == [(R, 4), (G, 256)]
    # (float32 partial sums: off by a few units in the last place of the sum of the values' magnitudes)
    np.testing.assert_allclose(x.sum().numpy(), data.sum(dtype=np.float64), atol=1e-6 * np.abs(data).sum())
    integers = Tensor(np.arange(1 << 17, dtype=np.int32), device=threaded).realize()
    assert integers.sum().item() == (1 << 16) * ((1 << 17) - 1)
    small = Tensor(data[:1000], device=threaded).realize()
    assert not any(opt.op is U for opt in heuristic_opts(kernel_of(small * 2), target))
    square = Tensor(data.reshape(512, 256), device=threaded).realize()
    assert not any(opt.op is U for opt in heuristic_opts(kernel_of(square.T + 1), target))
    np.testing.assert_allclose((square.T + 1).numpy(), data.reshape(512, 256).T + 1, rtol=1e-6)
    assert not any(opt.op is U for opt in heuristic_opts(kernel_of(x.half() * 2), target))
    # an update in place (an optimizer's step) reads each vector of its weights, then writes it back
    weights = Tensor(data, device=threaded).realize()
    weights.assign(weights - x * 0.5).realize()
    np.testing.assert_allclose(weights.numpy(), data - data * np.float32(0.5), rtol=1e-6)


def test_the_cuda_source_reads_and_writes_aligned_vectors_and_scalars_elsewhere():
    """The CUDA source makes the four loads of a float4 one (`LAZYGRAD_WIDE`, which the mock checks is aligned, as a
    GPU requires), and the four stores one; a slice one element in reads its four floats one at a time (a vector
    there would straddle two), and stores its aligned outputs as one."""
    from lazygrad.engine.realize import render_kernel

    device = available("CUDA")
    data = np.random.default_rng(17).standard_normal((1 << 17) + 1).astype(np.float32)
    x = Tensor(data, device=device).realize()
    cuda = Device[device]

    def source(tensor: Tensor) -> str:
        (item,) = tensor.schedule()
        kernel = prepare(lower_kernel(item.ast))
        opts = heuristic_opts(kernel, cuda.renderer.target)
        return render_kernel(cuda, item.ast, apply_opts(kernel, opts, cuda.renderer.target), opts).source

    aligned = source(x[: 1 << 17] * 2 + 1)
    assert "LAZYGRAD_WIDE(const float4, data1 + " in aligned and "LAZYGRAD_WIDE(float4, data0 + " in aligned
    shifted = source(x[1:] * 2 + 1)
    assert "LAZYGRAD_WIDE(const float4" not in shifted and "LAZYGRAD_WIDE(float4, data0 + " in shifted
    np.testing.assert_allclose((x[1:] * 2 + 1).numpy(), data[1:] * 2 + 1, rtol=1e-6)
    rows = x[: 1 << 17].reshape(64, -1).sum(axis=1)
    assert "LAZYGRAD_WIDE(const float4, data1 + " in source(rows)
    # an integer sum's lanes are linearized out of order: its vectors are read at the lane that comes first
    counts = np.random.default_rng(18).integers(-1000, 1000, 1 << 17).astype(np.int32)
    total = Tensor(counts, device=device).realize().sum()
    assert "LAZYGRAD_WIDE(const int4, data1 + " in source(total)
    assert total.item() == counts.sum()
    weights = Tensor(data[: 1 << 17], device=device).realize()
    update = source(weights.assign(weights - x[: 1 << 17] * 0.5))  # (in place: read, then written back)
    assert "LAZYGRAD_WIDE(const float4, data0 + " in update and "LAZYGRAD_WIDE(float4, data0 + " in update
    np.testing.assert_allclose(weights.numpy(), data[: 1 << 17] * np.float32(0.5), rtol=1e-6)
    np.testing.assert_allclose(rows.numpy(), data[: 1 << 17].reshape(64, -1).sum(axis=1), rtol=1e-5, atol=1e-3)


def test_opencl_on_a_gpu_reads_and_writes_aligned_vectors(monkeypatch):
    """An OpenCL GPU (preferred vector width 1) gets CUDA's 16-byte accesses, spelled as a dereference of a pointer to
    a vector type (one access; vload4 may make four): here PoCL runs kernels rendered for such a GPU's target."""
    from lazygrad.codegen.renderer import Target
    from lazygrad.codegen.renderer.opencl import OpenCLRenderer
    from lazygrad.engine.realize import render_kernel

    device = available("GPU")
    gpu = Device[device]
    target = Target(vector_width=1, max_threads=256, block_threads=256, shared_memory=1 << 15, wide_bytes=16)
    monkeypatch.setattr(gpu, "renderer", OpenCLRenderer(target))
    data = np.random.default_rng(18).standard_normal(1 << 17).astype(np.float32)
    x = Tensor(data, device=device).realize()
    rows = x.reshape(64, -1)
    sources = []
    for tensor, expected in ((x * 2 + 1, data * 2 + 1), (rows.sum(axis=1), data.reshape(64, -1).sum(axis=1))):
        (item,) = tensor.schedule()
        kernel = prepare(lower_kernel(item.ast))
        opts = heuristic_opts(kernel, target)
        sources.append(render_kernel(gpu, item.ast, apply_opts(kernel, opts, target), opts).source)
        assert "*(__global const float4*)(data1 + " in sources[-1], sources[-1]
        np.testing.assert_allclose(run_with(tensor, opts).reshape(-1), expected, rtol=1e-5, atol=1e-3)
    assert "*(__global float4*)(data0 + " in sources[0]  # (the elementwise kernel's four outputs: one store)


def test_a_threaded_device_unrolls_a_windows_taps_and_keeps_its_weight_gradient_spread():
    """On a device with threads, a convolution's product unrolls its stacked taps in each thread (rolled, every tap
    would read all its taps' slices under gates), and a weight gradient takes its taps into registers only while
    BUSY_BLOCKS blocks are left: one 7-tap axis of a depthwise 7x7 convolution's 3136 outputs, no axis of a 3x3
    one's 216. Forward and backward match torch on this device."""
    torch = pytest.importorskip("torch")
    from lazygrad.codegen.heuristic import BUSY_BLOCKS
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    target = CUDARenderer.target
    x, _ = realized(4, 3, 16, 16)
    w, _ = realized(8, 3, 3, 3)
    forward = kernel_of(x.conv2d(w))
    taps = sorted(loop.arg[0] for loop in loops_by_axis(forward).values() if loop.src[0].arg == 3)[-2:]
    assert heuristic_opts(forward, target)[:2] == (Opt(R, taps[1], 3), Opt(R, taps[0], 3))
    for (channels, channels_out, groups, kernel), upcast in (((3, 8, 1, 3), 0), ((64, 64, 64, 7), 7)):
        x, x_data = realized(8, channels, 16, 16)
        w, w_data = realized(channels_out, channels // groups, kernel, kernel)
        g, g_data = realized(8, channels_out, 16, 16)
        out = x.conv2d(w, padding=kernel // 2, groups=groups)
        x_gradient, weight_gradient = (out * g).sum().gradient(x, w)
        product = prepare(lower_kernel(weight_gradient.schedule()[-1].ast))  # (after a copy of the padded input)
        opts = heuristic_opts(product, target)
        assert [opt.amount for opt in opts if opt.op is U] == ([upcast] if upcast else [])
        assert w_data.size // kernel < BUSY_BLOCKS if not upcast else w_data.size // upcast >= BUSY_BLOCKS
        tx, tw = torch.from_numpy(x_data).requires_grad_(), torch.from_numpy(w_data).requires_grad_()
        torch.nn.functional.conv2d(tx, tw, padding=kernel // 2, groups=groups).backward(torch.from_numpy(g_data))
        np.testing.assert_allclose(weight_gradient.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(x_gradient.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_every_kernel_of_a_convolutions_backward_keeps_the_threads_busy():
    """Each kernel of a convolution's forward and backward on a device with threads runs as many threads as it has
    outputs (up to 64, at least): the input's gradient (a short reduce broadcast over many outputs) spreads its outputs over threads rather
    than looping over them in a few, and the weights' gradient (few outputs, a long reduce) takes a block per output
    whose threads share the reduce."""
    from lazygrad.engine.realize import generate_kernel

    x = Tensor(rng.standard_normal((4, 3, 16, 16), dtype=np.float32), device="PYTHON", requires_grad=True).realize()
    weight = Tensor(rng.standard_normal((8, 3, 3, 3), dtype=np.float32), device="PYTHON", requires_grad=True)
    loss = x.conv2d(weight.realize(), padding=1).sum()
    loss.backward()
    for item in loss.schedule(x.grad, weight.grad):
        if item.kind == "kernel":
            kernel = generate_kernel(Device["PYTHON"], item.ast)
            grid, block, _ = kernel.launch
            assert grid * block >= min(item.buffers[0].arg[1], 64), (kernel.name, kernel.launch)


# ---- tiles: a matrix product's inputs staged in shared memory ------------------------------------------------------


@pytest.mark.parametrize(
    "opts, message",
    [
        ((Opt(T, 2, 4),), "no threads to share the copies"),
        ((Opt(L, 1, 4), Opt(T, 1, 2)), "is a global loop, not a reduce loop"),
        ((Opt(L, 1, 4), Opt(T, 3, 12)), "must be less than the loop's 12 iterations"),
        ((Opt(L, 1, 4), Opt(T, 3, 5)), "must be at least 2 and divide"),
        ((Opt(L, 1, 4), Opt(T, 3, 6), Opt(U, 0, 2)), "share memory already"),
        ((Opt(L, 1, 4), Opt(T, 3, 6), Opt(G, 3, 2)), "reads its inputs from a tile in shared memory"),
        ((Opt(L, 1, 4), Opt(T, 3, 6), Opt(G, 4, 2)), "reads its inputs from a tile in shared memory"),
        ((Opt(G, 2, 4), Opt(T, 3, 3)), "share memory already"),
    ],
    ids=str,
)
def test_tiles_that_do_not_fit_are_errors(opts, message):
    a, _ = realized(8, 12)
    b, _ = realized(12, 32)
    with pytest.raises(KernelOptError, match=message):
        apply_opts(kernel_of(a @ b), opts, Device["PYTHON"].renderer.target)
    with pytest.raises(KernelOptError, match="the device has no threads"):
        apply_opts(kernel_of(a @ b), (Opt(T, 2, 4),))


def test_a_tile_needs_the_shared_memory_it_stages_into():
    from lazygrad.codegen.renderer import Target

    a, _ = realized(64, 64)
    kernel, opts = kernel_of(a @ a), (Opt(L, 0, 8), Opt(L, 2, 8), Opt(T, 4, 16))
    small = Target(vector_width=1, max_threads=64, block_threads=64, shared_memory=1000)
    with pytest.raises(KernelOptError, match="the staged inputs need 1024 bytes of the device's 1000"):
        apply_opts(kernel, opts, small)
    with pytest.raises(KernelOptError, match="each thread would copy 32 elements of an input, over 16"):
        apply_opts(kernel, (Opt(L, 1, 2), Opt(T, 3, 32)), small)  # (2 threads, 64 elements)
    staged = apply_opts(kernel, opts, Target(vector_width=1, max_threads=64, block_threads=64, shared_memory=1 << 13))
    shared = sorted(node.arg[1] for node in staged.toposort if node.op is Ops.DEFINE_LOCAL)
    assert shared == [8 * 16, 8 * 16]  # each input's 8 rows (or columns) by 16 reduce iterations
    assert sum(node.op is Ops.BARRIER for node in staged.toposort) == 1  # (the linearizer adds the second)


def test_the_fastest_threads_read_a_tile_across_memory_banks():
    """x @ wᵀ reads w along the reduce: staged with the reduce innermost (neighbouring threads copy neighbouring
    memory), each thread's row of it padded by one element, so neighbouring threads read different banks."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    x_data, w_data = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((32, 64)).astype(np.float32)
    x, w = Tensor(x_data, device="PYTHON").realize(), Tensor(w_data, device="PYTHON").realize()
    opts = (Opt(L, 0, 8), Opt(L, 2, 8), Opt(T, 4, 16))
    staged = apply_opts(kernel_of(x @ w.T), opts, CUDARenderer.target)
    assert sorted(node.arg[1] for node in staged.toposort if node.op is Ops.DEFINE_LOCAL) == [8 * 16, 8 * 17]
    np.testing.assert_allclose(run_with(x @ w.T, opts), x_data @ w_data.T, rtol=1e-4, atol=1e-4)


def test_vectorize_takes_one_loop_of_a_kernel_on_a_device_with_vector_types():
    """On a device with threads whose renderer computes in vector types (OpenCL on a CPU), VECTORIZE makes an output
    loop a VECTOR loop inside each thread, or a reduce loop a VECTOR_REDUCE one: one per kernel, which no later
    action takes, and whose threads share no memory. Elsewhere only a reduce loop may be vectorized."""
    from lazygrad.codegen.renderer import Target
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    opencl_cpu = Target(vector_width=8, max_threads=256, block_threads=64, shared_memory=1 << 15)
    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    kernel = kernel_of(a @ b)
    kinds = lambda sink: {axis: loop.arg[1] for axis, loop in loops_by_axis(sink).items()}  # noqa: E731
    assert kinds(apply_opts(kernel, (Opt(V, 1),), opencl_cpu))[1] is LoopKind.VECTOR
    assert kinds(apply_opts(kernel, (Opt(P, 1), Opt(V, 1)), opencl_cpu))[1] is LoopKind.VECTOR
    assert kinds(apply_opts(kernel, (Opt(V, 2),), opencl_cpu))[2] is LoopKind.VECTOR_REDUCE
    refused = [
        ((Opt(V, 1), Opt(V, 2)), "the kernel's second vector loop"),
        ((Opt(V, 1), Opt(U, 1, 4)), "computed in vector lanes"),
        ((Opt(V, 1), Opt(S, 1, 4)), "computed in vector lanes"),
        ((Opt(V, 1), Opt(G, 2, 4)), "threads that share memory do not"),
        ((Opt(G, 2, 4), Opt(V, 1)), "share memory already"),
    ]
    for opts, message in refused:
        with pytest.raises(KernelOptError, match=message):
            apply_opts(kernel, opts, opencl_cpu)
    apply_opts(kernel, (Opt(V, 1), Opt(L, 0, 8)), opencl_cpu)  # (threads that share no memory: fine)
    with pytest.raises(KernelOptError, match="only on a device with threads whose renderer has them"):
        apply_opts(kernel, (Opt(V, 1),), CUDARenderer.target)  # (vector width 1: scalars)
    # the heuristic vectorizes the loop it cuts as wide as the vectors, or a row's reduce where nothing is cut
    assert Opt(V, 2) in heuristic_opts(kernel_of(a @ b), opencl_cpu)
    rows, _ = realized(6, 16)  # (6 rows: no vector of 4 or more divides them)
    assert Opt(V, 1) in heuristic_opts(kernel_of(rows.sum(axis=1)), opencl_cpu)
    assert not any(opt.op is V for opt in heuristic_opts(kernel_of(a @ b), CUDARenderer.target))
    # BEAM times the list without vector types too
    offered = candidate_opts(kernel_of(a @ b), opencl_cpu)
    assert any(Opt(V, 2) in opts for opts in offered) and any(all(o.op is not V for o in opts) for opts in offered)


def test_the_thread_heuristic_tiles_matrix_products_on_gpus():
    from lazygrad.codegen.renderer import Target
    from lazygrad.codegen.renderer.cstyle import CUDARenderer

    cuda, opencl_cpu = CUDARenderer.target, Target(vector_width=8, max_threads=256, block_threads=64)
    a, _ = realized(64, 64)
    b, _ = realized(64, 64)
    # 16 by 16 threads, 4 by 4 outputs each, the inputs staged 16 reduce iterations at a time, where that leaves
    # BUSY_BLOCKS blocks (1024 × 1024 outputs: 256 of them); fewer outputs to a thread where it would not (256 × 512:
    # 2 by 2 each, 128 blocks; 64 × 64: one each, 16 blocks, rather than one block of 4 by 4)
    for rows, columns, registers in ((1024, 1024, 4), (256, 512, 2)):
        x, _ = realized(rows, 64)
        y, _ = realized(64, columns)
        expected = (Opt(L, 0, 16), Opt(L, 2, 16), Opt(U, 0, registers), Opt(U, 2, registers), Opt(T, 4, 16))
        assert heuristic_opts(kernel_of(x @ y), cuda) == expected, (rows, columns)
    tiled = (Opt(L, 0, 16), Opt(L, 2, 16), Opt(T, 4, 16))
    assert heuristic_opts(kernel_of(a @ b), cuda) == tiled
    assert not any(opt.op is T for opt in heuristic_opts(kernel_of(a @ b), opencl_cpu))  # vectors there instead
    assert tiled in candidate_opts(kernel_of(a @ b), cuda)
    assert thread_opts(kernel_of(a @ b), cuda, tiles=False) in candidate_opts(kernel_of(a @ b), cuda)
    # a batch of products: the batch is a loop of blocks
    batch, _ = realized(3, 32, 16)
    assert heuristic_opts(kernel_of(batch @ batch.transpose(1, 2)), cuda)[-1] == Opt(T, 5, 8)
    # no tile where the threads do not divide the outputs, or a loop reuses no input (an elementwise kernel)
    odd, _ = realized(33, 64)
    assert not any(opt.op is T for opt in heuristic_opts(kernel_of(odd @ b), cuda))
    assert not any(opt.op is T for opt in heuristic_opts(kernel_of(a + b), cuda))


@pytest.mark.parametrize(
    "product",
    ["matmul", "batched", "linear", "conv2d"],
)
def test_products_through_the_default_heuristic(threaded, product):
    """What the heuristic gives each device (tiles on a GPU, and on PYTHON, which runs the GPUs' programs)."""
    shapes = {"matmul": [(32, 48), (48, 16)], "batched": [(2, 16, 24), (2, 24, 8)], "linear": [(16, 32), (8, 32)]}
    shapes["conv2d"] = [(2, 4, 6, 6), (8, 4, 3, 3)]
    data = [rng.standard_normal(shape).astype(np.float32) for shape in shapes[product]]
    x, y = (Tensor(value, device=threaded) for value in data)
    if product == "conv2d":
        windows = np.lib.stride_tricks.sliding_window_view(data[0], (3, 3), axis=(2, 3))  # (n, c, h, w, kh, kw)
        expected, result = np.einsum("nchwij,ocij->nohw", windows, data[1]), x.conv2d(y, padding=0)
    else:
        expected, result = (data[0] @ data[1].T, x @ y.T) if product == "linear" else (data[0] @ data[1], x @ y)
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "int32"])
def test_tiled_products_of_narrow_dtypes(threaded, dtype):
    """Staged inputs of narrow types: products of small integers are exact."""
    from lazygrad import dtypes

    data = [rng.integers(-1, 2, shape).astype(np.float32) for shape in ((32, 16), (16, 32))]
    x, y = (Tensor(value, device=threaded).cast(getattr(dtypes, dtype)).realize() for value in data)
    np.testing.assert_array_equal((x @ y).cast(dtypes.float32).numpy(), data[0] @ data[1])


def test_tiles_of_a_convolution_and_of_a_padded_input(threaded):
    """A tile over the channels of a convolution also stages the taps' loops inside it; a padded input stays a
    gated load in the copy (zero outside), also in the last copy, which only the threads with an element make."""
    x_data, w_data = rng.standard_normal((2, 4, 6, 6)).astype(np.float32), rng.standard_normal((8, 4, 3, 3))
    x, w = Tensor(x_data, device=threaded).realize(), Tensor(w_data.astype(np.float32), device=threaded).realize()
    windows = np.lib.stride_tricks.sliding_window_view(x_data, (3, 3), axis=(2, 3))
    expected = np.einsum("nchwij,ocij->nohw", windows, w_data)
    for opts in [(Opt(L, 3, 4), Opt(L, 1, 4), Opt(T, 5, 2)), (Opt(L, 3, 4), Opt(L, 1, 8), Opt(T, 4, 2))]:
        np.testing.assert_allclose(run_with(x.conv2d(w), opts), expected, rtol=1e-4, atol=1e-4)
    a_data, b_data = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((12, 16)).astype(np.float32)
    a, b = Tensor(a_data, device=threaded).realize(), Tensor(b_data, device=threaded).realize()
    expected = np.pad(a_data, ((0, 0), (2, 2))) @ b_data
    for opts in [(Opt(L, 0, 4), Opt(L, 2, 4), Opt(U, 0, 2), Opt(T, 4, 4)), (Opt(L, 0, 4), Opt(L, 2, 8), Opt(T, 4, 6))]:
        np.testing.assert_allclose(run_with(a.pad(((0, 0), (2, 2))) @ b, opts), expected, rtol=1e-4, atol=1e-4)


# ---- copies onto the stack (PACK): the host devices -----------------------------------------------------------------

K = OptOp.PACK


@pytest.fixture(params=["LLVM", "CPU"])
def host(request) -> str:
    return available(request.param)


def on(device: str, *arrays: np.ndarray) -> list[Tensor]:
    return [Tensor(array, device=device).realize() for array in arrays]


@pytest.mark.parametrize(
    "opts",
    [
        (Opt(K, 0),),  # the weights copied once per output column, read by every row
        (Opt(K, 1),),  # the rows copied once per row, read by every column
        (Opt(U, 1, 8), Opt(U, 0, 4), Opt(K, 0)),  # the register block's 8 columns side by side in the copy
        (Opt(U, 1, 16), Opt(U, 0, 2), Opt(R, 2, 3), Opt(K, 0)),
        (Opt(S, 2, 4), Opt(U, 1, 4), Opt(K, 0)),  # a reduce over two loops
    ],
    ids=str,
)
def test_pack_keeps_the_product(host, opts):
    x, y = rng.standard_normal((24, 12)).astype(np.float32), rng.standard_normal((12, 32)).astype(np.float32)
    a, b = on(host, x, y)
    np.testing.assert_allclose(run_with(a @ b, opts), x @ y, rtol=1e-5, atol=1e-5)


def test_pack_of_batched_padded_and_float64_products(host):
    from lazygrad import dtypes

    x, y, z = (rng.standard_normal(shape).astype(np.float32) for shape in ((3, 8, 12), (12, 16), (3, 12, 16)))
    a, b, c = on(host, x, y, z)
    # weights shared by the batch: copied once per column block, before the batch's loop or inside it
    for opts in [(Opt(K, 1),), (Opt(K, 0),), (Opt(U, 2, 8), Opt(U, 1, 4), Opt(K, 1))]:
        np.testing.assert_allclose(run_with(a @ b, opts), x @ y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_with(a @ c, (Opt(K, 1),)), x @ z, rtol=1e-5, atol=1e-5)  # a copy per batch
    # a padded input stays a gated load in the copy (zero outside)
    expected = x[0] @ np.pad(y, ((0, 0), (2, 2)))
    np.testing.assert_allclose(run_with(a[0] @ b.pad(((0, 0), (2, 2))), (Opt(K, 0),)), expected, rtol=1e-5, atol=1e-5)
    # a reduce over two loops (a weight gradient's batch and time): both copied
    g = rng.standard_normal((3, 8, 5)).astype(np.float32)
    (d,) = on(host, g)
    gradient = (a[:, :, :, None] * d[:, :, None, :]).sum((0, 1))
    np.testing.assert_allclose(run_with(gradient, (Opt(K, 0),)), np.einsum("btk,btj->kj", x, g), rtol=1e-5, atol=1e-5)
    u, v = on(host, x[0].astype(np.float64), y.astype(np.float64))
    assert u.dtype == dtypes.float64
    np.testing.assert_allclose(run_with(u @ v, (Opt(U, 1, 4), Opt(K, 0))), x[0].astype(np.float64) @ y, rtol=1e-12)


def test_the_copy_runs_between_the_output_loops():
    a, _ = realized(16, 12)
    b, _ = realized(12, 32)
    kernel = apply_opts(kernel_of(a @ b), (Opt(U, 1, 8), Opt(K, 0)), Device["LLVM"].renderer.target)
    kinds = [node.arg[1] for node in linearize(kernel) if node.op is Ops.RANGE]
    # the column blocks, the copy of their weights (over the reduce), the rows, the reduce
    assert kinds == [LoopKind.GLOBAL, LoopKind.PACK, LoopKind.GLOBAL, LoopKind.REDUCE]
    assert [loop.src[0].arg for loop in output_loops_of(kernel)] == [4, 16]


def output_loops_of(kernel):
    from lazygrad.codegen.opt import output_loops

    return output_loops(kernel)


def test_a_pack_that_does_not_fit_is_an_error():
    from lazygrad.codegen.renderer import Target

    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    cpu = Target(pack_bytes=1 << 16)
    with pytest.raises(KernelOptError, match="no stack buffers"):
        apply_opts(kernel_of(a @ b), (Opt(K, 0),), Device["PYTHON"].renderer.target)
    with pytest.raises(KernelOptError, match="is a reduce loop, not an output loop"):
        apply_opts(kernel_of(a @ b), (Opt(K, 2),), cpu)
    with pytest.raises(KernelOptError, match="has no reduce"):
        apply_opts(kernel_of(a + 1), (Opt(K, 0),), cpu)
    with pytest.raises(KernelOptError, match="no input of the reduce reads the same memory all along loop 0"):
        apply_opts(kernel_of((a * a).sum(1)), (Opt(K, 0),), cpu)
    with pytest.raises(KernelOptError, match="would take 768 bytes of the stack, over 512"):
        apply_opts(kernel_of(a @ b), (Opt(U, 1, 16), Opt(K, 0)), Target(pack_bytes=512))  # 16 columns of 12
    with pytest.raises(KernelOptError, match="takes no amount"):
        apply_opts(kernel_of(a @ b), (Opt(K, 0, 2),), cpu)
    with pytest.raises(KernelOptError, match="copies inputs onto the stack"):
        apply_opts(kernel_of(a @ b), (Opt(K, 0), Opt(U, 0, 2)), cpu)


def test_the_heuristic_packs_the_weights_of_large_products_on_cpus(host):
    from lazygrad.codegen.renderer import Target

    avx2 = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    a, y = realized(512, 512)
    assert heuristic_opts(kernel_of(a @ a), avx2) == (Opt(U, 1, 16), Opt(U, 0, 4), Opt(K, 0))
    assert heuristic_opts(kernel_of(a @ a), Target(vector_width=8, vector_registers=16)) == (
        Opt(U, 1, 16),
        Opt(U, 0, 4),
    )
    # x @ wᵀ copies blocks of wᵀ in the same way, each step a vector of a block's columns (its rows read w along
    # the reduce, a vector of products per output); 16 rows are too few for that copy, and one block of x @ w
    assert heuristic_opts(kernel_of(a @ a.T), avx2) == (Opt(U, 1, 16), Opt(U, 0, 4), Opt(K, 0))
    b, x = realized(16, 512)
    assert OptOp.PACK not in {opt.op for opt in heuristic_opts(kernel_of(b @ a), avx2)}
    assert OptOp.PACK not in {opt.op for opt in heuristic_opts(kernel_of(b @ a.T), avx2)}
    (h,) = on(host, y)
    np.testing.assert_allclose(
        run_with(h @ h.T, (Opt(U, 1, 16), Opt(U, 0, 4), Opt(K, 0))), y @ y.T, rtol=1e-4, atol=1e-4
    )
    # weights too large for the stack are read in place (16 columns of 8192: 512 KiB)
    c, _ = realized(64, 8192)
    w, _ = realized(8192, 64)
    # (the rows still go innermost, so the weights' column block is read again from the cache by each of them)
    assert heuristic_opts(kernel_of(c @ w), avx2)[-1] == Opt(OptOp.INNER, 0)
    # and BEAM times lists with and without the copy
    assert {OptOp.PACK in {opt.op for opt in opts} for opts in candidate_opts(kernel_of(a @ a), avx2)} == {True, False}


def test_inner_moves_an_output_loop_innermost(host):
    x, y = rng.standard_normal((24, 12)).astype(np.float32), rng.standard_normal((12, 32)).astype(np.float32)
    a, b = on(host, x, y)
    kernel = apply_opts(kernel_of(a @ b), (Opt(U, 1, 8), Opt(OptOp.INNER, 0)), Device[host].renderer.target)
    # the column blocks outside, the rows inside them
    assert [loop.src[0].arg for loop in output_loops_of(kernel)] == [4, 24]
    for opts in [(Opt(OptOp.INNER, 0),), (Opt(U, 1, 8), Opt(U, 0, 4), Opt(OptOp.INNER, 0))]:
        np.testing.assert_allclose(run_with(a @ b, opts), x @ y, rtol=1e-5, atol=1e-5)
    with pytest.raises(KernelOptError, match="INNER takes an output loop and no amount"):
        apply_opts(kernel_of(a @ b), (Opt(OptOp.INNER, 2),), Device[host].renderer.target)


def test_the_heuristic_reads_transposed_rows_a_cache_line_at_a_time_where_they_share_cache_sets():
    from lazygrad.codegen.renderer import Target

    avx2 = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    # rows 1 KiB apart and more (256 floats, 128 doubles): the outer loop upcast by a line's elements
    a, x = realized(512, 256)
    assert heuristic_opts(kernel_of(a.T + 1), avx2) == (Opt(U, 0, 16),)
    assert heuristic_opts(kernel_of(Tensor(x.astype(np.float64)).realize().T * 2), avx2) == (Opt(U, 0, 8),)
    np.testing.assert_array_equal((a.T + 1).numpy(), x.T + 1)
    # a permute moving the last axis first reads it rows apart, and the merged rest in order
    b, y = realized(2, 16, 8, 32)
    assert heuristic_opts(kernel_of(b.permute(0, 2, 3, 1) * 1), avx2) == (Opt(M, 1), Opt(U, 1, 16))
    np.testing.assert_array_equal(b.permute(0, 2, 3, 1).numpy(), y.transpose(0, 2, 3, 1))
    # rows that spread over the cache sets (1000 floats apart), reads in order, and a reduce: unchanged
    c, _ = realized(500, 1000)
    assert heuristic_opts(kernel_of(c.T + 1), avx2) == ()
    assert heuristic_opts(kernel_of(a + 1), avx2) == (Opt(M, 0),)


def test_the_heuristic_takes_a_row_of_up_to_four_vectors_whole_in_blocks_of_two_rows_at_least():
    from lazygrad.codegen.renderer import Target

    torch = pytest.importorskip("torch")
    avx512 = Target(vector_width=16, vector_registers=32, pack_bytes=1 << 18)
    avx2 = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    w, weights = realized(8, 8, 3, 3)
    for side, target, rows in ((56, avx512, 2), (28, avx2, 2), (28, avx512, 4)):
        x, _ = realized(2, 8, side, side)
        kernel = prepare(lower_kernel(x.conv2d(w, padding=1).schedule()[-1].ast))  # (after the padded copy)
        assert heuristic_opts(kernel, target)[:2] == (Opt(U, 3, side), Opt(U, 2, rows))
    # a row past 4 vectors: its largest part of at most two vectors (the image's rows are not padded: its loads
    # along them, gated, would be no vector loads)
    for side, first in ((72, Opt(U, 3, 24)), (65, Opt(U, 3, 13))):
        x, image = realized(2, 8, side, side)
        assert heuristic_opts(prepare(lower_kernel(x.conv2d(w, padding=1).schedule()[-1].ast)), avx512)[0] == first
        expected = torch.nn.functional.conv2d(torch.tensor(image), torch.tensor(weights), padding=1).numpy()
        np.testing.assert_allclose(x.conv2d(w, padding=1).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_one_output_loop_takes_every_accumulator_across_it():
    """A vector times a matrix (or a column sum) has no rows to share its loads with: its block is 8 vectors of outputs
    (the FMA chains), not 2 vectors by rows that do not exist (the multiply-adds waited on each other)."""
    from lazygrad.codegen.renderer import Target

    avx512 = Target(vector_width=16, vector_registers=32, pack_bytes=1 << 18)
    avx2 = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    v, vector = realized(1, 512)
    m, matrix = realized(512, 1024)
    for target, width in ((avx512, 128), (avx2, 64)):
        assert heuristic_opts(kernel_of(v @ m), target) == (Opt(U, 0, width),)
        assert heuristic_opts(kernel_of(m.sum(0)), target) == (Opt(U, 0, width),)
    np.testing.assert_allclose((v @ m).numpy(), vector @ matrix, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m.sum(0).numpy(), matrix.sum(0), rtol=1e-4, atol=1e-4)


# ---- values kept on the stack (STASH): the host devices -------------------------------------------------------------

H = OptOp.STASH


@pytest.mark.parametrize("opts", [(Opt(H, 3),), (Opt(V, 2), Opt(V, 3), Opt(H, 3)), (Opt(H, 2),)], ids=str)
def test_stash_keeps_a_softmax(host, opts):
    # the sum's exponentials kept for the outputs (or, pointless but right, the max's inputs)
    x = rng.standard_normal((16, 40)).astype(np.float32)
    (a,) = on(host, x)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(run_with(a.softmax(-1), opts), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_the_heuristic_stashes_costly_values_on_cpus():
    from lazygrad.codegen.renderer import Target

    avx2 = Target(vector_width=8, vector_registers=16, pack_bytes=1 << 18)
    a, x = realized(16, 40)
    assert heuristic_opts(kernel_of(a.softmax(-1)), avx2) == (Opt(V, 2), Opt(V, 3), Opt(H, 3))
    assert OptOp.STASH not in {opt.op for opt in heuristic_opts(kernel_of(a.softmax(-1)), Target())}
    # a log-softmax's outputs do not compute the exponentials again
    assert OptOp.STASH not in {opt.op for opt in heuristic_opts(kernel_of(a.log_softmax(-1)), avx2)}
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(a.softmax(-1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_stash_that_does_not_fit_is_an_error():
    from lazygrad.codegen.renderer import Target

    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    cpu = Target(pack_bytes=1 << 16)
    softmax = kernel_of(a.softmax(-1))
    with pytest.raises(KernelOptError, match="no stack buffers"):
        apply_opts(softmax, (Opt(H, 3),), Device["PYTHON"].renderer.target)
    with pytest.raises(KernelOptError, match="is a global loop, not a reduce loop"):
        apply_opts(softmax, (Opt(H, 1),), cpu)
    with pytest.raises(KernelOptError, match="no output computes the reduce's values again along a loop of 12"):
        apply_opts(kernel_of(a @ b), (Opt(H, 2),), cpu)
    with pytest.raises(KernelOptError, match="one reduce over loop 1 alone"):
        apply_opts(kernel_of(a.sum()), (Opt(H, 1),), cpu)
    with pytest.raises(KernelOptError, match="would take 48 bytes of the stack"):
        apply_opts(softmax, (Opt(H, 3),), Target(pack_bytes=32))


def test_the_quick_division_test_of_a_merge_agrees_with_the_whole_rewrite():
    x, _ = realized(2, 4, 6, 6)
    kernels = [
        kernel_of(x.pad(((0, 0), (0, 0), (1, 1), (1, 1)))[:, :, ::2, 1::2].relu().contiguous()),
        kernel_of(x.reshape(2, 4, 36).permute(0, 2, 1).contiguous()),
        kernel_of(x.permute(0, 2, 1, 3) + 1),
        kernel_of((x[:, :, ::2, ::2] * 2).contiguous()),
    ]
    verdicts = []
    for kernel in kernels:
        loops = output_loops(kernel)
        for outer, inner in zip(loops, loops[1:]):
            size = inner.src[0].arg
            merged = UOp(Ops.RANGE, outer.dtype, (UOp.const(outer.dtype, outer.src[0].arg * size),), outer.arg)
            replacements = {outer: merged // size, inner: merged % size}
            whole = count_divmod(replace_ranges(kernel, replacements, {})) > count_divmod(kernel)
            assert adds_divisions(kernel, replacements) == whole
            verdicts.append(whole)
    assert True in verdicts and False in verdicts  # both answers were checked


# ---- loops run to a multiple (PAD) -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opts",
    [
        (Opt(D, 0, 4), Opt(U, 0, 4)),  # 127 rows as 128, 4 at a time
        (Opt(D, 1, 8), Opt(U, 1, 8)),  # 65 columns as 72: a part of a vector past the end
        (Opt(D, 1, 16), Opt(U, 1, 16), Opt(D, 0, 4), Opt(U, 0, 4), Opt(K, 0)),  # both, the weights copied
        (Opt(D, 0, 2),),  # padded, not upcast
    ],
    ids=str,
)
def test_pad_keeps_the_product_and_writes_nothing_past_it(host, opts):
    x, y = rng.standard_normal((127, 33)).astype(np.float32), rng.standard_normal((33, 65)).astype(np.float32)
    a, b = on(host, x, y)
    np.testing.assert_allclose(run_with(a @ b, opts), x @ y, rtol=1e-5, atol=1e-5)
    # the stores of the iterations past the end are made only where they are inside it
    from lazygrad.codegen.renderer import kernel_name
    from lazygrad.codegen.renderer.llvmir import LLVMRenderer

    program = linearize(apply_opts(kernel_of(a @ b), opts, Device[host].renderer.target))
    source = LLVMRenderer().render(kernel_name(program), program)
    assert "_store:" in source and "_join:" in source


def test_a_pad_that_does_not_fit_is_an_error():
    a, _ = realized(8, 12)
    b, _ = realized(12, 16)
    with pytest.raises(KernelOptError, match="PAD"):
        apply_opts(kernel_of(a @ b), (Opt(D, 0, 4),))  # 4 divides 8 already
    with pytest.raises(KernelOptError, match="PAD"):
        apply_opts(kernel_of(a.sum(1)), (Opt(D, 1, 6),))  # 6 divides the reduce loop's 12 already


def test_the_heuristic_pads_loops_a_block_nearly_divides():
    from lazygrad.codegen.renderer import Target

    avx512 = Target(vector_width=16, vector_registers=32, pack_bytes=1 << 18)
    # a product's rows (each row's input read one value at a time): 197 tokens as 200, 4 rows at a time
    # (5.4 -> 1.6 ms for 197 x 768 @ 768 x 2304), and 127 rows as 133 beside a row of 255 in parts of 17
    for rows, columns, block in (
        (197, 256, (Opt(U, 1, 32), Opt(D, 0, 4), Opt(U, 0, 4))),
        (127, 255, (Opt(U, 1, 17), Opt(D, 0, 7), Opt(U, 0, 7))),
    ):
        a, x = realized(rows, 96)
        b, y = realized(96, columns)
        assert heuristic_opts(kernel_of(a @ b), avx512)[:3] == block
        np.testing.assert_allclose((a @ b).numpy(), x @ y, rtol=1e-4, atol=1e-4)
    # padding that would add more than an eighth (6 rows as 8) is not done, nor that of rows read as vectors (x @ wᵀ
    # with a vector of products per output reads each row along the reduce; with wᵀ copied, it reads them one value
    # at a time, as x @ w does)
    c, _ = realized(6, 64)
    d, _ = realized(64, 70)
    assert OptOp.PAD not in {opt.op for opt in heuristic_opts(kernel_of(c @ d), avx512)}
    e, _ = realized(197, 64)
    f, _ = realized(256, 64)
    assert OptOp.PAD not in {opt.op for opt in heuristic_opts(kernel_of(e @ f.T), avx512, pack=False)}
    assert heuristic_opts(kernel_of(e @ f.T), avx512)[1:3] == (Opt(D, 0, 4), Opt(U, 0, 4))


@pytest.mark.parametrize("columns", [97, 509, 998])
def test_a_row_without_a_vector_wide_part_is_padded_to_the_block(columns, host):
    """A row of outputs whose largest part of at most two vectors is under half a vector (a prime width, 998 in
    parts of 2) runs in blocks of whole vectors, padded: it ran one output at a time, or nearly (a 997³ product at
    2.7 GFLOP/s). A row with a larger part (1000 in parts of 25, 65 in parts of 13) and a short row (taken whole)
    are not padded."""
    from lazygrad.codegen.renderer import Target

    avx512 = Target(vector_width=16, vector_registers=32, pack_bytes=1 << 18)
    a, x = realized(64, 40)
    b, y = realized(40, columns)
    opts = heuristic_opts(kernel_of(a @ b), avx512)
    width = opts[0].amount  # (two vectors where that pads at most an eighth more: 509 as 512)
    assert opts[:2] == (Opt(D, 1, width), Opt(U, 1, width)) and width in (16, 32) and Opt(K, 0) in opts
    on_host = on(host, x, y)
    np.testing.assert_allclose(run_with(on_host[0] @ on_host[1], opts), x @ y, rtol=1e-4, atol=1e-4)
    for unpadded in (1000, 65, 61):
        c, _ = realized(40, unpadded)
        assert OptOp.PAD not in {opt.op for opt in heuristic_opts(kernel_of(a @ c), avx512)}


# ---- SCATTER: a lookup's gradient ----------------------------------------------------------------------------------

SC = OptOp.SCATTER


def selected_sum(device: str = "LLVM", rows: int = 9, columns: int = 8) -> tuple[Tensor, np.ndarray]:
    """A lookup's gradient in the form SCATTER takes, Σ_t where(a_t == row and keep_t, value_t, 0), as one kernel of
    output loops (row 0, column 1) and reduce loop 2; and NumPy's. Some a_t lie outside the table, repeat or are
    not kept, and the steps not kept hold NaN and inf."""
    a = np.array([3, -1, 7, 3, rows, 0, 3, 2**31 - 1, 5, 7, 8, 3], np.int32)
    keep = np.array([1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1], bool)
    values = rng.standard_normal((len(a), columns)).astype(np.float32)
    values[~keep] = [np.nan, np.inf] * (columns // 2)
    chosen = (Tensor(a, device=device).reshape(-1, 1) == Tensor.arange(rows, device=device)) & Tensor(
        keep, device=device
    ).reshape(-1, 1)
    value = Tensor(values, device=device).realize()
    total = chosen.unsqueeze(-1).where(value.unsqueeze(1), 0).sum(0)
    expected = np.zeros((rows, columns), np.float32)
    inside = keep & (a >= 0) & (a < rows)
    np.add.at(expected, a[inside], values[inside])
    return total, expected


@pytest.mark.parametrize("opts", [(Opt(SC, 0),), (Opt(SC, 0), Opt(U, 1, 4)), (Opt(SC, 0), Opt(U, 1, 8))], ids=str)
@pytest.mark.parametrize("device", ["LLVM", "CPU", "PYTHON"])
def test_a_scatter_keeps_the_selected_sum(device, opts):
    total, expected = selected_sum(available(device))
    np.testing.assert_allclose(run_with(total, opts), expected, rtol=1e-6)


@pytest.mark.parametrize("opts", [(Opt(SC, 0), Opt(L, 1, 4)), (Opt(SC, 0), Opt(U, 1, 2), Opt(L, 1, 4))], ids=str)
def test_a_scatter_on_threads_keeps_the_selected_sum(threaded, opts):
    total, expected = selected_sum(threaded)
    np.testing.assert_allclose(run_with(total, opts), expected, rtol=1e-6)


def test_a_scatter_zeroes_its_rows_then_adds_each_step_in_turn():
    total, _ = selected_sum()
    kernel = apply_opts(kernel_of(total), (Opt(SC, 0),))
    assert not any(node.op is Ops.RANGE_REDUCE for node in kernel.toposort)
    zeros, steps = kernel.src
    assert zeros.src[2].op is Ops.CONST and zeros.src[2].arg == 0
    assert steps.src[2].src[0].op is Ops.LOAD and steps.src[2].src[0].src[0] is steps.src[0]  # (an add in place)
    program = linearize(kernel)
    loops = [(node.src[0].arg, node.arg[1]) for node in program if node.op is Ops.RANGE]
    assert loops == [(8, LoopKind.GLOBAL), (9, LoopKind.SCATTER), (12, LoopKind.SCATTER)]


def test_a_scatter_that_does_not_fit_is_an_error():
    total, _ = selected_sum()
    with pytest.raises(KernelOptError, match="of one output"):
        apply_opts(kernel_of(total), (Opt(U, 1, 2), Opt(SC, 0)))
    table = Tensor(rng.standard_normal((5, 3)).astype(np.float32)).realize()
    a = Tensor(np.array([1, 4, 1], np.int32)).realize()
    chosen = a.reshape(-1, 1) == Tensor.arange(5)
    times_row = chosen.unsqueeze(-1).where(table[:3].unsqueeze(1) * Tensor.arange(5).reshape(1, 5, 1), 0).sum(0)
    with pytest.raises(KernelOptError, match="depend on loop 0 beyond its selection"):
        apply_opts(kernel_of(times_row), (Opt(SC, 0),))
    steps = Tensor(rng.standard_normal((3, 2, 1)).astype(np.float32)).realize()
    twice = (a.reshape(3, 1, 1) == Tensor.arange(5)).where(steps, 0).sum((0, 1))  # (a_t the same for both s)
    with pytest.raises(KernelOptError, match="does not move along every loop"):
        apply_opts(kernel_of(twice), (Opt(SC, 0),))


def test_the_heuristic_scatters_a_lookup_gradient_in_vectors_of_columns():
    target = Device["LLVM"].renderer.target
    weight = Tensor(rng.standard_normal((5000, 16)).astype(np.float32), requires_grad=True)
    tokens = Tensor(rng.integers(0, 5000, (2, 32)).astype(np.int32))
    upstream = Tensor(rng.standard_normal((2, 32, 16)).astype(np.float32)).realize()
    (weight[tokens] * upstream).sum().backward()
    assert heuristic_opts(kernel_of(weight.grad), target) == (Opt(SC, 0), Opt(U, 1, target.vector_width))


def test_a_scatter_of_values_cast_for_the_sum():
    """Counts summed in a wider type than the selected values (an int32 one-hot summed as int64, half values as
    float32): the casts around the selection move onto the values."""
    labels = np.arange(500) * 7 % 100
    hit = Tensor(labels).reshape(-1, 1) == Tensor.arange(100).reshape(1, -1)
    expected = np.bincount(labels, minlength=100)
    counts = hit.where(1, 0).sum(0)
    assert heuristic_opts(kernel_of(counts), Device["LLVM"].renderer.target)[0] == Opt(SC, 0)
    np.testing.assert_array_equal(counts.numpy(), expected)
    halves = hit.where(Tensor.ones(500, 1, dtype=dtypes.float16), 0).sum(0, dtype=dtypes.float32)
    np.testing.assert_array_equal(halves.numpy(), expected)


def test_index_add_into_zeros_is_a_scatter():
    """index_add adds into self after the sum; into zeros, that is the sum plus 0, which the scatter takes as the sum
    (it starts from +0.0 too)."""
    source = Tensor(rng.standard_normal((64, 16)).astype(np.float32)).realize()
    rows = rng.integers(0, 4000, 64)
    added = Tensor.zeros(4000, 16).index_add(0, Tensor(rows), source)
    assert heuristic_opts(kernel_of(added), Device["LLVM"].renderer.target)[0] == Opt(SC, 0)
    expected = np.zeros((4000, 16), np.float32)
    np.add.at(expected, rows, source.numpy())
    np.testing.assert_allclose(added.numpy(), expected, rtol=1e-6)


def test_a_count_is_a_scatter():
    """bincount's counts (a sum of the comparisons cast to ints) scatter too: 100,000 values into 50,000 bins."""
    values = rng.integers(0, 50000, 100000)
    counts = Tensor(values).bincount(minlength=50000)
    assert heuristic_opts(kernel_of(counts), Device["LLVM"].renderer.target)[0] == Opt(SC, 0)
    np.testing.assert_array_equal(counts.numpy(), np.bincount(values, minlength=50000))


def test_summed_products_over_loops_of_one_size_are_one_reduce(host):
    """`x @ a + h @ b` (an LSTM's gates) is one sum over the shared length, blocked in registers as one product is
    (two reduces in one kernel were left unblocked: a few GFLOP/s)."""
    from lazygrad.codegen.renderer import Target

    values = [rng.standard_normal(shape).astype(np.float32) for shape in ((32, 24), (24, 48), (32, 24), (24, 48))]
    x, a, h, b = on(host, *values)
    gates = x @ a + h @ b + 1.0
    kernel = kernel_of(gates)
    assert sum(node.op is Ops.RANGE_REDUCE for node in kernel.toposort) == 1
    assert OptOp.UPCAST in {opt.op for opt in heuristic_opts(kernel, Target(vector_width=8, vector_registers=16))}
    expected = values[0] @ values[1] + values[2] @ values[3] + 1.0
    np.testing.assert_allclose(gates.numpy(), expected, rtol=1e-5, atol=1e-5)
    # sums over loops of other sizes stay two
    (g,) = on(host, rng.standard_normal((32, 16)).astype(np.float32))
    assert sum(node.op is Ops.RANGE_REDUCE for node in kernel_of(x @ a + g @ b[:16]).toposort) == 2


# ---- PIECES: each piece of a cat in a loop of its own --------------------------------------------------------------


def test_a_cat_runs_as_pieces_each_reading_only_its_own_input(host):
    """The pieces of a cat along the innermost loop: one ungated load each, in a loop of its own (a piece one wide
    in none), not every piece's load under a condition at every output."""
    widths = (3, 1, 7, 5, 16)
    arrays = [rng.standard_normal((6, width)).astype(np.float32) for width in widths]
    joined = Tensor.cat(*on(host, *arrays), dim=1)
    kernel = kernel_of(joined)
    opts = heuristic_opts(kernel, Device[host].renderer.target)
    assert opts[0] == Opt(OptOp.PIECES, 1)
    program = linearize(apply_opts(kernel, opts[:1]))
    loads = [node for node in program if node.op is Ops.LOAD]
    assert len(loads) == len(widths) and all(len(load.src) == 2 for load in loads)  # (no gate)
    assert sum(node.op is Ops.RANGE and node.arg[1] is LoopKind.SCATTER for node in program) == len(widths) - 1
    np.testing.assert_array_equal(run_with(joined, opts[:1]), np.concatenate(arrays, 1))
    np.testing.assert_array_equal(joined.numpy(), np.concatenate(arrays, 1))


def test_a_stack_and_a_reflect_pad_run_as_pieces(host):
    vectors = [rng.standard_normal(64).astype(np.float32) for _ in range(16)]
    stacked = Tensor.stack(*on(host, *vectors))
    opts = heuristic_opts(kernel_of(stacked), Device[host].renderer.target)
    assert opts[0] == Opt(OptOp.PIECES, 0)
    program = linearize(apply_opts(kernel_of(stacked), opts))
    assert not any(node.op is Ops.RANGE and node.arg[1] is LoopKind.SCATTER for node in program)  # (one wide each)
    np.testing.assert_array_equal(stacked.numpy(), np.stack(vectors))
    (image,) = on(host, rng.standard_normal((2, 3, 9, 11)).astype(np.float32))
    padded = image.pad((3, 2, 2, 3), mode="reflect")
    assert Opt(OptOp.PIECES, 3) in heuristic_opts(kernel_of(padded), Device[host].renderer.target)
    expected = np.pad(image.numpy(), ((0, 0), (0, 0), (2, 3), (3, 2)), mode="reflect")
    np.testing.assert_array_equal(padded.numpy(), expected)


def test_pieces_that_do_not_fit_are_an_error():
    a, _ = realized(16, 6)
    b, _ = realized(16, 2)
    joined = a.cat(b, dim=1)
    with pytest.raises(KernelOptError, match="no condition of the kernel changes along loop 0"):
        apply_opts(kernel_of(joined), (Opt(OptOp.PIECES, 0),))
    with pytest.raises(KernelOptError, match="takes no amount"):
        apply_opts(kernel_of(joined), (Opt(OptOp.PIECES, 1, 2),))
    with pytest.raises(KernelOptError, match="an elementwise kernel"):
        apply_opts(kernel_of(joined.sum(0)), (Opt(OptOp.PIECES, 0),))


def test_reduces_over_loops_of_one_size_share_them():
    """A variance's sums of the deviations and of their squares run in one pass over the inputs (one loop nest), and
    the kernel is blocked in registers as a one-reduce kernel is (std along axis 0 ran a column at a time, at 0.3
    GFLOP/s). A reduce that reads another (a softmax's sum of exponentials after its max) keeps loops of its own."""
    x, data = realized(512, 64)
    std = x.std(0)
    kernel = prepare(lower_kernel(std.schedule()[-1].ast))
    first, second = [node for node in kernel.toposort if node.op is Ops.RANGE_REDUCE]
    assert first.src[1:] == second.src[1:]
    assert OptOp.UPCAST in {opt.op for opt in heuristic_opts(kernel, Device["LLVM"].renderer.target)}
    np.testing.assert_allclose(std.numpy(), data.std(0, ddof=1), rtol=1e-5)
    # sums of one size where some read others' results (a mean, a max): only those that read none share loops
    mixed = x.square().sum(0) * (x - x.mean(0)).abs().sum(0) + x.max(0) * (x - x.max(0)).exp().sum(0)
    expected = np.square(data).sum(0) * np.abs(data - data.mean(0)).sum(0)
    expected += data.max(0) * np.exp(data - data.max(0)).sum(0)
    np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5)
    logits = x.reshape(64, 512).log_softmax(1)
    for item in logits.schedule():
        reduces = [node for node in prepare(lower_kernel(item.ast)).toposort if node.op is Ops.RANGE_REDUCE]
        for reduce in reduces:
            assert all(
                other is reduce or other.src[1:] != reduce.src[1:] for other in reduces if other in reduce.toposort
            )


# ---- action lists extra/fuzz_opts.py found wrong ----------------------------------------------------------------------


def test_actions_on_loops_they_do_not_take_are_clear_errors():
    """Each of these failed deep inside an action (a KeyError or a list's ValueError), or built a program that read
    a copy it never made, instead of saying the action does not fit."""
    a, _ = realized(8, 12)
    b, _ = realized(12, 32)
    python = Device["PYTHON"].renderer.target
    with pytest.raises(KernelOptError, match="MERGE takes an output loop or a loop of a reduce"):
        apply_opts(kernel_of(a @ b), (Opt(L, 1, 4), Opt(M, 2)), python)  # loop 2: the block's threads
    c, _ = realized(16, 4)
    d, _ = realized(16, 6)
    with pytest.raises(KernelOptError, match="is a scatter loop, not a reduce loop"):
        apply_opts(kernel_of(c.cat(d, dim=1)), (Opt(OptOp.PIECES, 1), Opt(G, 2, 2)), python)
    from lazygrad.codegen.renderer import Target

    avx512 = Target(vector_width=16, vector_registers=32, pack_bytes=1 << 18)
    with pytest.raises(KernelOptError, match="output loop 1 would open inside loop 0, after its copies"):
        apply_opts(kernel_of(a @ b), (Opt(P, 1), Opt(K, 0)), avx512)


def test_the_emulator_runs_stores_no_thread_makes_and_shuffles_of_one_value():
    """A store gated off in every thread (the padded lanes of an upcast) once failed the emulator's bounds check on
    an empty index, and a shuffle of a value every thread holds (a NumPy 0-d array) indexed it by thread."""
    data = rng.standard_normal((3, 6)).astype(np.float32)
    (x,) = on(available("PYTHON"), data)
    np.testing.assert_array_equal(run_with(x * 2, (Opt(D, 1, 8), Opt(U, 1, 8))), data * 2)
    e, f = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((1, 3)).astype(np.float32)
    y, z = on("PYTHON", e, f)
    np.testing.assert_allclose(run_with((y - z).max(0), (Opt(D, 0, 8), Opt(U, 0, 4), Opt(G, 1, 2))), (e - f).max(0))


def test_a_gated_store_in_vector_lanes_stores_only_where_its_gate_holds():
    """OpenCL stored every lane of a vector loop padded past its end (PAD, then VECTORIZE), its gate dropped: the
    padded lanes wrote over the next row and past the buffer's end (PoCL's heap was corrupted)."""
    data = rng.standard_normal((6, 5)).astype(np.float32)
    (x,) = on(available("GPU"), data)
    opts = (Opt(D, 1, 8), Opt(V, 1), Opt(L, 0, 2))
    program = linearize(apply_opts(kernel_of(x * 2), opts, Device["GPU"].renderer.target))
    source = Device["GPU"].renderer.render("padded", program)
    stores = [line.strip() for line in source.splitlines() if "data0[" in line]
    assert stores and all(line.startswith("if (") for line in stores), source
    np.testing.assert_array_equal(run_with(x * 2, opts), data * 2)
