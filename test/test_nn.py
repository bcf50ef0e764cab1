"""Tests of lazygrad.nn: layers and functional ops against PyTorch (forward and backward, with the same weights),
optimizer steps against torch.optim, TinyJit capture/replay and its errors, state dicts and safetensors files in
both directions, and bad input.

Tests that need torch or safetensors take the `torch` / `safetensors` fixture and skip cleanly without them. Every
shape is small: the file runs on any device, including the slow PYTHON emulator.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from lazygrad import GlobalCounters, Tensor, TinyJit, dtypes, nn
from lazygrad.engine.jit import JitError
from lazygrad.nn import optim
from lazygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def safetensors():
    pytest.importorskip("safetensors")
    import safetensors.numpy

    return safetensors


@pytest.fixture(autouse=True)
def _not_training():
    """Every test starts and ends in eval mode, whatever it sets."""
    Tensor.training = False
    yield
    Tensor.training = False


def rand(*shape, seed=0, low=-1.0, high=1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def close(ours, theirs, rtol=1e-5, atol=1e-5) -> None:
    """Compare a lazygrad Tensor (or array) with a torch tensor (or array): shape, then values."""
    assert ours is not None, "lazygrad gave no value (a missing .grad?)"
    assert theirs is not None, "torch gave no value"
    ours = ours.numpy() if isinstance(ours, Tensor) else np.asarray(ours)
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert ours.shape == theirs.shape, f"shape {ours.shape} != {theirs.shape}"
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol)


def to_torch(torch, array: np.ndarray, grad: bool = False):
    if array.dtype.kind in "iu":
        return torch.from_numpy(array.astype(np.int64))
    return torch.tensor(array, requires_grad=grad and array.dtype.kind == "f")


def check_layer(torch, layer, module, x: np.ndarray, params: list[str], rtol=1e-5, atol=1e-5):
    """`layer(x)` against `module(x)`, with the module's parameters set from the layer's: the output, then the
    gradients of the input and of every parameter for a random upstream gradient."""
    with torch.no_grad():
        for name in params:
            getattr(module, name).copy_(torch.from_numpy(getattr(layer, name).numpy()))
    ours_x, theirs_x = Tensor(x), to_torch(torch, x, grad=True)
    out, expected = layer(ours_x), module(theirs_x)
    upstream = rand(*expected.shape, seed=99)
    (out * Tensor(upstream)).sum().backward()
    (expected * torch.from_numpy(upstream)).sum().backward()
    close(out, expected, rtol, atol)
    if x.dtype.kind == "f":
        close(ours_x.grad, theirs_x.grad, rtol, atol)
    for name in params:
        close(getattr(layer, name).grad, getattr(module, name).grad, rtol, atol)
    return out


def check_function(torch, ours_fn, theirs_fn, *inputs: np.ndarray, grads=None, rtol=1e-5, atol=1e-5):
    """`ours_fn(*tensors)` against `theirs_fn(*torch_tensors)`, output and gradients of the inputs in `grads`
    (default: every float input) for a random upstream gradient."""
    grads = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"] if grads is None else list(grads)
    ours = [Tensor(a) for a in inputs]
    theirs = [to_torch(torch, a, grad=i in grads) for i, a in enumerate(inputs)]
    out, expected = ours_fn(*ours), theirs_fn(*theirs)
    close(out, expected, rtol, atol)
    if grads:
        upstream = rand(*expected.shape, seed=99)
        (out * Tensor(upstream)).sum().backward()
        (expected * torch.from_numpy(upstream)).sum().backward()
        for i in grads:
            close(ours[i].grad, theirs[i].grad, rtol, atol)
    return out


def set_param(layer, name: str, value: np.ndarray) -> None:
    setattr(layer, name, Tensor(value))


# ---------------------------------------------------------------------------------------------------------------------
# layers against torch


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5)])
def test_linear(torch, shape, bias):
    layer = nn.Linear(5, 3, bias=bias)
    assert layer.weight.shape == (3, 5)
    check_layer(
        torch, layer, torch.nn.Linear(5, 3, bias=bias), rand(*shape), ["weight", "bias"] if bias else ["weight"]
    )


def test_linear_init_range():
    weight = nn.Linear(16, 8).weight.numpy()
    assert np.abs(weight).max() <= 1 / 4 and weight.std() > 0.05


CONV_CASES = [
    # in, out, kernel, stride, padding, dilation, groups, bias
    (3, 4, 3, 1, 0, 1, 1, True),
    (3, 4, 3, 2, 1, 1, 1, True),
    (2, 3, (2, 3), (2, 1), (1, 0), 1, 1, False),
    (3, 2, 3, 1, 2, 2, 1, True),
    (4, 6, 3, 1, 1, (1, 2), 2, True),
    (4, 4, 3, 2, 1, 1, 4, False),  # depthwise
]


@pytest.mark.parametrize("cin,cout,kernel,stride,padding,dilation,groups,bias", CONV_CASES)
def test_conv2d(torch, cin, cout, kernel, stride, padding, dilation, groups, bias):
    layer = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    module = torch.nn.Conv2d(
        cin, cout, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias
    )
    assert layer.weight.shape == tuple(module.weight.shape)
    check_layer(torch, layer, module, rand(2, cin, 7, 6), ["weight", "bias"] if bias else ["weight"], atol=1e-4)


def test_conv2d_tensor_method_torch_padding_order(torch):
    # four values are torch's F.pad order: (left, right, top, bottom)
    x, w = rand(1, 2, 5, 6), rand(3, 2, 2, 2, seed=1)
    expected = torch.nn.functional.conv2d(
        torch.nn.functional.pad(torch.from_numpy(x), (1, 0, 2, 1)), torch.from_numpy(w)
    )
    close(Tensor(x).conv2d(Tensor(w), padding=(1, 0, 2, 1)), expected, atol=1e-5)


def _batchnorm_pair(torch, channels: int, ndim: int, **kwargs):
    """nn.BatchNorm2d and the torch module for `ndim`-D input, with the same random affine weights and running
    statistics."""
    layer = nn.BatchNorm2d(channels, **kwargs)
    module = (torch.nn.BatchNorm2d if ndim == 4 else torch.nn.BatchNorm1d)(channels, **kwargs)
    set_param(layer, "weight", rand(channels, seed=1, low=0.5, high=1.5))
    set_param(layer, "bias", rand(channels, seed=2))
    layer.running_mean.assign(Tensor(rand(channels, seed=3))).realize()
    layer.running_var.assign(Tensor(rand(channels, seed=4, low=0.5, high=2.0))).realize()
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(module, name).copy_(torch.from_numpy(getattr(layer, name).numpy()))
    return layer, module


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5, 5)])
def test_batchnorm_train(torch, shape, steps):
    layer, module = _batchnorm_pair(torch, 3, len(shape))
    module.train()
    Tensor.training = True
    for step in range(steps):
        x = rand(*shape, seed=5 + step, low=-2, high=3)
        ours_x, theirs_x = Tensor(x), torch.tensor(x, requires_grad=True)
        out, expected = layer(ours_x), module(theirs_x)
        upstream = rand(*shape, seed=99)
        (out * Tensor(upstream)).sum().backward()
        (expected * torch.from_numpy(upstream)).sum().backward()
        close(out, expected, atol=1e-5)
        close(ours_x.grad, theirs_x.grad, atol=1e-4)
        close(layer.weight.grad, module.weight.grad, atol=1e-4)
        close(layer.bias.grad, module.bias.grad, atol=1e-4)
        # the running statistics after this step: momentum 0.1, unbiased batch variance
        close(layer.running_mean, module.running_mean)
        close(layer.running_var, module.running_var)
        assert layer.num_batches_tracked.numpy().item() == step + 1
        layer.weight.grad = layer.bias.grad = None
        module.zero_grad()


def test_batchnorm_running_statistics_in_a_jitted_training_step(torch):
    # the running statistics' assigns read the convolution's output, so they are pending tensors reading the weights
    # the optimizer step overwrites: they run in the step's schedule (and so in every replay), before the write
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((8, 3, 4, 4)).astype(np.float32) for _ in range(4)]
    Tensor.manual_seed(0)
    conv, norm = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
    optimizer = optim.SGD(get_parameters([conv, norm]), lr=0.1)
    their_conv, their_norm = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        their_conv.weight.copy_(torch.from_numpy(conv.weight.numpy()))
        their_conv.bias.copy_(torch.from_numpy(conv.bias.numpy()))
    their_optimizer = torch.optim.SGD([*their_conv.parameters(), *their_norm.parameters()], lr=0.1)

    @TinyJit
    def step(x):
        with Tensor.train():
            optimizer.zero_grad()
            loss = norm(conv(x)).relu().mean()
            loss.backward()
            return loss.realize(*optimizer.schedule_step())

    for batch in batches:
        step(Tensor(batch).realize())
        their_optimizer.zero_grad()
        their_norm(their_conv(torch.from_numpy(batch))).relu().mean().backward()
        their_optimizer.step()
    close(norm.running_mean, their_norm.running_mean, atol=1e-6)
    close(norm.running_var, their_norm.running_var, atol=1e-6)
    close(conv.weight, their_conv.weight, atol=1e-6)
    assert norm.num_batches_tracked.numpy().item() == their_norm.num_batches_tracked.item() == len(batches)


def test_batchnorm_statistics_a_jitted_forward_leaves_pending_are_replayed(torch):
    # a replay runs only what the captured call realized: the running statistics nothing in the call reads (a
    # forward pass in training mode) must be realized with it, or replays never update them
    norm, theirs = nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2)

    @TinyJit
    def forward(x):
        with Tensor.train():
            return norm(x).sum().realize()

    for number in range(5):
        batch = np.full((2, 2, 1, 1), float(number), np.float32)
        batch[0] += 1
        forward(Tensor(batch))
        theirs(torch.from_numpy(batch))
    close(norm.running_mean, theirs.running_mean, atol=1e-6)
    close(norm.running_var, theirs.running_var.detach(), atol=1e-6)
    assert norm.num_batches_tracked.numpy().item() == 5


def test_batchnorm_eval(torch):
    layer, module = _batchnorm_pair(torch, 3, 4, eps=1e-3)
    module.eval()
    before = layer.running_mean.numpy().copy()
    check_layer(torch, layer, module, rand(2, 3, 4, 4, seed=5), ["weight", "bias"])
    np.testing.assert_array_equal(layer.running_mean.numpy(), before)
    assert layer.num_batches_tracked.numpy().item() == 0


def test_batchnorm_no_affine_no_tracking(torch):
    layer = nn.BatchNorm2d(2, affine=False, track_running_stats=False)
    module = torch.nn.BatchNorm2d(2, affine=False, track_running_stats=False)
    Tensor.training = True
    check_layer(torch, layer, module, rand(3, 2, 3, 3), [], atol=1e-4)
    assert layer.running_mean is None and layer.running_var is None and layer.num_batches_tracked is None


def test_batchnorm_momentum_none_averages_every_batch_as_torch(torch):
    """momentum=None: the running statistics are the plain average of the batches' (training crashed on None)."""
    layer, module = nn.BatchNorm2d(3, momentum=None), torch.nn.BatchNorm2d(3, momentum=None)
    with Tensor.train():
        for number in range(4):
            x = rand(4, 3, 5, 5, seed=number) * (number + 1) + number
            layer(Tensor(x)).realize()
            module(torch.tensor(x))
    np.testing.assert_allclose(layer.running_mean.numpy(), module.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), module.running_var.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"BatchNorm: momentum must be a number in \[0, 1\] or None"):
        nn.BatchNorm2d(3, momentum=2)


@pytest.mark.parametrize("training", [False, True])
def test_batchnorm_without_running_statistics_uses_the_batchs(torch, training):
    # with no running statistics there is nothing else to normalize with, in eval mode too (as in torch); the state
    # dict has torch's keys for such a layer, so checkpoints go both ways
    layer, module = nn.BatchNorm1d(3, track_running_stats=False), torch.nn.BatchNorm1d(3, track_running_stats=False)
    set_param(layer, "weight", rand(3, seed=1, low=0.5, high=1.5))
    set_param(layer, "bias", rand(3, seed=2))
    module.train(training)
    Tensor.training = training
    x = np.arange(12, dtype=np.float32).reshape(4, 3) * 2 + 5
    check_layer(torch, layer, module, x, ["weight", "bias"], atol=1e-4)
    assert set(get_state_dict(layer)) == set(module.state_dict()) == {"weight", "bias"}


@pytest.mark.parametrize("normalized,shape", [(5, (2, 3, 5)), ((3, 5), (2, 3, 5))])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm(torch, normalized, shape, affine):
    layer = nn.LayerNorm(normalized, elementwise_affine=affine)
    module = torch.nn.LayerNorm(normalized, elementwise_affine=affine)
    if affine:
        weight_shape = (normalized,) if isinstance(normalized, int) else normalized
        set_param(layer, "weight", rand(*weight_shape, seed=1, low=0.5, high=1.5))
        set_param(layer, "bias", rand(*weight_shape, seed=2))
    check_layer(
        torch, layer, module, rand(*shape, seed=3, low=-2, high=3), ["weight", "bias"] if affine else [], atol=1e-4
    )


@pytest.mark.parametrize(
    "groups,shape,affine", [(2, (2, 6, 3, 3), True), (3, (2, 6, 4), False), (6, (1, 6, 2, 2), True)]
)
def test_groupnorm(torch, groups, shape, affine):
    layer, module = nn.GroupNorm(groups, shape[1], affine=affine), torch.nn.GroupNorm(groups, shape[1], affine=affine)
    if affine:
        set_param(layer, "weight", rand(shape[1], seed=1, low=0.5, high=1.5))
        set_param(layer, "bias", rand(shape[1], seed=2))
    check_layer(
        torch, layer, module, rand(*shape, seed=3, low=-2, high=3), ["weight", "bias"] if affine else [], atol=1e-4
    )


def test_embedding(torch):
    layer, module = nn.Embedding(7, 4), torch.nn.Embedding(7, 4)
    idx = np.array([[0, 6, 2], [2, 2, 5]], dtype=np.int32)
    out = check_layer(torch, layer, module, idx, ["weight"])
    assert out.shape == (2, 3, 4)


# ---------------------------------------------------------------------------------------------------------------------
# functional ops against torch


@pytest.mark.parametrize(
    "kernel,stride,padding,dilation",
    [(2, None, 0, 1), (3, 2, 1, 1), ((2, 3), (1, 2), (1, 1), 1), (2, 1, 0, 2), (3, 1, 0, 1)],
)
def test_max_pool2d(torch, kernel, stride, padding, dilation):
    F = torch.nn.functional
    check_function(
        torch,
        lambda x: x.max_pool2d(kernel, stride, dilation=dilation, padding=padding),
        lambda x: F.max_pool2d(x, kernel, stride, padding=padding, dilation=dilation),
        rand(2, 2, 7, 6),
    )


@pytest.mark.parametrize("kernel,stride,padding", [(2, None, 0), (3, 2, 1), ((2, 3), (1, 2), (1, 1)), (3, 1, 0)])
def test_avg_pool2d(torch, kernel, stride, padding):
    F = torch.nn.functional
    check_function(
        torch,
        lambda x: x.avg_pool2d(kernel, stride, padding=padding),
        lambda x: F.avg_pool2d(x, kernel, stride, padding=padding),
        rand(2, 2, 7, 6),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_indices(torch, reduction, smoothing):
    F = torch.nn.functional
    labels = np.array([0, 4, 2, 2], dtype=np.int32)
    check_function(
        torch,
        lambda x, y: x.cross_entropy(y, reduction=reduction, label_smoothing=smoothing),
        lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing),
        rand(4, 5, low=-3, high=3),
        labels,
    )


def test_cross_entropy_spatial_and_ignored(torch):
    F = torch.nn.functional
    labels = np.array([[0, 4, -100], [1, 1, 3]], dtype=np.int32)  # torch's default ignore_index is -100
    check_function(
        torch, lambda x, y: x.cross_entropy(y), lambda x, y: F.cross_entropy(x, y), rand(2, 5, 3, low=-3), labels
    )


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("spatial", [(3, 3), (2, 4)])
def test_cross_entropy_of_images_per_pixel(torch, reduction, spatial):
    # segmentation: logits (N, C, H, W) against labels (N, H, W); square images once gave a loss of the wrong pixels
    F = torch.nn.functional
    labels = np.random.default_rng(2).integers(0, 3, (2, *spatial)).astype(np.int32)
    check_function(
        torch,
        lambda x, y: x.cross_entropy(y, reduction=reduction),
        lambda x, y: F.cross_entropy(x, y, reduction=reduction),
        rand(2, 3, *spatial, low=-3, high=3),
        labels,
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3), (2, 3, 2, 4)])
def test_cross_entropy_probabilities(torch, smoothing, shape):
    F = torch.nn.functional
    probs = np.exp(rand(*shape, seed=1, low=-2, high=2))
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    check_function(
        torch,
        lambda x, y: x.cross_entropy(y, label_smoothing=smoothing),
        lambda x, y: F.cross_entropy(x, y, label_smoothing=smoothing),
        rand(*shape, low=-3, high=3),
        probs,
    )


@pytest.mark.parametrize(
    "labels,ignore_index,smoothing,reduction",
    [
        ([1, 0, 4], -1, 0.0, "mean"),
        ([1, -1, 4], -1, 0.0, "mean"),
        ([2, 0, 2], 2, 0.0, "mean"),
        ([2, 0, 3], 2, 0.2, "mean"),
        ([1, -1, 4], -1, 0.0, "sum"),
        ([1, -1, 4], -1, 0.1, "none"),
    ],
)
def test_sparse_categorical_crossentropy(torch, labels, ignore_index, smoothing, reduction):
    F = torch.nn.functional
    check_function(
        torch,
        lambda x, y: x.sparse_categorical_crossentropy(
            y, ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction
        ),
        lambda x, y: F.cross_entropy(x, y, ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction),
        rand(3, 5, low=-3, high=3),
        np.array(labels, dtype=np.int32),
    )


def test_sparse_categorical_crossentropy_batched(torch):
    F = torch.nn.functional
    labels = np.array([[1, 0, 4], [3, -1, 2]], dtype=np.int32)
    check_function(
        torch,
        lambda x, y: x.sparse_categorical_crossentropy(y),
        lambda x, y: F.cross_entropy(x.reshape(-1, 5), y.reshape(-1), ignore_index=-1),
        rand(2, 3, 5, low=-3, high=3),
        labels,
    )


def test_a_mean_loss_over_no_label_is_nan_as_in_torch(torch):
    """Every label ignored, or an empty batch: 0/0 (it gave 0.0)."""
    logits = rand(2, 3)
    assert np.isnan(Tensor(logits).sparse_categorical_crossentropy(Tensor([-1, -1])).item())
    ignored = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor([-100, -100]))
    assert np.isnan(ignored.item()) and np.isnan(Tensor(logits).cross_entropy(Tensor([-100, -100])).item())
    assert np.isnan(Tensor.zeros(0, 3).cross_entropy(Tensor(np.zeros(0, np.int64))).item())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(torch, reduction):
    F = torch.nn.functional
    probs = (1 / (1 + np.exp(-rand(4, 3, low=-3, high=3)))).astype(np.float32)
    check_function(
        torch,
        lambda p, t: p.binary_crossentropy(t, reduction=reduction),
        lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction),
        probs,
        rand(4, 3, seed=1, low=0, high=1),
        grads=[0],
        atol=1e-4,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy_logits(torch, reduction):
    F = torch.nn.functional
    logits = rand(4, 3, low=-3, high=3)
    logits[0, :2] = [30.0, -30.0]  # far from 0: must stay finite and exact
    check_function(
        torch,
        lambda x, t: x.binary_crossentropy_logits(t, reduction=reduction),
        lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction),
        logits,
        rand(4, 3, seed=1, low=0, high=1),
        grads=[0],
    )


def test_binary_crossentropy_logits_gradient_at_zero():
    x = Tensor([0.0, 0.0], requires_grad=True)
    x.binary_crossentropy_logits(Tensor([0.0, 1.0]), reduction="sum").backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.5, -0.5], rtol=1e-6)


def test_mse(torch):
    check_function(
        torch, lambda a, b: a.mse(b), lambda a, b: torch.nn.functional.mse_loss(a, b), rand(3, 4), rand(3, 4, seed=1)
    )


def test_one_hot():
    labels = np.array([[0, 4, 2], [1, 1, 3]], dtype=np.int32)
    out = Tensor(labels).one_hot(5)
    assert out.shape == (2, 3, 5) and out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), np.eye(5, dtype=np.int32)[labels])


def _sdpa(torch, q_shape, k_shape, v_shape, mask=None, is_causal=False):
    F = torch.nn.functional
    arrays = [rand(*q_shape, seed=1), rand(*k_shape, seed=2), rand(*v_shape, seed=3)]
    if mask is None:
        return check_function(
            torch,
            lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=is_causal),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
            *arrays,
        )
    return check_function(
        torch,
        lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m),
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        *arrays,
        mask,
        grads=[0, 1, 2],
    )


def test_sdpa_plain(torch):
    _sdpa(torch, (2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 6))


def test_sdpa_causal(torch):
    _sdpa(torch, (2, 2, 4, 4), (2, 2, 4, 4), (2, 2, 4, 3), is_causal=True)


def test_sdpa_bool_mask(torch):
    mask = np.random.default_rng(7).random((3, 5)) < 0.5
    mask[:, 0] = True  # no row is fully masked
    _sdpa(torch, (2, 3, 4), (2, 5, 4), (2, 5, 4), mask=mask)


def test_sdpa_query_that_may_attend_to_nothing_gets_zeros(torch):
    # a padded query: torch gives zeros (and zero gradients), not NaN that spreads into the loss
    mask = np.random.default_rng(7).random((3, 5)) < 0.5
    mask[:, 0], mask[1] = True, False
    _sdpa(torch, (2, 3, 4), (2, 5, 4), (2, 5, 4), mask=mask)
    q = Tensor(rand(1, 3, 4))
    with pytest.raises(ValueError, match="pass attn_mask or is_causal=True, not both"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor(mask[:, :3]), is_causal=True)
    with pytest.raises(ValueError, match=r"attn_mask \(3, 5\) does not broadcast to the scores \(1, 3, 3\)"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor(mask))


def test_sdpa_float_mask(torch):
    _sdpa(torch, (2, 3, 4), (2, 5, 4), (2, 5, 4), mask=rand(3, 5, seed=8, low=-2, high=0))


def test_dropout_identity_when_not_training():
    x = Tensor(rand(4, 5))
    assert not Tensor.training
    np.testing.assert_array_equal(x.dropout(0.5).numpy(), x.numpy())
    Tensor.training = True
    np.testing.assert_array_equal(x.dropout(0.0).numpy(), x.numpy())


def test_dropout_training():
    p = 0.25
    Tensor.training = True
    x = Tensor.ones(64, 64).contiguous().realize()
    x.requires_grad = True
    out = x.dropout(p)
    values = out.numpy()
    zeros = (values == 0).mean()
    assert abs(zeros - p) < 0.03, f"fraction of zeros {zeros}, expected about {p}"
    np.testing.assert_allclose(values[values != 0], 1 / (1 - p), rtol=1e-6)
    # the gradient uses the same mask as the forward
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), values, rtol=1e-6)
    # a second call draws a new mask
    assert not np.array_equal(x.dropout(p).numpy(), values)
    np.testing.assert_array_equal(x.dropout(1.0).numpy(), np.zeros((64, 64), np.float32))


def test_dropout_seeded():
    Tensor.training = True
    x = Tensor.ones(8, 8).contiguous().realize()
    Tensor.manual_seed(3)
    first = x.dropout(0.5).numpy()
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(x.dropout(0.5).numpy(), first)


# ---------------------------------------------------------------------------------------------------------------------
# optimizers against torch.optim


def _problem():
    """Parameters (the last one unused by the loss, so it never gets a gradient) and a small nonlinear loss."""
    params = [rand(4, 3, seed=1), rand(3, seed=2), rand(3, 2, seed=3), rand(2, seed=4)]
    x, y = rand(5, 4, seed=5), rand(5, 2, seed=6)

    def loss(w1, b1, w2, _unused, xs, ys):
        return (((xs @ w1 + b1).tanh() @ w2 - ys) ** 2).mean()

    return params, x, y, loss


def _run_against_torch(torch, ours_opt, theirs_opt, mode="step", steps=3, rtol=1e-5, atol=1e-6):
    """Three steps of our optimizer and torch's on the same problem; after each, the loss and every parameter must
    match. `mode` "step": realize the loss, then `opt.step()`; "schedule_step": the loss and the update in one
    schedule (`Tensor.realize_all(loss, *opt.schedule_step())`)."""
    arrays, x, y, loss = _problem()
    ours = [Tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    opt, topt = ours_opt(ours), theirs_opt(theirs)
    for step in range(steps):
        opt.zero_grad()
        topt.zero_grad()
        ours_loss = loss(*ours, Tensor(x), Tensor(y))
        theirs_loss = loss(*theirs, torch.from_numpy(x), torch.from_numpy(y))
        ours_loss.backward()
        theirs_loss.backward()
        if mode == "step":
            ours_loss.realize()
            opt.step()
        else:
            Tensor.realize_all(ours_loss, *opt.schedule_step())
        topt.step()
        close(ours_loss, theirs_loss, rtol=rtol, atol=atol)
        assert ours[3].grad is None
        for number, (a, b) in enumerate(zip(ours, theirs)):
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"param {number}")
    np.testing.assert_array_equal(ours[3].numpy(), arrays[3])  # no gradient, no update
    assert not np.allclose(ours[0].numpy(), arrays[0])


SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9},
    {"lr": 0.1, "momentum": 0.9, "nesterov": True},
    {"lr": 0.1, "weight_decay": 0.1},
    {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.1, "nesterov": True},
]


@pytest.mark.parametrize(
    "kwargs,mode",
    [
        pytest.param(
            kwargs,
            mode,
            id=f"{','.join(kwargs)}-{mode}",
        )
        for number, kwargs in enumerate(SGD_CASES)
        for mode in ("step", "schedule_step")
    ],
)
def test_sgd(torch, kwargs, mode):
    _run_against_torch(torch, lambda p: optim.SGD(p, **kwargs), lambda p: torch.optim.SGD(p, **kwargs), mode)


@pytest.mark.parametrize("kwargs", [{"momentum": 0.9}, {"momentum": 0.9, "nesterov": True}])
def test_sgd_momentum_simple_loop(torch, kwargs):
    """The plainest training loop, as in a tutorial: zero_grad, backward, step."""
    w, tw = Tensor([1.0, -2.0], requires_grad=True), torch.tensor([1.0, -2.0], requires_grad=True)
    opt, topt = optim.SGD([w], lr=0.1, **kwargs), torch.optim.SGD([tw], lr=0.1, **kwargs)
    for _ in range(3):
        opt.zero_grad()
        topt.zero_grad()
        (w * w).sum().backward()
        (tw * tw).sum().backward()
        opt.step()
        topt.step()
        close(w, tw, rtol=1e-6, atol=1e-7)


def _checkpoint(optimizer) -> dict:
    """The optimizer's state dict as copies (a file would hold them so), taken after the last step."""
    return {name: Tensor(value.numpy()) for name, value in get_state_dict(optimizer).items()}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_resumes_from_a_checkpoint(torch, nesterov, jit):
    # the velocity is all the state momentum needs: a new optimizer that loads it takes the uninterrupted run's (and
    # torch's) steps from its first one on, also when its steps are a TinyJit's
    kwargs = {"lr": 0.1, "momentum": 0.9, "nesterov": nesterov}
    w, tw = Tensor([1.0, -2.0], requires_grad=True), torch.tensor([1.0, -2.0], requires_grad=True)
    opt, topt = optim.SGD([w], **kwargs), torch.optim.SGD([tw], **kwargs)

    def step(weight, optimizer):
        optimizer.zero_grad()
        (weight * weight).sum().backward()
        optimizer.step()

    for number in range(6):
        if number == 2:
            resumed = Tensor(w.numpy(), requires_grad=True)
            resumed_opt = optim.SGD([resumed], **kwargs)
            load_state_dict(resumed_opt, _checkpoint(opt))
            run = TinyJit(lambda: step(resumed, resumed_opt)) if jit else (lambda: step(resumed, resumed_opt))
        if number >= 2:
            run()
        step(w, opt)
        step(tw, topt)
    close(w, tw.detach(), rtol=1e-6, atol=1e-7)
    close(resumed, tw.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("make", ["Adam", "AdamW", "LAMB"])
def test_adam_resumes_from_a_checkpoint_after_a_missed_step(torch, make, jit):
    # a parameter that missed steps (no gradient) counts fewer steps than the others, as in torch: its counter is in
    # the state dict from the start, so a checkpoint taken after a miss loads into a new optimizer, which resumes
    # exactly (LAMB has no torch counterpart: it is checked against the uninterrupted run)
    start = [np.array([1.0, -2.0], np.float32), np.array([2.0, 0.5], np.float32)]
    ours = [Tensor(a, requires_grad=True) for a in start]
    theirs = [torch.tensor(a, requires_grad=True) for a in start]
    opt = getattr(optim, make)(ours, lr=0.1)
    topt = getattr(torch.optim, make)(theirs, lr=0.1) if make != "LAMB" else None

    def step(params, optimizer, both: bool = True):
        optimizer.zero_grad()
        loss = (params[0] * params[0]).sum()
        (loss + (params[1] * params[1]).sum() if both else loss).backward()
        optimizer.step()

    for number in range(7):
        if number == 3:
            resumed = [Tensor(p.numpy(), requires_grad=True) for p in ours]
            resumed_opt = getattr(optim, make)(resumed, lr=0.1)
            load_state_dict(resumed_opt, _checkpoint(opt))
            run = TinyJit(lambda: step(resumed, resumed_opt)) if jit else (lambda: step(resumed, resumed_opt))
        if number >= 3:
            run()
        step(ours, opt, both=number not in (1, 2))
        if topt is not None:
            step(theirs, topt, both=number not in (1, 2))
    for number, (a, b) in enumerate(zip(resumed, ours)):
        close(a, b, rtol=1e-6, atol=1e-7)
        if topt is not None:
            close(a, theirs[number].detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("make", ["Adam", "AdamW"])
def test_adam_counts_a_parameters_steps_from_its_gradients(torch, make, jit):
    # torch counts a parameter's steps only when it has a gradient (a frozen or unused layer): its bias corrections
    # then differ from the others'
    ours, theirs = (
        [Tensor([1.0, -2.0], requires_grad=True) for _ in range(2)],
        [torch.tensor([1.0, -2.0]) for _ in range(2)],
    )
    for tensor in theirs:
        tensor.requires_grad_()
    opt, topt = getattr(optim, make)(ours, lr=0.1), getattr(torch.optim, make)(theirs, lr=0.1)

    def step(first_only: bool):
        opt.zero_grad()
        (ours[0] * ours[0] if first_only else ours[0] * ours[1]).sum().backward()
        opt.step()

    # (a TinyJit replays one graph: its parameter that has no gradient misses every replayed step)
    run = TinyJit(lambda: step(True)) if jit else (lambda: step(True))
    for number in range(5):
        run() if jit or number < 2 else step(False)
        topt.zero_grad()
        (theirs[0] * theirs[0] if jit or number < 2 else theirs[0] * theirs[1]).sum().backward()
        topt.step()
    for a, b in zip(ours, theirs):
        close(a, b.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bases", [(0.9, 0.999), (0.0, 0.9999), (0.5, 0.99)])
def test_adam_bias_corrections_are_as_exact_as_float64(bases):
    # 1 - b**t computed as a difference in float32 lost up to 1e-4 of itself for b near 1 (one ulp of 0.999): more
    # than torch's float64 arithmetic allows. Each correction is within a few float32 ulps of float64's
    steps = Tensor(np.array([1, 2, 3, 10, 100, 1000, 10000], np.float32).reshape(-1, 1))
    got = optim._one_minus_powers(bases, steps).numpy()
    want = 1 - np.array(bases, np.float64) ** steps.numpy().astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=4e-7)


@pytest.mark.parametrize("make", [optim.Adam, optim.AdamW, optim.LAMB])
def test_adam_rejects_a_decay_outside_0_to_1(make):
    with pytest.raises(ValueError, match=r"b2 must be in \[0, 1\).*got 1.0"):
        make([Tensor([1.0], requires_grad=True)], b2=1.0)


@pytest.mark.parametrize("kwargs", [{}, {"lr": 0.01}, {"lr": 0.02, "b1": 0.8, "b2": 0.99, "eps": 1e-6}])
def test_adam(torch, kwargs):
    theirs = {k: v for k, v in kwargs.items() if k not in ("b1", "b2")}
    if "b1" in kwargs:
        theirs["betas"] = (kwargs["b1"], kwargs["b2"])
    _run_against_torch(torch, lambda p: optim.Adam(p, **kwargs), lambda p: torch.optim.Adam(p, **theirs))


@pytest.mark.parametrize("kwargs", [{}, {"lr": 0.01, "weight_decay": 0.1}])
def test_adamw(torch, kwargs):
    _run_against_torch(torch, lambda p: optim.AdamW(p, **kwargs), lambda p: torch.optim.AdamW(p, **kwargs))


def test_lamb_against_numpy():
    arrays, x, y, loss = _problem()
    params = [Tensor(a, requires_grad=True) for a in arrays[:3]]
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-6, 0.01
    opt = optim.LAMB(params, lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd)
    weights = [a.copy() for a in arrays[:3]]
    first, second = [np.zeros_like(w) for w in weights], [np.zeros_like(w) for w in weights]
    for step in range(1, 4):
        opt.zero_grad()
        loss(*params, None, Tensor(x), Tensor(y)).backward()
        grads = [p.grad.numpy() for p in params]
        opt.step()
        for i, g in enumerate(grads):
            first[i] = b1 * first[i] + (1 - b1) * g
            second[i] = b2 * second[i] + (1 - b2) * g * g
            update = (first[i] / (1 - b1**step)) / (np.sqrt(second[i] / (1 - b2**step)) + eps) + wd * weights[i]
            trust = np.linalg.norm(weights[i]) / np.linalg.norm(update)
            weights[i] = weights[i] - lr * trust * update
            np.testing.assert_allclose(params[i].numpy(), weights[i], rtol=1e-5, atol=1e-6)


def test_zero_grad_and_accumulation():
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    (w * 3).sum().backward()
    (w * 3).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 6.0])
    opt.zero_grad()
    assert w.grad is None
    (w * 3).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.numpy(), [0.7, 1.7], rtol=1e-6)


def test_learning_rate_change():
    w = Tensor([1.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    for lr in (0.1, 0.5):
        opt.lr.assign(Tensor([lr])).realize()
        opt.zero_grad()
        (w * 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.2 - 1.0], rtol=1e-6)


def test_parameters_made_as_equal_constants_train_apart(torch):
    """Two Tensor.zeros(4) are one node until a gradient is asked of them: each parameter then takes a node of its
    own, so the two biases get their own gradients and updates, as torch's do."""

    class Net:
        def __init__(self):
            self.w = Tensor.ones(4, 4)
            self.b1, self.b2 = Tensor.zeros(4), Tensor.zeros(4)

        def __call__(self, x):
            return ((x @ self.w + self.b1).relu() * 2 + self.b2 * 3).sum()

    net, x = Net(), rand(2, 4)
    w, b1, b2 = (torch.ones(4, 4, requires_grad=True), *(torch.zeros(4, requires_grad=True) for _ in range(2)))
    opt, theirs = optim.SGD(get_parameters(net), lr=0.1), torch.optim.SGD([w, b1, b2], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        net(Tensor(x)).backward()
        opt.step()
        theirs.zero_grad()
        (((torch.from_numpy(x) @ w + b1).relu() * 2 + b2 * 3).sum()).backward()
        theirs.step()
    for ours, expected in ((net.w, w), (net.b1, b1), (net.b2, b2)):
        np.testing.assert_allclose(ours.numpy(), expected.detach().numpy(), rtol=1e-6)
    a, b = Tensor.zeros(3), Tensor.zeros(3)
    Tensor.realize_all(a, b)  # (one buffer for both)
    a.requires_grad, b.requires_grad = True, True
    (a * Tensor([1.0, 2.0, 3.0]) + b * 2).sum().backward()
    assert (a.grad.tolist(), b.grad.tolist()) == ([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=["half", "bf16"])
@pytest.mark.parametrize(
    "make",
    [lambda p: optim.SGD(p, lr=0.1, momentum=0.9), optim.Adam, optim.AdamW, optim.LAMB],
    ids=["sgd", "adam", "adamw", "lamb"],
)
def test_optimizers_update_half_and_bfloat16_parameters(dtype, make):
    """An update is computed in float32 (the learning rate's dtype) and stored in the parameter's dtype: within its
    rounding of the same steps on float32 parameters."""
    start = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    results = []
    for param_dtype in (dtype, dtypes.float32):
        w = Tensor(start, dtype=param_dtype, requires_grad=True)
        opt = make([w])
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        assert w.dtype == param_dtype
        results.append(w.float().numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=2e-2, atol=1e-2)


def test_optimizer_accepts_get_parameters_with_batchnorm():
    class Net:
        def __init__(self):
            self.conv, self.bn = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)

        def __call__(self, x):
            return self.bn(self.conv(x)).relu().mean()

    net = Net()
    opt = optim.Adam(get_parameters(net), lr=0.01)
    Tensor.training = True
    before = net.conv.weight.numpy().copy()
    opt.zero_grad()
    net(Tensor(rand(2, 1, 5, 5))).backward()
    opt.step()
    assert not np.allclose(net.conv.weight.numpy(), before)


# ---------------------------------------------------------------------------------------------------------------------
# TinyJit


class MLP:
    def __init__(self, seed: int = 0):
        self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 3)
        for number, layer in enumerate((self.l1, self.l2)):
            layer.weight = Tensor(rand(*layer.weight.shape, seed=seed + 2 * number, low=-0.5, high=0.5))
            layer.bias = Tensor(rand(*layer.bias.shape, seed=seed + 2 * number + 1, low=-0.5, high=0.5))

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def _train(jit: bool, steps: int = 10):
    model = MLP()
    opt = optim.Adam(get_parameters(model), lr=0.05)
    calls = []

    def step(x: Tensor, y: Tensor) -> Tensor:
        calls.append(1)
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        Tensor.realize_all(loss, *opt.schedule_step())
        return loss

    run = TinyJit(step) if jit else step
    rng = np.random.default_rng(1)
    xs, ys = rng.normal(size=(steps, 4, 6)).astype(np.float32), rng.integers(0, 3, size=(steps, 4)).astype(np.int32)
    losses, compiles = [], []
    for i in range(steps):
        losses.append(run(Tensor(xs[i]), Tensor(ys[i])).numpy().item())
        compiles.append(GlobalCounters.compile_count)
    return losses, [p.numpy() for p in get_parameters(model)], len(calls), compiles, run


def test_jit_training_matches_eager():
    jit_losses, jit_params, jit_calls, compiles, run = _train(jit=True)
    losses, params, calls, _, _ = _train(jit=False)
    assert calls == 10 and jit_calls == 2, "calls 1 and 2 run the function, later calls replay"
    assert run.launches, "the second call captured kernels"
    assert compiles[2:] == [compiles[2]] * 8, "replays compile nothing"
    assert len(set(losses)) == 10, "every step sees its own batch"
    np.testing.assert_allclose(jit_losses, losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(jit_params, params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_jit_training_matches_torch(torch):
    losses, params, _, _, _ = _train(jit=True)
    model = MLP()
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for module, layer in ((net[0], model.l1), (net[2], model.l2)):
            module.weight.copy_(torch.from_numpy(layer.weight.numpy()))
            module.bias.copy_(torch.from_numpy(layer.bias.numpy()))
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    rng = np.random.default_rng(1)
    xs, ys = rng.normal(size=(10, 4, 6)).astype(np.float32), rng.integers(0, 3, size=(10, 4))
    expected = []
    for i in range(10):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(xs[i])), torch.from_numpy(ys[i]))
        loss.backward()
        opt.step()
        expected.append(loss.item())
    np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(params[0], net[0].weight.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_jit_replays_new_inputs():
    calls = []

    @TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        calls.append(1)
        return (x * 2 + y).sum(0).realize()

    for i in range(5):
        a, b = rand(3, 4, seed=i), rand(4, 3, seed=10 + i)
        y = Tensor(b).T if i % 2 else Tensor(b.T.copy())  # a strided view on some calls
        np.testing.assert_allclose(f(Tensor(a), y).numpy(), (a * 2 + b.T).sum(0), rtol=1e-6)
    assert len(calls) == 2


def test_jit_same_plain_argument_is_fine():
    @TinyJit
    def f(x: Tensor, scale: float) -> Tensor:
        return (x * scale).realize()

    for i in range(4):
        np.testing.assert_allclose(f(Tensor([float(i)]), 3.0).numpy(), [3.0 * i])


def test_jit_shape_change_raises():
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x + 1).realize()

    for _ in range(3):
        f(Tensor(rand(2, 3)))
    with pytest.raises(JitError, match="shape|\\(2, 3\\)"):
        f(Tensor(rand(3, 3)))


def test_jit_dtype_change_raises():
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x + 1).realize()

    f(Tensor([1.0, 2.0]))
    f(Tensor([1.0, 2.0]))
    with pytest.raises(JitError):
        f(Tensor([1, 2]))


@pytest.mark.parametrize("as_kwarg", [False, True])
def test_jit_plain_argument_change_raises(as_kwarg):
    @TinyJit
    def f(x: Tensor, scale: float = 1.0) -> Tensor:
        return (x * scale).realize()

    def call(scale):
        return f(Tensor([1.0]), scale=scale) if as_kwarg else f(Tensor([1.0]), scale)

    call(2.0)
    call(2.0)
    np.testing.assert_allclose(call(2.0).numpy(), [2.0])
    with pytest.raises(JitError):
        call(3.0)


def test_jit_no_kernels_raises():
    @TinyJit
    def f(x: Tensor) -> tuple:
        return x.shape

    f(Tensor([1.0]))
    with pytest.raises(JitError, match="no kernels"):
        f(Tensor([2.0]))


def test_jit_outputs_that_view_an_input_show_each_calls_input():
    """An output that is an input, or a view of one, is copied: a replay swaps in the new input's buffer, and the
    view returned the captured call's values on every replay."""

    @TinyJit
    def f(x: Tensor) -> tuple:
        return (x * 2).realize(), x, x.reshape(2, 2), x[1:3].flip(0)

    for call in range(4):
        values = np.arange(4, dtype=np.float32) * (call + 1)
        doubled, same, square, part = f(Tensor(values) + 0)
        np.testing.assert_array_equal(doubled.numpy(), values * 2)
        np.testing.assert_array_equal(same.numpy(), values)
        np.testing.assert_array_equal(square.numpy(), values.reshape(2, 2))
        np.testing.assert_array_equal(part.numpy(), values[1:3][::-1])


def test_jit_returning_a_python_number_raises():
    # a replay runs kernels, not Python: the number would be the captured call's forever
    @TinyJit
    def loss_value(x: Tensor) -> float:
        return (x * x).sum().item()

    loss_value(Tensor([1.0]))
    with pytest.raises(JitError, match=r"returns the Python number 4.0.*return the Tensor and call .item\(\)"):
        loss_value(Tensor([2.0]))


def test_jit_returning_a_numpy_array_raises():
    @TinyJit
    def doubled(x: Tensor) -> np.ndarray:
        return (x * 2).numpy()

    doubled(Tensor([1.0]))
    with pytest.raises(JitError, match=r"returns a NumPy array of shape \(1,\).*\.numpy\(\) on what the TinyJit"):
        doubled(Tensor([2.0]))


def test_jit_output_fed_back_as_its_input():
    """`x = step(x)` (a recurrence, a generation loop) passes the last replay's output, which the next replay
    overwrites while it reads it: the input is copied first."""
    step = TinyJit(lambda x: x.flip(0).realize())
    recur = TinyJit(lambda x: (x.cumsum(0) * 0.5).realize())
    x, y = Tensor([1.0, 2.0, 3.0, 4.0]), Tensor([1.0, 2.0, 3.0])
    expected_x, expected_y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0])
    for _ in range(5):
        x, y = step(x), recur(y)
        expected_x, expected_y = expected_x[::-1], np.cumsum(expected_y) * 0.5
        np.testing.assert_array_equal(x.numpy(), expected_x)
        np.testing.assert_allclose(y.numpy(), expected_y, rtol=1e-6)


def test_jit_keeps_which_inputs_are_one_tensor():
    """Captured with one tensor passed twice, the kernels read it once for both: a call with two tensors is refused
    (and the other way round), while the same tensor twice replays."""
    f = TinyJit(lambda a, b: (a - b).realize())
    x = Tensor([5.0, 5.0])
    f(x, x)
    f(x, x)
    y = Tensor([7.0, 9.0]).realize()
    assert f(y, y).numpy().tolist() == [0.0, 0.0]
    with pytest.raises(JitError, match="which of them are one tensor"):
        f(Tensor([5.0, 5.0]), Tensor([1.0, 2.0]))
    g = TinyJit(lambda a, b: (a - b).realize())
    for _ in range(3):
        g(Tensor([5.0, 5.0]), Tensor([1.0, 2.0]))
    with pytest.raises(JitError, match="which of them are one tensor"):
        g(y, y)


def test_jit_starts_over_after_a_failed_capture():
    """An error in the call being captured leaves nothing to replay: the next calls warm up and capture again."""
    calls = []

    @TinyJit
    def f(x: Tensor) -> Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("transient")
        return (x * 2).realize()

    f(Tensor([1.0]))
    with pytest.raises(RuntimeError, match="transient"):
        f(Tensor([2.0]))
    assert [f(Tensor([value])).item() for value in (3.0, 4.0, 5.0, 6.0)] == [6.0, 8.0, 10.0, 12.0]


def test_jit_replays_after_assigns_made_between_calls():
    weight = Tensor([1.0]).realize()

    @TinyJit
    def scale(x: Tensor) -> Tensor:
        return (x * weight).realize()

    results = []
    for value in (1.0, 2.0, 3.0, 4.0):
        weight.assign(Tensor([value]))  # pending until something reads it: the replay must see it
        results.append(scale(Tensor([10.0])).item())
    assert results == [10.0, 20.0, 30.0, 40.0]


def test_jit_disabled_by_env():
    script = """
import numpy as np
from lazygrad import Tensor, TinyJit
calls = []

@TinyJit
def f(x, scale):
    calls.append(1)
    return (x * scale).realize()

for i in range(4):
    assert f(Tensor(np.full(3, i, np.float32)), 2).numpy().tolist() == [2.0 * i] * 3
assert f(Tensor([1.0, 2.0]), 5).numpy().tolist() == [5.0, 10.0]  # new shape and argument: fine without the JIT

@TinyJit
def nothing(x):
    return x

for _ in range(3):
    nothing(Tensor([1.0]))
print("calls", len(calls))
"""
    env = {**os.environ, "JIT": "0"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "calls 5" in result.stdout


def test_nn_submodules_reachable_from_nn():
    script = "from lazygrad import nn; nn.optim.Adam; nn.state.get_parameters; print('ok')"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_jit_replays_draw_new_random_numbers():
    """The random counter lives on the device, so each replay of a step with dropout uses a new mask."""
    x = Tensor(np.ones(256, np.float32))
    step = TinyJit(lambda x: x.dropout(0.5).realize())
    Tensor.training = True
    try:
        masks = [step(x).numpy() != 0 for _ in range(6)]
    finally:
        Tensor.training = False
    assert len({mask.tobytes() for mask in masks}) == 6
    assert all(0.3 < mask.mean() < 0.7 for mask in masks)


def test_jit_batchnorm_running_stats():
    """Assigns outside the optimizer (BatchNorm's running statistics) replay too when the step realizes them."""

    def build():
        conv, bn = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)
        conv.weight, conv.bias = Tensor(rand(2, 1, 3, 3, seed=1)), Tensor(rand(2, seed=2))
        opt = optim.SGD([conv.weight, conv.bias, bn.weight, bn.bias], lr=0.1)

        def step(x: Tensor) -> Tensor:
            Tensor.training = True
            opt.zero_grad()
            loss = bn(conv(x)).relu().mean()
            loss.backward()
            Tensor.realize_all(loss, *opt.schedule_step(), bn.running_mean, bn.running_var, bn.num_batches_tracked)
            return loss

        return bn, step

    bn_jit, step = build()
    jit = TinyJit(step)
    bn_eager, eager = build()
    for seed in range(5):
        x = rand(2, 1, 5, 5, seed=seed)
        np.testing.assert_allclose(jit(Tensor(x)).numpy(), eager(Tensor(x)).numpy(), rtol=1e-5)
    assert bn_jit.num_batches_tracked.numpy().item() == 5
    np.testing.assert_allclose(bn_jit.running_mean.numpy(), bn_eager.running_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(bn_jit.running_var.numpy(), bn_eager.running_var.numpy(), rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# state: names, parameters, state dicts, safetensors


class Net:
    def __init__(self):
        self.fc = nn.Linear(3, 4)
        self.layers = [nn.Linear(4, 4), nn.Linear(4, 2, bias=False)]
        self.heads = {"out": nn.Linear(2, 1)}
        self.norm = nn.LayerNorm(4)
        self.bn = nn.BatchNorm2d(2)
        self.name, self.scale = "net", 2.0  # not tensors: not state

    def __call__(self, x: Tensor) -> Tensor:
        x = self.norm(self.layers[0](self.fc(x)).relu())
        return self.heads["out"](self.layers[1](x))


NET_KEYS = {
    "fc.weight",
    "fc.bias",
    "layers.0.weight",
    "layers.0.bias",
    "layers.1.weight",
    "heads.out.weight",
    "heads.out.bias",
    "norm.weight",
    "norm.bias",
    "bn.weight",
    "bn.bias",
    "bn.running_mean",
    "bn.running_var",
    "bn.num_batches_tracked",
}


def test_state_dict_names():
    net = Net()
    state = get_state_dict(net)
    assert set(state) == NET_KEYS
    assert state["fc.weight"] is net.fc.weight and state["layers.0.bias"] is net.layers[0].bias
    assert state["fc.weight"].shape == (4, 3)


def test_get_parameters():
    net = Net()
    params = get_parameters(net)
    assert len(params) == len(NET_KEYS)
    assert any(p is net.layers[1].weight for p in params)

    class Shared:
        def __init__(self):
            self.a = nn.Linear(2, 2)
            self.b = self.a

    shared = Shared()
    assert set(get_state_dict(shared)) == {"a.weight", "a.bias", "b.weight", "b.bias"}
    assert len(get_parameters(shared)) == 2


def _assert_same_state(a, b):
    sa, sb = get_state_dict(a), get_state_dict(b)
    assert set(sa) == set(sb)
    for name in sa:
        np.testing.assert_array_equal(sa[name].numpy(), sb[name].numpy(), err_msg=name)


def test_load_state_dict_round_trip():
    src, dst = Net(), Net()
    assert not np.array_equal(src.fc.weight.numpy(), dst.fc.weight.numpy())
    src.bn.running_mean.assign(Tensor([0.5, -0.5])).realize()
    src.bn.num_batches_tracked.assign(Tensor([7], dtype=dtypes.int64)).realize()
    load_state_dict(dst, get_state_dict(src))
    _assert_same_state(src, dst)
    x = Tensor(rand(2, 3))
    np.testing.assert_allclose(dst(x).numpy(), src(x).numpy(), rtol=1e-6)
    # a copy, not an alias
    src.fc.weight.assign(Tensor.zeros(4, 3)).realize()
    assert np.abs(dst.fc.weight.numpy()).sum() > 0


def test_load_state_dict_missing_and_unexpected():
    src, dst = Net(), Net()
    state = get_state_dict(src)
    missing = {k: v for k, v in state.items() if k != "fc.bias"}
    with pytest.raises(KeyError, match="fc.bias"):
        load_state_dict(dst, missing)
    with pytest.raises(KeyError, match="extra.weight"):
        load_state_dict(dst, {**state, "extra.weight": Tensor([1.0])})
    before = dst.fc.bias.numpy().copy()
    load_state_dict(dst, {**missing, "extra.weight": Tensor([1.0])}, strict=False)
    np.testing.assert_array_equal(dst.fc.bias.numpy(), before)
    np.testing.assert_array_equal(dst.fc.weight.numpy(), src.fc.weight.numpy())


def test_load_state_dict_shape_mismatch():
    net = Net()
    state = {**get_state_dict(Net()), "fc.weight": Tensor(rand(3, 4))}
    with pytest.raises(ValueError, match="fc.weight"):
        load_state_dict(net, state)


def test_safe_save_read_by_safetensors(safetensors, tmp_path):
    arrays = {
        "f32": rand(2, 3),
        "f16": rand(4, seed=1).astype(np.float16),
        "i32": np.arange(-3, 3, dtype=np.int32).reshape(3, 2),
        "bool": np.array([True, False, False, True, True]),
    }
    tensors = {k: Tensor(v) for k, v in arrays.items()}
    tensors["view"] = Tensor(arrays["f32"]).T  # a strided view
    tensors["lazy"] = Tensor(arrays["f32"]) * 2 + 1  # not yet computed
    path = str(tmp_path / "out.safetensors")
    safe_save(tensors, path, metadata={"format": "np"})
    loaded = safetensors.numpy.load_file(path)
    assert set(loaded) == set(tensors)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype, name
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)
    np.testing.assert_array_equal(loaded["view"], arrays["f32"].T)
    np.testing.assert_allclose(loaded["lazy"], arrays["f32"] * 2 + 1, rtol=1e-6)
    with safetensors.safe_open(path, "np") as file:
        assert file.metadata() == {"format": "np"}


def test_safe_load_reads_safetensors_files(safetensors, tmp_path):
    arrays = {
        "f32": rand(2, 3),
        "f16": rand(4, seed=1).astype(np.float16),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3) - 2,
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.array(1.5, dtype=np.float32),
    }
    expected_dtypes = {
        "f32": dtypes.float32,
        "f16": dtypes.float16,
        "i32": dtypes.int32,
        "bool": dtypes.bool,
        "scalar": dtypes.float32,
    }
    path = str(tmp_path / "in.safetensors")
    safetensors.numpy.save_file(arrays, path, metadata={"who": "test"})
    loaded = safe_load(path)
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == expected_dtypes[name], name
        assert loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name].numpy(), array, err_msg=name)


def test_model_round_trip_through_file(tmp_path):
    src, dst = Net(), Net()
    path = str(tmp_path / "net.safetensors")
    safe_save(get_state_dict(src), path)
    load_state_dict(dst, safe_load(path))
    _assert_same_state(src, dst)


# ---------------------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("training", [False, True])
def test_layer_wrong_input_shape(training):
    Tensor.training = training
    cases = [
        (nn.Linear(5, 3), (4, 6), "Linear.*5"),
        (nn.Linear(5, 3), (), "Linear"),
        (nn.Conv2d(3, 4, 3), (2, 4, 8, 8), "Conv2d.*3"),
        (nn.Conv2d(3, 4, 3), (3, 8, 8), "Conv2d"),
        (nn.LayerNorm(5), (2, 4), "LayerNorm.*5"),
        (nn.LayerNorm((2, 3)), (3,), "LayerNorm"),
        (nn.BatchNorm2d(3), (2, 4, 5, 5), "BatchNorm.*3"),
        (nn.BatchNorm2d(3), (3,), "BatchNorm"),
        (nn.GroupNorm(2, 6), (2, 4, 3), "GroupNorm.*6"),
    ]
    for layer, shape, message in cases:
        with pytest.raises(ValueError, match=message):
            layer(Tensor(np.zeros(shape, np.float32)))


def test_layer_bad_construction():
    with pytest.raises(ValueError, match="groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="GroupNorm"):
        nn.GroupNorm(4, 6)
    with pytest.raises(ValueError):
        nn.Conv2d(3, 4, 5)(Tensor(rand(1, 3, 3, 3)))  # the kernel does not fit


def test_embedding_float_indices():
    with pytest.raises(TypeError, match="Embedding"):
        nn.Embedding(4, 2)(Tensor([0.0, 1.0]))


def test_loss_label_errors():
    logits = Tensor(rand(3, 5))
    with pytest.raises(TypeError, match="labels"):
        logits.sparse_categorical_crossentropy(Tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="labels"):
        logits.sparse_categorical_crossentropy(Tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="labels"):
        logits.sparse_categorical_crossentropy(Tensor([[0], [1], [2]]))
    with pytest.raises(ValueError):
        logits.cross_entropy(Tensor(rand(3, 4)))  # probabilities of the wrong shape
    with pytest.raises(ValueError):
        logits.cross_entropy(Tensor([0, 1]))  # indices of the wrong shape
    with pytest.raises(TypeError):
        Tensor([0.0, 1.0]).one_hot(3)
    with pytest.raises(ValueError):
        logits.dropout(1.5)


def test_optimizer_bad_params():
    float_param = Tensor([1.0, 2.0])
    for make in (optim.SGD, optim.Adam, optim.AdamW, optim.LAMB):
        with pytest.raises(ValueError, match="no float parameters"):
            make([])
        with pytest.raises(ValueError):
            make(iter([]))
        with pytest.raises(ValueError, match="no float parameters.*1 int or bool tensor left out"):
            make([Tensor([1, 2])])  # (int and bool state, such as counters or position ids, is left out)
        assert make([float_param, Tensor([True, False])]).params == [float_param]
        with pytest.raises(TypeError):
            make([np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([float_param], lr=0.1, nesterov=True)


def test_gradients_of_freshly_initialized_layers_use_their_stored_values():
    # the parameters are drawn from the random counter, which their own realization advances: gradients must
    # use the stored values, not redraw them from the counter's new contents
    Tensor.manual_seed(0)
    first, second = nn.Linear(4, 3), nn.Linear(3, 2)
    Tensor.realize_all(first.weight, first.bias, second.weight, second.bias)
    x = np.random.default_rng(1).standard_normal((50, 4)).astype(np.float32)
    second(first(Tensor(x)).relu()).relu().sum().backward()
    w1, b1, w2, b2 = (t.numpy() for t in (first.weight, first.bias, second.weight, second.bias))
    hidden = np.maximum(x @ w1.T + b1, 0)
    grad_out = ((hidden @ w2.T + b2) > 0).astype(np.float32)
    grad_hidden = (grad_out @ w2) * (hidden > 0)
    np.testing.assert_allclose(second.weight.grad.numpy(), grad_out.T @ hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first.weight.grad.numpy(), grad_hidden.T @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first.bias.grad.numpy(), grad_hidden.sum(0), rtol=1e-5, atol=1e-5)
