"""Convolution, pooling, resizing and padding modes over the last N axes of (N, C, *spatial) tensors, for any N.

Every window op is a view: `_window` turns an axis into (out, kernel) axes with movement ops only, so an N-d
convolution is one elementwise product and one sum (a single kernel forward), and its gradient comes from the
primitives' rules."""

from __future__ import annotations

import math
import numbers
import operator
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.dtype import dtypes, integer_range
from lazygrad.helpers import prod
from lazygrad.tensor_elementwise import broadcast_node, check_same_device
from lazygrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

PAD_MODES = ("constant", "reflect", "replicate", "circular")
INTERPOLATE_MODES = {"nearest": None, "nearest-exact": None, "linear": 1, "bilinear": 2, "trilinear": 3}
# a window of at most this many taps is a stack of shifted slices (see `window_node`), each read under a gate that
# folds away where codegen unrolls the tap loop: it unrolls tap loops this short (test_opt checks that it still does).
# A longer window repeats the axis and reads it through `%`, whose gradient (a col2im) ran at 0.3-0.5 GFLOP/s: with
# up to 7 taps stacked rather than 4, a 5x5 convolution of 8 x 32 x 32² forward and backward went from 46 to 20 ms
# (torch 8), a 7x7 one from 89 to 43 (torch 13), a 7x7 depthwise one from 31 to 10 (torch 18). Strided windows stack
# fewer taps: a stacked 7x7 stem of stride 2 and 3 channels got a copy of its windows before the product, and its
# forward pass ran at half the speed
STACKED_TAPS, STACKED_STRIDED_TAPS = 7, 4
# the fewest input channels (per group) for which a convolution outside training whose windows are costly to read
# in place (a stride past 1, or a kernel past STACKED_TAPS) copies them out and computes channels last
COPIED_WINDOW_CHANNELS = 16


def _is_int(value) -> bool:
    """Any integral (a NumPy int too, as torch takes it), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _pair(value, count: int, name: str) -> tuple[int, ...]:
    """`value` as `count` Python ints: one int repeats, a sequence (or 1-D array) must have `count` of them."""
    if _is_int(value):
        return (operator.index(value),) * count
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = list(value)
    if not isinstance(value, (tuple, list)) or len(value) != count or not all(_is_int(v) for v in value):
        raise ValueError(f"{name} needs one int or {count} ints (one per spatial axis), got {value!r}")
    return tuple(operator.index(v) for v in value)


def _positive(value, count: int, name: str, op_name: str) -> tuple[int, ...]:
    """A stride, dilation or kernel size as `count` positive ints, as torch requires: a zero or negative one would
    build windows that read outside the input."""
    values = _pair(value, count, f"{op_name}: {name}")
    if any(v < 1 for v in values):
        raise ValueError(f"{op_name}: {name} must be positive in every spatial axis, got {value!r}")
    return values


def _check_tensor(value, name: str, op_name: str) -> None:
    if not hasattr(value, "uop"):
        raise TypeError(f"{op_name}: {name} must be a Tensor, got {type(value).__name__}; wrap it with Tensor(...)")


def _check_bias(bias, channels_out: int, op_name: str) -> None:
    """A bias is one value per output channel (a 1-D tensor of C_out), as in torch: not anything that broadcasts."""
    if bias is None:
        return
    _check_tensor(bias, "bias", op_name)
    if bias.shape != (channels_out,):
        raise ValueError(
            f"{op_name}: bias must be 1-D with one value per output channel, shape ({channels_out},), got {bias.shape}"
        )


class ConvMixin:
    """Convolution, transposed convolution, pooling, unpooling, interpolation and padding modes."""

    __slots__ = ()

    # ---- windows -----------------------------------------------------------------------------------------------

    def _window(self: Tensor, axis: int, kernel: int, stride: int, dilation: int) -> Tensor:
        """Axis `axis` of size i becomes two axes (out, kernel) with [o, k] = x[o*stride + k*dilation], as a view
        (see `window_node`)."""
        size = self.shape[axis]
        if (size - dilation * (kernel - 1) - 1) // stride + 1 <= 0:
            raise ValueError(
                f"pool/conv: window {kernel} (dilation {dilation}) does not fit an axis of size {size} in {self.shape}"
            )
        return self._new(window_node(self.uop, axis, kernel, stride, dilation))

    def _pool(self: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """(..., *spatial) → (..., *out, *kernel): every window of the last len(kernel) axes (callers check that
        each window fits)."""
        return self._new(pool_node(self.uop, kernel, stride, dilation))

    def _padding(self: Tensor, padding, count: int, op_name: str = "conv") -> tuple[tuple[int, int], ...]:
        """(before, after) per spatial axis from an int, one int per axis, or torch's flat order (last axis first);
        each a non-negative int (a negative one would crop the input, which torch refuses)."""
        if _is_int(padding):
            pairs = ((operator.index(padding),) * 2,) * count
        elif not isinstance(padding, (tuple, list)):
            raise ValueError(f"{op_name}: padding needs an int or a tuple of ints, got {padding!r}")
        elif len(padding) == count and all(isinstance(p, tuple) and len(p) == 2 for p in padding):
            pairs = tuple(padding)
        elif len(padding) == count:
            pairs = tuple((p, p) for p in padding)
        elif len(padding) == 2 * count:  # torch order: (left, right, top, bottom) for the last axes first
            pairs = tuple(reversed([(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]))
        else:
            raise ValueError(f"{op_name}: padding {padding} needs 1, {count} or {2 * count} values")
        flat = tuple(p for pair in pairs for p in pair)
        if not all(_is_int(p) for p in flat):
            raise ValueError(f"{op_name}: padding needs ints, got {padding!r}")
        pairs = tuple((operator.index(before), operator.index(after)) for before, after in pairs)
        if any(p < 0 for p in flat):
            raise ValueError(
                f"{op_name}: padding must be non-negative, got {padding!r}; to crop, slice the input first"
            )
        return pairs

    # ---- convolution -------------------------------------------------------------------------------------------

    def conv(
        self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride=1, dilation=1, padding=0
    ) -> Tensor:
        """N-d convolution (cross-correlation, as in torch) of (N, C_in, *spatial) with weight
        (C_out, C_in/groups, *kernel); the number of spatial axes comes from the weight. `padding` is an int, one
        int per axis, torch's flat (left, right, top, bottom, ...) order, "valid" or "same". The positional order
        after bias is tinygrad's, (groups, stride, dilation, padding), not F.conv2d's (stride, padding, dilation,
        groups): pass them by keyword."""
        return self._conv(weight, bias, groups, stride, dilation, padding, "conv")

    def conv1d(self: Tensor, weight: Tensor, bias=None, groups: int = 1, stride=1, dilation=1, padding=0) -> Tensor:
        """1-D convolution of (N, C_in, L) with weight (C_out, C_in/groups, k) (tinygrad's positional order, as conv)."""
        return self._conv(weight, bias, groups, stride, dilation, padding, "conv1d", 1)

    def conv2d(self: Tensor, weight: Tensor, bias=None, groups: int = 1, stride=1, dilation=1, padding=0) -> Tensor:
        """2-D convolution of (N, C_in, H, W) with weight (C_out, C_in/groups, kh, kw). The positional order after bias
        is tinygrad's, (groups, stride, dilation, padding), not F.conv2d's: pass them by keyword."""
        return self._conv(weight, bias, groups, stride, dilation, padding, "conv2d", 2)

    def conv3d(self: Tensor, weight: Tensor, bias=None, groups: int = 1, stride=1, dilation=1, padding=0) -> Tensor:
        """3-D convolution of (N, C_in, D, H, W) with weight (C_out, C_in/groups, kd, kh, kw) (tinygrad's positional
        order, as conv)."""
        return self._conv(weight, bias, groups, stride, dilation, padding, "conv3d", 3)

    def _conv(
        self: Tensor, weight, bias, groups, stride, dilation, padding, op_name: str, count: int | None = None
    ) -> Tensor:
        _check_tensor(weight, "weight", op_name)
        check_same_device(op_name, self, weight, bias)
        count = weight.ndim - 2 if count is None else count
        letters = ("L",) if count == 1 else ("H", "W") if count == 2 else tuple(f"S{i}" for i in range(count))
        if count < 1 or self.ndim != count + 2 or weight.ndim != count + 2:
            raise ValueError(
                f"{op_name}: need an input (N, C_in, {', '.join(letters)}) and a weight (C_out, C_in/groups, "
                f"{', '.join('k' + c for c in letters)}) with {count + 2} dimensions each, got {self.shape} and "
                f"{weight.shape}"
            )
        if not _is_int(groups) or groups < 1:
            raise ValueError(f"{op_name}: groups must be a positive int, got {groups!r}")
        groups = operator.index(groups)
        batch, channels_in = self.shape[:2]
        channels_out, group_channels, *kernel = weight.shape
        if channels_in != group_channels * groups or channels_out % groups:
            raise ValueError(
                f"{op_name}: input {self.shape} with groups={groups} needs weight (C_out, {channels_in // groups}, "
                f"...) with C_out divisible by {groups}, got {weight.shape}"
            )
        if any(k < 1 for k in kernel):
            raise ValueError(
                f"{op_name}: the weight {weight.shape} has an empty kernel; every kernel size must be positive"
            )
        _check_bias(bias, channels_out, op_name)
        stride, dilation = _positive(stride, count, "stride", op_name), _positive(dilation, count, "dilation", op_name)
        if isinstance(padding, str):
            padding = self._named_padding(padding, kernel, stride, dilation, op_name)
        pads = self._padding(padding, count, op_name)
        x = self.pad(((0, 0), (0, 0)) + pads) if any(p != (0, 0) for p in pads) else self
        for axis, (size, k, d) in enumerate(zip(x.shape[2:], kernel, dilation)):
            if size < d * (k - 1) + 1:
                raise ValueError(
                    f"{op_name}: kernel {tuple(kernel)} (dilation {dilation}) does not fit the padded input "
                    f"{x.shape}: spatial axis {axis} has {size} elements; pad the input or use a smaller kernel"
                )
        windows = pool_node(x.uop, tuple(kernel), stride, dilation)
        out = windows.shape[2 : 2 + count]
        per_group = channels_out // groups
        # positions before channels and taps: where the windows get a buffer of their own (an im2col, when they are
        # costly to compute twice, or shared by the forward pass and the weight's gradient), each position's
        # channels and taps lie in a row, so every product over them (forward, the weight's and the windows'
        # gradients) reads or writes that row contiguously, whatever the image size
        windows = _reshape(windows, (batch, groups, group_channels, *out, *kernel))
        windows = _permute(windows, (0, 1, *range(3, 3 + count), 2, *range(3 + count, 3 + 2 * count)))
        windows = _reshape(windows, (batch, groups, 1, *out, group_channels, *kernel))
        weights = _reshape(weight.uop, (1, groups, per_group, *(1,) * count, group_channels, *kernel))
        taps = tuple(range(3 + count, 4 + 2 * count))  # each output's channels and taps
        costly = any(s > 1 for s in stride) and prod(kernel) > 1 or max(kernel) > STACKED_TAPS
        if costly and group_channels >= COPIED_WINDOW_CHANNELS and not type(self).training:
            # outside training (where the weight's gradient reads the windows too, and the scheduler copies them out
            # anyway), windows read in place with a stride or through a long kernel's `%` ran at 5-15 GFLOP/s; copied
            # out, a row per position, they are x @ wᵀ with positions as rows (16 x 64 x 56² -> 128, 3x3, stride 2:
            # 115 -> 27 ms; 5x5: 430 -> 105). Few input channels (an RGB stem) are read well in place (7x7 stride 2:
            # 39 ms, 110 copied)
            cols = x._new(windows).permute(0, *range(3, 3 + count), 1, 2, *range(3 + count, 4 + 2 * count))
            w = weight.reshape(*(1,) * (1 + count), groups, per_group, group_channels, *kernel)
            result = cols.contiguous()._sum_of_products(w, tuple(range(count + 3, 2 * count + 4)))
            result = result.permute(0, count + 1, count + 2, *range(1, 1 + count)).reshape(batch, channels_out, *out)
            return result if bias is None else result + bias.reshape(1, -1, *(1,) * count)
        dtype = self.dtype
        if (
            dtype in (dtypes.float32, dtypes.float64)
            and weight.dtype == dtype
            and weight.device == self.device
            and (bias is None or (bias.dtype == dtype and bias.device == self.device))
        ):
            # (the common case, built on the nodes: the very nodes of the steps below, without a tensor per step)
            full = (batch, groups, per_group, *out, group_channels, *kernel)
            products = UOp(Ops.MUL, dtype, (broadcast_node(windows, full), broadcast_node(weights, full)))
            reduced = UOp(Ops.REDUCE, dtype, (products,), (Ops.ADD, taps))
            reduced = UOp(Ops.RESHAPE, dtype, (reduced,), full[: 3 + count])
            result = UOp(Ops.RESHAPE, dtype, (reduced,), (batch, channels_out, *out))
            if bias is not None:
                shaped = UOp(Ops.RESHAPE, dtype, (bias.uop,), (1, channels_out, *(1,) * count))
                result = UOp(Ops.ADD, dtype, (result, broadcast_node(shaped, result.shape)))
            return self._new(result)
        result = x._new(windows)._sum_of_products(weight._new(weights), taps).reshape(batch, channels_out, *out)
        return result if bias is None else result + bias.reshape(1, -1, *(1,) * count)

    def _named_padding(self: Tensor, padding: str, kernel, stride, dilation, op_name: str):
        if padding == "valid":
            return 0
        if padding != "same":
            raise ValueError(f"{op_name}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError(f"{op_name}: padding='same' needs stride 1, got stride {stride}")
        # torch puts the odd element of the total padding after
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple(p for total in reversed(totals) for p in (total // 2, total - total // 2))

    def conv_transpose(
        self: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride=1,
        dilation=1,
        padding=0,
        output_padding=0,
    ) -> Tensor:
        """N-d transposed convolution (the gradient of conv with respect to its input) of (N, C_in, *spatial) with
        weight (C_in, C_out/groups, *kernel), as torch's conv_transpose."""
        return self._conv_transpose(weight, bias, groups, stride, dilation, padding, output_padding, "conv_transpose")

    def conv_transpose1d(self: Tensor, weight, bias=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0):
        """1-D transposed convolution: (N, C_in, L) with weight (C_in, C_out/groups, k)."""
        return self._conv_transpose(
            weight, bias, groups, stride, dilation, padding, output_padding, "conv_transpose1d", 1
        )

    def conv_transpose2d(self: Tensor, weight, bias=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0):
        """2-D transposed convolution: (N, C_in, H, W) with weight (C_in, C_out/groups, kh, kw)."""
        return self._conv_transpose(
            weight, bias, groups, stride, dilation, padding, output_padding, "conv_transpose2d", 2
        )

    def conv_transpose3d(self: Tensor, weight, bias=None, groups=1, stride=1, dilation=1, padding=0, output_padding=0):
        """3-D transposed convolution: (N, C_in, D, H, W) with weight (C_in, C_out/groups, kd, kh, kw)."""
        return self._conv_transpose(
            weight, bias, groups, stride, dilation, padding, output_padding, "conv_transpose3d", 3
        )

    def _conv_transpose(
        self: Tensor, weight, bias, groups, stride, dilation, padding, output_padding, op_name: str, count=None
    ) -> Tensor:
        _check_tensor(weight, "weight", op_name)
        check_same_device(op_name, self, weight, bias)
        count = weight.ndim - 2 if count is None else count
        if count < 1 or self.ndim != count + 2 or weight.ndim != count + 2:
            raise ValueError(
                f"{op_name}: need an input (N, C_in, *spatial) and a weight (C_in, C_out/groups, *kernel) with "
                f"{count + 2} dimensions each, got {self.shape} and {weight.shape}"
            )
        if not _is_int(groups) or groups < 1 or self.shape[1] != weight.shape[0] or weight.shape[0] % groups:
            raise ValueError(
                f"{op_name}: input {self.shape} needs weight ({self.shape[1]}, C_out/groups, ...) with "
                f"{self.shape[1]} divisible by groups={groups}, got {weight.shape}"
            )
        groups = operator.index(groups)
        stride, dilation = _positive(stride, count, "stride", op_name), _positive(dilation, count, "dilation", op_name)
        output_padding = _pair(output_padding, count, f"{op_name}: output_padding")
        padding = _pair(padding, count, f"{op_name}: padding")
        if any(p < 0 for p in padding):
            raise ValueError(f"{op_name}: padding must be non-negative, got {padding}")
        for extra, s, d in zip(output_padding, stride, dilation):
            if not 0 <= extra < max(s, d):
                raise ValueError(
                    f"{op_name}: output_padding {output_padding} must be smaller than the stride {stride} or the "
                    f"dilation {dilation} in each axis, and non-negative"
                )
        kernel = weight.shape[2:]
        if any(k < 1 for k in kernel):
            raise ValueError(
                f"{op_name}: the weight {weight.shape} has an empty kernel; every kernel size must be positive"
            )
        _check_bias(bias, weight.shape[1] * groups, op_name)
        sizes = tuple(
            (i - 1) * s - 2 * p + d * (k - 1) + extra + 1
            for i, s, p, d, k, extra in zip(self.shape[2:], stride, padding, dilation, kernel, output_padding)
        )
        if any(size < 1 for size in sizes):
            raise ValueError(
                f"{op_name}: the output would be empty: (size - 1) * stride - 2 * padding + dilation * (kernel - 1) "
                f"+ output_padding + 1 gives {sizes} for the input {self.shape}, weight {weight.shape}, stride "
                f"{stride}, padding {padding}, dilation {dilation} and output_padding {output_padding}; use a smaller "
                "padding"
            )
        if any(s > 1 for s in stride) and all(d == 1 for d in dilation):
            out = self._conv_transpose_by_phases(weight, groups, stride, padding, sizes, op_name)
            return out if bias is None else out + bias.reshape(1, -1, *(1,) * count)
        # pad by the kernel's reach less `padding` and convolve with the flipped kernel; a stride past 1 (with a
        # dilation) first spreads the input stride apart (stride-1 zeros after each element, in one pad over all
        # axes; the trailing ones are cropped by the pad after)
        spatial, x = self.shape[2:], self
        if any(s > 1 for s in stride):
            x = x.reshape(*self.shape[:2], *(s for size in spatial for s in (size, 1)))
            x = x.pad(((0, 0), (0, 0)) + tuple(p for s in stride for p in ((0, 0), (0, s - 1))))
            x = x.reshape(*self.shape[:2], *(size * s for size, s in zip(spatial, stride)))
        pads = tuple(
            (d * (k - 1) - p, d * (k - 1) - p + extra - (s - 1))
            for k, d, p, extra, s in zip(kernel, dilation, padding, output_padding, stride)
        )
        channels_in, per_group = weight.shape[:2]
        w = weight.reshape(groups, channels_in // groups, per_group, *kernel).transpose(1, 2)
        w = w.reshape(groups * per_group, channels_in // groups, *kernel).flip(tuple(range(2, 2 + count)))
        w = w.contiguous()  # (in the layout a convolution's weight has: see contiguous_gradient)
        x = x.pad(((0, 0), (0, 0)) + pads)
        return x._conv(w, bias, groups, 1, dilation, 0, op_name, count)

    def _conv_transpose_by_phases(
        self: Tensor, weight: Tensor, groups: int, stride, padding, sizes, op_name: str
    ) -> Tensor:
        """A transposed convolution with a stride past 1 (and no dilation), without the zeros a spread input would
        multiply: an output at position q·stride + r (before the padding's crop) takes the taps r, r + stride,
        r + 2·stride, ... of the kernel, each phase r its own kernel of ⌈kernel/stride⌉ taps over the unspread
        input. One convolution with every phase's kernel as output channels computes them all; a reshape then
        interleaves the phases. Convolving the spread input instead spent (stride^n - 1)/stride^n of its
        multiply-adds on zeros."""
        batch, channels_in, *spatial = self.shape
        count, kernel, per_group = len(spatial), weight.shape[2:], weight.shape[1]
        taps = [-(-k // s) for k, s in zip(kernel, stride)]
        w = weight.reshape(groups, channels_in // groups, per_group, *kernel)
        if any(t * s != k for t, s, k in zip(taps, stride, kernel)):  # zero taps up to whole strides
            w = w.pad(((0, 0),) * 3 + tuple((0, t * s - k) for t, s, k in zip(taps, stride, kernel)))
        # (group, in, out, tap, phase, ...) -> (group, *phases, out, in, *taps reversed)
        w = w.reshape(groups, channels_in // groups, per_group, *(n for t, s in zip(taps, stride) for n in (t, s)))
        w = w.flip(tuple(3 + 2 * axis for axis in range(count)))
        w = w.permute(0, *(4 + 2 * axis for axis in range(count)), 2, 1, *(3 + 2 * axis for axis in range(count)))
        # (copied in the layout a convolution's weight has: see contiguous_gradient)
        w = w.reshape(groups * prod(stride) * per_group, channels_in // groups, *taps).contiguous()
        x = self.pad(((0, 0), (0, 0)) + tuple((t - 1, t - 1) for t in taps))
        # (in a buffer of its own: the convolution stores its rows whole, where through the interleave every store
        # would be stride apart, and the block scalar)
        phases = x._conv(w, None, groups, 1, 1, 0, op_name, count).contiguous()
        lengths = phases.shape[2:]
        phases = phases.reshape(batch, groups, *stride, per_group, *lengths)
        order = (0, 1, 2 + count, *(n for axis in range(count) for n in (3 + count + axis, 2 + axis)))
        out = phases.permute(order).reshape(batch, groups * per_group, *(n * s for n, s in zip(lengths, stride)))
        return out.pad(
            ((0, 0), (0, 0)) + tuple((-p, size + p - n * s) for p, size, n, s in zip(padding, sizes, lengths, stride))
        )

    # ---- pooling -----------------------------------------------------------------------------------------------

    def _pool_args(self: Tensor, kernel_size, stride, dilation, padding, count: int, op_name: str):
        """The kernel, stride and dilation (`count` positive ints each) and the (before, after) padding per axis of
        a pooling op, checked as torch checks them."""
        if self.ndim < count + 1:
            raise ValueError(f"{op_name}: needs an input with at least {count + 1} dimensions, got {self.shape}")
        kernel = _positive(kernel_size, count, "kernel_size", op_name)
        stride = (
            kernel
            if stride is None or isinstance(stride, tuple) and not stride
            else _positive(stride, count, "stride", op_name)
        )
        dilation = _positive(dilation, count, "dilation", op_name)
        pads = self._padding(padding, count, op_name)
        # (torch's limit, of the kernel without its dilation: a window then always holds an input element)
        if any(max(pair) > k // 2 for pair, k in zip(pads, kernel)):
            raise ValueError(f"{op_name}: padding {padding} must be at most half the kernel {kernel}, as in torch")
        return kernel, stride, dilation, pads

    def _pool_nd(self: Tensor, args, ceil_mode: bool, value, op_name: str) -> tuple[Tensor, tuple[int, ...]]:
        """Windows (..., *out, *kernel) of the last axes padded with `value` (and, for ceil_mode, on the right where
        the last window hangs over), and the ceil_mode extra per axis; `args` from `_pool_args`."""
        kernel, stride, dilation, pads = args
        count = len(kernel)
        extras = []
        for size, k, s, d, (before, after) in zip(self.shape[-count:], kernel, stride, dilation, pads):
            # torch's output size: with ceil_mode a last partial window counts if it starts in the input or its
            # left padding (so an input smaller than the kernel still has one window)
            out = (size + before + after - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
            if ceil_mode and (out - 1) * s >= size + before:
                out -= 1
            if out < 1:
                raise ValueError(
                    f"{op_name}: kernel {kernel} (dilation {dilation}) does not fit the input {self.shape} padded "
                    f"by {pads}; pad it more, use a smaller kernel or ceil_mode=True"
                )
            # (only a dilated kernel can skip over the input; torch then gives -inf and an index outside the input)
            if d > 1:
                taps = np.arange(out)[:, None] * s - before + np.arange(k) * d
                if empty := np.flatnonzero(((taps < 0) | (taps >= size)).all(1)).tolist():
                    raise ValueError(
                        f"{op_name}: window {empty[0]} along axis {self.ndim - count + len(extras)} of the input "
                        f"{self.shape} holds only padding (kernel {kernel}, dilation {dilation}, padding {pads}); "
                        "use a smaller padding or dilation"
                    )
            extras.append(max(0, (out - 1) * s + d * (k - 1) + 1 - (size + before + after)))
        full = tuple((before, after + extra) for (before, after), extra in zip(pads, extras))
        x = self.pad(((0, 0),) * (self.ndim - count) + full, value=value) if any(p != (0, 0) for p in full) else self
        # (the extra padding ends exactly at the last window, so the windows are the `out` ones counted above)
        return x._pool(kernel, stride, dilation), tuple(extras)

    def _pool_value(self: Tensor, largest: bool):
        if self.dtype.is_float:
            return float("-inf") if largest else float("inf")
        return integer_range(self.dtype)[0 if largest else 1] if self.dtype != dtypes.bool else (not largest)

    def _max_pool(self: Tensor, count, kernel_size, stride, dilation, padding, ceil_mode, return_indices, name):
        args = self._pool_args(kernel_size, stride, dilation, padding, count, name)
        taps, extras = self._pool_nd(args, ceil_mode, self._pool_value(True), name)
        taps = taps.flatten(-count)
        values = taps.max(-1)
        # (the gradient of tied maxima is shared among them, as max's is; torch gives it to the first alone. Choosing
        # one tap here cost a ResNet18 training step 13 more kernels, for ties that follow a ReLU's zeros, whose
        # gradient is 0 anyway)
        if not return_indices:
            return values
        tensor = type(self)
        # the first maximum of each window (as torch) among the window's taps in the input: padding ties with a
        # maximum of -inf but is never chosen
        is_max = taps == values.unsqueeze(-1)
        if self.dtype.is_float:  # a window holding NaN has the maximum NaN: its first NaN, as in torch
            is_max = is_max | (taps != taps)
        spatial = self.shape[-count:]
        if any(pair != (0, 0) for pair in args[3]) or any(extras):
            inside = tensor.ones(1, *spatial, dtype=dtypes.bool, device=self.device)._pool_nd(
                args, ceil_mode, False, name
            )
            is_max = is_max & inside[0].flatten(-count)
        countdown = tensor.arange(taps.shape[-1], 0, -1, device=self.device)
        best = is_max.where(countdown, 0).max(-1)
        # the tap's position in the unpadded input's flattened spatial axes, from the window's place and the tap's
        # place in the kernel (its flat number unravelled, last axis fastest); found in int32, int64 as in torch
        tap, position, place = taps.shape[-1] - best, 0, 1
        kernel, stride, dilation, pads = args
        out = taps.shape[-1 - count : -1]
        for axis in reversed(range(count)):
            offset, tap = tap % kernel[axis], tap // kernel[axis]
            start = tensor.arange(out[axis], device=self.device).reshape(out[axis], *(1,) * (count - 1 - axis))
            position = position + (start * stride[axis] - pads[axis][0] + offset * dilation[axis]) * place
            place *= spatial[axis]
        return values, position.cast(dtypes.int64)

    def max_pool1d(self, kernel_size=2, stride=None, dilation=1, padding=0, ceil_mode=False, return_indices=False):
        """Max over windows of the last axis; `return_indices` also gives each maximum's position. The positional
        order is tinygrad's, (kernel_size, stride, dilation, padding), not torch's (..., padding, dilation): pass
        padding and dilation by keyword."""
        return self._max_pool(1, kernel_size, stride, dilation, padding, ceil_mode, return_indices, "max_pool1d")

    def max_pool2d(self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, return_indices=False):
        """Max over windows of the last two axes; `return_indices` also gives each maximum's position in H*W (the
        input for max_unpool2d). The positional order is tinygrad's, (kernel_size, stride, dilation, padding), not
        torch's (..., padding, dilation): pass padding and dilation by keyword."""
        return self._max_pool(2, kernel_size, stride, dilation, padding, ceil_mode, return_indices, "max_pool2d")

    def max_pool3d(self, kernel_size=2, stride=None, dilation=1, padding=0, ceil_mode=False, return_indices=False):
        """Max over windows of the last three axes (tinygrad's positional order, as max_pool2d)."""
        return self._max_pool(3, kernel_size, stride, dilation, padding, ceil_mode, return_indices, "max_pool3d")

    def _avg_pool(self: Tensor, count, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad, name):
        source = self._to_float()
        args = self._pool_args(kernel_size, stride, dilation, padding, count, name)
        windows, extras = source._pool_nd(args, ceil_mode, 0.0, name)
        kernel, strides, dilations, pads = args
        if (count_include_pad or all(p == (0, 0) for p in pads)) and not any(extras):
            return windows.mean(tuple(range(-count, 0)))
        # divide by how many places of each window lie in the input (plus its padding, with count_include_pad):
        # fixed by the shapes, so computed here, one factor per axis
        divisor = np.ones((), np.float32)
        for size, out, k, s, d, (before, after) in zip(
            self.shape[-count:], windows.shape[-2 * count : -count], kernel, strides, dilations, pads
        ):
            taps = np.arange(out)[:, None] * s - before + np.arange(k)[None, :] * d
            low, high = (-before, size + after) if count_include_pad else (0, size)
            divisor = np.multiply.outer(divisor, ((taps >= low) & (taps < high)).sum(1).astype(np.float32))
        total = windows._sum_unwidened(tuple(range(-count, 0)))
        return total / type(self)(divisor, device=self.device).cast(total.dtype)

    def avg_pool1d(self, kernel_size=2, stride=None, dilation=1, padding=0, ceil_mode=False, count_include_pad=True):
        """Mean over windows of the last axis (tinygrad's positional order, as max_pool2d)."""
        return self._avg_pool(1, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad, "avg_pool1d")

    def avg_pool2d(
        self, kernel_size=(2, 2), stride=None, dilation=1, padding=0, ceil_mode=False, count_include_pad=True
    ):
        """Mean over windows of the last two axes (padding counts in the divisor unless count_include_pad=False). The
        positional order is tinygrad's, (kernel_size, stride, dilation, padding), not torch's (..., padding,
        ceil_mode): pass padding by keyword."""
        return self._avg_pool(2, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad, "avg_pool2d")

    def avg_pool3d(self, kernel_size=2, stride=None, dilation=1, padding=0, ceil_mode=False, count_include_pad=True):
        """Mean over windows of the last three axes (tinygrad's positional order, as avg_pool2d)."""
        return self._avg_pool(3, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad, "avg_pool3d")

    def max_unpool2d(self: Tensor, indices: Tensor, kernel_size=(2, 2), stride=None, padding=0, output_size=None):
        """The inverse of max_pool2d(return_indices=True): each value placed at its index in the H*W output plane,
        zeros elsewhere."""
        return self._max_unpool(indices, 2, kernel_size, stride, padding, output_size, "max_unpool2d")

    def max_unpool1d(self: Tensor, indices: Tensor, kernel_size=2, stride=None, padding=0, output_size=None):
        """The inverse of max_pool1d(return_indices=True)."""
        return self._max_unpool(indices, 1, kernel_size, stride, padding, output_size, "max_unpool1d")

    def max_unpool3d(self: Tensor, indices: Tensor, kernel_size=2, stride=None, padding=0, output_size=None):
        """The inverse of max_pool3d(return_indices=True)."""
        return self._max_unpool(indices, 3, kernel_size, stride, padding, output_size, "max_unpool3d")

    def _max_unpool(self: Tensor, indices, count, kernel_size, stride, padding, output_size, op_name: str) -> Tensor:
        if not hasattr(indices, "uop") or indices.shape != self.shape or indices.dtype.is_float:
            raise ValueError(
                f"{op_name}: indices must be an int Tensor of the input's shape {self.shape} (from max_pool with "
                f"return_indices=True), got {getattr(indices, 'shape', type(indices).__name__)}"
            )
        kernel = _positive(kernel_size, count, "kernel_size", op_name)
        stride = kernel if stride is None else _positive(stride, count, "stride", op_name)
        pads = _pair(padding, count, f"{op_name}: padding")
        if any(p < 0 for p in pads):
            raise ValueError(f"{op_name}: padding must be non-negative, got {padding!r}")
        size = tuple((i - 1) * s - 2 * p + k for i, s, p, k in zip(self.shape[-count:], stride, pads, kernel))
        if output_size is not None:
            if len(tuple(output_size)) not in (count, self.ndim):
                raise ValueError(
                    f"{op_name}: output_size {tuple(output_size)} needs the {count} spatial sizes (or all "
                    f"{self.ndim} sizes), for input {self.shape}"
                )
            size = tuple(output_size)[-count:]
        plane = math.prod(size)
        values = indices.numpy()
        if ((values < 0) | (values >= plane)).any():
            raise ValueError(
                f"{op_name}: index {values[(values < 0) | (values >= plane)].flat[0]} is outside the output plane "
                f"{size} ({plane} places); pass the indices max_pool returned, and output_size if it was odd"
            )
        batch = self.shape[:-count]
        flat_values = self.reshape(*batch, -1, 1)
        mask = indices.reshape(*batch, -1, 1) == type(self).arange(plane, device=self.device)
        # overlapping windows (a stride below the kernel) may pick one element twice: it is placed once, not summed
        placed = mask.where(flat_values, self._pool_value(True)).max(-2)
        return mask.any(-2).where(placed, 0).cast(self.dtype).reshape(*batch, *size)

    # ---- resizing ----------------------------------------------------------------------------------------------

    def interpolate(
        self: Tensor, size=None, mode: str = "nearest", align_corners: bool | None = None, scale_factor=None
    ) -> Tensor:
        """Resize the spatial axes (all but the first two) to `size` or by `scale_factor`, as torch's
        F.interpolate: nearest (the default, as torch's; tinygrad's default is linear, so pass `mode=` to port
        code), nearest-exact, bilinear (4-D), trilinear (5-D) or linear (here any number of axes, as in tinygrad);
        `align_corners` for the linear modes. A uint8 image resized linearly stays uint8, rounded as torch rounds it
        (see `_resize_axis_uint8`); other ints and bools are an error there, as in torch. The arguments after `size`
        are tinygrad's order: pass them by keyword."""
        if mode not in INTERPOLATE_MODES:
            raise ValueError(f"interpolate: mode must be one of {', '.join(INTERPOLATE_MODES)}, got {mode!r}")
        linear = not mode.startswith("nearest")
        if linear and not self.dtype.is_float and self.dtype != dtypes.uint8:
            raise TypeError(
                f"interpolate: mode {mode!r} takes float or uint8 tensors, as torch's, got {self.dtype} of shape "
                f"{self.shape}; cast it first (.float() for float results, .cast(dtypes.uint8) for an image)"
            )
        count = self.ndim - 2
        wanted = INTERPOLATE_MODES[mode]
        if count < 1 or wanted not in (None, 1) and wanted != count:
            needed = f"{wanted + 2}-D" if wanted not in (None, 1) else "at least 3-D"
            raise ValueError(f"interpolate: mode {mode!r} needs a {needed} input (N, C, *spatial), got {self.shape}")
        if align_corners and wanted is None:
            raise ValueError(f"interpolate: align_corners only applies to the linear modes, not {mode!r}")
        if (size is None) == (scale_factor is None):
            raise ValueError("interpolate: give exactly one of size and scale_factor")
        if size is not None:
            sizes = _pair(size, count, "interpolate: size")
        else:
            number = numbers.Real
            factors = (scale_factor,) * count if isinstance(scale_factor, number) else tuple(scale_factor)
            if len(factors) != count or not all(isinstance(f, number) and not isinstance(f, bool) for f in factors):
                raise ValueError(f"interpolate: scale_factor needs 1 or {count} numbers, got {scale_factor!r}")
            sizes = tuple(int(math.floor(in_size * f)) for in_size, f in zip(self.shape[2:], factors))
        if any(s <= 0 for s in sizes) or 0 in self.shape[2:]:
            given = f"size {size!r}" if size is not None else f"scale_factor {scale_factor!r}"
            raise ValueError(
                f"interpolate: input and output sizes must be positive, got output sizes {sizes} (from {given}) for "
                f"the input {self.shape}"
            )
        if size is not None:
            scales = [in_size / out for in_size, out in zip(self.shape[2:], sizes)]
        else:
            scales = [1 / f for f in factors]  # torch uses the given factor itself, not the ratio of sizes
        axes = list(enumerate(zip(self.shape[2:], sizes, scales), start=2))
        if linear and self.dtype == dtypes.uint8:
            # torch's order: the last axis first, each rounded to uint8 before the next; an axis of unchanged size
            # is left as it is (a scale_factor near 1 moves nothing)
            x = self
            for axis, (in_size, out, scale) in reversed(axes):
                if out != in_size:
                    x = x._resize_axis_uint8(axis, in_size, out, scale, bool(align_corners))
            return x
        x = self
        for axis, (in_size, out, scale) in axes:
            x = x._resize_axis(axis, in_size, out, scale, mode, bool(align_corners))
        return x

    def _resize_axis(self: Tensor, axis: int, in_size: int, out: int, scale: float, mode: str, align: bool) -> Tensor:
        targets = np.arange(out, dtype=np.float64)
        if mode.startswith("nearest"):
            offset = 0.5 if mode == "nearest-exact" else 0.0
            source = np.minimum(np.floor((targets + offset) * scale).astype(np.int64), in_size - 1)
            if out % in_size == 0 and np.array_equal(source, np.repeat(np.arange(in_size), out // in_size)):
                return self.repeat_interleave(out // in_size, axis)  # a whole-number upscale is a view
            return self._take(axis, source)
        source = _linear_sources(in_size, out, scale, align)
        low = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
        high = np.minimum(low + 1, in_size - 1)
        shape = [1] * self.ndim
        shape[axis] = out
        weight = type(self)((source - low).astype(np.float32), device=self.device).reshape(shape).cast(self.dtype)
        return self._take(axis, low) * (1 - weight) + self._take(axis, high) * weight

    def _resize_axis_uint8(self: Tensor, axis: int, in_size: int, out: int, scale: float, align: bool) -> Tensor:
        """Linear resizing of a uint8 axis as torch's (UpSampleKernel.cpp, after Pillow): each output's two weights in
        float64 made int16 at the precision the axis' largest weight allows (14 to 22 bits), summed in int32 with
        the pixels, rounded and clamped to uint8: torch's values exactly."""
        source = _linear_sources(in_size, out, scale, align)
        # (torch takes the floor of the source index as a float32)
        low = np.minimum(np.floor(source.astype(np.float32)).astype(np.int64), in_size - 1)
        fraction = np.clip(source - low, 0.0, 1.0)
        # the triangle filter at -fraction and 1 - fraction, as torch computes them; at the last pixel both fall on it
        weight_low, weight_high = 1 - fraction, 1 - (1 - fraction)
        high = np.minimum(low + 1, in_size - 1)
        last = high == low
        weight_low, weight_high = np.where(last, weight_low + weight_high, weight_low), np.where(last, 0.0, weight_high)
        # the most bits (up to 22) that keep twice the largest weight below 2**15
        largest = max(weight_low.max(), weight_high.max())
        precision = next((bits for bits in range(22) if int(0.5 + largest * (1 << (bits + 1))) >= 1 << 15), 22)
        shape = [1] * self.ndim
        shape[axis] = out
        total = 1 << (precision - 1)  # (a half, so that the shift below rounds)
        for positions, weights in ((low, weight_low), (high, weight_high)):
            integer = np.floor(0.5 + weights * (1 << precision)).astype(np.int32)
            column = type(self)(integer, device=self.device).reshape(shape)
            total = self._take(axis, positions).cast(dtypes.int32) * column + total
        return (total >> precision).clip(0, 255).cast(dtypes.uint8)

    def _take(self: Tensor, axis: int, positions: np.ndarray) -> Tensor:
        """The elements at fixed `positions` along `axis`."""
        if np.array_equal(positions, np.arange(self.shape[axis])):
            return self
        return self[(slice(None),) * axis + (positions,)]

    # ---- padding modes -----------------------------------------------------------------------------------------

    def _pad_mode(self: Tensor, pairs: tuple[tuple[int, int], ...], mode: str) -> Tensor:
        """Pad by reflecting (without repeating the edge), repeating the edge, or wrapping around."""
        if mode not in PAD_MODES:
            raise ValueError(f"pad: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
        x = self
        for axis, (before, after) in enumerate(pairs):
            if (before, after) == (0, 0):
                continue
            size = x.shape[axis]
            limit = size - 1 if mode == "reflect" else size
            if min(before, after) < 0 or max(before, after) > limit or (mode == "replicate" and size == 0):
                raise ValueError(
                    f"pad: {mode} padding ({before}, {after}) of axis {axis} of {self.shape} must be non-negative and "
                    f"{'smaller than' if mode == 'reflect' else 'at most'} the axis' size {size}"
                )

            def part(start: int, end: int, x=x, axis=axis) -> Tensor:
                return x.shrink(tuple((start, end) if a == axis else None for a in range(x.ndim)))

            if mode == "reflect":
                head, tail = part(1, before + 1).flip(axis), part(size - after - 1, size - 1).flip(axis)
            elif mode == "replicate":
                shape = list(x.shape)
                head = part(0, 1).expand(*(before if a == axis else s for a, s in enumerate(shape)))
                tail = part(size - 1, size).expand(*(after if a == axis else s for a, s in enumerate(shape)))
            else:
                head, tail = part(size - before, size), part(0, after)
            x = head.cat(x, tail, dim=axis)
        return x


# ---- windows, built on the nodes ------------------------------------------------------------------------------------
# (movement ops only, whose shapes the window arithmetic guarantees: built without a tensor and its checks per step,
# as windows are the bulk of a convolution's graph)


def _linear_sources(in_size: int, out: int, scale: float, align: bool) -> np.ndarray:
    """Where each of `out` outputs of a linear resize reads its input axis of `in_size`, in float64 (torch's)."""
    targets = np.arange(out, dtype=np.float64)
    if align:
        return targets * ((in_size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    return np.maximum((targets + 0.5) * scale - 0.5, 0.0)


def _shrink_axis(node: UOp, axis: int, start: int, end: int) -> UOp:
    shape = node.shape
    if start == 0 and end == shape[axis]:
        return node
    arg = tuple((start, end) if i == axis else (0, size) for i, size in enumerate(shape))
    return UOp(Ops.SHRINK, node.dtype, (node,), arg)


def _pad_axis(node: UOp, axis: int, before: int, after: int) -> UOp:
    if before == 0 and after == 0:
        return node
    return UOp(
        Ops.PAD, node.dtype, (node,), tuple((before, after) if i == axis else (0, 0) for i in range(len(node.shape)))
    )


def _reshape(node: UOp, shape: tuple[int, ...]) -> UOp:
    return node if shape == node.shape else UOp(Ops.RESHAPE, node.dtype, (node,), shape)


def _permute(node: UOp, order: tuple[int, ...]) -> UOp:
    return node if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, node.dtype, (node,), order)


def window_node(x: UOp, axis: int, kernel: int, stride: int, dilation: int) -> UOp:
    """Axis `axis` of size i becomes two axes (out, kernel) with [o, k] = x[o*stride + k*dilation], as a view (the
    window must fit: out >= 1).

    Windows that do not overlap (stride >= kernel, no dilation) are rows of a reshape: (out, stride), cut to
    (out, kernel). A small kernel stacks one strided slice per tap: kernels index it with plain sums (h + kh) under a
    gate that folds away once codegen unrolls the tap loop, and its gradient adds shifted copies. A larger kernel
    repeats the axis and re-reads it with rows of length R = m*i + dilation: row k then starts at element
    k*dilation (mod i), so a plain reshape and shrink line the windows up without a gate per tap (at the price of
    `%` in the index, and in the gradient)."""
    shape = x.shape
    size = shape[axis]
    out = (size - dilation * (kernel - 1) - 1) // stride + 1
    before, after = shape[:axis], shape[axis + 1 :]
    if stride >= kernel and dilation == 1:
        x = _shrink_axis(_pad_axis(x, axis, 0, max(0, out * stride - size)), axis, 0, out * stride)
        return _shrink_axis(_reshape(x, (*before, out, stride, *after)), axis + 1, 0, kernel)
    if kernel <= (STACKED_TAPS if stride == 1 else STACKED_STRIDED_TAPS):
        # the taps stacked along a new axis: each slice gets that axis, padded to the kernel's length, and added
        span = (out - 1) * stride + 1
        join = Ops.OR if x.dtype == dtypes.bool else Ops.ADD
        stacked = None
        for tap in range(kernel):
            start = tap * dilation
            tap_values = _shrink_axis(x, axis, start, start + span)
            if stride > 1:  # every stride-th element: pad to out*stride, fold into (out, stride), keep column 0
                tap_values = _pad_axis(tap_values, axis, 0, out * stride - span)
                tap_values = _reshape(tap_values, (*before, out, stride, *after))
                tap_values = _shrink_axis(tap_values, axis + 1, 0, 1)
                # (a reshape the next one makes redundant, kept: without it two of ResNet18's kernels come out
                # shaped differently, and these nodes stay those of the steps through tensors)
                tap_values = _reshape(tap_values, (*before, out, *after))
            tap_values = _pad_axis(_reshape(tap_values, (*before, out, 1, *after)), axis + 1, tap, kernel - tap - 1)
            stacked = tap_values if stacked is None else UOp(join, x.dtype, (stacked, tap_values))
        return stacked
    row = size + dilation
    while row < out * stride:
        row += size
    repeats = math.ceil(kernel * row / size)
    x = UOp(Ops.EXPAND, x.dtype, (_reshape(x, (*before, 1, *shape[axis:])),), (*before, repeats, *shape[axis:]))
    x = _shrink_axis(_reshape(x, (*before, repeats * size, *after)), axis, 0, kernel * row)
    x = _shrink_axis(_reshape(x, (*before, kernel, row, *after)), axis + 1, 0, out * stride)
    x = _shrink_axis(_reshape(x, (*before, kernel, out, stride, *after)), axis + 2, 0, 1)
    x = _reshape(x, (*before, kernel, out, *after))
    order = list(range(len(x.shape)))
    order[axis], order[axis + 1] = axis + 1, axis
    return _permute(x, tuple(order))


def pool_node(x: UOp, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> UOp:
    """(..., *spatial) → (..., *out, *kernel): every window of the last len(kernel) axes."""
    count = len(kernel)
    first = len(x.shape) - count
    for number in range(count):
        # earlier spatial axes have become (out, kernel) pairs
        x = window_node(x, first + 2 * number, kernel[number], stride[number], dilation[number])
    order = list(range(first)) + [first + 2 * n for n in range(count)] + [first + 2 * n + 1 for n in range(count)]
    return _permute(x, tuple(order))
