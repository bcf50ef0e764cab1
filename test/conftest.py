"""Every test session starts from an empty disk cache of its own: kept kernels and binaries of an earlier session
(or of another version of the code) never stand in for what a test means to generate and compile. The process that
made it (with xdist, the controller, whose workers inherit it) removes it when it exits."""

import atexit
import os
import shutil
import tempfile

if not os.environ.get("LAZYGRAD_CACHE"):
    os.environ["LAZYGRAD_CACHE"] = tempfile.mkdtemp(prefix="lazygrad-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LAZYGRAD_CACHE"], ignore_errors=True)
