"""The TensorFlow name scopes of the copies a plan makes, written and read here only.

The plan-applying step runs each wave of the batch under ``wave<w>`` and each shard of a split
layer under ``shard<i>``; the applier and the placement read-back strip those scopes to find the
profiled op a copy comes from. Both sides use these functions, so the grammar has one home.
"""

from __future__ import annotations

import re

__all__ = ["wave_scope", "shard_scope", "split_name"]

_WAVE = re.compile(r"^wave(\d+)$")
_SHARD = re.compile(r"^shard(\d+)$")


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


def split_name(name: str) -> tuple[str, int, int]:
    """An op name without its wave and shard scopes, and those indices (-1 when absent).

    Example:
        >>> split_name("gradient_tape/wave1/model/dense/shard0/MatMul")
        ('gradient_tape/model/dense/MatMul', 1, 0)
    """
    wave = shard = -1
    parts = []
    for part in name.split("/"):
        w, s = _WAVE.match(part), _SHARD.match(part)
        if w and wave < 0:
            wave = int(w.group(1))
        elif s and shard < 0:
            shard = int(s.group(1))
        else:
            parts.append(part)
    return "/".join(parts), wave, shard
