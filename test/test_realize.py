"""Realization: results replace graphs (no recompute), buffers die with their last user (no leak), assigns write
in place after every reader of the old values, and the compile cache is hit."""

import gc
import weakref

import numpy as np
import pytest
from support import available

from lazygrad import Device, GlobalCounters, Tensor
from lazygrad.engine import buffers, realize
from lazygrad.helpers import Context
from lazygrad.uop.ops import Ops


def test_realized_tensor_points_at_a_buffer():
    a = Tensor([1.0, 2.0, 3.0])
    b = (a * 2 + 1).realize()
    assert buffers.is_buffer_view(b.uop)
    GlobalCounters.reset()
    np.testing.assert_allclose(b.numpy(), [3.0, 5.0, 7.0])
    assert GlobalCounters.kernel_count == 0


def test_other_tensors_with_the_same_graph_reuse_the_result():
    a = Tensor([1.0, 2.0, 3.0])
    first, second = a * 3, a * 3
    first.realize()
    GlobalCounters.reset()
    np.testing.assert_allclose(second.numpy(), [3.0, 6.0, 9.0])
    assert GlobalCounters.kernel_count == 0


def test_buffers_are_freed_with_their_last_user():
    a = Tensor(np.ones(1000, np.float32))
    b = (a + 1).realize()
    # detached: c keeps no gradient history, so nothing of b's survives b
    c = (b * 2).detach().realize()
    memory = [weakref.ref(buffers.buffer_of(buffers.memory_of(t.uop))) for t in (a, b, c)]  # (c: a detached name)
    del b
    gc.collect()
    assert memory[1]() is None
    np.testing.assert_allclose(c.numpy(), np.full(1000, 4.0))
    del a, c
    gc.collect()
    assert all(ref() is None for ref in memory)


def test_realized_tensor_keeps_gradient_history_alive():
    a = Tensor(np.ones(4, np.float32))
    b = (a + 1).realize()
    c = (b * b).realize()
    memory = weakref.ref(buffers.buffer_of(b.uop.base))
    computation = weakref.ref(c._history)
    del b
    gc.collect()
    # c's gradient still flows through b's computation, which c keeps; b's buffer goes with the last reader of b
    # (its value is computed again where the gradient needs it)
    assert memory() is None and computation() is not None
    c.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.full(4, 4.0))
    del c
    gc.collect()
    assert computation() is None


def test_uop_graph_is_freed_with_its_tensors():
    a = Tensor([1.0, 2.0])
    node = (a + 5).uop
    ref = weakref.ref(node)
    del node
    gc.collect()
    assert ref() is None


def test_assign_writes_in_place_after_readers():
    w = Tensor([1.0, 2.0, 3.0])
    buffer = w.uop.base
    old_times_ten = w * 10
    w.assign(w * 2)
    Tensor.realize_all(old_times_ten, w)
    assert w.uop.base is buffer
    np.testing.assert_allclose(old_times_ten.numpy(), [10.0, 20.0, 30.0])
    np.testing.assert_allclose(w.numpy(), [2.0, 4.0, 6.0])


def test_assign_reading_other_indices_is_not_corrupted():
    m = Tensor([[1.0, 2.0], [3.0, 4.0]])
    m.assign(m.T).realize()
    np.testing.assert_allclose(m.numpy(), [[1.0, 3.0], [2.0, 4.0]])
    v = Tensor([1.0, 2.0, 3.0])
    v.assign(v - v.sum()).realize()
    np.testing.assert_allclose(v.numpy(), [-5.0, -4.0, -3.0])
    f = Tensor([1.0, 2.0, 3.0])
    f.assign(f.flip(0)).realize()
    np.testing.assert_allclose(f.numpy(), [3.0, 2.0, 1.0])


def test_assigns_reading_each_others_old_values():
    # each assign reads the other's old buffer: one value is computed apart first, then both writes happen
    v, p = Tensor([1.0]).contiguous().realize(), Tensor([5.0]).contiguous().realize()
    new_v = v * 0.9 + p * 2
    v.assign(new_v)
    p.assign(p - new_v)
    Tensor.realize_all(v, p)
    np.testing.assert_allclose(v.numpy(), [10.9], rtol=1e-6)
    np.testing.assert_allclose(p.numpy(), [-5.9], rtol=1e-6)


def test_same_assign_twice_runs_twice():
    w = Tensor([0.0])
    for _ in range(3):
        w.assign(w + 1).realize()
    np.testing.assert_allclose(w.numpy(), [3.0])


def test_assign_keeps_equal_tensors_apart():
    a = Tensor.zeros(3).realize()
    b = Tensor.zeros(3).realize()
    a.assign(a + 1).realize()
    np.testing.assert_allclose(a.numpy(), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(b.numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_allclose((Tensor.zeros(3) + 5).numpy(), [5.0, 5.0, 5.0])


def test_graphs_after_an_assign_read_new_values():
    w = Tensor([1.0, 2.0])
    doubled = w * 2
    doubled.realize()
    w.assign(w + 10).realize()
    # a graph built now from w reads the new values, not a result remembered from before the assign
    np.testing.assert_allclose((w * 2).numpy(), [22.0, 24.0])


def test_a_value_an_assign_wrote_is_read_before_a_later_assign_overwrites_it():
    """Pending assigns chained on two buffers, one reading the other's intermediate values (batch norm's running
    averages with momentum=None read its batch counter): each read runs before the next write of that buffer (the
    reader of the second count ran after the third was written)."""
    count, average = Tensor([0.0]).contiguous().realize(), Tensor([0.0]).contiguous().realize()
    for value in (1.0, 2.0, 3.0):
        counted = count + 1
        weight = counted.reciprocal()
        average.assign((1 - weight) * average + weight * value)
        count.assign(counted)
    assert average.item() == 2.0 and count.item() == 3.0


def test_a_view_read_once_still_shows_its_buffer():
    """A view (a slice, a transpose of a reshape) stays a view when it is read or realized: reading it again after
    a write shows the new contents, as a torch view does (it became a copy at its first read), and a write pending on
    its buffer runs before it is read. Assigning to one writes through to the viewed tensor, as setitem does."""
    base = Tensor([1.0, 2.0, 3.0, 4.0]).contiguous().realize()
    part, turned = base[1:3], base.reshape(2, 2).T
    assert part.tolist() == [2.0, 3.0] and turned.realize().tolist() == [[1.0, 3.0], [2.0, 4.0]]
    base[1] = 50.0
    assert part.tolist() == [50.0, 3.0] and turned.tolist() == [[1.0, 3.0], [50.0, 4.0]]
    base.assign(base * 2)
    assert part.tolist() == [100.0, 6.0] and turned.tolist() == [[2.0, 6.0], [100.0, 8.0]]
    square = base.reshape(2, 2)
    base.assign(base + 1)
    assert square.tolist() == [[3.0, 101.0], [7.0, 9.0]]
    part.assign(Tensor([9.0, 8.0]))
    assert base.tolist() == [3.0, 9.0, 8.0, 9.0] and turned.tolist() == [[3.0, 8.0], [9.0, 9.0]]
    part[0] = 5.0
    assert base.tolist() == [3.0, 5.0, 8.0, 9.0] and part.tolist() == [5.0, 8.0]


def test_values_built_before_an_assign_keep_their_values():
    # a pending value reading a buffer that a later realize overwrites is computed before the write; a view of the
    # buffer (movement ops only) shows its contents whenever it is read, as a PyTorch view does
    w = Tensor([1.0, 2.0, 3.0]).realize()
    doubled, first_two, copied = w * 2, w[0:2], w.to("CPU") + 0
    w.assign(w + 10).realize()
    np.testing.assert_allclose(doubled.numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_allclose(copied.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(first_two.numpy(), [11.0, 12.0])
    # a value reading both the old contents and the assign sees each as it was built
    w = Tensor([1.0, 2.0, 3.0]).realize()
    doubled = w * 2
    w.assign(w + 10)
    both = doubled + w
    w.realize()
    np.testing.assert_allclose(both.numpy(), [13.0, 16.0, 19.0])
    # the same value realized first: its kernel would read the buffer before and after the write, so the part
    # reading the old contents is computed apart
    w = Tensor([1.0, 2.0, 3.0]).realize()
    doubled = w * 2
    w.assign(w + 10)
    both = doubled + w
    both.realize()
    np.testing.assert_allclose(both.numpy(), [13.0, 16.0, 19.0])
    np.testing.assert_allclose(w.numpy(), [11.0, 12.0, 13.0])


def _regression(seed: int):
    """A small least-squares problem: inputs, targets, first weights, and the weight tensor with SGD (lr 0.1)."""
    from lazygrad.nn.optim import SGD

    rng = np.random.default_rng(seed)
    x, y, w0 = (rng.standard_normal(shape).astype(np.float32) for shape in ((8, 4), (8, 2), (4, 2)))
    w = Tensor(w0, requires_grad=True)
    return x, y, w0, w, SGD([w], lr=0.1)


def test_loss_and_gradients_after_an_optimizer_step_match_torch():
    torch = pytest.importorskip("torch")
    x, y, w0, w, optimizer = _regression(0)
    inputs = Tensor(x)
    loss = ((inputs @ w - Tensor(y)) ** 2).mean()
    loss.backward()
    gradient = w.grad  # held: a value like any other
    optimizer.step()
    tw = torch.tensor(w0, requires_grad=True)
    tl = ((torch.tensor(x) @ tw - torch.tensor(y)) ** 2).mean()
    tl.backward()
    np.testing.assert_allclose(loss.item(), tl.item(), rtol=1e-5)
    np.testing.assert_allclose(gradient.numpy(), tw.grad.numpy(), rtol=1e-5)
    # the gradient left in .grad was released by the step that overwrote what it read; an input's implicit one is
    # dropped, and the next step runs as usual
    with pytest.raises(RuntimeError, match="released.*optimizer step.*zero_grad"):
        _ = w.grad
    assert inputs.grad is None
    optimizer.zero_grad()
    ((inputs @ w - Tensor(y)) ** 2).mean().backward()
    optimizer.step()
    with torch.no_grad():
        tw -= 0.1 * tw.grad
    tw.grad = None
    ((torch.tensor(x) @ tw - torch.tensor(y)) ** 2).mean().backward()
    with torch.no_grad():
        tw -= 0.1 * tw.grad
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5)


def test_a_loss_read_before_the_step_computes_its_gradients_with_it():
    # `loss.item()` between backward() and opt.step() (a PyTorch habit) computes the pending gradients in the same
    # schedule: apart, they would recompute the forward values that the loss's own kernels kept no buffer for
    torch = pytest.importorskip("torch")
    from lazygrad.engine.buffers import is_buffer_view

    x, y, w0, w, optimizer = _regression(1)
    loss = ((Tensor(x) @ w - Tensor(y)).relu() ** 2).mean()
    loss.backward()
    value = loss.item()
    assert is_buffer_view(w.grad.uop)
    optimizer.step()
    tw = torch.tensor(w0, requires_grad=True)
    tl = ((torch.tensor(x) @ tw - torch.tensor(y)).relu() ** 2).mean()
    tl.backward()
    np.testing.assert_allclose(value, tl.item(), rtol=1e-5)
    # still the step's gradient, as in torch
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.numpy(), (tw - 0.1 * tw.grad).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_compile_cache_is_hit():
    a = Tensor(np.arange(8, dtype=np.float32))
    (a * 7 - 1).realize()
    GlobalCounters.reset()
    b = Tensor(np.arange(8, dtype=np.float32) + 1)
    np.testing.assert_allclose((b * 7 - 1).numpy(), (np.arange(8) + 1) * 7 - 1)
    assert GlobalCounters.compile_count == 0
    assert GlobalCounters.compile_cache_hits >= 1


def test_kernel_generation_is_counted_and_timed():
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    GlobalCounters.reset()
    with Context(CACHELEVEL=0):  # no generated kernel from an earlier process: these two are generated here
        np.testing.assert_allclose(
            (a * 3.25 + 0.5).sum(axis=1).numpy(), (np.arange(12).reshape(3, 4) * 3.25 + 0.5).sum(1)
        )
        np.testing.assert_allclose((a - 1.75).exp2().numpy(), np.exp2(np.arange(12).reshape(3, 4) - 1.75), rtol=1e-6)
    assert GlobalCounters.generate_count == 2
    assert 0 < GlobalCounters.generate_max_s <= GlobalCounters.generate_time_s
    GlobalCounters.reset()
    assert GlobalCounters.generate_count == 0 and GlobalCounters.generate_time_s == GlobalCounters.generate_max_s == 0


def test_the_collector_waits_until_a_schedules_kernels_are_generated(monkeypatch):
    # generating drops millions of acyclic objects: a collection between two kernels would scan every live graph
    # (a full one takes ~0.1 s beside a ResNet18 step's graphs) for garbage that is mostly not there
    events = []
    generate = realize.generate_kernel

    def generate_and_note(device, ast):
        events.append(("generate", gc.isenabled()))
        return generate(device, ast)

    def note_collection(phase, info):
        if phase == "start":
            events.append(("collect", info["generation"]))

    monkeypatch.setattr(realize, "generate_kernel", generate_and_note)
    gc.callbacks.append(note_collection)
    try:
        a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        with Context(CACHELEVEL=0):
            total, largest, scaled = (a * 3.2517).sum(axis=1), (a * 0.8125).max(axis=0), (a - 1.7519).exp2()
            gc.set_threshold(1)  # a collection at every chance it gets
            try:
                Tensor.realize_all(total, largest, scaled)
            finally:
                gc.set_threshold(*THRESHOLDS)
    finally:
        gc.callbacks.remove(note_collection)
    generated = [number for number, event in enumerate(events) if event[0] == "generate"]
    assert len(generated) >= 3 and all(events[number][1] is False for number in generated)
    assert all(event[0] == "generate" for event in events[generated[0] : generated[-1] + 1])
    np.testing.assert_allclose(total.numpy(), (np.arange(12).reshape(3, 4) * 3.2517).sum(1), rtol=1e-6)


THRESHOLDS = gc.get_threshold()


def test_the_collector_is_paused_while_a_step_builds_or_frees_its_graph(monkeypatch):
    # a step's graph is acyclic: the collector finds nothing in it, but, triggered by its size, scans it, and once
    # it has outlived a few collections, every object of the process (~0.1 s beside torch, every few steps)
    import lazygrad.tensor
    from lazygrad.nn.optim import SGD

    x, y, w0, w, optimizer = _regression(1)
    loss = ((Tensor(x) @ w - Tensor(y)) ** 2).mean()
    enabled: dict[str, bool] = {}

    def noting(name, function):
        def noted(*args, **kwargs):
            enabled[name] = gc.isenabled()
            return function(*args, **kwargs)

        return noted

    # (`tensors_holding` finds the tensors a realize switches to their buffers)
    patched = [
        (lazygrad.tensor, "compute_gradients"),
        (SGD, "_updates"),
        (lazygrad.tensor, "run_schedule"),
        (lazygrad.tensor, "tensors_holding"),
    ]
    for module, name in patched:
        monkeypatch.setattr(module, name, noting(name, getattr(module, name)))
    loss.backward()
    Tensor.realize_all(loss, *optimizer.schedule_step())
    assert enabled == dict.fromkeys(["compute_gradients", "_updates", "run_schedule", "tensors_holding"], False)
    assert gc.isenabled()
    gradient = 2 * x.T @ (x @ w0 - y) / y.size
    np.testing.assert_allclose(loss.item(), ((x @ w0 - y) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), w0 - 0.1 * gradient, rtol=1e-5, atol=1e-6)


def test_a_realize_leaves_a_collector_the_user_turned_off_off():
    gc.disable()
    try:
        np.testing.assert_allclose((Tensor([1.5]) + 1).numpy(), [2.5])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_constants_realized_on_one_device_stay_there():
    # a broadcast constant has no buffer and so no device: realizing it on one device must not hand that buffer to
    # the same constant used on another
    on_python = Tensor.zeros(4, device="PYTHON").realize()
    on_llvm = Tensor.zeros(4, device="LLVM")
    result = Tensor(np.ones(4, np.float32), device="LLVM") + on_llvm
    np.testing.assert_allclose(result.numpy(), np.ones(4))
    assert on_python.uop.base.arg[2] == "PYTHON" and result.uop.base.arg[2] == "LLVM"


@pytest.mark.parametrize("device", ["LLVM", "CPU"])
def test_kernels_of_one_schedule_compiled_together_keep_apart(device):
    # a schedule's new kernels are compiled in batches (one LLVM module, one C translation unit): kernels that would
    # share a name get numbered, and each launch runs its own code
    a = Tensor(np.arange(8, dtype=np.float32), device=available(device)).realize()
    results = [a + 1.5, a * 2.5, a - 3.5, (a * a).sum(), a.max(), a + 4.5, a * 5.5, a - 6.5, a / 7.5, a + 8.5]
    GlobalCounters.reset()
    Tensor.realize_all(*results)
    assert GlobalCounters.kernel_count == len(results) and GlobalCounters.compile_count < len(results)
    x = np.arange(8, dtype=np.float32)
    expected = [x + 1.5, x * 2.5, x - 3.5, (x * x).sum(), x.max(), x + 4.5, x * 5.5, x - 6.5, x / 7.5, x + 8.5]
    for result, value in zip(results, expected):
        np.testing.assert_allclose(result.numpy(), value, rtol=1e-6)


def test_memory_of_dead_buffers_is_reused_up_to_a_limit():
    from lazygrad.device import Buffer, MemoryPool, memory_pool
    from lazygrad.dtype import dtypes

    first = Buffer("LLVM", 1000, dtypes.float32).copyin(np.ones(1000, np.float32))
    address = first.handle.address
    del first
    second = Buffer("LLVM", 1000, dtypes.float32)
    assert second.handle.address == address  # the same memory, handed out again
    second.copyin(np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(second.numpy(), np.arange(1000, dtype=np.float32))
    # a pool at its limit gives memory back instead of keeping it
    pool = MemoryPool(limit=4000)
    pool.give_back("LLVM", 4000, pool.take("LLVM", 4000))
    pool.give_back("LLVM", 4000, pool.take("LLVM", 4000))
    pool.give_back("LLVM", 8, pool.take("LLVM", 8))
    assert pool.held == 4000 and len(pool.free_memory[("LLVM", 4000)]) == 1
    assert ("LLVM", 8) not in pool.free_memory
    pool.clear()
    assert pool.held == 0 and memory_pool.held <= memory_pool.limit


def test_empty_cache_gives_back_what_the_pool_keeps():
    from lazygrad.device import memory_pool

    sizes = [1000 * k for k in range(1, 11)]
    for size in sizes:  # dead buffers of sizes no later buffer asks for: kept (by the pool, or CUDA's allocator)
        Tensor.ones(size).contiguous().realize()
    gc.collect()
    assert Device.empty_cache() >= 4 * sum(sizes)
    assert memory_pool.held == 0 and not any(memory_pool.free_memory.values())
    stats = getattr(Device[Device.DEFAULT].allocator, "stats", None)
    assert stats is None or stats()["cached_bytes"] == 0
    np.testing.assert_array_equal((Tensor.ones(1005).contiguous() * 2).numpy(), np.full(1005, 2.0))


def test_graph_with_a_nan_constant_compiles_once():
    steps = Tensor([1.0, 2.0]).realize()
    for _ in range(3):
        GlobalCounters.reset()
        np.testing.assert_allclose((0.9**steps).numpy(), [0.9, 0.81], rtol=1e-6)  # pow's NaN for negative bases
    assert GlobalCounters.compile_count == 0 and GlobalCounters.compile_cache_hits > 0


def test_memory_in_use_and_its_peak_are_counted():
    gc.collect()
    before = GlobalCounters.memory_used
    GlobalCounters.reset()
    x = Tensor.ones(1000).contiguous().realize()
    y = (x * 2).realize()
    assert GlobalCounters.memory_used == before + 8000
    del x, y
    gc.collect()
    assert GlobalCounters.memory_used == before and GlobalCounters.memory_peak >= before + 8000


def test_beam_search_times_action_lists_and_keeps_the_choice(tmp_path, monkeypatch):

    from test_program_cache import loaded_code

    from lazygrad import diskcache
    from lazygrad.codegen.heuristic import candidate_opts
    from lazygrad.codegen.lower import lower_kernel
    from lazygrad.codegen.opt import prepare
    from lazygrad.engine import realize, search
    from lazygrad.helpers import BEAM

    monkeypatch.setattr(search, "disk_cache", diskcache.DiskCache(str(tmp_path)))
    monkeypatch.setattr(BEAM, "value", 3)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((48, 96), dtype=np.float32), rng.standard_normal((96, 80), dtype=np.float32)
    product = Tensor(a) @ Tensor(b)
    (item,) = product.schedule()
    np.testing.assert_allclose(product.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert len(list((tmp_path / "beam").iterdir())) == 1
    device = Device[item.device]
    kept = search.disk_cache.get("beam", search.beam_key(device, item.ast))
    choice, timed = search.decode_choice(kept)
    assert timed == 3
    kernel, target = prepare(lower_kernel(item.ast)), device.renderer.target
    assert choice in candidate_opts(kernel, target)[:3]

    # a later search for the same kernel reads the choice instead of timing again
    def no_timing(opts):
        raise AssertionError("timed again")

    assert search.beam_opts(device, item.ast, kernel, no_timing) == choice

    # on another CPU model (another compiler identity) the kept choice is not taken: the search times again
    monkeypatch.setattr(device.compiler, "cache_name", device.compiler.cache_name + "-another-cpu")
    timed = []

    def build_and_count(opts):
        timed.append(opts)
        return realize.build_candidate(device, item.ast, kernel, opts)

    loaded = loaded_code(item.device)
    assert search.beam_opts(device, item.ast, kernel, build_and_count) in candidate_opts(kernel, target)[:3]
    assert len(timed) == 3
    # the candidates' code is given back once timed: a search leaves no more code loaded than before it
    assert loaded_code(item.device) == loaded


def test_beam_search_passes_over_a_candidate_the_device_cannot_run(tmp_path, monkeypatch, capfd):
    """A candidate whose blocks the device refuses (LaunchRefused: registers) takes forever; the search chooses
    among the others, and fails only where it can run none."""
    from lazygrad import diskcache
    from lazygrad.codegen.heuristic import candidate_opts
    from lazygrad.codegen.lower import lower_kernel
    from lazygrad.codegen.opt import prepare
    from lazygrad.device import LaunchRefused
    from lazygrad.engine import realize, search
    from lazygrad.helpers import BEAM, Context

    monkeypatch.setattr(search, "disk_cache", diskcache.DiskCache(str(tmp_path)))
    monkeypatch.setattr(BEAM, "value", 3)
    a, b = np.ones((48, 96), np.float32), np.ones((96, 80), np.float32)
    (item,) = (Tensor(a) @ Tensor(b)).schedule()
    device = Device[item.device]
    kernel = prepare(lower_kernel(item.ast))
    candidates = candidate_opts(kernel, device.renderer.target)[:3]

    def refusing(refused):
        def build(opts):
            if opts in refused:
                raise LaunchRefused(f"refused {len(refused)}")
            return realize.build_candidate(device, item.ast, kernel, opts)

        return build

    with Context(DEBUG=1):
        assert search.beam_opts(device, item.ast, kernel, refusing(candidates[:1])) in candidates[1:]
    assert "cannot run: refused 1" in capfd.readouterr().out
    monkeypatch.setattr(search, "disk_cache", diskcache.DiskCache(str(tmp_path / "again")))  # (not the kept choice)
    with pytest.raises(LaunchRefused, match="BEAM: the device runs none of the 3 candidates of kernel"):
        search.beam_opts(device, item.ast, kernel, refusing(candidates))


def test_beam_search_times_block_sizes_on_a_device_with_threads(tmp_path, monkeypatch):

    from lazygrad import diskcache
    from lazygrad.codegen.heuristic import candidate_opts
    from lazygrad.codegen.lower import lower_kernel
    from lazygrad.codegen.opt import Opt, OptOp, prepare
    from lazygrad.engine import realize, search
    from lazygrad.helpers import BEAM

    # an empty disk cache: a kernel kept by an earlier run would be taken without a search
    monkeypatch.setattr(search, "disk_cache", diskcache.DiskCache(str(tmp_path)))
    monkeypatch.setattr(realize, "disk_cache", search.disk_cache)
    monkeypatch.setattr(BEAM, "value", 3)
    data = np.random.default_rng(1).standard_normal((4, 64), dtype=np.float32)
    doubled = Tensor(data, device="PYTHON") * 2
    (item,) = doubled.schedule()
    np.testing.assert_array_equal(doubled.numpy(), data * 2)
    kept = search.disk_cache.get("beam", search.beam_key(Device["PYTHON"], item.ast))
    choice, _ = search.decode_choice(kept)
    offered = candidate_opts(prepare(lower_kernel(item.ast)), Device["PYTHON"].renderer.target)
    assert choice in offered[:3] and len(offered) == 3  # blocks of 8 (the default), 32 and 64 threads
    assert [opts[-1] for opts in offered] == [Opt(OptOp.LOCAL, 0, 8), Opt(OptOp.LOCAL, 0, 32), Opt(OptOp.LOCAL, 0, 64)]


def test_a_kernel_that_fails_to_generate_leaves_no_kernel_waiting(monkeypatch):
    from lazygrad.engine import realize

    real = realize.generate_kernel
    calls = []

    def fail_on_second(device, ast):
        calls.append(ast)
        if len(calls) == 2:
            raise RuntimeError("codegen failed")
        return real(device, ast)

    a = Tensor(np.arange(5, dtype=np.float32)).realize()
    results = [a * 3.25, a.sum() + 7.5]
    monkeypatch.setattr(realize, "generate_kernel", fail_on_second)
    with pytest.raises(RuntimeError, match="codegen failed"):
        Tensor.realize_all(*results)
    monkeypatch.setattr(realize, "generate_kernel", real)
    # both kernels are built afresh: the first was forgotten with the failure, not left pending
    np.testing.assert_allclose(results[0].numpy(), np.arange(5) * 3.25)
    np.testing.assert_allclose(results[1].numpy(), 10 + 7.5)


def test_a_program_reused_on_other_buffers_reads_them():
    # a program keeps the array of its last call's buffer addresses: a call on other buffers must not reuse it
    sources = [Tensor([float(n), float(n) + 1]).realize() for n in (1, 10, 100, 1000)]
    kernels = GlobalCounters.kernel_count
    results = [(source + 1).realize() for source in sources]  # all kept: each in a buffer of its own
    assert GlobalCounters.kernel_count - kernels == 4
    assert [r.tolist() for r in results] == [[2.0, 3.0], [11.0, 12.0], [101.0, 102.0], [1001.0, 1002.0]]


def test_repeated_small_graphs_each_run_with_their_own_constant():
    # leaves keep their part of the schedule's structure key: constants that compare equal in Python stay apart
    t = Tensor([1.0]).realize()
    for _ in range(3):
        assert (t * 0.0 + 1).reciprocal().item() == 1.0 and (t * -0.0).reciprocal().item() == float("-inf")
        assert (t + 1).item() == 2.0 and (t + True).item() == 2.0 and (t + 2).item() == 3.0


def test_a_kept_kernel_whose_name_another_kernel_has_is_generated_again(tmp_path, monkeypatch):
    # kernels share one symbol table per device: a kernel kept by another process under a name that a different
    # kernel of this process has already must not be loaded under it
    from lazygrad import diskcache
    from lazygrad.engine import realize

    monkeypatch.setattr(realize, "disk_cache", diskcache.DiskCache(str(tmp_path)))
    a = Tensor(np.arange(7, dtype=np.float32)).realize()
    device = Device[Device.DEFAULT]
    (other,) = (a * 2.625).schedule()
    taken = realize.generate_kernel(device, other.ast).name
    result = a * 3.125 + 1.75
    (item,) = result.schedule()
    impostor = realize.GeneratedKernel(taken, "not this kernel's source", 1, 1, 1, (1, 1))
    realize.keep_kernel(device, item.ast, impostor)
    assert realize.kept_kernel(device, item.ast) is None
    np.testing.assert_allclose(result.numpy(), np.arange(7) * 3.125 + 1.75)
    # what was generated instead is kept, under the kernel's own name, and found again
    kept = realize.kept_kernel(device, item.ast)
    assert kept is not None and kept.name != taken
    # (the PYTHON device's source is its pickled program, which holds no kernel name)
    assert kept.name in kept.source or Device.DEFAULT == "PYTHON"


def test_a_repeated_graph_runs_its_plan_again_under_the_settings_of_the_time():
    a = Tensor(np.arange(6, dtype=np.float32))
    (a * 3 + 1).realize()
    for _ in range(3):  # these run the kernels prepared for the graph's plan
        GlobalCounters.reset()
        np.testing.assert_allclose((a * 3 + 1).numpy(), np.arange(6) * 3 + 1)
        assert GlobalCounters.kernel_count == 1 and GlobalCounters.compile_cache_hits == 1
    (item,) = (a * 3 + 1).schedule()
    with Context(NOOPT=1):  # a setting that changes the program: the plan's kernels are looked up again
        np.testing.assert_allclose((a * 3 + 1).numpy(), np.arange(6) * 3 + 1)
    assert (item.device, item.ast, True, *realize.program_settings()[1:]) in realize._programs
    np.testing.assert_allclose((a * 3 + 1).numpy(), np.arange(6) * 3 + 1)


def test_results_remembered_for_later_graphs_are_forgotten_with_their_graph():
    a = Tensor([1.0, 2.0])
    b = (a + 1).realize()
    computation = weakref.ref(b._history)
    assert computation() in dict(buffers.realized.items())
    del b
    gc.collect()
    assert computation() is None
    assert all(node.op is not Ops.ADD or a.uop not in node.src for node, _ in buffers.realized.items())


def test_a_long_lived_node_keeps_no_entries_for_its_dead_tensors():
    node = Tensor.full((3,), 2.0).uop  # (a cached constant: it outlives the tensors built on it)
    for _ in range(1000):
        Tensor(node)
    assert len(node.__dict__["tensors"]) < 16


def test_listing_a_schedule_forgets_nothing_running_it_forgets():
    w = Tensor([1.0, 2.0, 3.0]).realize()
    total = w.sum().realize()
    computation = total._history  # the sum, remembered as held in total's buffer
    update = w.assign(w * 2)
    update.schedule()  # what would run: the assign overwrites w, but has not yet
    assert buffers.realized_view(computation) is total.uop
    update.realize()  # now w holds new values: the sum computed from the old ones is no longer w's sum
    assert buffers.realized_view(computation) is None
    np.testing.assert_allclose([total.item(), w.sum().item()], [6.0, 12.0])


def test_a_second_optimizer_steps_after_the_first():
    """torch's param groups as two optimizers (decay for the weights, none for the biases): the first step overwrote
    the weights that the bias's gradient reads, and that gradient was released, so the second step raised. A
    gradient this step does not read is computed before the write instead, as torch's backward computed it."""
    torch = pytest.importorskip("torch")
    from lazygrad.nn.optim import AdamW

    w = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = Tensor([0.5, -0.5], requires_grad=True)
    decayed, plain = AdamW([w], lr=0.1, weight_decay=0.1), AdamW([b], lr=0.1, weight_decay=0.0)
    tw, tb = torch.tensor(w.numpy(), requires_grad=True), torch.tensor(b.numpy(), requires_grad=True)
    torch_opt = torch.optim.AdamW(
        [{"params": [tw], "weight_decay": 0.1}, {"params": [tb], "weight_decay": 0.0}], lr=0.1
    )
    for step in range(3):
        x = np.array([[1.0, -1.0 - step]], np.float32)
        ((Tensor(x) @ w + b) ** 2).sum().backward()
        decayed.step()
        plain.step()
        decayed.zero_grad()
        plain.zero_grad()
        torch_opt.zero_grad()
        ((torch.tensor(x) @ tw + tb) ** 2).sum().backward()
        torch_opt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5)


def _python_lines(function) -> int:
    """The lines of Python `function()` runs (a count of work that, unlike a time, is the same on every run, and
    that grows with a loop as with a call)."""
    import sys

    count = 0

    def trace(frame, event, arg):
        nonlocal count
        count += 1
        return trace

    sys.settrace(trace)
    try:
        function()
    finally:
        sys.settrace(None)
    return count


def _fewest_lines(function, times: int = 5) -> int:
    # (the fewest of several: an occasional pruning of the registry of live tensors walks them all, amortized)
    return min(_python_lines(function) for _ in range(times))


def test_realizing_the_same_value_again_costs_the_same_however_many_tensors_hold_it():
    # equal computations realized while an earlier result lives share its buffer: every tensor holding it once asked
    # whether any other did, so each realize walked all of them (n realizes took n^2 steps)
    t = Tensor(np.ones(4, np.float32)).realize()
    kept = [(t + 1).realize() for _ in range(10)]
    few = _fewest_lines(lambda: kept.append((t + 1).realize()))
    kept += [(t + 1).realize() for _ in range(400)]
    assert _fewest_lines(lambda: kept.append((t + 1).realize())) < 1.05 * few
    np.testing.assert_array_equal(kept[-1].numpy(), [2, 2, 2, 2])
    kept[-1].assign(Tensor(np.zeros(4, np.float32))).realize()  # (the shared buffer is copied first, as before)
    np.testing.assert_array_equal(kept[0].numpy(), [2, 2, 2, 2])
    np.testing.assert_array_equal(kept[-1].numpy(), [0, 0, 0, 0])


def test_a_training_step_costs_the_same_however_many_losses_a_program_keeps():
    # `losses.append(loss)`: an optimizer step looked through every live tensor for values its write must keep, so a
    # program keeping its losses slowed down step by step
    from lazygrad import nn
    from lazygrad.nn.optim import SGD

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, 4)).astype(np.float32))
    y = Tensor(rng.standard_normal((8, 1)).astype(np.float32))
    model = nn.Linear(4, 1)
    optimizer = SGD([model.weight, model.bias], lr=0.01)
    losses = []

    def step():
        with Tensor.train():
            optimizer.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append((loss, loss.item()))

    for _ in range(10):
        step()
    few = _fewest_lines(step)
    for _ in range(300):
        step()
    assert _fewest_lines(step) < 1.05 * few  # (a few lines differ: what pruning and id reuse find)
    # each kept loss still holds the value it had at its step
    assert all(loss.item() == value for loss, value in losses)
    assert losses[-1][1] < losses[0][1]


def test_a_training_step_costs_the_same_however_many_computed_values_a_program_keeps():
    # a dataset normalized by tensor ops and kept: each value has a history (gradients could flow through it), and
    # every optimizer step looked through all of them for those its write changes, and every backward for those in
    # its graph
    from lazygrad import nn
    from lazygrad.nn.optim import Adam

    rng = np.random.default_rng(0)
    model = nn.Linear(4, 1)
    optimizer = Adam([model.weight, model.bias], lr=0.01)
    mean, std = Tensor(rng.standard_normal(4).astype(np.float32)), Tensor(np.full(4, 2.0, np.float32))
    data = [rng.standard_normal((8, 4)).astype(np.float32) for _ in range(300)]
    kept = []

    def step():
        x = Tensor(data[len(kept) % len(data)])
        with Tensor.train():
            optimizer.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            optimizer.step()
            loss.item()

    for _ in range(5):
        step()
    # (measured first with a few kept: keeping any costs a step about a thousand lines more, whatever their number,
    # which next to a ~27,000-line step left the 5% margin to the state earlier tests left in the process)
    kept += [((Tensor(array) - mean) / std).realize() for array in data[:30]]
    few = _fewest_lines(step)
    kept += [((Tensor(array) - mean) / std).realize() for array in data[30:]]
    assert _fewest_lines(step) < 1.05 * few  # (a few lines differ: what pruning and id reuse find)
    # the kept values are still right, and gradients still flow through one into its input
    np.testing.assert_allclose(kept[3].numpy(), (data[3] - mean.numpy()) / 2.0, rtol=1e-6)
    source = Tensor(data[0], requires_grad=True)
    normalized = ((source - mean) / std).realize()
    for _ in range(3):
        step()
    normalized.sum().backward()
    np.testing.assert_allclose(source.grad.numpy(), np.full((8, 4), 0.5, np.float32))


def test_a_write_with_a_gradient_costs_the_same_however_many_computed_values_a_program_keeps():
    # `out[t] = h` keeps the gradient flowing into the written rows: it looked through every value with a history for
    # the other names of the written memory
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    out = Tensor(np.zeros((4, 4), np.float32))
    h = Tensor(np.ones(4, np.float32))

    def write(row):
        out[row] = (w @ h).tanh()

    def writes():
        return min(_python_lines(lambda: write(row)) for row in range(4))

    few = writes()
    # (a write does much besides: 2,000 values, a few lines each, are what a 5% margin tells apart)
    kept = [(Tensor(rng.standard_normal(4).astype(np.float32)) * 2).realize() for _ in range(2000)]
    assert writes() < 1.05 * few
    out.sum().backward()
    # each of the 4 rows holds tanh(w @ h) from its last write, so d(sum)/dw = 4 (1 - tanh^2(w @ h)) h^T
    product = w.numpy().astype(np.float64) @ np.ones(4)
    expected = 4 * np.outer(1 - np.tanh(product) ** 2, np.ones(4))
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-4, atol=1e-6)
    assert len(kept) == 2000
