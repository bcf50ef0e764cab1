"""Data-parallel training over MPI (Open MPI, or any MPI, through mpi4py): every rank runs the same program on its
part of each batch, and collectives combine tensors across the ranks.

    from lazygrad import distributed
    distributed.init()                       # rank and world size from mpirun; per-rank random streams
    model = distributed.DataParallel(model)  # every rank starts from rank 0's parameters
    loss.backward(); model.sync_gradients(); optimizer.step()

and run it with `mpirun -n 2 python train.py` (one machine, or many hosts with `--host`/`--hostfile`).

How it works:
- A collective is a host step (engine/realize.py `run_host`) between kernels: its tensors are realized, MPI reads
  their buffers and writes the result into a new buffer. TinyJit captures the step in its place and replays it.
  Buffers go through host memory: the memory itself on host devices, a staging copy on others; with a CUDA-aware
  MPI, GPU memory is handed to MPI directly, once the device has synchronized (the one device-specific path, taken
  only when MPI reports it).
- Every collective starts with a handshake through rank 0: each rank sends what it is about to do (how many
  collectives it made before, the op, the shapes and dtypes), rank 0 checks that they agree and answers. Ranks that
  disagree all raise `DistributedError` naming both sides (a call refused by one rank's own argument checks still
  makes the handshake first, so it is such a disagreement); a rank that does not arrive within the timeout is named
  and the job is aborted, so no rank waits forever. Then the data moves by MPI's own collectives (a rank that dies
  during one is noticed by mpirun, which ends the job). An uncaught exception on any rank aborts every rank at once.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import math
import operator
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NoReturn

import numpy as np

from lazygrad.device import Buffer, Device
from lazygrad.dtype import DType, dtypes
from lazygrad.engine.buffers import new_buffer
from lazygrad.engine.realize import run_host
from lazygrad.helpers import MPI_WORLD_SIZE, prod
from lazygrad.nn.state import _members, get_parameters
from lazygrad.tensor import Tensor

BUCKET_BYTES = 25 * 2**20  # gradient bytes all-reduced in one message, as PyTorch's DistributedDataParallel
REDUCE_OPS = ("sum", "mean", "max", "min")
INSTALL_HINT = (
    "pip install 'lazygrad[distributed]' (mpi4py, which needs an MPI library: apt-get install openmpi-bin "
    "libopenmpi-dev)"
)
_HANDSHAKE_TAG = 17
_MPI_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}
_LOGICAL_OPS = {"max": "LOR", "min": "LAND"}  # on bools: max is "on any rank", min "on every rank"


class DistributedError(RuntimeError):
    """A collective that cannot run as called: before `init()`, or with ranks that disagree about it."""


@dataclass
class _World:
    """The job after `init()`: mpi4py's MPI module, lazygrad's own communicator, and the collectives made so far."""

    mpi: Any
    comm: Any
    rank: int
    size: int
    timeout: float
    calls: int = 0


_world: _World | None = None


def init(seed: int = 0, timeout: float = 300.0) -> None:
    """Join the MPI job: rank and world size come from mpirun (a plain `python` run is a world of one). Seeds each
    rank's random numbers: rank 0 exactly as `Tensor.manual_seed(seed)`, so a distributed run starts from the
    weights a single process would draw, and every other rank from (seed, rank), reproducibly. A rank that does not
    reach a collective within `timeout` seconds of rank 0 ends the job with a message naming it. Calling `init`
    again re-seeds and sets the timeout."""
    global _world
    try:
        number = operator.index(seed)  # a NumPy integer too
    except TypeError:
        number = -1
    if number < 0:
        raise ValueError(f"distributed.init: seed must be a non-negative int, got {seed!r}")
    if not timeout > 0:
        raise ValueError(f"distributed.init: timeout must be a positive number of seconds, got {timeout!r}")
    if _world is None:
        MPI = _start_mpi(float(timeout))
        world = _World(MPI, MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), float(timeout))
        if world.size > 1:
            _abort_on_uncaught_exception(world)
        _agree(world, "init()")  # every rank is here (or the missing one is named), so the next call cannot hang
        world.comm = MPI.COMM_WORLD.Dup()  # lazygrad's messages never meet the program's own MPI traffic
        _world = world
    _world.timeout = float(timeout)
    Tensor.manual_seed(_rank_seed(number, _world.rank))


def _start_mpi(timeout: float) -> Any:
    """Import mpi4py, which starts MPI. Open MPI's start waits for every rank of the job, so a rank that never
    gets there (hung before `init()`) would hold the others forever. The wait holds the GIL, so no Python thread can
    watch it: faulthandler's watchdog does, and after `timeout` seconds prints where this rank waits ("Timeout")
    and exits, and mpirun ends the job."""
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        from mpi4py import MPI  # waits until every rank of the job gets here (see above)
    except ImportError as error:
        raise ImportError(f"distributed.init: cannot import mpi4py ({error}) — {INSTALL_HINT}") from error
    finally:
        faulthandler.cancel_dump_traceback_later()
    return MPI


def launched_by_mpirun() -> bool:
    """Whether mpirun started this process (so `init()` joins a job of several ranks)."""
    return MPI_WORLD_SIZE > 0


def _rank_seed(seed: int, rank: int) -> int:
    """The random seed of a rank: `seed` itself on rank 0, a 32-bit number drawn from (seed, rank) on the others."""
    return seed if rank == 0 else int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def _require(what: str) -> _World:
    if _world is None:
        raise DistributedError(
            f"distributed.{what}: call distributed.init() first (and start the program with mpirun -n N python ...)"
        )
    return _world


def rank() -> int:
    """This process's rank: 0 .. world_size() - 1."""
    return _require("rank").rank


def world_size() -> int:
    """How many ranks the job has."""
    return _require("world_size").size


# ---- the handshake: every rank agrees on each collective before any data moves ---------------------------------


def _agree(world: _World, summary: str, details: str = "", flags: int = 0) -> int:
    """Check that every rank is making the same collective (same count of collectives before it, same `summary` and
    `details`) within the timeout; the ranks that disagree raise on every rank, a missing rank aborts the job. Also
    ORs the ranks' `flags` (bits of a Python int, such as which parameters have a gradient) and returns the result."""
    world.calls += 1
    mine = (world.calls, summary, zlib.crc32((summary + details).encode()))
    if world.size == 1:
        return flags
    comm = world.comm
    if world.rank == 0:
        theirs = _wait({r: comm.irecv(source=r, tag=_HANDSHAKE_TAG) for r in range(1, world.size)}, world.timeout)
        missing = [r for r in range(1, world.size) if r not in theirs]
        if missing:
            _abort(
                world,
                f"{summary}, collective #{world.calls}, timed out after {world.timeout:g} s: "
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not reach it "
                "(it died, hung, raised an error or called other collectives)",
            )
        other = next((r for r in sorted(theirs) if theirs[r][0] != mine), None)
        verdict = None if other is None else _disagreement(0, mine, other, theirs[other][0])
        for _, their_flags in theirs.values():
            flags |= their_flags
        _wait_all([comm.isend((verdict, flags), dest=r, tag=_HANDSHAKE_TAG) for r in range(1, world.size)])
    else:
        sent = comm.isend((mine, flags), dest=0, tag=_HANDSHAKE_TAG)
        # a little longer than rank 0 waits, so that when another rank is missing, rank 0 names it first
        answer = _wait({0: comm.irecv(source=0, tag=_HANDSHAKE_TAG)}, world.timeout * 1.1 + 1)
        if not answer:
            _abort(
                world,
                f"{summary}, collective #{world.calls}, timed out after {world.timeout:g} s: no answer from rank 0, "
                "which checks that every rank reached it (rank 0 died, hung or raised an error)",
            )
        _wait_all([sent])
        verdict, flags = answer[0]
    if verdict is not None:
        raise DistributedError(verdict)
    return flags


def _disagreement(rank_a: int, call_a: tuple, rank_b: int, call_b: tuple) -> str:
    if call_a[1] == call_b[1] and call_a[0] == call_b[0]:
        return (
            f"ranks disagree: rank {rank_a} and rank {rank_b} both call {call_a[1]} as collective #{call_a[0]}, but "
            "with different tensors; every rank must pass tensors of the same shapes and dtypes"
        )
    return (
        f"ranks disagree: rank {rank_a} calls {call_a[1]} as its collective #{call_a[0]}, rank {rank_b} calls "
        f"{call_b[1]} as its collective #{call_b[0]}; every rank must make the same collective calls in the same "
        "order, with tensors of the same shapes and dtypes"
    )


def _wait(requests: dict[int, Any], seconds: float) -> dict[int, Any]:
    """Poll non-blocking receives until all have arrived or `seconds` pass; the messages that arrived, by rank."""
    arrived: dict[int, Any] = {}
    start, pause = time.monotonic(), 0.0
    while True:
        for source, request in list(requests.items()):
            done, message = request.test()
            if done:
                arrived[source] = message
                del requests[source]
        elapsed = time.monotonic() - start
        if not requests or elapsed > seconds:
            return arrived
        # spin for the first millisecond (the others are usually about to arrive), then sleep longer and longer (up
        # to a millisecond) so that a rank that waits leaves the cores to the ranks still computing
        if elapsed > 1e-3:
            time.sleep(pause)
            pause = min(2 * pause or 5e-5, 1e-3)


def _wait_all(requests: list[Any]) -> None:
    for request in requests:
        request.wait()


def _abort(world: _World, message: str) -> None:
    sys.stderr.write(f"lazygrad.distributed: rank {world.rank} of {world.size}: {message}; aborting every rank\n")
    sys.stderr.flush()
    world.mpi.COMM_WORLD.Abort(1)


def _abort_on_uncaught_exception(world: _World) -> None:
    """Make an uncaught exception end the whole job: the other ranks would otherwise wait for this one forever."""
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        previous(kind, value, traceback)
        _abort(world, f"raised {kind.__name__} (traceback above)")

    sys.excepthook = hook


# ---- moving buffers through host memory ----------------------------------------------------------------------


def _host_bytes(buffer: Buffer) -> np.ndarray | None:
    """The buffer's own memory as host bytes, on devices whose memory is this process's; else None."""
    memory = Device[buffer.device].allocator.host_bytes(buffer.handle)
    return None if memory is None else memory[: buffer.nbytes]


_staging: dict[str, np.ndarray] = {}


def _staging_bytes(device: str, nbytes: int) -> np.ndarray:
    """Host bytes to stage a device's buffers in: one array per device, grown to the largest collective so far (a
    GPU's allocator copies through its own page-locked buffers)."""
    memory = _staging.get(device)
    if memory is None or memory.nbytes < nbytes:
        memory = _staging[device] = np.empty(nbytes, dtype=np.uint8)
    return memory[:nbytes]


def _output_bytes(buffer: Buffer) -> tuple[np.ndarray, Callable[[], None]]:
    """Host bytes to write a collective's result into, and what then moves them into the buffer."""
    memory = _host_bytes(buffer)
    if memory is not None:
        return memory, lambda: None
    staging = _staging_bytes(buffer.device, buffer.nbytes)

    def copy_in() -> None:
        if buffer.nbytes:
            Device[buffer.device].allocator.copyin(buffer.handle, staging)

    return staging, copy_in


def _gather(buffers: tuple[Buffer, ...], memory: np.ndarray) -> None:
    """Lay the buffers' bytes end to end into host `memory`."""
    offset = 0
    for buffer in buffers:
        target = memory[offset : offset + buffer.nbytes]
        if (source := _host_bytes(buffer)) is not None:
            target[:] = source
        elif buffer.nbytes:
            Device[buffer.device].allocator.copyout(target, buffer.handle)
        offset += buffer.nbytes


def _scatter(memory: np.ndarray, buffers: tuple[Buffer, ...]) -> None:
    """Copy host `memory` into the buffers, laid end to end (the reverse of `_gather`)."""
    offset = 0
    for buffer in buffers:
        source = memory[offset : offset + buffer.nbytes]
        if (target := _host_bytes(buffer)) is not None:
            target[:] = source
        elif buffer.nbytes:
            Device[buffer.device].allocator.copyin(buffer.handle, source)
        offset += buffer.nbytes


# The one device-specific path, taken only when detected: an MPI built with CUDA support (Open MPI reports it
# through MPIX_Query_cuda_support) moves GPU memory itself, given its address, so nothing is staged on the host.
@functools.cache
def _mpi_moves_gpu_memory() -> bool:
    query = getattr(ctypes.CDLL(None), "MPIX_Query_cuda_support", None)
    return bool(query is not None and query())


def _mpi_memory(world: _World, buffer: Buffer) -> Any:
    """Memory MPI can read and write as it is (host memory, or GPU memory with a CUDA-aware MPI), or None."""
    memory = _host_bytes(buffer)
    if memory is None and buffer.nbytes and _mpi_moves_gpu_memory():
        device = Device[buffer.device]
        address = device.allocator.gpu_address(buffer.handle)
        if address is not None:
            # launches are asynchronous (ops_cuda.py): the kernels writing an input, or still reading a recycled
            # output block, must finish before MPI touches the memory
            getattr(device, "synchronize", lambda: None)()
            memory = world.mpi.buffer.fromaddress(address, buffer.nbytes)
    return memory


def _mpi_type(world: _World, dtype: DType) -> Any:
    """MPI's datatype for a dtype, or None where MPI has none (float16; bfloat16, whose memory is uint16 bits)."""
    if dtype == dtypes.bfloat16:
        return None
    try:
        datatype = world.mpi.Datatype.fromcode(dtype.np.char)
        datatype.Get_size()  # a type this MPI library lacks (MPIX_C_FLOAT16) is only found out when used
        return datatype
    except (KeyError, ValueError, world.mpi.Exception):
        return None


# ---- the collectives as host steps: called with the output buffer, then the input buffers -----------------------


def _all_reduce_step(world: _World, summary: str, details: str, op: str, output: Buffer, *inputs: Buffer) -> None:
    _agree(world, summary, details)
    mpi = world.mpi
    mpi_op = getattr(mpi, (_LOGICAL_OPS if output.dtype == dtypes.bool else _MPI_OPS)[op])
    mpi_type = _mpi_type(world, output.dtype)
    send = _mpi_memory(world, inputs[0]) if len(inputs) == 1 else None
    receive = _mpi_memory(world, output)
    if send is not None and receive is not None:
        world.comm.Allreduce([send, mpi_type], [receive, mpi_type], mpi_op)
        return
    memory, commit = _output_bytes(output)
    _gather(inputs, memory)
    world.comm.Allreduce(mpi.IN_PLACE, [memory, mpi_type], mpi_op)
    commit()


def _broadcast_step(world: _World, summary: str, details: str, source: int, *buffers: Buffer) -> None:
    """`buffers`: outputs, then as many inputs, of any dtypes: rank `source`'s inputs travel as one message of
    bytes into every rank's outputs."""
    _agree(world, summary, details)
    outputs, inputs = buffers[: len(buffers) // 2], buffers[len(buffers) // 2 :]
    if len(outputs) == 1:
        memory, commit = _output_bytes(outputs[0])
    else:
        memory = np.empty(sum(output.nbytes for output in outputs), dtype=np.uint8)
        commit = functools.partial(_scatter, memory, outputs)
    if world.rank == source:
        _gather(inputs, memory)
    world.comm.Bcast([memory, world.mpi.BYTE], root=source)
    commit()


def _all_gather_step(world: _World, summary: str, output: Buffer, source: Buffer) -> None:
    _agree(world, summary)
    send, receive = _mpi_memory(world, source), _mpi_memory(world, output)
    if send is not None and receive is not None:
        world.comm.Allgather([send, world.mpi.BYTE], [receive, world.mpi.BYTE])
        return
    memory, commit = _output_bytes(output)
    _gather((source,), memory[world.rank * source.nbytes : (world.rank + 1) * source.nbytes])
    world.comm.Allgather(world.mpi.IN_PLACE, [memory, world.mpi.BYTE])
    commit()


def _collective(step: Callable[..., None], tensors: list[Tensor], shape: tuple[int, ...], dtype: DType) -> Tensor:
    """Realize `tensors` (in one schedule), then run the host step that reads their buffers and writes a new
    buffer of `shape` and `dtype`, which it returns as a tensor (a leaf: collectives are not differentiable)."""
    return _collective_into(step, tensors, [(shape, dtype)])[0]


def _collective_into(
    step: Callable[..., None], tensors: list[Tensor], outputs: list[tuple[tuple[int, ...], DType]]
) -> list[Tensor]:
    """`_collective` with several outputs, of these shapes and dtypes: the step gets them all, then the inputs."""
    sources = [tensor.contiguous() for tensor in tensors]
    Tensor.realize_all(*sources)
    device = tensors[0].device
    buffers = [new_buffer(device, prod(shape), dtype) for shape, dtype in outputs]
    run_host(step, [*buffers, *(source.uop.base for source in sources)], device)
    return [
        Tensor(buffer, device=device, requires_grad=False).reshape(shape)
        for buffer, (shape, _) in zip(buffers, outputs)
    ]


def _describe(tensor: Any) -> str:
    return f"{tensor.dtype.name} {tensor.shape}" if isinstance(tensor, Tensor) else type(tensor).__name__


def _not_a_tensor(what: str, tensor: Any) -> TypeError | None:
    if isinstance(tensor, Tensor):
        return None
    return TypeError(f"distributed.{what}: expected a Tensor, got {type(tensor).__name__}")


def _source(world: _World, what: str, src: Any) -> tuple[int | str, ValueError | None]:
    """`src` as a rank (a NumPy integer too) or, where it is none, its repr and the error that says so."""
    try:
        rank = operator.index(src)
    except TypeError:
        rank = -1
    if 0 <= rank < world.size:
        return rank, None
    return repr(src), ValueError(
        f"distributed.{what}: src={src!r} is not a rank of this job (ranks 0..{world.size - 1})"
    )


def _refuse(world: _World, summary: str, error: Exception) -> NoReturn:
    """Raise a bad argument's `error`, but only after the handshake the call would have made: another rank making
    a different call (the right dtype, a valid op) would otherwise wait for this one until the timeout. Where the
    calls differ, every rank raises DistributedError naming both sides; where they agree, every rank raises `error`."""
    try:
        _agree(world, summary)
    except DistributedError as disagreement:
        raise DistributedError(f"{disagreement} (on this rank: {error})") from error
    raise error


def _reduce(world: _World, tensors: list[Tensor], op: str, summary: str, details: str = "") -> Tensor:
    """The all-reduce of the tensors laid end to end, as one flat tensor. A mean divides lazily, in the kernels
    that read it; floats MPI has no type for (float16) travel as float32."""
    dtype = tensors[0].dtype
    wire = dtype if _mpi_type(world, dtype) is not None else dtypes.float32
    elements = sum(tensor.numel() for tensor in tensors)
    step = functools.partial(_all_reduce_step, world, summary, details, op)
    flat = _collective(step, [tensor.cast(wire) for tensor in tensors], (elements,), wire)
    return (flat / world.size if op == "mean" else flat).cast(dtype)


def _all_reduce_problem(world: _World, tensor: Any, op: Any) -> Exception | None:
    if (error := _not_a_tensor("all_reduce", tensor)) is not None:
        return error
    if op not in REDUCE_OPS:
        return ValueError(f"distributed.all_reduce: op must be one of {', '.join(map(repr, REDUCE_OPS))}, got {op!r}")
    if op == "mean" and not tensor.dtype.is_float:
        return TypeError(
            f"distributed.all_reduce: op='mean' needs a float tensor, got {tensor.dtype}; cast it with .float() or "
            "use op='sum'"
        )
    if op == "sum" and tensor.dtype == dtypes.bool:
        return TypeError(
            "distributed.all_reduce: op='sum' of a bool tensor: cast it to int32 to count, or use op='max' (true on "
            "any rank) or op='min' (true on every rank)"
        )
    if not tensor.dtype.is_float and _mpi_type(world, tensor.dtype) is None:
        return TypeError(f"distributed.all_reduce: MPI has no type for {tensor.dtype}; cast the tensor first")
    return None


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """A new tensor, the same on every rank: the elementwise "sum", "mean", "max" or "min" of `tensor` over all
    ranks. A mean needs floats; a float max or min is NaN where any rank has NaN (as `Tensor.max`); on bools, max
    is "on any rank" and min "on every rank"."""
    world = _require("all_reduce")
    summary = f"all_reduce({_describe(tensor)}, op={op!r})"
    if (error := _all_reduce_problem(world, tensor, op)) is not None:
        _refuse(world, summary, error)
    if op in ("max", "min") and tensor.dtype.is_float:
        # MPI's MAX and MIN compare as C does, so a NaN wins or loses by the rank holding it: each element's
        # isnan travels too (negated for min, so one op reduces both) and makes the result NaN where any rank has one
        nan = tensor.isnan().cast(tensor.dtype)
        flat = _reduce(world, [tensor, nan if op == "max" else -nan], op, summary)
        values, anywhere = flat[: tensor.numel()], flat[tensor.numel() :] != 0
        return anywhere.where(math.nan, values).reshape(tensor.shape)
    return _reduce(world, [tensor], op, summary).reshape(tensor.shape)


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
    """A new tensor holding rank `src`'s `tensor` on every rank."""
    world = _require("broadcast")
    source, bad_source = _source(world, "broadcast", src)
    summary = f"broadcast({_describe(tensor)}, src={source})"
    if (error := _not_a_tensor("broadcast", tensor) or bad_source) is not None:
        _refuse(world, summary, error)
    step = functools.partial(_broadcast_step, world, summary, "", source)
    return _collective(step, [tensor], tensor.shape, tensor.dtype)


def all_gather(tensor: Tensor) -> Tensor:
    """Every rank's `tensor`, stacked: a new tensor of shape (world_size, *tensor.shape), rank r's at index r."""
    world = _require("all_gather")
    summary = f"all_gather({_describe(tensor)})"
    if (error := _not_a_tensor("all_gather", tensor)) is not None:
        _refuse(world, summary, error)
    step = functools.partial(_all_gather_step, world, summary)
    return _collective(step, [tensor], (world.size, *tensor.shape), tensor.dtype)


def barrier() -> None:
    """Wait until every rank reaches this point (a rank missing after the timeout is named, and the job ended).
    Inside TinyJit it is a host step of the capture: every replay waits at the same place."""
    world = _require("barrier")

    def wait() -> None:
        _agree(world, "barrier()")
        world.comm.Barrier()

    run_host(wait, [], Device.DEFAULT)


# ---- data-parallel training ----------------------------------------------------------------------------------


def _buckets(tensors: list[Tensor], bucket_bytes: int, by_dtype: bool = True) -> Iterator[list[int]]:
    """Positions of consecutive tensors of one device (and dtype, for a reduction), about `bucket_bytes` at most
    per group."""
    bucket: list[int] = []
    size = 0
    for position, tensor in enumerate(tensors):
        nbytes = tensor.numel() * tensor.dtype.itemsize
        first = tensors[bucket[0]] if bucket else None
        if first is not None and (
            size + nbytes > bucket_bytes or tensor.device != first.device or (by_dtype and tensor.dtype != first.dtype)
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(position)
        size += nbytes
    if bucket:
        yield bucket


def _describe_bucket(what: str, number: int, tensors: list[Tensor]) -> tuple[str, str]:
    """A bucket's summary for messages (its first shapes) and its details for the handshake (every shape)."""
    shapes = [tensor.shape for tensor in tensors]
    listed = ", ".join(map(str, shapes[:4])) + (f", and {len(shapes) - 4} more" if len(shapes) > 4 else "")
    kinds = "/".join(dict.fromkeys(tensor.dtype.name for tensor in tensors))
    summary = f"{what}(bucket {number}: {len(tensors)} {kinds} tensors of {sum(map(prod, shapes))} elements: {listed})"
    return summary, repr([(tensor.shape, tensor.dtype.name) for tensor in tensors])


def sync_gradients(params: list[Tensor], bucket_bytes: int = BUCKET_BYTES) -> None:
    """Replace each parameter's gradient by its mean over all ranks: call it after `backward()` and before the
    optimizer's step. The gradients are realized in one schedule and travel in flat buckets of about
    `bucket_bytes` (one message each); each new gradient is a view of its bucket's result.

    A parameter with a gradient on some ranks only (a branch taken by some ranks' data) counts as a zero gradient
    on the others, as in PyTorch's DDP with find_unused_parameters=True, so every rank ends with the same
    gradients; a parameter with a gradient on no rank keeps None.

    It is the mean of the ranks' gradients, each as the rank's loss gives it: with a loss that is a mean over the
    rank's examples and uneven local batches, that is not the whole batch's gradient (as in PyTorch's DDP). Give
    every rank equally many examples (`ShardedSampler`), or scale each rank's loss by
    local_count * world_size() / total_count (the total from `all_reduce`) before `backward()`."""
    world = _require("sync_gradients")
    params = [param for param in params if isinstance(param, Tensor)]
    # before any gradient moves, the ranks agree on the parameters and learn which have a gradient on some rank:
    # buckets of different parameters' gradients, whose shapes may match, would be averaged together silently
    local = sum(1 << i for i, param in enumerate(params) if param.grad is not None)
    shapes = repr([(param.shape, param.dtype.name) for param in params])
    anywhere = _agree(world, f"sync_gradients({len(params)} parameters)", shapes, local)
    with_grad = [param for i, param in enumerate(params) if anywhere >> i & 1]
    grads = [
        (param.grad if param.grad is not None else param.zeros_like(requires_grad=False)).contiguous()
        for param in with_grad
    ]
    Tensor.realize_all(*grads)
    for number, bucket in enumerate(_buckets(grads, bucket_bytes)):
        summary, details = _describe_bucket("sync_gradients", number, [grads[i] for i in bucket])
        flat = _reduce(world, [grads[i] for i in bucket], "mean", summary, details)
        offset = 0
        for i in bucket:
            size = grads[i].numel()
            with_grad[i].grad = flat.shrink(((offset, offset + size),)).reshape(with_grad[i].shape)
            offset += size


def broadcast_parameters(params: list[Tensor], src: int = 0, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Overwrite every rank's `params` (and any other tensors in the list, such as running statistics) in place
    with rank `src`'s, one message per bucket of about `bucket_bytes` (of any dtypes)."""
    world = _require("broadcast_parameters")
    tensors = [param for param in params if isinstance(param, Tensor)]
    source, error = _source(world, "broadcast_parameters", src)
    if error is not None:
        _refuse(world, f"broadcast_parameters(src={source})", error)
    Tensor.realize_all(*tensors)
    for number, bucket in enumerate(_buckets(tensors, bucket_bytes, by_dtype=False)):
        members = [tensors[i] for i in bucket]
        summary, details = _describe_bucket("broadcast_parameters", number, members)
        step = functools.partial(_broadcast_step, world, summary, details, source)
        received = _collective_into(step, members, [(tensor.shape, tensor.dtype) for tensor in members])
        if world.rank != source:
            for tensor, value in zip(members, received):
                tensor.assign(value)
    Tensor.realize_all(*tensors)


class DataParallel:
    """A model trained data-parallel. On creation every rank takes rank 0's parameters and buffers; each rank then
    runs the model on its part of the batch and calls `sync_gradients()` after `backward()`, so every rank's
    optimizer applies the same gradient (the mean over the ranks: see `sync_gradients` for uneven batches) and the
    copies stay equal.

    Buffers are the model's tensors marked requires_grad=False, such as BatchNorm's running statistics, which each
    rank's forward updates from its own examples: with `broadcast_buffers` (the default, as in PyTorch's DDP),
    `sync_gradients()` also gives every rank rank 0's, in one message. (A frozen parameter marked so is a buffer
    too: it stays equal anyway; pass broadcast_buffers=False to spare the message where nothing updates them.)

    Its state dict (`nn.state.get_state_dict`) is the model's, with the same keys: a checkpoint of either loads
    into the other."""

    def __init__(self, model: Any, bucket_bytes: int = BUCKET_BYTES, broadcast_buffers: bool = True):
        self.model, self.bucket_bytes, self.broadcast_buffers = model, bucket_bytes, broadcast_buffers
        self.parameters = get_parameters(model)
        self.buffers = [tensor for tensor in self.parameters if tensor.requires_grad is False]
        broadcast_parameters(self.parameters, bucket_bytes=bucket_bytes)

    def __call__(self, *args, **kwargs) -> Any:
        return self.model(*args, **kwargs)

    def _asdict(self) -> dict[Any, Any]:
        """What nn.state walks (as a namedtuple's fields): the model's own members, so the keys are the model's."""
        return dict(_members(self.model))

    def sync_gradients(self) -> None:
        """Average the model's gradients over the ranks (see `sync_gradients`), then give every rank rank 0's
        buffers (with `broadcast_buffers`)."""
        sync_gradients(self.parameters, self.bucket_bytes)
        if self.broadcast_buffers and self.buffers and world_size() > 1:
            broadcast_parameters(self.buffers, bucket_bytes=self.bucket_bytes)


class ShardedSampler:
    """Which examples a rank trains on. Each pass over it is one epoch: one shuffle of `size` examples (the same on
    every rank: drawn from `seed`), cut into global batches of `batch_size`, of which rank r takes the r-th of
    `world_size` equal slices. So the ranks see disjoint parts of every epoch and together the global batches one
    process would see; examples after the last whole global batch are left out of that epoch."""

    def __init__(self, size: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"ShardedSampler: rank {rank} is not one of world_size={world_size} ranks")
        if batch_size < 1 or batch_size % world_size:
            raise ValueError(
                f"ShardedSampler: the global batch of {batch_size} does not split evenly over {world_size} ranks; "
                "pick a batch size that is a multiple of the number of ranks"
            )
        if size < batch_size:
            raise ValueError(f"ShardedSampler: {size} examples do not fill one global batch of {batch_size}")
        self.size, self.batch_size, self.rank, self.world_size = size, batch_size, rank, world_size
        self.generator = np.random.default_rng(seed)

    def __len__(self) -> int:
        """Steps per epoch."""
        return self.size // self.batch_size

    def __iter__(self) -> Iterator[np.ndarray]:
        order = self.generator.permutation(self.size)
        local = self.batch_size // self.world_size
        for step in range(len(self)):
            first = step * self.batch_size + self.rank * local
            yield order[first : first + local]
