"""Layers, with tinygrad's names: each holds its parameters as Tensors and is called on an input."""

from __future__ import annotations

import math
import operator

import numpy as np

from lazygrad.device import Device
from lazygrad.dtype import dtypes
from lazygrad.tensor import Tensor
from lazygrad.tensor_conv import _is_int, _pair
from lazygrad.tensor_nn import eval_mode_layers

# torch.finfo(dtype).eps, RMSNorm's default eps (NumPy has no bfloat16)
MACHINE_EPSILON = {
    dtypes.float16: 2.0**-10,
    dtypes.bfloat16: 2.0**-7,
    dtypes.float32: 2.0**-23,
    dtypes.float64: 2.0**-52,
}


def _statistic(values: np.ndarray) -> Tensor:
    """A buffer of running statistics: updated in place, never trained."""
    return Tensor(values, requires_grad=False)


def _check_input(layer: str, x: Tensor, expected: str, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{layer}: expected input of shape {expected}, got {x.shape}")


def _init_bound(fan_in: int) -> float:
    """±1/sqrt(fan_in), torch's uniform bound for weights and biases; 0 for no inputs (the weight is then empty and
    the bias zeros, as in torch)."""
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


class Linear:
    """y = x Wᵀ + b, with weights drawn uniformly from ±1/sqrt(in_features) (as torch does)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = _init_bound(in_features)
        self.weight = Tensor.uniform(out_features, in_features, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        in_features = self.weight.shape[1]
        _check_input("Linear", x, f"(..., {in_features})", x.ndim >= 1 and x.shape[-1] == in_features)
        out = x @ self.weight.T
        return out if self.bias is None else out + self.bias


def _count(value, name: str, layer: str) -> int:
    """A channel or group count: any integral (a NumPy int too, as torch takes it) as an int."""
    if not _is_int(value):
        raise TypeError(f"{layer}: {name} must be an int, got {value!r}")
    return operator.index(value)


# torch's padding_mode names, and the mode of Tensor.pad each one is
PADDING_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}


class _ConvNd:
    """An N-d convolution layer over (N, C_in, *spatial) inputs; weights are uniform in ±1/sqrt(fan_in), as in torch.
    The arguments are torch's, in torch's order (tinygrad's too): (in_channels, out_channels, kernel_size, stride,
    padding, dilation, groups, bias, padding_mode, device, dtype); each size is an int (NumPy ints too) or one per
    spatial axis. `padding_mode` is how the `padding` is filled, as torch's: "zeros" (the default), "reflect",
    "replicate" or "circular". It holds no tensor, so the state dict is torch's (`weight`, `bias`) whatever the
    mode."""

    spatial = 2
    transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: str | None = None,
        dtype=None,
    ):
        self._build(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            0,
            padding_mode,
            device,
            dtype,
        )

    def _build(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        bias,
        output_padding,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        name = type(self).__name__
        if padding_mode not in PADDING_MODES:
            raise ValueError(
                f"{name}: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular' (torch's), got "
                f"{padding_mode!r}"
            )
        if self.transposed and padding_mode != "zeros":
            raise ValueError(
                f"{name}: only padding_mode='zeros' is supported for a transposed convolution (as in torch), got "
                f"{padding_mode!r}"
            )
        if dtype is not None and not dtype.is_float:
            raise TypeError(f"{name}: dtype must be a float dtype for trainable weights, got {dtype}")
        in_channels, out_channels = _count(in_channels, "in_channels", name), _count(out_channels, "out_channels", name)
        kernel = _pair(kernel_size, self.spatial, f"{name}: kernel_size")
        if min(kernel) < 1:
            raise ValueError(f"{name}: kernel_size must be positive, got {kernel_size}; a kernel covers at least 1")
        if not _is_int(groups) or groups < 1:
            raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
        groups = operator.index(groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: channels {in_channels}→{out_channels} must be divisible by groups={groups}")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding, self.padding_mode = output_padding, padding_mode
        if self.transposed:
            shape = (in_channels, out_channels // groups, *kernel)
            fan_in = out_channels // groups * math.prod(kernel)  # torch counts the weight's dimension 1
        else:
            shape = (out_channels, in_channels // groups, *kernel)
            fan_in = in_channels // groups * math.prod(kernel)
        bound = _init_bound(fan_in)
        self.weight = Tensor.uniform(*shape, low=-bound, high=bound, device=device, dtype=dtype)
        self.bias = Tensor.uniform(out_channels, low=-bound, high=bound, device=device, dtype=dtype) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        name = type(self).__name__
        channels = self.weight.shape[0] if self.transposed else self.weight.shape[1] * self.groups
        axes = ("L",) if self.spatial == 1 else ("H", "W") if self.spatial == 2 else ("D", "H", "W")
        expected = f"(N, {channels}, {', '.join(axes)})"
        _check_input(name, x, expected, x.ndim == self.spatial + 2 and x.shape[1] == channels)
        # (the op named as the layer: an error about the kernel or the padding names what the user built)
        if self.transposed:
            return x._conv_transpose(
                self.weight,
                self.bias,
                self.groups,
                self.stride,
                self.dilation,
                self.padding,
                self.output_padding,
                name,
                self.spatial,
            )
        padding = self.padding
        if getattr(self, "padding_mode", "zeros") != "zeros":  # (a layer unpickled from before padding_mode: zeros)
            x, padding = self._filled(x, name), 0
        return x._conv(self.weight, self.bias, self.groups, self.stride, self.dilation, padding, name, self.spatial)

    def _filled(self, x: Tensor, name: str) -> Tensor:
        """The input padded by `padding` in `padding_mode`, as torch pads it before a convolution with none: the
        same amounts ("same" and "valid" too) that zeros padding would add, filled from the input's own values."""
        kernel = self.weight.shape[2:]
        padding = self.padding
        if isinstance(padding, str):
            stride = _pair(self.stride, self.spatial, f"{name}: stride")
            dilation = _pair(self.dilation, self.spatial, f"{name}: dilation")
            padding = x._named_padding(padding, kernel, stride, dilation, name)
        pairs = x._padding(padding, self.spatial, name)
        if all(pair == (0, 0) for pair in pairs):
            return x
        mode = PADDING_MODES[self.padding_mode]
        for axis, ((before, after), size) in enumerate(zip(pairs, x.shape[2:])):
            limit = size - 1 if mode == "reflect" else size
            if max(before, after) > limit:
                raise ValueError(
                    f"{name}: padding_mode={self.padding_mode!r} pads spatial axis {axis} of the input {x.shape} by "
                    f"{(before, after)}, which must be {'smaller than' if mode == 'reflect' else 'at most'} its size "
                    f"{size}; use a smaller padding or a larger input"
                )
        return x.pad(((0, 0), (0, 0), *pairs), mode=mode)


class _ConvTransposeNd(_ConvNd):
    """An N-d transposed convolution layer, weight (C_in, C_out/groups, *kernel). The arguments are in torch's order,
    (in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias, dilation): tinygrad's
    puts dilation before groups and bias, so pass those three by keyword to write code both read alike. Only
    padding_mode="zeros" is taken, as in torch."""

    transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups: int = 1,
        bias: bool = True,
        dilation=1,
        padding_mode: str = "zeros",
        device: str | None = None,
        dtype=None,
    ):
        self._build(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            output_padding,
            padding_mode,
            device,
            dtype,
        )


class Conv1d(_ConvNd):
    """1-D convolution layer over (N, C_in, L) inputs."""

    spatial = 1


class Conv2d(_ConvNd):
    """2-D convolution layer over (N, C_in, H, W) inputs."""

    spatial = 2


class Conv3d(_ConvNd):
    """3-D convolution layer over (N, C_in, D, H, W) inputs."""

    spatial = 3


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution layer: weight (C_in, C_out/groups, k)."""

    spatial = 1


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution layer: weight (C_in, C_out/groups, kh, kw)."""

    spatial = 2


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution layer: weight (C_in, C_out/groups, kd, kh, kw)."""

    spatial = 3


class BatchNorm:
    """Batch normalization over axis 1: batch statistics while `Tensor.training` (updating running averages),
    the running statistics otherwise. With `track_running_stats=False` there are none, as in torch: it always
    normalizes with the batch's statistics, and running_mean, running_var and num_batches_tracked are None (so its
    state dict holds only the affine weight and bias, the keys torch saves for such a layer). `momentum=None`
    makes the running statistics the plain average of every batch's, as in torch. The arguments are in torch's order,
    (num_features, eps, momentum, affine, track_running_stats): tinygrad's puts momentum last. A half or bfloat16
    input is normalized with float32 statistics, as in torch."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ):
        if momentum is not None and not (isinstance(momentum, (int, float)) and 0 <= momentum <= 1):
            raise ValueError(
                f"BatchNorm: momentum must be a number in [0, 1] or None (a plain average), got {momentum!r}"
            )
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        self.weight = Tensor.ones(num_features).contiguous().realize() if affine else None
        self.bias = Tensor.zeros(num_features).contiguous().realize() if affine else None
        self.running_mean = _statistic(np.zeros(num_features, np.float32)) if track_running_stats else None
        self.running_var = _statistic(np.ones(num_features, np.float32)) if track_running_stats else None
        # int64, torch's counter (an OpenCL embedded profile lacks it: int32 there)
        counter = np.int32 if dtypes.int64 in Device[Device.DEFAULT].unsupported_dtypes else np.int64
        self.num_batches_tracked = _statistic(np.zeros(1, counter)) if track_running_stats else None

    def __call__(self, x: Tensor) -> Tensor:
        features = self.num_features
        _check_input("BatchNorm", x, f"(N, {features}, ...)", x.ndim >= 2 and x.shape[1] == features)
        axes = tuple(a for a in range(x.ndim) if a != 1)
        count = x.shape[0] * math.prod(x.shape[2:])  # values per channel
        if Tensor.training or not self.track_running_stats:
            if count == 1:  # (a variance of one value is 0: the output would be all zeros)
                raise ValueError(
                    f"BatchNorm: expected more than 1 value per channel when using batch statistics (training, or "
                    f"track_running_stats=False), got input {x.shape}; use a larger batch, or eval mode with running "
                    "statistics"
                )
            # statistics of half and bfloat16 in float32, as torch computes them: a deviation past 256 squares to
            # inf in half (the output was zeros, the running variance inf)
            stats = x.float() if x.dtype in (dtypes.float16, dtypes.bfloat16) else x
            mean = stats.mean(axes)
            shape = [1] * x.ndim
            shape[1] = features
            var = (stats - mean.reshape(shape)).square().mean(axes)
            if Tensor.training and self.track_running_stats:
                unbiased = var.detach() * (count / max(count - 1, 1))
                tracked = self.num_batches_tracked + 1
                # (no momentum: the n-th batch's statistics count 1/n, so the running ones are their plain average)
                factor = (
                    self.momentum if self.momentum is not None else tracked.cast(self.running_mean.dtype).reciprocal()
                )
                if count:  # (an empty batch has no statistics: torch keeps the running ones, but counts the batch)
                    # (kept in their own dtype: a float64 input's statistics are float64, as in eval mode's output)
                    kept = self.running_mean.dtype
                    self.running_mean.assign(((1 - factor) * self.running_mean + factor * mean.detach()).cast(kept))
                    self.running_var.assign(((1 - factor) * self.running_var + factor * unbiased).cast(kept))
                self.num_batches_tracked.assign(tracked)
        else:
            eval_mode_layers.add(self)
            mean, var = self.running_mean, self.running_var
        out = x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())
        # a half or bfloat16 input gives its own dtype back, as in torch (normalized with float32 statistics)
        return out.cast(x.dtype) if x.dtype in (dtypes.float16, dtypes.bfloat16) else out


BatchNorm2d = BatchNorm
BatchNorm1d = BatchNorm


class LayerNorm:
    """Normalization over the last axes `normalized_shape`, with an elementwise affine transform (a weight, and a
    bias unless `bias=False`, as in torch)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        self.normalized_shape = (
            (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
        )
        self.eps = eps
        self.weight = Tensor.ones(*self.normalized_shape).contiguous().realize() if elementwise_affine else None
        self.bias = Tensor.zeros(*self.normalized_shape).contiguous().realize() if elementwise_affine and bias else None

    def __call__(self, x: Tensor) -> Tensor:
        count = len(self.normalized_shape)
        _check_input(
            "LayerNorm",
            x,
            f"(..., {', '.join(map(str, self.normalized_shape))})",
            x.shape[-count:] == self.normalized_shape,
        )
        out = x.layernorm(axis=tuple(range(-count, 0)), eps=self.eps)
        out = out if self.weight is None else out * self.weight
        return out if self.bias is None else out + self.bias


class GroupNorm:
    """Normalization over groups of channels of (N, C, ...) inputs."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: {num_channels} channels do not split into {num_groups} groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Tensor.ones(num_channels).contiguous().realize() if affine else None
        self.bias = Tensor.zeros(num_channels).contiguous().realize() if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        _check_input("GroupNorm", x, f"(N, {self.num_channels}, ...)", x.ndim >= 2 and x.shape[1] == self.num_channels)
        grouped = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None:
            return grouped
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return grouped * self.weight.reshape(shape) + self.bias.reshape(shape)


class Embedding:
    """A lookup table: integer indices (…) → vectors (…, embed_size). With `padding_idx` (as torch's), that row
    starts at zeros and gets no gradient: the lookups of padding stay what the row holds."""

    def __init__(self, vocab_size: int, embed_size: int, padding_idx: int | None = None):
        self.vocab_size, self.embed_size = vocab_size, embed_size
        if padding_idx is not None:
            if not _is_int(padding_idx) or not -vocab_size <= padding_idx < vocab_size:
                raise ValueError(
                    f"Embedding: padding_idx must be an int in [-{vocab_size}, {vocab_size}) (a row of the table), "
                    f"got {padding_idx!r}"
                )
            padding_idx = operator.index(padding_idx) % vocab_size  # (a negative one counts from the end, as torch)
        self.padding_idx = padding_idx
        self.weight = Tensor.normal(vocab_size, embed_size)
        if padding_idx is not None:
            rows = Tensor.arange(vocab_size).reshape(vocab_size, 1)
            self.weight = (rows == padding_idx).where(0.0, self.weight).contiguous().realize()

    def __call__(self, idx: Tensor) -> Tensor:
        if not idx.dtype.is_int:
            raise TypeError(f"Embedding: indices must be integers, got {idx.dtype}; cast them with .int()")
        fix = f"indices must be below vocab_size {self.vocab_size}: fix them, or make a larger Embedding"
        # the rows selected, summed over the vocabulary: codegen makes that a load of each row (codegen/lookup.py),
        # and a row no index names is never read (an inf there leaves the lookups alone, as in torch)
        selected = idx._label_mask(self.vocab_size, "Embedding", fix).unsqueeze(-1)
        out = self.weight._sum_selected(selected, -2)
        if self.padding_idx is None:
            return out
        # the padding row's value, detached: the select passes no gradient to the lookups of padding, so none
        # reaches that row
        padding = (idx == self.padding_idx).unsqueeze(-1)
        return padding.where(self.weight[self.padding_idx].detach(), out)


class RMSNorm:
    """Root-mean-square normalization over the last axes `normalized_shape`, as torch's nn.RMSNorm:
    x / sqrt(mean(x²) + eps) · weight, with eps None meaning the input dtype's machine epsilon (torch's default).
    Half and bfloat16 are normalized in float32 and rounded back."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True):
        shape = (normalized_shape,) if _is_int(normalized_shape) else tuple(normalized_shape)
        self.normalized_shape = tuple(operator.index(size) for size in shape)
        self.eps = eps
        self.weight = Tensor.ones(*self.normalized_shape).contiguous().realize() if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        count = len(self.normalized_shape)
        expected = f"(..., {', '.join(map(str, self.normalized_shape))})"
        _check_input("RMSNorm", x, expected, x.shape[-count:] == self.normalized_shape)
        dtype = x.dtype if x.dtype.is_float else dtypes.default_float
        eps = self.eps if self.eps is not None else MACHINE_EPSILON[dtype]
        source = x.cast(dtypes.float32) if dtype in (dtypes.float16, dtypes.bfloat16) else x.cast(dtype)
        axes = tuple(range(-count, 0))
        out = (source * (source.square().mean(axes, keepdim=True) + eps).rsqrt()).cast(dtype)
        return out if self.weight is None else out * self.weight


# (so `nn.optim`, `nn.state` and `nn.utils` work after `from lazygrad import nn`)
from lazygrad.nn import optim, state, utils  # noqa: E402,F401
