"""Neural-network ops against PyTorch, values and gradients: N-d convolution and transposed convolution, pooling
(ceil_mode, count_include_pad, return_indices, dilation) and unpooling, interpolate, pad modes, nll_loss,
binary_cross_entropy_with_logits with pos_weight, attention with grouped key/value heads, the weight initializers
and the layers that use them. The same file runs on every device; tensors stay small."""

import numpy as np
import pytest
from test_ops import assert_tensor, data
from test_ops_backward import compare_backward

from lazygrad import Tensor, dtypes, nn

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def against_torch(function, torch_function, *arrays, tolerance=None):
    """Values and the gradients of every input, lazygrad against torch."""
    compare_backward(list(arrays), function, torch_function, tolerance or TOLERANCE, np.random.default_rng(1))


def distinct(*shape, seed=0) -> np.ndarray:
    """Values that differ from each other (so max has one winner per window, as torch's gradient assumes)."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    return (rng.permutation(size) * 0.1 - size * 0.05).reshape(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# convolution

CONVOLUTIONS = [
    # (spatial input shape, kernel, keyword arguments)
    ((7,), (3,), {}),
    ((8,), (2,), {"stride": 2, "padding": 1, "dilation": 2}),
    ((6,), (3,), {"padding": "same"}),
    ((16,), (7,), {"stride": 2, "dilation": 2}),  # a long kernel: windows read through a repeated axis
    ((5, 6), (3, 2), {"stride": (2, 1), "padding": (1, 0)}),
    ((4, 4, 4), (2, 2, 2), {}),
    ((5, 4, 6), (3, 1, 2), {"stride": (1, 2, 2), "padding": 1, "dilation": (2, 1, 1)}),
    ((4, 5, 3), (3, 3, 3), {"padding": "same"}),
]


@pytest.mark.parametrize("spatial, kernel, options", CONVOLUTIONS, ids=[str(c[:2]) for c in CONVOLUTIONS])
@pytest.mark.parametrize("groups", [1, 2])
def test_conv_nd(spatial, kernel, options, groups):
    count = len(spatial)
    x, w, b = data(2, 4, *spatial), data(6, 4 // groups, *kernel, seed=1), data(6, seed=2)
    ours = {1: "conv1d", 2: "conv2d", 3: "conv3d"}[count]
    theirs = getattr(F, ours)
    against_torch(
        lambda x, w, b: getattr(x, ours)(w, b, groups=groups, **options),
        lambda x, w, b: theirs(x, w, b, groups=groups, **options),
        x,
        w,
        b,
    )
    assert_tensor(
        Tensor(x).conv(Tensor(w), Tensor(b), groups, **options),
        theirs(torch.tensor(x), torch.tensor(w), torch.tensor(b), groups=groups, **options).numpy(),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "spatial, kernel, options",
    [
        ((17,), (5,), {"stride": 2, "padding": 1}),
        ((12, 11), (8, 8), {"padding": 2}),
        ((5, 6, 5), (3, 3, 3), {"stride": 2}),
    ],
    ids=["1d", "2d", "3d"],
)
@pytest.mark.parametrize("training", [False, True])
def test_a_convolution_of_many_channels_with_costly_windows(spatial, kernel, options, training):
    # outside training, 16 input channels a group and more, with a stride or a kernel past STACKED_TAPS (7): the
    # windows copied out (an im2col), then a product channels last; in training, the product reads the windows in
    # place (3 kernels: the padded input, the copy and the product, against 2)
    count = len(spatial)
    x, w, b = data(2, 32, *spatial), data(6, 16, *kernel, seed=1), data(6, seed=2)
    ours = {1: "conv1d", 2: "conv2d", 3: "conv3d"}[count]
    with Tensor.train(training):
        against_torch(
            lambda x, w, b: getattr(x, ours)(w, b, groups=2, **options),
            lambda x, w, b: getattr(F, ours)(x, w, b, groups=2, **options),
            x,
            w,
            b,
            tolerance={"rtol": 1e-4, "atol": 1e-4},  # (sums of 400 products near 1)
        )
        made = getattr(Tensor(x), ours)(Tensor(w), Tensor(b), groups=2, **options)
        assert len(made.schedule()) == (2 if training else 3) - ("padding" not in options)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("groups, bias", [(1, True), (2, False)])
def test_float_convolution_builds_the_graph_of_its_steps(dtype, groups, bias):
    # a float convolution builds its product on the nodes: they are the very nodes its steps through tensors make
    x, w = Tensor(data(2, 4, 7, 6, dtype=dtype)), Tensor(data(6, 4 // groups, 3, 2, dtype=dtype, seed=1))
    b = Tensor(data(6, dtype=dtype, seed=2)) if bias else None
    windows = x.pad(((0, 0), (0, 0), (1, 1), (1, 1)))._pool((3, 2), (2, 1), (1, 1))  # (2, 4, 4, 7, 3, 2)
    windows = windows.reshape(2, groups, 4 // groups, 4, 7, 3, 2).permute(0, 1, 3, 4, 2, 5, 6)
    windows = windows.reshape(2, groups, 1, 4, 7, 4 // groups, 3, 2)
    weights = w.reshape(1, groups, 6 // groups, 1, 1, 4 // groups, 3, 2)
    expected = (windows * weights).sum((-3, -2, -1)).reshape(2, 6, 4, 7)
    expected = expected + b.reshape(1, -1, 1, 1) if bias else expected
    assert x.conv2d(w, b, groups=groups, stride=(2, 1), padding=1).uop is expected.uop


def test_conv_errors():
    x = Tensor(data(2, 4, 7))
    with pytest.raises(
        ValueError, match=r"conv1d: need an input \(N, C_in, L\) and a weight .* got \(2, 4, 7\) and \(3, 4, 2, 2\)"
    ):
        x.conv1d(Tensor(data(3, 4, 2, 2)))
    with pytest.raises(ValueError, match=r"conv3d: need an input \(N, C_in, S0, S1, S2\)"):
        x.conv3d(Tensor(data(3, 4, 2)))
    with pytest.raises(ValueError, match=r"conv1d: input \(2, 4, 7\) with groups=3 needs weight"):
        x.conv1d(Tensor(data(3, 4, 2)), groups=3)
    with pytest.raises(ValueError, match=r"conv1d: kernel \(9,\) .* does not fit the padded input \(2, 4, 7\)"):
        x.conv1d(Tensor(data(3, 4, 9)))
    with pytest.raises(ValueError, match="conv1d: padding='same' needs stride 1"):
        x.conv1d(Tensor(data(3, 4, 3)), stride=2, padding="same")
    with pytest.raises(ValueError, match="conv1d: padding must be an int, a tuple, 'valid' or 'same'"):
        x.conv1d(Tensor(data(3, 4, 3)), padding="full")
    with pytest.raises(ValueError, match=r"conv2d: stride needs one int or 2 ints"):
        Tensor(data(1, 4, 5, 5)).conv2d(Tensor(data(2, 4, 3, 3)), stride=(1, 1, 1))


TRANSPOSED = [
    ((5,), (3,), {}),
    ((4,), (3,), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((4,), (2,), {"stride": 3, "dilation": 2}),
    ((3, 4), (3, 2), {"stride": (2, 1), "padding": (1, 0)}),
    ((3, 3), (2, 2), {"stride": 2, "output_padding": (1, 0)}),
    ((2, 3, 2), (2, 2, 2), {"stride": 2, "padding": (0, 1, 0)}),
    # (with a stride: a kernel shorter than it leaves zeros between; taps that land partly or wholly outside)
    ((4,), (1,), {"stride": 3}),
    ((2,), (5,), {"stride": 2, "padding": 3}),
    ((3, 4), (2, 3), {"stride": (2, 3), "dilation": (2, 1), "padding": (1, 2), "output_padding": (1, 0)}),
]


@pytest.mark.parametrize(
    "spatial, kernel, options", TRANSPOSED, ids=[str(c[:2]) + str(i) for i, c in enumerate(TRANSPOSED)]
)
@pytest.mark.parametrize("groups", [1, 2])
def test_conv_transpose_nd(spatial, kernel, options, groups):
    count = len(spatial)
    x, w, b = data(2, 4, *spatial), data(4, 6 // groups, *kernel, seed=1), data(6, seed=2)
    name = f"conv_transpose{count}d"
    against_torch(
        lambda x, w, b: getattr(x, name)(w, b, groups=groups, **options),
        lambda x, w, b: getattr(F, name)(x, w, b, groups=groups, **options),
        x,
        w,
        b,
    )


def test_conv_transpose_errors():
    x = Tensor(data(2, 4, 5))
    with pytest.raises(ValueError, match=r"conv_transpose1d: input \(2, 4, 5\) needs weight \(4, C_out/groups, ...\)"):
        x.conv_transpose1d(Tensor(data(3, 2, 3)))
    with pytest.raises(ValueError, match=r"output_padding \(2,\) must be smaller than the stride \(2,\)"):
        x.conv_transpose1d(Tensor(data(4, 2, 3)), stride=2, output_padding=2)


def test_conv_layers():
    for layer_type, module_type, shape in [
        (nn.Conv1d, torch.nn.Conv1d, (2, 4, 9)),
        (nn.Conv3d, torch.nn.Conv3d, (1, 4, 5, 4, 6)),
        (nn.ConvTranspose1d, torch.nn.ConvTranspose1d, (2, 4, 5)),
        (nn.ConvTranspose2d, torch.nn.ConvTranspose2d, (1, 4, 3, 4)),
        (nn.ConvTranspose3d, torch.nn.ConvTranspose3d, (1, 4, 2, 3, 2)),
    ]:
        layer = layer_type(4, 6, 3, stride=2, padding=1, groups=2)
        module = module_type(4, 6, 3, stride=2, padding=1, groups=2)
        assert tuple(module.weight.shape) == layer.weight.shape
        with torch.no_grad():
            module.weight.copy_(torch.tensor(layer.weight.numpy()))
            module.bias.copy_(torch.tensor(layer.bias.numpy()))
        x = data(*shape)
        assert_tensor(layer(Tensor(x)), module(torch.tensor(x)).detach().numpy(), atol=1e-5)
        # torch's fan-in is the weight's dimension 1 times the kernel, for both kinds
        bound = 1 / np.sqrt(np.prod(layer.weight.shape[1:]))
        assert 0.5 * bound < np.abs(layer.weight.numpy()).max() <= bound
    with pytest.raises(ValueError, match=r"Conv1d: expected input of shape \(N, 4, L\), got \(2, 3, 9\)"):
        nn.Conv1d(4, 6, 3)(Tensor(data(2, 3, 9)))


# ---------------------------------------------------------------------------------------------------------------------
# pooling

POOLS = [
    # (input shape, kernel, keyword arguments shared by both libraries)
    ((1, 2, 7), 3, {"stride": 2, "ceil_mode": True}),
    ((2, 1, 5, 7), 2, {"ceil_mode": True}),
    ((2, 1, 5, 7), (3, 2), {"stride": (2, 3), "padding": (1, 1), "ceil_mode": True}),
    ((1, 2, 6, 6), 3, {"stride": 2, "padding": 1}),
    ((1, 1, 4, 5, 6), 2, {"stride": (1, 2, 2), "ceil_mode": True}),
]


@pytest.mark.parametrize("shape, kernel, options", POOLS, ids=range(len(POOLS)))
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool(shape, kernel, options, count_include_pad):
    name = f"avg_pool{len(shape) - 2}d"
    against_torch(
        lambda x: getattr(x, name)(kernel, **options, count_include_pad=count_include_pad),
        lambda x: getattr(F, name)(x, kernel, **options, count_include_pad=count_include_pad),
        data(*shape),
    )


@pytest.mark.parametrize("shape, kernel, options", POOLS, ids=range(len(POOLS)))
@pytest.mark.parametrize("dilation", [1, 2])
def test_max_pool_with_indices(shape, kernel, options, dilation):
    name = f"max_pool{len(shape) - 2}d"
    x = distinct(*shape)
    if any(size < 2 * (k - 1) + 1 for size, k in zip(shape[2:], np.broadcast_to(kernel, len(shape) - 2))):
        pytest.skip("the dilated kernel does not fit")
    against_torch(
        lambda x: getattr(x, name)(kernel, **options, dilation=dilation),
        lambda x: getattr(F, name)(x, kernel, **options, dilation=dilation),
        x,
    )
    values, indices = getattr(Tensor(x), name)(kernel, **options, dilation=dilation, return_indices=True)
    expected_values, expected_indices = getattr(F, name)(
        torch.tensor(x), kernel, **options, dilation=dilation, return_indices=True
    )
    assert_tensor(values, expected_values.numpy())
    assert_tensor(indices, expected_indices.numpy(), dtype=dtypes.int64)  # int64 as in PyTorch


def test_max_pool_ties_pick_the_first_index():
    x = np.zeros((1, 1, 2, 4), np.float32)
    _, indices = Tensor(x).max_pool2d(2, return_indices=True)
    assert_tensor(indices, F.max_pool2d(torch.tensor(x), 2, return_indices=True)[1].numpy(), dtype=dtypes.int64)


def test_max_unpool2d():
    x = distinct(2, 2, 6, 5)
    values, indices = Tensor(x).max_pool2d(2, stride=2, return_indices=True)
    expected_values, expected_indices = F.max_pool2d(torch.tensor(x), 2, stride=2, return_indices=True)
    expected = F.max_unpool2d(expected_values, expected_indices, 2, stride=2, output_size=(6, 5))
    assert_tensor(values.max_unpool2d(indices, 2, stride=2, output_size=(6, 5)), expected.numpy())
    indices_array = expected_indices.numpy()
    against_torch(
        lambda v: v.max_unpool2d(Tensor(indices_array), 2, output_size=(6, 5)),
        lambda v: F.max_unpool2d(v, torch.tensor(indices_array), 2, output_size=(6, 5)),
        expected_values.numpy(),
    )
    with pytest.raises(ValueError, match=r"max_unpool2d: index 30 is outside the output plane \(6, 4\)"):
        values.max_unpool2d(Tensor(np.full(values.shape, 30, np.int32)), 2)
    with pytest.raises(ValueError, match=r"max_unpool2d: output_size \(6,\) needs the 2 spatial sizes"):
        values.max_unpool2d(indices, 2, output_size=(6,))
    with pytest.raises(ValueError, match=r"max_unpool2d: indices must be an int Tensor of the input's shape"):
        values.max_unpool2d(Tensor(np.zeros((1, 2), np.int32)), 2)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_max_unpool_of_overlapping_windows_places_each_value_once(dtype):
    # with a stride below the kernel, windows share elements: a maximum picked by two windows has one index twice
    x = np.array([[[1, 5, 2, -3, -1, -4]]], dtype)
    values, indices = Tensor(x).max_pool1d(2, stride=1, return_indices=True)
    expected = F.max_unpool1d(
        *F.max_pool1d(torch.tensor(x, dtype=torch.float32), 2, stride=1, return_indices=True), 2, 1
    )
    assert_tensor(values.max_unpool1d(indices, 2, stride=1), expected.numpy().astype(dtype))


def test_pool_errors():
    x = Tensor(data(1, 1, 4, 4))
    with pytest.raises(ValueError, match="max_pool2d: padding 3 must be at most half the"):
        x.max_pool2d(2, padding=3)
    with pytest.raises(ValueError, match=r"avg_pool2d: kernel_size needs one int or 2 ints"):
        x.avg_pool2d((2, 2, 2))
    with pytest.raises(ValueError, match=r"max_pool3d: needs an input with at least 4 dimensions, got \(4, 4\)"):
        Tensor(data(4, 4)).max_pool3d()


# ---------------------------------------------------------------------------------------------------------------------
# interpolate

INTERPOLATIONS = [
    ((1, 2, 5), {"size": 8, "mode": "linear"}),
    ((1, 2, 5), {"size": 3, "mode": "linear", "align_corners": True}),
    ((1, 2, 5), {"size": 10, "mode": "nearest"}),
    ((1, 2, 5), {"size": 7, "mode": "nearest-exact"}),
    ((2, 1, 3, 4), {"size": (5, 7), "mode": "bilinear"}),
    ((2, 1, 3, 4), {"size": (6, 2), "mode": "bilinear", "align_corners": True}),
    ((2, 1, 3, 4), {"scale_factor": 2, "mode": "nearest"}),
    ((2, 1, 3, 4), {"scale_factor": 1.5, "mode": "nearest"}),
    ((2, 1, 3, 4), {"size": (4, 3), "mode": "nearest-exact"}),
    ((1, 1, 2, 3, 2), {"size": (3, 4, 5), "mode": "trilinear"}),
    ((1, 1, 2, 3, 2), {"scale_factor": (2, 1, 1.5), "mode": "trilinear", "align_corners": True}),
]


@pytest.mark.parametrize("shape, options", INTERPOLATIONS, ids=range(len(INTERPOLATIONS)))
def test_interpolate(shape, options):
    ours = dict(options)
    ours.setdefault("align_corners", False if "linear" in options["mode"] else None)
    against_torch(lambda x: x.interpolate(**ours), lambda x: F.interpolate(x, **options), data(*shape))


def test_interpolate_errors():
    x = Tensor(data(1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"interpolate: mode 'trilinear' needs a 5-D input"):
        x.interpolate((2, 2), mode="trilinear")
    with pytest.raises(ValueError, match="interpolate: mode must be one of nearest"):
        x.interpolate((2, 2), mode="cubic")
    with pytest.raises(ValueError, match="interpolate: give exactly one of size and scale_factor"):
        x.interpolate(mode="nearest")
    with pytest.raises(ValueError, match="align_corners only applies to the linear modes"):
        x.interpolate((2, 2), mode="nearest", align_corners=True)


# ---------------------------------------------------------------------------------------------------------------------
# padding modes


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("padding", [(1, 2), (2, 0, 1, 3), (0, 1, 2, 0)])
def test_pad_modes(mode, padding):
    shape = (1, 2, 4, 5) if len(padding) == 4 else (2, 3, 5)
    against_torch(lambda x: x.pad(padding, mode=mode), lambda x: F.pad(x, padding, mode=mode), data(*shape))


def test_pad_constant_value():
    x = data(2, 3)
    against_torch(lambda x: x.pad((1, 2, 0, 1), value=-3.5), lambda x: F.pad(x, (1, 2, 0, 1), value=-3.5), x)
    against_torch(lambda x: x.pad((1, 2), "constant", 2.0), lambda x: F.pad(x, (1, 2), "constant", 2.0), x)
    assert_tensor(Tensor(x).pad(((1, 0), None), 7.0), np.pad(x, ((1, 0), (0, 0)), constant_values=7.0))


def test_pad_mode_errors():
    x = Tensor(data(2, 3))
    with pytest.raises(ValueError, match=r"pad: reflect padding \(3, 0\) of axis 1 of \(2, 3\) must be"):
        x.pad((3, 0), mode="reflect")
    with pytest.raises(ValueError, match="pad: mode must be one of constant, reflect, replicate, circular"):
        x.pad((1, 1), mode="wrap")
    with pytest.raises(ValueError, match=r"pad: circular padding \(-1, 0\)"):
        x.pad((-1, 0), mode="circular")


# ---------------------------------------------------------------------------------------------------------------------
# losses and attention


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4), (2, 3, 2, 3), (3,)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(shape, reduction, weighted):
    rng = np.random.default_rng(3)
    target = rng.integers(0, 3, size=(shape[0], *shape[2:]) if len(shape) > 1 else ())
    if target.ndim:
        target.reshape(-1)[0] = -100  # ignored
    weight = np.array([0.5, 2.0, 1.5], np.float32)
    log_probs = np.log(np.abs(data(*shape)) + 0.1)
    ours_weight = Tensor(weight) if weighted else None
    theirs_weight = torch.tensor(weight) if weighted else None
    against_torch(
        lambda x: x.nll_loss(Tensor(target), ours_weight, reduction=reduction),
        lambda x: F.nll_loss(x, torch.tensor(target), theirs_weight, reduction=reduction),
        log_probs,
    )


def test_nll_loss_errors():
    x = Tensor(data(4, 3))
    with pytest.raises(ValueError, match=r"nll_loss: input \(4, 3\) needs a target of shape \(4,\), got \(3,\)"):
        x.nll_loss(Tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="nll_loss: label 3 at index"):
        x.nll_loss(Tensor([0, 1, 2, 3]))
    with pytest.raises(TypeError, match="nll_loss: labels must be integer class indices"):
        x.nll_loss(Tensor([0.0, 1.0, 2.0, 1.0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_pos_weight", [False, True])
@pytest.mark.parametrize("with_weight", [False, True])
def test_binary_cross_entropy_with_logits(reduction, with_pos_weight, with_weight):
    x, target = data(4, 3), np.random.default_rng(2).uniform(0, 1, (4, 3)).astype(np.float32)
    pos_weight, weight = np.array([0.5, 2.0, 3.0], np.float32), data(4, 1, low=0.1, high=2.0, seed=4)
    against_torch(
        lambda x: x.binary_cross_entropy_with_logits(
            Tensor(target),
            Tensor(weight) if with_weight else None,
            reduction,
            Tensor(pos_weight) if with_pos_weight else None,
        ),
        lambda x: F.binary_cross_entropy_with_logits(
            x,
            torch.tensor(target),
            torch.tensor(weight) if with_weight else None,
            reduction=reduction,
            pos_weight=torch.tensor(pos_weight) if with_pos_weight else None,
        ),
        x,
    )
    if not with_weight:
        ours = Tensor(x).binary_crossentropy_logits(
            Tensor(target), reduction, pos_weight=Tensor(pos_weight) if with_pos_weight else None
        )
        assert_tensor(
            ours,
            Tensor(x)
            .binary_cross_entropy_with_logits(
                Tensor(target), None, reduction, Tensor(pos_weight) if with_pos_weight else None
            )
            .numpy(),
        )


def test_binary_cross_entropy_with_logits_errors():
    with pytest.raises(ValueError, match=r"target \(3,\) must match the logits \(2, 3\)"):
        Tensor(data(2, 3)).binary_cross_entropy_with_logits(Tensor(data(3)))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none'"):
        Tensor(data(3)).binary_cross_entropy_with_logits(Tensor(data(3)), reduction="avg")


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention_gqa(causal):
    q, k, v = data(1, 4, 3, 2), data(1, 2, 5, 2, seed=1), data(1, 2, 5, 3, seed=2)
    against_torch(
        lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=causal, enable_gqa=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
        q,
        k,
        v,
    )
    against_torch(
        lambda q, k, v: q.scaled_dot_product_attention(k, v, scale=0.3),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3),
        q,
        k[:, :1].repeat(4, 1),
        v[:, :1].repeat(4, 1),
    )
    with pytest.raises(ValueError, match="with enable_gqa the query's 4 heads must be a multiple"):
        Tensor(q).scaled_dot_product_attention(Tensor(data(1, 3, 5, 2)), Tensor(data(1, 3, 5, 3)), enable_gqa=True)


# ---------------------------------------------------------------------------------------------------------------------
# initializers


@pytest.mark.parametrize(
    "name, bound",
    [
        ("scaled_uniform", 1 / np.sqrt(64 * 32)),
        ("glorot_uniform", np.sqrt(6 / (64 + 32))),
        ("kaiming_uniform", np.sqrt(3) * np.sqrt(2 / (1 + 0.01**2)) / np.sqrt(32)),
    ],
)
def test_uniform_initializers(name, bound):
    Tensor.manual_seed(0)
    values = getattr(Tensor, name)(64, 32).numpy()
    assert values.shape == (64, 32) and values.dtype == np.float32
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound
    assert abs(values.std() - bound / np.sqrt(3)) < 0.05 * bound


def test_kaiming_normal_and_dtype():
    Tensor.manual_seed(0)
    values = Tensor.kaiming_normal(64, 16, 2, a=0.5).numpy()
    std = np.sqrt(2 / (1 + 0.25)) / np.sqrt(32)
    assert values.shape == (64, 16, 2) and abs(values.std() - std) < 0.05 * std
    assert Tensor.glorot_uniform(4, 4, dtype=dtypes.float16).dtype == dtypes.float16


def test_argument_type_errors():
    x = Tensor(data(1, 2, 5))
    with pytest.raises(TypeError, match=r"conv1d: weight must be a Tensor, got ndarray; wrap it with Tensor"):
        x.conv1d(data(3, 2, 2))
    with pytest.raises(TypeError, match="conv_transpose1d: weight must be a Tensor"):
        x.conv_transpose1d([[1.0]])
    with pytest.raises(TypeError, match="nll_loss: target must be an integer Tensor, got list"):
        Tensor(data(2, 3)).nll_loss([0, 1])
    with pytest.raises(ValueError, match=r"nll_loss: weight needs one value per class, shape \(3,\), got \(2,\)"):
        Tensor(data(2, 3)).nll_loss(Tensor([0, 1]), Tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="binary_cross_entropy_with_logits: target must be a Tensor"):
        Tensor(data(2)).binary_cross_entropy_with_logits([0.0, 1.0])


def test_nll_loss_without_ignore_index():
    log_probs, target = np.log(np.abs(data(3, 4)) + 0.1), np.array([0, 3, 1])
    expected = F.nll_loss(torch.tensor(log_probs), torch.tensor(target)).numpy()
    assert_tensor(Tensor(log_probs).nll_loss(Tensor(target), ignore_index=None), expected)
