"""Tensor: the user API. Every method builds UOps from a few primitives; nothing runs until a result is asked for
(`realize`, `numpy`, `item`, `tolist`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import sys
import threading
import weakref
from typing import Any

import numpy as np

from lazygrad.device import Device
from lazygrad.dtype import (
    DType,
    bfloat16_to_float32,
    data_to_numpy,
    dtypes,
    to_dtype,
)
from lazygrad.engine.buffers import (
    DETACHED_VIEW,
    buffer_from_numpy,
    buffer_of,
    forget_dead,
    history,
    history_cut,
    history_of,
    is_buffer_view,
    memory_of,
    read_before_overwrite,
    realized,
    realized_view,
    remember_history,
    strided_layout,
    strided_view,
    views_holding,
    views_memory,
    views_on_gradient_paths,
    views_with_history,
    with_history,
    write_target,
)
from lazygrad.engine.buffers import writes_pending as _written
from lazygrad.engine.realize import collector_paused, realize_lock, run_schedule
from lazygrad.engine.rng import is_random_source
from lazygrad.engine.schedule import ScheduleItem, bind, create_schedule, plan_graph
from lazygrad.gradient import compute_gradients, rule_for
from lazygrad.helpers import DEBUG, Context, GlobalCounters, prod
from lazygrad.tensor_activation import ActivationMixin
from lazygrad.tensor_conv import ConvMixin
from lazygrad.tensor_create import CreationMixin
from lazygrad.tensor_elementwise import ElementwiseMixin, check_device_has
from lazygrad.tensor_extra import ExtraMixin
from lazygrad.tensor_index import MOVEMENT_OPS, IndexMixin, move_views, view_holders
from lazygrad.tensor_layout import LayoutMixin
from lazygrad.tensor_math import MathMixin
from lazygrad.tensor_movement import MovementMixin, as_int
from lazygrad.tensor_nn import NNMixin
from lazygrad.tensor_reduce import ReduceMixin
from lazygrad.tensor_scan import ScanMixin
from lazygrad.uop.ops import Ops, UOp, toposort

Scalar = int | float | bool
_contiguous_ids = itertools.count()
_assign_ids = itertools.count()
# every tensor made, as weak references by id (pruned once the map has doubled since it held only live ones), for the
# rare walks over all of them (a TinyJit capture, a write into a tensor still lazy)
_made: dict[int, weakref.ref] = {}
_made_pruned_at = 64
# The tensors that may hold a pending value (a graph or a write, not a name of memory, nor a broadcast constant), in
# the order they got it: the scans for what a write must keep (`_values_to_keep`, `pending_assigns`) walk these, not
# `_made`, and drop the ones they find dead or holding such a value no more, so a program that keeps thousands of
# realized tensors (a list of losses) does not pay for each of them in every optimizer step. Pruned with `_made` too.
_pending_holders: dict[int, weakref.ref] = {}
# id of a tensor set as a .grad -> (it, and the tensors it is the .grad of, all weakly): see `_values_to_keep`
_grads_given: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}


def _unpickle_tensor(values: np.ndarray, dtype: str, device: str, requires_grad: bool | None) -> Tensor:
    """A pickled tensor made again (see Tensor.__reduce__)."""
    return Tensor(values, dtype=getattr(dtypes, dtype), device=device, requires_grad=requires_grad)


def _name_detached(buffer: UOp, tensor: Tensor) -> None:
    """Note `tensor` as a detached name of `buffer`'s memory (see `Tensor.assign`)."""
    names = buffer.__dict__.setdefault("detached", {})
    if len(names) >= 8:  # (forget the dead: an optimizer detaches every parameter in every step)
        for key in [key for key, reference in list(names.items()) if reference() is None]:
            names.pop(key, None)
    names[id(tensor)] = weakref.ref(tensor)


def tensors_holding(nodes) -> list[Tensor]:
    """The live tensors whose node is one of `nodes`."""
    found: dict[int, Tensor] = {}
    for node in nodes:
        for reference in list(node.__dict__.get("tensors", {}).values()):
            if (tensor := reference()) is not None:
                found[id(tensor)] = tensor
    return list(found.values())


def _held_twice(node: UOp) -> bool:
    """Whether two live tensors hold `node`. (Stops at the second: every tensor realized to one buffer asks this, and
    thousands may hold it, `[(t + 1).realize() for _ in range(n)]`.)"""
    live = 0
    for reference in list(node.__dict__.get("tensors", {}).values()):
        if reference() is not None:
            live += 1
            if live == 2:
                return True
    return False


def pending_assigns() -> list[Tensor]:
    """Tensors for the assigns that have not run yet (state a step updated, such as batch norm's running statistics,
    before anything read it): the newest write pending on each buffer (it reads the earlier ones it needs; a later
    write replaces a buffer's whole contents), and any live tensor holding an assign."""
    found: dict[UOp, Tensor] = {}
    for tensor in _pending_tensors():
        if tensor._uop.op is Ops.ASSIGN and "realized" not in tensor._uop.__dict__:
            found.setdefault(tensor._uop, tensor)
    for reference in list(_written.values()):
        buffer = reference()
        if buffer is not None and (write := _newest_write(buffer)) is not None and write not in found:
            found[write] = Tensor(write, device=buffer.arg[2])
    return list(found.values())


# Writes pending on a buffer. Each assign notes itself on its buffer's node (`writes`: its number -> a weak reference
# to it and the key of the tensor that made it, in the order they were made), so every name of the memory (a view, a
# reshape, a detached tensor) reads the newest (see `Tensor.uop`), and reading or realizing one runs them. A write is
# held strongly (the buffer's node holds it only weakly: the write holds the buffer, and so does the intern table's
# key of the write, so a strong reference from the buffer would keep both alive for good) by the tensor that made
# it, while that tensor lives (`_held_writes`), then, if it has not run, until the next realize runs it
# (`_orphaned_writes`: `flat = p.view(-1); flat *= 0.5`, with `flat` gone before anything read p). `_written`
# (buffers.writes_pending) holds the buffers with writes noted, weakly, so that a read checks nothing when there are
# none.
_held_writes: dict[int, tuple[weakref.ref, UOp]] = {}  # id of a tensor -> (it, weakly; the newest write it made)
_orphaned_writes: list[UOp] = []


def _write_made_by_dead_tensor(key: int, reference: weakref.ref) -> None:
    entry = _held_writes.get(key)
    if entry is not None and entry[0] is reference:
        del _held_writes[key]
        if "realized" not in entry[1].__dict__:
            _orphaned_writes.append(entry[1])


def _note_write(buffer: UOp, write: UOp, writer: Tensor) -> None:
    writes = buffer.__dict__.get("writes")
    if writes is None:
        writes = buffer.__dict__["writes"] = {}
        number = id(buffer)
        _written[number] = weakref.ref(
            buffer, lambda ref, number=number: _written.get(number) is ref and _written.pop(number)
        )
    key = id(writer)
    entry = _held_writes.get(key)
    if entry is None or entry[0]() is not writer:
        entry = (weakref.ref(writer, lambda reference, key=key: _write_made_by_dead_tensor(key, reference)), write)
    _held_writes[key] = (entry[0], write)
    writes[write.arg] = (weakref.ref(write), key)


def _pending_writes(buffer: UOp) -> list[UOp]:
    """The writes noted on `buffer` that have not run, in the order they were made (forgetting those that ran or died:
    a write no tensor holds any more, nor any value built on it, is one a later write replaced)."""
    writes = buffer.__dict__.get("writes")
    if writes is None:
        return []
    found, gone = [], []
    for number, (reference, _) in writes.items():
        write = reference()
        if write is None or "realized" in write.__dict__:
            gone.append(number)
        else:
            found.append(write)
    for number in gone:
        del writes[number]
    if not writes:
        del buffer.__dict__["writes"]
        _written.pop(id(buffer), None)
    return found


def _newest_write(buffer: UOp) -> UOp | None:
    """The last write pending on `buffer` (its node stands for the buffer's contents once the writes have run)."""
    writes = buffer.__dict__.get("writes")
    if writes:
        reference = writes[next(reversed(writes))][0]
        if (write := reference()) is not None and "realized" not in write.__dict__:
            return write
        pending = _pending_writes(buffer)
        return pending[-1] if pending else None
    return None


def _forget_writes_run(buffer: UOp) -> None:
    """Drop the writes on `buffer` that ran, with those made before them (a write replaces the whole contents: one
    made before a write that ran is either run too, or will never be seen), and let go of them."""
    writes = buffer.__dict__.get("writes")
    if not writes:
        return
    last = None
    for number, (reference, _) in writes.items():
        if (write := reference()) is not None and "realized" in write.__dict__:
            last = number
    if last is not None:
        for number in [number for number in writes if number <= last]:
            reference, key = writes.pop(number)
            if (entry := _held_writes.get(key)) is not None and entry[1].arg <= last:
                del _held_writes[key]
    _pending_writes(buffer)  # (and forget the dead)


def _over(node: UOp, write: UOp, buffer: UOp) -> UOp:
    """`node`, a name of `buffer`'s memory (movement ops of a view, a detached name), read over the contents `write`
    leaves there: the view's chain rebuilt on the write's node."""
    chain = []
    target = write.src[0]
    while node is not target and node is not buffer:
        chain.append(node)
        node = node.src[0]
    contents = (
        write
        if node is target or write.shape == buffer.shape
        else UOp(Ops.RESHAPE, write.dtype, (write,), buffer.shape)
    )
    for link in reversed(chain):
        contents = UOp(link.op, link.dtype, (contents,), link.arg)
    return contents


def _read_node(node: UOp) -> UOp:
    """The node a computation reads for a tensor of `node`: a name of memory with writes pending reads the newest
    (a tensor built before the write keeps the old contents: its graph reads the buffer itself)."""
    buffer = memory_of(node)
    if buffer is None or "writes" not in buffer.__dict__ or (write := _newest_write(buffer)) is None:
        return node
    return _over(node, write, buffer)


def _reads_data(node: UOp) -> bool:
    """Whether a graph reads a buffer other than a random source's (its sources' answers are known)."""
    if node.op is Ops.BUFFER:
        return not is_random_source(node)
    return any(source.__dict__["reads_data"] for source in node.src)


def _prune_made() -> None:
    global _made_pruned_at
    # (a copy of the items, and pop: another thread may be making tensors, or pruning too)
    for key in [key for key, reference in list(_made.items()) if reference() is None]:
        _made.pop(key, None)
    _made_pruned_at = max(64, 2 * len(_made))
    _pending_tensors()
    for key, (reference, _) in list(_grads_given.items()):
        if reference() is None:
            _grads_given.pop(key, None)


def _pending_tensors() -> list[Tensor]:
    """The live tensors holding a pending value that reads memory, in the order they got it (see `_pending_holders`,
    which the others leave)."""
    found = []
    for key, reference in list(_pending_holders.items()):
        tensor = reference()
        # (memory_of, not views_memory: a flip of a buffer keeps the values it was made with, as a computation does)
        if tensor is not None and memory_of(node := tensor._uop) is None and node.base.op is not Ops.CONST:
            found.append(tensor)
        elif _pending_holders.get(key) is reference:  # (not a newer tensor that took a dead one's id meanwhile)
            _pending_holders.pop(key, None)
    return found


# ids of the tensors a setitem is writing into with gradients flowing through the write (see Tensor.__setitem__)
_writes_keeping_gradient: set[int] = set()

_RELEASED = "released"  # `.grad` of a tensor whose gradient an assign invalidated (see `_values_to_keep`)


def keep_values_before_writes(written: set[UOp]) -> None:
    """Compute the live pending tensors and writes that read the current contents of the `written` buffers, before
    something that runs outside a schedule (a TinyJit replay) overwrites them (see `_values_to_keep`)."""
    if readers := _values_to_keep([], written, set(), []):
        Tensor._realize_all(tuple(tensors_holding(readers)), tuple(node for node in readers if node.op is Ops.ASSIGN))


def _values_to_keep(outputs: list[UOp], overwritten: set[UOp], written_now: set[UOp], nodes: list[UOp]) -> list[UOp]:
    """The nodes of live pending tensors and of the writes pending on buffers (besides `outputs` and what this
    schedule computes) that read the old contents of an `overwritten` buffer: the schedule computes them too, before
    the write, so a value keeps the meaning it had when it was built (`loss.item()` after `opt.step()` is the loss
    before the step, and a running statistic updated beside the step reads the weights it was given).

    Gradients are the exception: a `.grad` that reads the old contents and that this schedule reads too (`nodes`:
    an optimizer step consumes the gradients as it overwrites the parameters) is released (reading it then raises
    and says why): computing them all before each write would cost a kernel per parameter in every training step.
    An input's implicit gradient is dropped. The gradient of a tensor that asked for one and that the schedule does
    not read (a parameter of a second optimizer, stepped next) is computed, as torch's backward computes it. A
    gradient tensor held elsewhere (`g = w.grad`) is a value like any other and is computed."""
    skip = set(outputs)
    pending: dict[UOp, None] = {}
    gradients = []  # (the pending tensors that are a .grad)
    # (a view shows the new contents: it keeps no old value, and is not among these)
    for tensor in _pending_tensors():
        if (node := tensor._uop) not in skip and node not in written_now:
            pending[node] = None
            if id(tensor) in _grads_given:
                gradients.append(tensor)
    tensor = None  # (no reference of a loop may keep a tensor alive)
    writes = {}
    for reference in list(_written.values()):  # (the newest write on a buffer reads the earlier ones it needs)
        if (buffer := reference()) is not None and (write := _newest_write(buffer)) is not None:
            if write not in skip and write not in written_now:
                pending[write] = writes[write] = None
    # (in the order the tensors were made, not a set's: the readers join the schedule's outputs, and a step that
    # makes the same tensors again must give the same graph, so its plan is found again instead of made anew)
    stale = dict.fromkeys(read_before_overwrite(list(pending), overwritten, written_now)) if pending else {}
    if not stale:
        return []
    read_now = None  # (the schedule's nodes as a set, made only where a gradient asks)
    for gradient in gradients:
        if gradient._uop not in stale:
            continue
        reference, owners = _grads_given[id(gradient)]
        for owner in owners if reference() is gradient else ():
            if (tensor := owner()) is None or tensor._grad is not gradient:
                continue
            # (an implicit gradient, of a tensor that never asked for one, e.g. an input batch, is simply dropped:
            # PyTorch has none, and the next backward starts it afresh)
            if tensor._requires_grad is None:
                tensor._grad = None
            else:
                read_now = set(nodes) if read_now is None else read_now
                if gradient._uop in read_now:
                    tensor._grad = _RELEASED
    tensor = gradient = gradients = None  # (a gradient dropped here dies now: it is no value to keep)
    return [node for node in stale if node in writes or tensors_holding([node])]


def _pending_gradients(outputs: list[UOp], device: str) -> list[Tensor]:
    """The gradients still pending that a backward from one of `outputs` gave, where no output assigns. A root read on
    its own (`loss.item()` between `backward()` and `opt.step()`) is computed with them in one schedule: computed
    apart, the gradients would recompute the forward values the root's kernels kept no buffer for (an eager ResNet18
    step written so took 120 ms instead of 92). An optimizer step's outputs are assigns that read the gradients:
    those are fused into the update's kernels instead."""
    found: dict[int, Tensor] = {}
    for output in outputs:  # (the common case first: no output was a backward's root, a dict look-up each)
        for reference in output.__dict__.get("gradients", ()):
            tensor = reference()
            grad = tensor._grad if tensor is not None else None
            if isinstance(grad, Tensor) and grad.device == device and not is_buffer_view(grad._uop):
                found[id(grad)] = grad
    if not found or any(output.op is Ops.ASSIGN for output in outputs):
        return []
    return list(found.values())


class _ThreadModes(threading.local):
    """The calling thread's own `Tensor.training` and `Tensor.no_grad`, set by `Tensor.train()`/`Tensor.test()`
    (None: the process-wide setting)."""

    training: bool | None = None
    no_grad: bool | None = None


_thread_modes = _ThreadModes()
_process_modes = {"training": False, "no_grad": False}  # what assigning `Tensor.training = ...` sets


def _thread_mode(name: str) -> property:
    """A mode read as the calling thread's own where it set one, else as the process's; assigned for the process."""

    def read(cls) -> bool:
        mode = getattr(_thread_modes, name)
        return _process_modes[name] if mode is None else mode

    def assign(cls, value: bool) -> None:
        _process_modes[name] = value
        setattr(_thread_modes, name, None)

    return property(read, assign)


class _TensorType(type):
    """Tensor's class. `Tensor.training` and `Tensor.no_grad` are each thread's mode, as torch's grad mode is: a
    thread inside `with Tensor.test():` turns off no other thread's gradients, and threads entering and leaving such
    blocks at once cannot leave a mode stuck on (each restored the other's). Assigning one (`Tensor.training = True`,
    tinygrad's way) sets it for the whole process, for the threads not inside such a block."""

    training = _thread_mode("training")
    no_grad = _thread_mode("no_grad")


def _viewed_value(node: UOp, moves: tuple[Ops, ...] = MOVEMENT_OPS, among=None) -> UOp | None:
    """The computation `node` is a view of in torch's terms (by movement ops among `moves`), where that computation
    is `among` those given (computed with it), or else a live tensor holds it; else None."""
    if node.op not in moves:  # (the common case: not a view)
        return None
    base, chain = node, []
    while base.op in moves:
        chain.append(base)
        base = base.src[0]
    if base not in among if among is not None else "tensors" not in base.__dict__ or not tensors_holding([base]):
        return None
    if base.op in (Ops.CONST, Ops.ASSIGN) or views_memory(base):
        return None
    return base if strided_view(chain[::-1], base.shape) else None


def _give_history(tensors, node: UOp, view: UOp, remember: dict, remembered: set, overwritten=None) -> None:
    """Record the computation `node` as the history of `view`, the memory it was just computed into, for those of
    `tensors` (holding `view` or views of it) that take gradients: their gradients flow back through it. Where its
    inputs still hold what it read (`remember`), or an earlier realize computed it and it is still known to be there
    (a write into what it read forgets it). A value computed before a write into a buffer it read (`overwritten`:
    the buffers written, and each kept value's graph with the computations behind the realized values it read) keeps
    that graph where it reads none of those buffers (`g = h.exp(); h += 1`); else its gradient is cut, and backward
    says why."""
    if node.op in (Ops.ASSIGN, Ops.DETACH):
        return
    earlier = False
    if node not in remember:  # (the rare case: the common one is a value this realize computed)
        if not any(tensor._wants_gradient() for tensor in tensors):
            return
        earlier = realized_view(node) is view
        if not earlier:
            if overwritten is None:
                return
            written, expansions = overwritten
            node = expansions.get(node, node)
            if any(source.op is Ops.BUFFER and source in written for source in node.toposort):
                if views_on_gradient_paths([node]):  # (else no gradient passes into it: a leaf, as a write leaves it)
                    history_cut.set(view, True)
                return
    for tensor in tensors:
        if tensor._wants_gradient():
            if view not in remembered:
                remember_history(view, node)
                remembered.add(view)
                if earlier:  # (the node now refers to its view weakly, as `_realize_all` sets it for the others)
                    realized.set(node, weakref.ref(view))
            tensor._history = view.__dict__.get(history.key)  # (history.get, inline: this runs on every realize)


def _reshaped_value(node: UOp) -> UOp | None:
    """The computation `node` is a reshape of (the same values in the same order), where a live tensor holds it. (A
    slice is computed alone: realizing all of a language model's logits for its last row's slice would cost more; a
    transpose would need a copy to be read in order.)"""
    return _viewed_value(node, (Ops.RESHAPE,))


def _host_view(node: UOp) -> np.ndarray | None:
    """A copy of the values of `node`, a strided view of a buffer in this process's memory, read with NumPy's
    strides; None for other views and for device memory."""
    layout = strided_layout(node)
    if layout is None:
        return None
    buffer_node, offset, strides = layout
    buffer = buffer_of(buffer_node)
    memory = Device[buffer.device].allocator.host_bytes(buffer.handle)
    if memory is None:
        return None
    values = memory[: buffer.size * buffer.dtype.itemsize].view(buffer.dtype.np)
    size = buffer.dtype.itemsize
    shape = node.shape
    if any(length == 0 for length in shape):
        return np.empty(shape, dtype=buffer.dtype.np)
    return np.lib.stride_tricks.as_strided(values[offset:], shape, [stride * size for stride in strides]).copy()


class _ThreadMode(contextlib.ContextDecorator):
    """A context (and decorator) setting one of this thread's modes (see _TensorType) and restoring it after; one
    object may be entered again, and nested in itself, as torch's no_grad()."""

    def __init__(self, name: str, mode: bool):
        self.name, self.mode, self.stacks = name, mode, threading.local()  # (what each entry replaced, per thread)

    @staticmethod
    def made(name: str, mode, op_name: str):
        if callable(mode):  # `@Tensor.test` without parentheses: the function it decorates
            return _ThreadMode(name, True)(mode)
        if not isinstance(mode, (bool, int, np.bool_)):
            raise TypeError(f"Tensor.{op_name}: mode must be True or False, got {mode!r}")
        return _ThreadMode(name, bool(mode))

    def __enter__(self):
        if not hasattr(self.stacks, "previous"):
            self.stacks.previous = []
        self.stacks.previous.append(getattr(_thread_modes, self.name))
        setattr(_thread_modes, self.name, self.mode)
        return self

    def __exit__(self, *exception):
        setattr(_thread_modes, self.name, self.stacks.previous.pop())
        return False

    def __call__(self, function):
        """`function` run in this mode; a generator function's body runs in it at each step of its iteration, as
        torch's no_grad decorates one (a plain wrapper would set the mode only while the generator is made)."""
        if inspect.isgeneratorfunction(function):
            return self._generator_in_mode(function)
        return super().__call__(function)

    def _generator_in_mode(self, function):
        @functools.wraps(function)
        def generator(*args, **kwargs):
            inner = function(*args, **kwargs)
            try:
                with self:
                    response = inner.send(None)
                while True:
                    # the caller's code between the steps runs in its own mode, as with torch
                    try:
                        request = yield response
                    except GeneratorExit:
                        with self:
                            inner.close()
                        raise
                    except BaseException as error:
                        with self:
                            response = inner.throw(error)
                    else:
                        with self:
                            response = inner.send(request)
            except StopIteration as stop:
                return stop.value

        return generator


class Tensor(
    CreationMixin,
    ElementwiseMixin,
    MathMixin,
    ActivationMixin,
    IndexMixin,
    LayoutMixin,
    MovementMixin,
    ReduceMixin,
    ScanMixin,
    ConvMixin,
    NNMixin,
    ExtraMixin,
    metaclass=_TensorType,
):
    """A lazily evaluated n-dimensional array. Operations build a UOp graph; `realize()` computes it."""

    # _history: the computation behind a realized tensor's buffer, kept for gradients (see realize_all)
    __slots__ = ("_uop", "device", "_requires_grad", "_grad", "_history", "__weakref__")

    def __init__(
        self,
        data: Any,
        dtype: DType | str | None = None,
        device: str | None = None,
        requires_grad: bool | None = None,
    ):
        self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
        self._uop, self._requires_grad, self._grad, self._history = None, None, None, None
        dtype = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, UOp):
            self.uop = data
        elif isinstance(data, Tensor):
            raise TypeError("Tensor(Tensor): use .detach(), .contiguous() or .to(device) instead")
        else:
            if isinstance(data, range):
                data = list(data)
            elif (torch := sys.modules.get("torch")) is not None and isinstance(data, torch.Tensor):
                # through NumPy, detached (NumPy refuses a tensor that requires grad: any nn.Parameter); NumPy has no
                # bfloat16, so its values go as float32, exactly (every bfloat16 is one), and stay bfloat16 here
                if data.dtype == torch.bfloat16:
                    data, dtype = data.detach().float(), dtypes.bfloat16 if dtype is None else dtype
                data = data.numpy(force=True)
            elif not isinstance(data, (np.ndarray, np.generic)) and hasattr(data, "__array__"):
                data = np.asarray(data)  # (another library's array: through NumPy, as torch.as_tensor)
            if not isinstance(data, (list, tuple, np.ndarray, int, float, bool, np.generic)):
                raise TypeError(
                    f"Tensor: cannot make a tensor from {type(data).__name__}; pass a list, tuple, number or numpy array"
                )
            if isinstance(data, np.ndarray) and data.dtype.kind == "c" or isinstance(data, complex):
                raise TypeError(
                    f"Tensor: unsupported dtype {getattr(data, 'dtype', 'complex')}: lazygrad has no complex numbers"
                )
            from_numpy = dtype is None and isinstance(data, (np.ndarray, np.generic))
            array, dtype = data_to_numpy(data, dtype)
            if from_numpy and dtype in Device[self.device].unsupported_dtypes:
                raise TypeError(
                    f"Tensor: a {dtype} NumPy array cannot live on {self.device} "
                    f"({Device[self.device].unsupported_dtypes[dtype]}); convert it first (array.astype(np.float32)) "
                    "or pass dtype=dtypes.float32"
                )
            if dtype.itemsize == 8:
                check_device_has(dtype, self.device, "Tensor")
            self.uop = buffer_from_numpy(array, self.device, dtype)
        self.requires_grad = requires_grad

    @property
    def uop(self) -> UOp:
        """The node this tensor is read as: a graph until realized, then (usually) a view of the buffer holding it. A
        name of memory (a view) whose buffer has writes pending, made through any name of it, reads the newest, so a
        value built now sees them (`_uop` is the node the tensor holds)."""
        return _read_node(self._uop) if _written else self._uop

    @uop.setter
    def uop(self, node: UOp) -> None:
        # A node knows the live tensors holding it (by id, as weak references: Tensor's == is elementwise, so no sets
        # of tensors), so realization and autograd visit only the tensors they concern. The map lives with the node's
        # cached facts: it dies with the node, with no weak dictionary to keep up. A dead tensor's entry stays until
        # the map has doubled since it last held only live ones (a node kept alive, as a cached constant is, may
        # outlive many tensors holding it).
        previous = self._uop
        if previous is not None and (holders := previous.__dict__.get("tensors")) is not None:
            holders.pop(id(self), None)
        self._uop = node
        facts = node.__dict__  # (`weak_notes(facts, "tensors")`, inline: this runs on every op)
        holders = facts.get("tensors")
        if holders is None:
            holders = facts["tensors"] = {}
        elif len(holders) >= facts.get("tensors_pruned_at", 8):
            forget_dead(facts, "tensors")
        holders[id(self)] = reference = weakref.ref(self)
        if previous is None:
            # (at the end: the registry is in the order tensors were made, though a dead one's id is reused before it
            # is pruned; the values a write keeps join a schedule in that order, and a step that makes the same
            # tensors again must give the same graph, so its plan is found again, not made anew at every step)
            _made.pop(id(self), None)
            _made[id(self)] = reference
            if len(_made) >= _made_pruned_at:
                _prune_made()
        # (to the end, as in `_made`: the order the scans find pending values in is the order they got them, the same
        # whenever a step is repeated, whatever was pruned meanwhile)
        _pending_holders.pop(id(self), None)
        _pending_holders[id(self)] = reference

    @staticmethod
    def train(mode: bool = True):
        """`with Tensor.train():` (or as a decorator, `@Tensor.train` or `@Tensor.train()`) sets `Tensor.training`
        (dropout drops, batchnorm uses batch statistics and updates its running ones) and restores it after."""
        return _ThreadMode.made("training", mode, "train")

    @staticmethod
    def test(mode: bool = True):
        """`with Tensor.test():` (or as a decorator, `@Tensor.test` or `@Tensor.test()`) sets `Tensor.no_grad`
        (results carry no gradient) and restores it after."""
        return _ThreadMode.made("no_grad", mode, "test")

    @staticmethod
    def allow_tf32(mode: bool = True):
        """`with Tensor.allow_tf32():` lets float32 matrix products run on tensor cores in TF32 (inputs rounded to
        10 mantissa bits; off by default, as PyTorch's allow_tf32), and restores the setting after."""
        return Context(ALLOW_TF32=int(mode))

    def sequential(self, layers) -> Tensor:
        """Apply each callable of `layers` in turn: `x.sequential([l1, Tensor.relu, l2])`."""
        result = self
        for position, layer in enumerate(layers):
            if not callable(layer):
                raise TypeError(
                    f"sequential: layer {position} is a {type(layer).__name__}, not callable; pass layers or functions "
                    "that take a Tensor and return one"
                )
            result = layer(result)
        return result

    # ---- basic properties --------------------------------------------------------------------------------------

    # (`_uop` read directly: graph building asks for shapes and dtypes all the time)
    @property
    def shape(self) -> tuple[int, ...]:
        return self._uop.shape

    @property
    def dtype(self) -> DType:
        return self._uop.dtype

    @property
    def ndim(self) -> int:
        return len(self._uop.shape)

    def numel(self) -> int:
        return prod(self.shape)

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        """The shape, or the size of axis `dim` (torch.Tensor.size)."""
        if dim is None:
            return self.shape
        if (index := as_int(dim)) is None:
            raise TypeError(f"size: dim must be an int, got {dim!r}")
        if not -max(self.ndim, 1) <= index < max(self.ndim, 1) or self.ndim == 0:
            raise IndexError(f"size: dim {dim!r} is out of range for a tensor of shape {self.shape}")
        return self.shape[index]

    def dim(self) -> int:
        """The number of axes (`ndim`; torch.Tensor.dim)."""
        return self.ndim

    def element_size(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes the values take: numel() * element_size()."""
        return self.numel() * self.dtype.itemsize

    def is_floating_point(self) -> bool:
        """Whether the dtype is a float."""
        return self.dtype.is_float

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        """The sub-tensors along the first axis (without this, Python iterated a 0-d tensor as an empty sequence)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor: read its value with .item()")
        return (self[index] for index in range(self.shape[0]))

    def __contains__(self, value) -> bool:
        """`value in t`: whether any element equals it, as torch's."""
        equal = self == value
        if not isinstance(equal, Tensor):  # (== gave NotImplemented: None, a string)
            raise TypeError(f"in: a Tensor can be searched for a number or a tensor, got {type(value).__name__}")
        return bool(equal.any().item())

    def __pos__(self) -> Tensor:
        return self

    def __round__(self, ndigits: int | None = None) -> Tensor:
        """`round(t)`: the tensor rounded half to even, elementwise (a tensor, as torch's)."""
        return self.round() if ndigits is None else self.round(decimals=ndigits)

    @property
    def is_leaf(self) -> bool:
        """Whether this tensor is no computation's result (torch's meaning): it takes no gradient, or holds values of
        its own (a computation realized keeps its history for gradients, and is no leaf)."""
        return self.requires_grad is False or (views_memory(self._uop) and self._history is None)

    def __repr__(self) -> str:
        return f"<Tensor {self.shape} {self.dtype} on {self.device}>"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ValueError(
                f"the truth value of a tensor with {self.numel()} elements is ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    # ---- a one-element tensor as a Python number, and any tensor as a NumPy array (as torch's) ----------------------

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        """An integer one-element tensor as a list index or a size."""
        if not self.dtype.is_int:
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype}; cast with .int()")
        return int(self.item())

    def __format__(self, spec: str) -> str:
        """A 0-d tensor formats as its number (`f"{loss:.3f}"`); another, with a spec, is an error saying so."""
        if self.ndim == 0:
            return format(self.item(), spec)
        if spec:
            raise TypeError(
                f"format: only a 0-d tensor takes a format spec ({spec!r}); this one is {self.shape}: use "
                "t.item() for one element, or format t.tolist()"
            )
        return repr(self)

    # NumPy's operators defer to the tensor's (`np.float32(2) * t` stays a tensor, with its gradient) instead of
    # converting it through __array__
    __array_ufunc__ = None

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __abs__(self) -> Tensor:
        return self.abs()

    def _new(self, uop: UOp) -> Tensor:
        """A tensor for the result of an op on this one (built directly: the hottest path of graph building)."""
        tensor = object.__new__(Tensor)
        # (_uop set first: the setter's look-up of an unset slot would raise and catch an AttributeError)
        tensor.device, tensor._grad, tensor._history, tensor._uop = self.device, None, None, None
        no_grad = _thread_modes.no_grad  # (Tensor.no_grad, inline: the hottest path of graph building)
        if no_grad if no_grad is not None else _process_modes["no_grad"]:
            tensor._requires_grad, tensor.uop = False, UOp(Ops.DETACH, uop.dtype, (uop,))
        else:
            tensor._requires_grad, tensor.uop = None, uop
        return tensor

    # ---- gradients ---------------------------------------------------------------------------------------------

    @property
    def grad(self) -> Tensor | None:
        """The gradient `backward` accumulated here, or None."""
        if self._grad is _RELEASED:
            raise RuntimeError(
                f"grad: the gradient of this {self.shape} {self.dtype.name} tensor was released: an assign (an "
                "optimizer step) overwrote values it was computed from. Read gradients before the step, or realize "
                "them with it (Tensor.realize_all(*grads, *opt.schedule_step())); zero_grad() or .grad = None "
                "clears it"
            )
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        # checked here, as torch does: a wrong shape failed only at the next backward, and one that broadcasts never
        if value is not None and (not isinstance(value, Tensor) or value.shape != self.shape):
            got = f"a {value.shape} tensor" if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"grad: must be None or a tensor of this tensor's shape {self.shape}, got {got}")
        self._grad = value
        if value is not None:  # (noted for `_values_to_keep`, which finds the tensors a pending gradient belongs to)
            given = _grads_given.get(id(value))
            if given is None or given[0]() is not value:
                given = _grads_given[id(value)] = (weakref.ref(value), [])
            if all(owner() is not self for owner in given[1]):
                given[1].append(weakref.ref(self))

    @property
    def requires_grad(self) -> bool | None:
        """True: `backward` fills this tensor's `.grad`; False: never; None (the default): if it is a float tensor
        that is not a broadcast Python constant."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value and not self.dtype.is_float:
            raise TypeError(
                f"requires_grad=True needs a float tensor, but this one is {self.dtype}: only floats have gradients; "
                "make it with a float dtype (dtype=dtypes.float32) or .float() it first"
            )
        if value and not self._requires_grad and self._shares_its_node():
            # equal constants (two Tensor.zeros(3)), and tensors realized together from them, are one node, which
            # a gradient cannot tell apart: this tensor takes a node of its own, a leaf (a copy of the values, made
            # when next realized, through which no gradient flows back to the shared node)
            detached = UOp(Ops.DETACH, self.dtype, (self.uop,))
            self.uop = UOp(Ops.CONTIGUOUS, self.dtype, (detached,), next(_contiguous_ids))
        self._requires_grad = value

    def _shares_its_node(self) -> bool:
        """Whether another tensor may be this one's node: a constant's, or one another live tensor holds."""
        return self._uop.base.op is Ops.CONST or any(tensor is not self for tensor in tensors_holding([self._uop]))

    def _seed(self, gradient: Tensor | Any | None, op_name: str) -> UOp:
        """The gradient to start from at this root, checked against its shape."""
        if gradient is None:
            if self.shape != ():
                raise RuntimeError(
                    f"{op_name}: the root has shape {self.shape}, so its gradient cannot be implied; "
                    "pass gradient= with that shape, or call .sum() first to make a scalar"
                )
            return UOp.const(self.dtype, 1.0)
        if not isinstance(gradient, Tensor):
            gradient = Tensor(gradient, dtype=self.dtype, device=self.device)
        if gradient.shape != self.shape:
            raise ValueError(
                f"{op_name}: gradient has shape {gradient.shape} but the root has shape {self.shape}; they must match"
            )
        return gradient.cast(self.dtype).uop

    def _wants_gradient(self) -> bool:
        """Float tensors get gradients unless marked requires_grad=False or they are broadcast Python constants."""
        requires_grad = self._requires_grad
        if requires_grad is True:
            return True
        return requires_grad is None and self._uop.dtype.is_float and self._uop.base.op is not Ops.CONST

    @staticmethod
    def _backward(roots: list[Tensor], seeds: list[UOp]) -> None:
        """Accumulate d(sum of root·seed)/d(t) into `.grad` of every live tensor `t` in the roots' graphs."""
        if Tensor.no_grad:
            raise RuntimeError("backward: gradients are off (Tensor.no_grad is set); turn it off to call backward")
        if any(root.requires_grad is False for root in roots):
            raise RuntimeError(
                "backward: the tensor does not require a gradient (computed under Tensor.no_grad or with "
                "requires_grad=False), so nothing it was computed from would get one; compute it with gradients on"
            )
        with collector_paused():  # (it builds a graph as large as the forward one: see collector_paused)
            # gradients are taken on the computations behind realized views, so realizing never cuts the history
            nodes = [r.uop for r in roots]
            expanded = with_history(nodes) if history else {}  # (no view has a history to expand: the graph as it is)
            expanded_roots = [expanded.get(node, node) for node in nodes]
            order = toposort(expanded_roots)
            # (below a DETACH or a comparison the values in memory are read: a hidden state detached after an optimizer
            # step, whose own computation read the old weights, is fine)
            if history_cut and any(history_cut.get(node) for node in views_on_gradient_paths(expanded_roots)):
                raise RuntimeError(
                    "backward: part of this graph was computed before a write into memory it read (an optimizer step, "
                    "an assign or a setitem into a tensor it was computed from, between the forward pass and "
                    "backward), so the values its gradient needs are gone; as torch refuses ('modified by an inplace "
                    "operation'), call backward before the write, or compute the forward pass again after it"
                )
            # (dicts, not sets, here: the tensors found come in the graph's order, the same for the same graph)
            in_graph = dict.fromkeys(order)
            # the tensors in the graph: those holding one of its nodes, and realized ones whose computation is in it
            views = views_holding(in_graph)
            # (where no root changed, nothing below one did: the graph as built is the expanded one)
            graph = in_graph if expanded_roots == nodes else dict.fromkeys(toposort(nodes)) | in_graph
            candidates = tensors_holding([*graph, *views])
            node_of = {t: expanded.get(t.uop) or history_of(t.uop) for t in candidates if t._wants_gradient()}
            written_by = {node.src[0]: node for node in order if node.op is Ops.ASSIGN}  # (the newest last)
            for tensor, node in node_of.items():
                # a tensor written since the graph read it, the write still pending (`with Tensor.test(): w -= lr`
                # before backward): its gradient is taken at the values the graph read, as torch's
                if node not in in_graph and tensor._uop in in_graph:
                    node_of[tensor] = tensor._uop
                # one whose write ran since (something read the weights, or the loss, before backward): the graph
                # reads the write's value, and holds the memory only as its target, through which no gradient passes
                elif node in written_by:
                    node_of[tensor] = written_by[node]
            targets = [t for t, node in node_of.items() if node in in_graph]
            combined: dict[UOp, UOp] = {}
            for node, seed in zip(expanded_roots, seeds):
                combined[node] = combined[node] + seed if node in combined else seed
            grads, _ = compute_gradients(combined, list({node_of[t]: None for t in targets}), order)
            # (a root takes its own seed: only a root that is a leaf, a buffer, counts as taking a gradient)
            if not any(
                node_of[t] in grads and (views_memory(t._uop) or all(t is not r for r in roots)) for t in targets
            ):
                raise RuntimeError(
                    "backward: nothing this tensor was computed from takes a gradient (it was computed from tensors "
                    "made under Tensor.no_grad or Tensor.test(), detached, marked requires_grad=False, or "
                    "constants), as torch would say; compute them with gradients on"
                )
            for tensor in targets:
                # (one an optimizer step released stays so: the sum with what it held is unknown, and reading it says
                # why; a GAN's generator loss reaches the discriminator just stepped, whose next zero_grad clears it)
                if node_of[tensor] in grads and tensor._grad is not _RELEASED:
                    grad = Tensor(grads[node_of[tensor]], device=tensor.device, requires_grad=False)
                    tensor.grad = grad if tensor.grad is None else tensor.grad + grad
            # a root read alone later (`loss.item()` before `opt.step()`) computes these gradients with it: see
            # `_pending_gradients`
            given = [weakref.ref(tensor) for tensor in targets if node_of[tensor] in grads]
            for root in roots:
                if not is_buffer_view(root._uop):
                    root._uop.__dict__["gradients"] = given

    def backward(self, gradient: Tensor | Any | None = None) -> Tensor:
        """Fill `.grad` of every float tensor this one depends on (accumulating into existing grads). A scalar
        root starts from 1; otherwise pass `gradient` with the root's shape. Nothing runs until a grad is used."""
        Tensor._backward([self], [self._seed(gradient, "backward")])
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | Any | None = None) -> list[Tensor]:
        """d(self)/d(target) for each target, as new lazy tensors (differentiable again). The targets come one by one
        or as one list or tuple (torch.autograd.grad's): `y.gradient(x, w)` or `y.gradient([x, w])`."""
        if len(targets) == 1 and isinstance(targets[0], (list, tuple)):
            targets = tuple(targets[0])
        for number, target in enumerate(targets):
            if not isinstance(target, Tensor):
                raise TypeError(
                    f"gradient: target {number} is a {type(target).__name__}, not a Tensor; pass the tensors to "
                    "differentiate by, one by one or as one list: y.gradient(x, w) or y.gradient([x, w])"
                )
        expanded = with_history([self.uop, *(t.uop for t in targets)])
        nodes = [expanded.get(t.uop) or history_of(t.uop) for t in targets]
        grads, _ = compute_gradients({expanded[self.uop]: self._seed(gradient, "gradient")}, nodes)
        return [
            Tensor(grads[node], device=t.device) if node in grads else t.zeros_like() for node, t in zip(nodes, targets)
        ]

    # ---- realizing ---------------------------------------------------------------------------------------------

    def schedule(self, *others: Tensor) -> list[ScheduleItem]:
        """The kernels `realize` would run, without running them."""
        return create_schedule([t.uop for t in (self, *others)], self.device)[0].items

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`) now, in one schedule. Returns self."""
        with realize_lock, collector_paused():  # (realize_all, inline: this runs on every eager op)
            Tensor._realize_all((self, *others))
        return self

    @staticmethod
    def realize_all(*tensors: Tensor) -> None:
        """Compute `tensors` in one schedule. Threads realize one after another: scheduling, running and switching
        tensors to their buffers is one step, so a pending assign two threads share runs once."""
        with realize_lock, collector_paused():  # (the graphs it frees are no cyclic garbage: see collector_paused)
            Tensor._realize_all(tensors)

    @staticmethod
    def _realize_all(tensors: tuple[Tensor, ...], writes: tuple[UOp, ...] = ()) -> None:
        """Realize `tensors` and the pending `writes` (assign nodes, which no tensor needs to hold) in one schedule."""
        if _orphaned_writes:  # writes whose tensors died before they ran run now (see `_held_writes`)
            writes = (*(write for write in _orphaned_writes if "realized" not in write.__dict__), *writes)
            _orphaned_writes.clear()
        # (plain loops: on Python 3.11 a comprehension costs a frame, and one tensor is the common case)
        outputs, viewed = list(writes), []
        if writes:
            device = writes[0].src[0].base.arg[2]  # (the written buffer's)
        for tensor in tensors:
            node = tensor._uop
            if views_memory(node):  # (realized, or a view of memory: it stays one, see `_without_views`)
                buffer = memory_of(node) if _written else None
                if buffer is not None and "writes" in buffer.__dict__ and _newest_write(buffer) is not None:
                    kept, pending = Tensor._without_views(tensors)
                    return Tensor._realize_all(kept, tuple(dict.fromkeys((*writes, *pending))))
                continue
            if not outputs:
                device = tensor.device  # (the first pending tensor's)
            if node.op is Ops.RESHAPE and (base := _reshaped_value(node)) is not None:
                # a reshape of a computation another tensor holds: that computation is realized, and this tensor
                # becomes its view (as torch's), which later writes into either show in both
                viewed.append((tensor, base))
                node = base
            outputs.append(node)
        if not outputs:
            return
        if gradients := _pending_gradients(outputs, device):
            outputs += [gradient._uop for gradient in gradients]
        asked = len(outputs)  # (what was asked for, not kept before a write: see `_give_history`)
        planned = plan_graph(outputs, device)
        # (buffers are allocated only for the final plan) the values that read what it overwrites join it, until
        # none is left: a pending write that joins (it read a buffer the schedule overwrites) overwrites its own
        while planned.plan.overwritten:
            readers = _values_to_keep(outputs, planned.overwritten(), planned.computed(), planned.nodes)
            if not readers:
                break
            outputs = outputs + readers
            planned = plan_graph(outputs, device, planned.walk)
        schedule, becomes, remember = bind(planned)
        # the values kept before the write (`_values_to_keep`), with the computations behind the realized values
        # they read (taken before it runs: running it forgets the history of what it overwrites). Not the values
        # asked for: a loss realized with the optimizer step that overwrites its weights keeps no history.
        expansions = {}
        if planned.plan.overwritten and history and len(outputs) > asked:
            expansions = with_history(outputs[asked:])
        run_schedule(schedule)
        # Realization replaces: every live tensor whose graph was computed now points at the buffer holding it,
        # and the `realized` map lets deeper graphs that still contain the node read it too.
        remembered: set[UOp] = set()  # the views given a history: the nodes they hold refer to them weakly
        overwritten = (planned.overwritten(), expansions) if planned.plan.overwritten else None
        for tensor in tensors_holding(becomes):
            node = tensor._uop
            view = becomes[node]
            if tensor.device != view.base.arg[2] or node.arg is DETACHED_VIEW:
                continue  # the same device-less node (a constant) on another device, or a detached name of memory
            if node.op in MOVEMENT_OPS and (base := _viewed_value(node, among=becomes)) is not None:
                viewed.append((tensor, base))  # (a view of another value computed here: it becomes a view of that)
                _give_history([tensor], base, becomes[base], remember, remembered, overwritten)
                continue
            _give_history([tensor], node, view, remember, remembered, overwritten)
            if node.op is Ops.DETACH:  # a detached value stays a detached name of its memory: as the view itself, which
                # y's computation gives its history, `y.detach().realize()` passed gradients on into y
                tensor.uop = UOp(Ops.DETACH, view.dtype, (view,), DETACHED_VIEW)
                _name_detached(memory_of(view), tensor)
                continue
            tensor.uop = view
            facts = view.__dict__
            if len(facts["tensors"]) > 1 and node.op is not Ops.ASSIGN and "shared" not in facts and _held_twice(view):
                facts["shared"] = True  # equal values computed into one buffer: see `assign`
        for node, view in becomes.items():  # (views of what is memory now are views of that memory, as torch's)
            if "views" in node.__dict__ and node.op is not Ops.ASSIGN:
                holders = view_holders(node)
                move_views(node, view, holders)
                _give_history(holders, node, view, remember, remembered, overwritten)
        for tensor, base in viewed:
            if base in becomes:
                move_views(base, becomes[base], [tensor])
        for node, view in remember.items():
            realized.set(node, weakref.ref(view) if view in remembered else view)
        if planned.plan.overwritten and _written:
            for buffer in planned.overwritten():
                _forget_writes_run(buffer)
        if DEBUG.value >= 1:
            print(f"compiles {GlobalCounters.compile_count}, compile cache hits {GlobalCounters.compile_cache_hits}")

    @staticmethod
    def _live_tensors():
        """Every live tensor, one at a time (for the mixins, which do not import this module at run time)."""
        for reference in list(_made.values()):
            if (tensor := reference()) is not None:
                yield tensor

    @staticmethod
    def _without_views(tensors: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], tuple[UOp, ...]]:
        """`tensors` without the views of memory, and the newest write pending on each of their buffers (whichever
        name of it made the write, and whether or not that tensor lives): a view stays one (it shows its buffer's
        contents whenever it is read, as a torch view does), and realizing it runs those writes. Movement ops that
        copy in torch (a flip, a pad) keep their values: they need no write, and are computed before one runs."""
        kept, writes = [], {}
        for tensor in tensors:
            if not views_memory(tensor._uop):
                kept.append(tensor)
            elif (buffer := memory_of(tensor._uop)) is not None and (write := _newest_write(buffer)) is not None:
                writes[write] = None
        return tuple(kept), tuple(writes)

    def assign(self, value: Tensor | Any) -> Tensor:
        """Write `value` into this tensor's memory (in place, when it is realized). Kernels that read the old
        values run before the write."""
        if not isinstance(value, Tensor):
            value = Tensor(value, dtype=self.dtype, device=self.device)
        if value.shape != self.shape or value.dtype != self.dtype:
            raise ValueError(
                f"assign: value {value.shape} {value.dtype} does not match the target {self.shape} {self.dtype}; "
                "reshape or cast it first"
            )
        if value.device != self.device:
            raise ValueError(f"assign: value is on {value.device} but the target is on {self.device}; use .to()")
        if (through := self._check_writable("assign")) is not None:
            return self._write_through(*through, value)
        if _writes_keeping_gradient and id(self) in _writes_keeping_gradient:  # (setitem's write: see __setitem__)
            _writes_keeping_gradient.discard(id(self))
            if self._gradient_history() is not None or self._record_writes_into_data(value):
                return self._assign_keeping_gradient(value)
        # Write in place into the tensor's buffer: the write is noted on the buffer, pending until something reads
        # the memory, and the tensor stays the name of that memory it was, as every other name of it (a view, a
        # reshape, a detached tensor) does: they all read the newest write (see `uop`), and realizing any of them
        # runs it, whether or not the tensor that made it still lives. Another live tensor that realization gave the
        # very same buffer (equal values, as two `Tensor.zeros(3)` realized together, are one node) keeps its
        # values: it becomes a copy of them, which the write's schedule computes first (see `_values_to_keep`),
        # while this tensor keeps its buffer, which a TinyJit replay or an optimizer reads (given a new one, the
        # replays read the old). (Two views made alike, `x.reshape(2, 2)` twice, are one node too, and both views.)
        # A tensor with no buffer yet simply becomes the value (unless a live tensor is a view of it: then
        # `_check_writable` computed it into its buffer first, so the view shows the write as torch's does). Each
        # assign is a distinct event: a number makes its node unique, so the same update issued twice runs twice.
        node = self._uop
        if node.op is Ops.ASSIGN:  # (a tensor made of a pending write: it writes that buffer, and becomes its name)
            target = node.src[0]
        elif (target := write_target(node)) is None:
            self.uop = value.uop
            return self
        elif node.__dict__.pop("shared", False) and (others := [t for t in tensors_holding([node]) if t is not self]):
            copy = UOp(Ops.CONTIGUOUS, self.dtype, (_read_node(node),), next(_contiguous_ids))
            for other in others:
                other.uop = copy
        if names := target.base.__dict__.get("detached"):  # detached names of the memory (see `detach`)
            for key, reference in list(names.items()):
                if (detached := reference()) is not self:
                    names.pop(key, None)
                    if detached is not None:
                        detached.uop = UOp(Ops.CONTIGUOUS, self.dtype, (detached.uop,), next(_contiguous_ids))
            detached = None
        _note_write(target.base, UOp(Ops.ASSIGN, self.dtype, (target, value.uop), next(_assign_ids)), self)
        if node.op is Ops.ASSIGN:
            self.uop = target
        return self

    def _write_through(self, below: UOp, moves: list[UOp], value: Tensor) -> Tensor:
        """Write `value` into what this tensor is a view of (`below`, through the movement ops `moves`, this
        tensor's own first: see `_check_writable`), as torch's write into a slice changes the tensor sliced: the
        value goes back through each move (as a gradient does: a slice's is a pad) into the places the view shows,
        and the tensor below is written there, as setitem writes, keeping a gradient the value carries. Every name
        of that memory, this view too, then reads the write."""
        if below.op is Ops.BUFFER:
            base = Tensor(below, device=self.device)
        else:  # (a computation another tensor holds: computed into its buffer, which this view then shows)
            base = self._put_in_memory(below, "assign")
            node = base._uop
            for move in reversed(moves):
                node = UOp(move.op, move.dtype, (node,), move.arg)
            # (a view made with gradients off stays a detached name of the memory)
            self.uop = node if self._uop.op is not Ops.DETACH else UOp(Ops.DETACH, node.dtype, (node,), DETACHED_VIEW)
        placed, shown = value.uop, Tensor.ones(*self.shape, dtype=dtypes.bool, device=self.device).uop
        for move in moves:
            (placed,), (shown,) = rule_for(move, placed), rule_for(move, shown)
        _writes_keeping_gradient.add(id(base))
        try:
            base.assign(base._new(shown).where(base._new(placed), base))
        finally:
            _writes_keeping_gradient.discard(id(base))
        return self

    def _in_place(self, op_name: str, result: Tensor) -> Tensor:
        """`self op= other` as torch's in-place ops: `result` (self op other) written into this tensor, which keeps
        its shape and dtype, so every name for it (`b = a; a += 1`) sees the new values. Rebinding the name instead
        left an optimizer training a tensor the model no longer held (`layer.weight *= 0`). `op_name` is an operator
        (`+=`) or a method's name (`add_`, torch's in-place forms)."""
        # the out-of-place form to suggest: `x = x + y` for `+=`, `x = x.add(...)` for `add_`
        instead = f"x = x.{op_name[:-1]}(...)" if op_name.endswith("_") else f"x = x {op_name[:-1]} y"
        if self.requires_grad and not Tensor.no_grad and views_memory(self._uop) and self._history is None:
            raise RuntimeError(
                f"{op_name}: this {self.shape} tensor requires grad and holds its own values (a leaf), so changing it "
                "in place would lose what its gradient needs, as torch refuses; do it under `with Tensor.test():` "
                f"(Tensor.no_grad, torch.no_grad()), or write `{instead}` for a new tensor"
            )
        through = self._check_writable(op_name)
        if result.shape != self.shape:
            raise ValueError(
                f"{op_name}: the result {result.shape} does not fit this {self.shape} tensor in place (the other "
                f"operand broadcasts it larger); write `{instead}` for a new tensor"
            )
        if result.dtype != self.dtype:
            if result.dtype.is_float and not self.dtype.is_float or self.dtype == dtypes.bool:
                raise TypeError(
                    f"{op_name}: the result is {result.dtype}, which this {self.dtype} tensor cannot hold in place "
                    f"(as torch refuses); write `{instead}` for a new tensor, or cast first"
                )
            result = result.cast(self.dtype)
        if through is not None:
            return self._write_through(*through, result)
        if self._gradient_history() is not None or self._record_writes_into_data(result):
            return self._assign_keeping_gradient(result)
        return self.assign(result)

    def __setitem__(self, index, value) -> None:
        # (IndexMixin's setitem, whose write into a tensor with gradient history keeps the gradient flowing: its
        # assign turns into _assign_keeping_gradient where the tensor, once writable, has a history)
        if Tensor.no_grad:
            return IndexMixin.__setitem__(self, index, value)
        _writes_keeping_gradient.add(id(self))
        try:
            IndexMixin.__setitem__(self, index, value)
        finally:
            _writes_keeping_gradient.discard(id(self))

    def _gradient_history(self) -> UOp | None:
        """The realized node whose history gradients flow back through into other tensors' values, where an in-place
        operator or setitem into this tensor must keep them flowing (with gradients on): this tensor's own, or, for a
        reshape of another tensor's memory (`y.reshape(2, 2)[0] = v`), the node of the tensor it reshapes. None for
        a leaf, for one whose buffer an assign overwrote since (its values no longer come from that history), and
        for one computed from random numbers and constants alone (a layer's first weights: `w -= lr * w.grad` is an
        update, and must not chain every step's graph to the weights)."""
        if Tensor.no_grad or not self._wants_gradient():
            return None
        node = self._uop
        while (computation := history.get(node)) is None:
            if node.op is not Ops.RESHAPE:
                return None
            node = node.src[0]
        # (a fact cached per node, as shapes are: a loop of `y += x` asks it of a history that grows by a few nodes)
        return node if computation._derive("reads_data", _reads_data) else None

    def _record_writes_into_data(self, value: Tensor) -> bool:
        """Before a write (setitem, an in-place operator) of a value that carries a gradient into a tensor of data
        (`out = Tensor(np.zeros((T, H))); out[t] = h`, or through a reshape of it): as torch records such a write, the
        memory's values so far are kept as a copy, which becomes the history of the memory's node, so that this write
        and later ones go through `_assign_keeping_gradient` and the gradient flows into the written values. (A plain
        assign has no derivative: it dropped the gradient, and the model silently did not train.) True if it did. A
        value carries a gradient where its graph reads a tensor that requires grad, or a computation realized with
        gradients on from data; random numbers and data alone do not, as in torch (`batch[i] = Tensor(image) +
        noise` keeps nothing), and neither do a layer's weights before they are realized and an optimizer holds them.
        A target marked requires_grad=False takes gradients from then on, as torch's does."""
        if Tensor.no_grad or not self._uop.dtype.is_float or not views_memory(self._uop):
            return False
        memory = self._uop
        while memory.op is Ops.RESHAPE and history.get(memory) is None:
            memory = memory.src[0]
        if memory.op not in (Ops.BUFFER, Ops.RESHAPE) or history.get(memory) is not None:
            return False  # (a detached name; or a layer's first weights, whose update stays an update)
        graph = value.uop.toposort
        carries = any(
            (computation := history.get(node)) is not None and computation._derive("reads_data", _reads_data)
            for node in graph
            if node.op in (Ops.BUFFER, Ops.RESHAPE)
        )
        if not carries and not any(tensor.requires_grad is True for tensor in tensors_holding(graph)):
            return False
        copy = UOp(Ops.CONTIGUOUS, memory.dtype, (_read_node(memory),), next(_contiguous_ids))
        kept = Tensor(copy, device=self.device, requires_grad=False).realize()
        remember_history(memory, kept.uop)
        if self._requires_grad is False:
            self._requires_grad = None
        return True

    def _assign_keeping_gradient(self, value: Tensor) -> Tensor:
        """An in-place operator's or setitem's write into a tensor with gradient history (`y = (x * 2).realize();
        y += 1`, or through a reshape of y): as torch records the in-place op, gradients flow through the written
        value (to x) rather than stopping at the write, where a plain assign, which has no derivative, dropped them.
        The write runs now, and the value's graph becomes the tensor's history (as if it had been computed as
        `y = y + 1`), and the history of every other name of the memory that had one, in its shape."""
        # (the value's graph with realized tensors expanded, and the names with a history, taken before the write:
        # running it forgets the history of the buffer it overwrites)
        expanded = with_history([value.uop])[value.uop]
        # the other names of this memory with a history (`y` under `y.reshape(2, 2)[0] = v`, or a reshape of this
        # tensor): they hold the written values too (a view with a history is a reshape of its buffer)
        buffer = self._uop.base
        owners = [view for view in views_with_history(buffer) if view is not self._uop]
        self.assign(value).realize()
        self._history = remember_history(self._uop, expanded, expanded=True)
        for owner in owners:
            owned = remember_history(owner, UOp(Ops.RESHAPE, expanded.dtype, (expanded,), owner.shape), expanded=True)
            for tensor in tensors_holding([owner]):
                if tensor._wants_gradient():
                    tensor._history = owned
        return self

    def __iadd__(self, other) -> Tensor:
        return self._in_place("+=", self + other)

    def __isub__(self, other) -> Tensor:
        return self._in_place("-=", self - other)

    def __imul__(self, other) -> Tensor:
        return self._in_place("*=", self * other)

    def __itruediv__(self, other) -> Tensor:
        return self._in_place("/=", self / other)

    def __ifloordiv__(self, other) -> Tensor:
        return self._in_place("//=", self // other)

    def __imod__(self, other) -> Tensor:
        return self._in_place("%=", self % other)

    def __ipow__(self, other) -> Tensor:
        return self._in_place("**=", self**other)

    def __imatmul__(self, other) -> Tensor:
        return self._in_place("@=", self @ other)

    def __iand__(self, other) -> Tensor:
        return self._in_place("&=", self & other)

    def __ior__(self, other) -> Tensor:
        return self._in_place("|=", self | other)

    def __ixor__(self, other) -> Tensor:
        return self._in_place("^=", self ^ other)

    def __ilshift__(self, other) -> Tensor:
        return self._in_place("<<=", self << other)

    def __irshift__(self, other) -> Tensor:
        return self._in_place(">>=", self >> other)

    def __deepcopy__(self, memo: dict) -> Tensor:
        """A copy in memory of its own, computed now (torch's deepcopy: a model snapshot must not follow later
        updates), with the same requires_grad and a copy of the gradient. (`copy.copy` copies too: see __reduce__.)"""
        copied = Tensor(
            UOp(Ops.CONTIGUOUS, self.dtype, (self.detach().uop,), next(_contiguous_ids)), device=self.device
        )
        copied = memo[id(self)] = copied.realize()
        copied.requires_grad = self.requires_grad
        if isinstance(self._grad, Tensor):  # (a gradient an optimizer step released is not copied: none was asked for)
            copied.grad = self._grad.__deepcopy__(memo)
        return copied

    def __reduce__(self):
        """Pickled with its values (NumPy's), dtype, device and requires_grad, as torch pickles a tensor; without
        this a pickle named the buffer, whose values are gone in another process."""
        return _unpickle_tensor, (self.numpy(), self.dtype.name, self.device, self.requires_grad)

    def contiguous(self) -> Tensor:
        """This tensor laid out in its own buffer in row-major order (a no-op for one already laid out so)."""
        if is_buffer_view(self._uop):
            return self
        # each call asks for a buffer of its own: a number makes the node unique, so two equal tensors made
        # contiguous (two layers' weights initialised to ones) never end up sharing one buffer
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), next(_contiguous_ids)))

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array of the tensor's dtype (runs the graph). NumPy has no bfloat16: a bfloat16
        tensor gives float32 (exactly its values; PyTorch raises here instead)."""
        tensor = self.realize()
        node = tensor._uop
        if node.op is Ops.DETACH and node.arg == DETACHED_VIEW:  # (a detached name of memory reads it as it is)
            node = node.src[0]
        if not is_buffer_view(node):
            if (array := _host_view(node)) is not None:  # (read in place: `float(t[i])` in a loop compiles nothing)
                return np.asarray(bfloat16_to_float32(array)) if self.dtype == dtypes.bfloat16 else array
            node = tensor.contiguous().realize()._uop  # a strided view of device memory: copied into order first
        array = buffer_of(node.base).numpy().reshape(self.shape)
        # (np.asarray: NumPy gives a 0-d array's conversion as a scalar, which np.asarray(tensor) refused)
        return np.asarray(bfloat16_to_float32(array)) if self.dtype == dtypes.bfloat16 else array

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Scalar:
        """The single value of a one-element tensor as a Python number."""
        if self.numel() != 1:
            raise ValueError(
                f"item(): only one-element tensors can be converted to a Python scalar, got shape {self.shape}"
            )
        return self.numpy().reshape(()).item()

    def detach(self) -> Tensor:
        """The same values, with no gradient flowing through. Of a tensor in memory (or a view of it), a name of that
        memory, as torch's: a write through it (`d = x.detach(); d += 1`, `p.detach().mul_(...)`) changes x. A write
        into the memory through another name leaves it the values it had (it becomes a copy of them, as a value made
        before the write keeps them: `keep = w.detach()` before an update keeps the old weights)."""
        if (buffer := memory_of(self._uop)) is None:
            return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), device=self.device, requires_grad=False)
        detached = Tensor(UOp(Ops.DETACH, self.dtype, (self._uop,), DETACHED_VIEW), device=self.device)
        detached._requires_grad = False
        _name_detached(buffer, detached)
        return detached

    def clone(self) -> Tensor:
        """A copy in a buffer of its own (later writes into this tensor do not reach it); gradients flow through,
        as with torch.clone."""
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), next(_contiguous_ids)))

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set `requires_grad` in place and return this tensor (torch's spelling)."""
        self.requires_grad = requires_grad
        return self

    def to(
        self,
        device: str | DType | None = None,
        dtype: DType | str | None = None,
        non_blocking: bool = False,
        copy: bool = False,
    ) -> Tensor:
        """A copy on another device (or self when it is already there); as in PyTorch, `.to(dtype)` (a DType, or
        a dtype's name like "uint8") and `.to(device, dtype)` cast too. `non_blocking` is accepted and changes
        nothing (every copy is lazy until read); `copy=True` gives a copy where the result would be self."""
        if copy:
            result = self.to(device, dtype)
            return result.clone() if result is self else result
        if isinstance(device, DType) or isinstance(device, str) and isinstance(getattr(dtypes, device, None), DType):
            device, dtype = None, device
        result = self if dtype is None else self.cast(dtype)
        return result if device is None else result._to_device(device)

    def type_as(self, other: Tensor) -> Tensor:
        """This tensor cast to other's dtype."""
        return self.cast(other.dtype)

    def _to_device(self, device: str) -> Tensor:
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        result = Tensor(UOp(Ops.COPY, self.dtype, (self.uop,), device), device=device)
        return result
