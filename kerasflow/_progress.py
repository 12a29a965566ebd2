"""Progress bars for long work (profiling, planning): tqdm on stderr, only where a person watches."""

from __future__ import annotations

import sys

__all__ = ["progress_bar"]


class _Silent:
    """The bar where nobody watches. Not a disabled tqdm: making any tqdm starts tqdm's monitor
    thread, which a disabled bar never stops, so each fit that planned left a thread running."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(total: int, description: str, verbose=True):
    """A tqdm bar on stderr, silent with ``verbose`` off (0, False) and when stderr is not a terminal.

    Example:
        >>> with progress_bar(3, "work", verbose=0) as bar:
        ...     bar.update(1)
    """
    interactive = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    if not interactive or verbose in (0, "0", False):
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=description, file=sys.stderr, leave=False)
