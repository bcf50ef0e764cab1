"""Neural-network functions on tensors: normalization, dropout, attention, the losses and the weight
initializers. All are compositions of primitives (convolution and pooling are in tensor_conv.py)."""

from __future__ import annotations

import itertools
import math
import weakref
from typing import TYPE_CHECKING

import numpy as np

from lazygrad.dtype import dtypes
from lazygrad.engine.realize import run_host
from lazygrad.helpers import prod
from lazygrad.tensor_conv import _pair
from lazygrad.tensor_elementwise import NARROW_FLOATS, broadcast_shape, check_same_device, type_name
from lazygrad.tensor_index import comparable_index, refuse_host_values_in_capture
from lazygrad.tensor_movement import as_int

if TYPE_CHECKING:
    from lazygrad.tensor import Tensor

# The layers with parameters (batch norm) that ran their eval-mode form since an optimizer last stepped: a step that
# trains their parameters with `Tensor.training` False warns, as a loop ported from torch (whose modules start in
# training mode) silently trained them on running statistics that never update without `Tensor.train()`.
eval_mode_layers: weakref.WeakSet = weakref.WeakSet()


def _check_label_range(labels: Tensor, classes: int, op_name: str, fix: str, ignore_index: int | None = None) -> None:
    """An error naming the first label outside 0..classes-1 (other than `ignore_index`). Labels are data, so they are
    realized and read here, when the op is called (as PyTorch checks them): an out-of-range label would otherwise
    select no class and silently give a wrong result. The check is a host step, so a TinyJit replay checks each
    call's labels too."""
    labels = labels.contiguous()
    labels.realize()
    shape = labels.shape

    def check(buffer) -> None:
        values = buffer.numpy()
        wrong = (values < 0) | (values >= classes)
        if ignore_index is not None:
            wrong &= values != ignore_index
        if wrong.any():
            position = np.unravel_index(int(wrong.argmax()), shape)
            allowed = f"0..{classes - 1}" + (f" or ignore_index={ignore_index}" if ignore_index is not None else "")
            raise ValueError(
                f"{op_name}: label {values[wrong.argmax()]} at index {tuple(int(i) for i in position)} is not a class "
                f"of {classes} (allowed: {allowed}); {fix}"
            )

    run_host(check, [labels.uop.base], labels.device)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def _check_reduction(reduction: str, op_name: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op_name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check_tensor(value, op_name: str, what: str) -> None:
    if not hasattr(value, "uop"):
        raise TypeError(f"{op_name}: {what} must be a Tensor, got {type_name(value)}")


def _check_target(prediction: Tensor, target, op_name: str, noun: str) -> None:
    """The target must have the prediction's shape: broadcasting one into the other pairs the wrong elements and
    gives a wrong loss (torch raises for these losses too)."""
    _check_tensor(target, op_name, "target")
    if target.shape != prediction.shape:
        raise ValueError(
            f"{op_name}: target {target.shape} must match the {noun} {prediction.shape} (the same shape: broadcasting "
            "would pair the wrong elements); reshape the target"
        )


def _difference(prediction: Tensor, target: Tensor) -> Tensor:
    """prediction - target for a loss, in floats where both are ints (an unsigned difference wraps below 0)."""
    if not prediction.dtype.is_float and not target.dtype.is_float:
        return prediction._to_float() - target._to_float()
    return prediction - target


def _check_loss_weight(weight, prediction: Tensor, op_name: str, what: str, meaning: str) -> None:
    """A loss weight must broadcast to the input's shape without growing it (as in torch)."""
    _check_tensor(weight, op_name, what)
    try:
        fits = broadcast_shape(op_name, weight.shape, prediction.shape) == prediction.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{op_name}: {what} {weight.shape} must broadcast to the input's shape {prediction.shape} ({meaning})"
        )


def _check_label_smoothing(label_smoothing: float, op_name: str) -> None:
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op_name}: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")


def _check_class_axis(logits: Tensor, op_name: str, layout: str) -> None:
    if logits.ndim == 0:
        raise ValueError(f"{op_name}: the input needs a class axis: give it shape {layout}, not a 0-d tensor")


class NNMixin:
    """Layers' building blocks as Tensor methods."""

    __slots__ = ()

    # ---- normalization, dropout, attention ------------------------------------------------------------------------

    def layernorm(self: Tensor, axis=-1, eps: float = 1e-5) -> Tensor:
        """Normalize over `axis` to mean 0 and variance 1 (the biased variance, as torch's layer_norm). Half and
        bfloat16 are normalized in float32 and rounded back, as torch does: a deviation past 256 squares to inf in
        half, which made the whole row 0."""
        if self.dtype in (dtypes.float16, dtypes.bfloat16):
            return self.float().layernorm(axis, eps).cast(self.dtype)
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
        """Zero elements with probability p while `type(self).training`, scaling the rest by 1/(1-p)."""
        if not 0 <= p <= 1:
            raise ValueError(f"dropout: p must be in [0, 1], got {p}")
        return self._drop(p) if type(self).training else self

    def _drop(self: Tensor, p: float) -> Tensor:
        """Dropout with probability p, in training or not."""
        if p == 0:
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
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """softmax(q kᵀ · scale + mask) v, with scale 1/sqrt(d) by default. With `enable_gqa`, key and value may have
        fewer heads (axis -3) than the query: each serves a group of query heads, as in torch. A `dropout_p` above 0
        drops attention weights whether or not `Tensor.training` is set, as torch's does (pass 0 to evaluate)."""
        check_same_device("scaled_dot_product_attention", self, key, value, attn_mask)
        if self.ndim < 2 or key.ndim < 2 or value.ndim < 2 or self.shape[-1] != key.shape[-1]:
            raise ValueError(
                f"scaled_dot_product_attention: query {self.shape} and key {key.shape} need at least 2 dimensions and "
                "the same last (feature) size"
            )
        if key.shape[-2] != value.shape[-2]:
            raise ValueError(
                f"scaled_dot_product_attention: key {key.shape} and value {value.shape} need the same length (axis "
                "-2): one value per key"
            )
        if not 0 <= dropout_p <= 1:
            raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
        if enable_gqa and self.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            heads, kv_heads = self.shape[-3], key.shape[-3]
            if heads % kv_heads or value.shape[-3] != kv_heads:
                raise ValueError(
                    f"scaled_dot_product_attention: with enable_gqa the query's {heads} heads must be a multiple of "
                    f"the key's and value's (got key {key.shape}, value {value.shape})"
                )
            key = key.repeat_interleave(heads // kv_heads, -3)
            value = value.repeat_interleave(heads // kv_heads, -3)
        try:
            broadcast_shape("scaled_dot_product_attention", self.shape[:-2], key.shape[:-2], value.shape[:-2])
        except ValueError:
            heads = self.shape[-3] if self.ndim >= 3 else 0
            kv_heads = key.shape[-3] if key.ndim >= 3 else 0
            grouped = not enable_gqa and kv_heads and heads % kv_heads == 0
            raise ValueError(
                f"scaled_dot_product_attention: the batch axes (all but the last two) of query {self.shape}, key "
                f"{key.shape} and value {value.shape} do not broadcast together"
                + ("; for fewer key/value heads (axis -3) than query heads, pass enable_gqa=True" if grouped else "")
            ) from None
        scale = 1 / math.sqrt(self.shape[-1]) if scale is None else scale
        # half and bfloat16 scores and their softmax in float32, as torch's (a half score past 65504 made a row NaN)
        narrow = self.dtype in NARROW_FLOATS or key.dtype in NARROW_FLOATS
        query, key = (self.float(), key.float()) if narrow else (self, key)
        scores = query @ key.transpose(-2, -1) * scale
        if attn_mask is not None:
            if attn_mask.dtype != dtypes.bool and not attn_mask.dtype.is_float:
                raise TypeError(
                    f"scaled_dot_product_attention: attn_mask must be bool (True = attend) or float (added to the "
                    f"scores), got {attn_mask.dtype}; cast a keep-mask with .bool(), or an additive one with .float()"
                )
            try:
                broadcast_shape("scaled_dot_product_attention", attn_mask.shape, scores.shape)
            except ValueError:
                raise ValueError(
                    f"scaled_dot_product_attention: attn_mask {attn_mask.shape} does not broadcast to the scores "
                    f"{scores.shape} (…, queries, keys); give it (queries, keys) or the scores' shape"
                ) from None
        if is_causal:
            if attn_mask is not None:
                raise ValueError(
                    "scaled_dot_product_attention: pass attn_mask or is_causal=True, not both (as in torch); fold the "
                    "causal mask into yours with attn_mask & ones(rows, cols).tril()"
                )
            rows, cols = scores.shape[-2:]
            attn_mask = type(self).ones(rows, cols, dtype=dtypes.bool, device=self.device).tril()
        if attn_mask is None:
            weights = scores.softmax(-1)
        elif attn_mask.dtype != dtypes.bool:
            # a softmax of its own: a row the mask makes all -inf gets zeros (and zero gradients), as in torch, where
            # the plain softmax gives NaN (-inf minus its -inf maximum). The shift is detached: softmax ignores it.
            masked = scores + attn_mask
            peak = masked.max(-1, keepdim=True).detach()
            dead = peak == float("-inf")
            exponent = (masked - dead.where(0.0, peak)).exp()
            weights = exponent / dead.where(1.0, exponent.sum(-1, keepdim=True))
        else:
            weights = attn_mask.where(scores, float("-inf")).softmax(-1)
            if not is_causal:  # a query that may attend to nothing (a padded one) gets zeros, as in torch, not NaN
                weights = attn_mask.any(-1, keepdim=True).where(weights, 0.0)
        if narrow and value.dtype in NARROW_FLOATS:  # (the weights rounded once, then summed in float32 by the matmul)
            weights = weights.cast(value.dtype)
        return weights._drop(dropout_p) @ value

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
        return keep.where(self, self.zeros_like())  # (a bool tensor stays bool, as tril's)

    def fold(self: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
        """Sliding blocks back into an image, overlaps summed (torch.nn.functional.fold, the inverse of an im2col):
        (N, C*kh*kw, L) or (C*kh*kw, L) -> (N, C, H, W) or (C, H, W), L being the count of blocks that fit
        `output_size`. Each kernel tap places its values by a pad; all the taps add up in one kernel."""
        if self.ndim not in (2, 3):
            raise ValueError(f"fold: input must be (N, C*kh*kw, L) or (C*kh*kw, L), got shape {self.shape}")
        columns = self if self.ndim == 3 else self.unsqueeze(0)
        out_size, kernel = _pair(output_size, 2, "fold: output_size"), _pair(kernel_size, 2, "fold: kernel_size")
        dilation, padding = _pair(dilation, 2, "fold: dilation"), _pair(padding, 2, "fold: padding")
        stride = _pair(stride, 2, "fold: stride")
        if min(kernel + dilation + stride) < 1 or min(padding) < 0:
            raise ValueError("fold: kernel_size, dilation and stride must be positive and padding non-negative")
        batch, width, length = columns.shape
        blocks = [
            (o + 2 * p - d * (k - 1) - 1) // s + 1 for o, p, d, k, s in zip(out_size, padding, dilation, kernel, stride)
        ]
        if width % prod(kernel) or min(blocks) < 1 or prod(blocks) != length:
            raise ValueError(
                f"fold: input {self.shape} does not match: dim -2 must be channels × {prod(kernel)} (kernel {kernel}) "
                f"and dim -1 the {' × '.join(map(str, blocks))} = {prod(blocks)} blocks that fit output_size "
                f"{out_size} with padding {padding}, dilation {dilation} and stride {stride}"
            )
        channels = width // prod(kernel)
        taps = columns.reshape(batch, channels, *kernel, *blocks)
        padded = [o + 2 * p for o, p in zip(out_size, padding)]
        total = None
        for tap in itertools.product(*(range(k) for k in kernel)):
            placed = taps[(slice(None), slice(None), *tap)]
            for axis, (offset, count, step, size) in enumerate(zip(tap, blocks, stride, padded)):
                # spread the blocks `step` apart, then shift them to this tap's offset inside the padded image
                axis += 2
                spread = placed.unsqueeze(axis + 1).pad(
                    tuple((0, step - 1) if a == axis + 1 else (0, 0) for a in range(5))
                )
                spread = spread.flatten(axis, axis + 1)
                spread = spread.shrink(tuple((0, (count - 1) * step + 1) if a == axis else None for a in range(4)))
                before = offset * dilation[axis - 2]
                after = size - before - spread.shape[axis]
                placed = spread.pad(tuple((before, after) if a == axis else (0, 0) for a in range(4)))
            total = placed if total is None else total + placed
        image = total.shrink(((0, batch), (0, channels), *((p, p + o) for p, o in zip(padding, out_size))))
        return image if self.ndim == 3 else image.squeeze(0)

    # ---- losses ----------------------------------------------------------------------------------------------------

    def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
        """(…,) int labels → (…, num_classes) int32 with a 1 at each label; num_classes -1 (the default, as
        PyTorch's) takes the largest label plus one. Labels outside 0..num_classes-1 are an error (the labels are
        realized to check them, as PyTorch checks them when called)."""
        if self.dtype.is_float:
            raise TypeError(f"one_hot: labels must be integers, got {self.dtype}")
        if as_int(num_classes) is not None:  # (a NumPy int too)
            num_classes = as_int(num_classes)
        if num_classes == -1 and isinstance(num_classes, int):
            refuse_host_values_in_capture(self, "one_hot without num_classes", "Pass num_classes")
            num_classes = int(self.max().item()) + 1 if self.numel() else 0
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f"one_hot: num_classes must be a non-negative int (or -1: inferred), got {num_classes!r}")
        return self._one_hot(num_classes, "one_hot", "fix the labels or pass a larger num_classes")

    def _one_hot(self: Tensor, num_classes: int, op_name: str, fix: str) -> Tensor:
        """one_hot, for an op that uses it: an out-of-range label is that op's error."""
        return self._label_mask(num_classes, op_name, fix).cast(dtypes.int32)

    def _label_mask(self: Tensor, num_classes: int, op_name: str, fix: str) -> Tensor:
        """one_hot as bools (an embedding's selection of rows), its labels checked as `_one_hot` checks them."""
        _check_label_range(self, num_classes, op_name, fix)
        return comparable_index(self).unsqueeze(-1) == type(self).arange(num_classes, device=self.device)

    def _check_labels(self: Tensor, labels: Tensor, op_name: str, ignore_index: int | None = None) -> None:
        if not labels.dtype.is_int:
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
        zero (and a mean over no counted label is NaN, 0/0, as torch's cross_entropy gives). Other labels are an error
        (they are realized to check them)."""
        _check_class_axis(self, "sparse_categorical_crossentropy", "(..., C)")
        _check_tensor(Y, "sparse_categorical_crossentropy", "labels")
        return self._label_crossentropy(Y, ignore_index, label_smoothing, reduction, "sparse_categorical_crossentropy")

    def _label_crossentropy(
        self: Tensor,
        Y: Tensor,
        ignore_index: int,
        label_smoothing: float,
        reduction: str,
        op_name: str,
        weight: Tensor | None = None,
    ) -> Tensor:
        _check_reduction(reduction, op_name)
        _check_label_smoothing(label_smoothing, op_name)
        self._check_labels(Y, op_name, ignore_index)
        Y = comparable_index(Y)
        classes = self.shape[-1]
        log_probs = self.log_softmax(-1)
        chosen = Y.unsqueeze(-1) == type(self).arange(classes, device=self.device)
        valid = Y != ignore_index
        if weight is not None:
            # torch's weighted form: each target's loss times its class's weight, the smoothing term weighted by
            # class, and a mean divided by the counted targets' weights (not their count)
            target_weight = valid.where(chosen.where(weight, 0).sum(-1), 0)
            nll = -(chosen.where(log_probs, 0).sum(-1)) * target_weight
            if label_smoothing:
                smooth = -(log_probs * weight).sum(-1)
                nll = (1 - label_smoothing) * nll + valid.where(smooth, 0) * (label_smoothing / classes)
            return nll.sum() / target_weight.sum() if reduction == "mean" else _reduce(nll, reduction)
        nll = -(chosen.where(log_probs, 0).sum(-1))
        if label_smoothing:
            nll = (1 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
        nll = valid.where(nll, 0)
        if reduction != "mean":
            return _reduce(nll, reduction)
        counted = valid._sum_unwidened()
        # (no label counted: NaN, as torch's 0/0; dividing by the bare count instead scheduled three more kernels
        # in a ResNet18 step)
        return (counted == 0).where(float("nan"), nll.sum() / counted.maximum(1))

    def cross_entropy(
        self: Tensor,
        Y: Tensor,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        *,
        weight: Tensor | None = None,
        ignore_index: int = -100,
    ) -> Tensor:
        """Cross-entropy of logits (N, C, …) against class indices (N, …) or probabilities (N, C, …), like torch:
        `weight` (C,) weighs each class (a mean over class indices divides by the counted targets' weights), and
        targets equal to `ignore_index` count zero (class indices only, as in torch). The positional order is
        tinygrad's (Y, reduction, label_smoothing): pass weight and ignore_index by keyword."""
        _check_class_axis(self, "cross_entropy", "(C,), (N, C) or (N, C, d1, ...)")
        _check_tensor(Y, "cross_entropy", "target")
        # the class axis goes last, the others keep their order: (N, C, H, W) -> (N, H, W, C)
        logits = self.movedim(1, -1) if self.ndim > 2 else self
        classes = logits.shape[-1]
        if weight is not None:
            _check_tensor(weight, "cross_entropy", "weight")
            if weight.shape != (classes,) or not weight.dtype.is_float:
                raise ValueError(
                    f"cross_entropy: weight needs one float per class, shape ({classes},) for logits {self.shape}, "
                    f"got {weight.shape} {weight.dtype}"
                )
        if not Y.dtype.is_float:
            if Y.shape != logits.shape[:-1]:  # (checked here, to name the shapes the caller gave)
                raise ValueError(
                    f"cross_entropy: logits {self.shape} (N, C, ...) need class indices of shape "
                    f"{logits.shape[:-1]} (N, ...), got {Y.shape}"
                )
            return logits._label_crossentropy(Y, ignore_index, label_smoothing, reduction, "cross_entropy", weight)
        if Y.shape != self.shape:
            raise ValueError(
                f"cross_entropy: probabilities {Y.shape} must have the logits' shape {self.shape} (N, C, ...); "
                "pass class indices as an int tensor of shape (N, ...)"
            )
        _check_reduction(reduction, "cross_entropy")
        _check_label_smoothing(label_smoothing, "cross_entropy")
        probs = Y.movedim(1, -1) if Y.ndim > 2 else Y
        probs = probs * (1 - label_smoothing) + label_smoothing / classes
        products = probs * logits.log_softmax(-1)
        return _reduce(-(products if weight is None else products * weight).sum(-1), reduction)

    def binary_crossentropy(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """Binary cross-entropy of probabilities against targets in [0, 1]; each log is clamped at -100, as in torch,
        so a certain wrong prediction costs 100, not inf. The probabilities' gradient is torch's,
        (p - y) / max(p (1 - p), 1e-12): finite at a probability of exactly 0 or 1 (0 where it is right). The targets'
        gradient there is the clamped logs' difference (±100; torch's is ±inf)."""
        _check_reduction(reduction, "binary_crossentropy")
        _check_target(self, Y, "binary_crossentropy", "probabilities")
        # Where p (1 - p) < 1e-12 (p is 0 or 1 in float32, e.g. a sigmoid of 20) a log's slope 1/p is inf, and the
        # clamp's zero slope times it gave NaN. There the logs see p detached (their value, no slope: the select
        # drops their NaN), and `edge` adds torch's slope (p - y) / 1e-12 with a value of exactly 0. The test is in
        # float32 for half (1e-12 is 0 there, and 1e12 inf)
        wide = self.float() if self.dtype in (dtypes.float16, dtypes.bfloat16) else self
        inside = wide * (1 - wide) >= 1e-12
        held = inside.where(self, self.detach())
        loss = -(Y * held.log().maximum(-100) + (1 - Y) * (1 - held).log().maximum(-100))
        edge = (wide - wide.detach()) * inside.where(0.0, (wide - Y) * 1e12)
        return _reduce(loss + edge.cast(loss.dtype), reduction)

    def binary_crossentropy_logits(
        self: Tensor, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        """Binary cross-entropy of logits, computed stably; `pos_weight` (broadcast over the last axis, one weight per
        class) scales the loss of positive targets."""
        return self.binary_cross_entropy_with_logits(Y, reduction=reduction, pos_weight=pos_weight)

    def binary_cross_entropy_with_logits(
        self: Tensor, Y: Tensor, weight: Tensor | None = None, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        """torch's F.binary_cross_entropy_with_logits: -w·[pos_weight·y·log σ(x) + (1-y)·log(1-σ(x))]."""
        op_name = "binary_cross_entropy_with_logits"
        _check_reduction(reduction, op_name)
        _check_target(self, Y, op_name, "logits")
        if weight is not None:
            _check_loss_weight(weight, self, op_name, "weight", "a weight per element, or one broadcast over axes")
        if pos_weight is not None:
            _check_loss_weight(pos_weight, self, op_name, "pos_weight", "usually one weight per class, the last axis")
        # -log σ(-x) = log1p(exp(-|x|)) + max(-x, 0) (log1p keeps the loss of a confident right logit, 4e-8 at 17,
        # where log(1 + ...) gave 0); max's gradient splits 1/2 at 0 and |x| has none there, so the gradient is
        # σ(x) - y everywhere (with pos_weight 1)
        log_sigmoid_negative = (-self.abs()).exp()._log1p_unit() + (-self).maximum(0)
        if pos_weight is None:
            loss = (1 - Y) * self + log_sigmoid_negative
        else:
            loss = (1 - Y) * self + (1 + (pos_weight - 1) * Y) * log_sigmoid_negative
        if weight is not None:
            loss = loss * weight
        return _reduce(loss, reduction)

    def nll_loss(
        self: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
    ) -> Tensor:
        """Negative log-likelihood of log-probabilities (N, C, ...) or (C,) at the class indices `target` (N, ...) or
        (); `weight` weighs each class, and a mean divides by the weights of the counted targets (torch's
        F.nll_loss)."""
        _check_reduction(reduction, "nll_loss")
        _check_class_axis(self, "nll_loss", "(C,), (N, C) or (N, C, d1, ...)")
        if not hasattr(target, "uop"):
            raise TypeError(f"nll_loss: target must be an integer Tensor, got {type(target).__name__}")
        log_probs = self.movedim(1, -1) if self.ndim > 2 else self  # (N, C, H, W) -> (N, H, W, C), as the target
        expected = (self.shape[0], *self.shape[2:]) if self.ndim >= 2 else ()
        if target.shape != expected:
            raise ValueError(f"nll_loss: input {self.shape} needs a target of shape {expected}, got {target.shape}")
        log_probs._check_labels(target, "nll_loss", ignore_index)
        target = comparable_index(target)
        classes = log_probs.shape[-1]
        if weight is not None and getattr(weight, "shape", None) != (classes,):
            raise ValueError(
                f"nll_loss: weight needs one value per class, shape ({classes},), got {getattr(weight, 'shape', weight)}"
            )
        chosen = target.unsqueeze(-1) == type(self).arange(classes, device=self.device)
        weights = chosen.where(weight if weight is not None else 1.0, 0.0).sum(-1)
        if ignore_index is not None:
            weights = weights * (target != ignore_index)
        loss = -(chosen.where(log_probs, 0).sum(-1)) * weights
        return loss.sum() / weights.sum() if reduction == "mean" else _reduce(loss, reduction)

    def mse(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """(x - y)², as torch's F.mse_loss: reduced by "mean" (the default), "sum" or "none"."""
        _check_reduction(reduction, "mse")
        _check_target(self, Y, "mse", "input")
        return _reduce(_difference(self, Y).square(), reduction)

    def kl_div(self: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
        """The Kullback-Leibler divergence of `target` from this tensor's log-probabilities, as torch's F.kl_div:
        target · (log target - self) elementwise (exp(target) · (target - self) with `log_target`, the target then
        log-probabilities too). A target of 0 adds 0, as torch's xlogy (but for an input of -inf there: 0 · -inf is
        NaN in torch too). `reduction` is "mean" (over every element, torch's default, which is not the divergence),
        "batchmean" (the sum divided by the batch size, the first axis: the divergence of each sample, averaged),
        "sum" or "none"."""
        if reduction not in ("mean", "sum", "none", "batchmean"):
            raise ValueError(f"kl_div: reduction must be 'mean', 'batchmean', 'sum' or 'none', got {reduction!r}")
        _check_target(self, target, "kl_div", "input")
        if not self.dtype.is_float:
            raise TypeError(f"kl_div: the input must be float log-probabilities, got {self.dtype}; cast it first")
        if log_target:
            loss = target.exp() * (target - self)
        else:
            # target · log(target), 0 at target 0; the log reads 1 there so its slope (log t + 1, -inf at 0) does
            # not reach the gradient as 0 · -inf = NaN through the select (torch's target gradient is NaN there)
            zero = target == 0
            loss = zero.where(0.0, target * zero.where(1.0, target).log()) - target * self
        if reduction == "batchmean":
            total = loss.sum()
            return total / self.shape[0] if self.ndim else total  # (torch divides only where there is a batch axis)
        return _reduce(loss, reduction)

    def l1_loss(self: Tensor, Y: Tensor, reduction: str = "mean") -> Tensor:
        """|x - y|, as torch's F.l1_loss (its slope at x = y is 0)."""
        _check_reduction(reduction, "l1_loss")
        _check_target(self, Y, "l1_loss", "input")
        return _reduce(_difference(self, Y).abs(), reduction)

    def smooth_l1_loss(self: Tensor, Y: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
        """0.5 (x - y)² / beta where |x - y| < beta, else |x - y| - 0.5 beta (torch's F.smooth_l1_loss; beta 0 is
        the L1 loss)."""
        _check_reduction(reduction, "smooth_l1_loss")
        _check_target(self, Y, "smooth_l1_loss", "input")
        if beta < 0:
            raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
        difference = _difference(self, Y)
        distance = difference.abs()
        if beta == 0:
            return _reduce(distance, reduction)
        # (the square of the difference, not of its abs: abs's slope at 0 is split, so x = y keeps slope 0 either way)
        loss = (distance < beta).where(difference.square() * (0.5 / beta), distance - 0.5 * beta)
        return _reduce(loss, reduction)

    def huber_loss(self: Tensor, Y: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
        """0.5 (x - y)² where |x - y| < delta, else delta (|x - y| - 0.5 delta) (torch's F.huber_loss)."""
        _check_reduction(reduction, "huber_loss")
        _check_target(self, Y, "huber_loss", "input")
        if delta <= 0:
            raise ValueError(f"huber_loss: delta must be positive, got {delta}")
        difference = _difference(self, Y)
        distance = difference.abs()
        loss = (distance < delta).where(difference.square() * 0.5, (distance - 0.5 * delta) * delta)
        return _reduce(loss, reduction)

    # ---- weight initializers -------------------------------------------------------------------------------------

    @classmethod
    def scaled_uniform(cls, *shape, **kwargs) -> Tensor:
        """Uniform in [-1, 1) scaled by 1/sqrt(number of elements)."""
        shape = cls._shape_arg(shape)
        return cls.uniform(*shape, low=-1.0, high=1.0, **kwargs) * (math.prod(shape) ** -0.5)

    @classmethod
    def glorot_uniform(cls, *shape, **kwargs) -> Tensor:
        """Glorot (Xavier) uniform: ±sqrt(6 / (fan_out + fan_in)), with fan_out = shape[0]."""
        shape = cls._shape_arg(shape)
        bound = math.sqrt(6 / (shape[0] + math.prod(shape[1:])))
        return cls.uniform(*shape, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_uniform(cls, *shape, a: float = 0.01, **kwargs) -> Tensor:
        """He uniform for a leaky ReLU of slope `a`: ±sqrt(6 / ((1 + a²) · fan_in)), fan_in = prod(shape[1:])."""
        shape = cls._shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(math.prod(shape[1:]))
        return cls.uniform(*shape, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape, a: float = 0.01, **kwargs) -> Tensor:
        """He normal for a leaky ReLU of slope `a`: standard deviation sqrt(2 / ((1 + a²) · fan_in))."""
        shape = cls._shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a**2)) / math.sqrt(math.prod(shape[1:]))
        return cls.normal(*shape, mean=0.0, std=std, **kwargs)
