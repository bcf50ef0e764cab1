"""Exact kernel counts: a change that adds a kernel fails here; one that removes a kernel updates the number."""

import os

import numpy as np
import pytest

from lazygrad import Device, GlobalCounters, Tensor
from lazygrad.engine.kernel_work import KERNEL_WORK_LIMIT
from lazygrad.uop.ops import Ops, UOp


def kernels(*tensors: Tensor) -> int:
    """How many kernels realizing `tensors` together would run."""
    return len(tensors[0].schedule(*tensors[1:]))


def rand(*shape: int) -> Tensor:
    return Tensor(np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32))


@pytest.fixture
def abc():
    return rand(32, 128), rand(32, 128), rand(32, 128)


def test_elementwise_chain(abc):
    a, b, c = abc
    assert kernels(a + b + c) == 1
    assert kernels(((a * b + c).relu() * 0.5 + a.exp()).sqrt()) == 1


def test_reduce_with_prologue(abc):
    a, b, _ = abc
    assert kernels((a * b).sum()) == 1


def test_reduce_with_epilogue(abc):
    a, b, _ = abc
    assert kernels(((a * b).sum() + 1).relu()) == 1


def test_reshape_then_reduce():
    a, b = rand(4096), rand(4096)
    assert kernels((a + b).reshape(32, 128).sum(0)) == 1


def test_reduce_then_add(abc):
    a, _, _ = abc
    assert kernels(a.sum(0) + rand(128)) == 1


def test_matmul():
    a, b, bias = rand(32, 64), rand(64, 16), rand(16)
    assert kernels(a @ b) == 1
    assert kernels((a @ b + bias).relu()) == 1


def test_softmax():
    # one kernel: per row, the max, then the sum of exponentials, then the outputs
    x = rand(4, 12, 64, 64)
    assert kernels(x.softmax(-1)) == 1
    values = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
    np.testing.assert_allclose(x.softmax(-1).numpy(), values / values.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_std():
    x = rand(4, 12, 64, 64)
    assert kernels(x.std(-1)) == 1
    np.testing.assert_allclose(x.std(-1).numpy(), x.numpy().std(-1, ddof=1), rtol=1e-4)


def test_transpose_contiguous(abc):
    a, _, _ = abc
    assert kernels(a.T.contiguous()) == 1


def test_two_independent_reduces_fuse(abc):
    a, b, _ = abc
    assert kernels(a.sum() + b.max()) == 1


def test_reduce_read_back_along_its_row_fuses(abc):
    a, _, _ = abc
    # a row's sum, expanded back along the row: computed once per row, before the row's outputs, in one kernel
    assert kernels(a / a.sum(1, keepdim=True)) == 1
    expected = a.numpy() / a.numpy().sum(1, keepdims=True)
    np.testing.assert_allclose((a / a.sum(1, keepdim=True)).numpy(), expected, rtol=1e-4)
    # a column's sum expanded back down the columns would be computed once per output there: it is realized
    assert kernels(a / a.sum(0, keepdim=True)) == 2


def test_realized_tensor_is_reused(abc):
    a, b, _ = abc
    z = (a + b).realize()
    assert kernels(z * 2) == 1
    GlobalCounters.reset()
    (z * 2).realize()
    assert GlobalCounters.kernel_count == 1


def test_no_recompute_of_realized_intermediate(abc):
    a, b, _ = abc
    intermediate = a * b + 1
    intermediate.realize()
    GlobalCounters.reset()
    # a graph that contains the realized node reads its buffer instead of recomputing it
    result = (intermediate.sum() * 2).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(result, ((a.numpy() * b.numpy() + 1).sum()) * 2, rtol=1e-4)


def test_realizing_two_outputs_together(abc):
    a, b, _ = abc
    assert kernels(a + b, a * b) == 2


def test_views_of_buffers_need_no_kernel(abc):
    a, _, _ = abc
    assert kernels(a.reshape(128, 32)) == 0


def test_kernel_count_counter(abc):
    a, b, c = abc
    GlobalCounters.reset()
    out = a + b + c
    assert GlobalCounters.kernel_count == 0  # building is lazy
    out.realize()
    assert GlobalCounters.kernel_count == 1


def test_random_is_lazy_and_fused():
    Tensor.manual_seed(0)
    assert kernels(Tensor.rand(16, 16) + 1) == 1
    assert kernels(Tensor.randn(64) * 2) == 1
    # two draws in one graph read their own sources: still one kernel
    assert kernels(Tensor.rand(8) + Tensor.rand(8)) == 1


def test_random_values_read_repeatedly_are_drawn_once():
    Tensor.manual_seed(0)
    x = Tensor(np.ones((4, 8), np.float32)).realize()
    weight = Tensor.uniform(16, 8, low=-1, high=1)
    # read inside the matmul's reduce, the weight gets a kernel of its own, and the tensor then holds its buffer
    out = x @ weight.T
    assert kernels(out) == 2
    out.realize()
    assert kernels(weight) == 0
    # a random value read by two kernels is computed once for both
    values = Tensor(np.arange(32, dtype=np.float32)).realize()
    mask = Tensor.rand(32) < 0.5
    assert kernels((values * mask).sum(), mask.where(values, 0.0).max()) == 3


def test_backward_of_matmul_relu_sum():
    a, b = rand(16, 32), rand(32, 8)
    (a @ b).relu().sum().backward()
    # the forward matmul (needed for relu's mask), then one kernel per gradient
    assert kernels(a.grad, b.grad) == 3


def test_gradient_of_elementwise_chain_is_one_kernel_each():
    x, y = rand(64), rand(65)[:64]
    ((x * y + 1).exp() * x).sum().backward()
    assert kernels(x.grad) == 1
    assert kernels(y.grad) == 1
    assert kernels(x.grad, y.grad) == 2


def _training_step_kernels(model, optimizer, x, y, loss_fn) -> int:
    """Kernels in one realized training step (loss, backward, update in one schedule), after a warm-up step."""
    counts = []
    for _ in range(2):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        GlobalCounters.reset()
        Tensor.realize_all(loss, *optimizer.schedule_step())
        counts.append(GlobalCounters.kernel_count)
    return counts[-1]


def test_linear_relu_sum_adam_step():
    from lazygrad import nn
    from lazygrad.nn.optim import Adam

    Tensor.manual_seed(0)
    layer = nn.Linear(32, 128)
    optimizer = Adam([layer.weight, layer.bias], lr=0.01)
    x = rand(4, 32).realize()
    # tinygrad: 13. One of the 14 computes Adam's two bias corrections (exp, log and a square root) once a step, which
    # each parameter's update then reads, instead of computing them again for every element
    assert _training_step_kernels(layer, optimizer, x, None, lambda out, _: out.relu().sum()) == 14


def test_conv_batchnorm_relu_eval_forward():
    from lazygrad import nn
    from lazygrad.nn.state import get_parameters

    conv, norm = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
    Tensor.realize_all(*get_parameters([conv, norm]))
    assert kernels(norm(conv(rand(2, 3, 8, 8))).relu()) == 1


def test_costly_work_read_through_an_expand_is_computed_once():
    # a layer norm's output feeds products that read each value once per output column: it gets a buffer (in one
    # kernel with its mean and variance) instead of being computed again for each column, and so does a softmax
    # read by attention's second product; a bias and a ReLU are cheap and stay fused into the next product
    x, g, b, w1, w2 = rand(64, 128), rand(128), rand(128), rand(128, 128), rand(128, 96)
    normed = x.layernorm() * g + b
    assert kernels(normed @ w1) == 2
    assert kernels(normed @ w1, normed @ w2) == 3
    assert kernels((x @ w1 + b).relu() @ w2) == 2
    assert kernels(rand(8, 32, 32).softmax(-1) @ rand(8, 32, 64)) == 2


def test_relu_gradient_mask_of_a_large_product_is_computed_once_with_its_product():
    # at an MLP's sizes a ReLU's forward output and its gradient mask (an add, two compares and a select per value)
    # are read by products that would repeat them once per output column: each gets a buffer, and the gradient's
    # product that the mask multiplies is computed in the mask's kernel (not a buffer of its own)
    x, w1, b1, w2, w3 = rand(256, 784), rand(784, 512), rand(512), rand(512, 512), rand(512, 10)
    for parameter in (w1, b1, w2, w3):
        parameter.requires_grad_()
    ((x @ w1 + b1).relu() @ w2).relu().matmul(w3).sum().backward()
    schedule = w1.grad.schedule(b1.grad, w2.grad, w3.grad)
    # the two forward products, the first ReLU's output, the two masks each with its product, the four gradients
    assert len(schedule) == 9
    masked_products = [
        item
        for item in schedule
        if item.ast.src[0].src[-1].op is Ops.WHERE and any(n.op is Ops.REDUCE for n in item.ast.toposort)
    ]
    assert len(masked_products) == 2
    if Device.DEFAULT not in ("LLVM", "CPU"):
        return  # (its values on the host devices: the PYTHON emulator and the CUDA shim would take a minute or more)
    xn, w1n, b1n, w2n, w3n = (t.numpy() for t in (x, w1, b1, w2, w3))
    h1 = xn @ w1n + b1n
    h2 = np.maximum(h1, 0) @ w2n
    grad_h2 = (np.ones((256, 10), np.float32) @ w3n.T) * (h2 > 0)
    grad_h1 = (grad_h2 @ w2n.T) * (h1 > 0)
    np.testing.assert_allclose(w1.grad.numpy(), xn.T @ grad_h1, rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(b1.grad.numpy(), grad_h1.sum(0), rtol=1e-3, atol=1e-2)


def test_mlp_training_step():
    from lazygrad import nn
    from lazygrad.nn.optim import SGD
    from lazygrad.nn.state import get_parameters

    Tensor.manual_seed(0)
    # the 784-512-512-10 MLP's structure at small sizes: the scheduler's decisions do not depend on sizes, and the
    # suite also runs on the slow PYTHON device
    layers = [nn.Linear(24, 16), nn.Linear(16, 16), nn.Linear(16, 10)]

    def model(x):
        return layers[2](layers[1](layers[0](x).relu()).relu())

    optimizer = SGD(get_parameters(layers), lr=0.01)
    x = rand(8, 24).realize()
    y = Tensor(np.random.default_rng(0).integers(0, 10, 8).astype(np.int32))
    # tinygrad: 26. (23 while the input's implicit gradient grew by a step's graph every step: it kept the nodes
    # computed from the labels, and so their remembered values, alive)
    assert _training_step_kernels(model, optimizer, x, y, lambda out, y: out.sparse_categorical_crossentropy(y)) == 25


def test_plan_reused_for_a_graph_over_new_buffers():
    from lazygrad.engine import schedule

    def step(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        a, b = Tensor(x), Tensor(y)
        return ((a * b).sum(axis=1) + a.max()).numpy()

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((8, 5)).astype(np.float32) for _ in range(4)]
    step(arrays[0], arrays[1])
    plans = len(schedule._plans)
    for x, y in [(arrays[2], arrays[3]), (arrays[1], arrays[0])]:
        np.testing.assert_allclose(step(x, y), (x * y).sum(axis=1) + x.max(), rtol=1e-5)
    assert len(schedule._plans) == plans


def test_plan_reused_when_pending_values_read_a_buffer_before_an_overwrite(monkeypatch):
    # running statistics updated beside a training step read the weight the step overwrites: they join its schedule,
    # in the order they were made, so the same step built again finds its plan (a set's order made a new plan, and
    # scheduled a ResNet18 step from scratch, every step); the walk of the step's graph is continued for them
    from lazygrad.engine import schedule

    continued = []
    original = schedule._structure

    def structure(outputs, device, walked=None):
        continued.append(walked is not None and walked[0] == outputs[: len(walked[0])])
        return original(outputs, device, walked)

    monkeypatch.setattr(schedule, "_structure", structure)

    weight = Tensor(np.ones(4, dtype=np.float32)).realize()
    statistics = [Tensor.zeros(4).contiguous().realize() for _ in range(8)]
    expected_weight, expected = np.ones(4, dtype=np.float32), np.zeros((8, 4), dtype=np.float32)

    def step():
        for number, value in enumerate(statistics):
            value.assign(value * 0.5 + weight * (number + 1))
        weight.assign(weight - 0.25)
        weight.realize()

    for count in range(6):
        if count == 2:
            plans = len(schedule._plans)
        step()
        expected = expected * 0.5 + expected_weight * np.arange(1, 9, dtype=np.float32)[:, None]
        expected_weight = expected_weight - 0.25
    assert len(schedule._plans) == plans
    assert continued[-2:] == [False, True]  # (the step's outputs walked, then that walk continued for the readers)
    np.testing.assert_allclose(np.stack([value.numpy() for value in statistics]), expected, rtol=1e-6)
    np.testing.assert_array_equal(weight.numpy(), expected_weight)


def test_plan_tells_one_buffer_used_twice_from_two():
    # a + a and a + b have the same shape of graph, but in the first both operands are one buffer
    x, y = np.arange(6, dtype=np.float32), np.ones(6, dtype=np.float32)
    a, b = Tensor(x), Tensor(y)
    np.testing.assert_array_equal((a + b).numpy(), x + y)
    np.testing.assert_array_equal((a + a).numpy(), x + x)
    np.testing.assert_array_equal((b + a).numpy(), y + x)


def test_plan_reused_for_assigns_to_new_buffers():
    for start in (1.0, 5.0):
        weight = Tensor([start, start]).realize()
        old = weight * 2  # read before the write: must run first
        weight.assign(weight + 1)
        Tensor.realize_all(old, weight)
        np.testing.assert_array_equal(old.numpy(), [2 * start] * 2)
        np.testing.assert_array_equal(weight.numpy(), [start + 1] * 2)


def test_plan_keeps_graphs_of_one_shape_apart():
    # each pair below has the same ops in the same places: a cached plan must tell them apart by what differs
    x = np.array([1.5, -2.0, 3.0], dtype=np.float32)
    for _ in range(2):  # the second round finds every plan cached
        t = Tensor(x).realize()
        # constants, the sign of zero among them
        np.testing.assert_array_equal((t + 1).numpy(), x + 1)
        np.testing.assert_array_equal((t + 2).numpy(), x + 2)
        assert np.signbit((t * 0.0).numpy()).tolist() == np.signbit(x * np.float32(0.0)).tolist()
        assert np.signbit((t * -0.0).numpy()).tolist() == np.signbit(x * np.float32(-0.0)).tolist()
        # shapes and dtypes of the buffers
        for data in (x, x[:2], x.reshape(3, 1), x.astype(np.int32), np.array([True, False])):
            np.testing.assert_array_equal((Tensor(data) * 3).numpy(), data * 3)
        # other buffers of the same kind, one buffer read twice and two buffers
        y = np.array([10.0, 20.0, 30.0], dtype=np.float32)
        u = Tensor(y).realize()
        np.testing.assert_array_equal((t + u).numpy(), x + y)
        np.testing.assert_array_equal((u + t).numpy(), y + x)
        np.testing.assert_array_equal((t + t).numpy(), x + x)
        # the same nodes in the same order, wired differently
        np.testing.assert_array_equal((t * u + t).numpy(), x * y + x)
        np.testing.assert_array_equal((t * u + u).numpy(), x * y + y)
        # buffers that differ in their dtype alone (every node above them is float32)
        for data in (np.array([200, -3], np.int32), np.array([200, 3], np.uint8), np.array([200, -3], np.int16)):
            np.testing.assert_array_equal((Tensor(data).float() + 1).numpy(), data.astype(np.float32) + 1)


def test_plan_reads_nodes_realized_earlier_from_their_buffers():
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    t = Tensor(x).realize()
    for offset in (1.0, 5.0):
        inner = t + offset
        outer = (inner * 2).detach() + inner
        assert len(outer.schedule()) == 1
        # the same graph once `inner` is realized: its kernel reads inner's buffer instead of computing it again
        inner.realize()
        items = outer.schedule()
        assert len(items) == 1 and inner.uop.base in items[0].buffers and t.uop.base not in items[0].buffers
        np.testing.assert_array_equal(outer.numpy(), (x + offset) * 3)


def test_plan_keeps_outputs_apart():
    from lazygrad.engine.buffers import is_buffer_view

    x = np.array([1.0, 2.0], dtype=np.float32)
    t = Tensor(x).realize()
    np.testing.assert_array_equal(((t + 1) * 2).numpy(), (x + 1) * 2)  # one output: t + 1 is fused, not kept
    # the same nodes with t + 1 an output too: it gets a buffer of its own
    inner = t + 1
    outer = inner * 2
    Tensor.realize_all(outer, inner)
    assert is_buffer_view(inner.uop) and is_buffer_view(outer.uop)
    np.testing.assert_array_equal(inner.numpy(), x + 1)
    np.testing.assert_array_equal(outer.numpy(), (x + 1) * 2)


def test_plan_follows_the_buffer_an_assign_writes():
    first, second = Tensor([1.0, 2.0]).realize(), Tensor([10.0, 20.0]).realize()
    for step in range(1, 4):
        first.assign(first + 1).realize()
        np.testing.assert_array_equal(first.numpy(), [1.0 + step, 2.0 + step])
        np.testing.assert_array_equal(second.numpy(), [10.0 + step - 1, 20.0 + step - 1])
        second.assign(second + 1).realize()
        np.testing.assert_array_equal(second.numpy(), [10.0 + step, 20.0 + step])
        # a graph reading the buffer an assign wrote reads its new values
        np.testing.assert_array_equal((first + 1).numpy(), [2.0 + step, 3.0 + step])


def test_plan_keeps_devices_apart():
    x = np.array([1.0, 2.0], dtype=np.float32)
    for device in (Device.DEFAULT, "PYTHON", Device.DEFAULT):
        result = Tensor(x, device=device) + 1
        np.testing.assert_array_equal(result.numpy(), x + 1)
        assert result.uop.base.arg[2] == Device.canonicalize(device)
        # a graph with no buffer below it is computed on the device it is realized for
        filled = Tensor.full((2,), 3.0, device=device) + 1
        np.testing.assert_array_equal(filled.numpy(), [4.0, 4.0])
        assert filled.uop.base.arg[2] == Device.canonicalize(device)


def test_reduce_read_through_two_views_is_realized():
    # r[i-1] + r[i]: fused, every output would compute two sums; realized, each sum is computed once
    x = rand(64, 32)
    r = x.sum(0)
    shifted = r.pad(((1, 0),)) + r.pad(((0, 1),))
    assert kernels(shifted) == 2
    expected = x.numpy().sum(0)
    np.testing.assert_allclose(shifted.numpy(), np.pad(expected, (1, 0)) + np.pad(expected, (0, 1)), rtol=1e-5)
    # read twice through the same view, it still fuses
    assert kernels(r * 2 + r.exp()) == 1


def test_padded_input_read_by_many_taps_is_realized():
    # the 9 taps of a padded 3x3 convolution read one padded copy of the input, with no bounds checks
    x, weight = rand(2, 3, 8, 8), rand(4, 3, 3, 3)
    assert kernels(x.conv2d(weight, padding=1)) == 2
    assert kernels(x.conv2d(weight)) == 1
    # so do the windows of a padded 7x7 convolution, which repeat the padded input and read it shifted by each tap
    x, weight = rand(2, 3, 16, 16), rand(4, 3, 7, 7)
    assert kernels(x.conv2d(weight, stride=2, padding=3)) == 2
    assert kernels(x.conv2d(weight, stride=2)) == 1
    # a pad read through one view stays fused, and so does a padded operand of a product (it is only broadcast)
    assert kernels(x.pad(((0, 0), (0, 0), (1, 1), (1, 1))).relu() * 2) == 1
    assert kernels(rand(8, 8).pad(((0, 0), (2, 2))) @ rand(12, 16)) == 1


def test_value_padded_input_read_by_many_taps_is_realized():
    # a max pool with padding pads with -inf (a where over two pads, not a pad): its 9 taps read one padded copy too,
    # computed once, rather than every tap computing the input again (a batch norm and ReLU) under a gate of its own
    torch = pytest.importorskip("torch")
    data, scale = rand(2, 3, 8, 8).numpy(), rand(3).numpy()
    x = Tensor(data, requires_grad=True)
    pooled = (x * Tensor(scale).reshape(1, 3, 1, 1)).exp().max_pool2d(3, stride=2, padding=1)
    assert kernels(pooled) == 2
    assert kernels(x.max_pool2d(2)) == 1  # no padding: no copy
    pooled.sum().backward()
    tx = torch.tensor(data, requires_grad=True)
    expected = torch.nn.functional.max_pool2d((tx * torch.tensor(scale).reshape(1, 3, 1, 1)).exp(), 3, 2, 1)
    expected.sum().backward()
    np.testing.assert_allclose(pooled.numpy(), expected.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5)


def test_a_value_uniform_along_axes_is_stored_once_along_them():
    # with a .sum() loss, a convolution's windows gradient is the same for every image and position: stored once
    # per (channel, tap) and read back through an expand, not 32 x 32 x 32 times over (3.5 MB)
    torch = pytest.importorskip("torch")
    data, weights = rand(32, 3, 32, 32).numpy(), rand(16, 3, 3, 3).numpy()
    x, w = Tensor(data, requires_grad=True), Tensor(weights, requires_grad=True)
    x.conv2d(w, padding=1).sum().backward()
    items = x.grad.schedule()
    assert len(items) == 2 and items[0].buffers[0].arg[1] == 3 * 3 * 3
    tx, tw = torch.tensor(data, requires_grad=True), torch.tensor(weights, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, padding=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4)


def test_a_tensor_whose_value_is_stored_once_keeps_its_values_and_gradients():
    # a live tensor computed between kernels, uniform along an axis, is not switched to the small buffer: it reads
    # it back in full when realized, and gradients still flow through it
    data, other = rand(8).numpy(), rand(64, 5, 8).numpy()
    w = Tensor(data, requires_grad=True)
    row = (w.reshape(1, 1, 8).expand(64, 4, 8) * 3.0).sum(1, keepdim=True)  # (64, 1, 8): the same for each of 64
    out = (row.expand(64, 5, 8) * Tensor(other)).sum(2)
    items = out.schedule()
    assert len(items) == 2 and items[0].buffers[0].arg[1] == 8
    np.testing.assert_allclose(out.numpy(), (12.0 * data * other).sum(2), rtol=1e-5)
    np.testing.assert_allclose(row.numpy(), np.broadcast_to(12.0 * data, (64, 1, 8)), rtol=1e-6)
    row.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full(8, 64 * 12.0), rtol=1e-6)


def test_uniform_axes_follow_movement_and_elementwise_ops():
    from lazygrad.engine.schedule import _reshaped_uniform_axes, _uniform_axes

    # a merge is uniform only if all it merges is; a split of a uniform axis is uniform throughout
    assert _reshaped_uniform_axes((4, 8), frozenset({0}), (32,)) == frozenset()
    assert _reshaped_uniform_axes((4, 8), frozenset({0}), (2, 2, 8)) == frozenset({0, 1})
    assert _reshaped_uniform_axes((4, 1, 8), frozenset({0, 1}), (4, 8, 1)) == frozenset({0})
    row = Tensor(rand(8).numpy()).reshape(1, 8).expand(6, 8)
    assert _uniform_axes(row.uop, {}) == {0}
    assert _uniform_axes((row * 2).permute(1, 0).uop, {}) == {1}
    assert _uniform_axes((row + Tensor(rand(6, 8).numpy())).uop, {}) == frozenset()
    assert _uniform_axes(row.pad(((1, 0), (0, 0))).uop, {}) == frozenset()  # the pad's zeros differ from the row
    assert _uniform_axes(row.sum(1, keepdim=True).uop, {}) == {0, 1}


def test_long_reduce_into_one_value_is_split_across_cores():
    # 2**20 values into one: 256 partial sums (a kernel the cores share), then their sum
    values = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
    x = Tensor(values, requires_grad=True)
    assert kernels(x.sum()) == 2 and kernels(x.max()) == 2
    np.testing.assert_allclose(x.sum().numpy(), values.astype(np.float64).sum(), rtol=1e-6)
    assert x.max().numpy() == values.max()
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * values, rtol=1e-6)
    # short reduces, and reduces into many values, stay one kernel
    assert kernels(rand(1000).sum()) == 1 and kernels(rand(512, 1024).sum(1)) == 1


def test_a_long_reduce_no_part_count_divides_is_padded_and_split():
    """A reduce's parts are padded with its identity: unsplit, a sum added into one block of float32 accumulators,
    where each stops growing at 2**24 (the mean of 2**31 ones was 0.5), and a max ran on one core (one thread of
    a GPU). The padding of a max is its lowest value, of a product 1, not zeros."""
    length = (1 << 20) + 3
    values = np.random.default_rng(2).random(length, dtype=np.float32)
    x = Tensor(values, requires_grad=True)
    assert kernels(x.sum()) == 2 and kernels(x.max()) == 2
    np.testing.assert_allclose(x.sum().numpy(), values.astype(np.float64).sum(), rtol=1e-6)
    assert Tensor(np.ones(length, np.int32)).sum().item() == length and x.max().item() == values.max()
    negative = Tensor(-values - 1)
    assert negative.max().item() == (-values - 1).max() and negative.argmax().item() == (-values - 1).argmax()
    assert (-negative).min().item() == (values + 1).min()
    assert Tensor(-(np.arange(length) % 7).astype(np.int32) - 3).max().item() == -3
    factors = np.ones(length, np.float32)
    factors[::100_000] = -2  # (11 of them: the product is exact)
    assert Tensor(factors).prod().item() == -(2.0**11)
    assert not (x > 2).any().item() and (x >= 0).all().item()
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(length, 3, np.float32))
    from lazygrad.codegen.renderer import Target

    assert Target(cores=4).reduce_parts(1, length) == 256


def test_the_scheduler_splits_every_long_reduce_into_fewer_values_than_cores():
    # the graph holds one reduce (the split is the device's choice, made when scheduling), and a reduce that autograd
    # builds (a broadcast weight's gradient) is split as a sum is
    values = np.random.default_rng(1).random((2, 1 << 19), dtype=np.float32)
    x = Tensor(values)
    assert [node.op for node in x.sum().uop.toposort].count(Ops.REDUCE) == 1
    weight = Tensor(np.float32([1.5]), requires_grad=True)
    (x * weight).sum().backward()
    expected_kernels = 2 if Device[Device.DEFAULT].renderer.target.cores > 1 else 1
    assert kernels(weight.grad) == expected_kernels
    np.testing.assert_allclose(weight.grad.numpy(), [values.astype(np.float64).sum()], rtol=1e-6)
    # on a device with more cores than outputs (a GPU's multiprocessors), a reduce into a few values is split too
    from lazygrad.codegen.renderer import Target

    assert Target(cores=132).reduce_parts(16, 1 << 20) == 256 and Target(cores=2).reduce_parts(16, 1 << 20) == 1
    assert Target(cores=132).reduce_parts(1, 1000) == 1  # a short reduce is not worth a kernel more
    # a GPU's reduce into one value: enough blocks to fill each multiprocessor 8 times (an H200's 132: 1024 blocks,
    # a sum of 16M values 16384 each), none shorter than 1024 values; a reduce into 16 values: 256 parts, as on a CPU
    gpu = Target(cores=132, max_threads=1024)
    parts = [gpu.reduce_parts(1, 1 << 24), gpu.reduce_parts(1, 1 << 18), gpu.reduce_parts(16, 1 << 20)]
    assert parts == [1024, 256, 256]


def test_a_long_float_sum_into_many_values_is_split_for_accuracy():
    """A column mean of a tall matrix, unsplit, added each column's values into one float32 accumulator
    (the mean of a million values near 1000 was 0.9% off; torch's is exact to 1e-7): a long float sum is split
    whatever its outputs, along its outermost reduced axis in place (read in memory order). Exact reduces (an int
    sum, a max) into as many values as cores are not."""
    values = np.random.default_rng(3).normal(1000.0, 1.0, (1 << 18, 8)).astype(np.float32)
    x = Tensor(values)
    cores = Device[Device.DEFAULT].renderer.target.cores  # (a GPU's multiprocessors outnumber the 8 outputs)
    assert kernels(x.mean(0)) == 2 and kernels(x.max(0)) == (2 if cores > 8 else 1)
    if Device.DEFAULT == "CUDA" and os.environ.get("MOCKCUDA"):
        pytest.skip("the CUDA shim emulates a block's threads: each of these sums takes it 20 s")
    np.testing.assert_allclose(x.mean(0).numpy(), values.astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(x.sum(0).numpy(), values.astype(np.float64).sum(0), rtol=1e-6)
    # a batch norm's statistics: the batch of 4 divides too few parts in place, so the sum is split through a permute
    images = np.random.default_rng(4).normal(3.0, 1.0, (4, 2, 256, 256)).astype(np.float32)
    np.testing.assert_allclose(
        Tensor(images).mean((0, 2, 3)).numpy(), images.astype(np.float64).mean((0, 2, 3)), rtol=1e-6
    )
    # channels last: the leading run of reduced axes is merged before it is split (16 parts of 65536 were 4e-4 off)
    last = np.random.default_rng(5).normal(1000.0, 1.0, (16, 16384, 4)).astype(np.float32)
    np.testing.assert_allclose(Tensor(last).mean((0, 1)).numpy(), last.astype(np.float64).mean((0, 1)), rtol=1e-6)
    # a product with a long K: its parts are the outermost loop (as the innermost output it ran 20x slower)
    a, b = (
        np.random.default_rng(6).standard_normal(shape).astype(np.float32) for shape in ((4, 1 << 18), (1 << 18, 4))
    )
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=2e-3)
    assert Tensor(np.ones((1 << 18, 4), np.int32)).sum(0).tolist() == [1 << 18] * 4
    from lazygrad.codegen.renderer import Target

    assert Target(cores=2).reduce_parts(16, 1 << 20, rounds=True) == 256
    assert Target(cores=2).reduce_parts(16, 1 << 17, rounds=True) == 1  # (short enough for one accumulator)


def test_a_graph_with_detached_values_is_walked_once_and_planned_as_without_them(monkeypatch):
    # kernels read a DETACH as its source: the graph is walked once (an optimizer step detaches every parameter), its
    # plan is the one of the same graph without the DETACH nodes, and a tensor holding one is switched to its buffer
    import lazygrad.engine.schedule as schedule

    walks = []
    original = schedule._structure
    monkeypatch.setattr(schedule, "_structure", lambda *args: walks.append(1) or original(*args))
    monkeypatch.setattr(schedule, "_plans", {})  # (planned here first, whatever ran before in this process)
    for seed in (2, 3):  # the same graph over another buffer: the plan found cached
        data = np.random.default_rng(seed).random((4, 8), dtype=np.float32)
        weight = Tensor(data).realize()
        detached = weight.detach()
        out = (detached * 3 + weight).exp2()
        Tensor.realize_all(out, detached)
        np.testing.assert_allclose(out.numpy(), np.exp2(data * 4), rtol=1e-6)
        np.testing.assert_array_equal(detached.numpy(), data)
    assert len(walks) == 2 + 1  # the first realize planned on the graph without DETACH (a walk more), the second not
    assert kernels((weight.detach() * 5 + weight).exp2()) == 1
    # dropping the DETACH nodes makes `x.detach() * 2` and `x * 2` one node: the walk numbers them as one, so the
    # same graph over another buffer finds its plan in one walk too (an optimizer step's graph has such pairs)
    for seed in (4, 5):
        data = np.random.default_rng(seed).random((4, 8), dtype=np.float32)
        weight = Tensor(data).realize()
        twice = (weight.detach() * 2, (weight * 2).detach(), weight * 2)
        walks.clear()
        Tensor.realize_all(*twice)
        for tensor in twice:
            np.testing.assert_allclose(tensor.numpy(), data * 2, rtol=1e-6)
    assert len(walks) == 1


@pytest.mark.parametrize("name", ["mish", "erf", "atan", "asin", "acosh", "selu", "hardswish", "logsigmoid", "sinh"])
def test_composed_elementwise_math_is_one_kernel(abc, name):
    # every select, series and range reduction inside these ops fuses into the one elementwise kernel
    a, _, _ = abc
    assert kernels(getattr(a * 0.5, name)()) == 1


def test_composed_binary_math_is_one_kernel(abc):
    a, b, c = abc
    assert kernels(a.lerp(b, c)) == 1
    assert kernels(a.copysign(b) + a.isclose(b).float()) == 1
    assert kernels(a.div(b, rounding_mode="floor")) == 1


def test_scans_and_sort():
    # a running sum or product is one reduce over the prefix mask; logcumsumexp needs each prefix's maximum first
    x = rand(8, 16)
    assert kernels(x.cumsum(1)) == 1
    assert kernels(x.cumprod(1)) == 1
    assert kernels(x.logcumsumexp(1)) == 2
    # a long one: the blocks' values padded for their prefixes' windows, the blocks' prefixes, the running totals
    # of the blocks, and the two combined
    assert kernels(rand(4, 2048).cumsum(1)) == 4
    # sort: the ranks (a count of the elements before each), then the values (a select of the input by rank)
    assert kernels(x.sort(1)[0]) == 2
    assert kernels(*x.sort(1)) == 3
    assert kernels(x.topk(3, 1)[0]) == 2


def test_nd_convolutions_are_one_kernel():
    # conv1d and conv3d share conv2d's code: one product and one sum, with bias and activation fused
    assert kernels(rand(2, 3, 16).conv1d(rand(4, 3, 3))) == 1
    assert kernels(rand(2, 3, 16).conv1d(rand(4, 3, 3), rand(4)).relu()) == 1
    assert kernels(rand(1, 2, 6, 6, 6).conv3d(rand(4, 2, 3, 3, 3))) == 1
    # padding reads one padded copy, as for conv2d
    assert kernels(rand(1, 2, 6, 6, 6).conv3d(rand(4, 2, 3, 3, 3), padding=1)) == 2


def test_conv_transpose():
    # the flipped weight copied into a convolution's layout, the input padded by the kernel's reach, then the
    # convolution; with a stride, the convolution computes every phase, and a copy interleaves them
    assert kernels(rand(1, 2, 5, 5).conv_transpose2d(rand(2, 3, 3, 3))) == 3
    assert kernels(rand(1, 2, 5, 5).conv_transpose2d(rand(2, 3, 3, 3), stride=2, padding=1)) == 4


def test_the_gradient_of_a_reordering_copy_that_is_a_sum_is_laid_out_as_the_copy():
    # a transposed convolution reads its weight flipped, with its channels swapped, from a copy in a convolution's
    # layout: the weight's gradient (a sum) is stored in that layout (3 x 4 x 3 x 3 values), then copied back,
    # instead of every store of the sum landing apart from the last
    torch = pytest.importorskip("torch")
    x, weights = rand(2, 4, 6, 6), rand(4, 3, 3, 3).numpy()
    w = Tensor(weights, requires_grad=True)
    x.conv_transpose2d(w, padding=1).sum().backward()
    assert [item.buffers[0].arg[1] for item in w.grad.schedule()][-2:] == [108, 108]
    tw = torch.tensor(weights, requires_grad=True)
    torch.nn.functional.conv_transpose2d(torch.tensor(x.numpy()), tw, padding=1).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
    # an elementwise gradient reads through the view in the kernel that needs it
    v = Tensor(rand(5, 7).numpy(), requires_grad=True)
    (v.T.contiguous() * rand(7, 5)).sum().backward()
    assert kernels(v.grad) == 1


def test_pooling_modes_and_layout_ops():
    assert kernels(rand(1, 2, 7, 7).max_pool2d(2, ceil_mode=True)) == 1
    assert kernels(rand(1, 2, 8, 8).interpolate((16, 16), mode="nearest")) == 1  # a whole-number upscale is a view
    assert kernels(rand(1, 2, 5, 5).pad((1, 1, 2, 2), mode="reflect")) == 1
    assert kernels(rand(4, 5).gather(1, Tensor(np.zeros((4, 2), np.int32)))) == 1
    assert kernels(Tensor.einsum("ij,jk->ik", rand(3, 4), rand(4, 5))) == 1


def test_long_elementwise_chain_is_cut_into_kernels():
    # past KERNEL_WORK_LIMIT instructions a chain is cut: each kernel loads its input and does LIMIT - 1 operations
    values = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    steps = 1000
    y = x = Tensor(values)
    for _ in range(steps):
        y = y * 1.0001 + 0.5
    assert kernels(x * 1.0001 + 0.5) == 1
    assert kernels(y) == -(-2 * steps // (KERNEL_WORK_LIMIT - 1))
    expected = values
    for _ in range(steps):
        expected = expected * np.float32(1.0001) + np.float32(0.5)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5)


def test_value_shared_by_a_long_chain_is_cut_once():
    # sin(y) + exp(y) reads y twice: where the kernel must be cut, y is realized (so nothing is computed twice),
    # not both of its readers
    values = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    y = Tensor(values)
    expected = values
    for _ in range(12):
        y = (y * 0.5).sin() + (y * 0.25).exp() * 0.5
        expected = np.sin(expected * np.float32(0.5)) + np.exp(expected * np.float32(0.25)) * np.float32(0.5)
    schedule = y.schedule()
    assert len(schedule) == 2  # six steps of a sine, an exponential and four more operations each
    assert all(len(item.buffers) == 2 for item in schedule)  # each reads one earlier value: a chain of kernels
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5)


def test_ten_thousand_chained_operations_realize():
    # the cold time of this is a row of extra/bench.py; here, the values (no recursion limit is hit anywhere)
    values = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    y = Tensor(values)
    for _ in range(5000):
        y = y * 0.9999 + 0.0001
    # a float32 multiply-add, fused or not, rounds 5000 times: compared with float64 math on the float32 constants
    scale, shift = float(np.float32(0.9999)), float(np.float32(0.0001))
    expected = values.astype(np.float64)
    for _ in range(5000):
        expected = expected * scale + shift
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("channels, count", [(8, 6), (4, 5)])
def test_convolution_windows_feed_both_products_from_one_buffer(channels, count):
    # the windows of a ReLU's output are read by the forward product and by the weight's gradient: they are written
    # once, positions first (an im2col), and both products read rows of it: pad, windows, forward, windows' gradient,
    # input's gradient, weight's. Rows of fewer than 64 values (4 channels of 3x3 taps) are read directly, one kernel
    # fewer. The values stay torch's either way
    torch = pytest.importorskip("torch")
    x_data, w_data = rand(2, channels, 6, 6).numpy(), rand(8, channels, 3, 3).numpy()
    x, w = Tensor(x_data, requires_grad=True), Tensor(w_data, requires_grad=True)
    out = x.relu().conv2d(w, padding=1)
    (out * out).sum().backward()
    assert kernels(out, w.grad, x.grad) == count
    tx, tw = torch.tensor(x_data, requires_grad=True), torch.tensor(w_data, requires_grad=True)
    t_out = torch.nn.functional.conv2d(tx.relu(), tw, padding=1)
    (t_out * t_out).sum().backward()
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_pooling_gradient_shared_by_batchnorm_sums_is_computed_once():
    # a max pool's gradient feeds a batch norm's backward sums and its elementwise part: it gets a buffer (as do the
    # other costly values those kernels share), instead of every one of them computing it again
    torch = pytest.importorskip("torch")
    from lazygrad import nn

    data = rand(16, 16, 32, 32).numpy()
    x = Tensor(data, requires_grad=True)
    with Tensor.train():
        nn.BatchNorm2d(16)(x).relu().max_pool2d().square().sum().backward()
    assert kernels(x.grad) == 13
    tx = torch.tensor(data, requires_grad=True)
    torch.nn.functional.max_pool2d(
        torch.nn.functional.batch_norm(tx, None, None, training=True).relu(), 2
    ).square().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-3)


def test_fold_and_pixel_shuffle_are_one_kernel():
    # fold places each kernel tap by a pad and adds the taps up: all of it one elementwise kernel, as is a shuffle of
    # a computed value (a view)
    columns = rand(2, 12, 20)
    assert kernels(columns.fold((5, 6), 2)) == 1
    assert kernels((rand(2, 12, 28) * 2).fold((6, 7), 2, padding=1, stride=(1, 2))) == 1
    assert kernels((rand(2, 8, 3, 2) + 1).pixel_shuffle(2)) == 1
    assert kernels(rand(3, 4).index_add(1, Tensor([2, 0, 2]), rand(3, 3))) == 1


def test_kernel_facts_kept_between_rounds_give_the_plan_walking_every_kernel_again_gives(monkeypatch):
    """Deciding which nodes get buffers takes rounds; a kernel's facts are kept from one round to the next while no
    node they touched changed. On a convolution, batch norm, pool and linear layer's training step that takes several
    rounds, the nodes realized are those found walking every kernel again each round, and fewer walks are made."""
    from lazygrad import nn
    from lazygrad.engine import fusion

    Tensor.manual_seed(0)
    conv, norm, linear = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8 * 4 * 4, 10)
    x = rand(4, 3, 8, 8)
    with Tensor.train():
        out = linear(norm(conv(x)).relu().max_pool2d().flatten(1)).log_softmax().mean()
    out.backward()
    outputs = [out.uop, conv.weight.grad.uop, norm.weight.grad.uop, linear.weight.grad.uop]
    sink = UOp(Ops.SINK, src=tuple(outputs))
    walks, unsafe_reduces = [], fusion._unsafe_reduces

    def counted(roots, to_realize, random_leaves, known=None):
        walks.append((len(roots) - len(known), len(roots)))  # (kernels walked this round, kernels)
        return unsafe_reduces(roots, to_realize, random_leaves, known)

    monkeypatch.setattr(fusion, "_unsafe_reduces", counted)
    kept = fusion.kernel_roots(sink, outputs)
    monkeypatch.setattr(
        fusion,
        "_unsafe_reduces",
        lambda roots, to_realize, random_leaves, known=None: unsafe_reduces(roots, to_realize, random_leaves),
    )
    assert fusion.kernel_roots(sink, outputs) == kept
    assert len(walks) > 2 and sum(walked for walked, _ in walks) < sum(kernels for _, kernels in walks)


def test_assigns_that_read_each_others_old_values_in_a_cycle_are_ordered():
    # two linear layers fed one example: each SGD update fuses with the gradients it reads, and b1's update reads w2's
    # old value while w2's reads b1's (through the hidden layer): a cycle the scheduler refused
    torch = pytest.importorskip("torch")
    from lazygrad.nn import optim

    rng = np.random.default_rng(0)
    values = [rng.standard_normal(shape).astype(np.float32) for shape in ((2, 2), (2,), (1, 2), (1,))]
    x = rng.standard_normal((1, 2)).astype(np.float32)
    ours = [Tensor(value, requires_grad=True) for value in values]
    theirs = [torch.tensor(value, requires_grad=True) for value in values]
    for params, make, tensor in ((ours, optim.SGD, Tensor), (theirs, torch.optim.SGD, torch.tensor)):
        opt = make(params, lr=0.1)
        w1, b1, w2, b2 = params
        for _ in range(2):
            opt.zero_grad()
            ((tensor(x) @ w1.T + b1) @ w2.T + b2).sum().backward()
            opt.step()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-6, atol=1e-7)


# ---- recurrent networks written by hand: per-step products, stacked and sliced ----------------------------------------


def test_products_stacked_or_sliced_per_step_are_computed_once():
    """A product read through a pad that places it among others (`stack([x_t @ w ...])`, and the gradient of
    `x[:, t]`, which pads each step's gradient to the whole sequence) gets a buffer: fused, every output of the
    stack ran every step's product and kept one (T times the work: 16 steps of 32 x 256 @ 256 x 1024 took 1.8 s)."""
    steps, w = 8, rand(64, 96).realize()
    xs = [rand(16, 64 + t)[:, :64].contiguous().realize() for t in range(steps)]
    stacked = Tensor.stack(*[x @ w for x in xs], dim=1)
    assert kernels(stacked) == steps + 1
    GlobalCounters.reset()
    out = stacked.numpy()
    assert GlobalCounters.global_ops <= 1.25 * 2 * steps * 16 * 64 * 96
    np.testing.assert_allclose(out, np.stack([x.numpy() @ w.numpy() for x in xs], 1), rtol=1e-4, atol=1e-4)
    x = rand(16, steps, 64).requires_grad_()
    loss = sum((x[:, t] @ w).square().sum() for t in range(steps))
    loss.backward()
    GlobalCounters.reset()
    gradient = x.grad.numpy()
    # (forward and backward products: each once, give or take the gradient's 2·y, which devices with threads
    # compute in the product's loop; fused, it was `steps` times this)
    assert GlobalCounters.global_ops <= 1.5 * 2 * 2 * steps * 16 * 64 * 96
    xv, wv = x.numpy(), w.numpy()
    expected = np.stack([2 * (xv[:, t] @ wv) @ wv.T for t in range(steps)], 1)
    np.testing.assert_allclose(gradient, expected, rtol=1e-3, atol=1e-3)


def test_a_weight_shared_by_many_steps_gets_its_gradient_without_the_broadcast_products():
    """A weight read by every step (an RNN's) gets a sum over the steps of products of broadcasts, which a long
    chain's cut wrote out whole (32 x 1024 x 256 floats a step for an LSTM): the cuts go below the broadcasts."""
    steps, batch, width = 8, 8, 32
    w = rand(width, width).requires_grad_()
    h, x = Tensor.zeros(batch, width), rand(batch, steps, width).realize()
    for t in range(steps):
        h = (x[:, t] @ w + h @ w).tanh().sigmoid()
    h.sum().backward()
    items = w.grad.schedule()
    assert all(item.ast.src[0].src[0].arg[1] < batch * width * width for item in items)
    import torch

    tw, th, tx = torch.tensor(w.numpy(), requires_grad=True), torch.zeros(batch, width), torch.tensor(x.numpy())
    for t in range(steps):
        th = (tx[:, t] @ tw + th @ tw).tanh().sigmoid()
    th.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-5)
