"""TinyJit: run a function twice normally, capture the kernels of the second call, then replay them on new
inputs' buffers with no scheduling or codegen."""

from __future__ import annotations

import copy
import functools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from lazygrad.device import Buffer, Device
from lazygrad.engine import realize
from lazygrad.engine.buffers import buffer_of, buffers_made_from_now, is_buffer_view, views_memory
from lazygrad.engine.rng import is_random_source, redraw
from lazygrad.helpers import DEBUG, JIT


class JitError(RuntimeError):
    """A call the JIT cannot replay correctly."""


def _leaves_in(value: Any, kind: type | tuple[type, ...]) -> list:
    """The values of `kind` in arguments or a result: nested in lists, tuples and dict values."""
    if isinstance(value, kind):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves_in(item, kind)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves_in(item, kind)]
    return []


def _rebuilt(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with every list, tuple (a namedtuple too) and dict in it made anew, of its own type, and each other
    value replaced by `leaf(value)`: a replay hands each caller containers of its own, which it may change."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_rebuilt(item, leaf) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuilt(item, leaf) for item in value)
    if isinstance(value, dict):
        rebuilt = copy.copy(value)  # (keeps a dict's own type and settings: an OrderedDict, a defaultdict's factory)
        for key, item in value.items():
            rebuilt[key] = _rebuilt(item, leaf)
        return rebuilt
    return leaf(value)


def _input_views_copied(value: Any, inputs: set) -> Any:
    """A result with each tensor that views an input's memory (the input itself, x.reshape(...), x[1:3]) replaced
    by a copy: a replay swaps in the new inputs' buffers, where such a view would keep showing the captured call's."""

    def copied(item):
        if hasattr(item, "uop") and views_memory(item.uop) and item.uop.base in inputs:
            return item.clone()
        return item

    return _rebuilt(value, copied)


def _fresh(value: Any) -> Any:
    """A new Tensor of a tensor's node (a result of its own for each caller), any other value as it is."""
    from lazygrad.tensor import Tensor

    return Tensor(value.uop, device=value.device) if isinstance(value, Tensor) else value


def _tensors_in(value: Any) -> list:
    from lazygrad.tensor import Tensor

    return _leaves_in(value, Tensor)


def _gradients_held() -> dict[int, tuple[weakref.ref, bool, weakref.ref | None]]:
    """For every live tensor: (the tensor, whether it has a .grad, the buffer its .grad is if realized), by the id of
    its entry in the registry of live tensors. Tensors and buffers are held weakly: holding them would change what
    the captured call computes and keeps."""
    from lazygrad.tensor import Tensor, _made

    held = {}
    for reference in list(_made.values()):  # (the registry of live tensors, as pending_assigns reads it)
        tensor = reference()
        if tensor is not None:
            gradient = tensor._grad  # (a Tensor, None, or a marker that an assign released it)
            base = gradient.uop.base if isinstance(gradient, Tensor) and views_memory(gradient.uop) else None
            held[id(reference)] = (reference, gradient is not None, weakref.ref(base) if base is not None else None)
    return held


def _lazy_tensors() -> list:
    """The live tensors whose values are still graphs, not memory (a view of memory, `w.T`, reads its buffer)."""
    from lazygrad.tensor import _made

    found = []
    for reference in list(_made.values()):
        tensor = reference()
        if tensor is not None and not views_memory(tensor.uop):
            found.append(tensor)
    return found


def _array_in(value: Any, where: str) -> tuple[str, Any] | None:
    """(where, value) of the first array (a NumPy array, or another library's tensor) in an argument, or None."""
    from lazygrad.tensor import Tensor

    if isinstance(value, np.ndarray) or (
        hasattr(value, "__array__") and not isinstance(value, (Tensor, np.generic)) and hasattr(value, "shape")
    ):
        return where, value
    if isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = ((repr(key), item) for key, item in value.items())
    else:
        return None
    for key, item in items:
        if (found := _array_in(item, f"{where}[{key}]")) is not None:
            return found
    return None


# what a replay cannot recompute: it runs kernels, not the function's Python
_HOST_VALUES = (bool, int, float, complex, np.generic, np.ndarray)


@dataclass
class _Recording:
    """One capture of the function (a TinyJit keeps one for each mode it is called in): its calls so far, the
    signature it was captured with, the launches and how a replay binds them, and the results it returns."""

    calls: int = 0
    signature: tuple | None = None
    launches: list[realize.Launch] = field(default_factory=list)
    input_slots: list[tuple[int, int, int]] = field(default_factory=list)  # (launch, buffer position, input number)
    outputs: Any = None
    bound: list[list] = field(default_factory=list)
    random_sources: list = field(default_factory=list)
    own: set[int] = field(default_factory=set)  # (ids of) the buffers a replay writes and reads itself
    plan: list[tuple[int, int, Any]] | None = None  # how a replay runs the launches, made at the first one
    # (tensor, the .grad the captured call gave it, whether that call started with no .grad): a replay gives it again
    gradients: list[tuple[weakref.ref, Any, bool]] = field(default_factory=list)
    written: set | None = None  # the buffers its launches write, found at the first replay
    # the tensors whose memory its launches use, and whether each required grad then: a parameter frozen or unfrozen
    # since changes what the function computes (its gradient and update), so the function is captured again
    requires_grad: list[tuple[weakref.ref, bool | None]] = field(default_factory=list)

    def trains_other_tensors(self) -> bool:
        return any((tensor := ref()) is not None and tensor.requires_grad != then for ref, then in self.requires_grad)


class TinyJit:
    """Wrap a function whose work is realized Tensors (e.g. a training step). Call 1 runs it, call 2 runs it
    while recording every kernel launch, later calls replay the launches with the new inputs' buffers. The outputs
    of a replay live in the same buffers every call (the containers holding them are new each call): they hold this
    call's values until the next call. `JIT=0` turns capturing off.

    A replay runs kernels, not the function's Python, so what the Python decided at the capture stays decided:
    - The mode it runs in, `Tensor.training` (dropout, batch norm) and `Tensor.no_grad` (`Tensor.test()`), is part
      of the capture: a call in another mode warms up and captures again (as torch.compile re-traces when a guard
      fails), and each mode keeps its capture, so a train step and an eval step alternate without recapturing (at
      most four captures, one per mode).
    - Inputs are Tensors: their values change between calls, their shapes, dtypes and devices may not. Any other
      argument (a number, a string) must be the same at every call; a NumPy array is refused (pass Tensor(array)).
    - State the function updates must be updated in place with `assign` (the optimizers' parameters, batch norm's
      running statistics): a replay writes the same buffers. Rebinding a Python attribute after the capture is not
      seen: `opt.lr = 0.0` leaves the replays at the old rate, while `opt.lr.assign(Tensor([0.0]))` reaches them;
      and a tensor the function rebinds each call (`self.h = self.h + x`) is read as it was at the capture. Tensors
      still lazy when it captures (`b = a * 3`) are computed first, so the replays read (and see assigns to) their
      buffers.
    - `.grad`: each replay gives the tensors the function's backward filled the same `.grad` (holding this call's
      gradient), also when `opt.zero_grad()` runs outside the function. Adding to a `.grad` kept from an earlier
      call (backward without zero_grad in the function) cannot be replayed and is refused with a JitError.
    - A TinyJit called while another one captures runs as plain code, its kernels part of the outer capture.
    - Threads: a TinyJit runs one call at a time (a second thread waits), and while it captures no other thread
      realizes. A replay's outputs are the same buffers for every caller: another thread's call overwrites them.
    - On a method (`@TinyJit` in a class body), each instance gets a TinyJit of its own: its tensors differ."""

    def __init__(self, function: Callable):
        self.function = function
        self.recordings: dict[tuple[bool, bool], _Recording] = {}  # by mode: (Tensor.training, Tensor.no_grad)
        self.recording = _Recording()  # the one the last call used
        # (re-entrant: the function may call this TinyJit again, which then warms up inside it)
        self._lock = threading.RLock()
        self._bound: dict[int, TinyJit] = {}  # on a method: each instance's TinyJit, by the instance's id
        functools.update_wrapper(self, function)

    def __get__(self, instance: Any, owner: type | None = None) -> TinyJit:
        """`instance.method`: the instance's own TinyJit (one capture shared by all instances would replay the first
        one's tensors for every other). It holds the instance weakly and goes with it."""
        if instance is None:
            return self
        bound = self._bound.get(id(instance))
        if bound is not None:
            return bound
        try:
            reference = weakref.ref(instance)
        except TypeError:
            raise TypeError(
                f"TinyJit({self.function.__name__}): a method of a {type(instance).__name__} instance, which cannot be "
                "weakly referenced (its __slots__ lack '__weakref__'), so its own capture cannot be kept with it; add "
                "'__weakref__' to __slots__, or make one per instance: self.step = TinyJit(self._step)"
            ) from None
        function = self.function

        def method(*args, **kwargs):
            return function(reference(), *args, **kwargs)

        functools.update_wrapper(method, function)
        bound = self._bound.setdefault(id(instance), TinyJit(method))  # (setdefault: two threads get one)
        if bound.function is method:
            weakref.finalize(instance, self._bound.pop, id(instance), None)
        return bound

    def __deepcopy__(self, memo: dict) -> TinyJit:
        """A TinyJit of a copy of the function (`copy.deepcopy(model)`, whose step reads the copy's tensors), which
        captures again: a capture replays the buffers it was made with (and its lock cannot be copied)."""
        return TinyJit(copy.deepcopy(self.function, memo))

    def __getattr__(self, name: str) -> Any:
        """The last call's capture, read as the TinyJit's own: `launches`, `plan`, `calls` (in that mode: 1 warmed
        up, 2 captured, more replayed), `outputs`, ..."""
        if name in _Recording.__dataclass_fields__ and "recording" in self.__dict__:
            return getattr(self.recording, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def reset(self) -> None:
        """Forget every capture; the next calls warm up and capture again."""
        self.recordings, self.recording = {}, _Recording()

    @staticmethod
    def _signature(args: tuple, kwargs: dict, tensors: list) -> tuple:
        """What a replay needs to stay as captured: the inputs' shapes, dtypes and devices, which inputs are one
        tensor (or views of one buffer: the captured kernels read it once for all of them), and the other
        arguments."""
        first = {}
        shapes = tuple((t.shape, t.dtype, t.device, first.setdefault(t.uop.base, n)) for n, t in enumerate(tensors))
        from lazygrad.tensor import Tensor

        def plain(value):
            return None if isinstance(value, Tensor) else repr(value)

        return shapes, tuple(plain(a) for a in args), tuple(sorted((k, plain(v)) for k, v in kwargs.items()))

    def _refuse_arrays(self, args: tuple, kwargs: dict) -> None:
        """An array among the arguments is an error: it is not a Tensor, so the signature would keep its repr (which
        leaves out most values of a large one) and a replay would reuse the captured call's values."""
        named = [*((f"argument {number}", value) for number, value in enumerate(args))]
        named += [(f"keyword argument {key!r}", value) for key, value in kwargs.items()]
        for where, value in named:
            if (found := _array_in(value, where)) is not None:
                position, array = found
                kind = f"{type(array).__module__}.{type(array).__qualname__} of shape {tuple(array.shape)}"
                raise JitError(
                    f"TinyJit({self.function.__name__}): {position} is a {kind}, which a replay would not read again "
                    "(it reads new values only from Tensors, and would reuse the captured call's); pass "
                    "Tensor(array) instead"
                )

    def __call__(self, *args, **kwargs):
        # inside another TinyJit's capture this one is plain code: its kernels join that capture (its own replay
        # would launch them unrecorded, and its own capture would end the outer one)
        if not JIT or realize.capture.launches is not None:
            return self.function(*args, **kwargs)
        with self._lock:  # (one call at a time: its counter, capture and replay's output buffers are shared)
            return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict):
        from lazygrad.tensor import Tensor, pending_assigns

        self._refuse_arrays(args, kwargs)
        # (keyword arguments in the signature's order, by name: the call's order would swap same-shaped inputs)
        tensors = _tensors_in(list(args) + [kwargs[key] for key in sorted(kwargs)])
        # assigns made since the last call (`lr.assign(...)`, new weights) run first, outside any capture: a replay
        # reads the buffers they write, and would otherwise run on before them
        Tensor.realize_all(*tensors, *pending_assigns())
        # a view (x[1:3], x.T) goes in as a copy in a buffer of its own, which a replay can swap for the next call's;
        # the caller's tensor stays the view it is (it follows its buffer, and keeps its gradient)
        copies = {id(tensor): tensor.contiguous() for tensor in tensors if not is_buffer_view(tensor.uop)}
        if copies:
            Tensor.realize_all(*copies.values())
            tensors = [copies.get(id(tensor), tensor) for tensor in tensors]

            def copied(value):
                return copies.get(id(value), value) if isinstance(value, Tensor) else value

            args, kwargs = _rebuilt(args, copied), _rebuilt(kwargs, copied)
        signature = self._signature(args, kwargs, tensors)
        mode = (bool(Tensor.training), bool(Tensor.no_grad))
        recording = self.recordings.get(mode)
        if recording is None or recording.trains_other_tensors():
            if recording is not None and DEBUG >= 1:
                print(f"TinyJit({self.function.__name__}): a tensor it uses was frozen or unfrozen: capturing again")
            recording = self.recordings[mode] = _Recording()
        self.recording = recording
        if recording.signature is not None and signature != recording.signature:
            raise JitError(
                f"TinyJit({self.function.__name__}): called with {signature[0]} and arguments {signature[1:]}, but it was "
                f"captured with {recording.signature[0]} and {recording.signature[1:]} (each input: shape, dtype, "
                "device, and the first input that is the same tensor); inputs must keep their shapes, dtypes, which "
                "of them are one tensor, and the non-Tensor arguments (make a new TinyJit or call .reset())"
            )
        recording.signature = signature
        recording.calls += 1
        if recording.calls > 2:
            return self._replay(recording, tensors)
        try:
            if recording.calls == 1:
                return self._run(args, kwargs, tensors)
            # no other thread realizes meanwhile: it would record nothing here, but could compute (or realize
            # first, outside the capture) tensors this call is building
            with realize.realize_lock:
                return self._capture(recording, args, kwargs, tensors)
        except BaseException:
            # (a failed warm-up or capture leaves nothing to replay: the next call in this mode starts again)
            self.recordings.pop(mode, None)
            self.recording = _Recording()
            raise

    def _run(self, args, kwargs, tensors: list):
        from lazygrad.tensor import Tensor, pending_assigns

        before = {id(tensor): tensor for tensor in pending_assigns()}  # (held: their ids stay theirs)
        result = _input_views_copied(self.function(*args, **kwargs), {tensor.uop.base for tensor in tensors})
        # state the function updated without returning it (batch norm's running statistics, a step counter) is
        # realized with its results: a replay runs only the kernels the captured call ran
        updated = [tensor for tensor in pending_assigns() if id(tensor) not in before]
        Tensor.realize_all(*_tensors_in(result), *updated)
        return result

    def _capture(self, recording: _Recording, args, kwargs, tensors: list):
        from lazygrad.tensor import Tensor

        # tensors made before this call and still lazy (`b = a * 3`, a bias set to Tensor.zeros(n)) are computed
        # first, outside the capture, so the captured kernels read their buffers, which a later assign
        # (load_state_dict) writes in place: inlined, their graphs stayed the values they had at the capture. All of
        # them, not only those the function reads: that shows only once their graphs are inlined in its kernels (the
        # others are computed now rather than when first read)
        Tensor.realize_all(*_lazy_tensors())
        first_new_buffer = buffers_made_from_now()
        gradients_before = _gradients_held()
        realize.capture.launches = []
        realize.capture.inputs = frozenset(tensor.uop.base for tensor in tensors)
        try:
            result = self._run(args, kwargs, tensors)
            launches = realize.capture.launches
        finally:
            realize.capture.launches, realize.capture.inputs = None, frozenset()
        name = self.function.__name__
        if not launches:
            raise JitError(f"TinyJit({name}): the function launched no kernels, so there is nothing to replay")
        if values := _leaves_in(result, _HOST_VALUES):
            what = (
                f"a NumPy array of shape {values[0].shape}"
                if isinstance(values[0], np.ndarray)
                else f"the Python number {values[0]!r}"
            )
            raise JitError(
                f"TinyJit({name}): the function returns {what}, which a replay would return "
                "unchanged (it runs kernels, not Python); return the Tensor and call .item() or .numpy() on what the "
                "TinyJit returns"
            )
        inputs = {}
        for number, tensor in enumerate(tensors):
            inputs.setdefault(tensor.uop.base, number)  # (inputs that are one buffer: the signature keeps them so)
        recording.gradients = _gradients_given(name, launches, gradients_before, tensors)
        recording.requires_grad = _requires_grad_of_tensors_using(launches)
        recording.launches = launches
        recording.input_slots = [
            (launch_number, position, inputs[buffer])
            for launch_number, launch in enumerate(launches)
            for position, buffer in enumerate(launch.buffers)
            if buffer in inputs
        ]
        # pre-bound: each launch's buffers, looked up once; a replay only swaps in the new inputs'
        recording.bound = [[buffer_of(node) for node in launch.buffers] for launch in launches]
        # the memory a replay writes and reads itself (its outputs, intermediates): an input found there is copied
        # first (`x = step(x)` passes the last call's output, which the replay overwrites while reading it)
        recording.own = {id(buffer) for bound in recording.bound for buffer in bound} - {
            id(buffer_of(node)) for node in inputs
        }
        # the random sources the step itself drew, in the order it drew them: a replay draws them anew (random
        # tensors made before the step are not redrawn: they are fixed values the step reads)
        sources = {
            node: None
            for launch in launches
            for node in launch.buffers
            if is_random_source(node) and node.arg[0] > first_new_buffer
        }
        recording.random_sources = sorted(sources, key=lambda node: node.arg[0])
        # (kept apart from what this call returns, which its caller may change: a dict it writes a number into)
        recording.outputs, recording.plan = _rebuilt(result, _fresh), None
        return result

    def _replay(self, recording: _Recording, tensors: list):
        with realize.realize_lock:  # as a realize: its launches and draws are not interleaved with another thread's
            return self._replay_locked(recording, tensors)

    def _replay_locked(self, recording: _Recording, tensors: list):
        from lazygrad.tensor import keep_values_before_writes

        self._check_gradients(recording)
        # a value built before the call from what the replay overwrites (a snapshot of the weights, a running
        # statistic) is computed first, as the function's own schedules would have computed it
        if recording.written is None:
            recording.written = {launch.buffers[0] for launch in recording.launches if launch.buffers}
        keep_values_before_writes(recording.written)
        for number, tensor in enumerate(tensors):
            if id(buffer_of(tensor.uop.base)) in recording.own:
                tensors[number] = tensor.clone().realize()
        for source in recording.random_sources:
            redraw(source)
        buffers = [list(launch_buffers) for launch_buffers in recording.bound]
        for launch_number, position, input_number in recording.input_slots:
            buffers[launch_number][position] = buffer_of(tensors[input_number].uop.base)
        if recording.plan is None:  # runs of kernels as their device's graphs, where it has them (CUDA graphs)
            recording.plan = replay_plan(recording.launches, buffers)
        for first, end, graph in recording.plan:
            if graph is not None:
                launch_graph(graph, recording.launches[first:end], buffers[first:end])
                continue
            launch, launch_buffers = recording.launches[first], buffers[first]
            if launch.host is not None:
                launch.host(*launch_buffers)
            elif launch_buffers[0].size:
                realize.launch_kernel(launch.kernel, launch_buffers, launch.device)
        # the function's backward bound these .grads: the replay, which ran it as kernels, binds them again
        for reference, gradient, _ in recording.gradients:
            if (tensor := reference()) is not None:
                tensor._grad = gradient
        return _rebuilt(recording.outputs, _fresh)

    def _check_gradients(self, recording: _Recording) -> None:
        """Refuse a replay where eager code would add to a .grad that the captured call found empty (cleared
        outside the function before each call, and not this time)."""
        for reference, _, started_empty in recording.gradients:
            tensor = reference()
            if tensor is None or not started_empty or tensor._grad is None:
                continue
            raise JitError(
                f"TinyJit({self.function.__name__}): a {tensor.shape} {tensor.dtype.name} tensor has a .grad from an "
                "earlier call, which backward would add to, but the captured call started with none (its .grad was "
                "cleared before the call) and replays a fresh gradient. Clear the gradients before every call, as "
                "then (opt.zero_grad()), or inside the function"
            )


def _gradients_given(name: str, launches: list, before: dict, inputs: list) -> list:
    """The .grads the captured call bound to buffers it wrote: (tensor, .grad, whether the tensor was there before
    the call with no .grad), which a replay binds again (an input's is left out: its gradient is dropped). A .grad
    that adds to one kept from the call before (the captured kernels read that buffer and do not write it) is
    refused: a replay would add to that old buffer, the same every call, where eager code adds to the last sum."""
    from lazygrad.tensor import Tensor, _made

    # (a launch's first buffer is the one it writes; a host step may have none: a barrier)
    written = {launch.buffers[0] for launch in launches if launch.buffers}
    read = {node for launch in launches for node in launch.buffers}
    given = []
    for reference in list(_made.values()):
        tensor = reference()
        if tensor is None or not isinstance(gradient := tensor._grad, Tensor) or not is_buffer_view(gradient.uop):
            continue
        if any(tensor is input_tensor for input_tensor in inputs):
            continue
        _, had_gradient, earlier = before.get(id(reference), (None, False, None))
        old = earlier() if earlier is not None else None
        if gradient.uop.base not in written or gradient.uop.base is old:  # (not the capture's, or updated in place)
            continue
        if old is not None and old in read and old not in written and all(old is not t.uop.base for t in inputs):
            raise JitError(
                f"TinyJit({name}): the function adds to the .grad of a {tensor.shape} {tensor.dtype.name} tensor that "
                "it kept from the call before (backward adds to an existing .grad), which a replay cannot do: it "
                "would add to the first call's gradient every time. Clear the gradients inside the function before "
                "backward (opt.zero_grad() or .grad = None); to add up several calls' gradients, keep the sum in a "
                "tensor of your own (total.assign(total + w.grad))"
            )
        given.append((reference, gradient, id(reference) in before and not had_gradient))
    return given


def _requires_grad_of_tensors_using(launches: list) -> list[tuple[weakref.ref, bool | None]]:
    """(tensor, weakly; its requires_grad) for every live tensor whose memory one of `launches` reads or writes."""
    from lazygrad.tensor import _made

    used = {node for launch in launches for node in launch.buffers}
    found = []
    for reference in list(_made.values()):
        tensor = reference()
        if tensor is not None and views_memory(tensor.uop) and tensor.uop.base in used:
            found.append((reference, tensor.requires_grad))
    return found


def replay_plan(launches: list[realize.Launch], buffers: list[list[Buffer]]) -> list[tuple[int, int, Any]]:
    """How a replay runs the launches: (first, end, graph) for each run of kernels on one device that has graphs
    (`graph(programs)`, e.g. a CUDA graph: one launch for the run), (number, number + 1, None) for each launch left
    (a host step such as a label check or a copy, a kernel on a device without graphs)."""
    plan: list[tuple[int, int, Any]] = []
    first = 0
    while first < len(launches):
        end = first
        device = launches[first].device
        graphs = launches[first].kernel is not None and hasattr(Device[device], "graph")
        while graphs and end < len(launches) and launches[end].kernel is not None and launches[end].device == device:
            end += 1
        programs = [
            launch.kernel.program for launch, bound in zip(launches[first:end], buffers[first:end]) if bound[0].size
        ]
        if programs:
            plan.append((first, end, Device[device].graph(programs)))
        else:
            end = first + 1
            plan.append((first, end, None))
        first = end
    return plan


def launch_graph(graph: Any, launches: list[realize.Launch], buffers: list[list[Buffer]]) -> None:
    """Replay a run of kernels with one launch of their graph, counting them (DEBUG=2 prints one line for it)."""
    kernels = [(launch.kernel, bound) for launch, bound in zip(launches, buffers) if bound[0].size]
    start = time.perf_counter()
    measured = graph([[buffer.handle for buffer in bound] for _, bound in kernels])
    # a device that times its own work (events at DEBUG>=2) returns the seconds
    elapsed = measured if isinstance(measured, float) else time.perf_counter() - start
    realize.count_launched([kernel for kernel, _ in kernels], elapsed)
    if DEBUG >= 2:
        print(f"*** {launches[0].device:6s} graph of {len(kernels)} kernels, one launch {elapsed * 1e3:9.3f} ms")
