"""How kerasflow plans inside ``fit``: one frozen ``Options``, from arguments, then ``KERASFLOW_*`` variables.

Every value is checked here, where it enters, so a bad one is an error when the strategy
or callback is made, never a failure at step 4. Knobs come in two styles only: a yes/no
setting is a boolean (``drop_slower_plan``), a setting with more choices is one of its
lowercase names (``split``, ``tick_tock``, ``replicated``: ``"auto"``, ``"on"`` or ``"off"``;
``on_mismatch``: ``"error"`` or ``"replan"``). ``split`` was a boolean before it had
``"auto"``, so it still takes one (or its words), as ``"on"`` or ``"off"``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from kerasflow.planner import Cluster, Plan
from kerasflow.planner.errors import KerasflowError

__all__ = ["Options", "parse_bool"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_THREE_WAY = ("auto", "on", "off")


def parse_bool(name: str, raw: Any) -> bool:
    """A boolean setting from an argument or an environment variable's text.

    Args:
        name: the setting, for the error message.
        raw: a bool, or one of 1/0, true/false, yes/no, on/off (any case).

    Raises:
        KerasflowError: anything else.

    Example:
        >>> parse_bool("KERASFLOW_DROP_SLOWER_PLAN", "no"), parse_bool("drop_slower_plan", True)
        (False, True)
    """
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise KerasflowError(f"{name} must be a boolean (1/0, true/false, yes/no, on/off). Received: {name}={raw!r}")


def _parse_int(minimum: int):
    def parse(name: str, raw: Any) -> int:
        try:
            value = raw if isinstance(raw, int) and not isinstance(raw, bool) else int(str(raw).strip())
        except ValueError:
            value = None
        if value is None or isinstance(raw, bool) or value < minimum:
            raise KerasflowError(f"{name} must be an integer >= {minimum}. Received: {name}={raw!r}")
        return value
    return parse


def _parse_memory(name: str, raw: Any) -> float | None:
    if raw is None:
        return None
    try:
        value = math.nan if isinstance(raw, bool) else float(raw)
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise KerasflowError(f"{name} must be a positive number of bytes. Received: {name}={raw!r}")
    return value


def _parse_verbose(name: str, raw: Any) -> Any:
    text = "auto" if raw is None else str(raw).strip().lower()
    if text == "auto":
        return "auto"
    if text in _FALSE or text in _TRUE or text == "2":
        return 2 if text == "2" else int(text in _TRUE)
    raise KerasflowError(f"{name} must be 'auto', 0, 1 or 2 (as Keras' verbose). Received: {name}={raw!r}")


def _parse_choice(choices: tuple[str, ...]):
    def parse(name: str, raw: Any) -> str:
        text = raw.strip().lower() if isinstance(raw, str) else None
        if text not in choices:
            raise KerasflowError(f"{name} must be one of {list(choices)}. Received: {name}={raw!r}")
        return text
    return parse


def _parse_split(name: str, raw: Any) -> str:
    text = str(raw).strip().lower()
    if text in _THREE_WAY:
        return text
    if text in _TRUE or text in _FALSE:  # True, 1, "yes", ...: split was a boolean before "auto"
        return "on" if text in _TRUE else "off"
    raise KerasflowError(f"{name} must be one of {list(_THREE_WAY)}, or a boolean. Received: {name}={raw!r}")


def _parse_text(name: str, raw: Any) -> str | None:
    return None if raw is None else str(raw)


# Each setting's parser; None (an argument left out) takes KERASFLOW_<NAME>, then the default.
_PARSERS = {
    # Steps 0-1 trace and optimise the graph, so profiling starts at step 2 or later.
    "warmup_steps": _parse_int(2),
    "profile_steps": _parse_int(1),
    "split": _parse_split,
    "tick_tock": _parse_choice(_THREE_WAY),
    "replicated": _parse_choice(_THREE_WAY),
    "memory_limit": _parse_memory,
    "log_dir": _parse_text,
    "verbose": _parse_verbose,
    "on_mismatch": _parse_choice(("error", "replan")),
    "drop_slower_plan": parse_bool,
}


@dataclasses.dataclass(frozen=True)
class Options:
    """How kerasflow plans inside ``fit``, checked and frozen (see ``FastTStrategy`` for each).

    Attributes:
        devices: the devices planned over.
        cluster: the cluster planned for (None: the CPU testbed for logical CPUs, else measured).
        plan: a plan given up front (None: profile and plan inside ``fit``).
        warmup_steps: steps on the default placement before profiling (>= 2).
        profile_steps: profiled steps (>= 1).
        split: ``"auto"``, ``"on"`` or ``"off"``: whether the planner may split layers across
            devices (``"auto"``: where no two of them share compute; ``may_split`` decides).
        tick_tock: ``"auto"``, ``"on"`` or ``"off"``.
        replicated: ``"auto"``, ``"on"`` or ``"off"``.
        memory_limit: a cap in bytes for every device, or None.
        log_dir: where plan, profile and timeline files go, or None.
        verbose: ``"auto"``, 0, 1 or 2.
        on_mismatch: ``"error"`` or ``"replan"`` for a given plan made for another model.
        drop_slower_plan: whether a plan measured slower than the default placement gives way.
        max_split_evaluations: how many split candidates the planner simulates.

    Environment: ``KERASFLOW_WARMUP_STEPS``, ``KERASFLOW_PROFILE_STEPS``, ``KERASFLOW_SPLIT``,
    ``KERASFLOW_TICK_TOCK``, ``KERASFLOW_REPLICATED``, ``KERASFLOW_MEMORY_LIMIT``,
    ``KERASFLOW_LOG_DIR``, ``KERASFLOW_VERBOSE``, ``KERASFLOW_ON_MISMATCH``,
    ``KERASFLOW_DROP_SLOWER_PLAN``, used by ``build`` for any argument left at None.

    Example:
        >>> Options.build(["/CPU:0", "/CPU:1"], split=False, tick_tock="on").split
        'off'
    """

    devices: tuple[str, ...]
    cluster: Cluster | None = None
    plan: Plan | None = None
    warmup_steps: int = 2
    profile_steps: int = 3
    # "auto": on devices that share one pool of compute (logical CPUs) no split can shorten the
    # critical path, as its shards take cores from one another; elsewhere it is where FastT gains.
    split: str = "auto"
    tick_tock: str = "auto"
    replicated: str = "auto"
    memory_limit: float | None = None
    log_dir: str | None = None
    verbose: Any = "auto"
    on_mismatch: str = "error"
    drop_slower_plan: bool = True
    max_split_evaluations: int = 16

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        for name, parse in _PARSERS.items():
            object.__setattr__(self, name, parse(name, getattr(self, name)))

    @classmethod
    def build(cls, devices, **settings) -> "Options":
        """Options from keyword arguments; one left at None takes ``KERASFLOW_<NAME>``, then the default.

        Raises:
            KerasflowError: a value of the wrong kind or out of range, naming the setting (or
                the environment variable it came from).
        """
        unknown = sorted(set(settings) - set(_PARSERS) - {"cluster", "plan"})
        if unknown:
            raise KerasflowError(f"Unknown kerasflow setting(s) {unknown}. Received: {unknown[0]}="
                                 f"{settings[unknown[0]]!r}")
        given = {}
        for name, parse in _PARSERS.items():
            value = settings.get(name)
            if value is not None:
                given[name] = parse(name, value)
                continue
            variable = f"KERASFLOW_{name.upper()}"
            if os.environ.get(variable, "") != "":
                given[name] = parse(variable, os.environ[variable])
        return cls(devices=tuple(devices), cluster=settings.get("cluster"), plan=settings.get("plan"), **given)
