"""TinyJit: run a function twice normally, capture the kernels of the second call, then replay them on new
inputs' buffers with no scheduling or codegen."""

from __future__ import annotations

import functools
import time
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


def _input_views_copied(value: Any, inputs: set) -> Any:
    """A result with each tensor that views an input's memory (the input itself, x.reshape(...), x[1:3]) replaced
    by a copy: a replay swaps in the new inputs' buffers, where such a view would keep showing the captured call's."""
    if isinstance(value, (list, tuple)):
        return type(value)(_input_views_copied(item, inputs) for item in value)
    if isinstance(value, dict):
        return {key: _input_views_copied(item, inputs) for key, item in value.items()}
    if hasattr(value, "uop") and views_memory(value.uop) and value.uop.base in inputs:
        return value.clone()
    return value


def _tensors_in(value: Any) -> list:
    from lazygrad.tensor import Tensor

    return _leaves_in(value, Tensor)


# what a replay cannot recompute: it runs kernels, not the function's Python
_HOST_VALUES = (bool, int, float, complex, np.generic, np.ndarray)


class TinyJit:
    """Wrap a function whose work is realized Tensors (e.g. a training step). Calls 1 runs it, call 2 runs it
    while recording every kernel launch, later calls replay the launches with the new inputs' buffers. The outputs
    of a replay live in the same buffers every call. `JIT=0` turns capturing off."""

    def __init__(self, function: Callable):
        self.function = function
        self.calls = 0
        self.signature: tuple | None = None
        self.launches: list[realize.Launch] = []
        self.input_slots: list[tuple[int, int, int]] = []  # (launch, buffer position, input number)
        self.outputs: Any = None
        self.bound: list[list] = []
        self.random_sources: list = []
        self.own: set[int] = set()  # (ids of) the buffers a replay writes and reads itself
        self.plan: list[tuple[int, int, Any]] | None = None  # how a replay runs the launches, made at the first one
        functools.update_wrapper(self, function)

    def reset(self) -> None:
        """Forget the capture; the next calls warm up and capture again."""
        self.calls, self.signature, self.launches, self.input_slots, self.outputs, self.bound, self.plan = (
            0,
            None,
            [],
            [],
            None,
            [],
            None,
        )
        self.random_sources, self.own = [], set()

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

    def __call__(self, *args, **kwargs):
        from lazygrad.tensor import Tensor, pending_assigns

        if not JIT:
            return self.function(*args, **kwargs)
        tensors = _tensors_in(list(args) + list(kwargs.values()))
        # assigns made since the last call (`lr.assign(...)`, new weights) run first, outside any capture: a replay
        # reads the buffers they write, and would otherwise run on before them
        Tensor.realize_all(*tensors, *pending_assigns())
        for tensor in tensors:
            if not is_buffer_view(tensor.uop):
                tensor.uop = tensor.contiguous().realize().uop
        signature = self._signature(args, kwargs, tensors)
        if self.signature is not None and signature != self.signature:
            raise JitError(
                f"TinyJit({self.function.__name__}): called with {signature[0]} and arguments {signature[1:]}, but it was "
                f"captured with {self.signature[0]} and {self.signature[1:]} (each input: shape, dtype, device, and the "
                "first input that is the same tensor); inputs must keep their shapes, dtypes, which of them are one "
                "tensor, and the non-Tensor arguments (make a new TinyJit or call .reset())"
            )
        self.signature = signature
        self.calls += 1
        if self.calls > 2:
            return self._replay(tensors)
        try:
            return self._run(args, kwargs, tensors) if self.calls == 1 else self._capture(args, kwargs, tensors)
        except BaseException:
            self.reset()  # (a failed warm-up or capture leaves nothing to replay: the next call starts again)
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

    def _capture(self, args, kwargs, tensors: list):
        first_new_buffer = buffers_made_from_now()
        realize.capture.launches = []
        try:
            result = self._run(args, kwargs, tensors)
            launches = realize.capture.launches
        finally:
            realize.capture.launches = None
        if not launches:
            raise JitError(
                f"TinyJit({self.function.__name__}): the function launched no kernels, so there is nothing to replay"
            )
        if values := _leaves_in(result, _HOST_VALUES):
            what = (
                f"a NumPy array of shape {values[0].shape}"
                if isinstance(values[0], np.ndarray)
                else f"the Python number {values[0]!r}"
            )
            raise JitError(
                f"TinyJit({self.function.__name__}): the function returns {what}, which a replay would return "
                "unchanged (it runs kernels, not Python); return the Tensor and call .item() or .numpy() on what the "
                "TinyJit returns"
            )
        inputs = {}
        for number, tensor in enumerate(tensors):
            inputs.setdefault(tensor.uop.base, number)  # (inputs that are one buffer: the signature keeps them so)
        self.launches = launches
        self.input_slots = [
            (launch_number, position, inputs[buffer])
            for launch_number, launch in enumerate(launches)
            for position, buffer in enumerate(launch.buffers)
            if buffer in inputs
        ]
        # pre-bound: each launch's buffers, looked up once; a replay only swaps in the new inputs'
        self.bound = [[buffer_of(node) for node in launch.buffers] for launch in launches]
        # the memory a replay writes and reads itself (its outputs, intermediates): an input found there is copied
        # first (`x = step(x)` passes the last call's output, which the replay overwrites while reading it)
        self.own = {id(buffer) for bound in self.bound for buffer in bound} - {id(buffer_of(node)) for node in inputs}
        # the random sources the step itself drew, in the order it drew them: a replay draws them anew (random
        # tensors made before the step are not redrawn: they are fixed values the step reads)
        sources = {
            node: None
            for launch in launches
            for node in launch.buffers
            if is_random_source(node) and node.arg[0] > first_new_buffer
        }
        self.random_sources = sorted(sources, key=lambda node: node.arg[0])
        self.outputs, self.plan = result, None
        return result

    def _replay(self, tensors: list):
        with realize.realize_lock:  # as a realize: its launches and draws are not interleaved with another thread's
            return self._replay_locked(tensors)

    def _replay_locked(self, tensors: list):
        from lazygrad.tensor import Tensor

        for number, tensor in enumerate(tensors):
            if id(buffer_of(tensor.uop.base)) in self.own:
                tensors[number] = tensor.clone().realize()
        for source in self.random_sources:
            redraw(source)
        buffers = [list(launch_buffers) for launch_buffers in self.bound]
        for launch_number, position, input_number in self.input_slots:
            buffers[launch_number][position] = buffer_of(tensors[input_number].uop.base)
        if self.plan is None:  # runs of kernels as their device's graphs, where it has them (CUDA graphs)
            self.plan = replay_plan(self.launches, buffers)
        for first, end, graph in self.plan:
            if graph is not None:
                launch_graph(graph, self.launches[first:end], buffers[first:end])
                continue
            launch, launch_buffers = self.launches[first], buffers[first]
            if launch.host is not None:
                launch.host(*launch_buffers)
            elif launch_buffers[0].size:
                realize.launch_kernel(launch.kernel, launch_buffers, launch.device)

        def fresh(value):
            if isinstance(value, Tensor):
                return Tensor(value.uop, device=value.device)
            if isinstance(value, (list, tuple)):
                return type(value)(fresh(item) for item in value)
            return value

        return fresh(self.outputs)


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
