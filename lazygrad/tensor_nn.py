"""Neural-network functions on tensors: convolution and pooling (as windowed views), normalization, dropout,
attention and the losses. All are compositions of primitives."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.codegen.heuristic import UNROLL_LIMIT
from lazygrad.dtype import dtypes

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor


def _pair(value, count: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * count
    value = tuple(value)
    if len(value) != count:
        raise ValueError(f"{name} needs {count} values, got {value}")
    return value


def _check_label_range(labels: Tensor, classes: int, op_name: str, fix: str, ignore_index: int | None = None) -> None:
    """An error naming the first label outside 0..classes-1 (other than `ignore_index`). Labels are data, so they are
    realized and read here, when the op is called (as PyTorch checks them): an out-of-range label would otherwise
    select no class and silently give a wrong result."""
    values = labels.numpy().reshape(-1)
    wrong = (values < 0) | (values >= classes)
    if ignore_index is not None:
        wrong &= values != ignore_index
    if wrong.any():
        position = np.unravel_index(int(wrong.argmax()), labels.shape)
        allowed = f"0..{classes - 1}" + (f" or ignore_index={ignore_index}" if ignore_index is not None else "")
        raise ValueError(
            f"{op_name}: label {values[wrong.argmax()]} at index {tuple(int(i) for i in position)} is not a class of "
            f"{classes} (allowed: {allowed}); {fix}"
        )


class NNMixin:
    """Layers' building blocks as Tensor methods."""

    __slots__ = ()

    # ---- windows -----------------------------------------------------------------------------------------------

    def _window(self: Tensor, axis: int, kernel: int, stride: int, dilation: int) -> Tensor:
        """Axis `axis` of size i becomes two axes (out, kernel) with [o, k] = x[o*stride + k*dilation], as a view.

        Windows that do not overlap (stride >= kernel, no dilation) are rows of a reshape: (out, stride), cut to
        (out, kernel). A small kernel stacks one strided slice per tap: kernels index it with plain sums (h + kh) under a gate
        that folds away once codegen unrolls the tap loop, and its gradient adds shifted copies. A larger kernel
        repeats the axis and re-reads it with rows of length R = m*i + dilation: row k then starts at element
        k*dilation (mod i), so a plain reshape and shrink line the windows up without a gate per tap (at the
        price of `%` in the index, and in the gradient)."""
        size = self.shape[axis]
        out = (size - dilation * (kernel - 1) - 1) // stride + 1
        if out <= 0:
            raise ValueError(
                f"pool/conv: window {kernel} (dilation {dilation}) does not fit an axis of size {size} in {self.shape}"
            )
        before, after = self.shape[:axis], self.shape[axis + 1 :]
        if stride >= kernel and dilation == 1:
            x = self.pad(tuple((0, max(0, out * stride - size)) if i == axis else None for i in range(self.ndim)))
            x = x.shrink(tuple((0, out * stride) if i == axis else None for i in range(self.ndim)))
            x = x.reshape(*before, out, stride, *after)
            return x.shrink(tuple((0, kernel) if i == axis + 1 else None for i in range(x.ndim)))
        if kernel <= UNROLL_LIMIT:
            span = (out - 1) * stride + 1
            taps = []
            for tap in range(kernel):
                start = tap * dilation
                x = self.shrink(tuple((start, start + span) if i == axis else None for i in range(self.ndim)))
                if stride > 1:  # every stride-th element: pad to out*stride, fold into (out, stride), keep column 0
                    x = x.pad(tuple((0, out * stride - span) if i == axis else None for i in range(self.ndim)))
                    x = x.reshape(*before, out, stride, *after)
                    x = x.shrink(tuple((0, 1) if i == axis + 1 else None for i in range(x.ndim)))
                    x = x.reshape(*before, out, *after)
                taps.append(x)
            return taps[0].stack(*taps[1:], dim=axis + 1)
        row = size + dilation
        while row < out * stride:
            row += size
        repeats = math.ceil(kernel * row / size)
        x = self.unsqueeze(axis).expand(*self.shape[:axis], repeats, *self.shape[axis:])
        x = x.reshape(*before, repeats * size, *after)
        x = x.shrink(tuple((0, kernel * row) if i == axis else None for i in range(x.ndim)))
        x = x.reshape(*before, kernel, row, *after)
        x = x.shrink(tuple((0, out * stride) if i == axis + 1 else None for i in range(x.ndim)))
        x = x.reshape(*before, kernel, out, stride, *after)
        x = x.shrink(tuple((0, 1) if i == axis + 2 else None for i in range(x.ndim)))
        x = x.reshape(*before, kernel, out, *after)
        return x.transpose(axis, axis + 1)

    def _pool(self: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """(..., *spatial) → (..., *out, *kernel): every window of the last len(kernel) axes."""
        count = len(kernel)
        x = self
        first = self.ndim - count
        for number in range(count):
            # earlier spatial axes have become (out, kernel) pairs
            x = x._window(first + 2 * number, kernel[number], stride[number], dilation[number])
        order = list(range(first)) + [first + 2 * n for n in range(count)] + [first + 2 * n + 1 for n in range(count)]
        return x.permute(order)

    def _padding(self: Tensor, padding, count: int) -> tuple[tuple[int, int], ...]:
        if isinstance(padding, int):
            return ((padding, padding),) * count
        padding = tuple(padding)
        if len(padding) == count:
            return tuple((p, p) for p in padding)
        if len(padding) == 2 * count:  # torch order: (left, right, top, bottom) for the last axes first
            pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
            return tuple(reversed(pairs))
        raise ValueError(f"padding {padding} needs 1, {count} or {2 * count} values")

    def conv2d(
        self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0
    ) -> Tensor:
        """2-D convolution of (N, C_in, H, W) with weight (C_out, C_in/groups, kh, kw)."""
        if self.ndim != 4 or weight.ndim != 4:
            raise ValueError(f"conv2d: need a 4-D input and weight, got {self.shape} and {weight.shape}")
        batch, channels_in = self.shape[:2]
        channels_out, group_channels, *kernel = weight.shape
        if channels_in != group_channels * groups or channels_out % groups:
            raise ValueError(
                f"conv2d: input {self.shape} with groups={groups} needs weight (C_out, {channels_in // max(groups, 1)}, kh, kw) "
                f"with C_out divisible by {groups}, got {weight.shape}"
            )
        pads = self._padding(padding, 2)
        x = self.pad(((0, 0), (0, 0)) + pads) if any(p != (0, 0) for p in pads) else self
        windows = x._pool(tuple(kernel), _pair(stride, 2, "stride"), _pair(dilation, 2, "dilation"))
        out_h, out_w = windows.shape[2:4]
        per_group = channels_out // groups
        # taps before positions: the gradient of the windows (a reduce over output channels) is then laid out
        # along the image's rows, where adding its taps back up into the input's gradient reads it in order
        windows = windows.permute(0, 1, 4, 5, 2, 3).reshape(batch, groups, 1, group_channels, *kernel, out_h, out_w)
        weights = weight.reshape(1, groups, per_group, group_channels, *kernel, 1, 1)
        result = (windows * weights).sum((3, 4, 5)).reshape(batch, channels_out, out_h, out_w)
        return result if bias is None else result + bias.reshape(1, -1, 1, 1)

    def _pool2d(self: Tensor, kernel_size, stride, dilation, padding, value: float) -> Tensor:
        kernel = _pair(kernel_size, 2, "kernel_size")
        stride = kernel if stride is None else _pair(stride, 2, "stride")
        pads = self._padding(padding, 2)
        x = self.pad(((0, 0),) * (self.ndim - 2) + pads, value=value) if any(p != (0, 0) for p in pads) else self
        return x._pool(kernel, stride, _pair(dilation, 2, "dilation"))

    def max_pool2d(self: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0) -> Tensor:
        return self._pool2d(kernel_size, stride, dilation, padding, float("-inf")).max((-2, -1))

    def avg_pool2d(self: Tensor, kernel_size=(2, 2), stride=None, dilation=1, padding=0) -> Tensor:
        return self._pool2d(kernel_size, stride, dilation, padding, 0.0).mean((-2, -1))

    # ---- normalization, dropout, attention ------------------------------------------------------------------------

    def layernorm(self: Tensor, axis=-1, eps: float = 1e-5) -> Tensor:
        centered = self - self.mean(axis, keepdim=True)
        return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(
        self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor, axis=1
    ) -> Tensor:
        """Normalize with given statistics along the channel axis `axis`."""
        shape = [1] * self.ndim
        shape[axis] = self.shape[axis]
        x = (self - mean.reshape(shape)) * invstd.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        return x if bias is None else x + bias.reshape(shape)

    def dropout(self: Tensor, p: float = 0.5) -> Tensor:
        """Zero elements with probability p while `Tensor.training`, scaling the rest by 1/(1-p)."""
        if not 0 <= p <= 1:
            raise ValueError(f"dropout: p must be in [0, 1], got {p}")
        if not type(self).training or p == 0:
            return self
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p)) if p < 1 else self * 0

    def scaled_dot_product_attention(
        self: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
    ) -> Tensor:
        """softmax(q kᵀ / sqrt(d) + mask) v."""
        scores = self @ key.transpose(-2, -1) * (1 / math.sqrt(self.shape[-1]))
        if is_causal:
            rows, cols = scores.shape[-2:]
            attn_mask = type(self).ones(rows, cols, dtype=dtypes.bool, device=self.device).tril()
        if attn_mask is not None:
            scores = attn_mask.where(scores, float("-inf")) if attn_mask.dtype == dtypes.bool else scores + attn_mask
        return scores.softmax(-1).dropout(dropout_p) @ value

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        rows, cols = self.shape[-2:]
        keep = type(self).arange(rows, device=self.device).reshape(rows, 1) + diagonal >= type(self).arange(
            cols, device=self.device
        ).reshape(1, cols)
        return keep.where(self, self.zeros_like())

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        rows, cols = self.shape[-2:]
        keep = type(self).arange(rows, device=self.device).reshape(rows, 1) + diagonal <= type(self).arange(
            cols, device=self.device
        ).reshape(1, cols)
        return keep.where(self, 0)

    # ---- losses ----------------------------------------------------------------------------------------------------

    def one_hot(self: Tensor, num_classes: int) -> Tensor:
        """(…,) int labels → (…, num_classes) int32 with a 1 at each label. Labels outside 0..num_classes-1 are an
        error (the labels are realized to check them, as PyTorch checks them when called)."""
        if self.dtype.is_float:
            raise TypeError(f"one_hot: labels must be integers, got {self.dtype}")
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"one_hot: num_classes must be a non-negative int, got {num_classes!r}")
        _check_label_range(self, num_classes, "one_hot", "fix the labels or pass a larger num_classes")
        return (self.unsqueeze(-1) == type(self).arange(num_classes, device=self.device)).cast(dtypes.int32)

    def _check_labels(self: Tensor, labels: Tensor, op_name: str, ignore_index: int | None = None) -> None:
        if labels.dtype.is_float:
            raise TypeError(f"{op_name}: labels must be integer class indices, got {labels.dtype}; cast with .int()")
        if labels.shape != self.shape[:-1]:
            raise ValueError(
                f"{op_name}: logits {self.shape} need labels of shape {self.shape[:-1]}, got {labels.shape}"
            )
        fix = f"fix the labels (the logits' class axis has {self.shape[-1]} classes)"
        _check_label_range(labels, self.shape[-1], op_name, fix, ignore_index)

    def sparse_categorical_crossentropy(
        self: Tensor, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean"
    ) -> Tensor:
        """Cross-entropy of logits (…, C) against integer labels (…) in 0..C-1; labels equal to `ignore_index` count
        zero (and a mean over no counted label is 0). Other labels are an error (they are realized to check them)."""
        return self._label_crossentropy(Y, ignore_index, label_smoothing, reduction, "sparse_categorical_crossentropy")

    def _label_crossentropy(
        self: Tensor, Y: Tensor, ignore_index: int, label_smoothing: float, reduction: str, op_name: str
    ) -> Tensor:
        self._check_labels(Y, op_name, ignore_index)
        classes = self.shape[-1]
        log_probs = self.log_softmax(-1)
        chosen = Y.unsqueeze(-1) == type(self).arange(classes, device=self.device)
        valid = Y != ignore_index
        nll = -(chosen.where(log_probs, 0).sum(-1))
        if label_smoothing:
            nll = (1 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
        nll = valid.where(nll, 0)
        if reduction == "none":
            return nll
        if reduction == "sum":
            return nll.sum()
        if reduction != "mean":
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        return nll.sum() / valid.sum().maximum(1)

    def cross_entropy(self: Tensor, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
        """Cross-entropy of logits (N, C, …) against class indices (N, …) or probabilities (N, C, …), like torch."""
        logits = self.transpose(1, -1) if self.ndim > 2 else self
        if not Y.dtype.is_float:
            return logits._label_crossentropy(Y, -100, label_smoothing, reduction, "cross_entropy")
        probs = Y.transpose(1, -1) if Y.ndim > 2 else Y
        if probs.shape != logits.shape:
            raise ValueError(f"cross_entropy: probabilities {Y.shape} must match logits {self.shape}")
        classes = logits.shape[-1]
        probs = probs * (1 - label_smoothing) + label_smoothing / classes
        loss = -(probs * logits.log_softmax(-1)).sum(-1)
        return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()

    def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """Binary cross-entropy of probabilities against targets in [0, 1]."""
        loss = -(Y * self.log() + (1 - Y) * (1 - self).log())
        return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()

    def binary_crossentropy_logits(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """Binary cross-entropy of logits, computed stably as max(x,0) - x*y + log(1 + exp(-|x|))."""
        # max(x, 0) splits its gradient at 0 (1/2) and |x| has none there: the gradient is sigmoid(x) - y everywhere
        loss = self.maximum(0) - self * Y + (1 + (-self.abs()).exp()).log()
        return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()

    def mse(self: Tensor, Y: Tensor) -> Tensor:
        return (self - Y).square().mean()
