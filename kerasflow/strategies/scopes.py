"""The TensorFlow name scopes of the copies a plan makes, written and read here only.

The plan-applying step runs each wave of the batch under ``wave<w>`` and each shard of a split
layer under ``shard<i>``; the applier and the placement read-back strip those scopes to find the
profiled op a copy comes from. A split layer cuts its inputs into shards under
``shard_inputs`` and joins its outputs under ``shard_outputs``; the applier runs a cut where its
input is made and a join where its output is used, as the simulator's split and concat tasks run.
The waves' own bookkeeping (their slices of the batch, the sums of their gradients) runs under
``waves``, so that it shifts none of the names TensorFlow gives the profiled step's ops. A
data-parallel plan runs each replica under ``replica<r>`` and its all-reduce under ``ring``; the
rings of the whole batch's BatchNormalization statistics run under ``batch_statistics``.
Both sides use these functions, so the grammar has one home.
"""

from __future__ import annotations

import re

__all__ = ["wave_scope", "shard_scope", "replica_scope", "SHARD_INPUTS_SCOPE", "SHARD_OUTPUTS_SCOPE", "WAVES_SCOPE",
           "RING_SCOPE", "BATCH_STATISTICS_SCOPE", "shard_boundary", "split_name", "replica_of", "gradient_scope"]

SHARD_INPUTS_SCOPE = "shard_inputs"
SHARD_OUTPUTS_SCOPE = "shard_outputs"
WAVES_SCOPE = "waves"
RING_SCOPE = "ring"
BATCH_STATISTICS_SCOPE = "batch_statistics"  # the whole batch's BatchNormalization statistics' rings
_GRADIENT_PREFIX = "gradient_tape/"

_WAVE = re.compile(r"^wave(\d+)$")
_SHARD = re.compile(r"^shard(\d+)$")
_REPLICA = re.compile(r"^replica(\d+)(?:_\d+)?$")  # TensorFlow suffixes a scope entered again


def wave_scope(wave: int) -> str:
    """The name scope of wave ``wave``'s ops.

    Example:
        >>> wave_scope(1)
        'wave1'
    """
    return f"wave{wave}"


def shard_scope(shard: int) -> str:
    """The name scope of shard ``shard``'s ops.

    Example:
        >>> shard_scope(0)
        'shard0'
    """
    return f"shard{shard}"


def replica_scope(replica: int) -> str:
    """The name scope of data-parallel replica ``replica``'s ops.

    Example:
        >>> replica_scope(1)
        'replica1'
    """
    return f"replica{replica}"


def gradient_scope(scope: str) -> str:
    """The full name scope of the gradient of ops made under the full name scope ``scope``, as
    TensorFlow's tape names it (for a gradient made by hand, which the tape does not name).

    Example:
        >>> gradient_scope("model/norm/shard0/moments/")
        'gradient_tape/model/norm/shard0/moments/'
    """
    return _GRADIENT_PREFIX + scope


def replica_of(name: str) -> int:
    """The data-parallel replica an op name belongs to (its outermost ``replica<r>`` scope), else -1.

    Example:
        >>> replica_of("gradient_tape/replica1/sequential/dense/MatMul"), replica_of("replica1_2/adam/Mul")
        (1, 1)
        >>> replica_of("ring/add")
        -1
    """
    for part in name.split("/"):
        match = _REPLICA.match(part)
        if match:
            return int(match.group(1))
    return -1


def shard_boundary(name: str) -> str | None:
    """``"split"`` for an op that cuts a tensor into a split layer's shards, ``"join"`` for one that
    joins shards into one tensor, else None: the ops under ``shard_inputs`` and ``shard_outputs``,
    and their gradients (the gradient of a cut joins, the gradient of a join cuts).

    Example:
        >>> shard_boundary("model/dense/shard_inputs/split"), shard_boundary("model/dense/shard0/MatMul")
        ('split', None)
        >>> shard_boundary("gradient_tape/model/dense/shard_inputs/concat")
        'join'
    """
    parts = name.split("/")
    backward = name.startswith(_GRADIENT_PREFIX)
    if SHARD_INPUTS_SCOPE in parts:
        return "join" if backward else "split"
    if SHARD_OUTPUTS_SCOPE in parts:
        return "split" if backward else "join"
    return None


def split_name(name: str) -> tuple[str, int, int]:
    """An op name without its wave and shard scopes, and those indices (-1 when absent).

    A name can hold its scope twice: a loop's gradient accumulator is named after the forward
    op it accumulates, under the gradient's scope, and both are inside the wave or shard.

    Example:
        >>> split_name("gradient_tape/wave1/model/dense/shard0/MatMul")
        ('gradient_tape/model/dense/MatMul', 1, 0)
        >>> split_name("gradient_tape/wave0/lstm/while/wave0/lstm/while/Tanh_0/accumulator")
        ('gradient_tape/lstm/while/lstm/while/Tanh_0/accumulator', 0, -1)
    """
    wave = shard = -1
    parts = []
    for part in name.split("/"):
        w, s = _WAVE.match(part), _SHARD.match(part)
        if w and wave in (-1, int(w.group(1))):
            wave = int(w.group(1))
        elif s and shard in (-1, int(s.group(1))):
            shard = int(s.group(1))
        else:
            parts.append(part)
    return "/".join(parts), wave, shard
