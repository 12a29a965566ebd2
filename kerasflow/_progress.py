"""Progress bars for long work (profiling, planning): tqdm on stderr, only where a person watches."""

from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(total: int, description: str, verbose=True):
    """A tqdm bar on stderr, silent with ``verbose`` off (0, False) and when stderr is not a terminal.

    Example:
        >>> with progress_bar(3, "work", verbose=0) as bar:
        ...     bar.update(1)
    """
    from tqdm import tqdm

    interactive = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    return tqdm(total=total, desc=description, file=sys.stderr, leave=False,
                disable=not interactive or verbose in (0, "0", False))
