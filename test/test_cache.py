"""The disk cache, and the environment variables' errors.

Disk cache: each case damages a cache (truncates, swaps or replaces entries, plants a shared library that would
announce itself if it were ever loaded, makes the directory unwritable, full, shared with the group or another
user's, or keeps a BEAM choice the kernel does not offer) and then runs a small program in a fresh process on that
cache: every run must compute the values NumPy computes, and load nothing it did not verify.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys

import pytest
from support import available

from lazygrad.codegen.opt import Opt
from lazygrad.diskcache import DiskCache, entry_name, pack, unpack
from lazygrad.helpers import DEVICE_ENV_VARS, Context, getenv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# three schedules (so three entries in the device's table, four on GPU): elementwise, a reduce, a matrix product
PROGRAM = """
import numpy as np
from lazygrad import Tensor
from lazygrad.helpers import GlobalCounters

rng = np.random.default_rng(0)
a, b = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
x, y = Tensor(a), Tensor(b)
np.testing.assert_allclose((x * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
np.testing.assert_allclose(x.exp().sum(axis=1).numpy(), np.exp(a).sum(axis=1), rtol=1e-5)
np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-5, atol=1e-5)
print("compiles", GlobalCounters.compile_count)
"""

# a product BEAM has register blocks to choose from
BEAM_PROGRAM = """
import numpy as np
from lazygrad import Tensor

rng = np.random.default_rng(0)
a, b = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((64, 48)).astype(np.float32)
np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
"""

# a shared library that writes a file when it is loaded
PLANTED_LIBRARY = """
#include <stdio.h>
__attribute__((constructor)) static void announce(void) {
  FILE *file = fopen(MARKER, "w");
  if (file) { fputs("loaded", file); fclose(file); }
}
void E_8_16(void) {}
"""

WARNING = "RuntimeWarning: lazygrad:"


def run(cache, device: str, program: str = PROGRAM, prefix: tuple = (), cwd=None, limit_file_size=False, **env):
    """Run `program` in a new Python process on `device` with the disk cache in `cache`; it must succeed."""
    removed = set(DEVICE_ENV_VARS) | {"DEBUG", "BEAM", "CACHELEVEL", "LAZYGRAD_CACHE", "PROGRAM_CACHE"}
    environment = {key: value for key, value in os.environ.items() if key not in removed}
    pythonpath = [ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    environment.update(
        {"PYTHONPATH": os.pathsep.join(pythonpath), "LAZYGRAD_CACHE": str(cache), "DEBUG": "1", device: "1"} | env
    )

    def no_file_writes():  # a full disk: writing any byte of a file fails (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    result = subprocess.run(
        [*prefix, sys.executable, "-c", program],
        env=environment,
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=no_file_writes if limit_file_size else None,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def compiles(result) -> int:
    return int(result.stdout.strip().splitlines()[-1].split()[-1])


def entries(cache, binaries_only: bool = True) -> list[str]:
    """The paths of the compiled binaries' entries (and the generated kernels', unless `binaries_only`)."""
    return sorted(
        os.path.join(cache, table, name)
        for table in os.listdir(cache)
        if table != "beam" and not (binaries_only and table == "kernels")
        for name in os.listdir(os.path.join(cache, table))
    )


def snapshot(cache) -> dict[str, bytes]:
    """Every file under `cache`, by path, with its content."""
    files = {}
    for directory, _, names in os.walk(cache):
        for name in names:
            with open(os.path.join(directory, name), "rb") as file:
                files[os.path.join(directory, name)] = file.read()
    return files


def without_file_permission_override() -> tuple:
    """A command prefix under which root, too, is held to file permissions (the empty prefix for other users)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, and setpriv (util-linux) is not there to drop CAP_DAC_OVERRIDE")
    capabilities = "-dac_override,-dac_read_search,-fowner"
    return ("setpriv", f"--inh-caps={capabilities}", f"--bounding-set={capabilities}")


@pytest.fixture(params=["LLVM", "CPU", "GPU"])
def device(request) -> str:
    return available(request.param)


@pytest.fixture(params=["LLVM", "CPU"])
def host_device(request) -> str:
    """The devices whose kernels run in this process's memory (the directory checks are the same for every device)."""
    return available(request.param)


_filled: dict[str, tuple[str, int]] = {}


def fill(device: str, tmp_path_factory) -> tuple[str, int]:
    """(a copy of a cache that one run of PROGRAM on `device` filled, how many binaries that run compiled)."""
    if device not in _filled:
        template = tmp_path_factory.mktemp(f"filled-{device}") / "cache"
        _filled[device] = (str(template), compiles(run(template, device)))
    template, count = _filled[device]
    copy = tmp_path_factory.mktemp("cache") / "cache"
    shutil.copytree(template, copy)
    return copy, count


@pytest.fixture
def filled(device, tmp_path_factory):
    return fill(device, tmp_path_factory)


@pytest.fixture
def host_filled(host_device, tmp_path_factory):
    return fill(host_device, tmp_path_factory)


def test_a_new_cache_is_private_and_a_second_run_compiles_nothing(device, tmp_path):
    cache = tmp_path / "cache"
    first = run(cache, device)
    assert compiles(first) >= 3 and WARNING not in first.stderr
    for directory, _, names in os.walk(cache):
        assert os.stat(directory).st_mode & 0o777 == 0o700
        for name in names:
            assert os.stat(os.path.join(directory, name)).st_mode & 0o777 == 0o600
    assert len(entries(cache)) == compiles(first)
    assert compiles(run(cache, device)) == 0


def test_a_second_run_generates_no_kernels_and_debug_3_generates_them_again(device, tmp_path):
    cache = tmp_path / "cache"
    run(cache, device)
    assert len(os.listdir(cache / "kernels")) >= 3  # one generated kernel kept per kernel AST
    no_generating = (
        "import lazygrad.engine.realize as realize\n"
        "def refuse(device, ast): raise AssertionError('generated again')\n"
        "realize.generate_kernel = refuse\n"
    )
    assert compiles(run(cache, device, no_generating + PROGRAM)) == 0
    # DEBUG=3 shows how each kernel is optimized: it generates them (the same sources: nothing to compile)
    shown = run(cache, device, PROGRAM, DEBUG="3")
    assert re.search(r"^[ER]_\w+: ", shown.stdout, re.MULTILINE) and compiles(shown) == 0


def test_truncated_entries_are_removed_and_built_again(filled, device):
    cache, count = filled
    for path in entries(cache):
        with open(path, "r+b") as file:
            file.truncate(os.path.getsize(path) // 2)
    result = run(cache, device)
    assert compiles(result) == count
    assert result.stdout.count("disk cache: removed") == count and "bytes where the header says" in result.stdout
    assert compiles(run(cache, device)) == 0  # the entries built again are whole


def test_swapped_entries_are_not_loaded(filled, device):
    cache, count = filled
    first, second = entries(cache)[:2]
    os.rename(first, first + ".moved")
    os.rename(second, first)
    os.rename(first + ".moved", second)
    result = run(cache, device)
    assert compiles(result) == 2 and result.stdout.count("the entry of another key") == 2


def test_a_planted_shared_library_is_never_loaded(filled, device, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the planted library")
    cache, count = filled
    marker, library = tmp_path / "marker", tmp_path / "planted.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-x", "c", "-", "-o", str(library)],
        input=PLANTED_LIBRARY,
        text=True,
        check=True,
    )
    planted = library.read_bytes()
    for number, path in enumerate(entries(cache)):
        with open(path, "rb") as file:
            header = file.readline()
        # the library alone, or behind the header of the entry it replaces
        with open(path, "wb") as file:
            file.write(planted if number % 2 == 0 else header + planted)
    result = run(cache, device)
    assert not marker.exists()
    assert compiles(result) == count and result.stdout.count("disk cache: removed") == count
    assert "not an entry lazygrad wrote" in result.stdout


@pytest.mark.parametrize("unwritable", ["the directory", "its tables"])
def test_an_unwritable_cache_warns_once_and_kernels_still_run(host_filled, host_device, unwritable):
    cache, count = host_filled
    prefix = without_file_permission_override()
    if unwritable == "the directory":
        shutil.rmtree(cache)
        os.mkdir(cache, 0o500)
    else:
        for path in entries(cache, binaries_only=False):
            os.unlink(path)
        for table in os.listdir(cache):
            os.chmod(os.path.join(cache, table), 0o500)
        os.chmod(cache, 0o500)
    result = run(cache, host_device, prefix=prefix)
    assert compiles(result) == count and result.stderr.count(WARNING) == 1
    message = "cannot make the disk cache directory" if unwritable == "the directory" else "cannot write"
    assert message in result.stderr and "Permission denied" in result.stderr
    assert snapshot(cache) == {}


def test_a_full_disk_warns_once_and_leaves_no_partial_files(tmp_path):
    # only LLVM: the other devices' compilers write files themselves, and would fail on a full disk as well
    cache = tmp_path / "cache"
    run(cache, "LLVM", CACHELEVEL="1")
    for path in entries(cache, binaries_only=False):
        os.unlink(path)
    result = run(cache, "LLVM", limit_file_size=True)
    assert compiles(result) >= 3 and result.stderr.count(WARNING) == 1 and "cannot write" in result.stderr
    assert snapshot(cache) == {}


@pytest.mark.parametrize("where", ["the directory", "a table"])
def test_a_cache_others_may_write_to_is_refused(host_filled, host_device, where):
    cache, count = host_filled
    refused = cache if where == "the directory" else os.path.dirname(entries(cache)[0])
    os.chmod(refused, 0o770)
    before = snapshot(refused)
    result = run(cache, host_device)
    assert compiles(result) == count  # nothing was read from it...
    # ...or written to it (the other tables stay in use: a busy machine's host device may split a kernel otherwise
    # than when the cache was filled, and keep that kernel in one)
    assert snapshot(refused) == before
    assert result.stderr.count(WARNING) == 1 and "group or others may write" in result.stderr


def test_a_cache_of_another_user_is_refused(host_filled, host_device):
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")
    cache, count = host_filled
    os.chown(cache, 65534, 65534)
    result = run(cache, host_device)
    assert compiles(result) == count
    assert result.stderr.count(WARNING) == 1 and "belongs to user 65534" in result.stderr


def test_a_beam_choice_the_kernel_does_not_offer_is_ignored(host_device, tmp_path):
    cache = tmp_path / "cache"
    run(cache, host_device, BEAM_PROGRAM, BEAM="2")
    (name,) = os.listdir(cache / "beam")
    path = cache / "beam" / name
    for kept in [b"[-1, 4]", b"not json", b'[["UPCAST", 1, 3]]']:
        path.write_bytes(pack(name, kept))  # a well-formed entry with a bad value
        shutil.rmtree(cache / "kernels")  # (the kernel BEAM chose for, kept as generated: its choice is not read)
        result = run(cache, host_device, BEAM_PROGRAM, BEAM="2")
        assert f"BEAM: ignoring the kept choice {kept.decode()}" in result.stdout
        # searched again: the entry holds a list of actions (which one is fastest may differ from run to run)
        searched = json.loads(unpack(name, path.read_bytes()))
        assert [Opt.from_json(value) for value in searched["opts"]] and searched["timed"] == 2
    # a wider search (a larger BEAM) than the kept choice's times again; a narrower one takes it
    shutil.rmtree(cache / "kernels")
    assert "2 were timed, not 3" in run(cache, host_device, BEAM_PROGRAM, BEAM="3").stdout
    assert json.loads(unpack(name, path.read_bytes()))["timed"] == 3
    shutil.rmtree(cache / "kernels")
    assert "BEAM:" not in run(cache, host_device, BEAM_PROGRAM, BEAM="2").stdout


def test_an_empty_cache_variable_is_the_default_directory_not_the_working_one(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    run("", "LLVM", cwd=work, HOME=str(home))
    assert os.listdir(work) == []
    assert entries(home / ".cache" / "lazygrad")


def test_entries_are_checked_in_process(tmp_path):
    cache = DiskCache(str(tmp_path))
    cache.put("table", "key", b"value")
    assert cache.get("table", "key") == b"value" and cache.get("table", "other key") is None
    path = tmp_path / "table" / entry_name("table", "key")
    assert path.read_bytes().startswith(b"lazygrad-cache-1 ")
    path.write_bytes(path.read_bytes()[:-1] + b"V")  # same length, other content
    assert cache.get("table", "key") is None and not path.exists()
    path.symlink_to(tmp_path / "elsewhere")
    assert cache.get("table", "key") is None and not path.is_symlink()
    with Context(CACHELEVEL=0):
        cache.put("table", "key", b"value")
    assert not path.exists()
    with pytest.raises(ValueError, match="not a plain directory name"):
        cache.get("../escape", "key")
    # a directory in an entry's place (open() of it raised IsADirectoryError in every later run): an empty one is
    # removed, one with files in it left alone; either way the entry is missed, not a crash
    path.mkdir()
    assert cache.get("table", "key") is None and not path.exists()
    path.mkdir()
    (path / "file").write_bytes(b"")
    assert cache.get("table", "key") is None and path.is_dir()
    with pytest.warns(RuntimeWarning, match="kernels are kept in memory only"):  # (it cannot replace the directory)
        cache.put("table", "key", b"value")


# ---- environment variables ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("DEBUG", "abc", "DEBUG='abc' is not an integer: DEBUG takes an integer — 1: schedule summary"),
        ("BEAM", "1.5", "BEAM='1.5' is not an integer: BEAM takes an integer — N > 0 times up to N register blocks"),
        ("GPU", "yes", "GPU='yes' is not an integer: GPU takes an integer — 1 selects the GPU device —"),
    ],
)
def test_a_variable_that_does_not_parse_names_itself_and_what_it_takes(variable, value, message):
    environment = {**os.environ, variable: value, "PYTHONPATH": ROOT}
    result = subprocess.run(
        [sys.executable, "-c", "import lazygrad; lazygrad.Device.DEFAULT"],
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and f"ValueError: environment variable {message}" in result.stderr


def test_an_empty_variable_is_an_unset_one(monkeypatch):
    monkeypatch.setenv("LAZYGRAD_TEST_SETTING", "")
    getenv.cache_clear()
    assert getenv("LAZYGRAD_TEST_SETTING", 7) == 7
    monkeypatch.setenv("LAZYGRAD_TEST_SETTING", "1.5")
    getenv.cache_clear()
    with pytest.raises(ValueError, match="LAZYGRAD_TEST_SETTING='1.5' is not an integer.*default, 7"):
        getenv("LAZYGRAD_TEST_SETTING", 7)
    getenv.cache_clear()
