"""Gradient clipping, as torch.nn.utils: `clip_grad_norm_` and `clip_grad_value_` (with `get_total_norm` and
`clip_grads_with_norm_`, the two halves of `clip_grad_norm_`). Each writes the clipped gradients into the `.grad`
tensors with `assign`, lazily: nothing is read back to the host (but with `error_if_nonfinite=True`), so a clip inside
a TinyJit step is part of its replay."""

from __future__ import annotations

import math
from collections.abc import Iterable

from lazygrad.dtype import least_upper_dtype
from lazygrad.tensor import Tensor


def _gradients(parameters: Tensor | Iterable[Tensor], op_name: str) -> list[Tensor]:
    """The gradients of `parameters` (one tensor, or any iterable of them) that have one."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = []
    for number, param in enumerate(params):
        if not isinstance(param, Tensor):
            raise TypeError(
                f"{op_name}: parameters must be Tensors, got {type(param).__name__} at position {number}; pass "
                "nn.state.get_parameters(model) or a list of tensors"
            )
        if param.grad is not None:
            grads.append(param.grad)
    return grads


def _norm_type(norm_type: float | str, op_name: str) -> float:
    if isinstance(norm_type, str) and norm_type == "inf":
        return math.inf
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)):
        raise TypeError(f"{op_name}: norm_type must be a number (2.0, 1.0, inf, ...), got {norm_type!r}")
    return float(norm_type)


def _total_norm(grads: list[Tensor], norm_type: float) -> Tensor:
    """The norm of the gradients' norms, which is the norm of all their elements together, on the first gradient's
    device (as torch computes it)."""
    device = grads[0].device
    norms = [grad.norm(norm_type) for grad in grads]
    dtype = least_upper_dtype(*(norm.dtype for norm in norms), op_name="clip_grad_norm_")
    norms = [(norm if norm.device == device else norm.to(device)).cast(dtype) for norm in norms]
    return norms[0].stack(*norms[1:]).norm(norm_type)


def get_total_norm(
    tensors: Tensor | Iterable[Tensor],
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """The `norm_type` norm of all the elements of `tensors` together (as torch.nn.utils.get_total_norm), a 0-d
    tensor: 0.0 for no tensors. `foreach` is accepted for torch's signature and ignored."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if not tensors:
        return Tensor(0.0)
    total = _total_norm(tensors, _norm_type(norm_type, "get_total_norm"))
    if error_if_nonfinite:
        _refuse_nonfinite(total, norm_type, "get_total_norm")
    return total


def _refuse_nonfinite(total: Tensor, norm_type: float, op_name: str) -> None:
    value = total.item()  # (the one host read: asked for with error_if_nonfinite=True)
    if not math.isfinite(value):
        raise RuntimeError(
            f"{op_name}: the total norm of order {norm_type} of the gradients is {value}, so they cannot be clipped "
            "(as torch's error_if_nonfinite=True); find the step that made them non-finite, or pass "
            "error_if_nonfinite=False to clip anyway (the gradients then become NaN)"
        )


def clip_grads_with_norm_(
    parameters: Tensor | Iterable[Tensor], max_norm: float, total_norm: Tensor, foreach: bool | None = None
) -> None:
    """Scale the parameters' gradients by max_norm / (total_norm + 1e-6) where that is below 1, in place (as
    torch.nn.utils.clip_grads_with_norm_); `total_norm` is a 0-d tensor such as get_total_norm's."""
    grads = _gradients(parameters, "clip_grads_with_norm_")
    if not grads:
        return
    max_norm = float(max_norm)
    # (always a multiply, as torch's: a coefficient of 1 leaves the gradients as they are)
    coefficient = (max_norm / (total_norm + 1e-6)).minimum(1.0)
    for grad in grads:
        scale = coefficient if coefficient.device == grad.device else coefficient.to(grad.device)
        grad.assign((grad * scale).cast(grad.dtype))


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Scale the gradients of `parameters` in place so that their total `norm_type` norm (all their elements as one
    vector) is at most `max_norm`, as torch.nn.utils.clip_grad_norm_: each is multiplied by
    min(1, max_norm / (total + 1e-6)). Returns the total norm before clipping, a 0-d tensor (not read: nothing waits
    for it, unless `error_if_nonfinite=True`, which reads it and raises a RuntimeError for a NaN or infinite norm).
    Parameters without a gradient are skipped; with none at all the norm is 0.0. `foreach` is accepted for torch's
    signature and ignored."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)  # (a generator is read once)
    grads = _gradients(params, "clip_grad_norm_")
    if not grads:
        return Tensor(0.0)
    norm_type = _norm_type(norm_type, "clip_grad_norm_")
    total = _total_norm(grads, norm_type)
    if error_if_nonfinite:
        _refuse_nonfinite(total, norm_type, "clip_grad_norm_")
    clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of `parameters` into [-clip_value, clip_value] in place, as
    torch.nn.utils.clip_grad_value_."""
    clip_value = float(clip_value)
    for grad in _gradients(parameters, "clip_grad_value_"):
        grad.assign(grad.clamp(-clip_value, clip_value).cast(grad.dtype))
