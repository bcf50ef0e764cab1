"""Action-list fuzzer: run each kernel of random programs with random optimization actions and compare its outputs with
the kernel run without actions.

The heuristic and BEAM apply only the action lists they choose; any other list a kernel accepts must compute the
same values too (an action that does not fit raises KernelOptError, and is left out). For every seed this builds
extra/fuzz.py's program, then runs its schedule one kernel at a time on the selected device (``PYTHON=1`` checks the
GPU shapes: threads, shared memory, shuffles, wide accesses; ``CUDA=1 MOCKCUDA=1`` and ``GPU=1`` compile them). Each
kernel runs first without actions, then with the heuristic's list, every list BEAM would time and a few random ones,
each on copies of the memory it started from, and every buffer it wrote is compared with the first run's.

    PYTHON=1 python extra/fuzz_opts.py --seeds 200 --lists 6
    GPU=1 python extra/fuzz_opts.py --as-gpu     # PoCL runs the kernels an OpenCL GPU would get
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz import build_program, new_program

from lazygrad import Device, Tensor
from lazygrad.codegen.heuristic import candidate_opts, heuristic_opts
from lazygrad.codegen.lower import lower_kernel
from lazygrad.codegen.opt import KernelOptError, Opt, OptOp, apply_opt, loops_by_axis, prepare
from lazygrad.device import Buffer, LaunchRefused
from lazygrad.engine.buffers import buffer_of
from lazygrad.engine.realize import build_candidate, run_item
from lazygrad.uop.ops import LoopKind

NO_AMOUNT = (OptOp.LOOP, OptOp.MERGE, OptOp.VECTORIZE, OptOp.LANES, OptOp.STASH, OptOp.PACK, OptOp.PIECES)
WITH_AMOUNT = (OptOp.UPCAST, OptOp.UNROLL, OptOp.SPLIT, OptOp.LOCAL, OptOp.GROUP, OptOp.TILE)
IN_REGISTERS = (OptOp.UPCAST, OptOp.UNROLL, OptOp.LANES)  # copies of the body: kept small, as the heuristic keeps them
MOST_COPIES = 16
ATTEMPTS = 12  # random actions tried per list (those that do not fit are skipped)


def random_action(rng: np.random.Generator, kernel, threads: bool) -> Opt:
    """One action on a random loop of `kernel`: an amount that divides the loop (sometimes one that does not, for
    PAD, or a multiple of it, for GROUP), where the action takes one."""
    axis, loop = list(loops_by_axis(kernel).items())[int(rng.integers(len(loops_by_axis(kernel))))]
    size = loop.src[0].arg
    ops = (*WITH_AMOUNT, *NO_AMOUNT, OptOp.PAD) if threads else (*WITH_AMOUNT[:3], *NO_AMOUNT, OptOp.PAD)
    op = ops[int(rng.integers(len(ops)))]
    if op is OptOp.LANES and size > MOST_COPIES:
        op = OptOp.UNROLL
    if op in NO_AMOUNT:
        return Opt(op, axis)
    if op is OptOp.PAD:
        return Opt(op, axis, int(rng.choice([4, 8, 16, 32])))
    most = MOST_COPIES if op in IN_REGISTERS else 256
    divisors = [d for d in range(2, min(size, most) + 1) if size % d == 0] or [2]
    amount = int(rng.choice(divisors))
    if op is OptOp.GROUP and loop.arg[1] is LoopKind.REDUCE and rng.random() < 0.2:
        amount = size * int(rng.choice([2, 4]))  # (more threads than iterations: see opt.threads_across)
    return Opt(op, axis, amount)


def random_lists(rng: np.random.Generator, kernel, target, count: int, failures: list[str]) -> list[tuple[Opt, ...]]:
    """`count` random action lists that apply to `kernel`, each grown one fitting action at a time; an action that
    fails other than by KernelOptError (the clear error of one that does not fit) is added to `failures`."""
    lists = []
    for _ in range(count):
        opts, current, length = [], kernel, int(rng.integers(1, 5))
        for _ in range(ATTEMPTS):
            if len(opts) >= length or not loops_by_axis(current):
                break
            opt = random_action(rng, current, bool(target.max_threads))
            try:
                current = apply_opt(current, opt, target)
            except KernelOptError:
                continue
            except Exception as error:  # noqa: BLE001 -- an unclear error is what this looks for
                failures.append(
                    f"[{' '.join(map(str, (*opts, opt)))}] failed to apply: {type(error).__name__}: {error}"
                )
                break
            opts.append(opt)
        lists.append(tuple(opts))
    return lists


def run_once(device, item, kernel, opts: tuple[Opt, ...], buffers: list[Buffer]) -> None:
    """Build the schedule item's kernel with `opts` and run it once on `buffers`."""
    program, _ = build_candidate(device, item.ast, kernel, opts)
    try:
        program(*(buffer.handle for buffer in buffers))
        getattr(device, "synchronize", lambda: None)()
    finally:  # (a program outside the program cache frees its code itself)
        getattr(program, "release", lambda: None)()


def differences(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The flat positions where `got` differs from `want`: beyond float rounding for floats (a reduce may add in
    another order), at all for other dtypes."""
    if want.dtype.kind != "f":
        return np.flatnonzero(got != want)
    scale = float(np.abs(want[np.isfinite(want)]).max(initial=1.0))
    return np.flatnonzero(~np.isclose(got, want, rtol=1e-3, atol=1e-4 * scale, equal_nan=True))


def check_kernel(item, rng: np.random.Generator, lists: int, verbose: bool = False) -> list[str]:
    """Run one schedule item without actions (on its own buffers, so later kernels read its outputs), then with the
    other lists on copies of the memory it started from; the lists that fail or whose outputs differ, and how."""
    device = Device[item.device]
    target = device.renderer.target
    buffers = [buffer_of(node) for node in item.buffers]
    before = [buffer.numpy().copy() for buffer in buffers]
    kernel = prepare(lower_kernel(item.ast))
    run_once(device, item, kernel, (), buffers)
    expected = [buffer.numpy() for buffer in buffers]
    failures: list[str] = []
    offered = [heuristic_opts(kernel, target), *candidate_opts(kernel, target)]
    offered += random_lists(rng, kernel, target, lists, failures)
    for opts in dict.fromkeys(opts for opts in offered if opts):
        name = " ".join(map(str, opts))
        if verbose:  # (before it runs: a list that corrupts memory may end the process)
            print(f"  kernel {item.ast.key.hex()[:8]} [{name}]", flush=True)
        scratch = [Buffer(b.device, b.size, b.dtype).copyin(data) for b, data in zip(buffers, before)]
        try:
            run_once(device, item, kernel, opts, scratch)
        except LaunchRefused:  # (more registers or shared memory than the device has: BEAM skips it too)
            continue
        except Exception as error:  # noqa: BLE001 -- any other failure is what this looks for
            failures.append(f"[{name}] failed: {type(error).__name__}: {error}")
            continue
        for position, (buffer, want) in enumerate(zip(scratch, expected)):
            got = buffer.numpy()
            if len(wrong := differences(got, want)):
                failures.append(
                    f"[{name}] buffer {position}: {len(wrong)} of {got.size} values differ, first at {wrong[0]}: "
                    f"{got.ravel()[wrong[0]]} instead of {want.ravel()[wrong[0]]}"
                )
                break
    return failures


def data(rng: np.random.Generator, *shape: int, dtype=np.float32) -> Tensor:
    if np.issubdtype(dtype, np.integer):
        return Tensor(rng.integers(-100, 100, shape).astype(dtype))
    return Tensor(rng.standard_normal(shape).astype(dtype))


def pick(rng: np.random.Generator, *choices: int) -> int:
    return int(rng.choice(choices))


def half_product(rng: np.random.Generator) -> Tensor:
    """A float16 product (tensor cores), its second operand read along its rows or its columns."""
    x, columns = data(rng, pick(rng, 16, 32, 48), 64, dtype=np.float16), pick(rng, 16, 32)
    if rng.random() < 0.5:
        return x @ data(rng, columns, 64, dtype=np.float16).T
    return x @ data(rng, 64, columns, dtype=np.float16)


def in_place_update(rng: np.random.Generator) -> Tensor:
    weight = data(rng, pick(rng, 1024, 4096, 1028)).realize()
    return weight.assign(weight - data(rng, weight.shape[0]) * 0.1)


# kernels of the kinds GPU heuristics shape (larger than the random programs' and of other dtypes), one per seed in
# turn: tensor-core products, rows of a softmax or layer norm, sums read in 16-byte vectors, column sums, a
# convolution and its weight gradient, an update in place
GRAPHS = {
    "half product": half_product,
    "softmax rows": lambda rng: data(rng, pick(rng, 4, 16), pick(rng, 128, 256, 200)).softmax(-1),
    "layer norm": lambda rng: data(rng, pick(rng, 8, 12), pick(rng, 96, 128)).layernorm(),
    "integer sum": lambda rng: data(rng, pick(rng, 1024, 4100), dtype=np.int32).sum(),
    "float64 row sums": lambda rng: data(rng, pick(rng, 8, 16), pick(rng, 256, 260), dtype=np.float64).sum(1),
    "column sums": lambda rng: data(rng, pick(rng, 64, 100), pick(rng, 48, 64)).sum(0),
    "convolution": lambda rng: data(rng, 2, 3, 10, 10).conv2d(data(rng, 4, 3, 3, 3), padding=pick(rng, 0, 1)),
    "update in place": in_place_update,
}


def check_schedule(tensor: Tensor, rng: np.random.Generator, lists: int, verbose: bool) -> list[str]:
    """Every kernel that computes `tensor`, in order, checked with the heuristic's, BEAM's and `lists` random lists."""
    failures = []
    for item in tensor.schedule():
        if item.kind != "kernel" or buffer_of(item.buffers[0]).size == 0:
            run_item(item)
            continue
        failures += [
            f"kernel {item.ast.key.hex()[:8]} {failure}" for failure in check_kernel(item, rng, lists, verbose)
        ]
    return failures


def run_seed(seed: int, lists: int, verbose: bool = False) -> list[str]:
    """Fuzz seed `seed`'s random program, and one of GRAPHS in turn, each kernel checked with many action lists."""
    program = new_program(seed)
    output = build_program(program)
    rng = np.random.default_rng(seed)
    name = list(GRAPHS)[seed % len(GRAPHS)]
    failures = check_schedule(output.tensor, rng, lists, verbose)
    failures += [f"{name}: {failure}" for failure in check_schedule(GRAPHS[name](rng), rng, lists, verbose)]
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--lists", type=int, default=6, help="random action lists per kernel")
    parser.add_argument("--verbose", action="store_true", help="print each seed, kernel and list before it runs")
    parser.add_argument(
        "--as-gpu",
        action="store_true",
        help="with GPU=1: render for an OpenCL GPU's target (scalar code, 16-byte accesses, blocks of 256 of at most "
        "1,024 threads, 48 KiB of shared memory, as NVIDIA's driver reports) and run that on this OpenCL device",
    )
    args = parser.parse_args()
    if args.as_gpu:
        from lazygrad.codegen.renderer import Target
        from lazygrad.codegen.renderer.opencl import OpenCLRenderer

        like_gpu = Target(1, max_threads=1024, block_threads=256, shared_memory=48 << 10, cores=132, wide_bytes=16)
        Device["GPU"].renderer = OpenCLRenderer(like_gpu)
    failed, started = 0, time.perf_counter()
    for seed in range(args.start, args.start + args.seeds):
        if args.verbose:
            print(f"seed {seed}", flush=True)
        failures = run_seed(seed, args.lists, args.verbose)
        for failure in failures:
            print(f"FAIL seed {seed}: {failure}", flush=True)
        failed += bool(failures)
    print(f"\n{failed} of {args.seeds} seeds failed ({time.perf_counter() - started:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
