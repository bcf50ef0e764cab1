"""Layers, with tinygrad's names: each holds its parameters as Tensors and is called on an input."""

from __future__ import annotations

import math

import numpy as np

from lazygrad.tensor import Tensor


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


class _ConvNd:
    """An N-d convolution layer over (N, C_in, *spatial) inputs; weights are uniform in ±1/sqrt(fan_in), as in torch."""

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
        output_padding=0,
    ):
        name = type(self).__name__
        kernel = (kernel_size,) * self.spatial if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(kernel) != self.spatial:
            raise ValueError(f"{name}: kernel_size needs 1 or {self.spatial} ints, got {kernel_size}")
        if min(kernel) < 1:
            raise ValueError(f"{name}: kernel_size must be positive, got {kernel_size}; a kernel covers at least 1")
        if not isinstance(groups, int) or groups < 1:
            raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: channels {in_channels}→{out_channels} must be divisible by groups={groups}")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.output_padding = output_padding
        if self.transposed:
            shape = (in_channels, out_channels // groups, *kernel)
            fan_in = out_channels // groups * math.prod(kernel)  # torch counts the weight's dimension 1
        else:
            shape = (out_channels, in_channels // groups, *kernel)
            fan_in = in_channels // groups * math.prod(kernel)
        bound = _init_bound(fan_in)
        self.weight = Tensor.uniform(*shape, low=-bound, high=bound)
        self.bias = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        channels = self.weight.shape[0] if self.transposed else self.weight.shape[1] * self.groups
        axes = ("L",) if self.spatial == 1 else ("H", "W") if self.spatial == 2 else ("D", "H", "W")
        expected = f"(N, {channels}, {', '.join(axes)})"
        _check_input(type(self).__name__, x, expected, x.ndim == self.spatial + 2 and x.shape[1] == channels)
        if self.transposed:
            return x.conv_transpose(
                self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding, self.output_padding
            )
        return x.conv(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


class Conv1d(_ConvNd):
    """1-D convolution layer over (N, C_in, L) inputs."""

    spatial = 1


class Conv2d(_ConvNd):
    """2-D convolution layer over (N, C_in, H, W) inputs."""

    spatial = 2


class Conv3d(_ConvNd):
    """3-D convolution layer over (N, C_in, D, H, W) inputs."""

    spatial = 3


class ConvTranspose1d(_ConvNd):
    """1-D transposed convolution layer: weight (C_in, C_out/groups, k)."""

    spatial, transposed = 1, True


class ConvTranspose2d(_ConvNd):
    """2-D transposed convolution layer: weight (C_in, C_out/groups, kh, kw)."""

    spatial, transposed = 2, True


class ConvTranspose3d(_ConvNd):
    """3-D transposed convolution layer: weight (C_in, C_out/groups, kd, kh, kw)."""

    spatial, transposed = 3, True


class BatchNorm:
    """Batch normalization over axis 1: batch statistics while `Tensor.training` (updating running averages),
    the running statistics otherwise. With `track_running_stats=False` there are none, as in torch: it always
    normalizes with the batch's statistics, and running_mean, running_var and num_batches_tracked are None (so its
    state dict holds only the affine weight and bias, the keys torch saves for such a layer). `momentum=None`
    makes the running statistics the plain average of every batch's, as in torch."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        affine: bool = True,
        track_running_stats: bool = True,
        momentum: float | None = 0.1,
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
        self.num_batches_tracked = _statistic(np.zeros(1, np.int32)) if track_running_stats else None

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
            mean = x.mean(axes)
            shape = [1] * x.ndim
            shape[1] = features
            var = (x - mean.reshape(shape)).square().mean(axes)
            if Tensor.training and self.track_running_stats:
                unbiased = var.detach() * (count / max(count - 1, 1))
                tracked = self.num_batches_tracked + 1
                # (no momentum: the n-th batch's statistics count 1/n, so the running ones are their plain average)
                factor = (
                    self.momentum if self.momentum is not None else tracked.cast(self.running_mean.dtype).reciprocal()
                )
                if count:  # (an empty batch has no statistics: torch keeps the running ones, but counts the batch)
                    self.running_mean.assign((1 - factor) * self.running_mean + factor * mean.detach())
                    self.running_var.assign((1 - factor) * self.running_var + factor * unbiased)
                self.num_batches_tracked.assign(tracked)
        else:
            mean, var = self.running_mean, self.running_var
        return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())


BatchNorm2d = BatchNorm
BatchNorm1d = BatchNorm


class LayerNorm:
    """Normalization over the last axes `normalized_shape`, with an elementwise affine transform."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Tensor.ones(*self.normalized_shape).contiguous().realize() if elementwise_affine else None
        self.bias = Tensor.zeros(*self.normalized_shape).contiguous().realize() if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        count = len(self.normalized_shape)
        _check_input(
            "LayerNorm",
            x,
            f"(..., {', '.join(map(str, self.normalized_shape))})",
            x.shape[-count:] == self.normalized_shape,
        )
        out = x.layernorm(axis=tuple(range(-count, 0)), eps=self.eps)
        return out if self.weight is None else out * self.weight + self.bias


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
    """A lookup table: integer indices (…) → vectors (…, embed_size)."""

    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_size, self.embed_size = vocab_size, embed_size
        self.weight = Tensor.normal(vocab_size, embed_size)

    def __call__(self, idx: Tensor) -> Tensor:
        if not idx.dtype.is_int:
            raise TypeError(f"Embedding: indices must be integers, got {idx.dtype}; cast them with .int()")
        fix = f"indices must be below vocab_size {self.vocab_size}: fix them, or make a larger Embedding"
        one_hot = idx._one_hot(self.vocab_size, "Embedding", fix).cast(self.weight.dtype)
        return one_hot @ self.weight


from lazygrad.nn import optim, state  # noqa: E402,F401  (so `nn.optim` and `nn.state` work after `from lazygrad import nn`)
