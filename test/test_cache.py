"""Environment variables: a value that does not parse is an error naming the variable and what it takes; an empty
variable is an unset one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lazygrad.helpers import getenv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
