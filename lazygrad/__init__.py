"""lazygrad: a lazy, graph-compiling tensor framework."""

from lazygrad import nn  # noqa: F401
from lazygrad.device import Device  # noqa: F401
from lazygrad.dtype import dtypes  # noqa: F401
from lazygrad.engine.jit import TinyJit  # noqa: F401
from lazygrad.helpers import Context, GlobalCounters  # noqa: F401
from lazygrad.tensor import Tensor  # noqa: F401
