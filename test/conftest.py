"""Every test session starts from an empty disk cache of its own: kept kernels and binaries of an earlier session
(or of another version of the code) never stand in for what a test means to generate and compile."""

import os
import tempfile

if not os.environ.get("LAZYGRAD_CACHE"):  # (xdist's workers inherit the controller's)
    os.environ["LAZYGRAD_CACHE"] = tempfile.mkdtemp(prefix="lazygrad-test-cache-")
