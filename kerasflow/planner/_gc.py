"""The cyclic garbage collector paused while the planner allocates millions of small objects.

Building and running a task graph allocates millions of small tuples and lists but creates no
reference cycles; pausing the collector meanwhile saves its repeated scans of the whole heap.
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused():
    """Disables the cyclic garbage collector inside the block (re-enabled after if it was on).

    Example:
        >>> with collector_paused():
        ...     gc.isenabled()
        False
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
