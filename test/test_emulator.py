"""The PYTHON device runs every thread of a launch in lockstep, and checks each access to the memory a block's
threads share: a missing barrier, which lockstep would hide, is an error naming the kernel."""

import base64
import pickle

import numpy as np
import pytest

from lazygrad.dtype import dtypes
from lazygrad.runtime.ops_python import PythonProgram
from lazygrad.uop.ops import LoopKind, Ops, UOp, toposort

BLOCKS, THREADS = 3, 4


def run(program: list[UOp]) -> np.ndarray:
    """Run a linear program on BLOCKS blocks of THREADS threads, both ways: in lockstep, and one thread at a time
    from barrier to barrier (as the device runs tensor-core programs); each thread's output, from the lockstep run."""
    outputs = []
    for lockstep in (True, False):
        binary = base64.b64encode(pickle.dumps(program))
        kernel = PythonProgram("shifted", binary, (BLOCKS, THREADS))
        kernel.lockstep = lockstep
        out = np.zeros(BLOCKS * THREADS, np.float32)
        kernel(out)
        outputs.append(out)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    return outputs[0]


def shift_through_shared_memory(barrier_after_store: bool, store_again: bool) -> list[UOp]:
    """Each thread stores its number in shared memory and reads its neighbour's; optionally without the barrier
    between, and optionally storing over its own element again after the read (with no barrier before)."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    block = UOp(Ops.SPECIAL, dtypes.index, (), ("block", BLOCKS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, THREADS))
    mine = UOp(Ops.CAST, dtypes.float32, (thread,))
    value = mine + UOp(Ops.CAST, dtypes.float32, (block,)) * 10.0
    stored = UOp(Ops.STORE, src=(shared, thread, value))
    barrier = UOp(Ops.BARRIER, src=(stored,))
    neighbour = (thread + 1).alu(Ops.MOD, UOp.const(dtypes.index, THREADS))
    read = UOp(Ops.LOAD, dtypes.float32, (shared, neighbour, barrier) if barrier_after_store else (shared, neighbour))
    again = [UOp(Ops.STORE, src=(shared, thread, read))] if store_again else []
    result = UOp(Ops.STORE, src=(out, block * THREADS + thread, read))
    # in order: the stores (and barrier), then the read, then what follows; constants are no UOps of the program
    program = toposort([stored, *([barrier] if barrier_after_store else []), read, *again, result])
    program = [node for node in program if node.op is not Ops.CONST]
    return program


def test_threads_exchange_values_through_shared_memory_after_a_barrier():
    expected = [10.0 * block + (thread + 1) % THREADS for block in range(BLOCKS) for thread in range(THREADS)]
    np.testing.assert_array_equal(run(shift_through_shared_memory(True, False)), expected)


def test_a_read_of_another_threads_store_without_a_barrier_is_an_error():
    program = shift_through_shared_memory(False, False)
    kernel = PythonProgram("shifted", base64.b64encode(pickle.dumps(program)), (BLOCKS, THREADS))
    with pytest.raises(RuntimeError, match="shifted: a thread reads shared memory that another thread .* wrote"):
        kernel(np.zeros(BLOCKS * THREADS, np.float32))


def test_a_store_over_what_another_thread_read_without_a_barrier_is_an_error():
    program = shift_through_shared_memory(True, True)
    kernel = PythonProgram("shifted", base64.b64encode(pickle.dumps(program)), (BLOCKS, THREADS))
    with pytest.raises(RuntimeError, match="shifted: a thread writes shared memory that another thread .* read"):
        kernel(np.zeros(BLOCKS * THREADS, np.float32))


def test_a_loop_opened_twice_runs_twice():
    """A loop node may be opened again after it closed (two reduces over one loop, one run before an output loop
    opens, one inside it), and the second body may repeat nodes of the first: each ENDRANGE jumps back to its own
    RANGE."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    block = UOp(Ops.SPECIAL, dtypes.index, (), ("block", BLOCKS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    loop = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 3),), (0, LoopKind.REDUCE))
    value = UOp(Ops.CAST, dtypes.float32, (loop,))
    program = [out, block, thread]
    totals = []
    for number, scale in enumerate((1.0, 2.0)):
        accumulator = UOp(Ops.DEFINE_ACC, dtypes.float32, (), (0.0, number))
        update = UOp(Ops.LOAD, dtypes.float32, (accumulator, loop)) + value * scale
        program += [accumulator, loop, value, value * scale]
        program += [update.src[0], update, UOp(Ops.STORE, src=(accumulator, update)), UOp(Ops.ENDRANGE, src=(loop,))]
        totals.append(UOp(Ops.LOAD, dtypes.float32, (accumulator,)))
    program += [*totals, totals[0] + totals[1]]
    program.append(UOp(Ops.STORE, src=(out, block * THREADS + thread, program[-1])))
    program[-1:-1] = [block * THREADS, block * THREADS + thread]
    np.testing.assert_array_equal(run(program), np.full(BLOCKS * THREADS, 9.0))


def shuffle_program(lane) -> list[UOp]:
    """Each thread reads the value (block * 10 + thread) of its block's thread `lane(thread)` by a shuffle, as
    `__shfl_sync` reads a lane of its warp."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    block = UOp(Ops.SPECIAL, dtypes.index, (), ("block", BLOCKS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    value = UOp(Ops.CAST, dtypes.float32, (thread,)) + UOp(Ops.CAST, dtypes.float32, (block,)) * 10.0
    read = UOp(Ops.SHUFFLE, dtypes.float32, (value, lane(thread)))
    program = toposort([UOp(Ops.STORE, src=(out, block * THREADS + thread, read))])
    return [node for node in program if node.op is not Ops.CONST]


def test_threads_read_each_others_values_by_shuffles():
    partner = shuffle_program(lambda thread: thread.alu(Ops.XOR, UOp.const(dtypes.index, 1)))
    expected = [10.0 * block + (thread ^ 1) for block in range(BLOCKS) for thread in range(THREADS)]
    np.testing.assert_array_equal(run(partner), expected)


def test_a_shuffle_of_a_lane_past_the_block_is_an_error():
    past = shuffle_program(lambda thread: thread + 1)
    for lockstep in (True, False):
        kernel = PythonProgram("shuffled", base64.b64encode(pickle.dumps(past)), (BLOCKS, THREADS))
        kernel.lockstep = lockstep
        with pytest.raises(RuntimeError, match="shuffled: a shuffle reads a lane past the block's 4 threads"):
            kernel(np.zeros(BLOCKS * THREADS, np.float32))


def copy_to_shared_memory(offset: int, barrier: bool) -> list[UOp]:
    """Each thread copies 4 floats (16 bytes, CUDA's cp.async) from `x` at `offset` past its own 4 into shared memory,
    then reads its neighbour's first, after a barrier or not."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 4 * THREADS + 4))
    block = UOp(Ops.SPECIAL, dtypes.index, (), ("block", BLOCKS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 4 * THREADS))
    copy = UOp(Ops.WIDE_COPY, src=(shared, thread * 4, x, thread * 4 + offset), arg=4)
    waited = UOp(Ops.BARRIER, src=(copy,))
    neighbour = (thread + 1).alu(Ops.MOD, UOp.const(dtypes.index, THREADS)) * 4
    read = UOp(Ops.LOAD, dtypes.float32, (shared, neighbour, waited) if barrier else (shared, neighbour))
    result = UOp(Ops.STORE, src=(out, block * THREADS + thread, read))
    program = toposort([copy, *([waited] if barrier else []), read, result])
    return [node for node in program if node.op is not Ops.CONST]


def run_one_thread_at_a_time(program: list[UOp], x: np.ndarray) -> np.ndarray:
    kernel = PythonProgram("copied", base64.b64encode(pickle.dumps(program)), (BLOCKS, THREADS))
    kernel.lockstep = False  # (as the device runs the tensor-core programs, the only ones with copies)
    out = np.zeros(BLOCKS * THREADS, np.float32)
    kernel(out, x)
    return out


def test_a_copy_to_shared_memory_lands_at_the_next_barrier():
    """A thread's copy (WIDE_COPY, CUDA's cp.async) lands at its next barrier, where a CUDA kernel waits for it: read
    after the barrier it holds the values; read before, a copy another thread made is NaN (a GPU may not have landed
    it yet)."""
    x = np.arange(4 * THREADS + 4, dtype=np.float32)
    expected = [4.0 * ((thread + 1) % THREADS) for _ in range(BLOCKS) for thread in range(THREADS)]
    np.testing.assert_array_equal(run_one_thread_at_a_time(copy_to_shared_memory(0, True), x), expected)
    assert np.isnan(run_one_thread_at_a_time(copy_to_shared_memory(0, False), x)).any()


def test_a_copy_at_an_address_a_gpu_cannot_copy_from_is_an_error():
    with pytest.raises(
        RuntimeError, match="copied: a copy of 16 bytes at an address that is not a multiple of its size"
    ):
        run_one_thread_at_a_time(copy_to_shared_memory(2, True), np.zeros(4 * THREADS + 4, np.float32))


@pytest.mark.parametrize("lockstep", [True, False])
def test_an_access_past_either_end_of_a_buffer_is_an_error(lockstep):
    """A GPU reads or writes other memory past a buffer's ends (or faults); NumPy would take element -1 from the end."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    block = UOp(Ops.SPECIAL, dtypes.index, (), ("block", BLOCKS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    for shift, element in ((-1, -1), (1, BLOCKS * THREADS)):
        index = block * THREADS + thread + shift
        program = toposort([UOp(Ops.STORE, src=(out, index, UOp.const(dtypes.float32, 1.0)))])
        program = [node for node in program if node.op is not Ops.CONST]
        kernel = PythonProgram("shifted", base64.b64encode(pickle.dumps(program)), (BLOCKS, THREADS))
        kernel.lockstep = lockstep
        with pytest.raises(RuntimeError, match=f"shifted: an access at element {element} of a buffer of 12 elements"):
            kernel(np.zeros(BLOCKS * THREADS, np.float32))


def four_loads_a_thread(offset: int, store_between: int | None = None, order=(0, 1, 2, 3)) -> list[UOp]:
    """Each thread sums the four floats of `x` from 4 * its number + `offset` on (a float4, where that is aligned)
    into its output, loading them in `order`; optionally storing its first value into `x` at its lane
    `store_between` between its first two loads."""
    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 4 * BLOCKS * THREADS + 4))
    block = UOp(Ops.SPECIAL, dtypes.index, (), ("block", BLOCKS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    mine = block * THREADS + thread
    base = mine * 4
    loads = [UOp(Ops.LOAD, dtypes.float32, (x, base + (offset + lane) if offset + lane else base)) for lane in range(4)]
    total = loads[0] + loads[1] + loads[2] + loads[3]
    stored = UOp(Ops.STORE, src=(x, base + store_between if store_between else base, loads[0]))
    loads = [loads[lane] for lane in order]
    nodes = [loads[0]] if store_between is None else [loads[0], stored]
    program = toposort([*nodes, *loads[1:], UOp(Ops.STORE, src=(out, mine, total))])
    return [node for node in program if node.op is not Ops.CONST]


def test_four_aligned_loads_of_consecutive_floats_are_one_wide_access():
    """`wide_accesses` makes a float4 of four loads whose first element is a multiple of four wherever a thread
    reads it; not of four at an offset of 2 (a vector there would straddle two), nor of loads with a store between
    them into an element a later lane reads (read at the first lane, it would miss the store); a store into an
    element read before it (an update in place) leaves them one; lanes loaded out of order are one where nothing
    writes their memory. The PYTHON device checks each wide access's index as it runs: a misaligned one (here
    marked wide by hand) is an error, as on a GPU."""
    from lazygrad.codegen.vectorize import split_offset, wide_accesses

    aligned = four_loads_a_thread(0)
    (access,) = wide_accesses(aligned, 16)
    assert [node.op for node in access.nodes] == [Ops.LOAD] * 4
    assert wide_accesses(four_loads_a_thread(2), 16) == []
    assert wide_accesses(four_loads_a_thread(0, store_between=1), 16) == []
    assert len(wide_accesses(four_loads_a_thread(0, store_between=0), 16)) == 1
    assert [len(access.nodes) for access in wide_accesses(aligned, 8)] == [2, 2]  # (8 bytes: two float2)
    # lanes loaded out of order (as an integer sum's are linearized) are one access where nothing writes their memory:
    # the vector is read at the lane that comes first
    shuffled = four_loads_a_thread(0, order=(2, 1, 3, 0))
    (access,) = wide_accesses(shuffled, 16)
    assert [split_offset(node.src[1])[1] for node in access.nodes] == [0, 1, 2, 3]  # (in lane order)
    assert access.leader == 2 and access.nodes[2] is min(access.nodes, key=shuffled.index)
    assert wide_accesses(four_loads_a_thread(0, store_between=0, order=(0, 2, 1, 3)), 16) == []
    x = np.arange(4 * BLOCKS * THREADS + 4, dtype=np.float32)
    for offset, order in ((0, (0, 1, 2, 3)), (2, (0, 1, 2, 3)), (0, (2, 1, 3, 0))):
        for lockstep in (True, False):
            binary = base64.b64encode(pickle.dumps(four_loads_a_thread(offset, order=order)))
            kernel = PythonProgram("summed", binary, (BLOCKS, THREADS))
            kernel.lockstep = lockstep
            out = np.zeros(BLOCKS * THREADS, np.float32)
            kernel(out, x.copy())
            np.testing.assert_array_equal(out, x[offset : offset + 4 * BLOCKS * THREADS].reshape(-1, 4).sum(axis=1))
            if offset:
                kernel.wide = {node: 4 for node in kernel.program if node.op is Ops.LOAD}
                with pytest.raises(RuntimeError, match="summed: a wide access of 4 elements at element 2, not a"):
                    kernel(out, x.copy())


def test_a_copy_between_the_lanes_of_a_store_keeps_them_apart():
    """A copy into shared memory (WIDE_COPY) between a store run's lanes that reads the run's memory would read it
    before the stores made at the last lane: the stores stay scalar; a copy of other memory leaves them one."""
    from lazygrad.codegen.vectorize import wide_accesses

    x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, 4 * BLOCKS * THREADS))
    other = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 4 * BLOCKS * THREADS))
    shared = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 4 * THREADS))
    thread = UOp(Ops.SPECIAL, dtypes.index, (), ("thread", THREADS))
    base = thread * 4
    value = UOp.const(dtypes.float32, 1.0)
    stores = [UOp(Ops.STORE, src=(x, base + lane if lane else base, value)) for lane in range(4)]
    for copied, runs in ((x, 0), (other, 1)):
        copy = UOp(Ops.WIDE_COPY, src=(shared, base, copied, base), arg=16)
        program = [
            x,
            other,
            shared,
            thread,
            base,
            *stores[:2],
            copy,
            *(node.src[1] for node in stores[1:]),
            *stores[2:],
        ]
        assert len(wide_accesses(list(dict.fromkeys(program)), 16)) == runs


def test_loads_a_program_holds_twice_are_no_wide_access():
    """A loop opened twice may repeat the nodes of its first body (here in another order): a wide load of them would
    be rendered where its lanes are read before it, so they stay scalar loads, and CUDA renders the program."""
    from lazygrad.codegen.renderer.cstyle import CUDARenderer
    from lazygrad.codegen.vectorize import wide_accesses

    out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, BLOCKS * THREADS))
    x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, 12))
    loop = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, 3),), (0, LoopKind.REDUCE))
    base = loop * 4
    indices = [base, *(base + lane for lane in (1, 2, 3))]
    loads = [UOp(Ops.LOAD, dtypes.float32, (x, index)) for index in indices]
    program, totals = [out, x], []
    for number, order in enumerate(((3, 2, 1, 0), (0, 1, 2, 3))):
        accumulator = UOp(Ops.DEFINE_ACC, dtypes.float32, (), (0.0, number))
        program += [accumulator, loop, base]
        total = None
        for lane in order:
            program += [indices[lane]] if lane else []
            program.append(loads[lane])
            total = loads[lane] if total is None else total + loads[lane]
            program += [total] if total is not loads[lane] else []
        current = UOp(Ops.LOAD, dtypes.float32, (accumulator, loop))
        program += [current, current + total, UOp(Ops.STORE, src=(accumulator, current + total))]
        program += [UOp(Ops.ENDRANGE, src=(loop,))]
        totals.append(UOp(Ops.LOAD, dtypes.float32, (accumulator,)))
    program += [
        *totals,
        totals[0] + totals[1],
        UOp(Ops.STORE, src=(out, UOp.const(dtypes.index, 0), totals[0] + totals[1])),
    ]
    assert wide_accesses(program, 16) == []
    assert "LAZYGRAD_WIDE" not in CUDARenderer().render("twice", program)
