"""Reading and writing kerasflow's JSON files with one clear error per problem."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any, Callable, Mapping, TypeVar

from .errors import FileFormatError, KerasflowError

T = TypeVar("T")


def check_header(data: Any, kind: str, version: int) -> None:
    """Raises ``FileFormatError`` unless ``data`` is a ``kind`` object of ``version``."""
    if not isinstance(data, Mapping):
        raise FileFormatError(f"Expected a JSON object holding a {kind}; received {type(data).__name__}.")
    found_kind = data.get("kind", kind)
    if found_kind != kind:
        raise FileFormatError(
            f"Expected a {kind} but the data holds a {found_kind!r}; pass the right file."
        )
    found = data.get("format_version")
    if found != version:
        raise FileFormatError(
            f"{kind} format_version {found!r} is not supported; this kerasflow reads "
            f"version {version}. Re-create the file with this kerasflow version."
        )


def save(data: Mapping, path: str | os.PathLike) -> None:
    """Writes ``data`` as deterministic, indented JSON (byte-identical for equal data).

    A path ending in ``.gz`` is written gzip-compressed.
    """
    payload = (json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    if os.fspath(path).endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)  # no time stamp: equal data, equal bytes
    with open(path, "wb") as handle:
        handle.write(payload)


def load(path: str | os.PathLike, build: Callable[[Any], T], *, what: str) -> T:
    """Reads JSON from ``path`` and builds an object, naming the file in any error."""
    try:
        with open(path, "rb") as handle:
            payload = handle.read()
        if os.fspath(path).endswith(".gz"):
            payload = gzip.decompress(payload)
        data = json.loads(payload.decode("utf-8"))
    except FileNotFoundError:
        raise FileFormatError(f"{what} file {os.fspath(path)!r} does not exist.") from None
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise FileFormatError(f"Cannot read {what} file {os.fspath(path)!r}: {error}.") from None
    except json.JSONDecodeError as error:
        raise FileFormatError(
            f"{what} file {os.fspath(path)!r} is not valid JSON ({error}); "
            "was it truncated or edited by hand?"
        ) from None
    try:
        return build(data)
    except FileFormatError as error:
        raise FileFormatError(f"{what} file {os.fspath(path)!r}: {error}") from None
    except (KerasflowError, TypeError) as error:
        raise FileFormatError(f"{what} file {os.fspath(path)!r} is invalid: {error}") from None
