"""Argument checks and edge cases of the nn functions and layers, against torch where values are involved:
attention with fully masked rows and wrong mask dtypes, the losses' reductions, shapes and weights, BatchNorm with
one value per channel or an empty batch, Embedding's index dtypes and layers with no inputs or a zero kernel.

Every shape is tiny: the file runs on any device, including the slow PYTHON emulator.
"""

import re

import numpy as np
import pytest
from test_nn import _not_training, close, rand  # noqa: F401 (the eval-mode fixture and helpers, shared)

from lazygrad import Tensor, dtypes, nn


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


# ---- scaled_dot_product_attention ---------------------------------------------------------------------------------


def test_attention_float_mask_all_inf_row_is_zero(torch):
    mask = np.zeros((2, 3), np.float32)
    mask[1] = -np.inf
    ours = Tensor.ones(2, 4).scaled_dot_product_attention(Tensor.ones(3, 4), Tensor.ones(3, 2), attn_mask=Tensor(mask))
    theirs = torch.nn.functional.scaled_dot_product_attention(
        torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 2), attn_mask=torch.tensor(mask)
    )
    close(ours, theirs)


def test_attention_float_mask_values_and_gradients(torch):
    """A fully masked row, a partly masked one and plain ones, batched: output and every gradient (mask's too)."""
    q, k, v = rand(2, 5, 4), rand(2, 6, 4, seed=1), rand(2, 6, 3, seed=2)
    mask = rand(5, 6, seed=3)
    mask[2] = -np.inf
    mask[0, :3] = -np.inf
    ours = [Tensor(a, requires_grad=True) for a in (q, k, v, mask)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (q, k, v, mask)]
    out = ours[0].scaled_dot_product_attention(ours[1], ours[2], attn_mask=ours[3])
    ref = torch.nn.functional.scaled_dot_product_attention(*theirs[:3], attn_mask=theirs[3])
    upstream = rand(2, 5, 3, seed=4)
    (out * Tensor(upstream)).sum().backward()
    (ref * torch.tensor(upstream)).sum().backward()
    close(out, ref)
    for a, b in zip(ours, theirs):
        close(a.grad, b.grad)


def test_attention_integer_mask_is_an_error():
    q, k, v = Tensor([[1.0, 0.0]]), Tensor([[1.0, 0.0], [0.0, 1.0]]), Tensor([[10.0], [20.0]])
    with pytest.raises(TypeError, match=r"attn_mask must be bool .* or float .* got dtypes.int32; .*\.bool\(\)"):
        q.scaled_dot_product_attention(k, v, attn_mask=Tensor([[1, 0]], dtype=dtypes.int32))
    assert q.scaled_dot_product_attention(k, v, attn_mask=Tensor([[True, False]])).item() == 10.0


# ---- losses ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss",
    [
        lambda x: x.cross_entropy(Tensor([0, 1, 2, 0]), reduction="avg"),
        lambda x: x.cross_entropy(Tensor(rand(4, 3, low=0)), reduction="avg"),
        lambda x: x.sparse_categorical_crossentropy(Tensor([0, 1, 2, 0]), reduction="avg"),
        lambda x: x.binary_crossentropy(Tensor(rand(4, 3, low=0)), reduction="avg"),
        lambda x: x.binary_crossentropy_logits(Tensor(rand(4, 3, low=0)), reduction="avg"),
        lambda x: x.nll_loss(Tensor([0, 1, 2, 0]), reduction="avg"),
    ],
)
def test_loss_reduction_names(loss):
    with pytest.raises(ValueError, match=r"\w+: reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        loss(Tensor(rand(4, 3, low=0.1, high=0.9)))


def test_losses_need_a_class_axis():
    for name, call in [
        ("cross_entropy", lambda: Tensor(1.0).cross_entropy(Tensor(0))),
        ("nll_loss", lambda: Tensor(1.0).nll_loss(Tensor(0))),
        ("sparse_categorical_crossentropy", lambda: Tensor(1.0).sparse_categorical_crossentropy(Tensor(0))),
    ]:
        with pytest.raises(ValueError, match=rf"{name}: the input needs a class axis: give it shape \(.*C"):
            call()


def test_cross_entropy_unbatched(torch):
    logits = rand(5, seed=1)
    theirs = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(3))
    close(Tensor(logits).cross_entropy(Tensor(3)), theirs)


@pytest.mark.parametrize("smoothing", [1.5, -0.1])
def test_label_smoothing_range(smoothing):
    logits = Tensor(rand(4, 3))
    for call in [
        lambda: logits.cross_entropy(Tensor([0, 1, 2, 0]), label_smoothing=smoothing),
        lambda: logits.cross_entropy(Tensor(rand(4, 3, low=0)), label_smoothing=smoothing),
        lambda: logits.sparse_categorical_crossentropy(Tensor([0, 1, 2, 0]), label_smoothing=smoothing),
    ]:
        with pytest.raises(ValueError, match=rf"label_smoothing must be between 0.0 and 1.0, got {smoothing}"):
            call()


def test_label_smoothing_one(torch):
    logits, labels = rand(4, 3), np.array([0, 1, 2, 0])
    theirs = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels), label_smoothing=1.0)
    close(Tensor(logits).cross_entropy(Tensor(labels), label_smoothing=1.0), theirs)


def test_cross_entropy_bool_labels():
    with pytest.raises(TypeError, match="cross_entropy: labels must be integer class indices, got dtypes.bool"):
        Tensor(rand(2, 3)).cross_entropy(Tensor([True, False]))


@pytest.mark.parametrize(
    "name, noun, call",
    [
        ("binary_crossentropy", "probabilities", lambda x, y: x.binary_crossentropy(y)),
        ("binary_cross_entropy_with_logits", "logits", lambda x, y: x.binary_cross_entropy_with_logits(y)),
        ("binary_cross_entropy_with_logits", "logits", lambda x, y: x.binary_crossentropy_logits(y)),
        ("mse", "input", lambda x, y: x.mse(y)),
    ],
)
def test_loss_target_shape_must_match(name, noun, call):
    x = Tensor(rand(4, 3, low=0.1, high=0.9))
    with pytest.raises(ValueError, match=rf"{name}: target \(4, 1\) must match the {noun} \(4, 3\)"):
        call(x, Tensor(rand(4, 1, low=0)))
    with pytest.raises(TypeError, match=rf"{name}: target must be a Tensor, got float"):
        call(x, 0.5)


def test_bce_with_logits_weight_shapes(torch):
    x = Tensor(rand(4, 3))
    y = Tensor(rand(4, 3, low=0, seed=1))
    for bad in [(2,), (2, 4, 3)]:
        with pytest.raises(ValueError, match=rf"with_logits: weight \({bad[0]},.*must broadcast to the input's shape"):
            x.binary_cross_entropy_with_logits(y, weight=Tensor.ones(*bad))
        with pytest.raises(ValueError, match=r"with_logits: pos_weight .* must broadcast to the input's shape"):
            x.binary_crossentropy_logits(y, pos_weight=Tensor.ones(*bad))
    with pytest.raises(TypeError, match="with_logits: weight must be a Tensor, got float"):
        x.binary_cross_entropy_with_logits(y, weight=0.5)
    # weights that broadcast to the input's shape work, as in torch
    weight, pos_weight = rand(4, 1, low=0, seed=2), rand(3, low=0, seed=3)
    ours = x.binary_cross_entropy_with_logits(y, weight=Tensor(weight), pos_weight=Tensor(pos_weight))
    theirs = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.tensor(x.numpy()),
        torch.tensor(y.numpy()),
        weight=torch.tensor(weight),
        pos_weight=torch.tensor(pos_weight),
    )
    close(ours, theirs)


# ---- layers ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1), (1, 3, 1, 1)])
def test_batchnorm_one_value_per_channel(torch, shape):
    x = rand(*shape)
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel"):
        torch.nn.BatchNorm1d(3).train()(torch.tensor(x).reshape(1, 3, -1))
    Tensor.training = True
    layer = nn.BatchNorm(3)
    with pytest.raises(
        ValueError, match=rf"BatchNorm: expected more than 1 value per channel .* got input {re.escape(str(shape))}"
    ):
        layer(Tensor(x))
    close(layer.running_var, np.ones(3, np.float32))  # untouched
    Tensor.training = False
    with pytest.raises(ValueError, match="BatchNorm: expected more than 1 value per channel"):
        nn.BatchNorm(3, track_running_stats=False)(Tensor(x))
    # eval mode with running statistics normalizes a single value fine, as in torch
    module = torch.nn.BatchNorm2d(3).eval() if len(shape) == 4 else torch.nn.BatchNorm1d(3).eval()
    close(nn.BatchNorm(3)(Tensor(x)), module(torch.tensor(x)))


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_empty_batch_keeps_running_statistics(torch, momentum):
    """torch counts an empty batch but leaves the running statistics as they were (not NaN)."""
    x = rand(4, 3, seed=5)
    ours, theirs = nn.BatchNorm(3, momentum=momentum), torch.nn.BatchNorm1d(3, momentum=momentum).train()
    Tensor.training = True
    for batch in (np.zeros((0, 3), np.float32), x):
        assert ours(Tensor(batch)).shape == tuple(theirs(torch.tensor(batch)).shape)
    close(ours.running_mean, theirs.running_mean)
    close(ours.running_var, theirs.running_var)
    assert ours.num_batches_tracked.numpy()[0] == theirs.num_batches_tracked.item() == 2


@pytest.mark.parametrize("dtype", [dtypes.bool, dtypes.float32])
def test_embedding_needs_integer_indices(dtype):
    with pytest.raises(TypeError, match=rf"Embedding: indices must be integers, got {dtype}; cast them with .int\(\)"):
        nn.Embedding(3, 4)(Tensor([1], dtype=dtype))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
def test_linear_with_no_inputs(torch):
    layer = nn.Linear(0, 4)
    assert layer.weight.shape == (4, 0)
    module = torch.nn.Linear(0, 4)  # (torch warns that initializing it is a no-op: its bias is zeros)
    close(layer.bias, module.bias)
    close(layer(Tensor.ones(2, 0)), module(torch.ones(2, 0)))


def test_conv_with_no_input_channels_constructs():
    assert nn.Conv2d(0, 4, 3).weight.shape == (4, 0, 3, 3)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: nn.Conv2d(3, 4, 0), r"Conv2d: kernel_size must be positive, got 0"),
        (lambda: nn.Conv1d(3, 4, -1), r"Conv1d: kernel_size must be positive, got -1"),
        (lambda: nn.ConvTranspose2d(3, 4, (0, 2)), r"ConvTranspose2d: kernel_size must be positive, got \(0, 2\)"),
        (lambda: nn.Conv3d(3, 4, (1, 0, 1)), r"Conv3d: kernel_size must be positive, got \(1, 0, 1\)"),
        (lambda: nn.Conv2d(3, 4, 3, groups=0), r"Conv2d: groups must be a positive int, got 0"),
    ],
)
def test_conv_layer_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()
