"""Reading and writing kerasflow's JSON files with one clear error per problem, and nothing half-written.

Reads are bounded: only regular files, at most ``MAX_JSON_BYTES`` of JSON on disk or once a
gzip stream is unpacked, nested at most ``MAX_DEPTH`` deep; ``check_number`` bounds the numbers
the files hold. Writes go to a temporary file beside the target and are renamed into place, so a
failure leaves the target as it was.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import stat
import sys
import tempfile
import zlib
from typing import Any, Callable, Mapping, TypeVar

from .errors import FileFormatError, KerasflowError

T = TypeVar("T")

# JSON text read from one file, plain or unpacked: 12 times the largest real profile (the model
# zoo's GNMT, 11 MiB), and small enough to load and still plan in a 2 GiB address space (`ulimit
# -v 2097152`): a 128 MiB profile of 154,000 ops loads in 0.9 GiB at peak, a 264 MiB one in 1.7 GiB.
MAX_JSON_BYTES = 128 * 2**20
MAX_DEPTH = 64
# The largest magnitude of any figure (seconds, bytes, FLOPs, a speed, a batch), and its inverse
# the smallest divisor (a speed, a bandwidth). Real figures stay below 1e10, and within these
# bounds every sum, product and quotient over a graph and cluster stays far below float's 1.8e308
# (a task's seconds at most 1e18 * 1e18 / 1e-18 = 1e54, times at most 1e16 tasks). A bandwidth
# is only divided by, so any finite one is safe above (tests model free copies as 1e30 bytes/s).
MAX_MAGNITUDE = 1e18
SUFFIXES = (".json", ".json.gz")
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 2**20
_REQUIREMENTS = {
    "non-negative": (0.0, f"finite and non-negative, at most {MAX_MAGNITUDE:g}"),
    "positive": (0.0, f"finite and positive, at most {MAX_MAGNITUDE:g}"),
    "factor": (1 / MAX_MAGNITUDE, f"finite and from {1 / MAX_MAGNITUDE:g} to {MAX_MAGNITUDE:g}"),
    "divisor": (1 / MAX_MAGNITUDE, f"finite and at least {1 / MAX_MAGNITUDE:g}"),
    "count": (1, f"a whole number from 1 to {MAX_MAGNITUDE:g}"),
    "derived": (0.0, "finite and non-negative"),
}


def check_number(value: Any, field: str, error: type[KerasflowError], *, where: str = "",
                 kind: str = "non-negative", fix: str = "fix the file, or re-create it with kerasflow",
                 received: Any = None) -> Any:
    """Returns ``value`` if it is a number within the bounds of ``kind``, else raises ``error``.

    The one check every figure of a profile, cluster or plan passes, so that no sum over them
    overflows. Kinds: ``"non-negative"``, ``"positive"``, ``"factor"`` (a speed, from
    ``1 / MAX_MAGNITUDE``), ``"count"`` (an int), and two that may pass ``MAX_MAGNITUDE`` but must
    be finite floats: ``"divisor"`` (a bandwidth, only ever divided by, at least
    ``1 / MAX_MAGNITUDE``) and ``"derived"`` (a figure computed from the others: a predicted step time).

    Args:
        value: the number to check (a bool is not one).
        field: the field's name, e.g. ``"cost['V100']"``.
        error: the ``KerasflowError`` subclass to raise.
        where: what holds the field, for the message, e.g. ``"op 'a': "``.
        kind: one of the kinds above.
        fix: what the user should do, for the message.
        received: what the message shows as received (default: ``value``).

    Raises:
        KerasflowError: ``error``, in one line naming the field and what was received.

    Example:
        >>> check_number(10 ** 400, "batch_size", KerasflowError, kind="count", fix="fix it")
        Traceback (most recent call last):
        ...
        kerasflow.planner.errors.KerasflowError: field 'batch_size' must be a whole number from 1 to 1e+18; fix it. Received: batch_size=an integer of 401 digits
    """
    low, requirement = _REQUIREMENTS[kind]
    number = isinstance(value, int if kind == "count" else (int, float)) and not isinstance(value, bool)
    # Compared, never converted: an int past float's range compares exactly where float() raises,
    # and NaN fails every comparison.
    high = sys.float_info.max if kind in ("divisor", "derived") else MAX_MAGNITUDE
    if not (number and (low < value if kind == "positive" else low <= value) and value <= high):
        raise error(f"{where}field '{field}' must be {requirement}; {fix}. "
                    f"Received: {field}={shown(value if received is None else received)}")
    return value


def shown(value: Any) -> str:
    """``value`` for a one-line message: a huge integer as its length, not its hundreds of digits.

    Example:
        >>> shown([10 ** 400, 0.5]), shown({"fixed": "fast"})
        ('[an integer of 401 digits, 0.5]', "{'fixed': 'fast'}")
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MAGNITUDE:
        # repr() refuses integers of more than 4300 digits, so the length comes from the bits.
        digits = int(abs(value).bit_length() * math.log10(2)) + 1
        digits -= abs(value) < 10 ** (digits - 1)
        return f"an integer of {digits} digits"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(item) for item in value[:8]) + (", ...]" if len(value) > 8 else "]")
    if isinstance(value, Mapping):
        items = [f"{key!r:.40}: {shown(item)}" for key, item in list(value.items())[:8]]
        return "{" + ", ".join(items) + (", ...}" if len(value) > 8 else "}")
    return f"{value!r:.80}"


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
    """The file's bytes, decompressed when gzip-compressed, within ``MAX_JSON_BYTES``.

    A file is gzip when its name ends in ``.gz`` or its bytes start as gzip does (JSON text never
    does), whatever it holds: a profile, cluster or plan.

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
    if info.st_size > MAX_JSON_BYTES:
        raise FileFormatError(f"{what} file {name!r} has {info.st_size} bytes, more than the {MAX_JSON_BYTES} "
                              f"({MAX_JSON_BYTES >> 20} MiB) kerasflow reads; pass the right file.")
    try:
        with open(name, "rb") as handle:
            payload = handle.read(info.st_size + 1)  # read(n) reserves n bytes: the file's size, not the limit
    except OSError as error:
        raise FileFormatError(f"Cannot read {what} file {name!r}: {error.strerror or error}.") from None
    if name.endswith(".gz") or payload.startswith(_GZIP_MAGIC):
        payload = _gunzip(payload, name, what)
    return payload


def _gunzip(payload: bytes, name: str, what: str) -> bytes:
    """Decompresses a gzip stream of at most ``MAX_JSON_BYTES`` (a small file can unpack to gigabytes).

    A first pass only measures the stream, a chunk at a time, so a bomb is refused in constant
    memory; the second unpacks it into one buffer of the measured size.
    """
    try:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        size, pending = 0, payload
        while not inflater.eof and size <= MAX_JSON_BYTES:
            chunk = inflater.decompress(pending, _CHUNK)
            pending = inflater.unconsumed_tail
            if not chunk and not pending:
                break  # the input ended before the stream did
            size += len(chunk)
        if size > MAX_JSON_BYTES:
            raise FileFormatError(f"{what} file {name!r} unpacks to more than {MAX_JSON_BYTES} bytes "
                                  f"({MAX_JSON_BYTES >> 20} MiB), more than kerasflow reads; pass the right file.")
        if not inflater.eof:
            raise FileFormatError(f"{what} file {name!r} is a truncated gzip file; re-create it.")
        return zlib.decompress(payload, 16 + zlib.MAX_WBITS, max(size, 1))
    except zlib.error as error:
        raise FileFormatError(f"{what} file {name!r} is not a valid gzip file ({error}); re-create it.") from None


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
            broken gzip, not UTF-8, not JSON, nested too deeply, fields of the wrong kind, or
            more than the memory available holds.
    """
    name = os.fspath(path)
    try:
        return _parse_and_build(name, build, what)
    except MemoryError:
        # Within MAX_JSON_BYTES a profile loads in 2 GiB, but JSON of tiny values ('[{}, {}, ...]')
        # takes 25 times its size as Python objects.
        raise FileFormatError(f"{what} file {name!r} holds more than the memory available can read; pass the "
                              "right file, or run with more memory.") from None


def _parse_and_build(name: str, build: Callable[[Any], T], what: str) -> T:
    """``load``'s work: read, decode, check the nesting, parse and build, freeing each stage's input."""
    payload = read_bytes(name, what=what)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FileFormatError(f"{what} file {name!r} is not UTF-8 text ({error.reason} at byte {error.start}); "
                              "pass a saved JSON file.") from None
    del payload  # the text alone is parsed: the bytes would double what the parse holds
    if _depth(text) > MAX_DEPTH:
        raise FileFormatError(f"{what} file {name!r} nests more than {MAX_DEPTH} levels deep; kerasflow's files "
                              "nest a few levels. Pass the right file.")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise FileFormatError(
            f"{what} file {name!r} is not valid JSON ({error}); was it truncated or edited by hand?"
        ) from None
    except ValueError:  # the only other: Python reads no integer of more than 4300 digits
        raise FileFormatError(f"{what} file {name!r} holds an integer of thousands of digits; kerasflow's "
                              f"numbers are at most {MAX_MAGNITUDE:g}. Pass the right file.") from None
    del text  # nor during the build
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
