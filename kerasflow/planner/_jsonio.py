"""Reading and writing kerasflow's JSON files with one clear error per problem, and nothing half-written.

Reads are bounded: only regular files, at most ``MAX_FILE_BYTES`` on disk and
``MAX_JSON_BYTES`` once decompressed, nested at most ``MAX_DEPTH`` deep. Writes go to a
temporary file beside the target and are renamed into place, so a failure leaves the
target as it was.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import tempfile
import zlib
from typing import Any, Callable, Mapping, TypeVar

from .errors import FileFormatError, KerasflowError

T = TypeVar("T")

MAX_FILE_BYTES = 256 * 2**20
MAX_JSON_BYTES = 1024 * 2**20
MAX_DEPTH = 64


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


def check_fields(data: Mapping, known: set, kind: str) -> None:
    """Rejects top-level fields a ``kind`` file does not have (kerasflow's policy: an unknown
    field is a typo or a newer file, never silently dropped).

    Raises:
        FileFormatError: naming the unknown fields and the known ones.
    """
    unknown = sorted(str(key) for key in set(data) - set(known) - {"format_version", "kind"})
    if unknown:
        raise FileFormatError(f"unknown {kind} field(s) {unknown}; known fields are {sorted(known)}. "
                              "Remove them, or read the file with the kerasflow version that wrote it.")


def encode(data: Mapping, path: str | os.PathLike) -> bytes:
    """Deterministic, indented JSON (byte-identical for equal data), gzip-compressed for ``.gz``."""
    payload = (json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    if os.fspath(path).endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)  # no time stamp: equal data, equal bytes
    return payload


def save(data: Mapping, path: str | os.PathLike, *, what: str = "file") -> None:
    """Writes ``data`` as deterministic, indented JSON (a path ending in ``.gz``: gzip-compressed).

    Raises:
        KerasflowError: the folder does not exist or cannot be written, or the path is a
            folder; the target is left as it was.
    """
    write_atomically(path, encode(data, path), what=what)


def write_atomically(path: str | os.PathLike, payload: bytes, *, what: str = "file") -> None:
    """Writes ``payload`` to a temporary file beside ``path``, then renames it into place.

    Raises:
        KerasflowError: one line naming the path, the reason and the fix; nothing is left behind.
    """
    target = os.fspath(path)
    check_writable(target, what=what)
    folder = os.path.dirname(os.path.abspath(target))
    handle, temporary = None, None
    try:
        handle, temporary = tempfile.mkstemp(prefix=".kerasflow-", suffix=".tmp", dir=folder)
        with os.fdopen(handle, "wb") as stream:
            handle = None
            stream.write(payload)
        os.replace(temporary, target)
        temporary = None
    except OSError as error:
        raise KerasflowError(f"Cannot write the {what} to {target!r}: {error.strerror or error}. "
                             "Check that the folder exists and is writable, and that the disk has room.") from None
    finally:
        if handle is not None:
            os.close(handle)
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)


def check_writable(path: str | os.PathLike, *, what: str = "file", inputs: tuple = ()) -> None:
    """Checks, before any work, that ``path`` can be written and is none of ``inputs``.

    Raises:
        KerasflowError: the path is a folder, its folder does not exist, or it names an input.

    Example:
        >>> check_writable("/no/such/folder/plan.json", what="plan")
        Traceback (most recent call last):
        ...
        kerasflow.planner.errors.KerasflowError: Cannot write the plan to '/no/such/folder/plan.json': the folder '/no/such/folder' does not exist. Create it first, or write elsewhere.
    """
    target = os.fspath(path)
    if os.path.isdir(target):
        raise KerasflowError(f"Cannot write the {what} to {target!r}: it is a folder. Give a file name.")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise KerasflowError(f"Cannot write the {what} to {target!r}: the folder {folder!r} does not exist. "
                             "Create it first, or write elsewhere.")
    for source in inputs:
        if source and os.path.exists(target) and os.path.exists(source) and os.path.samefile(target, source):
            raise KerasflowError(f"Refusing to write the {what} over the input file {os.fspath(source)!r}. "
                                 "Give another output path.")


def read_bytes(path: str | os.PathLike, *, what: str) -> bytes:
    """The file's bytes, decompressed for ``.gz``, within the size limits.

    Raises:
        FileFormatError: not a regular file, too large, or a broken gzip stream.
    """
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except FileNotFoundError:
        raise FileFormatError(f"{what} file {name!r} does not exist.") from None
    except OSError as error:
        raise FileFormatError(f"Cannot read {what} file {name!r}: {error.strerror or error}.") from None
    if not stat.S_ISREG(info.st_mode):
        raise FileFormatError(f"{what} file {name!r} is not a regular file (a folder, pipe or device); "
                              "pass a saved JSON file.")
    if info.st_size > MAX_FILE_BYTES:
        raise FileFormatError(f"{what} file {name!r} has {info.st_size} bytes, more than the {MAX_FILE_BYTES} "
                              "kerasflow reads; pass the right file.")
    try:
        with open(name, "rb") as handle:
            payload = handle.read(MAX_FILE_BYTES + 1)
        if name.endswith(".gz"):
            payload = _gunzip(payload, name, what)
    except OSError as error:
        raise FileFormatError(f"Cannot read {what} file {name!r}: {error.strerror or error}.") from None
    return payload


def _gunzip(payload: bytes, name: str, what: str) -> bytes:
    """Decompresses at most ``MAX_JSON_BYTES`` (a small file can unpack to gigabytes)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(payload, MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES or inflater.unconsumed_tail:
            raise FileFormatError(f"{what} file {name!r} unpacks to more than {MAX_JSON_BYTES} bytes, more than "
                                  "kerasflow reads; pass the right file.")
        if not inflater.eof:
            raise FileFormatError(f"{what} file {name!r} is a truncated gzip file; re-create it.")
    except zlib.error as error:
        raise FileFormatError(f"{what} file {name!r} is not a valid gzip file ({error}); re-create it.") from None
    return data


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string literal (unrolled: fast on long files)
_NOT_BRACKET = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))


def _depth(text: str) -> int:
    """How deeply the JSON text nests arrays and objects (brackets inside strings skipped).

    Example:
        >>> _depth('{"a": [1, {"b": "]]"}]}')
        3
    """
    brackets = _STRING.sub("", text).translate(_NOT_BRACKET)
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def load(path: str | os.PathLike, build: Callable[[Any], T], *, what: str) -> T:
    """Reads JSON from ``path`` and builds an object, naming the file in any error.

    Raises:
        FileFormatError: one line for every problem: missing, not a regular file, too large,
            broken gzip, not UTF-8, not JSON, nested too deeply, or fields of the wrong kind.
    """
    name = os.fspath(path)
    payload = read_bytes(path, what=what)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FileFormatError(f"{what} file {name!r} is not UTF-8 text ({error.reason} at byte {error.start}); "
                              "pass a saved JSON file.") from None
    if _depth(text) > MAX_DEPTH:
        raise FileFormatError(f"{what} file {name!r} nests more than {MAX_DEPTH} levels deep; kerasflow's files "
                              "nest a few levels. Pass the right file.")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise FileFormatError(
            f"{what} file {name!r} is not valid JSON ({error}); was it truncated or edited by hand?"
        ) from None
    try:
        return build(data)
    except FileFormatError as error:
        raise FileFormatError(f"{what} file {name!r}: {error}") from None
    except KerasflowError as error:
        raise FileFormatError(f"{what} file {name!r} is invalid: {error}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as error:
        # A field of the wrong kind that the validators did not name.
        raise FileFormatError(f"{what} file {name!r} has a field of the wrong type or range "
                              f"({type(error).__name__}: {error}); re-create the file with kerasflow.") from None
