"""Fixes from a bug hunt against torch: the gradient of binary cross-entropy at probabilities of exactly 0 and 1,
float16 normalization layers, torch's argument order for the transposed convolutions and BatchNorm, NumPy integer
arguments, a parameter given twice to an optimizer, the precision of tanh, elu, softplus and the losses on logits,
attention's dropout, error messages that name the caller's layer and shapes, and interpolate's default mode.

Every shape is small: the file runs on any device, including the slow PYTHON emulator.
"""

import math

import numpy as np
import pytest
from test_nn import _not_training, close, rand  # noqa: F401 (the eval-mode fixture and helpers, shared)

from lazygrad import Tensor, dtypes, nn
from lazygrad.nn import optim


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


# ---- binary cross-entropy at certain probabilities -----------------------------------------------------------------

PROBABILITIES = np.array([0.0, 1.0, 1.0, 0.0, 0.3, 1e-13, 1 - 6e-8, 0.5, 1e-30, 0.9999], np.float32)
TARGETS = np.array([1.0, 0.0, 1.0, 0.0, 0.7, 0.5, 0.2, 0.0, 1.0, 1.0], np.float32)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_binary_crossentropy_at_certain_probabilities_is_torchs(torch, reduction):
    """p of exactly 0 or 1 (right or wrong), and p whose p(1 - p) is below torch's 1e-12: the value and the gradient
    (p - y) / max(p (1 - p), 1e-12), where the clamped log's inf slope gave NaN."""
    p = Tensor(PROBABILITIES, requires_grad=True)
    ours = p.binary_crossentropy(Tensor(TARGETS), reduction=reduction)
    tp = torch.tensor(PROBABILITIES, requires_grad=True)
    theirs = torch.nn.functional.binary_cross_entropy(tp, torch.tensor(TARGETS), reduction=reduction)
    upstream = rand(*theirs.shape, seed=5)
    (ours * Tensor(upstream)).sum().backward()
    (theirs * torch.tensor(upstream)).sum().backward()
    close(ours, theirs)
    close(p.grad, tp.grad, rtol=1e-5, atol=1e-6)


def test_binary_crossentropy_of_a_saturated_sigmoid_has_a_finite_gradient(torch):
    """sigmoid(20) is exactly 1.0 in float32: one confident right prediction made the whole gradient NaN."""
    logits = np.array([20.0, -20.0, 3.0], np.float32)
    x, tx = Tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    x.sigmoid().binary_crossentropy(Tensor([1.0, 0.0, 1.0])).backward()
    torch.nn.functional.binary_cross_entropy(tx.sigmoid(), torch.tensor([1.0, 0.0, 1.0])).backward()
    close(x.grad, tx.grad, atol=1e-9)


def test_binary_crossentropy_of_a_sigmoid_near_saturation_has_torchs_gradient(torch):
    """A VAE's loss, BCE(sigmoid(x), y): sigmoid's slope is p(1 - p) of its rounded output, as torch's, so that it
    cancels against the loss's 1/(1 - p). The exact slope gave 0.94 for 1.0 at 16, and 41399 at 17 (p is 1.0)."""
    logits = np.array([10.0, 16.0, 16.5, 17.0, 20.0, -16.5, -17.0], np.float32)
    for target in (0.0, 0.3, 1.0):
        y = np.full_like(logits, target)
        x, tx = Tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
        x.sigmoid().binary_crossentropy(Tensor(y), reduction="sum").backward()
        torch.nn.functional.binary_cross_entropy(tx.sigmoid(), torch.tensor(y), reduction="sum").backward()
        close(x.grad, tx.grad, rtol=1e-6, atol=1e-9)
    x, tx = Tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    (1 - x.sigmoid()).log().sum().backward()
    (1 - tx.sigmoid()).log().sum().backward()
    close(x.grad, tx.grad, rtol=1e-6, atol=1e-9)
    # and a gradient of the gradient stays sigmoid's second derivative, p (1 - p) (1 - 2p)
    values = np.array([-3.0, -0.5, 0.0, 1.5, 4.0], np.float32)
    x, tx = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    (slope,) = x.sigmoid().sum().gradient(x)
    (curvature,) = slope.sum().gradient(x)
    (torch_slope,) = torch.autograd.grad(tx.sigmoid().sum(), tx, create_graph=True)
    (torch_curvature,) = torch.autograd.grad(torch_slope.sum(), tx)
    close(curvature, torch_curvature, rtol=1e-5, atol=1e-7)


def test_binary_crossentropy_target_gradient_and_half():
    """The targets' gradient is the clamped logs' difference (finite); in half the edge test runs in float32."""
    p = Tensor([0.0, 1.0, 0.3], requires_grad=True)
    y = Tensor([1.0, 0.0, 0.7], requires_grad=True)
    p.binary_crossentropy(y, reduction="sum").backward()
    np.testing.assert_allclose(y.grad.numpy(), [100.0, -100.0, math.log(0.7 / 0.3)], rtol=1e-5)
    half = Tensor(np.array([0, 1, 0.3, 1], np.float16), requires_grad=True)
    loss = half.binary_crossentropy(Tensor(np.array([1, 0, 0.7, 1], np.float16)), reduction="none")
    loss.sum().backward()
    assert loss.dtype == dtypes.float16
    np.testing.assert_allclose(loss.numpy(), [100, 100, 0.95, 0], rtol=2e-3)
    grad = half.grad.numpy()
    assert grad[0] == -np.inf and grad[1] == np.inf and grad[3] == 0 and np.isfinite(grad[2])


# ---- float16 normalization -----------------------------------------------------------------------------------------


def wide_half(*shape, seed=0, scale=300.0) -> np.ndarray:
    """Half values spread far enough that a deviation squared overflows half (above 256)."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float16)


def test_half_layernorm_with_large_deviations(torch):
    x = np.array([[300.0, -300, 0, 10], [1000, -2000, 5, 7]], np.float16)
    out = Tensor(x).layernorm()
    assert out.dtype == dtypes.float16
    close(out.float(), torch.nn.functional.layer_norm(torch.tensor(x).float(), (4,)), rtol=2e-3, atol=2e-3)
    # the gradient runs through the float32 computation too: finite, and as torch's float32 one
    ours, theirs = Tensor(x, requires_grad=True), torch.tensor(x.astype(np.float32), requires_grad=True)
    upstream = rand(2, 4, seed=3)
    (ours.layernorm().float() * Tensor(upstream)).sum().backward()
    (torch.nn.functional.layer_norm(theirs, (4,)) * torch.tensor(upstream)).sum().backward()
    close(ours.grad.float(), theirs.grad, rtol=1e-2, atol=1e-5)


def test_half_layer_and_group_norm_layers(torch):
    x = wide_half(2, 4, 8)
    close(nn.LayerNorm(8)(Tensor(x)), torch.nn.LayerNorm(8)(torch.tensor(x).float()), rtol=2e-3, atol=2e-3)
    close(nn.GroupNorm(2, 4)(Tensor(x)), torch.nn.GroupNorm(2, 4)(torch.tensor(x).float()), rtol=2e-3, atol=2e-3)


def test_half_batchnorm_train_and_eval(torch):
    """Batch statistics in float32: the output was zeros and running_var inf. The output is half, as torch's."""
    x = wide_half(4, 3, 4, 4)
    layer, module = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    with Tensor.train():
        out = layer(Tensor(x))
    assert out.dtype == dtypes.float16 and layer(Tensor(x)).dtype == dtypes.float16
    expected = module(torch.tensor(x).float())
    close(out, expected, rtol=2e-3, atol=2e-3)
    close(layer.running_mean, module.running_mean, rtol=1e-4)
    close(layer.running_var, module.running_var, rtol=1e-4)
    module.eval()
    close(layer(Tensor(x)), module(torch.tensor(x).float()), rtol=2e-3, atol=2e-3)
    bare = nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    close(
        bare(Tensor(x)), torch.nn.functional.batch_norm(torch.tensor(x).float(), None, None, training=True), 2e-3, 2e-3
    )


# ---- torch's argument order ----------------------------------------------------------------------------------------


def copy_weights(layer, module, torch) -> None:
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(layer.weight.numpy()))
        if layer.bias is not None:
            module.bias.copy_(torch.from_numpy(layer.bias.numpy()))


@pytest.mark.parametrize(
    "make, args, shape",
    [
        ("ConvTranspose2d", (4, 2, 3, 2, 1, 1), (1, 4, 5, 5)),  # stride 2, padding 1, output_padding 1: 2x upsampling
        ("ConvTranspose2d", (4, 6, 3, 2, 1, 1, 2, False, 2), (1, 4, 4, 4)),  # + groups, bias, dilation
        ("ConvTranspose1d", (2, 3, 3, 2, 0, 1, 1, True, 2), (2, 2, 5)),
        ("ConvTranspose3d", (2, 2, 2, 2, 1, 1), (1, 2, 3, 3, 3)),
        ("Conv2d", (4, 6, 3, 2, 1, 2, 2, False), (1, 4, 7, 7)),  # stride, padding, dilation, groups, bias
    ],
)
def test_conv_layers_take_torchs_positional_arguments(torch, make, args, shape):
    layer, module = getattr(nn, make)(*args), getattr(torch.nn, make)(*args)
    copy_weights(layer, module, torch)
    x = rand(*shape)
    close(layer(Tensor(x)), module(torch.tensor(x)))


def test_batchnorm_takes_torchs_positional_arguments(torch):
    """(num_features, eps, momentum, affine, track_running_stats): a positional momentum was taken as `affine`."""
    layer, module = nn.BatchNorm2d(3, 1e-3, 0.5), torch.nn.BatchNorm2d(3, 1e-3, 0.5)
    assert layer.momentum == 0.5 and layer.eps == 1e-3
    x = rand(4, 3, 2, 2)
    with Tensor.train():
        close(layer(Tensor(x)), module(torch.tensor(x)))
    close(layer.running_mean, module.running_mean)
    close(layer.running_var, module.running_var)
    assert nn.BatchNorm2d(3, 1e-5, 0.1, False).weight is None


def test_numpy_integers_are_accepted_as_sizes(torch):
    """Any integral, as torch takes it: 'numpy.int64' object is not iterable, or needs one int ... got np.int64(2)."""
    i = np.int64
    x = rand(1, 4, 8, 8)
    layer = nn.Conv2d(i(4), i(6), i(3), i(2), np.int32(1), groups=i(2))
    module = torch.nn.Conv2d(4, 6, 3, 2, 1, groups=2)
    copy_weights(layer, module, torch)
    close(layer(Tensor(x)), module(torch.tensor(x)))
    transposed, module = nn.ConvTranspose2d(i(4), i(2), (i(3), 3), stride=i(2)), torch.nn.ConvTranspose2d(4, 2, 3, 2)
    copy_weights(transposed, module, torch)
    close(transposed(Tensor(x)), module(torch.tensor(x)))
    weight = rand(6, 4, 3, 3, seed=1)
    out = Tensor(x).conv2d(Tensor(weight), stride=i(2), padding=(i(1), i(0)), groups=i(1))
    close(out, torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(weight), stride=2, padding=(1, 0)))
    close(Tensor(x).max_pool2d(i(2)), torch.nn.functional.max_pool2d(torch.tensor(x), 2))
    close(Tensor(x).avg_pool2d(i(2), stride=(i(1), 2)), torch.nn.functional.avg_pool2d(torch.tensor(x), 2, (1, 2)))
    resized = Tensor(x).interpolate(size=(i(16), 8), mode="bilinear")
    close(resized, torch.nn.functional.interpolate(torch.tensor(x), size=(16, 8), mode="bilinear"))
    with pytest.raises(ValueError, match=r"conv2d: stride needs one int or 2 ints .* got True"):
        Tensor(x).conv2d(Tensor(weight), stride=True)


# ---- optimizers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [optim.SGD, optim.Adam, optim.AdamW])
def test_optimizer_refuses_a_parameter_given_twice(make):
    """It failed at step() with an internal scheduler error about a buffer read before and after an assign."""
    w, b = Tensor.randn(3, 4, requires_grad=True), Tensor.randn(4, requires_grad=True)
    with pytest.raises(ValueError, match=r"parameter 2 \(shape \(3, 4\), dtypes.float32\) is the same tensor as "):
        make([w, b, w])
    w.realize()
    with pytest.raises(ValueError, match=r"parameter 1 \(shape \(4,\).*shares its memory \(a view\) with parameter 0"):
        make([w, w[0]])
    make([w, b]).step()  # (distinct parameters are fine)


# ---- precision of activations and losses ---------------------------------------------------------------------------

# a wide range: tiny values, the tails, the exp's overflow, infinities and NaN
WIDE = np.array(
    [-np.inf, -1e30, -100, -88, -30, -20, -17, -10, -3, -1, -0.7, -0.6, -1e-3, -1e-6, -1e-8, -1e-30, 0]
    + [1e-30, 1e-8, 1e-6, 1e-3, 0.6, 0.7, 1, 3, 10, 17, 20, 30, 88, 100, 1e30, np.inf, np.nan],
    np.float32,
)


def against_torch_everywhere(torch, ours_fn, theirs_fn, values, rtol=2e-6, grad_rtol=1e-5, grad_atol=1e-37):
    """Values and gradients (for an upstream of ones) against torch's, relative to the magnitude, so the tiny values
    and the tails count as much as the others; NaN gives NaN (its gradient is left out: torch's elu gives 1 there)."""
    x, tx = Tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)
    out, expected = ours_fn(x), theirs_fn(tx)
    out.sum().backward()
    expected.sum().backward()
    ours, theirs = out.numpy(), expected.detach().numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    number = ~np.isnan(values)
    # (below float32's smallest normal, exp's results are flushed or not, device by device)
    np.testing.assert_allclose(ours[number], theirs[number], rtol=rtol, atol=1e-37)
    np.testing.assert_allclose(x.grad.numpy()[number], tx.grad.numpy()[number], rtol=grad_rtol, atol=grad_atol)


def test_tanh_everywhere(torch):
    """tanh(1e-8) was 0 and tanh(1e-6) 7% off (2·sigmoid(2x) - 1 rounds a small x away)."""
    # (torch's slope, 1 - tanh² in float32, is off by its rounding of 1: 0 past |x| ~ 9, where ours is exact)
    against_torch_everywhere(torch, lambda x: x.tanh(), torch.tanh, WIDE, grad_atol=2.5e-7)
    dense = np.concatenate([np.linspace(-12, 12, 20001), np.logspace(-38, 1, 400), -np.logspace(-38, 1, 400)])
    x = Tensor(dense.astype(np.float32), requires_grad=True)
    out = x.tanh()
    out.sum().backward()
    exact = dense.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(out.numpy(), np.tanh(exact), rtol=3e-7, atol=0)
    np.testing.assert_allclose(x.grad.numpy(), 1 / np.cosh(exact) ** 2, rtol=3e-6, atol=0)


def test_tanh_grad_at_its_saturation():
    """The slope past |x| ~ 9 is the exact 4·exp(-2|x|), not NaN, and 0 at the infinities."""
    x = Tensor([20.0, -20.0, np.inf, -np.inf], requires_grad=True)
    x.tanh().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4 * math.exp(-40), 4 * math.exp(-40), 0, 0], rtol=1e-4)


@pytest.mark.parametrize(
    "name, ours, theirs_name, theirs_kwargs",
    [
        ("elu", lambda x: x.elu(), "elu", {}),
        ("elu alpha", lambda x: x.elu(0.5), "elu", {"alpha": 0.5}),
        ("celu", lambda x: x.celu(2.0), "celu", {"alpha": 2.0}),
        ("selu", lambda x: x.selu(), "selu", {}),
        ("softplus", lambda x: x.softplus(), "softplus", {}),
        ("softplus beta", lambda x: x.softplus(beta=2.0, threshold=5.0), "softplus", {"beta": 2.0, "threshold": 5.0}),
        ("logsigmoid", lambda x: x.logsigmoid(), "logsigmoid", {}),
        ("mish", lambda x: x.mish(), "mish", {}),
        ("gelu", lambda x: x.gelu(), "gelu", {"approximate": "tanh"}),
    ],
)
def test_activations_keep_their_tails_and_tiny_values(torch, name, ours, theirs_name, theirs_kwargs):
    """elu(-1e-8) was 0 (exp(x) - 1), softplus(-20) and logsigmoid(20) were 0 (log(1 + ...)): torch's are exact."""
    theirs = getattr(torch.nn.functional, theirs_name)
    # (torch's own gelu subtracts in 1 + tanh(z), losing the far negative tail; compared where it keeps its digits)
    values = WIDE[(WIDE > -5) | np.isnan(WIDE)] if name == "gelu" else WIDE
    # our exp is within a few ulp of float32's rounding, and a tail of 20 multiplies its error (as torch's log does)
    against_torch_everywhere(torch, ours, lambda x: theirs(x, **theirs_kwargs), values, rtol=2e-5, grad_rtol=3e-5)


def test_tail_values_exactly():
    np.testing.assert_allclose(Tensor([-1e-8, -1e-6]).elu().numpy(), np.expm1([-1e-8, -1e-6]), rtol=1e-6)
    np.testing.assert_allclose(Tensor([-20.0, -30.0]).softplus().numpy(), np.log1p(np.exp([-20.0, -30.0])), rtol=1e-5)
    np.testing.assert_allclose(Tensor([20.0]).logsigmoid().numpy(), [-np.log1p(np.exp(-20.0))], rtol=1e-5)


def test_binary_cross_entropy_with_logits_keeps_a_confident_right_logits_loss(torch):
    """x=17, y=1 costs 4.1e-8, not 0."""
    logits = np.array([17.0, -17.0, 30.0, -30.0, 0.5, 100.0], np.float32)
    targets = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], np.float32)
    x, tx = Tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    ours = x.binary_cross_entropy_with_logits(Tensor(targets), reduction="none")
    theirs = torch.nn.functional.binary_cross_entropy_with_logits(tx, torch.tensor(targets), reduction="none")
    ours.sum().backward()
    theirs.sum().backward()
    close(ours, theirs, rtol=2e-5, atol=0)
    # (the slope, σ(x) - y, sums terms near 1 here as in torch: within an ulp of 1)
    close(x.grad, tx.grad, rtol=2e-5, atol=1.2e-7)


def kernels_of(fn, shape=(4096, 4096)) -> int:
    """The kernels of a forward and backward pass (scheduled, not run)."""
    x = Tensor.empty(*shape, requires_grad=True)
    out = fn(x)
    out.sum().backward()
    return len(out.schedule(x.grad))


def test_precise_activations_take_no_more_kernels():
    """The accurate forms cost no more kernels than the ones they replaced, on a large input (where the scheduler
    gives costly shared values buffers of their own)."""
    assert kernels_of(lambda x: x.tanh()) <= kernels_of(lambda x: 2.0 * (2.0 * x).sigmoid() - 1.0)
    old_softplus = lambda x: (x >= 0).where(x, 0) + (1 + x._negative_magnitude().exp()).log()  # noqa: E731
    assert kernels_of(lambda x: x.softplus()) <= kernels_of(lambda x: (x > 20).where(x, old_softplus(x)))
    old_tanh = lambda x: 2.0 * (2.0 * x).sigmoid() - 1.0  # noqa: E731
    # (8, as with the sigmoid form before sigmoid's slope was taken from its output: that form now takes 6)
    assert kernels_of(lambda x: x.mish()) <= 8
    # sigmoid's slope from its output: its forward and backward took 6 kernels, silu's 7
    assert kernels_of(lambda x: x.sigmoid()) <= 2 and kernels_of(lambda x: x.silu()) <= 3
    assert kernels_of(lambda x: x.gelu()) <= kernels_of(
        lambda x: 0.5 * x * (1 + old_tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    )


# ---- attention's dropout -------------------------------------------------------------------------------------------


def test_attention_dropout_applies_outside_training(torch):
    """torch drops whenever dropout_p > 0; it was ignored unless Tensor.training."""
    q, k, v = Tensor(rand(2, 8, 4)), Tensor(rand(2, 8, 4, seed=1)), Tensor(rand(2, 8, 3, seed=2))
    assert not Tensor.training
    plain = q.scaled_dot_product_attention(k, v).numpy()
    assert not np.allclose(q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy(), plain)
    dropped = q.scaled_dot_product_attention(k, v, dropout_p=1.0).numpy()
    theirs = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(t.numpy()) for t in (q, k, v)), dropout_p=1.0
    )
    close(dropped, theirs)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: dropout_p must be in \[0, 1\], got 1.5"):
        q.scaled_dot_product_attention(k, v, dropout_p=1.5)


# ---- errors that name the caller's layer and shapes ----------------------------------------------------------------


def test_errors_name_the_layer_and_the_shapes_given():
    with pytest.raises(ValueError, match=r"^Conv2d: kernel \(5, 5\) .* does not fit the padded input \(1, 3, 3, 3\)"):
        nn.Conv2d(3, 4, 5)(Tensor.zeros(1, 3, 3, 3))
    with pytest.raises(ValueError, match=r"^ConvTranspose2d: the output would be empty"):
        nn.ConvTranspose2d(3, 4, 1, padding=2)(Tensor.zeros(1, 3, 2, 2))
    with pytest.raises(ValueError, match=r"cross_entropy: logits \(2, 5, 3\) \(N, C, \.\.\.\) need class indices of "):
        Tensor.zeros(2, 5, 3).cross_entropy(Tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^scaled_dot_product_attention: key \(2, 5, 4\) and value \(2, 6, 4\) need"):
        Tensor.zeros(2, 3, 4).scaled_dot_product_attention(Tensor.zeros(2, 5, 4), Tensor.zeros(2, 6, 4))
    with pytest.raises(ValueError, match=r"^scaled_dot_product_attention: the batch axes .* pass enable_gqa=True"):
        Tensor.zeros(1, 4, 3, 2).scaled_dot_product_attention(Tensor.zeros(1, 2, 5, 2), Tensor.zeros(1, 2, 5, 2))


# ---- interpolate ---------------------------------------------------------------------------------------------------


def test_interpolate_defaults_to_nearest_as_torch(torch):
    x = rand(1, 2, 3, 4)
    close(Tensor(x).interpolate(scale_factor=2), torch.nn.functional.interpolate(torch.tensor(x), scale_factor=2))
    close(Tensor(x).interpolate((5, 7)), torch.nn.functional.interpolate(torch.tensor(x), (5, 7)))


# ---- cross_entropy's weight and ignore_index, the L1 losses, RMSNorm, Embedding's padding_idx -----------------------


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_weight_and_ignore_index(torch, reduction, smoothing):
    logits, weight = rand(3, 4, 2, low=-3, high=3), rand(4, low=0.1, high=2.0, seed=1)
    labels = np.array([[0, 3], [7, 1], [2, 7]], np.int64)
    x, tx = Tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
    options = {"reduction": reduction, "label_smoothing": smoothing}
    ours = x.cross_entropy(Tensor(labels), weight=Tensor(weight), ignore_index=7, **options)
    theirs = torch.nn.functional.cross_entropy(
        tx, torch.tensor(labels), weight=torch.tensor(weight), ignore_index=7, **options
    )
    ours.sum().backward()
    theirs.sum().backward()
    close(ours, theirs)
    close(x.grad, tx.grad)


def test_cross_entropy_weight_with_probabilities(torch):
    logits, weight = rand(3, 4, low=-3, high=3), rand(4, low=0.1, high=2.0, seed=1)
    probs = np.random.default_rng(2).dirichlet(np.ones(4), size=3).astype(np.float32)
    ours = Tensor(logits).cross_entropy(Tensor(probs), weight=Tensor(weight), label_smoothing=0.1)
    theirs = torch.nn.functional.cross_entropy(
        torch.tensor(logits), torch.tensor(probs), weight=torch.tensor(weight), label_smoothing=0.1
    )
    close(ours, theirs)
    with pytest.raises(ValueError, match=r"cross_entropy: weight needs one float per class, shape \(4,\)"):
        Tensor(logits).cross_entropy(Tensor([0, 1, 2]), weight=Tensor([1.0, 2.0]))


L1_LOSSES = [
    ("l1_loss", {}),
    ("smooth_l1_loss", {}),
    ("smooth_l1_loss", {"beta": 0.5}),
    ("smooth_l1_loss", {"beta": 2.0}),
    ("smooth_l1_loss", {"beta": 0.0}),
    ("huber_loss", {}),
    ("huber_loss", {"delta": 0.5}),
    ("huber_loss", {"delta": 2.0}),
]


@pytest.mark.parametrize("name, scale", L1_LOSSES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_l1_losses(torch, name, scale, reduction):
    options = {"reduction": reduction, **scale}
    prediction, target = rand(3, 5, low=-3, high=3), rand(3, 5, low=-3, high=3, seed=1)
    target[0, :2] = prediction[0, :2]  # (equal values: the slope there is 0, as torch's)
    x, tx = Tensor(prediction, requires_grad=True), torch.tensor(prediction, requires_grad=True)
    ours = getattr(x, name)(Tensor(target), **options)
    theirs = getattr(torch.nn.functional, name)(tx, torch.tensor(target), **options)
    ours.sum().backward()
    theirs.sum().backward()
    close(ours, theirs)
    close(x.grad, tx.grad)


@pytest.mark.parametrize("shape, normalized, eps", [((2, 3, 4), 4, None), ((2, 3, 4), (3, 4), 1e-3)])
def test_rmsnorm(torch, shape, normalized, eps):
    layer, module = nn.RMSNorm(normalized, eps=eps), torch.nn.RMSNorm(normalized, eps=eps)
    layer.weight = Tensor(rand(*module.weight.shape, seed=4))
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(layer.weight.numpy()))
    x, tx = Tensor(rand(*shape), requires_grad=True), torch.tensor(rand(*shape), requires_grad=True)
    upstream = rand(*shape, seed=9)
    ours, theirs = layer(x), module(tx)
    (ours * Tensor(upstream)).sum().backward()
    (theirs * torch.tensor(upstream)).sum().backward()
    close(ours, theirs)
    close(x.grad, tx.grad)
    close(layer.weight.grad, module.weight.grad)
    wide = wide_half(2, 8)  # (half, in float32: its squares overflow past 256)
    close(nn.RMSNorm(8)(Tensor(wide)).float(), torch.nn.RMSNorm(8)(torch.tensor(wide).float()), 2e-3, 2e-3)


@pytest.mark.parametrize("padding_idx", [1, -1])
def test_embedding_padding_idx(torch, padding_idx):
    """The padding row starts at zeros, its lookups give it, and no gradient reaches it."""
    layer, module = nn.Embedding(5, 3, padding_idx=padding_idx), torch.nn.Embedding(5, 3, padding_idx=padding_idx)
    row = padding_idx % 5
    assert not layer.weight.numpy()[row].any()
    values = rand(5, 3, seed=2)
    layer.weight = Tensor(values, requires_grad=True)
    with torch.no_grad():
        module.weight.copy_(torch.tensor(values))
    idx = np.array([[0, row, 2], [row, 4, 0]], np.int64)
    ours, theirs = layer(Tensor(idx)), module(torch.tensor(idx))
    upstream = rand(2, 3, 3, seed=3)
    (ours * Tensor(upstream)).sum().backward()
    (theirs * torch.tensor(upstream)).sum().backward()
    close(ours, theirs)
    close(layer.weight.grad, module.weight.grad)
    with pytest.raises(ValueError, match=r"Embedding: padding_idx must be an int in \[-5, 5\)"):
        nn.Embedding(5, 3, padding_idx=5)
